// Resume: the same layout checkpointed and resumed equals the uninterrupted run (--check-resume), and another
// layout resumes it (--resume-from; --mutate breaks it on purpose), with the routing gathered to compare.
// Included by test_gpt.cu after its harness's first part (check(), the tolerances), as one translation unit.

// ----------------------------------------------------------------------------
// resume: in the same layout bit for bit; in another layout, what layout A computes from its checkpoint

#define RESUME_STEP 5

// The full gradient of unit u (its tp slice) on every rank of its data-parallel group: the owned
// shards, all-gathered (ZeRO 0: every rank owns it all). For checkpoint_gather.
static void unit_grads_getter(Zero *z, int u, int which, float *host) {
    (void)which;
    const Unit *U = &z->units[u];
    size_t start, len;
    if (z->stage == 0) { zero_get_owned_grads(z, u, host, &start, &len); return; }
    float *shard = (float *)calloc(U->shard, sizeof(float)), *padded = (float *)malloc_check(U->padded * sizeof(float));
    if (shard == NULL) { fail("out of host memory"); }
    zero_get_owned_grads(z, u, shard, &start, &len);
    MPI_Allgather(shard, (int)U->shard, MPI_FLOAT, padded, (int)U->shard, MPI_FLOAT, U->dpg->mpi);
    memcpy(host, padded, U->size * sizeof(float));
    free(shard); free(padded);
}

// The logged routing of a step on rank 0 as the reference's arrays: choice, keep (Lm, R, Tg, k) and
// probs (Lm, R, Tg, E) of every MoE layer, global row and sequence position (each written by the one
// rank that holds it: tp rank 0 of its stage, dp rank and cp part; summed over the world).
static void gather_routing(Model *m, const int *log, int accum, int R, int Tg, int **choice_out, int **keep_out,
                           float **probs_out) {
    const ModelConfig *c = &m->config;
    int k = c->topk, E = c->num_experts, Lm = num_moe_layers(c), B = m->B, T = m->T, dp = m->grid->dp;
    size_t nk = (size_t)Lm * R * Tg * k, ne = (size_t)Lm * R * Tg * E;
    int *choice = (int *)calloc(nk, sizeof(int)), *keep = (int *)calloc(nk, sizeof(int));
    float *probs = (float *)calloc(ne, sizeof(float));
    if (!choice || !keep || !probs) { fail("out of host memory"); }
    for (int i = 0, j; i < accum && m->grid->tp_rank == 0; i++) {
        j = 0;
        for (int l = 0; l < m->Ls; l++) {
            if (!is_moe_layer(c, m->layer_id[l])) { continue; }
            const int *e = log + ((size_t)i * stage_moe_layers(m) + j++) * route_entry(m);
            int gm = 0;
            for (int q = 0; q < m->layer_id[l]; q++) { gm += is_moe_layer(c, q); }
            for (int b = 0; b < B; b++) {
                size_t g = (size_t)(i * dp + m->grid->dp_rank) * B + b;
                for (int tt = 0; tt < T; tt++) {
                    size_t src = (size_t)b * T + tt, dst = ((size_t)gm * R + g) * Tg + seq_pos(m->seqpos, tt);
                    memcpy(choice + dst * k, e + src * k, k * sizeof(int));
                    memcpy(keep + dst * k, e + (size_t)m->BT * k + src * k, k * sizeof(int));
                    memcpy(probs + dst * E, e + (size_t)m->BT * 2 * k + src * E, E * sizeof(float));
                }
            }
        }
    }
    int root = my_rank == 0;
    MPI_Reduce(root ? MPI_IN_PLACE : choice, choice, (int)nk, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(root ? MPI_IN_PLACE : keep, keep, (int)nk, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(root ? MPI_IN_PLACE : probs, probs, (int)ne, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
    *choice_out = choice; *keep_out = keep; *probs_out = probs;
}

// The decision margins of a routing, as gpt2_ref.py defines them: per token the smallest gap between
// consecutive keys p_e + b_e (bias (Lm, E): the routing bias of the step, or NULL) among its first
// min(k, E-1) + 1 in descending order; per (sequence, expert),
// probs policy with more candidates than the capacity, the gap between the last kept assignment's p_e
// and the first dropped one's (infinite where there is no decision).
static float routing_margins(const RefMoE *r, const int *choice, const float *probs, const float *bias, int cap,
                             float *topk_margin, float *cap_margin) {
    int E = r->E, k = r->k, T = r->T, J = k < E - 1 ? k : E - 1;
    float least = INFINITY, *sp = (float *)malloc_check(sizeof(float) * E),
        *cp = (float *)malloc_check(sizeof(float) * T * k);
    int *ct = (int *)malloc_check(sizeof(int) * T * k);
    for (size_t q = 0; q < (size_t)r->Lm * r->R; q++) {
        for (int t = 0; t < T; t++) {
            const float *p = probs + (q * T + t) * E, *b = bias ? bias + (q / r->R) * E : NULL;
            for (int e = 0; e < E; e++) { sp[e] = b ? p[e] + b[e] : p[e]; }
            for (int i = 1; i < E; i++) { for (int j = i; j > 0
                                               && sp[j] > sp[j - 1]; j--) { float x = sp[j]; sp[j] = sp[j - 1]; sp[j - 1] = x; } }
            float mg = INFINITY;
            for (int j = 0; j < J; j++) { mg = fminf(mg, sp[j] - sp[j + 1]); }
            topk_margin[q * T + t] = mg;
            least = fminf(least, mg);
        }
        for (int e = 0; e < E; e++) {   // candidates of expert e ordered by (-p_e, position)
            int n = 0;
            for (int t = 0; t < T; t++) {
                for (int j = 0; j < k; j++) {
                    if (choice[(q * T + t) * k + j] != e) { continue; }
                    float pe = probs[(q * T + t) * E + e];
                    int i = n++;
                    while (i > 0 && (cp[i - 1] < pe || (cp[i - 1] == pe && ct[i - 1] > t))) {
                        cp[i] = cp[i - 1];
                        ct[i] = ct[i - 1];
                        i--;
                    }
                    cp[i] = pe; ct[i] = t;
                }
            }
            float mg = r->policy == 0 && n > cap ? cp[cap - 1] - cp[cap] : INFINITY;
            cap_margin[q * E + e] = mg;
            least = fminf(least, mg);
        }
    }
    free(sp); free(cp); free(ct);
    return least;
}

// Layout A's results of the step after its checkpoint, written as a reference directory (dir/step5:
// state.bin and moe.bin in gpt2_ref.py's formats) for layout B (check_resume_from): the loss, the
// gradients in file order, the norm, the MoE numbers and routing with its margins, and the losses of
// the steps after (here: steps RESUME_STEP .. nsteps-1 as steps 0 ..).
typedef struct {
    float *grads, loss, norm, aux, z, dropped;
    int *choice, *keep;
    float *probs;
    float *bias;   // (Lm, E) the routing bias the step routed with
} StepDump;

static void write_step_dump(TestRun *t, const char *dir, const StepDump *d, const float *losses, const float *norms,
                            int n) {
    char path[PATH_LEN];
    path_join(path, dir, "step%d", RESUME_STEP);
    mkdir(path, 0755);
    const RefState *ref = &t->ref;
    int h[256] = {20241129, 1, ref->T, ref->R, n, ref->warmup};
    float fh[256] = {ref->lr, ref->beta1, ref->beta2, ref->eps, ref->weight_decay, ref->clip, ref->final_frac, d->loss,
                     d->norm};
    path_join(path, dir, "step%d/state.bin", RESUME_STEP);
    FILE *f = fopen_check(path, "wb");
    fwrite_check(h, sizeof(int), 256, f, path);
    fwrite_check(fh, sizeof(float), 256, f, path);
    fwrite_check(d->grads, sizeof(float), num_parameters(&t->config), f, path);
    fwrite_check(losses, sizeof(float), n, f, path);
    fwrite_check(norms, sizeof(float), n, f, path);
    fclose_check(f, path);
    if (t->config.num_experts == 0) { return; }
    RefMoE r = {1, t->config.num_experts, t->config.topk, t->config.moe_every, t->moe.cap1000,
                t->moe.policy == DROP_POSITION,
                num_moe_layers(&t->config), ref->R, ref->T, n};
    size_t nt = (size_t)r.Lm * r.R * r.T;
    float *topk_margin = (float *)malloc_check(sizeof(float) * nt),
        *cap_margin = (float *)malloc_check(sizeof(float) * r.Lm * r.R * r.E);
    float least = routing_margins(&r, d->choice, d->probs, d->bias, moe_capacity(r.k, r.T, r.E, r.F1000), topk_margin,
                                  cap_margin);
    int mh[256] = {20241130, 2, r.E, r.k, r.every, r.F1000, r.policy, r.Lm, r.R, r.T, n, 0};   // (no loads)
    float mfh[256] = {t->moe.aux_coeff, t->moe.z_coeff, d->aux, d->z, d->dropped, least, t->moe.bias_rate};
    path_join(path, dir, "step%d/moe.bin", RESUME_STEP);
    f = fopen_check(path, "wb");
    fwrite_check(mh, sizeof(int), 256, f, path);
    fwrite_check(mfh, sizeof(float), 256, f, path);
    fwrite_check(d->choice, sizeof(int), nt * r.k, f, path);
    fwrite_check(d->keep, sizeof(int), nt * r.k, f, path);
    fwrite_check(topk_margin, sizeof(float), nt, f, path);
    fwrite_check(cap_margin, sizeof(float), (size_t)r.Lm * r.R * r.E, f, path);
    fclose_check(f, path);
    printf("  layout A's step %d written to %s/step%d (smallest routing margin %.2e)\n", RESUME_STEP, dir, RESUME_STEP,
           least);
    free(topk_margin); free(cap_margin);
}

// A model of the run's layout resumed from the checkpoint of `step` in dir: its model file (which must have
// the tested shape) and its state file.
static void test_model_resumed(TestRun *t, Model *m, DataLoader *dl, Rng *rng, const char *dir, int step) {
    char path[PATH_LEN];
    path_join(path, dir, "model_%08d.bin", step);
    ModelConfig c;
    float *params = read_model_file(path, &c);
    check(!memcmp(&c, &t->config, sizeof(c)), "checkpoint: the model file keeps the shape (E %d k %d every %d)",
          c.num_experts, c.topk, c.moe_every);
    test_model(t, m, &c, params, dl);
    free(params);
    load_state(m, dir, step, dl, rng, t->args.layout.total_batch);
}

// Same layout: a fresh model trains to step RESUME_STEP, checkpoints into dir, and goes on; a model
// resumed from that checkpoint must repeat the steps after it bit for bit. Also writes what this layout
// (layout A) computes at the step after the checkpoint (write_step_dump), for check_resume_from.
static void check_resume(TestRun *t, const char *dir) {
    int nsteps = t->ref.nsteps, accum = t->accum;
    if (nsteps <= RESUME_STEP || nsteps > 64) {
        fail("--check-resume needs a reference of %d to 64 steps", RESUME_STEP + 1);
    }
    if (my_rank == 0) { mkdir(dir, 0755); }
    MPI_Barrier(MPI_COMM_WORLD);
    Model run;
    DataLoader dl;
    test_model(t, &run, &t->config, t->params, &dl);
    Rng rng;
    rng_init(&rng, 1);
    float uninterrupted[64], norms[64];
    StepDump d = {};
    for (int s = 0; s < nsteps; s++) {
        int dump = s == RESUME_STEP;
        int *log = dump ? (int *)malloc_check(sizeof(int) * (route_entry(&run) * stage_moe_layers(&run) * accum + 1))
                : NULL;
        run.moe.route_log.entries = log;
        run.moe.route_log.micros = accum;
        gpt2_forward_backward(&run, &dl, accum);
        run.moe.route_log.entries = NULL;
        if (dump) {
            d.loss = gpt2_read_loss(&run, accum);
            if (t->config.num_experts > 0) {
                double aux, z, dropped;
                moe_step_numbers(&run.moe, run.grid, (double)run.B * accum * run.grid->dp, (double)run.T * run.grid->cp,
                                 &aux, &z, &dropped);
                d.aux = (float)aux; d.z = (float)z; d.dropped = (float)dropped;
                gather_routing(&run, log, accum, t->ref.R, t->ref.T, &d.choice, &d.keep, &d.probs);
                d.bias = moe_gather_bias(&run.moe, run.grid, num_moe_layers(&run.config));
            }
            d.grads = checkpoint_gather(&run.config, &run.zero, unit_grads_getter, 0);
            free(log);
        }
        StepResult r = gpt2_update(&run, &t->opt, lr_at(&t->sched, s), s);
        uninterrupted[s] = r.loss; norms[s] = r.norm;
        if (dump) { d.norm = r.norm; }
        if (s + 1 == RESUME_STEP) { save_checkpoint(&run, dir, RESUME_STEP, &dl, &rng, t->args.layout.total_batch, 0, t->ref.nsteps); }
    }
    if (my_rank == 0) {
        write_step_dump(t, dir, &d, uninterrupted + RESUME_STEP, norms + RESUME_STEP, nsteps - RESUME_STEP);
    }
    free(d.grads); free(d.choice); free(d.keep); free(d.probs); free(d.bias);
    int step = latest_checkpoint(dir);
    check(step == RESUME_STEP, "checkpoint: newest complete checkpoint is step %d (expected %d)", step, RESUME_STEP);
    Model resumed;
    DataLoader dl3;
    Rng rng3;
    test_model_resumed(t, &resumed, &dl3, &rng3, dir, step);
    int same = 1;
    for (int s = step; s < nsteps; s++) {
        gpt2_forward_backward(&resumed, &dl3, accum);
        float l = gpt2_update(&resumed, &t->opt, lr_at(&t->sched, s), s).loss;
        if (memcmp(&l, &uninterrupted[s], sizeof(float)) != 0) { same = 0; }
        if (my_rank == 0) { printf("  resume step %d: %.9f vs uninterrupted %.9f\n", s, l, uninterrupted[s]); }
    }
    check(same, "resume from step %d reproduces steps %d..%d bit for bit", step, step, nsteps - 1);
    check(rng3.s == rng.s, "resume restores the generator state");
}

// --mutate experts: a copy of the checkpoint in dir whose state file stores experts 0 and 1 of every MoE
// layer swapped (m, v and master), with a valid checksum: the resume check must fail on it.
static void mutate_checkpoint_experts(TestRun *t, const char *dir, const char *out) {
    const ModelConfig *c = &t->config;
    if (c->num_experts < 2) { fail("--mutate experts needs a reference with 2 or more experts"); }
    if (my_rank == 0) {
        mkdir(out, 0755);
        char src[PATH_LEN], dst[PATH_LEN];
        path_join(src, dir, "model_%08d.bin", RESUME_STEP);
        path_join(dst, out, "model_%08d.bin", RESUME_STEP);
        FILE *in = fopen_check(src, "rb"), *o = fopen_check(dst, "wb");
        char buf[1 << 16];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), in)) > 0) { fwrite_check(buf, 1, n, o, dst); }
        fclose(in); fclose_check(o, dst);
        path_join(src, dir, "state_%08d.bin", RESUME_STEP);
        path_join(dst, out, "state_%08d.bin", RESUME_STEP);
        in = fopen_check(src, "rb");
        int h[256];
        fread_check(h, sizeof(int), 256, in, src);
        size_t P = num_parameters(c);
        int nstates = h[SH_MASTER] ? 3 : 2;
        float *st[3];
        size_t bytes[3];
        for (int i = 0; i < nstates; i++) {
            st[i] = (float *)malloc_check(P * sizeof(float));
            bytes[i] = P * sizeof(float);
            fread_check(st[i], sizeof(float), P, in, src);
            float *ptr[NUM_TENSORS];
            split_tensors(c, st[i], ptr);
            for (int id = T_EFCW; id <= T_EFCPROJB; id++) {
                TensorSpec sp = tensor_spec(c, id);
                size_t blk = sp.rows * sp.cols;
                for (int l = 0; l < sp.layers; l++) {
                    float *e0 = ptr[id] + (size_t)l * sp.nblk * blk;
                    for (size_t q = 0; q < blk; q++) { float x = e0[q]; e0[q] = e0[blk + q]; e0[blk + q] = x; }
                }
            }
        }
        fclose(in);
        char err[256];
        const void *parts[3] = {st[0], st[1], nstates == 3 ? st[2] : NULL};
        if (write_file_atomic(dst, h, parts, bytes, nstates, err, sizeof(err))) { fail("%s", err); }
        for (int i = 0; i < nstates; i++) { free(st[i]); }
        path_join(dst, out, "DONE_%08d", RESUME_STEP);
        fclose_check(fopen_check(dst, "wb"), dst);
        printf("  --mutate experts: %s holds the checkpoint with experts 0 and 1 swapped in the state\n", out);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

// Another layout (layout B) resumes layout A's checkpoint in dir (written by a --check-resume run):
// the step after it must compute what layout A computed from the same checkpoint (dir/step5: loss,
// routing where margins allow, every owned gradient element, norm; tolerances as against PyTorch: only
// the summation order differs), and the steps after that the losses of layout A and of the reference.
// mutation (the check must then fail): "experts" (the state's experts stored in another order),
// "data-round" (the data position one accumulation round off).
static void check_resume_from(TestRun *t, const char *dir, const char *mutation) {
    // layout A's results in dir/step5; the checkpoint in dir (or its mutated copy)
    char path[PATH_LEN], ckdir[PATH_LEN];
    snprintf(ckdir, sizeof(ckdir), "%s", dir);
    if (mutation && !strcmp(mutation, "experts")) {
        snprintf(ckdir, sizeof(ckdir), "%s/mutated_experts", dir);
        mutate_checkpoint_experts(t, dir, ckdir);
    } else if (mutation && strcmp(mutation, "data-round")) {
        fail_all(my_rank, "--mutate: expected experts or data-round, got '%s'", mutation);
    }
    int step = latest_checkpoint(ckdir);
    if (step != RESUME_STEP) {
        fail_all(my_rank, "--resume-from %s: expected a checkpoint at step %d (a --check-resume run's), found %d",
                 ckdir, RESUME_STEP, step);
    }
    RefState a5;
    RefMoE a5moe;
    path_join(path, dir, "step%d", RESUME_STEP);
    read_ref_moe(path, &a5moe);
    path_join(path, dir, "step%d/state.bin", RESUME_STEP);
    read_ref_state(path, &t->config, &a5);
    if (a5.nsteps != t->ref.nsteps - RESUME_STEP) {
        fail_all(my_rank, "%s: %d steps, expected %d", path, a5.nsteps, t->ref.nsteps - RESUME_STEP);
    }
    Model m;
    DataLoader dl;
    Rng rng;
    test_model_resumed(t, &m, &dl, &rng, ckdir, step);
    if (mutation && !strcmp(mutation, "data-round")) { dataloader_seek_rounds(&dl, (uint64_t)step * t->accum + 1); }
    float losses[64];
    double ep_rows;
    losses[0] = check_step(t, &m, &dl, &a5, &a5moe, step, "layout A from the same checkpoint", &ep_rows).loss;
    for (int s = step + 1; s < t->ref.nsteps; s++) {
        gpt2_forward_backward(&m, &dl, t->accum);
        losses[s - step] = gpt2_update(&m, &t->opt, lr_at(&t->sched, s), s).loss;
    }
    check_losses(losses, a5.losses, a5.nsteps, step, "against layout A's from the same checkpoint", measured_loss_tol(t));
    check_losses(losses, t->ref.losses + step, a5.nsteps, step, "against the reference's", measured_loss_tol(t));
}
