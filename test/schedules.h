// Pipeline schedules: every schedule's point-to-point messages pair up between neighbours, ZB's lists and
// bubble (--check-schedules).
// Included by test_gpt.cu after its harness's first part (check(), the tolerances), as one translation unit.

// ZB's list of rank r: every micro-batch's forward, B and W once each, each W after its B, the W passes in
// micro-batch order (what makes ZB's sums 1F1B's), and the slots and pending W passes pipeline_plan counts as
// the check_memory formulas say (pp, and s + 1 or the steady state's length). Returns 1 if all hold.
static int zb_list_ok(int pp, int r, int m) {
    StepList l = pipeline_steps(SCHEDULE_ZB, pp, 1, r, m, 0);
    int *seen = (int *)calloc_check(3 * (size_t)m, sizeof(int)), ok = 1, next_w = 0;
    for (int i = 0; i < l.n; i++) {
        const PipeStep *st = &l.s[i];
        if (st->fwd >= 0) { ok &= !seen[st->fwd]++; }
        if (st->bwd >= 0) { ok &= seen[st->bwd] == 1 && !seen[m + st->bwd]++; }
        if (st->wgt >= 0) { ok &= seen[m + st->wgt] == 1 && st->wgt == next_w++; }
    }
    ok &= next_w == m;
    for (int k = 0; k < m; k++) { ok &= seen[k] == 1 && seen[m + k] == 1; }
    Pipeline p = {};
    Group g = {};
    g.size = pp;
    p.pp = &g;
    int slots = pipeline_plan(&p, SCHEDULE_ZB, pp, 1, r, m);
    int warm = pp - r - 1 < m ? pp - r - 1 : m, steady = m - warm > 1 ? m - warm : 1;
    ok &= slots == (pp < m ? pp : m) && p.npending == (r + 1 < steady ? r + 1 : steady);
    free(seen); free(l.s); free(p.steps.s); free(p.slot_of); free(p.busy);
    return ok;
}

// --check-schedules' ZB part: ZB's lists keep its rules (zb_list_ok) at pp 2-8 and m 1-4pp on every rank, and its
// bubble on the model of time (pipe_simulate, F = B = W = 1) at m pp-4pp is at most (pp-1) + 1 per rank, against
// 1F1B's 3(pp-1): at most half.
static void check_zb_lists_and_bubbles(void) {
    long zb_bad = 0, zb_lists = 0, bubble_bad = 0, bubbles = 0;
    double worst_ratio = 0;
    for (int pp = 2; pp <= 8; pp++) {
        for (int m = 1; m <= 4 * pp; m++) {
            for (int r = 0; r < pp; r++) { zb_bad += !zb_list_ok(pp, r, m); zb_lists++; }
            if (m < pp) { continue; }
            double i1[8], iz[8], one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
            pipe_simulate(SCHEDULE_1F1B, pp, 1, m, one, one, one, NULL, NULL, i1);
            pipe_simulate(SCHEDULE_ZB, pp, 1, m, one, one, one, NULL, NULL, iz);
            for (int r = 0; r < pp; r++) {
                bubbles++;
                bubble_bad += fabs(i1[r] - 3.0 * (pp - 1)) > 1e-9 || iz[r] > (pp - 1) + 1 + 1e-9;
                if (iz[r] / i1[r] > worst_ratio) { worst_ratio = iz[r] / i1[r]; }
            }
        }
    }
    check(zb_bad == 0, "pipeline schedules: ZB's %ld lists (pp 2-8, m 1-4pp, every rank) run each micro-batch's F, B, W "
          "once, each W after its B and in micro-batch order, with pp slots and s + 1 pending W passes: %ld do not",
          zb_lists, zb_bad);
    check(bubble_bad == 0 && worst_ratio <= 0.5 + 1e-9,
          "pipeline schedules: simulated (F = B = W = 1, pp 2-8, m pp-4pp), 1F1B's bubble is 3(pp-1) on every rank and "
          "ZB's at most (pp-1) + 1, at most %.3f of 1F1B's (%ld of %ld ranks off)", worst_ratio, bubble_bad, bubbles);
}

// The model of time of one schedule (kind s of check_schedules' kinds, pp stages, vpp chunks, m micro-batches), each
// stage its own times: the event simulation on a core per rank (pipe_shared) = the walk (pipe_walk); all on one
// core, that core never idles. Returns the number of those that are off (per rank, then the two steps).
static long schedule_sim_off(PipeSchedule kind, int pp, int vpp, int m, int s) {
    long sim_bad = 0;
    double tf[8], tb[8], tw[8], w1[8], iw[8], is[8], i1[8], walk, shared, one;
    int own[8], same[8];
    for (int r = 0; r < pp; r++) {
        tf[r] = 0.5 + (r * 7 + m * 3 + s) % 5 * 0.25; tb[r] = 2 * tf[r] - 0.3; tw[r] = 0.7 * tf[r];
        own[r] = r; same[r] = 0; w1[r] = 1;
    }
    walk = pipe_walk(kind, pp, vpp, m, tf, tb, tw, iw);
    shared = pipe_shared(kind, pp, vpp, m, tf, tb, tw, own, w1, is);
    one = pipe_shared(kind, pp, vpp, m, tf, tb, tw, same, w1, i1);
    double work = 0;
    for (int r = 0; r < pp; r++) {
        sim_bad += fabs(iw[r] - is[r]) > 1e-9 * walk;
        work += one - i1[r];
    }
    sim_bad += fabs(walk - shared) > 1e-9 * walk || fabs(one - work) > 1e-9 * work;
    return sim_bad;
}

// One schedule's messages between every two neighbours (r, r + 1 mod pp), both ways (steps_match): the number of
// the pp pairs' 2 pp directions whose messages do not pair up in posting order and kind.
static long schedule_pairs_bad(PipeSchedule kind, int pp, int vpp, int m) {
    long bad = 0;
    for (int r = 0; r < pp; r++) {
        StepList a = pipeline_steps(kind, pp, vpp, r, m, 0);
        StepList b = pipeline_steps(kind, pp, vpp, (r + 1) % pp, m, 0);
        bad += !steps_match(&a, &b) + !steps_match(&b, &a);
        free(a.s); free(b.s);
    }
    return bad;
}

// The check fails on a schedule made wrong: rank 0's first step that sends and a later one that sends another kind,
// swapped, in the interleaved schedule at pp 2 x vpp 2 (where both kinds go both ways).
static void check_swapped_sends_caught(void) {
    StepList a = pipeline_steps(SCHEDULE_INTERLEAVED, 2, 2, 0, 4, 0), b = pipeline_steps(SCHEDULE_INTERLEAVED, 2, 2, 1, 4, 0);
    int i = 0, j;
    while (i < a.n && !a.s[i].send_fwd && !a.s[i].send_bwd) { i++; }
    for (j = i + 1; j < a.n && !(a.s[j].send_bwd && !a.s[i].send_bwd) && !(a.s[j].send_fwd && !a.s[i].send_fwd); j++) {}
    int found = j < a.n;
    if (found) { PipeStep x = a.s[i]; a.s[i] = a.s[j]; a.s[j] = x; }
    check(found && !steps_match(&a, &b),
          "pipeline schedules: rank 0's steps %d and %d (sends of another kind) swapped at pp 2 x vpp 2: the check "
          "fails on its sends", i, j);
    free(a.s); free(b.s);
}

// --check-schedules: every pipeline schedule's point-to-point messages pair up between every two neighbours,
// in posting order and kind (steps_match: what the untagged messages of comm.h need), for 1F1B, GPipe and ZB at
// pp 2-8 and interleaved at pp 2-8 x vpp 2-4, with m from 1 (or pp) to 4 pp micro-batches; and the check
// fails on a schedule made wrong (two steps of rank 0 that send swapped, with pp 2 where both kinds go
// both ways). ZB's lists keep its rules (zb_list_ok), and its bubble on the model of time (pipe_simulate, F = B =
// W = 1) is (pp-1)(F+B-W) per rank, at most pp-1 + 1 more, against 1F1B's (pp-1)(F+B+W): at most half.
static void check_schedules(void) {
    static const PipeSchedule kinds[4] = {SCHEDULE_1F1B, SCHEDULE_GPIPE, SCHEDULE_INTERLEAVED, SCHEDULE_ZB};
    long pairs = 0, bad = 0, configs = 0, sim_bad = 0;
    check_zb_lists_and_bubbles();
    for (int s = 0; s < 4; s++) {
        for (int pp = 2; pp <= 8; pp++) {
            for (int vpp = kinds[s] == SCHEDULE_INTERLEAVED ? 2 : 1; vpp <= (kinds[s] == SCHEDULE_INTERLEAVED ? 4 : 1); vpp++) {
                for (int m = kinds[s] == SCHEDULE_INTERLEAVED ? pp : 1; m <= 4 * pp; m += kinds[s] == SCHEDULE_INTERLEAVED ? pp : 1) {
                    configs++;
                    sim_bad += schedule_sim_off(kinds[s], pp, vpp, m, s);
                    pairs += 2 * pp;
                    bad += schedule_pairs_bad(kinds[s], pp, vpp, m);
                }
            }
        }
    }
    check(bad == 0, "pipeline schedules: the messages of %ld neighbour pairs (both ways) in %ld schedules pair up in "
          "posting order and kind: %ld do not", pairs, configs, bad);
    check(sim_bad == 0, "pipeline schedules: in %ld schedules with uneven stages, the event simulation with a core per "
          "rank gives the walk's step and bubbles, and with one core for all, a step of all the ranks' work (%ld off)",
          configs, sim_bad);
    check_swapped_sends_caught();
}
