// Communication: the comm report against cost_model.h's formulas (--check-comm), and the comm layer on its own:
// every collective on every group with known values, NCCL's in-place rules (--check-comm-layer).
// Included by test_gpt.cu after its harness's first part (check(), the tolerances), as one translation unit.

// Comm report vs the formulas (cost_model.h: the ones the plan and the layout search time), for one step of
// `accum` micro-batches: every group's bytes. ep_rows: the rows the step's all-to-alls moved, from its routing.
// ZeRO-3 with a pipeline or MoE layers: the interleaving of the uses decides which units stay gathered, so the
// gathers are the ones the run made, and at most the bound the plan takes (every use of a unit gathered).
static void check_comm(Model *m, int accum, double ep_rows) {
    Grid *g = m->grid;
    Zero *z = &m->zero;
    CommShape s = gpt2_comm_shape(m);
    int counted = z->stage == 3 && !s.z3_exact;
    CommBytes f = comm_step_bytes(&s, accum, ep_rows, counted ? z->gathered_ring : NULL),
        n = comm_step_calls(&s, accum, counted ? z->gathers : NULL);
    char zero_what[160];
    snprintf(zero_what, sizeof(zero_what), "ZeRO %d: %s%s", z->stage,
             z->stage < 2 ? "all-reduce 2(p-1)/p x 4P (1: reduce-scatter + all-gather)"
             : z->stage == 2 ? "reduce-scatter per micro-batch + all-gather"
                             : "gathers + reduce-scatter per micro-batch",
             z->stage == 3 ? (counted ? ", the gathers made" : ", gathers by zero_unit_params' policy") : "");
    struct { Group *grp; double expect, calls; const char *what; } rows[] = {
        {g->grad_group, f.dp, n.dp, zero_what},
        {&g->edp_group, f.edp, n.edp, "the experts' units over edp"},
        {&g->emb_group, f.emb, n.emb, "the tied embedding's gradient, all-reduced between the first and the last stage"},
        {&g->pp_group, f.pp, n.pp, "each micro-batch and chunk: the activation forward, its gradient back"},
        {&g->cp_group, f.cp, n.cp, "ring attention's k, v hops, Ulysses' all-to-alls; MoE routing's capacity and f"},
        {&g->ep_group, f.ep, n.ep, "all-to-all dispatch and return, forward, backward (and recomputed)"},
        {&g->tp_group, f.tp, n.tp, "SP: RS + AG, or all-reduces, of (p-1)/p BT C per layer and end; CE stats; gates"},
        {&g->world, f.world, n.world, "the step's loss and norm all-reduced; Muon: U to the owners, the results back"}};
    for (int i = 0; i < (int)(sizeof(rows) / sizeof(rows[0])); i++) {
        double got = rows[i].grp->bytes;
        check(fabs(got - rows[i].expect) < 1 + 1e-9 * rows[i].expect, "comm: %s bytes/step %.0f = formula %.0f (%s)",
              rows[i].grp->name, got, rows[i].expect, rows[i].what);
        check(rows[i].grp->calls == rows[i].calls, "comm: %s calls/step %ld = formula %.0f (%s)", rows[i].grp->name,
              rows[i].grp->calls, rows[i].calls, rows[i].what);
    }
    if (counted && g->grad_group->size > 1) {   // the gathers made: every unit at least once, at most the bound
        double bound[2], made = z->gathered_ring[0] + z->gathered_ring[1];
        for (int i = 0; i < 2; i++) { bound[i] = s.z3_step[i] + accum * s.z3_micro[i]; }
        check(z->gathers[0] + z->gathers[1] >= m->nunits && made <= bound[0] + bound[1] + 0.5,
              "comm: zero 3 gathers: %.0f units gathered, %.0f ring elements <= the plan's bound %.0f (every use gathered)",
              z->gathers[0] + z->gathers[1], made, bound[0] + bound[1]);
    }
}

// The comm layer on its own, one group: the reductions and gathers, with known values (element i of group
// rank r holds 1000 r + i), blocking and async, and the byte counters. dbuf, h: scratch of cap elements.
static void check_group_reductions(Group *g, floatX *dbuf, float *h, size_t n) {
    int p = g->size, r = g->rank, ok;
    // all-reduce, blocking and async: sum over ranks of (1000 r + i)
    for (int async = 0; async < 2; async++) {
        for (size_t i = 0; i < n; i++) { h[i] = 1000.0f * r + i; }
        upload_floats(dbuf, h, n);
        double before = g->bytes;
        CommRequest req = {};
        comm_all_reduce(g, dbuf, n, DT_FLOATX, async ? &req : NULL);
        comm_wait(&req);
        download_floats(h, dbuf, n);
        ok = fabs(g->bytes - before - (p > 1 ? 2.0 * (p - 1) / p * n * sizeof(floatX) : 0)) < 1e-6;
        for (size_t i = 0; i < n; i++) { ok &= h[i] == 1000.0f * p * (p - 1) / 2 + (float)(p * i); }
        check(ok, "comm layer: %s all-reduce%s (p %d): values and byte count", g->name, async ? " async" : "", p);
    }
    // reduce-scatter: rank r receives chunk r of the sum; all-gather (out of place and in place)
    for (size_t i = 0; i < n * p; i++) { h[i] = 1000.0f * r + i; }
    upload_floats(dbuf, h, n * p);
    comm_reduce_scatter(g, dbuf, dbuf + n * p, n, DT_FLOATX, NULL);
    download_floats(h, dbuf + n * p, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) { ok &= h[i] == 1000.0f * p * (p - 1) / 2 + (float)(p * (r * n + i)); }
    check(ok, "comm layer: %s reduce-scatter (p %d)", g->name, p);
    for (int async = 0; async < 2; async++) {    // in place: the rank's chunk of the input buffer
        for (size_t i = 0; i < n * p; i++) { h[i] = 1000.0f * r + i; }
        upload_floats(dbuf, h, n * p);
        CommRequest req = {};
        comm_reduce_scatter(g, dbuf, dbuf + r * n, n, DT_FLOATX, async ? &req : NULL);
        comm_wait(&req);
        download_floats(h, dbuf + r * n, n);
        ok = 1;
        for (size_t i = 0; i < n; i++) { ok &= h[i] == 1000.0f * p * (p - 1) / 2 + (float)(p * (r * n + i)); }
        check(ok, "comm layer: %s reduce-scatter in place%s (p %d)", g->name, async ? " async" : "", p);
    }
    for (int in_place = 0; in_place < 2; in_place++) {
        for (size_t i = 0; i < n; i++) { h[i] = 1000.0f * r + i; }
        floatX *send = in_place ? dbuf + r * n : dbuf + n * p;
        upload_floats(send, h, n);
        comm_all_gather(g, send, dbuf, n, DT_FLOATX, NULL);
        download_floats(h, dbuf, n * p);
        ok = 1;
        for (int q = 0; q < p; q++) { for (size_t i = 0; i < n; i++) { ok &= h[q * n + i] == 1000.0f * q + i; } }
        check(ok, "comm layer: %s all-gather%s (p %d)", g->name, in_place ? " in place" : "", p);
    }
}

// ... the all-to-all(v) and the point-to-point calls (cap: the scratch's elements, the receive half at cap).
static void check_group_exchanges(Group *g, floatX *dbuf, float *h, size_t n, size_t cap) {
    int p = g->size, r = g->rank, ok;
    // all-to-all(v): rank r sends (j + 1) elements valued 1000 r + j to rank j
    size_t sc[64] = {0}, so[64] = {0}, rc[64] = {0}, ro[64] = {0}, s_off = 0, r_off = 0;   // (p <= 64: set below)
    if (p <= 64) {
        for (int j = 0; j < p; j++) {
            sc[j] = j + 1;
            so[j] = s_off;
            s_off += sc[j];
            rc[j] = r + 1;
            ro[j] = r_off;
            r_off += rc[j];
        }
        for (int j = 0; j < p; j++) { for (size_t i = 0; i < sc[j]; i++) { h[so[j] + i] = 1000.0f * r + j; } }
        upload_floats(dbuf, h, s_off);
        comm_all_to_allv(g, dbuf, sc, so, dbuf + cap, rc, ro, DT_FLOATX);
        download_floats(h, dbuf + cap, r_off);
        ok = 1;
        for (int j = 0; j < p; j++) { for (size_t i = 0; i < rc[j]; i++) { ok &= h[ro[j] + i] == 1000.0f * j + r; } }
        check(ok, "comm layer: %s all-to-all(v) (p %d)", g->name, p);
    }
    // send / recv around the ring of the group (even ranks send first: no deadlock)
    if (p > 1) {
        for (size_t i = 0; i < n; i++) { h[i] = 1000.0f * r + i; }
        upload_floats(dbuf, h, n);
        int next = (r + 1) % p, prev = (r + p - 1) % p;
        if (r % 2 == 0) { comm_send(g, dbuf, n, DT_FLOATX, next); comm_recv(g, dbuf + n, n, DT_FLOATX, prev); }
        else { comm_recv(g, dbuf + n, n, DT_FLOATX, prev); comm_send(g, dbuf, n, DT_FLOATX, next); }
        download_floats(h, dbuf + n, n);
        ok = 1;
        for (size_t i = 0; i < n; i++) { ok &= h[i] == 1000.0f * prev + i; }
        check(ok, "comm layer: %s send/recv ring (p %d)", g->name, p);
    }
}

// NCCL's in-place rules (comm.h's comm_in_place_error, asserted before every collective on both backends): the
// layouts the code uses pass, overlapping ones that are not in place fail, for rank 0, 1 and 2 of 3.
static void check_in_place_rules(void) {
    char buf[64 * 12];
    int passed = 0, caught = 0, cases = 0;
    for (int r = 0; r < 3; r++) {
        const char *whole = buf, *chunk = buf + r * 64;   // chunk r of a 3-chunk buffer
        // allowed: in place exactly, or apart
        passed += !comm_in_place_error(CHUNK_IN_WHOLE_SEND, whole, 192, chunk, 64, r);   // reduce-scatter
        passed += !comm_in_place_error(CHUNK_IN_WHOLE_RECV, chunk, 64, whole, 192, r);   // all-gather
        passed += !comm_in_place_error(CHUNK_IN_WHOLE_SEND, whole, 192, buf + 512, 64, r);
        passed += !comm_in_place_error(APART, buf, 192, buf + 192, 192, r);            // all-to-all, adjacent
        // refused: another rank's chunk, a shifted chunk, an all-to-all in place
        caught += comm_in_place_error(CHUNK_IN_WHOLE_SEND, whole, 192, buf + ((r + 1) % 3) * 64, 64, r) != NULL;
        caught += comm_in_place_error(CHUNK_IN_WHOLE_RECV, chunk + 2, 64, whole, 192, r) != NULL;
        caught += comm_in_place_error(APART, buf, 192, buf + 100, 192, r) != NULL;
        cases++;
    }
    check(passed == 4 * cases && caught == 3 * cases,
          "comm layer: NCCL's in-place rules: %d of %d allowed layouts pass, %d of %d overlapping ones are refused",
          passed, 4 * cases, caught, 3 * cases);
}

// The comm layer on its own: every collective on every group of the grid.
static void check_comm_layer(Grid *grid) {
    check_in_place_rules();
    Group *groups[5] = {&grid->world, &grid->tp_group, &grid->pp_group, &grid->dp_group, &grid->ep_group};
    const size_t n = 7;
    for (int k = 0; k < 5; k++) {
        Group *g = groups[k];
        size_t cap = (n + g->size + 1) * g->size;   // all-to-all(v) below sends up to p, receives up to p*p elements
        floatX *dbuf = (floatX *)mem_alloc(sizeof(floatX) * cap * 2, MEM_COMM);
        float *h = (float *)malloc_check(sizeof(float) * cap * 2);
        check_group_reductions(g, dbuf, h, n);
        check_group_exchanges(g, dbuf, h, n, cap);
        comm_barrier(g);
        free(h);
        mem_free(dbuf);
    }
}
