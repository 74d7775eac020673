// MoE routing: the MoE part of a reference state and the routing compared decision by decision (margins,
// capacity keep masks per sequence); the CPU build's MoE fast paths against their loops (--check-attention's run).
// Included by test_gpt.cu after its harness's first part (check(), the tolerances), as one translation unit.

// The MoE part of a reference state (moe.bin, see gpt2_ref.py): its options, step-0 values, routing.
typedef struct {
    int present, E, k, every, F1000, policy, Lm, R, T, nsteps;
    float aux_coeff, z_coeff, aux0, z0, dropped0, min_margin;
    int *choice, *keep;                 // (Lm, R, T, k)
    float *topk_margin, *cap_margin;    // (Lm, R, T), (Lm, R, E)
    float bias_rate;                    // (version 2) loss-free balancing's rate
    int *loads;                         // (version 2, PyTorch's) (nsteps, Lm, E) assignments per expert before drops
    float *bias;                        // (version 2, PyTorch's) (Lm, E) the routing bias after the last step
    int *allow;                         // (version 3) (nsteps, Lm) the assignments another fp32 run may move, x 2
} RefMoE;

static void read_ref_moe(const char *dir, RefMoE *r) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/moe.bin", dir);
    memset(r, 0, sizeof(*r));
    if (access(path, R_OK) != 0) { return; }
    FILE *f = fopen_check(path, "rb");
    int h[256];
    float fh[256];
    fread_check(h, sizeof(int), 256, f, path);
    fread_check(fh, sizeof(float), 256, f, path);
    if (h[0] != 20241130 || h[1] < 1 || h[1] > 3) { fail("reference '%s' has bad magic/version", path); }
    r->present = 1;
    r->E = h[2];
    r->k = h[3];
    r->every = h[4];
    r->F1000 = h[5];
    r->policy = h[6];
    r->Lm = h[7];
    r->R = h[8];
    r->T = h[9];
    r->nsteps = h[10];
    r->aux_coeff = fh[0];
    r->z_coeff = fh[1];
    r->aux0 = fh[2];
    r->z0 = fh[3];
    r->dropped0 = fh[4];
    r->min_margin = fh[5];
    size_t n = (size_t)r->Lm * r->R * r->T * r->k;
    r->choice = (int *)malloc_check(n * sizeof(int));
    r->keep = (int *)malloc_check(n * sizeof(int));
    r->topk_margin = (float *)malloc_check((size_t)r->Lm * r->R * r->T * sizeof(float));
    r->cap_margin = (float *)malloc_check((size_t)r->Lm * r->R * r->E * sizeof(float));
    fread_check(r->choice, sizeof(int), n, f, path);
    fread_check(r->keep, sizeof(int), n, f, path);
    fread_check(r->topk_margin, sizeof(float), (size_t)r->Lm * r->R * r->T, f, path);
    fread_check(r->cap_margin, sizeof(float), (size_t)r->Lm * r->R * r->E, f, path);
    if (h[1] >= 2) {
        r->bias_rate = fh[6];
        if (h[11]) {   // the loads of every step and the final bias (a dump of layout A has none)
            size_t nl = (size_t)r->Lm * r->E;
            float *skip = (float *)malloc_check(3 * r->nsteps * sizeof(float));   // aux, z, dropped per step
            fread_check(skip, sizeof(float), 3 * (size_t)r->nsteps, f, path);
            free(skip);
            r->loads = (int *)malloc_check(r->nsteps * nl * sizeof(int));
            r->bias = (float *)malloc_check(nl * sizeof(float));
            fread_check(r->loads, sizeof(int), r->nsteps * nl, f, path);
            fread_check(r->bias, sizeof(float), nl, f, path);
            if (h[1] == 3) {   // the scores' drift from the fp64 run per step (not used here), the allowances
                float *drift = (float *)malloc_check(r->nsteps * sizeof(float));
                fread_check(drift, sizeof(float), r->nsteps, f, path);
                free(drift);
                r->allow = (int *)malloc_check((size_t)r->nsteps * r->Lm * sizeof(int));
                fread_check(r->allow, sizeof(int), (size_t)r->nsteps * r->Lm, f, path);
            }
        }
    }
    fclose(f);
}

// test_gpt's routing log (model.route_log, see moe_forward): per micro-batch, per MoE layer of the
// stage in the stage's order, an entry of choice (BT, k) ints, keep (BT, k) ints, probs (BT, E) floats.
static size_t route_entry(const Model *m) { return (size_t)m->BT * (2 * m->config.topk + m->config.num_experts); }

static int stage_moe_layers(const Model *m) {
    int n = 0;
    for (int l = 0; l < m->Ls; l++) { n += is_moe_layer(&m->config, m->layer_id[l]); }
    return n;
}

// What routing otherwise than the reference does to the expert gradients (compare_grads): per (MoE layer,
// expert), the assignments whose term in that expert's gradient differs from the reference's (moved: kept on
// one side only, or kept on both with another gate: a token whose chosen set differs, where the gates are its k > 1
// scores renormalised over that set), and the assignments the reference keeps (kept); the share of (layer, token)
// pairs whose choice differs (the dropped fraction's and every block's allowance, see compare_grads).
typedef struct {
    double flipped_share;
    int E;               // (0: no MoE reference; moved and kept NULL)
    int *moved, *kept;   // (Lm, E)
} RouteDiff;

static void route_diff_init(RouteDiff *d, const RefMoE *r) {
    memset(d, 0, sizeof(*d));
    if (!r->present) { return; }
    d->E = r->E;
    d->moved = (int *)calloc_check((size_t)r->Lm * r->E, sizeof(int));
    d->kept = (int *)calloc_check((size_t)r->Lm * r->E, sizeof(int));
    for (size_t a = 0; a < (size_t)r->Lm * r->R * r->T * r->k; a++) {
        int e = r->choice[a];
        if (r->keep[a] && e >= 0 && e < r->E) { d->kept[a / ((size_t)r->R * r->T * r->k) * r->E + e]++; }
    }
}

static void route_diff_free(RouteDiff *d) { free(d->moved); free(d->kept); memset(d, 0, sizeof(*d)); }

// One token's assignments (ours ch, kp; the reference's rch, rkp; k each) whose expert-gradient term differs, added
// to moved (E; renorm: the gates are the chosen scores renormalised); returns whether its chosen set is the same.
static int route_token_moved(const int *ch, const int *kp, const int *rch, const int *rkp, int k, int E, int renorm,
                             int *moved) {
    int same_set = 1;
    for (int j = 0; j < k; j++) {
        int found = 0;
        for (int jj = 0; jj < k; jj++) { found |= ch[j] == rch[jj]; }
        same_set &= found;
    }
    for (int j = 0; j < k; j++) {   // our experts, and the reference's that are not ours
        int in_r = 0, ours = 0;
        for (int jj = 0; jj < k; jj++) {
            if (rch[jj] == ch[j]) { in_r = rkp[jj] != 0; }
            if (ch[jj] == rch[j]) { ours = 1; }
        }
        int in_o = kp[j] != 0;
        if ((in_o || in_r) && (in_o != in_r || (!same_set && renorm)) && ch[j] >= 0 && ch[j] < E) { moved[ch[j]]++; }
        if (!ours && rkp[j] && rch[j] >= 0 && rch[j] < E) { moved[rch[j]]++; }
    }
    return same_set;
}

// The tallies of compare_routing's second pass: the tokens compared, those whose choice differs, those not compared
// (after a token routed otherwise upstream); the (layer, sequence) pairs compared, skipped, and those that differ;
// the tokens whose choice differs (every token); the keeps that differ with the same choices, and those of them
// without a cause the margins allow; the largest margin of a compared choice that differs.
typedef struct {
    long tok_compared, tok_differ, tok_downstream, seq_compared, seq_skipped, seq_differ, flips, keep_differ,
        keep_unexplained;
    float flip_margin;
} RouteTally;

// compare_routing's first pass on one row: row b of a micro-batch's log entry (choice, keep: (BT, k)) of MoE layer
// gm, the reference's row g. Lowers first[gm][g] to the first position whose choice or keep differs (first: (Lm, R))
// and marks in changed[gm][g] (changed: (Lm, R, E)) the experts of a choice that differs, ours and the reference's.
static void route_row_first_diff(const Model *m, const RefMoE *r, const int *choice, const int *keep, int gm, int b,
                                 int g, int *first, int *changed) {
    int T = m->T, Tg = r->T, k = m->config.topk, E = m->config.num_experts, R = r->R;
    size_t mine = (size_t)b * T * k, ref = (((size_t)gm * R + g) * Tg) * k;
    int *chg = changed + ((size_t)gm * R + g) * E;
    int *f = &first[(size_t)gm * R + g];
    for (int t = 0; t < T; t++) {
        int pos = seq_pos(m->seqpos, t);
        const int *ch = choice + mine + (size_t)t * k, *rch = r->choice + ref + (size_t)pos * k;
        int list = memcmp(ch, rch, k * sizeof(int)) != 0;
        for (int q = 0; q < k && list; q++) {
            if (ch[q] >= 0 && ch[q] < E) { chg[ch[q]] = 1; }
            chg[rch[q]] = 1;
        }
        if (list || memcmp(keep + mine + (size_t)t * k, r->keep + ref + (size_t)pos * k,
                           k * sizeof(int))) { *f = pos < *f ? pos : *f; }
    }
}

// compare_routing's second pass on one row's tokens (the row as route_row_first_diff; chg: changed[gm][g], E;
// upstream: the first position routed otherwise in an earlier MoE layer, Tg if none): each choice against the
// reference's, the keeps that differ with the same choices and whether a cause allows them, the assignments
// moved (into d, on tp rank 0), tallied into s. Returns whether nothing upstream differs and every compared
// token's top-k margin is clear.
static int route_row_tokens(const Model *m, const RefMoE *r, const int *choice, const int *keep, int gm, int b,
                            int g, const int *chg, int upstream, RouteDiff *d, RouteTally *s) {
    const ModelConfig *c = &m->config;
    int T = m->T, Tg = r->T, k = c->topk, E = c->num_experts, R = r->R;
    size_t mine = (size_t)b * T * k, ref = (((size_t)gm * R + g) * Tg) * k;
    int clear = upstream == Tg;
    for (int t = 0; t < T; t++) {
        int pos = seq_pos(m->seqpos, t);
        float margin = r->topk_margin[((size_t)gm * R + g) * Tg + pos];
        const int *ch = choice + mine + (size_t)t * k, *kp = keep + mine + (size_t)t * k;
        const int *rch = r->choice + ref + (size_t)pos * k, *rkp = r->keep + ref + (size_t)pos * k;
        int same = !memcmp(ch, rch, k * sizeof(int));
        s->flips += !same;
        if (m->grid->tp_rank == 0) {
            route_token_moved(ch, kp, rch, rkp, k, E, c->norm_topk && k > 1, d->moved + (size_t)gm * E);
        }
        for (int q = 0; q < k && same; q++) {   // a keep that differs with the same choices: its cause
            if ((kp[q] != 0) == (rkp[q] != 0)) { continue; }
            s->keep_differ++;
            s->keep_unexplained += upstream == Tg && !chg[ch[q]] &&
                                   !(r->cap_margin[((size_t)gm * R + g) * E + ch[q]] <= ROUTE_MARGIN);
        }
        if (pos >= upstream) { s->tok_downstream++; continue; }
        if (margin > ROUTE_MARGIN) { s->tok_compared++; s->tok_differ += !same; } else { clear = 0; }
        if (!same && margin > s->flip_margin) { s->flip_margin = margin; }
    }
    return clear;
}

// compare_routing's second pass on one row (as route_row_first_diff; first and changed: every rank's): its tokens
// (route_row_tokens), then the (layer, sequence) whole, choices and keep masks, when every margin of its decisions
// is clear and nothing upstream differs; tallied into s.
static void route_row_compare(const Model *m, const RefMoE *r, const int *choice, const int *keep, int gm, int b,
                              int g, const int *first, const int *changed, RouteDiff *d, RouteTally *s) {
    int T = m->T, Tg = r->T, k = m->config.topk, E = m->config.num_experts, R = r->R, upstream = Tg;
    size_t mine = (size_t)b * T * k, ref = (((size_t)gm * R + g) * Tg) * k;
    for (int q = 0; q < gm; q++) {
        upstream = first[(size_t)q * R + g] < upstream ? first[(size_t)q * R + g] : upstream;
    }
    int clear = route_row_tokens(m, r, choice, keep, gm, b, g, changed + ((size_t)gm * R + g) * E, upstream, d, s);
    for (int e = 0; e < E; e++) { clear &= r->cap_margin[((size_t)gm * R + g) * E + e] > ROUTE_MARGIN; }
    if (!clear) { s->seq_skipped++; return; }
    s->seq_compared++;
    for (int t = 0; t < T; t++) {
        size_t q = (size_t)seq_pos(m->seqpos, t) * k;
        if (memcmp(choice + mine + (size_t)t * k, r->choice + ref + q, k * sizeof(int)) ||
            memcmp(keep + mine + (size_t)t * k, r->keep + ref + q,
                   k * sizeof(int))) { s->seq_differ++; break; }
    }
}

// One pass of compare_routing over this rank's rows: per micro-batch i, per MoE layer of this stage in the log's
// order, per row b (the reference's row g). Pass 0 fills first and changed (route_row_first_diff), pass 1 compares
// and tallies into s (route_row_compare).
static void route_compare_pass(const Model *m, const RefMoE *r, const int *log, int accum, int pass, int *first,
                               int *changed, RouteDiff *d, RouteTally *s) {
    const ModelConfig *c = &m->config;
    int B = m->B, k = c->topk, dp = m->grid->dp, nmoe = stage_moe_layers(m);
    for (int i = 0; i < accum; i++) {
        int j = 0;
        for (int l = 0; l < m->Ls; l++) {
            if (!is_moe_layer(c, m->layer_id[l])) { continue; }
            const int *choice = log + ((size_t)i * nmoe + j) * route_entry(m), *keep = choice + (size_t)m->BT * k;
            int gm = 0;   // the model's MoE layers before this one
            for (int q = 0; q < m->layer_id[l]; q++) { gm += is_moe_layer(c, q); }
            for (int b = 0; b < B; b++) {
                int g = (i * dp + m->grid->dp_rank) * B + b;
                if (pass == 0) { route_row_first_diff(m, r, choice, keep, gm, b, g, first, changed); }
                else { route_row_compare(m, r, choice, keep, gm, b, g, first, changed, d, s); }
            }
            j++;
        }
    }
}

// compare_routing's verdict on its tallies (s): the compared choices and (layer, sequence) pairs are the
// reference's, and every keep that differs with the same choices has a cause the margins allow.
static void check_route_tally(const RouteTally *s) {
    check(s->tok_differ == 0 && s->seq_differ == 0 && s->tok_compared > 0,
          "routing: %ld tokens with a top-k margin > %.0e compared, %ld differ from the reference's choices (%ld "
          "after a token "
          "routed otherwise upstream not compared); %ld (layer, sequence) pairs with every margin clear compared, %ld differ in "
          "choices or capacity keep masks (%ld not compared); largest margin of a compared choice that differs "
          "%.1e",
          s->tok_compared, ROUTE_MARGIN, s->tok_differ, s->tok_downstream, s->seq_compared, s->seq_differ,
          s->seq_skipped, s->flip_margin);
    check(s->keep_unexplained == 0,
          "routing: %ld assignments kept or dropped otherwise than the reference's with the same choices, %ld of "
          "them without a cause the margins allow (capacity margin <= %.0e, a choice of that expert changed in "
          "the sequence, a token routed otherwise upstream)", s->keep_differ, s->keep_unexplained, ROUTE_MARGIN);
}

// The routing of a step (model.route_log: per micro-batch i, per MoE layer of this stage in the stage's
// order, choice then keep (BT, k) each) against the reference's: micro-batch i's row b on dp rank r is the
// reference's row (i dp + r) B + b. A token's top-k choice (experts in order of p) depends on its router
// row: it is compared when its decision margin exceeds ROUTE_MARGIN (the others may flip with rounding)
// and no earlier MoE layer routed a token of its sequence at or before its position otherwise (a token
// sent to another expert, or dropped, changes its row and, through causal attention, the rows after it).
// The capacity keep masks depend on the whole sequence: a (layer, sequence) is compared, choices and keep
// masks, when every margin of its decisions is clear and nothing upstream differs. The largest margin of
// a compared choice that differs is printed: it is what ROUTE_MARGIN must stay above. Token by token, a keep
// that differs where the choices are the same must have a cause the margins allow: its expert's capacity
// margin in that sequence <= ROUTE_MARGIN (p near a tie at the capacity's edge), a choice involving that expert
// changed in that sequence (its candidates changed), or a token of the sequence routed otherwise upstream (their
// p changed). Fills d->moved (every rank: the sums over the world, tp rank 0's tokens). Collective (the earlier
// layers may be on other stages); returns the tokens of this rank whose choice differs.
static long compare_routing(Model *m, const RefMoE *r, const int *log, int accum, RouteDiff *d) {
    int Tg = r->T, E = m->config.num_experts, R = r->R;
    int nmoe = stage_moe_layers(m);
    // first[gm][g]: the first position of row g whose choice or keep differs in MoE layer gm (Tg: none), all ranks'.
    // This rank's token t is at position seq_pos(m->seqpos, t) of its sequence (cp: Tg = cp T)
    int *first = (int *)malloc_check(sizeof(int) * ((size_t)r->Lm * R + 1));
    // changed[gm][g][e]: a token of row g whose choice differs has e among its or the reference's choices, all ranks'
    int *changed = (int *)calloc_check((size_t)r->Lm * R * E + 1, sizeof(int));
    for (size_t q = 0; q < (size_t)r->Lm * R; q++) { first[q] = Tg; }
    RouteTally s;
    memset(&s, 0, sizeof(s));
    route_compare_pass(m, r, log, accum, 0, first, changed, d, &s);
    MPI_Allreduce(MPI_IN_PLACE, first, r->Lm * R, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, changed, r->Lm * R * E, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    route_compare_pass(m, r, log, accum, 1, first, changed, d, &s);
    free(first);
    free(changed);
    MPI_Allreduce(MPI_IN_PLACE, d->moved, r->Lm * E, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (nmoe == 0) { return 0; }   // no MoE layer on this stage
    check_route_tally(&s);
    return s.flips;
}



#ifndef USE_CUDA
// The CPU build's MoE fast paths against their loops (moe.h): the capacity masks by sorting = the rank counts of
// moe_capacity_keep_body, exactly, for both drop policies, one part and two cp parts, with ties in p (scores drawn
// from 8 values: equal p then order by position); the router's logits and gradients through sgemm = the loops within
// fp32 rounding (sums of C terms: |d| <= 1e-5 relative to the sum of |terms|).
static void check_moe_cpu(void) {
    Rng rng;
    rng_init(&rng, 31);
    int B = 4, T = 24, k = 2, E = 6, cap = 5;
    size_t n = (size_t)B * T * k;
    int *choice = (int *)malloc_check(sizeof(int) * n), *keep1 = (int *)malloc_check(sizeof(int) * n),
        *keep2 = (int *)malloc_check(sizeof(int) * n);
    float *cprob = (float *)malloc_check(sizeof(float) * n);
    for (size_t a = 0; a < n; a += k) {   // k distinct experts per token, scores from 8 values
        choice[a] = rng_u32(&rng) % E;
        choice[a + 1] = (choice[a] + 1 + rng_u32(&rng) % (E - 1)) % E;
        cprob[a] = (1 + rng_u32(&rng) % 8) / 8.0f;
        cprob[a + 1] = (1 + rng_u32(&rng) % 8) / 8.0f;
    }
    long differ = 0, kept = 0;
    for (int policy = 0; policy < 2; policy++) {
        DropPolicy p = policy ? DROP_POSITION : DROP_PROBS;
        moe_capacity_keep_cpu(keep1, choice, cprob, 1, 0, B, T, k, cap, p);
        moe_capacity_keep_sorted(keep2, choice, cprob, 1, 0, B, T, k, E, cap, p);
        for (size_t i = 0; i < n; i++) { differ += keep1[i] != keep2[i]; kept += keep1[i]; }
        for (int me = 0; me < 2; me++) {   // two cp parts of B/2 sequences of 2T tokens
            moe_capacity_keep_cpu(keep1, choice, cprob, 2, me, B / 2, T, k, 2 * cap, p);
            moe_capacity_keep_sorted(keep2, choice, cprob, 2, me, B / 2, T, k, E, 2 * cap, p);
            for (size_t i = 0; i < n / 2; i++) { differ += keep1[i] != keep2[i]; kept += keep1[i]; }
        }
    }
    long total = 4 * (long)n;   // 2 policies x (one part of n, two parts of n / 2)
    check(differ == 0 && kept > 0 && kept < total,
          "MoE capacity masks by sorting = the rank counts (2 policies, 1 and 2 cp parts, tied scores): %ld of %ld "
          "assignments differ (%ld kept: some dropped)", differ, total, kept);
    int N = 37, C = 48;
    float *x = (float *)malloc_check(sizeof(float) * N * C), *wr = (float *)malloc_check(sizeof(float) * E * C);
    float *dl = (float *)malloc_check(sizeof(float) * N * E);
    for (int i = 0; i < N * C; i++) { x[i] = rng_normal(&rng, 0.0f, 1.0f); }
    for (int i = 0; i < E * C; i++) { wr[i] = rng_normal(&rng, 0.0f, 0.1f); }
    for (int i = 0; i < N * E; i++) { dl[i] = rng_normal(&rng, 0.0f, 1.0f); }
    float *p1 = (float *)calloc_check(N * E, sizeof(float)), *p2 = (float *)calloc_check(N * E, sizeof(float));
    float *l1 = (float *)calloc_check(N, sizeof(float)), *l2 = (float *)calloc_check(N, sizeof(float));
    float *w1 = (float *)calloc_check(E * C, sizeof(float)), *w2 = (float *)calloc_check(E * C, sizeof(float));
    float *d1 = (float *)calloc_check(N * C, sizeof(float)), *d2 = (float *)calloc_check(N * C, sizeof(float));
    moe_router_forward_cpu(p1, l1, x, wr, N, C, E, 0);
    moe_router_forward_blas(p2, l2, x, wr, N, C, E, 0);
    moe_router_dweight_cpu(w1, dl, x, N, C, E);
    moe_router_dweight_blas(w2, dl, x, N, C, E);
    moe_router_dinput_cpu(d1, dl, wr, N, C, E);
    moe_router_dinput_blas(d2, dl, wr, N, C, E);
    double worst = 0;   // |blas - loop| / (1e-30 + scale), scale: the terms' sizes (sum |terms| bounded by C or N max)
    for (int i = 0; i < N * E; i++) { worst = fmax(worst, fabs(p1[i] - p2[i]) / 1.0); }
    for (int i = 0; i < N; i++) { worst = fmax(worst, fabs(l1[i] - l2[i]) / (1.0 + fabs(l1[i]))); }
    for (int i = 0; i < E * C; i++) { worst = fmax(worst, fabs(w1[i] - w2[i]) / N); }
    for (int i = 0; i < N * C; i++) { worst = fmax(worst, fabs(d1[i] - d2[i]) / (0.1 * E)); }
    check(worst <= 1e-5, "MoE router through sgemm = its loops (probs, lse, weight and input gradients): worst %.2e "
          "relative to the terms' size (<= 1e-5)", worst);
    free(choice); free(keep1); free(keep2); free(cprob); free(x); free(wr); free(dl);
    free(p1); free(p2); free(l1); free(l2); free(w1); free(w2); free(d1); free(d2);
}
#endif
