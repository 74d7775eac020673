/*
test_gpt: runs any parallel configuration of train_gpt against a PyTorch reference state
(dev/reference/gpt2_ref.py) and checks, on every rank, the part that rank owns:
  - the loss of the first batch, and every gradient element this rank owns (its tp slice of each
    tensor, its ZeRO shard), before clipping;
  - the global gradient norm; the losses of the 10 AdamW steps; the parameters after them;
  - optionally: resume from a checkpoint at step 5 equals the uninterrupted run bit for bit
    (--check-resume DIR), the memory report against the ZeRO / SP / chunked-CE formulas
    (--check-memory), the comm report against the ring formulas (--check-comm).
usage: mpirun -np N ./test_gpt --ref DIR [--check-resume DIR] [--check-memory] [--check-comm] [train_gpt flags]
       mpirun -np N ./test_gpt --ref DIR --bad-file-on-rank R   (rank R fails on a file: every rank must exit)
Prints one line per check and closes with "N passed, N failed" (rank 0, summed over ranks).
*/
#define TESTING
#include "train_gpt.cu"

// ----------------------------------------------------------------------------
// the tolerances, all in one place (fp32 CPU build; the bf16 GPU build uses its own row)
#if defined(USE_CUDA) && !defined(ENABLE_FP32)
static const float GRAD_ATOL = 1e-2f, GRAD_RTOL = 5e-2f;   // bf16 activations and gradients
static const float LOSS_TOL = 5e-2f;                        // per step, as llm.c's bf16 check
static const float NORM_RTOL = 5e-2f;
static const float ROUTE_MARGIN = 5e-3f;                    // bf16 router inputs: only clear decisions compare
                                                            // (H200: flips up to a margin of 3.9e-4 on refs/moe*)
#else
static const float GRAD_ATOL = 1e-5f, GRAD_RTOL = 1e-4f;   // |g - ref| <= ATOL + RTOL |ref|, per element
static const float LOSS_TOL = 1e-5f;                        // |loss - ref| <= LOSS_TOL * |ref| (also MoE aux, z)
static const float NORM_RTOL = 1e-5f;
static const float ROUTE_MARGIN = 1e-5f;   // MoE: the routing of a (layer, sequence) is compared with the reference's
                                           // when every decision's margin (gap in p) exceeds this
#endif
static const double DROP_TOL = 1e-6;       // MoE: dropped fraction (a count ratio: equal when the masks are)

static int n_passed = 0, n_failed = 0;
static int my_rank = 0;

// Records one check on this rank; prints failures from any rank and passes from rank 0.
static void check(int ok, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (ok) { n_passed++; } else { n_failed++; }
    if (!ok || my_rank == 0) { printf("[rank %d] %s %s\n", my_rank, ok ? "ok  " : "FAIL", msg); fflush(stdout); }
}

typedef struct {
    int T, R, nsteps, warmup;
    float lr, beta1, beta2, eps, weight_decay, clip, final_frac, loss0, norm0;
    float *grads;        // 16 tensors, file order
    float *losses, *norms;
} RefState;

static void read_ref_state(const char *path, const GPT2Config *c, RefState *s) {
    FILE *f = fopen_check(path, "rb");
    int h[256];
    float fh[256];
    fread_check(h, sizeof(int), 256, f, path);
    if (h[0] != 20241129 || h[1] != 1) { fail("reference state '%s' has bad magic/version", path); }
    fread_check(fh, sizeof(float), 256, f, path);
    s->T = h[2]; s->R = h[3]; s->nsteps = h[4]; s->warmup = h[5];
    s->lr = fh[0]; s->beta1 = fh[1]; s->beta2 = fh[2]; s->eps = fh[3]; s->weight_decay = fh[4]; s->clip = fh[5];
    s->final_frac = fh[6]; s->loss0 = fh[7]; s->norm0 = fh[8];
    size_t P = num_parameters(c);
    s->grads = (float *)malloc_check(P * sizeof(float));
    s->losses = (float *)malloc_check(s->nsteps * sizeof(float));
    s->norms = (float *)malloc_check(s->nsteps * sizeof(float));
    fread_check(s->grads, sizeof(float), P, f, path);
    fread_check(s->losses, sizeof(float), s->nsteps, f, path);
    fread_check(s->norms, sizeof(float), s->nsteps, f, path);
    // (the file ends with the parameters after the last step: not read, see compare_grads)
    fclose(f);
}

// The MoE part of a reference state (moe.bin, see gpt2_ref.py): its options, step-0 values, routing.
typedef struct {
    int present, E, k, every, F1000, policy, Lm, R, T, nsteps;
    float aux_coeff, z_coeff, aux0, z0, dropped0, min_margin;
    int *choice, *keep;                 // (Lm, R, T, k)
    float *topk_margin, *cap_margin;    // (Lm, R, T), (Lm, R, E)
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
    if (h[0] != 20241130 || h[1] != 1) { fail("reference '%s' has bad magic/version", path); }
    r->present = 1;
    r->E = h[2]; r->k = h[3]; r->every = h[4]; r->F1000 = h[5]; r->policy = h[6]; r->Lm = h[7]; r->R = h[8]; r->T = h[9]; r->nsteps = h[10];
    r->aux_coeff = fh[0]; r->z_coeff = fh[1]; r->aux0 = fh[2]; r->z0 = fh[3]; r->dropped0 = fh[4]; r->min_margin = fh[5];
    size_t n = (size_t)r->Lm * r->R * r->T * r->k;
    r->choice = (int *)malloc_check(n * sizeof(int));
    r->keep = (int *)malloc_check(n * sizeof(int));
    r->topk_margin = (float *)malloc_check((size_t)r->Lm * r->R * r->T * sizeof(float));
    r->cap_margin = (float *)malloc_check((size_t)r->Lm * r->R * r->E * sizeof(float));
    fread_check(r->choice, sizeof(int), n, f, path);
    fread_check(r->keep, sizeof(int), n, f, path);
    fread_check(r->topk_margin, sizeof(float), (size_t)r->Lm * r->R * r->T, f, path);
    fread_check(r->cap_margin, sizeof(float), (size_t)r->Lm * r->R * r->E, f, path);
    fclose(f);
}

// The routing of step 0 (model.route_log: per micro-batch i, per MoE layer of this stage in the stage's
// order, choice then keep (BT, k) each) against the reference's: micro-batch i's row b on dp rank r is the
// reference's row (i dp + r) B + b. A token's top-k choice (experts in order of p) depends on its router
// row: it is compared when its decision margin exceeds ROUTE_MARGIN (the others may flip with rounding)
// and no earlier MoE layer routed a token of its sequence at or before its position otherwise (a token
// sent to another expert, or dropped, changes its row and, through causal attention, the rows after it).
// The capacity keep masks depend on the whole sequence: a (layer, sequence) is compared, choices and keep
// masks, when every margin of its decisions is clear and nothing upstream differs. The largest margin of
// a compared choice that differs is printed: it is what ROUTE_MARGIN must stay above. Collective (the
// earlier layers may be on other stages); returns the tokens of this rank whose choice differs.
static long compare_routing(GPT2 *m, const RefMoE *r, const int *log, int accum) {
    const GPT2Config *c = &m->config;
    int B = m->B, T = m->T, Tg = r->T, k = c->topk, E = c->num_experts, dp = m->grid->dp, R = r->R;
    int nmoe = 0;   // MoE layers of this stage
    for (int l = 0; l < m->Ls; l++) { nmoe += is_moe_layer(c, m->layer_id[l]); }
    // first[gm][g]: the first position of row g whose choice or keep differs in MoE layer gm (Tg: none), all ranks'.
    // This rank's token t is at position seq_pos(m->seqpos, t) of its sequence (cp: Tg = cp T)
    int *first = (int *)malloc_check(sizeof(int) * ((size_t)r->Lm * R + 1));
    for (size_t q = 0; q < (size_t)r->Lm * R; q++) { first[q] = Tg; }
    for (int pass = 0; pass < 2; pass++) {
        long tok_compared = 0, tok_differ = 0, tok_downstream = 0, seq_compared = 0, seq_skipped = 0, seq_differ = 0, flips = 0;
        float flip_margin = 0.0f;
        for (int i = 0; i < accum; i++) {
            int j = 0;
            for (int l = 0; l < m->Ls; l++) {
                if (!is_moe_layer(c, m->layer_id[l])) { continue; }
                const int *choice = log + ((size_t)i * nmoe + j) * 2 * m->BT * k, *keep = choice + (size_t)m->BT * k;
                int gm = 0;   // the model's MoE layers before this one
                for (int q = 0; q < m->layer_id[l]; q++) { gm += is_moe_layer(c, q); }
                for (int b = 0; b < B; b++) {
                    int g = (i * dp + m->grid->dp_rank) * B + b, upstream = Tg;
                    size_t mine = (size_t)b * T * k, ref = (((size_t)gm * R + g) * Tg) * k;
                    if (pass == 0) {
                        int *f = &first[(size_t)gm * R + g];
                        for (int t = 0; t < T; t++) {
                            int pos = seq_pos(m->seqpos, t);
                            if (memcmp(choice + mine + (size_t)t * k, r->choice + ref + (size_t)pos * k, k * sizeof(int)) ||
                                memcmp(keep + mine + (size_t)t * k, r->keep + ref + (size_t)pos * k, k * sizeof(int))) { *f = pos < *f ? pos : *f; }
                        }
                        continue;
                    }
                    for (int q = 0; q < gm; q++) { upstream = first[(size_t)q * R + g] < upstream ? first[(size_t)q * R + g] : upstream; }
                    int clear = upstream == Tg;
                    for (int t = 0; t < T; t++) {
                        int pos = seq_pos(m->seqpos, t);
                        float margin = r->topk_margin[((size_t)gm * R + g) * Tg + pos];
                        int same = !memcmp(choice + mine + (size_t)t * k, r->choice + ref + (size_t)pos * k, k * sizeof(int));
                        flips += !same;
                        if (pos >= upstream) { tok_downstream++; continue; }
                        if (margin > ROUTE_MARGIN) { tok_compared++; tok_differ += !same; } else { clear = 0; }
                        if (!same && margin > flip_margin) { flip_margin = margin; }
                    }
                    for (int e = 0; e < E; e++) { clear &= r->cap_margin[((size_t)gm * R + g) * E + e] > ROUTE_MARGIN; }
                    if (!clear) { seq_skipped++; continue; }
                    seq_compared++;
                    for (int t = 0; t < T; t++) {
                        size_t q = (size_t)seq_pos(m->seqpos, t) * k;
                        if (memcmp(choice + mine + (size_t)t * k, r->choice + ref + q, k * sizeof(int)) ||
                            memcmp(keep + mine + (size_t)t * k, r->keep + ref + q, k * sizeof(int))) { seq_differ++; break; }
                    }
                }
                j++;
            }
        }
        if (pass == 0) { MPI_Allreduce(MPI_IN_PLACE, first, r->Lm * R, MPI_INT, MPI_MIN, MPI_COMM_WORLD); continue; }
        free(first);
        if (nmoe == 0) { return 0; }   // no MoE layer on this stage
        check(tok_differ == 0 && seq_differ == 0 && tok_compared > 0,
              "routing: %ld tokens with a top-k margin > %.0e compared, %ld differ from the reference's choices (%ld after a token "
              "routed otherwise upstream not compared); %ld (layer, sequence) pairs with every margin clear compared, %ld differ in "
              "choices or capacity keep masks (%ld not compared); largest margin of a compared choice that differs %.1e",
              tok_compared, ROUTE_MARGIN, tok_differ, tok_downstream, seq_compared, seq_differ, seq_skipped, flip_margin);
        return flips;
    }
    return 0;
}


// Compares the owned, reduced gradient of every unit against the same range cut from the full
// reference gradients, per element: |g - ref| <= GRAD_ATOL + GRAD_RTOL |ref|, reported per tensor.
// (Parameters after the AdamW steps are not compared element-wise: an element whose gradient is
// rounding noise, e.g. the key biases, whose exact gradient is 0, moves by +-lr whatever the noise;
// the step losses are the check of the optimizer.)
static void compare_grads(GPT2 *m, float *ref_all) {
    const GPT2Config *c = &m->config;
    float *ref[NUM_TENSORS];
    split_tensors(c, ref_all, ref);
    double worst[NUM_TENSORS] = {0};
    long bad[NUM_TENSORS] = {0}, checked[NUM_TENSORS] = {0};
    for (int u = 0; u < m->nunits; u++) {
        const Unit *U = &m->units[u];
        float *ref_unit = (float *)malloc_check(U->size * sizeof(float));
        unit_copy_full(c, U, ref, ref_unit, m->grid->tp, m->grid->tp_rank, 1);
        float *mine = (float *)malloc_check(U->size * sizeof(float));
        size_t start, len;
        zero_get_owned_grads(&m->zero, u, mine, &start, &len);
        for (int k = 0; k < U->ntensors; k++) {
            const UnitTensor *t = &U->t[k];
            size_t a = t->offset > start ? t->offset : start;
            size_t b = t->offset + t->size < start + len ? t->offset + t->size : start + len;
            for (size_t i = a; i < b; i++) {
                float g = mine[i - start], r = ref_unit[i];
                double err = fabs((double)g - r), lim = GRAD_ATOL + GRAD_RTOL * fabs(r);
                if (!(err <= lim)) { bad[t->id]++; }
                if (err - lim > worst[t->id] || err != err) { worst[t->id] = err != err ? INFINITY : err - lim; }
                checked[t->id]++;
            }
        }
        free(ref_unit);
        free(mine);
    }
    for (int i = 0; i < NUM_TENSORS; i++) {
        if (checked[i] == 0) { continue; }
        check(bad[i] == 0, "grad %-8s: %ld owned elements, %ld outside |g-ref| <= %.0e + %.0e|ref| (worst excess %.3e)",
              tensor_names[i], checked[i], bad[i], GRAD_ATOL, GRAD_RTOL, worst[i]);
    }
}

// Memory report vs the formulas (X bytes per floatX). P is the number of this rank's (its pipeline
// stage's, tp-sliced, its experts') parameters, Psh its share under ZeRO: each unit divided by its
// data-parallel group (dp, or cp x dp with context parallelism; edp for the experts); padding is at
// most p-1 elements per unit.
static void check_memory(GPT2 *m, int accum) {
    const GPT2Config *c = &m->config;
    Zero *z = &m->zero;
    int dp = m->grid->grad_group->size, Ls = m->Ls;
    double P = 0, Psh = 0, experts = 0;
    for (int u = 0; u < m->nunits; u++) {
        P += m->units[u].size;
        Psh += (double)m->units[u].size / m->units[u].dpg->size;
        if (m->units[u].dpg == &m->grid->edp_group) { experts += m->units[u].size; }
    }
    double pad = 4.0 * (m->nunits) * dp;    // bytes of padding at most, per buffer
    double X = sizeof(floatX), opt_expect = (z->master ? 12.0 : 8.0) * (z->stage == 0 ? P : Psh);
    check(fabs((double)mem_current[MEM_OPTIMIZER] - opt_expect) <= 3 * pad, "memory: optimizer state %.0f B, formula %s = %.0f B (P_local %.0f, dp %d)",
          (double)mem_current[MEM_OPTIMIZER], z->stage == 0 ? "8P" : "8P/dp (experts: /edp)", opt_expect, P, dp);
    double max_layer = 0, embed = m->u_embed >= 0 ? m->units[m->u_embed].padded : 0;
    for (int u = 0; u < m->nunits; u++) { if (u != m->u_embed && m->units[u].padded > max_layer) { max_layer = m->units[u].padded; } }
    double grads_expect = z->stage < 2 ? X * P : X * Psh + X * (2.0 * max_layer + embed);
    check(fabs((double)mem_current[MEM_GRADS] - grads_expect) <= 3 * pad,
          "memory: gradients %.0f B, formula %s = %.0f B", (double)mem_current[MEM_GRADS],
          z->stage < 2 ? "4P" : "4P/dp + transient(2 layers + embedding)", grads_expect);
    double params_expect = z->stage < 3 ? X * P : X * Psh + X * (2.0 * max_layer + embed);
    check(fabs((double)mem_current[MEM_PARAMS] - params_expect) <= 3 * pad,
          "memory: parameters %.0f B, formula %s = %.0f B", (double)mem_current[MEM_PARAMS],
          z->stage < 3 ? "4P" : "4P/dp + gathered (2 layers + embedding)", params_expect);
    // MoE: each MoE layer of the stage holds E/ep experts, each 1/tp of an MLP (fcproj's bias whole)
    double BT = m->BT, BTs = m->BTs, C = c->channels, Cl = m->Cl;
    int nmoe = 0;
    for (int l = 0; l < Ls; l++) { nmoe += is_moe_layer(c, m->layer_id[l]); }
    if (nmoe > 0) {
        double El = (double)c->num_experts / m->grid->ep, per_expert = 4 * Cl * C + 4 * Cl + C * 4 * Cl + C;
        check(experts == nmoe * El * per_expert, "memory: expert parameters per rank %.0f = %d MoE layers x E/ep = %.0f experts x %.0f (1/tp of an MLP)",
              experts, nmoe, El, per_expert);
    }
    // activations, per micro-batch alive (1F1B: pp - stage of them, GPipe: all): the LayerNorm/residual
    // parts on BTs tokens (BT/tp with SP), the rest on BT tokens; lnf and its gradient on the last stage;
    // a dense layer's MLP stores fc and GELU (BT, 4Cl); a MoE layer its routing and, for the Rr rows its
    // experts may receive, their input, fc and GELU, and for the Rs rows it may send, their outputs
    double Rs = 0, Rr = 0, E = c->num_experts, k = c->topk;
    if (nmoe > 0) {   // worst cases: a token goes to at most k experts (min(k, E/ep) of one rank), a sequence
                      // at most cap times to one expert
        double cap = moe_capacity(c->topk, m->T * m->grid->cp, c->num_experts, m->moe.cap1000), El = E / m->grid->ep, kl = k < El ? k : El;
        Rs = m->B * fmin(m->T * k, E * cap);
        Rr = m->grid->ep * m->B * fmin(m->T * kl, El * cap);
    }
    // per layer: the LayerNorm/residual tensors, qkv and attention output, the attention lse; a dense
    // layer's fc and GELU outputs; a MoE layer's routing and expert rows, and its experts' fc and GELU
    double core = X * 3.0 * BTs * C + 4.0 * 4.0 * BTs + X * BT * 4.0 * Cl + 4.0 * BT * m->NHl;
    double dense_fc = X * BT * 8.0 * Cl, route = 4.0 * (BT * E + BT + 4 * BT * k + m->B * E) + X * (Rr * C + Rs * C);
    double hidden = X * 2 * Rr * 4 * Cl, Ld = Ls - nmoe;
    // --recompute: what is recomputed is not stored per micro-batch; one layer of it lives in a scratch
    double scratch;
    if (m->recompute == RECOMPUTE_NONE) { scratch = 0; }
    else if (m->recompute == RECOMPUTE_MLP) { scratch = (Ld > 0 ? dense_fc : 0) + (nmoe > 0 ? hidden : 0); }
    else { scratch = (Ls > 0 ? core : 0) + (Ld > 0 ? dense_fc : 0) + (nmoe > 0 ? route + hidden : 0); }
    // (micro-batch, chunk) pairs alive at once: 1F1B pp - stage, GPipe all m; interleaved (Megatron's count)
    // 2(pp - stage - 1) + (V-1)pp warm-up forwards + 1, all m*V when m = pp: stage 0 holds pp + (pp-1)/V
    // stages' worth. The step just run must have had that many alive at once (pipeline.h checks as it
    // runs that no slot is taken twice).
    int V = m->V, pp = m->grid->pp, s = m->grid->pp_rank, alive;
    if (pp == 1) { alive = 1; }
    else if (m->pipe.schedule == SCHEDULE_GPIPE) { alive = accum; }
    else if (m->pipe.schedule == SCHEDULE_1F1B) { alive = pp - s < accum ? pp - s : accum; }
    else { alive = accum == pp ? accum * V : 2 * (pp - s - 1) + (V - 1) * pp + 1; if (alive > accum * V) { alive = accum * V; } }
    check(m->pipe.nslots == alive, "memory: %d (micro-batch, chunk) activation slots, formula %d (%s, stage %d of %d, V %d, %d micro-batches)",
          m->pipe.nslots, alive, m->pipe.schedule == SCHEDULE_GPIPE ? "GPipe: all" : m->pipe.schedule == SCHEDULE_1F1B ? "1F1B: pp - stage" :
          "interleaved: 2(pp-s-1) + (V-1)pp + 1", s, pp, V, accum);
    check(m->pipe.peak == m->pipe.nslots, "memory: the step run had %d pairs alive at once, the %d slots", m->pipe.peak, m->pipe.nslots);
    // a slot holds any chunk of the stage: the largest chunk's layers, a dense layer's fc at as many
    // positions as the most dense layers of a chunk, a MoE layer's tensors at each position where a chunk has one
    int Lmax = 0, Ldmax = 0, nmoe_pos = 0;
    for (int l = 0, any; l < Ls; l++) {
        any = 0;
        for (int v = 0; v < V; v++) { int l0 = m->chunk_l0[v]; any |= l0 + l < m->chunk_l0[v + 1] && is_moe_layer(c, m->layer_id[l0 + l]); }
        nmoe_pos += any;
    }
    for (int v = 0; v < V; v++) {
        int l0 = m->chunk_l0[v], Lc = m->chunk_l0[v + 1] - l0, Ldc = 0;
        for (int l = l0; l < l0 + Lc; l++) { Ldc += !is_moe_layer(c, m->layer_id[l]); }
        if (Lc > Lmax) { Lmax = Lc; }
        if (Ldc > Ldmax) { Ldmax = Ldc; }
    }
    // the residual stream, lnf (last stage), tokens (first stage) and targets (last stage)
    double stage = X * (Lmax + 1) * BTs * C + (m->last ? X * 2 * BTs * C + 4.0 * 2 * BTs : 0) + 4.0 * BT * (m->first + m->last);
    double per_micro = stage + (m->recompute == RECOMPUTE_FULL ? 0 : Lmax * core) +
                       (m->recompute == RECOMPUTE_NONE ? Ldmax * dense_fc + nmoe_pos * hidden : 0) + (m->recompute != RECOMPUTE_FULL ? nmoe_pos * route : 0);
    double act_expect = scratch + per_micro * m->pipe.nslots;
    static const char *modes[3] = {"none", "mlp", "full"};
    check(fabs((double)mem_current[MEM_ACTIVATIONS] - act_expect) < 1, "memory: activations %.0f B, formula %.0f B (%d slots x %.0f + recompute scratch %.0f; BTs %d, recompute %s)",
          (double)mem_current[MEM_ACTIVATIONS], act_expect, m->pipe.nslots, per_micro, scratch, m->BTs, modes[m->recompute]);
    // comm buffers: MoE's dispatch buffers, send and receive, at their worst case; with a pipeline and
    // --overlap, the copy of the input's gradient being sent (but on the first stage, without
    // interleaving); interleaved, where a received gradient waits for its backward
    double grad_copy = m->pipe.overlap && (!m->first || V > 1) ? X * BTs * C : 0, grad_wait = V > 1 ? X * BTs * C : 0;
    // context parallelism: ring attention's keys and values (B, T/cp, 2C/tp), held and arriving, and their gradients
    double ring = m->grid->cp > 1 ? 4.0 * X * BT * 2 * Cl : 0;
    double comm_expect = X * (Rs + Rr) * C + grad_copy + grad_wait + ring;
    check(fabs((double)mem_current[MEM_COMM] - comm_expect) < 1, "memory: comm buffers %.0f B = MoE dispatch (Rs %.0f + Rr %.0f rows) x C x %d B + pipeline gradient copy %.0f B + waiting gradient %.0f B + cp ring 4 x (B, T/cp, 2C/tp) %.0f B",
          (double)mem_current[MEM_COMM], Rs, Rr, (int)X, grad_copy, grad_wait, ring);
    // logits (last stage): one chunk of chunk x Vp/tp, never B*T x Vp (plus per-token stats and losses)
    double logits_expect = m->last ? X * m->ce.chunk * m->Vl + 4.0 * (3.0 * m->ce.chunk * (1 + m->grid->tp) + BT) + 8.0 : 0;
    check(fabs((double)mem_peak[MEM_LOGITS] - logits_expect) < 1, "memory: logits peak %.0f B = chunk %d x Vp/tp %d x %d B + stats/losses/their sum (%.0f B)",
          (double)mem_peak[MEM_LOGITS], m->ce.chunk, m->Vl, (int)X, logits_expect);
}

// Comm report vs the ring formulas, for one step with gradient accumulation `accum`. ep_rows: the rows
// this rank's MoE dispatches sent to other ep ranks plus those it received from them (each moves
// forward and back, in the forward and again in the backward), from the routing (test main).
static void check_comm(GPT2 *m, int accum, double ep_rows) {
    const GPT2Config *c = &m->config;
    Zero *z = &m->zero;
    Grid *g = m->grid;
    int dp = g->grad_group->size, tp = g->tp, L = c->num_layers, Ls = m->Ls, first = m->first, last = m->last, nmoe = 0;
    double X = sizeof(floatX), full = 0, rep = 0, ring_all = 0;
    double full_g[2] = {0, 0};   // padded elements of the units reduced over dp, over edp
    for (int u = 0; u < m->nunits; u++) {
        const Unit *U = &m->units[u];
        int ge = U->dpg == &g->edp_group;
        full_g[ge] += U->padded;
        full += U->padded; rep += U->nrep;
        ring_all += (U->dpg->size - 1.0) / U->dpg->size * U->padded;
    }
    for (int l = 0; l < Ls; l++) { nmoe += is_moe_layer(c, m->layer_id[l]); }
    Group *groups[2] = {g->grad_group, &g->edp_group};
    for (int i = 0; i < 2 && z->stage < 3; i++) {   // dp: every unit but the experts; edp: the experts
        int p = groups[i]->size;
        if (p == 1 || full_g[i] == 0) { continue; }
        double ring = 2.0 * (p - 1) / p * X * full_g[i];   // one all-reduce of those gradients
        double expect = z->stage < 2 ? ring : (p - 1.0) / p * X * full_g[i] * (accum + 1);   // 2: RS per micro-batch + AG
        check(fabs(groups[i]->bytes - expect) < 1, "comm: zero %d %s bytes/step %.0f = formula %.0f (all-reduce 2(p-1)/p*4P = %.0f)",
              z->stage, groups[i]->name, groups[i]->bytes, expect, ring);
    }
    if (z->stage == 3 && dp > 1) {
        double ring = 2.0 * (dp - 1) / dp * X * full;
        if (g->pp == 1 && c->num_experts == 0) {
            // zero_unit_params' policy (L >= 2): the embedding gathered once per step; each layer twice per
            // micro-batch (forward, backward) except the last layer, still resident for its backward, and
            // layers 0 and 1, kept from one micro-batch's backward to the next one's forward; the final
            // LayerNorm once per micro-batch; every unit reduce-scattered once per micro-batch
            double E = m->units[0].padded, F = m->units[m->nunits - 1].padded, Llast = m->units[L].padded;
            double layers = full - E - F, L01 = m->units[1].padded + m->units[2].padded;
            double expect3 = (dp - 1.0) / dp * X * (E + accum * (2.0 * layers + F - Llast) - (accum - 1) * L01 + accum * full);
            check(fabs(g->grad_group->bytes - expect3) < 1, "comm: zero 3 %s bytes/step %.0f = formula %.0f = %.3f x the all-reduce %.0f per micro-batch (gather fwd + gather bwd + reduce-scatter, less the resident units; %ld gathers)",
                  g->grad_group->name, g->grad_group->bytes, expect3, g->grad_group->bytes / accum / ring, ring, z->gathers);
        } else {
            // with a pipeline, or the units of MoE layers, the interleaving of the uses decides which units stay
            // resident: the bytes must be those of the gathers made plus one reduce-scatter per unit and micro-batch
            double bytes = g->grad_group->bytes + g->edp_group.bytes, expect3 = X * (z->gathered_ring + accum * ring_all);
            check(fabs(bytes - expect3) < 1 && z->gathers >= m->nunits, "comm: zero 3 dp+edp bytes/step %.0f = formula %.0f (%ld unit gathers + %d reduce-scatters of every unit)",
                  bytes, expect3, z->gathers, accum);
        }
    }
    if (g->pp > 1 && m->u_embed >= 0) {   // the tied embedding: its owned gradient summed over the 2 end stages
        const Unit *U = &m->units[m->u_embed];
        double expect = X * (z->stage == 0 ? U->padded : U->shard);   // all-reduce over 2 ranks: 2(p-1)/p*N = N
        check(fabs(g->emb_group.bytes - expect) < 1, "comm: emb bytes/step %.0f = formula %.0f (tied embedding gradient, all-reduced between the first and the last stage)",
              g->emb_group.bytes, expect);
    }
    int V = m->V;
    if (g->pp > 1) {   // each micro-batch and model chunk: the output activation forward (but the last stage's last
                       // chunk), the input gradient back (but the first stage's chunk 0)
        double slice = (double)m->BTs * c->channels / (!m->sp && tp > 1 ? tp : 1);   // without SP: 1/tp each
        double expect = accum * X * slice * ((V - last) + (V - first));
        check(fabs(g->pp_group.bytes - expect) < 1, "comm: pp bytes/step %.0f = formula %.0f (%d micro-batches x %d chunk(s) x (B*T/tp_sp) x C, to %s)",
              g->pp_group.bytes, expect, accum, V, first ? "the next stage" : (last ? "the previous stage" : "both neighbours"));
    }
    if (g->cp > 1) {   // ring attention, per layer and micro-batch: N-1 hops of k, v forward (again when recomputed),
                       // N-1 of k, v and N of dk, dv backward; each (B, T/cp, 2C/tp)
        int N = g->cp, hops = (N - 1) + (m->recompute == RECOMPUTE_FULL ? N - 1 : 0) + (N - 1) + N;
        double kv = X * m->BT * 2.0 * m->Cl, expect = (double)accum * Ls * hops * kv;
        // MoE, per layer and forward (again when recomputed): the sequences' other assignments for the
        // capacity, all-gathered (choices and probabilities, (B, T/cp, k) ints and floats; not when
        // dropless), and f, all-reduced ((B, E) floats)
        int capped = m->moe_cap < m->T * N, fwd = m->recompute == RECOMPUTE_FULL ? 2 : 1;
        double moe = nmoe * fwd * ((capped ? 2.0 * (N - 1) * m->BT * c->topk * 4 : 0) + 2.0 * (N - 1) / N * m->B * c->num_experts * 4);
        expect += accum * moe;
        check(fabs(g->cp_group.bytes - expect) < 1, "comm: cp bytes/step %.0f = formula %.0f (%d micro-batches x %d layers x %d hops of (B, T/cp, 2C/tp) = %.0f B: ring attention; MoE routing %.0f B)",
              g->cp_group.bytes, expect, accum, Ls, hops, kv, accum * moe);
    }
    int runs = m->recompute == RECOMPUTE_FULL ? 3 : 2;   // forward, backward (and the recomputed forward)
    if (g->ep > 1 && nmoe > 0) {   // rows x C x X each way, forward (dispatch, return) and backward (the same)
        double expect = runs * ep_rows * c->channels * X;
        check(fabs(g->ep_group.bytes - expect) < 1, "comm: ep bytes/step %.0f = formula %.0f (%d x %.0f rows to / from the other ep ranks x C x %d B: all-to-all dispatch and return, forward, backward%s)",
              g->ep_group.bytes, expect, runs, ep_rows, (int)X, runs == 3 ? ", recomputed forward" : "");
    }
    if (tp > 1) {
        double S = X * m->BT * c->channels, ring = (tp - 1.0) / tp;
        double ce = 0;
        for (int c0 = 0; last && c0 < m->BT; c0 += m->ce.chunk) { int n = m->BT - c0 < m->ce.chunk ? m->BT - c0 : m->ce.chunk; ce += (tp - 1.0) * 3 * n * 4; }
        double rep_ar = m->sp ? 2.0 * ring * X * rep * (z->stage >= 2 ? accum : 1) : 0;
        // per micro-batch: 4 per layer of this stage, plus the embedding (first stage) and the head (last stage)
        double ends = first + last;
        double act = m->sp ? (2 * ends + 10.0 * Ls) * ring * S : (2 * ends + 8.0 * Ls) * ring * S;
        if (m->recompute == RECOMPUTE_FULL) { act += 4.0 * Ls * ring * S; }   // each layer's forward collectives, again
        // pipeline without SP: each tp rank received 1/tp of the stage boundary tensors, then all-gathered
        double pipe_ag = g->pp > 1 && !m->sp ? ((V - first) + (V - last)) * ring * S * m->BTs / m->BT : 0;
        // MoE: the gates' gradient (BT, k) fp32, all-reduced per MoE layer
        double gates = nmoe * 2.0 * ring * m->BT * c->topk * 4;
        double expect = accum * (act + ce + pipe_ag + gates) + rep_ar;
        check(fabs(g->tp_group.bytes - expect) < 1 + 1e-9 * expect,
              "comm: tp bytes/step %.0f = formula %.0f (%s: %s; CE stats %.0f; MoE gate gradients %.0f)", g->tp_group.bytes, expect,
              m->sp ? "SP" : "no SP", m->sp ? "(ends+4L) RS + (ends+6L) AG of (p-1)/p*BT*C, of which 2L AG re-gather in backward"
                                            : "(ends+4L) AR of 2(p-1)/p*BT*C", ce, accum * gates);
    }
}

// The comm layer on its own: every collective on every group of the grid, with known values
// (element i of group rank r holds 1000 r + i), blocking and async, and the byte counters.
static void check_comm_layer(Grid *grid) {
    Group *groups[5] = {&grid->world, &grid->tp_group, &grid->pp_group, &grid->dp_group, &grid->ep_group};
    const size_t n = 7;
    for (int k = 0; k < 5; k++) {
        Group *g = groups[k];
        int p = g->size, r = g->rank, ok;
        size_t cap = (n + p + 1) * p;   // all-to-all(v) below sends up to p, receives up to p*p elements
        floatX *dbuf = (floatX *)mem_alloc(sizeof(floatX) * cap * 2, MEM_COMM);
        float *h = (float *)malloc_check(sizeof(float) * cap * 2);
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
        // all-to-all(v): rank r sends (j + 1) elements valued 1000 r + j to rank j
        size_t sc[64], so[64], rc[64], ro[64], s_off = 0, r_off = 0;
        if (p <= 64) {
            for (int j = 0; j < p; j++) { sc[j] = j + 1; so[j] = s_off; s_off += sc[j]; rc[j] = r + 1; ro[j] = r_off; r_off += rc[j]; }
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
        comm_barrier(g);
        free(h);
        mem_free(dbuf);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    const char *ref_dir = NULL, *resume_dir = NULL;
    int check_mem = 0, check_comm_flag = 0, check_layer = 0, bad_rank = -1;
    char **rest = (char **)malloc_check(sizeof(char *) * (argc + 1));
    int nrest = 0;
    rest[nrest++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ref") && i + 1 < argc) { ref_dir = argv[++i]; }
        else if (!strcmp(argv[i], "--check-resume") && i + 1 < argc) { resume_dir = argv[++i]; }
        else if (!strcmp(argv[i], "--check-memory")) { check_mem = 1; }
        else if (!strcmp(argv[i], "--check-comm")) { check_comm_flag = 1; }
        else if (!strcmp(argv[i], "--check-comm-layer")) { check_layer = 1; }
        else if (!strcmp(argv[i], "--bad-file-on-rank") && i + 1 < argc) { bad_rank = atoi(argv[++i]); }
        else { rest[nrest++] = argv[i]; }
    }
    if (ref_dir == NULL) { fail_all(my_rank, "test_gpt needs --ref DIR (a reference state from dev/reference/gpt2_ref.py)"); }
    char path[1024];
    snprintf(path, sizeof(path), "%s/model.bin", ref_dir);
    GPT2Config ref_config;   // the reference's shape; the model tested is the same, or (--experts E with a
                             // dense reference) its upcycling, compared with the dense reference's numbers
    float *ref_params = read_model_file(path, &ref_config);
    RefState ref;
    snprintf(path, sizeof(path), "%s/state.bin", ref_dir);
    read_ref_state(path, &ref_config, &ref);
    RefMoE rmoe;
    read_ref_moe(ref_dir, &rmoe);

    if (bad_rank >= 0) {
        // one rank meets a bad file while the others wait in a collective: all must exit, none hang
        if (my_rank == bad_rank) { GPT2Config c; read_model_file("/nonexistent/model.bin", &c); }
        MPI_Barrier(MPI_COMM_WORLD);
        if (my_rank == 0) { printf("--bad-file-on-rank %d: no rank failed?\n", bad_rank); }
        MPI_Finalize();
        return 1;
    }
    Args args;
    default_args(&args);
    args.B = 1;
    parse_args(nrest, rest, &args);
    agree_on_args(&args, my_rank, world);
    attention_path = attention_path_of(&args);
    if (check_layer) {   // the comm layer alone, on the grid of --tp/--pp (any world size they divide)
        if (world % (args.tp * args.pp)) { fail_all(my_rank, "world %d is not divisible by tp*pp", world); }
        Grid g;
        grid_init(&g, args.tp, 1, args.pp, 1);
        check_comm_layer(&g);
        int counts[2] = {n_passed, n_failed};
        MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (my_rank == 0) { printf("%d passed, %d failed\n", counts[0], counts[1]); }
        grid_free(&g);
        MPI_Finalize();
        return counts[1] == 0 ? 0 : 1;
    }
    args.T = ref.T;
    args.total_batch = ref.R * ref.T;
    GPT2Config config = ref_config;
    float *params = (float *)malloc_check(num_parameters(&ref_config) * sizeof(float));
    memcpy(params, ref_params, num_parameters(&ref_config) * sizeof(float));
    snprintf(path, sizeof(path), "%s/model.bin", ref_dir);
    params = apply_moe_flags(&args, my_rank, &config, params, path, 0);
    if (config.num_experts > 0 && ref_config.num_experts == 0) {
        // E = 1, k = 1 (and z-coeff 0) is the dense model: its expert's gradients are the dense MLP's,
        // its router's exactly zero
        float *g = upcycle_dense(&ref_config, ref.grads, &config, 0, 1);
        free(ref.grads);
        ref.grads = g;
    }
    MoEOptions moe = moe_options(&args);   // a MoE reference: its own options
    if (rmoe.present) { moe = (MoEOptions){rmoe.F1000, rmoe.policy ? DROP_POSITION : DROP_PROBS, rmoe.aux_coeff, rmoe.z_coeff}; }
    validate_layout(&args, &config, world, my_rank);
    Grid grid;
    grid_init(&grid, args.tp, args.cp, args.pp, args.ep);
    int accum = args.total_batch / (args.B * args.T * grid.dp);
    if (my_rank == 0) {
        printf("test_gpt: %s | world %d = tp %d x cp %d x pp %d x dp %d | zero %d%s | B %d T %d accum %d | ce chunk %d | %s\n", ref_dir, world,
               grid.tp, grid.cp, grid.pp, grid.dp, args.zero, args.sp ? " | sp" : "", args.B, args.T, accum, args.ce_chunk, PRECISION_NAME);
        if (config.num_experts > 0) {
            printf("          MoE: E %d k %d every %d | ep %d edp %d | capacity factor %.3f, drop %s, aux %g, z %g%s\n", config.num_experts,
                   config.topk, config.moe_every, grid.ep, grid.edp_group.size, moe.cap1000 / 1000.0, moe.policy == DROP_PROBS ? "probs" : "position",
                   moe.aux_coeff, moe.z_coeff, ref_config.num_experts == 0 ? " | upcycled from the dense reference" : "");
        }
    }
    GPT2 model;
    gpt2_build(&model, &config, params, &grid, args.vpp, args.zero, args.sp, moe);
    model.recompute = recompute_mode(args.recompute);
    model.zero.prefetch = args.overlap;
    gpt2_alloc_activations(&model, args.B, args.T / args.cp, args.ce_chunk, accum, pipe_schedule(args.pp_schedule), 0);
    DataLoader loader;
    char data_path[1024];
    snprintf(data_path, sizeof(data_path), "%s/data.bin", ref_dir);
    dataloader_init(&loader, data_path, args.B, args.T, config.vocab_size, grid.dp, grid.dp_rank, 0, args.seed);
    LRScheduler sched = {"cosine", ref.lr, ref.final_frac, ref.warmup, ref.nsteps};
    OptConfig opt = {ref.beta1, ref.beta2, ref.eps, ref.weight_decay, ref.clip, args.seed};

    // the bf16 model file (version 5) of the same weights loads as their round-to-nearest-even
    snprintf(path, sizeof(path), "%s/model_bf16.bin", ref_dir);
    if (access(path, R_OK) == 0) {
        GPT2Config c16;
        float *p16 = read_model_file(path, &c16);
        size_t P = num_parameters(&ref_config), bad = 0;
        for (size_t i = 0; i < P; i++) { if (p16[i] != bf16_to_float(float_to_bf16(ref_params[i]))) { bad++; } }
        check(bad == 0 && !memcmp(&c16, &ref_config, sizeof(ref_config)), "model file version %d (bf16): %zu parameters load as bf16(fp32 file), %zu differ",
              ref_config.num_experts ? 15 : 5, P, bad);
        free(p16);
    }

    // step 0: loss, gradients, norm (MoE: the routing of every layer and micro-batch logged)
    comm_reset_counters(&grid);
    float *losses = (float *)malloc_check(sizeof(float) * ref.nsteps);
    int nmoe = 0;
    for (int l = 0; l < model.Ls; l++) { nmoe += is_moe_layer(&config, model.layer_id[l]); }
    int *route_log = (int *)malloc_check(sizeof(int) * (2 * (size_t)model.BT * config.topk * nmoe * accum + 1));
    model.route_log = route_log;
    model.route_log_micro = accum;
    gpt2_forward_backward(&model, &loader, accum);
    losses[0] = gpt2_read_loss(&model, accum);
    model.route_log = NULL;
    check(fabs(losses[0] - ref.loss0) <= LOSS_TOL * fabs(ref.loss0), "loss of the first batch %.6f, reference %.6f", losses[0], ref.loss0);
    double ep_rows = 0;
    if (config.num_experts > 0) {
        double aux, z, dropped;
        gpt2_moe_stats(&model, accum, &aux, &z, &dropped);
        if (rmoe.present) {
            check(fabs(aux - rmoe.aux0) <= LOSS_TOL * fabs(rmoe.aux0) && fabs(z - rmoe.z0) <= LOSS_TOL * fabs(rmoe.z0),
                  "MoE auxiliary losses of the first batch: aux %.6f z %.6f, reference %.6f %.6f", aux, z, rmoe.aux0, rmoe.z0);
            // the same choices give the same loads, so the same dropped count; each token whose choice differs
            // (only where its margin allows, checked above) moves at most k assignments, each changing the
            // count by at most 2 (one expert's load down, another's up): the fraction, a mean over the MoE
            // layers of dropped / (R T k), by at most 2 flips / (Lm R T). (tp ranks route the same tokens.)
            double flips = (double)compare_routing(&model, &rmoe, route_log, accum);
            MPI_Allreduce(MPI_IN_PLACE, &flips, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            flips /= grid.tp;
            double drop_tol = DROP_TOL + 2.0 * flips / ((double)rmoe.Lm * rmoe.R * rmoe.T);
            check(fabs(dropped - rmoe.dropped0) <= drop_tol, "MoE dropped fraction %.6f, reference %.6f (%.0f tokens routed otherwise: tolerance %.1e)",
                  dropped, rmoe.dropped0, flips, drop_tol);
        }
        // the rows this rank's dispatches moved to and from the other ep ranks, from its routing and the
        // others' (each micro-batch and MoE layer: counts per expert, all-gathered over the ep group)
        int E = config.num_experts, El = E / grid.ep, k = config.topk;
        int *cnt = (int *)malloc_check(sizeof(int) * E), *all = (int *)malloc_check(sizeof(int) * E * grid.ep);
        for (int q = 0; q < nmoe * accum; q++) {
            const int *choice = route_log + (size_t)q * 2 * model.BT * k, *keep = choice + (size_t)model.BT * k;
            for (int e = 0; e < E; e++) { cnt[e] = 0; }
            for (size_t i = 0; i < (size_t)model.BT * k; i++) { if (keep[i]) { cnt[choice[i]]++; } }
            MPI_Allgather(cnt, E, MPI_INT, all, E, MPI_INT, grid.ep_group.mpi);
            for (int r = 0; r < grid.ep; r++) {
                if (r == grid.ep_rank) { continue; }
                for (int le = 0; le < El; le++) { ep_rows += all[grid.ep_rank * E + r * El + le] + all[r * E + grid.ep_rank * El + le]; }
            }
        }
        free(cnt); free(all);
    }
    compare_grads(&model, ref.grads);
    StepResult r0 = gpt2_update(&model, &opt, lr_at(&sched, 0), 0);
    float norm = r0.norm;
    // the same sums divided in another order (fp64, then rounded to float): within 2 float ulps
    check(fabsf(r0.loss - losses[0]) <= ldexpf(fabsf(losses[0]), -22), "the step's loss (read with the norm, after the device all-reduce) %.9g = the loss read alone %.9g",
          r0.loss, losses[0]);
    check(fabs(norm - ref.norm0) <= NORM_RTOL * ref.norm0, "global grad norm %.6f, reference %.6f", norm, ref.norm0);
    if (check_comm_flag) { check_comm(&model, accum, ep_rows); }
    if (check_mem) {
        check_memory(&model, accum);
        // the memory plan (--plan, --memory-limit) of this rank, made without allocating, equals what the
        // model allocated, category by category and in total (this build's sizes; test_gpt does not sample)
        Args planned = args;
        planned.sample_every = 0;
        MemPlan plan = gpt2_plan(&planned, &config, model.moe, world, my_rank, plan_build(&planned));
        int same = plan.peak_total == mem_peak_total;
        for (int k = 0; k < MEM_NCAT; k++) { same &= plan.peak[k] == mem_peak[k]; }
        check(same, "memory plan = measurement: planned peaks %.0f %.0f %.0f %.0f %.0f %.0f %.0f B (total %.0f), measured %.0f %.0f %.0f %.0f %.0f %.0f %.0f B (total %.0f)",
              (double)plan.peak[0], (double)plan.peak[1], (double)plan.peak[2], (double)plan.peak[3], (double)plan.peak[4], (double)plan.peak[5],
              (double)plan.peak[6], (double)plan.peak_total, (double)mem_peak[0], (double)mem_peak[1], (double)mem_peak[2], (double)mem_peak[3],
              (double)mem_peak[4], (double)mem_peak[5], (double)mem_peak[6], (double)mem_peak_total);
    }
    if (args.memory_report) { mem_report(my_rank, world, "test"); }
    if (args.comm_report) { comm_report(&grid, 1, "test step 0"); }

    // steps 1 .. nsteps-1
    for (int s = 1; s < ref.nsteps; s++) {
        gpt2_forward_backward(&model, &loader, accum);
        losses[s] = gpt2_update(&model, &opt, lr_at(&sched, s), s).loss;
    }
    double worst = 0;
    int worst_step = 0;
    for (int s = 0; s < ref.nsteps; s++) {
        double e = fabs(losses[s] - ref.losses[s]) / fabs(ref.losses[s]);
        if (e > worst || e != e) { worst = e != e ? INFINITY : e; worst_step = s; }
    }
    check(worst <= LOSS_TOL, "losses of %d AdamW steps: worst relative error %.2e at step %d (%.6f vs %.6f)", ref.nsteps, worst,
          worst_step, losses[worst_step], ref.losses[worst_step]);

    // resume: a fresh model from the step-5 checkpoint must repeat steps 5..9 bit for bit
    if (resume_dir) {
        if (my_rank == 0) { mkdir(resume_dir, 0755); }
        MPI_Barrier(MPI_COMM_WORLD);
        GPT2 run;
        gpt2_build(&run, &config, params, &grid, args.vpp, args.zero, args.sp, moe);
        run.recompute = model.recompute;
        run.zero.prefetch = model.zero.prefetch;
        gpt2_alloc_activations(&run, args.B, args.T / args.cp, args.ce_chunk, accum, pipe_schedule(args.pp_schedule), 0);
        DataLoader dl2;
        dataloader_init(&dl2, data_path, args.B, args.T, config.vocab_size, grid.dp, grid.dp_rank, 0, args.seed);
        Rng rng;
        rng_init(&rng, 1);
        float uninterrupted[64];
        for (int s = 0; s < ref.nsteps; s++) {
            gpt2_forward_backward(&run, &dl2, accum);
            uninterrupted[s] = gpt2_update(&run, &opt, lr_at(&sched, s), s).loss;
            if (s + 1 == 5) { save_checkpoint(&run, resume_dir, 5, &dl2, &rng, args.total_batch, 0); }
        }
        int step = latest_checkpoint(resume_dir);
        check(step == 5, "checkpoint: newest complete checkpoint is step %d (expected 5)", step);
        char mp[1100];
        snprintf(mp, sizeof(mp), "%s/model_%08d.bin", resume_dir, step);
        GPT2Config c2;
        float *p2 = read_model_file(mp, &c2);
        GPT2 resumed;
        check(!memcmp(&c2, &config, sizeof(config)), "checkpoint: the model file keeps the shape (E %d k %d every %d)", c2.num_experts, c2.topk, c2.moe_every);
        gpt2_build(&resumed, &c2, p2, &grid, args.vpp, args.zero, args.sp, moe);
        free(p2);
        resumed.recompute = model.recompute;
        resumed.zero.prefetch = model.zero.prefetch;
        gpt2_alloc_activations(&resumed, args.B, args.T / args.cp, args.ce_chunk, accum, pipe_schedule(args.pp_schedule), 0);
        DataLoader dl3;
        dataloader_init(&dl3, data_path, args.B, args.T, config.vocab_size, grid.dp, grid.dp_rank, 0, args.seed);
        Rng rng3;
        load_state(&resumed, resume_dir, step, &dl3, &rng3, args.total_batch);
        int same = 1;
        for (int s = step; s < ref.nsteps; s++) {
            gpt2_forward_backward(&resumed, &dl3, accum);
            float l = gpt2_update(&resumed, &opt, lr_at(&sched, s), s).loss;
            if (memcmp(&l, &uninterrupted[s], sizeof(float)) != 0) { same = 0; }
            if (my_rank == 0) { printf("  resume step %d: %.9f vs uninterrupted %.9f\n", s, l, uninterrupted[s]); }
        }
        check(same, "resume from step %d reproduces steps %d..%d bit for bit", step, step, ref.nsteps - 1);
        check(rng3.s == rng.s, "resume restores the generator state");
    }

    int counts[2] = {n_passed, n_failed};
    MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (my_rank == 0) { printf("%d passed, %d failed\n", counts[0], counts[1]); }
    mem_free_all();
    grid_free(&grid);
    MPI_Finalize();
    return counts[1] == 0 ? 0 : 1;
}
