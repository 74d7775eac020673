/*
test_gpt: runs any parallel configuration of train_gpt against a PyTorch reference state
(dev/reference/gpt2_ref.py) and checks, on every rank, the part that rank owns:
  - the loss of the first batch, and every gradient element this rank owns (its tp slice of each
    tensor, its ZeRO shard), before clipping; MoE: the auxiliary losses, dropped fraction, routing;
  - the global gradient norm; the losses of the 10 AdamW steps;
  - optionally: resume from a checkpoint at step 5 equals the uninterrupted run bit for bit
    (--check-resume DIR, which also writes what this layout computes at step 5 from that checkpoint
    for --resume-from), the memory report against the ZeRO / SP / chunked-CE formulas and the memory
    plan (--check-memory), the comm report against the ring formulas (--check-comm);
  - or (--resume-from DIR) another layout resuming that checkpoint: its step 5 (loss, routing, every
    gradient element, norm) against the first layout's from the same checkpoint, its steps 5..9 against
    the first layout's and the reference's losses. --mutate experts|data-round breaks the resume on
    purpose (experts stored in another order in the state; the data one round off): it must then fail.
usage: mpirun -np N ./test_gpt --ref DIR [--check-resume DIR] [--check-memory] [--check-comm] [train_gpt flags]
       mpirun -np N ./test_gpt --ref DIR --resume-from DIR [--mutate experts|data-round] [train_gpt flags]
       mpirun -np N ./test_gpt --ref DIR --bad-file-on-rank R   (rank R fails on a file: every rank must exit)
Prints one line per check and closes with "N passed, N failed" (rank 0, summed over ranks).
*/
#define TESTING
#include "train_gpt.cu"

// ----------------------------------------------------------------------------
// the tolerances, all in one place. Every comparison here is of two computations of the same numbers from
// the same inputs (PyTorch and us; layout A and layout B from one checkpoint), which differ only in the
// order of their floating-point sums: a BLAS kernel choice, a tp or dp split, a chunk size. Each bound is
// derived from that, and must hold under any OpenBLAS kernel choice (the matrix runs the layout checks
// under two). fp32, u = 2^-24 = 6e-8; a sum of n terms carries a rounding error of about sqrt(n) u
// sum|terms| (errors of random sign; the worst case n u is never approached by these sums):
//  - GRAD: a weight gradient is a sum over B*T <= 256 tokens of products whose factors come from GEMM
//    sums of K <= 4C = 1024 terms chained through L <= 8 layers, and from the head's sum over Vp <= 50304
//    rows: (sqrt(256) + L sqrt(1024) + sqrt(50304)) u ~ 3e-5 relative to sum|terms| at most (d4), ~5e-6
//    for the C 64 references. RTOL 1e-4 is 3-20x that where the terms do not cancel (|g| ~ sum|terms|);
//    ATOL 1e-5 covers cancelling sums (|g| << sum|terms|) with sum|terms| <= 0.3 (per-token terms are
//    ~1/(B T) of the mean loss's gradient times O(1) activations).
//  - LOSS: a mean over B*T tokens of logsumexp(logits) - logit, logits from the same chains (~1e-6
//    relative, O(1) in size) over a loss of ~5: ~1e-6 relative; 1e-5 leaves 10x, also over 10 AdamW
//    steps (an update moves by lr times the relative change of m/sqrt(v), ~1e-6, except where a gradient
//    is pure rounding noise, e.g. the key biases, whose parameters the loss does not depend on). The MoE
//    aux and z losses the same (means of p and of squared log-sum-exps).
//  - NORM: sqrt(sum g^2) is weighted by the largest gradients, whose relative errors (~1e-6) average out
//    over many elements: 1e-5.
//  - ROUTE_MARGIN: p = softmax(x w) with x the ln2 output (LayerNorm: O(1) entries, ~1e-6 relative
//    error) and w ~ 0.02 over C = 64 channels: the logits differ by ~sqrt(64) 1e-6 0.02 ~ 2e-7 and p by
//    at most p(1 - p) that, 4e-8. A decision whose margin (gap in p) exceeds 1e-5 (250x) cannot flip and
//    is compared; others may flip. The references' data seeds give every decision of their 10 steps a
//    margin >= 1e-6 (gpt2_ref.py --min_margin, 25x), so losses and gradients compare without exclusions.
//  - DROP: the dropped fraction is a ratio of counts: equal when the masks are (1e-6: the printing).
// bf16 (GPU; u = 2^-8 = 3.9e-3 per stored activation, fp32 accumulation): the gradients compare per
// block (BF16_BLOCK_RTOL below, with its derivation); a loss or norm passes ~10 bf16 roundings per layer,
// ~10 sqrt(L) u ~ 5e-2 relative at most.
// Router inputs are bf16: p differs by ~p(1 - p) sqrt(C) u 0.02 ~ 1.5e-4 (an H200 flipped decisions up
// to a margin of 3.9e-4): decisions compare above 5e-3.
#if defined(USE_CUDA) && !defined(ENABLE_FP32)
#define BF16_GRADS 1   // compare_grads: the per-block bf16 tolerances
// |loss - ref| <= LOSS_TOL |ref|, per step (also MoE aux, z)
static const float LOSS_TOL = 5e-2f;
static const float NORM_RTOL = 5e-2f;
static const float ROUTE_MARGIN = 5e-3f;
#else
static const float GRAD_ATOL = 1e-5f, GRAD_RTOL = 1e-4f;   // |g - ref| <= ATOL + RTOL |ref|, per element
// |loss - ref| <= LOSS_TOL |ref|, per step (also MoE aux, z)
static const float LOSS_TOL = 1e-5f;
static const float NORM_RTOL = 1e-5f;
// MoE: a decision is compared with the reference's when its margin exceeds this
static const float ROUTE_MARGIN = 1e-5f;
#endif
static const double DROP_TOL = 1e-6;       // MoE: dropped fraction
// bf16 gradients, per block (a layer's slice of a tensor, cut into q, k, v for qkv, one per expert: the
// pieces of one scale). An element's error is the sum of the effects of the bf16 roundings on its path
// (each stored activation and its gradient: ~7 per layer each way, so ~14 L + 2 for the first layer's
// tensors), each uniform in +-u/2 relative, rms u/(2 sqrt 3) = 1.1e-3, independent: sqrt(14 L + 2) 1.1e-3
// = 8.2e-3 at L 4, the norm-wise relative error of a block; 5e-2 leaves 6x for the amplification by
// cancelling sums (a residual branch small against the stream it joins; LayerNorm's backward subtracting
// means). A wrong block (zeroed, scaled, another's) is off by O(1) of its norm. The error's rms over the
// elements a rank owns of a block <= BF16_BLOCK_RTOL x the block's rms (the whole block's, from the full
// reference: a ZeRO shard's sliver of a block is held to the block's scale). Elements: |g - ref| <= |ref|
// + the block's rms (no element off by more than the gradient's typical size: garbage, not rounding). A
// block whose reference rms is below 2^-16 of its layer's (all blocks) is an exact zero computed in fp32
// (the key bias: the loss does not depend on it) and takes the layer's rms. The PyTorch emulation of a
// bf16 step (dev/reference/bf16_grads.py, every activation and gradient rounded) must pass:
// test_gpt --check-tolerance.
static const double BF16_BLOCK_RTOL = 5e-2;

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

static void read_ref_state(const char *path, const ModelConfig *c, RefState *s) {
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
    float bias_rate;                    // (version 2) loss-free balancing's rate
    int *loads;                         // (version 2, PyTorch's) (nsteps, Lm, E) assignments per expert before drops
    float *bias;                        // (version 2, PyTorch's) (Lm, E) the routing bias after the last step
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
    if (h[0] != 20241130 || (h[1] != 1 && h[1] != 2)) { fail("reference '%s' has bad magic/version", path); }
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
    if (h[1] == 2) {
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

// The routing of a step (model.route_log: per micro-batch i, per MoE layer of this stage in the stage's
// order, choice then keep (BT, k) each) against the reference's: micro-batch i's row b on dp rank r is the
// reference's row (i dp + r) B + b. A token's top-k choice (experts in order of p) depends on its router
// row: it is compared when its decision margin exceeds ROUTE_MARGIN (the others may flip with rounding)
// and no earlier MoE layer routed a token of its sequence at or before its position otherwise (a token
// sent to another expert, or dropped, changes its row and, through causal attention, the rows after it).
// The capacity keep masks depend on the whole sequence: a (layer, sequence) is compared, choices and keep
// masks, when every margin of its decisions is clear and nothing upstream differs. The largest margin of
// a compared choice that differs is printed: it is what ROUTE_MARGIN must stay above. Collective (the
// earlier layers may be on other stages); returns the tokens of this rank whose choice differs.
static long compare_routing(Model *m, const RefMoE *r, const int *log, int accum) {
    const ModelConfig *c = &m->config;
    int B = m->B, T = m->T, Tg = r->T, k = c->topk, E = c->num_experts, dp = m->grid->dp, R = r->R;
    int nmoe = stage_moe_layers(m);
    // first[gm][g]: the first position of row g whose choice or keep differs in MoE layer gm (Tg: none), all ranks'.
    // This rank's token t is at position seq_pos(m->seqpos, t) of its sequence (cp: Tg = cp T)
    int *first = (int *)malloc_check(sizeof(int) * ((size_t)r->Lm * R + 1));
    for (size_t q = 0; q < (size_t)r->Lm * R; q++) { first[q] = Tg; }
    for (int pass = 0; pass < 2; pass++) {
        long tok_compared = 0, tok_differ = 0, tok_downstream = 0, seq_compared = 0, seq_skipped = 0, seq_differ = 0,
            flips = 0;
        float flip_margin = 0.0f;
        for (int i = 0; i < accum; i++) {
            int j = 0;
            for (int l = 0; l < m->Ls; l++) {
                if (!is_moe_layer(c, m->layer_id[l])) { continue; }
                const int *choice = log + ((size_t)i * nmoe + j) * route_entry(m), *keep = choice + (size_t)m->BT * k;
                int gm = 0;   // the model's MoE layers before this one
                for (int q = 0; q < m->layer_id[l]; q++) { gm += is_moe_layer(c, q); }
                for (int b = 0; b < B; b++) {
                    int g = (i * dp + m->grid->dp_rank) * B + b, upstream = Tg;
                    size_t mine = (size_t)b * T * k, ref = (((size_t)gm * R + g) * Tg) * k;
                    if (pass == 0) {
                        int *f = &first[(size_t)gm * R + g];
                        for (int t = 0; t < T; t++) {
                            int pos = seq_pos(m->seqpos, t);
                            if (memcmp(choice + mine + (size_t)t * k, r->choice + ref + (size_t)pos * k,
                                       k * sizeof(int)) ||
                                memcmp(keep + mine + (size_t)t * k, r->keep + ref + (size_t)pos * k,
                                       k * sizeof(int))) { *f = pos < *f ? pos : *f; }
                        }
                        continue;
                    }
                    for (int q = 0; q < gm; q++) {
                        upstream = first[(size_t)q * R + g] < upstream ? first[(size_t)q * R + g] : upstream;
                    }
                    int clear = upstream == Tg;
                    for (int t = 0; t < T; t++) {
                        int pos = seq_pos(m->seqpos, t);
                        float margin = r->topk_margin[((size_t)gm * R + g) * Tg + pos];
                        int same = !memcmp(choice + mine + (size_t)t * k, r->choice + ref + (size_t)pos * k,
                                           k * sizeof(int));
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
                            memcmp(keep + mine + (size_t)t * k, r->keep + ref + q,
                                   k * sizeof(int))) { seq_differ++; break; }
                    }
                }
                j++;
            }
        }
        if (pass == 0) { MPI_Allreduce(MPI_IN_PLACE, first, r->Lm * R, MPI_INT, MPI_MIN, MPI_COMM_WORLD); continue; }
        free(first);
        if (nmoe == 0) { return 0; }   // no MoE layer on this stage
        check(tok_differ == 0 && seq_differ == 0 && tok_compared > 0,
              "routing: %ld tokens with a top-k margin > %.0e compared, %ld differ from the reference's choices (%ld "
              "after a token "
              "routed otherwise upstream not compared); %ld (layer, sequence) pairs with every margin clear compared, %ld differ in "
              "choices or capacity keep masks (%ld not compared); largest margin of a compared choice that differs "
              "%.1e",
              tok_compared, ROUTE_MARGIN, tok_differ, tok_downstream, seq_compared, seq_differ, seq_skipped,
                  flip_margin);
        return flips;
    }
    return 0;
}


// The gradient's blocks (BF16_BLOCK_RTOL): tensor id's layer slices of nblk (rows, cols) blocks, numbered
// in file order. For the full reference: each block's tensor and rms, and per element (full layout, as
// floats so that unit_copy_full can cut them) its block's number.
typedef struct { int nblocks; int *tensor; float *rms; float *number; } GradBlocks;
typedef struct { double err2, worst_elem; long n, bad_elems; } BlockError;   // over the elements a rank checks

static double rms_of(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) { s += (double)x[i] * x[i]; }
    return n ? sqrt(s / n) : 0;
}

static void grad_blocks_init(const ModelConfig *c, const float *ref_all, GradBlocks *gb) {
    gb->nblocks = 0;
    for (int id = 0; id < NUM_TENSORS; id++) {
        TensorSpec s = tensor_spec(c, id);
        gb->nblocks += (s.layers < 0 ? 1 : s.layers) * s.nblk;
    }
    gb->tensor = (int *)malloc_check(gb->nblocks * sizeof(int));
    gb->rms = (float *)malloc_check(gb->nblocks * sizeof(float));
    gb->number = (float *)malloc_check(num_parameters(c) * sizeof(float));
    size_t off = 0;
    int b = 0;
    for (int id = 0; id < NUM_TENSORS; id++) {
        TensorSpec s = tensor_spec(c, id);
        size_t bs = s.rows * s.cols;
        for (int l = 0; l < (s.layers < 0 ? 1 : s.layers); l++, off += s.nblk * bs) {
            double layer_rms = rms_of(ref_all + off, s.nblk * bs);
            for (int k = 0; k < s.nblk; k++, b++) {
                double r = rms_of(ref_all + off + k * bs, bs);
                gb->tensor[b] = id;
                gb->rms[b] = (float)(r < ldexp(layer_rms, -16) ? layer_rms : r);   // an exact zero: the layer's
                for (size_t i = 0; i < bs; i++) { gb->number[off + k * bs + i] = (float)b; }
            }
        }
    }
}

static void grad_blocks_free(GradBlocks *gb) { free(gb->tensor); free(gb->rms); free(gb->number); }

// (elem: the element bound's multiple of the block rms: 1, more with routing flips, see compare_grads)
static void block_error_add(BlockError *e, float g, float r, float rms, double elem) {
    double d = fabs((double)g - r);
    e->err2 += d * d;
    e->n++;
    if (!(d <= fabs(r) + elem * rms)) { e->bad_elems++; }
    double ratio = d != d ? INFINITY : d / (fabs(r) + rms);
    if (ratio > e->worst_elem) { e->worst_elem = ratio; }
}

// A block's error rms over its rms (the error of an exact-zero block against a zero rms: 0 or infinite).
static double block_ratio(const GradBlocks *gb, const BlockError *e, int b) {
    if (e[b].n == 0) { return 0; }
    return gb->rms[b] > 0 ? sqrt(e[b].err2 / e[b].n) / gb->rms[b] : (e[b].err2 > 0 ? INFINITY : 0);
}

// Per tensor: the blocks whose error rms exceeds BF16_BLOCK_RTOL x their rms, and the elements over their
// bound. Returns the number of tensors that fail; checks them when `report`.
static int block_errors_report(const GradBlocks *gb, const BlockError *e, double rtol, int report) {
    int failed = 0;
    for (int id = 0; id < NUM_TENSORS; id++) {
        long blocks = 0, bad_blocks = 0, elems = 0, bad_elems = 0;
        double worst = 0, worst_elem = 0;
        for (int b = 0; b < gb->nblocks; b++) {
            if (gb->tensor[b] != id || e[b].n == 0) { continue; }
            double ratio = block_ratio(gb, e, b);
            blocks++;
            bad_blocks += !(ratio <= rtol);
            elems += e[b].n;
            bad_elems += e[b].bad_elems;
            if (!(ratio <= worst)) { worst = ratio; }
            if (!(e[b].worst_elem <= worst_elem)) { worst_elem = e[b].worst_elem; }
        }
        if (blocks == 0) { continue; }
        int ok = bad_blocks == 0 && bad_elems == 0;
        failed += !ok;
        if (report) {
            check(ok, "grad %-8s: %ld blocks, %ld with an error rms > %.1e x the block's rms (worst %.4f); %ld elements, %ld "
                  "with |g-ref| > |ref| + block rms (worst %.3f of it)",
                  tensor_names[id], blocks, bad_blocks, rtol, worst, elems, bad_elems, worst_elem);
        }
    }
    return failed;
}

// Compares the owned, reduced gradient of every unit against the same range cut from the full
// reference gradients, per element: |g - ref| <= GRAD_ATOL + GRAD_RTOL |ref|, reported per tensor.
// bf16 builds: per block (BF16_BLOCK_RTOL). There a MoE token may route otherwise (its margin below
// ROUTE_MARGIN): F such tokens over the Lm R T (layer, token) pairs change an expert's gradient by F's
// share of its ~k R T / E tokens' terms and every block upstream by less: a relative rms of ~sqrt(2 F /
// (Lm R T)) spread evenly; the block bound gets twice that on top, the element bound the same factor.
// (Parameters after the AdamW steps are not compared element-wise: an element whose gradient is
// rounding noise, e.g. the key biases, whose exact gradient is 0, moves by +-lr whatever the noise;
// the step losses are the check of the optimizer.)
static void compare_grads(Model *m, float *ref_all, double flipped_share) {
    const ModelConfig *c = &m->config;
    float *ref[NUM_TENSORS];
    split_tensors(c, ref_all, ref);
#ifndef BF16_GRADS
    (void)flipped_share;
    double worst[NUM_TENSORS] = {0};
    long bad[NUM_TENSORS] = {0}, checked[NUM_TENSORS] = {0};
#else
    GradBlocks gb;
    grad_blocks_init(c, ref_all, &gb);
    BlockError *berr = (BlockError *)calloc_check(gb.nblocks, sizeof(BlockError));
    double rtol = BF16_BLOCK_RTOL + 2.0 * sqrt(2.0 * flipped_share);
    float *numbers[NUM_TENSORS];
    split_tensors(c, gb.number, numbers);
#endif
    for (int u = 0; u < m->nunits; u++) {
        const Unit *U = &m->units[u];
        float *ref_unit = (float *)malloc_check(U->size * sizeof(float));
        unit_copy_full(c, U, ref, ref_unit, m->grid->tp, m->grid->tp_rank, 1);
        float *mine = (float *)malloc_check(U->size * sizeof(float));
        size_t start, len;
        zero_get_owned_grads(&m->zero, u, mine, &start, &len);
#ifdef BF16_GRADS
        float *number_unit = (float *)malloc_check(U->size * sizeof(float));
        unit_copy_full(c, U, numbers, number_unit, m->grid->tp, m->grid->tp_rank, 1);
#endif
        for (int k = 0; k < U->ntensors; k++) {
            const UnitTensor *t = &U->t[k];
            size_t a = t->offset > start ? t->offset : start;
            size_t b = t->offset + t->size < start + len ? t->offset + t->size : start + len;
            for (size_t i = a; i < b; i++) {
                float g = mine[i - start], r = ref_unit[i];
#ifdef BF16_GRADS
                int nb = (int)number_unit[i];
                block_error_add(&berr[nb], g, r, gb.rms[nb], rtol / BF16_BLOCK_RTOL);
#else
                double err = fabs((double)g - r), lim = GRAD_ATOL + GRAD_RTOL * fabs(r);
                if (!(err <= lim)) { bad[t->id]++; }
                if (err - lim > worst[t->id] || err != err) { worst[t->id] = err != err ? INFINITY : err - lim; }
                checked[t->id]++;
#endif
            }
        }
        free(ref_unit);
        free(mine);
#ifdef BF16_GRADS
        free(number_unit);
#endif
    }
#ifdef BF16_GRADS
    block_errors_report(&gb, berr, rtol, 1);
    free(berr);
    grad_blocks_free(&gb);
#else
    for (int i = 0; i < NUM_TENSORS; i++) {
        if (checked[i] == 0) { continue; }
        check(bad[i] == 0, "grad %-8s: %ld owned elements, %ld outside |g-ref| <= %.0e + %.0e|ref| (worst excess %.3e)",
              tensor_names[i], checked[i], bad[i], GRAD_ATOL, GRAD_RTOL, worst[i]);
    }
#endif
}

// --check-tolerance [--bf16-grads FILE]: the bf16 gradient tolerances (BF16_BLOCK_RTOL) applied to the full
// reference gradients, in any build. They pass the reference rounded to bf16 and a bf16 step emulated in
// PyTorch (FILE, from dev/reference/bf16_grads.py); they fail it with the q and k rows of qkvw zeroed (an
// attention backward that loses dq and dk: the per-element 1e-2 + 5e-2|ref| they replace passed that) in
// exactly those blocks, and with the whole qkv gradient zero.
static BlockError *block_errors(const GradBlocks *gb, const float *g, const float *ref, size_t n) {
    BlockError *e = (BlockError *)calloc_check(gb->nblocks, sizeof(BlockError));
    for (size_t i = 0; i < n; i++) {
        int b = (int)gb->number[i];
        block_error_add(&e[b], g[i], ref[i], gb->rms[b], 1.0);
    }
    return e;
}

static long old_tolerance_misses(const float *g, const float *ref, size_t n) {   // 1e-2 + 5e-2|ref|
    long bad = 0;
    for (size_t i = 0; i < n; i++) { bad += !(fabs((double)g[i] - ref[i]) <= 1e-2 + 5e-2 * fabs(ref[i])); }
    return bad;
}

static void check_zeroed_qkv(const ModelConfig *c, const GradBlocks *gb, const float *ref, float *g, int rows_zeroed) {
    size_t P = num_parameters(c), C = c->channels;
    float *t[NUM_TENSORS];
    memcpy(g, ref, P * sizeof(float));
    split_tensors(c, g, t);
    for (int l = 0; l < c->num_layers; l++) { memset(t[T_QKVW] + l * 3 * C * C, 0, rows_zeroed * C * C * sizeof(float)); }
    const float *ref_qkv = ref + (t[T_QKVW] - g);
    BlockError *e = block_errors(gb, g, ref, P);
    int flagged_zeroed = 0, flagged_other = 0, qkv_blocks = 0;
    for (int b = 0; b < gb->nblocks; b++) {
        int zeroed = gb->tensor[b] == T_QKVW && qkv_blocks++ % 3 < rows_zeroed;
        int flagged = !(block_ratio(gb, e, b) <= BF16_BLOCK_RTOL);
        if (zeroed) { flagged_zeroed += flagged; } else { flagged_other += flagged; }
    }
    check(flagged_zeroed == rows_zeroed * c->num_layers && flagged_other == 0,
          "bf16 tolerances, qkvw's first %d C rows zeroed in each layer: %d of the %d blocks zeroed fail, %d others "
          "(the per-element 1e-2 + 5e-2|ref| flags %ld of %zu elements)",
          rows_zeroed, flagged_zeroed, rows_zeroed * c->num_layers, flagged_other,
          old_tolerance_misses(t[T_QKVW], ref_qkv, tensor_full_size(c, T_QKVW)), tensor_full_size(c, T_QKVW));
    free(e);
}

static void check_tolerance(const ModelConfig *c, const float *ref, const char *emulated_path) {
    size_t P = num_parameters(c);
    GradBlocks gb;
    grad_blocks_init(c, ref, &gb);
    float *g = (float *)malloc_check(P * sizeof(float));
    for (size_t i = 0; i < P; i++) { g[i] = bf16_to_float(float_to_bf16(ref[i])); }
    BlockError *e = block_errors(&gb, g, ref, P);
    check(block_errors_report(&gb, e, BF16_BLOCK_RTOL, 0) == 0, "bf16 tolerances: the reference gradients rounded to bf16 pass (%d blocks)",
          gb.nblocks);
    free(e);
    if (emulated_path) {
        FILE *f = fopen_check(emulated_path, "rb");
        if (fread(g, sizeof(float), P, f) != P || fgetc(f) != EOF) {
            fail_all(my_rank, "--bf16-grads %s: expected %zu fp32 gradients (dev/reference/bf16_grads.py)", emulated_path, P);
        }
        fclose(f);
        if (my_rank == 0) { printf("bf16 tolerances on a bf16 step emulated in PyTorch (%s):\n", emulated_path); }
        e = block_errors(&gb, g, ref, P);
        block_errors_report(&gb, e, BF16_BLOCK_RTOL, 1);
        free(e);
    }
    check_zeroed_qkv(c, &gb, ref, g, 2);   // q and k: a lost dq, dk
    check_zeroed_qkv(c, &gb, ref, g, 3);   // the whole qkv gradient
    free(g);
    grad_blocks_free(&gb);
}

// Memory report vs the formulas (X bytes per floatX). P is the number of this rank's (its pipeline
// stage's, tp-sliced, its experts') parameters, Psh its share under ZeRO: each unit divided by its
// data-parallel group (dp, or cp x dp with context parallelism; edp for the experts); padding is at
// most p-1 elements per unit.
static void check_memory_model(Model *m) {
    const ModelConfig *c = &m->config;
    Zero *z = &m->zero;
    int dp = m->grid->grad_group->size;
    double P = 0, Psh = 0, experts = 0;
    for (int u = 0; u < m->nunits; u++) {
        P += m->units[u].size;
        Psh += (double)m->units[u].size / m->units[u].dpg->size;
        if (m->units[u].dpg == &m->grid->edp_group) { experts += m->units[u].size; }
    }
    double pad = 4.0 * (m->nunits) * dp;    // bytes of padding at most, per buffer
    double X = sizeof(floatX), opt_expect = (z->master ? 12.0 : 8.0) * (z->stage == 0 ? P : Psh);
    check(fabs((double)mem_current[MEM_OPTIMIZER] - opt_expect) <= 3 * pad,
          "memory: optimizer state %.0f B, formula %s = %.0f B (P_local %.0f, dp %d)",
          (double)mem_current[MEM_OPTIMIZER], z->stage == 0 ? "8P" : "8P/dp (experts: /edp)", opt_expect, P, dp);
    double max_layer = 0, embed = 0;   // (the embedding's work buffer: wte's, or an untied head's, the larger)
    for (int u = 0; u < m->nunits; u++) {
        double *big = m->units[u].embedding ? &embed : &max_layer;
        if (m->units[u].padded > *big) { *big = m->units[u].padded; }
    }
    double grads_expect = z->stage < 2 ? X * P : X * Psh + X * (2.0 * max_layer + embed);
    check(fabs((double)mem_current[MEM_GRADS] - grads_expect) <= 3 * pad,
          "memory: gradients %.0f B, formula %s = %.0f B", (double)mem_current[MEM_GRADS],
          z->stage < 2 ? "4P" : "4P/dp + transient(2 layers + embedding)", grads_expect);
    // (+ the routing bias of the stage's MoE layers, fp32: model state, not a parameter)
    double params_expect = (z->stage < 3 ? X * P : X * Psh + X * (2.0 * max_layer + embed))
            + 4.0 * m->moe.nlayers * c->num_experts;
    check(fabs((double)mem_current[MEM_PARAMS] - params_expect) <= 3 * pad,
          "memory: parameters %.0f B, formula %s = %.0f B", (double)mem_current[MEM_PARAMS],
          z->stage < 3 ? "4P" : "4P/dp + gathered (2 layers + embedding)", params_expect);
    // MoE: each MoE layer of the stage holds E/ep experts, each 1/tp of an MLP (fcproj's bias whole)
    double C = c->channels;
    int nmoe = stage_moe_layers(m);
    if (nmoe > 0) {
        double El = (double)c->num_experts / m->grid->ep, Hl = m->moe.Hl;
        double per_expert = c->arch == ARCH_LLAMA ? 3 * Hl * C             // (SwiGLU: gate, up, down; no biases)
                                                  : Hl * C + Hl + C * Hl + C;   // (width H: Hl = H/tp of it here)
        check(experts == nmoe * El * per_expert,
              "memory: expert parameters per rank %.0f = %d MoE layers x E/ep = %.0f experts x %.0f (1/tp of an MLP of width H)",
              experts, nmoe, El, per_expert);
    }
}

// The rows a MoE layer's dispatch sends (Rs) and receives (Rr) at most, the formula (0 without MoE layers on
// the stage): a token goes to at most k experts (min(k, E/ep) of one rank), a sequence at most cap times to
// one expert.
static void dispatch_rows_bound(Model *m, double *Rs, double *Rr) {
    const ModelConfig *c = &m->config;
    double E = c->num_experts, k = c->topk;
    *Rs = *Rr = 0;
    if (stage_moe_layers(m) == 0) { return; }
    double cap = moe_capacity(c->topk, m->T * m->grid->cp, c->num_experts, m->moe.opt.cap1000), El = E / m->grid->ep;
    double kl = k < El ? k : El;
    *Rs = m->B * fmin(m->T * k, E * cap);
    *Rr = m->grid->ep * m->B * fmin(m->T * kl, El * cap);
    if (m->moe.padded) { *Rs = *Rr = E * m->B * cap; }   // padded: E slots of B cap rows each way
}

// The activation slots: (micro-batch, chunk) pairs alive at once: 1F1B pp - stage, GPipe all m; interleaved (Megatron's
// count) 2(pp - stage - 1) + (vpp-1)pp warm-up forwards + 1, all m*vpp when m = pp: stage 0 holds pp + (pp-1)/vpp
// stages' worth. The step just run must have had that many alive at once (pipeline.h checks as it runs that no slot
// is taken twice).
static void check_memory_slots(Model *m, int accum) {
    int vpp = m->vpp, pp = m->grid->pp, s = m->grid->pp_rank, alive;
    if (pp == 1) { alive = 1; }
    else if (m->pipe.schedule == SCHEDULE_GPIPE) { alive = accum; }
    else if (m->pipe.schedule == SCHEDULE_1F1B) { alive = pp - s < accum ? pp - s : accum; }
    else if (m->pipe.schedule == SCHEDULE_ZB) { alive = pp < accum ? pp : accum; }   // (zb_store_formula)
    else { alive = accum == pp ? accum * vpp : 2 * (pp - s - 1) + (vpp - 1) * pp + 1; if (alive > accum * vpp) { alive = accum * vpp; } }
    check(m->pipe.nslots == alive,
          "memory: %d (micro-batch, chunk) activation slots, formula %d (%s, stage %d of %d, vpp %d, %d micro-batches)",
          m->pipe.nslots, alive,
              m->pipe.schedule == SCHEDULE_GPIPE ? "GPipe: all" : m->pipe.schedule == SCHEDULE_1F1B
                  ? "1F1B: pp - stage" : m->pipe.schedule == SCHEDULE_ZB ? "ZB: pp" :
          "interleaved: 2(pp-s-1) + (vpp-1)pp + 1", s, pp, vpp, accum);
}

// ZB's W store against its formula (0 without ZB): stage s runs pp-s-1 warm-up forwards, then holds up to s pending W
// passes (each keeping its micro-batch's slot) besides the micro-batch of its steady-state forward (a slot taken at
// the forward: the input waits in a buffer of its own): pp slots on every stage, 1F1B's peak. The pending W passes:
// s + 1 at most (right after a B, before its exchange runs the oldest), fewer when the steady state (m - warm-up
// steps) is shorter. Rr: the rows a MoE layer's experts may receive.
static double zb_store_formula(Model *m, int accum, double Rr) {
    const ModelConfig *c = &m->config;
    int Ls = m->Ls, nmoe = stage_moe_layers(m), pp = m->grid->pp, s = m->grid->pp_rank;
    double X = sizeof(floatX), BT = m->BT, C = c->channels, Cl = m->Cl;
    double wstore = 0;
    if (m->pipe.schedule == SCHEDULE_ZB && pp > 1) {
        int warm = pp - s - 1 < accum ? pp - s - 1 : accum, steady = accum - warm > 1 ? accum - warm : 1;
        int pending = s + 1 < steady ? s + 1 : steady;
        check(m->pipe.npending == pending, "memory: ZB keeps %d W passes pending at most, formula %d (stage %d of %d, "
              "%d micro-batches)", m->pipe.npending, pending, s, pp, accum);
        // per layer of the stage: the gradients of the outputs of attproj (BT, C) and qkv (BT, 3Cl), the LayerNorms'
        // parameter gradients (4C); SP or recompute full: ln2 and ln1 of all tokens (BT, C); full: the attention
        // output (BT, Cl). A dense layer: fcproj's and fc's output gradients (BT, C), (BT, 4Cl), recompute: the GELU
        // output (BT, 4Cl). A MoE layer: the shared experts' output and fc gradients (BT, C), (BT, SHl); the Rr rows'
        // output and fc gradients (Rr, C), (Rr, Hl); recompute: the rows' GELU output (Rr, Hl) and the shared
        // experts' (BT, SHl); full: the rows' input (Rr, C); the router logits' gradient (BT, E fp32)
        int full = m->recompute == RECOMPUTE_FULL, rec = m->recompute != RECOMPUTE_NONE, tp = m->grid->tp;
        double Hl = m->moe.Hl, SHl = m->moe.SHl, hs = C / c->num_heads, Fl = (double)c->ffn_hidden / tp;
        double qkv = (c->num_heads + 2.0 * c->kv_heads) / tp * hs, fc = c->arch == ARCH_LLAMA ? 2 * Fl : Fl;
        double qkn = c->qk_norm ? (c->num_heads + c->kv_heads) / tp * hs : 0;   // (+ QK-norm's weight gradients)
        double common = X * (BT * (C + qkv) + 4 * C + qkn + ((m->sp && m->grid->tp > 1) || full ? 2 * BT * C : 0) +
                             (full ? BT * Cl : 0));
        double dense_w = common + X * (BT * (C + fc) + (rec ? BT * Fl : 0));
        double hw = c->arch == ARCH_LLAMA ? 2 : 1;   // (SwiGLU: the gradients of [gate | up])
        double moe_w = common + X * ((SHl > 0 ? BT * (C + hw * SHl) : 0) + Rr * (C + hw * Hl) + (rec ? Rr * Hl + BT * SHl
                                     : 0) + (full ? Rr * C : 0)) + 4.0 * BT * (c->num_experts + c->shared_gate);
        wstore = Ls > 0 ? pending * ((Ls - nmoe) * dense_w + nmoe * moe_w) : 0;
    }
    return wstore;
}

// The activations (per micro-batch alive, and the recompute scratch) against their formula.
static void check_memory_activations(Model *m, int accum) {
    const ModelConfig *c = &m->config;
    int Ls = m->Ls, nmoe = stage_moe_layers(m);
    double X = sizeof(floatX), BT = m->BT, BTs = m->BTs, C = c->channels, Cl = m->Cl;
    // activations, per micro-batch alive (1F1B: pp - stage of them, GPipe: all): the LayerNorm/residual
    // parts on BTs tokens (BT/tp with SP), the rest on BT tokens; lnf and its gradient on the last stage;
    // a dense layer's MLP stores fc and GELU (BT, 4Cl); a MoE layer its routing and, for the Rr rows its
    // experts may receive, their input, fc and GELU (Rr, H/tp), and for the Rs rows it may send, their outputs;
    // with shared experts their fc and GELU (BT, S*H/tp)
    double Rs, Rr, E = c->num_experts, k = c->topk;
    dispatch_rows_bound(m, &Rs, &Rr);
    // per layer: the LayerNorm/residual tensors, qkv and attention output, the attention lse; a dense
    // layer's fc and GELU outputs; a MoE layer's routing and expert rows, and its experts' fc and GELU
    // (Llama: RMSNorm keeps no mean; qkv rows of NH/tp query and KV/tp kv heads; SwiGLU's fc output [gate | up]
    // 2F/tp, its activation F/tp; GPT-2: 3C/tp, 4C/tp and 4C/tp)
    // (QK-norm: q's and k's rows before the norm and their two scales per token)
    // (cp's all-to-all over U ranks leaves the head shard's qkv stored: with fewer kv heads per tp rank than U, each
    // replicated U/KV times, the rows NH/tp + 2U heads wide)
    int llama = c->arch == ARCH_LLAMA, tp = m->grid->tp, U = m->cpring.U, KVl = c->kv_heads / tp;
    double hs = C / c->num_heads, Fl = (double)c->ffn_hidden / tp;
    double qkv = ((double)c->num_heads / tp + 2.0 * (KVl % U == 0 ? KVl : U)) * hs;
    double core = X * 3.0 * BTs * C + 4.0 * (llama ? 2.0 : 4.0) * BTs + X * BT * (qkv + Cl) + 4.0 * BT * m->NHl;
    if (c->qk_norm) { core += X * BT * ((double)c->num_heads / tp + KVl) * hs + 4.0 * 2 * BT; }   // (q, k raw; scales)
    // (a MoE layer: SwiGLU experts keep [gate | up] and their output, GELU ones fc and GELU; Qwen2-MoE's shared gate
    // one float per token)
    double hw = llama ? 3.0 : 2.0, sgate = c->shared_gate ? 4.0 * BT : 0;
    double dense_fc = X * BT * hw * Fl, route = 4.0 * (BT * E + BT + 4 * BT * k + m->B * E) + X * (Rr * C + Rs * C) + sgate;
    double hidden = X * hw * (Rr * m->moe.Hl + BT * m->moe.SHl), Ld = Ls - nmoe;
    // --recompute: what is recomputed is not stored per micro-batch; one layer of it lives in a scratch
    double scratch;
    if (m->recompute == RECOMPUTE_NONE) { scratch = 0; }
    else if (m->recompute == RECOMPUTE_MLP) { scratch = (Ld > 0 ? dense_fc : 0) + (nmoe > 0 ? hidden : 0); }
    else { scratch = (Ls > 0 ? core : 0) + (Ld > 0 ? dense_fc : 0) + (nmoe > 0 ? route + hidden : 0); }
    int vpp = m->vpp;
    check_memory_slots(m, accum);
    double wstore = zb_store_formula(m, accum, Rr);
    check(m->pipe.peak == m->pipe.nslots, "memory: the step run had %d pairs alive at once, the %d slots",
          m->pipe.peak, m->pipe.nslots);
    // a slot holds any chunk of the stage: the largest chunk's layers, a dense layer's fc at as many
    // positions as the most dense layers of a chunk, a MoE layer's tensors at each position where a chunk has one
    int Lmax = 0, Ldmax = 0, nmoe_pos = 0;
    for (int l = 0, any; l < Ls; l++) {
        any = 0;
        for (int v = 0; v < vpp; v++) {
            int l0 = m->chunk_l0[v];
            any |= l0 + l < m->chunk_l0[v + 1] && is_moe_layer(c, m->layer_id[l0 + l]);
        }
        nmoe_pos += any;
    }
    for (int v = 0; v < vpp; v++) {
        int l0 = m->chunk_l0[v], Lc = m->chunk_l0[v + 1] - l0, Ldc = 0;
        for (int l = l0; l < l0 + Lc; l++) { Ldc += !is_moe_layer(c, m->layer_id[l]); }
        if (Lc > Lmax) { Lmax = Lc; }
        if (Ldc > Ldmax) { Ldmax = Ldc; }
    }
    // the residual stream, lnf (last stage), tokens (first stage) and targets (last stage)
    double stage = X * (Lmax + 1) * BTs * C + (m->last ? X * 2 * BTs * C + 4.0 * (llama ? 1 : 2) * BTs
                                               : 0) + 4.0 * BT * (m->first + m->last);
    double per_micro = stage + (m->recompute == RECOMPUTE_FULL ? 0 : Lmax * core) +
                       (m->recompute == RECOMPUTE_NONE ? Ldmax * dense_fc + nmoe_pos * hidden
                        : 0) + (m->recompute != RECOMPUTE_FULL ? nmoe_pos * route : 0);
    double act_expect = scratch + per_micro * m->pipe.nslots + wstore;
    static const char *modes[3] = {"none", "mlp", "full"};
    check(fabs((double)mem_current[MEM_ACTIVATIONS] - act_expect) < 1,
          "memory: activations %.0f B, formula %.0f B (%d slots x %.0f + recompute scratch %.0f + ZB's pending W %.0f; "
          "BTs %d, recompute %s)", (double)mem_current[MEM_ACTIVATIONS], act_expect, m->pipe.nslots, per_micro, scratch,
          wstore, m->BTs, modes[m->recompute]);
}

// The comm buffers and the logits against their formulas.
static void check_memory_buffers(Model *m) {
    double X = sizeof(floatX), BT = m->BT, BTs = m->BTs, C = m->config.channels, Rs, Rr;
    int vpp = m->vpp;
    dispatch_rows_bound(m, &Rs, &Rr);
    // comm buffers: MoE's dispatch buffers, send and receive, at their worst case (ep > 1); with a pipeline and
    // --overlap, the copy of the input's gradient being sent (but on the first stage, without
    // interleaving); interleaved, where a received gradient waits for its backward
    double grad_copy = m->pipe.overlap && (!m->first || vpp > 1) ? X * BTs * C : 0,
        grad_wait = vpp > 1 ? X * BTs * C : 0;
    // ZB (not the first stage): where a received input waits for its forward
    double input_wait = m->pipe.schedule == SCHEDULE_ZB && m->grid->pp > 1 && !m->first ? X * BTs * C : 0;
    // context parallelism: ring attention's keys and values (B, T/cp, 2 KV hs/tp), held and arriving, and their
    // gradients; with all-to-alls over U ranks (Ulysses, the hybrid) a send and a receive buffer of the local qkv
    // rows (B, T/cp, (NH + 2 U Hkv) hs/tp: KV/tp kv heads, or U replicated ones), and the hybrid's ring carries the
    // head shard's kv heads for the U T/cp tokens of its group: (B, T/cp, 2 U Hkv hs/tp) again
    int U = m->cpring.U, KVl = m->config.kv_heads / m->grid->tp, N = m->grid->cp / U;
    double hs = C / m->config.num_heads, Ckv = (KVl % U == 0 ? KVl : U) * hs;
    double ring = m->grid->cp > 1 && N > 1 ? 4.0 * X * BT * 2 * Ckv : 0;
    double a2a = m->grid->cp > 1 && U > 1 ? 2.0 * X * BT * (m->Cl + 2 * Ckv) : 0;
    double comm_expect = X * (m->grid->ep > 1 ? Rs + Rr : 0) * C + grad_copy + grad_wait + input_wait + ring + a2a;
    check(fabs((double)mem_current[MEM_COMM] - comm_expect) < 1,
          "memory: comm buffers %.0f B = MoE dispatch (Rs %.0f + Rr %.0f rows) x C x %d B + pipeline gradient copy %.0f B + waiting gradient %.0f B + waiting input %.0f B + cp ring 4 x (B, T/cp, 2 KV hs/tp) %.0f B + cp all-to-all 2 x (B, T/cp, (NH + 2KV) hs/tp) %.0f B",
          (double)mem_current[MEM_COMM], Rs, Rr, (int)X, grad_copy, grad_wait, input_wait, ring, a2a);
    // logits (last stage): one chunk of chunk x Vp/tp, never B*T x Vp (plus per-token stats and losses)
    double logits_expect = m->last
            ? X * m->ce.chunk * m->Vl + 4.0 * (3.0 * m->ce.chunk * (1 + m->grid->tp) + BT) + 8.0 : 0;
    check(fabs((double)mem_peak[MEM_LOGITS] - logits_expect) < 1,
          "memory: logits peak %.0f B = chunk %d x Vp/tp %d x %d B + stats/losses/their sum (%.0f B)",
          (double)mem_peak[MEM_LOGITS], m->ce.chunk, m->Vl, (int)X, logits_expect);
}

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
        {&g->tp_group, f.tp, n.tp, "SP: RS + AG, or all-reduces, of (p-1)/p BT C per layer and end; CE stats; gates"}};
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
    size_t sc[64], so[64], rc[64], ro[64], s_off = 0, r_off = 0;
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

// ----------------------------------------------------------------------------
// --check-attention: the CPU build's attention through BLAS (attention.h's panels, context_parallel.h's
// ring blocks) against the plain loops, their specification, where the model references do not reach:
// T = 1, T not a multiple of a tile, several key tiles, diagonal tiles cut anywhere (tiny tiles), head
// sizes 16, 32, 48 and 64, a single (batch, head) (with 2+ threads: the backward's all-threads-per-sgemm path),
// the ring's blocks at chunk offsets, causal and not, merged into an earlier block's result; grouped-query
// attention (KV = 1 and 2 kv heads for 4 query heads), and the plain loops with KV < NH against their
// definition (the KV = NH loops on the kv heads repeated).
// The tolerance per element is derived, no constant fitted to a run: both compute the same sums in other
// orders and blockings, the softmax against another running max. u = 2^-24; any order of summing n
// products is off by at most g(n) = n u times the sum of their absolute values (any BLAS kernel, threads).
//  - a score s = scale q.k is off by ds <= g(hs) scale sum|q k| + 2u |s|; E = the max of ds over a row
//  - out = sum_j p_j v_j / l, p_j = exp(s_j - m): each term relatively off by R = 2E (s_j's and the max's
//    errors) + (3n + 24) u (the sums l and out, the exps, the division) + (2n + 4) u smax + 4u |lse|
//    (the exps' arguments, up to n rescalings by exp(m_old - m_new)), on sum_j p_j |v_j| + w1 |y1| (a ring
//    block merges into an earlier result y1 of weight w1 = exp(lse1 - lse));  lse: 2E + (n + 8 + 4|lse|) u
//  - backward (the same out and lse in both): p relatively off by ep = ds + 2u (|s| + |lse|) + 4u, dp = dy.v
//    and D = dy.y by g(hs) sum|dy v|, g(hs) sum|dy y|, so ds = p (dp - D) scale by
//    Eds = |ds| (ep + 3u) + p scale g(hs) (sum|dy v| + sum|dy y|); then dq_i by sum_j Eds |k_j| +
//    g(n+1) (sum_j |ds k_j| + |dq_i before|) (a ring block adds to what is there), dk, dv likewise with
//    g(G n + 1): with grouped-query attention a kv head's dk, dv sum the terms of its G query heads.
// Each computation is within that (first-order) bound of the exact value: the two within twice of it.
static const double ATT_U = 1.0 / 16777216.0;

// scale x.y over n in double, and the same over |terms| into *abs
static double att_dot(const float *x, const float *y, int n, double scale, double *abs) {
    double s = 0.0, a = 0.0;
    for (int c = 0; c < n; c++) { s += (double)x[c] * y[c]; a += fabs((double)x[c] * y[c]); }
    *abs = a * scale;
    return s * scale;
}

// Forward tolerances of one head's n query rows (row i sees keys j <= i + diag; inputs a) into to (rows at
// ldo) and tl, from the plain loops' lse and the earlier result they merged into (y1 at ldo, lse1; NULL: none)
static void att_tol_forward(float *to, float *tl, int ldo, AttHead a, const float *lse, const float *y1,
                            const float *lse1, int n, int diag) {
    double u = ATT_U, sa;
    for (int i = 0; i < n; i++) {
        const float *q = a.q + (size_t)i * a.ldq;
        int nv = att_visible(i, diag, n);
        double E = 0.0, smax = 0.0, L = lse[i], w1 = lse1 ? exp((double)lse1[i] - L) : 0.0;
        for (int j = 0; j < nv; j++) {
            double s = att_dot(q, a.k + (size_t)j * a.ldkv, a.hs, a.scale, &sa);
            E = fmax(E, a.hs * u * sa + 2 * u * fabs(s));
            smax = fmax(smax, fabs(s));
        }
        double R = 2 * E + (3.0 * nv + 24 + (2.0 * nv + 4) * smax + 4 * fabs(L)) * u;
        for (int c = 0; c < a.hs; c++) { to[(size_t)i * ldo + c] = y1 ? (float)(2 * R * w1 * fabs(y1[(size_t)i * ldo + c])) : 0.0f; }
        for (int j = 0; j < nv; j++) {
            double p = exp(att_dot(q, a.k + (size_t)j * a.ldkv, a.hs, a.scale, &sa) - L);
            for (int c = 0; c < a.hs; c++) { to[(size_t)i * ldo + c] += (float)(2 * R * p * fabs(a.v[(size_t)j * a.ldkv + c])); }
        }
        tl[i] = (float)(2 * (2 * E + (nv + 8 + 4 * fabs(L)) * u));
    }
}

// Backward tolerances of the same rows into t (dq, dk, dv at t's lds; zeros on entry: a kv head's add up over
// the calls of its G query heads), from the plain loops' out (rows at ldy) and lse; g0: the gradients added to
// (dq NULL: zeros; dk, dv NULL: zeros, or counted by another query head's call)
static void att_tol_backward(AttGrad t, AttHead a, const float *y, int ldy, const float *lse, AttGrad g0, int n,
                             int diag, int G) {
    double u = ATT_U, ghs = a.hs * u, gn = (n + 1) * u, gkv = ((double)G * n + 1) * u, sa, dpa, Da;
    for (int i = 0; i < n; i++) {
        const float *q = a.q + (size_t)i * a.ldq, *dy = a.dout + (size_t)i * a.ldo;
        double L = lse[i], D = att_dot(dy, y + (size_t)i * ldy, a.hs, 1.0, &Da);
        for (int j = 0; j < att_visible(i, diag, n); j++) {
            const float *k = a.k + (size_t)j * a.ldkv, *v = a.v + (size_t)j * a.ldkv;
            double s = att_dot(q, k, a.hs, a.scale, &sa), dp = att_dot(dy, v, a.hs, 1.0, &dpa);
            double p = exp(s - L), ds = p * (dp - D) * a.scale, ep = ghs * sa + 2 * u * (fabs(s) + fabs(L)) + 4 * u;
            double Eds = fabs(ds) * (ep + 3 * u) + p * a.scale * ghs * (dpa + Da);
            for (int c = 0; c < a.hs; c++) {
                t.dq[(size_t)i * t.lddq + c] += (float)(2 * (Eds * fabs(k[c]) + gn * fabs(ds * k[c])));
                t.dk[(size_t)j * t.lddkv + c] += (float)(2 * (Eds * fabs(q[c]) + gkv * fabs(ds * q[c])));
                t.dv[(size_t)j * t.lddkv + c] += (float)(2 * p * (ep + gkv) * fabs(dy[c]));
            }
        }
    }
    for (int r = 0; r < n; r++) {   // what was there before
        for (int c = 0; c < a.hs && g0.dq; c++) {
            t.dq[(size_t)r * t.lddq + c] += (float)(2 * gn * fabs(g0.dq[(size_t)r * g0.lddq + c]));
        }
        for (int c = 0; c < a.hs && g0.dk; c++) {
            t.dk[(size_t)r * t.lddkv + c] += (float)(2 * gkv * fabs(g0.dk[(size_t)r * g0.lddkv + c]));
            t.dv[(size_t)r * t.lddkv + c] += (float)(2 * gkv * fabs(g0.dv[(size_t)r * g0.lddkv + c]));
        }
    }
}

// 1 if |got - want| <= tol for each of n elements; the worst |got - want| / tol and largest |got - want|
// into *worst, *diff
static int att_within(const float *got, const float *want, const float *tol, size_t n, double *worst, double *diff) {
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] == want[i] ? 0.0 : fabs((double)got[i] - want[i]);   // (-inf = -inf: a row no block reached)
        ok &= d <= tol[i];   // (false for NaN)
        if (d > *diff) { *diff = d; }
        if (d > 0 && d / tol[i] > *worst) { *worst = d / tol[i]; }
    }
    return ok;
}

static float *att_random(size_t n, Rng *r, float std) {
    float *x = (float *)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = rng_normal(r, 0.0f, std); }
    return x;
}

// One-device attention, B T, NH query heads sharing KV kv heads of size hs, tiles qt x kt: attention_forward_blas /
// attention_backward_blas against attention_forward_cpu / attention_backward_cpu (both backwards from the plain
// forward's out and lse)
static void check_attention_case(Rng *rng, int B, int T, int NH, int KV, int hs, int qt, int kt) {
    int W = (NH + 2 * KV) * hs, C = NH * hs, G = NH / KV;
    size_t n3 = (size_t)B * T * W, ny = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = att_random(n3, rng, 1.5f), *dout = att_random(ny, rng, 1.0f);
    float *y = (float *)calloc_check(2 * (ny + nl + n3), sizeof(float)), *lse = y + ny, *d = lse + nl;  // the loops'
    float *y2 = d + n3, *lse2 = y2 + ny, *d2 = lse2 + nl;                                             // BLAS's
    float *tol = (float *)calloc_check(ny + nl + n3, sizeof(float)), *tl = tol + ny, *td = tl + nl;
    att_panel_rows = qt; att_key_tile = kt;
    attention_forward_cpu(y, lse, qkv, B, T, NH, KV, hs);
    attention_forward_blas(y2, lse2, qkv, B, T, NH, KV, hs);
    attention_backward_cpu(d, dout, qkv, y, lse, B, T, NH, KV, hs);
    attention_backward_blas(d2, dout, qkv, y, lse, B, T, NH, KV, hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t r3 = (size_t)b * T * W + h * hs, rk = (size_t)b * T * W + (NH + h / G) * hs;   // q; its kv head's k
            size_t r1 = (size_t)b * T * C + h * hs, rl = ((size_t)b * NH + h) * T;
            AttHead a = {qkv + r3, qkv + rk, qkv + rk + KV * hs, dout + r1, W, W, C, hs, 1.0f / sqrtf((float)hs)};
            att_tol_forward(tol + r1, tl + rl, C, a, lse + rl, NULL, NULL, T, 0);
            AttGrad t = {td + r3, td + rk, td + rk + KV * hs, W, W}, none = {NULL, NULL, NULL, 0, 0};
            att_tol_backward(t, a, y + r1, C, lse + rl, none, T, 0, G);
        }
    }
    double worst = 0.0, diff = 0.0;
    int ok = att_within(y2, y, tol, ny, &worst, &diff) & att_within(lse2, lse, tl, nl, &worst, &diff)
             & att_within(d2, d, td, n3, &worst, &diff);
    check(ok, "attention through BLAS = the loops: B %d T %d NH %d KV %d hs %d, tiles %d x %d: out, lse, dqkv within "
          "the derived bounds (worst %.3f of a bound; largest difference %.1e)", B, T, NH, KV, hs, qt, kt, worst, diff);
    free(qkv); free(dout); free(y); free(tol);
}

// kv (B, T, 2 KV hs): the k and v parts of qkv (B, T, (NH + 2KV) hs)
static float *att_kv_of(const float *qkv, size_t rows, int NH, int KV, int hs) {
    size_t W = (size_t)(NH + 2 * KV) * hs, W2 = (size_t)2 * KV * hs;
    float *kv = (float *)malloc_check(rows * W2 * sizeof(float));
    for (size_t r = 0; r < rows; r++) { memcpy(kv + r * W2, qkv + r * W + (size_t)NH * hs, W2 * sizeof(float)); }
    return kv;
}

// One ring block (context_parallel.h), local T = 2c: query chunk qa's rows over key chunk kb's keys, causal
// when qa == kb. The forward merges into what an earlier block (key chunk 1 - kb, by the loops) left; the
// backward adds to random dq, dk, dv, with the out and lse of the plain causal attention over the T rows.
static void check_attention_block_case(Rng *rng, int B, int c, int NH, int KV, int hs, int qa, int kb, int qt, int kt) {
    int T = 2 * c, W = (NH + 2 * KV) * hs, W2 = 2 * KV * hs, C = NH * hs, G = NH / KV;
    int causal = qa == kb, q0 = qa * c, k0 = kb * c;
    size_t n3 = (size_t)B * T * W, n2 = (size_t)B * T * W2, ny = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = att_random(n3, rng, 1.5f), *dout = att_random(ny, rng, 1.0f);
    float *d0 = att_random(n3 + n2, rng, 1.0f), *dkv0 = d0 + n3;   // the gradients added to
    float *kv = att_kv_of(qkv, (size_t)B * T, NH, KV, hs);
    // before (y1, lse1); the loops' (y, lse, d, dkv); BLAS's (y2, lse2, d2, dkv2)
    float *y1 = (float *)malloc_check((3 * (ny + nl) + 2 * (n3 + n2)) * sizeof(float)), *lse1 = y1 + ny;
    float *y = lse1 + nl, *lse = y + ny, *y2 = lse + nl, *lse2 = y2 + ny;
    float *d = lse2 + nl, *dkv = d + n3, *d2 = dkv + n2, *dkv2 = d2 + n3;
    float *tol = (float *)calloc_check(ny + nl + n3 + n2, sizeof(float)), *tl = tol + ny, *td = tl + nl, *tkv = td + n3;
    att_panel_rows = qt; att_key_tile = kt;
    for (size_t i = 0; i < ny + nl; i++) { y1[i] = i < ny ? 0.0f : -INFINITY; }   // no block yet: out 0, lse -inf
    attention_block_forward_cpu(y1, lse1, qkv, kv, B, T, NH, KV, hs, q0, (1 - kb) * c, c, 0);
    memcpy(y, y1, (ny + nl) * sizeof(float)); memcpy(y2, y1, (ny + nl) * sizeof(float));   // y, lse follow
    attention_block_forward_cpu(y, lse, qkv, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    attention_block_forward_blas(y2, lse2, qkv, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t r3 = ((size_t)b * T + q0) * W + h * hs, r2 = ((size_t)b * T + k0) * W2 + (h / G) * hs;
            size_t r1 = ((size_t)b * T + q0) * C + h * hs, rl = ((size_t)b * NH + h) * T + q0;
            AttHead a = {qkv + r3, kv + r2, kv + r2 + KV * hs, dout + r1, W, W2, C, hs, scale};
            att_tol_forward(tol + r1, tl + rl, C, a, lse + rl, y1 + r1, lse1 + rl, c, causal ? 0 : c);
        }
    }
    attention_forward_cpu(y1, lse1, qkv, B, T, NH, KV, hs);   // the backward's out and lse
    memcpy(d, d0, (n3 + n2) * sizeof(float)); memcpy(d2, d0, (n3 + n2) * sizeof(float));    // d, dkv follow
    attention_block_backward_cpu(d, dkv, dout, qkv, y1, lse1, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    attention_block_backward_blas(d2, dkv2, dout, qkv, y1, lse1, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t r3 = ((size_t)b * T + q0) * W + h * hs, r2 = ((size_t)b * T + k0) * W2 + (h / G) * hs;
            size_t r1 = ((size_t)b * T + q0) * C + h * hs, rl = ((size_t)b * NH + h) * T + q0;
            AttHead a = {qkv + r3, kv + r2, kv + r2 + KV * hs, dout + r1, W, W2, C, hs, scale};
            AttGrad t = {td + r3, tkv + r2, tkv + r2 + KV * hs, W, W2};
            float *dk0 = h % G ? NULL : dkv0 + r2;   // (a kv head's earlier dk, dv: counted with its first query head)
            AttGrad g0 = {d0 + r3, dk0, dk0 ? dk0 + KV * hs : NULL, W, W2};
            att_tol_backward(t, a, y1 + r1, C, lse1 + rl, g0, c, causal ? 0 : c, G);
        }
    }
    double worst = 0.0, diff = 0.0;
    int ok = att_within(y2, y, tol, ny, &worst, &diff) & att_within(lse2, lse, tl, nl, &worst, &diff)
             & att_within(d2, d, td, n3, &worst, &diff) & att_within(dkv2, dkv, tkv, n2, &worst, &diff);
    check(ok, "ring block through BLAS = the loops: B %d c %d NH %d KV %d hs %d, query chunk %d x key chunk %d (%s), "
          "tiles %d x %d: out, lse, dq, dk, dv within the derived bounds (worst %.3f of a bound; largest difference "
          "%.1e)", B, c, NH, KV, hs, qa, kb, causal ? "causal" : "full", qt, kt, worst, diff);
    free(qkv); free(dout); free(d0); free(kv); free(y1); free(tol);
}

// Rows [x (P floats) | k heads (KV hs) | v heads (KV hs)] -> rows [x | NH k heads | NH v heads], head h a copy of kv
// head h / G: grouped-query attention's operands as multi-head attention's (new, rows * (P + 2 NH hs) floats)
static float *att_repeat_kv(const float *in, size_t rows, int P, int NH, int KV, int hs) {
    size_t Win = P + (size_t)2 * KV * hs, Wout = P + (size_t)2 * NH * hs;
    float *out = (float *)malloc_check(rows * Wout * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        memcpy(out + r * Wout, in + r * Win, P * sizeof(float));
        for (int part = 0; part < 2; part++) {   // k, then v
            for (int h = 0; h < NH; h++) {
                memcpy(out + r * Wout + P + (size_t)(part * NH + h) * hs,
                       in + r * Win + P + (size_t)(part * KV + h / (NH / KV)) * hs, hs * sizeof(float));
            }
        }
    }
    return out;
}

// ... and back, for their gradients: kv head kh's dk, dv the sums of its G copies', in order
static void att_sum_kv(float *out, const float *in, size_t rows, int P, int NH, int KV, int hs) {
    size_t Win = P + (size_t)2 * NH * hs, Wout = P + (size_t)2 * KV * hs;
    int G = NH / KV;
    for (size_t r = 0; r < rows; r++) {
        memcpy(out + r * Wout, in + r * Win, P * sizeof(float));
        for (int part = 0; part < 2; part++) {
            for (int c = 0; c < KV * hs; c++) {   // kv head c / hs, its dimension c % hs
                float sum = 0.0f;
                for (int g = 0; g < G; g++) { sum += in[r * Win + P + (size_t)part * NH * hs + (c / hs * G + g) * hs + c % hs]; }
                out[r * Wout + P + (size_t)part * KV * hs + c] = sum;
            }
        }
    }
}

// 1 if the first n floats of each of `rows` rows of a and b (ld apart) are the same bits
static int att_same_rows(const float *a, const float *b, size_t rows, size_t ld, size_t n) {
    int same = 1;
    for (size_t r = 0; r < rows; r++) { same &= !memcmp(a + r * ld, b + r * ld, n * sizeof(float)); }
    return same;
}

// Grouped-query attention is its definition: the plain loops with KV kv heads = the loops with KV = NH on the kv
// heads repeated G times. out, lse and dq exactly (the same sums in the same order); dk and dv = the sums of the G
// copies' within the derived bounds (the same G T terms, summed in another order).
static void check_gqa_definition(Rng *rng, int B, int T, int NH, int KV, int hs) {
    int W = (NH + 2 * KV) * hs, C = NH * hs, G = NH / KV;
    size_t rows = (size_t)B * T, n3 = rows * W, ny = rows * C, nl = (size_t)B * NH * T;
    float *qkv = att_random(n3, rng, 1.5f), *dout = att_random(ny, rng, 1.0f);
    float *rep = att_repeat_kv(qkv, rows, C, NH, KV, hs);
    float *y = (float *)calloc_check(2 * (ny + nl) + 3 * n3 + 3 * ny, sizeof(float)), *lse = y + ny;
    float *y1 = lse + nl, *lse1 = y1 + ny, *d = lse1 + nl, *dsum = d + n3, *td = dsum + n3, *d1 = td + n3;
    attention_forward_cpu(y, lse, qkv, B, T, NH, KV, hs);
    attention_forward_cpu(y1, lse1, rep, B, T, NH, NH, hs);
    attention_backward_cpu(d, dout, qkv, y, lse, B, T, NH, KV, hs);
    attention_backward_cpu(d1, dout, rep, y, lse, B, T, NH, NH, hs);
    att_sum_kv(dsum, d1, rows, C, NH, KV, hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t r3 = (size_t)b * T * W + h * hs, rk = (size_t)b * T * W + (NH + h / G) * hs;
            size_t r1 = (size_t)b * T * C + h * hs, rl = ((size_t)b * NH + h) * T;
            AttHead a = {qkv + r3, qkv + rk, qkv + rk + KV * hs, dout + r1, W, W, C, hs, 1.0f / sqrtf((float)hs)};
            AttGrad t = {td + r3, td + rk, td + rk + KV * hs, W, W}, none = {NULL, NULL, NULL, 0, 0};
            att_tol_backward(t, a, y + r1, C, lse + rl, none, T, 0, G);
        }
    }
    double worst = 0.0, diff = 0.0;
    int exact = !memcmp(y, y1, ny * sizeof(float)) && !memcmp(lse, lse1, nl * sizeof(float))
                && att_same_rows(d, dsum, rows, W, C);
    int ok = att_within(d, dsum, td, n3, &worst, &diff);
    check(exact && ok, "grouped-query attention = its definition (the loops on the kv heads repeated %d times): B %d "
          "T %d NH %d KV %d hs %d: out, lse, dq the same bits (%s), dk, dv within the derived bounds (worst %.3f of a "
          "bound; largest difference %.1e)", G, B, T, NH, KV, hs, exact ? "yes" : "no", worst, diff);
    free(qkv); free(dout); free(rep); free(y);
}

// ... and the ring's blocks' loops (query chunk qa over key chunk kb of T = 2c rows, from no earlier block; the
// backward from their out and lse, into zeros): out, lse, dq exactly, dk, dv within the derived bounds
static void check_gqa_block_definition(Rng *rng, int B, int c, int NH, int KV, int hs, int qa, int kb) {
    int T = 2 * c, W = (NH + 2 * KV) * hs, W2 = 2 * KV * hs, C = NH * hs, G = NH / KV;
    int causal = qa == kb, q0 = qa * c, k0 = kb * c;
    size_t rows = (size_t)B * T, n3 = rows * W, n2 = rows * W2, ny = rows * C, nl = (size_t)B * NH * T;
    float *qkv = att_random(n3, rng, 1.5f), *dout = att_random(ny, rng, 1.0f), *kv = att_kv_of(qkv, rows, NH, KV, hs);
    float *rep = att_repeat_kv(qkv, rows, C, NH, KV, hs), *kvrep = att_repeat_kv(kv, rows, 0, NH, KV, hs);
    // GQA's and the definition's (1): out, lse; dqkv (dsum: the copies' summed back); dkv; the tolerances
    float *y = (float *)calloc_check(2 * (ny + nl), sizeof(float)), *lse = y + ny, *y1 = lse + nl, *lse1 = y1 + ny;
    float *d = (float *)calloc_check(3 * n3 + 3 * ny, sizeof(float)), *dsum = d + n3, *td = dsum + n3, *d1 = td + n3;
    float *dkv = (float *)calloc_check(3 * n2 + 2 * ny, sizeof(float)), *dksum = dkv + n2, *tkv = dksum + n2;
    float *dkv1 = tkv + n2;
    for (size_t i = 0; i < ny + nl; i++) { y[i] = y1[i] = i < ny ? 0.0f : -INFINITY; }   // no block yet
    attention_block_forward_cpu(y, lse, qkv, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    attention_block_forward_cpu(y1, lse1, rep, kvrep, B, T, NH, NH, hs, q0, k0, c, causal);
    attention_block_backward_cpu(d, dkv, dout, qkv, y, lse, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    attention_block_backward_cpu(d1, dkv1, dout, rep, y, lse, kvrep, B, T, NH, NH, hs, q0, k0, c, causal);
    att_sum_kv(dsum, d1, rows, C, NH, KV, hs);     // (the k, v parts: zeros in both)
    att_sum_kv(dksum, dkv1, rows, 0, NH, KV, hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t r3 = ((size_t)b * T + q0) * W + h * hs, r2 = ((size_t)b * T + k0) * W2 + (h / G) * hs;
            size_t r1 = ((size_t)b * T + q0) * C + h * hs, rl = ((size_t)b * NH + h) * T + q0;
            AttHead a = {qkv + r3, kv + r2, kv + r2 + KV * hs, dout + r1, W, W2, C, hs, 1.0f / sqrtf((float)hs)};
            AttGrad t = {td + r3, tkv + r2, tkv + r2 + KV * hs, W, W2}, none = {NULL, NULL, NULL, 0, 0};
            att_tol_backward(t, a, y + r1, C, lse + rl, none, c, causal ? 0 : c, G);
        }
    }
    double worst = 0.0, diff = 0.0;
    int exact = !memcmp(y, y1, ny * sizeof(float)) && !memcmp(lse, lse1, nl * sizeof(float))
                && !memcmp(d, dsum, n3 * sizeof(float));
    int ok = att_within(dkv, dksum, tkv, n2, &worst, &diff);
    check(exact && ok, "ring block = its definition (the loops on the kv heads repeated %d times): B %d c %d NH %d KV "
          "%d hs %d, query chunk %d x key chunk %d (%s): out, lse, dq the same bits (%s), dk, dv within the derived "
          "bounds (worst %.3f of a bound; largest difference %.1e)", G, B, c, NH, KV, hs, qa, kb,
          causal ? "causal" : "full", exact ? "yes" : "no", worst, diff);
    free(qkv); free(dout); free(kv); free(rep); free(kvrep); free(y); free(d); free(dkv);
}

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

// --check-schedules: every pipeline schedule's point-to-point messages pair up between every two neighbours,
// in posting order and kind (steps_match: what the untagged messages of comm.h need), for 1F1B, GPipe and ZB at
// pp 2-8 and interleaved at pp 2-8 x vpp 2-4, with m from 1 (or pp) to 4 pp micro-batches; and the check
// fails on a schedule made wrong (two steps of rank 0 that send swapped, with pp 2 where both kinds go
// both ways). ZB's lists keep its rules (zb_list_ok), and its bubble on the model of time (pipe_simulate, F = B =
// W = 1) is (pp-1)(F+B-W) per rank, at most pp-1 + 1 more, against 1F1B's (pp-1)(F+B+W): at most half.
static void check_schedules(void) {
    static const PipeSchedule kinds[4] = {SCHEDULE_1F1B, SCHEDULE_GPIPE, SCHEDULE_INTERLEAVED, SCHEDULE_ZB};
    long pairs = 0, bad = 0, configs = 0, zb_bad = 0, zb_lists = 0, bubble_bad = 0, bubbles = 0, sim_bad = 0;
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
    for (int s = 0; s < 4; s++) {
        for (int pp = 2; pp <= 8; pp++) {
            for (int vpp = kinds[s] == SCHEDULE_INTERLEAVED ? 2 : 1; vpp <= (kinds[s] == SCHEDULE_INTERLEAVED ? 4 : 1); vpp++) {
                for (int m = kinds[s] == SCHEDULE_INTERLEAVED ? pp : 1; m <= 4 * pp; m += kinds[s] == SCHEDULE_INTERLEAVED ? pp : 1) {
                    configs++;
                    // the model of time, each stage its own times: the event simulation on a core per rank
                    // (pipe_shared) = the walk (pipe_walk); all on one core, that core never idles
                    double tf[8], tb[8], tw[8], w1[8], iw[8], is[8], i1[8], walk, shared, one;
                    int own[8], same[8];
                    for (int r = 0; r < pp; r++) {
                        tf[r] = 0.5 + (r * 7 + m * 3 + s) % 5 * 0.25; tb[r] = 2 * tf[r] - 0.3; tw[r] = 0.7 * tf[r];
                        own[r] = r; same[r] = 0; w1[r] = 1;
                    }
                    walk = pipe_walk(kinds[s], pp, vpp, m, tf, tb, tw, iw);
                    shared = pipe_shared(kinds[s], pp, vpp, m, tf, tb, tw, own, w1, is);
                    one = pipe_shared(kinds[s], pp, vpp, m, tf, tb, tw, same, w1, i1);
                    double work = 0;
                    for (int r = 0; r < pp; r++) {
                        sim_bad += fabs(iw[r] - is[r]) > 1e-9 * walk;
                        work += one - i1[r];
                    }
                    sim_bad += fabs(walk - shared) > 1e-9 * walk || fabs(one - work) > 1e-9 * work;
                    for (int r = 0; r < pp; r++) {
                        StepList a = pipeline_steps(kinds[s], pp, vpp, r, m, 0);
                        StepList b = pipeline_steps(kinds[s], pp, vpp, (r + 1) % pp, m, 0);
                        pairs += 2;
                        bad += !steps_match(&a, &b) + !steps_match(&b, &a);
                        free(a.s); free(b.s);
                    }
                }
            }
        }
    }
    check(bad == 0, "pipeline schedules: the messages of %ld neighbour pairs (both ways) in %ld schedules pair up in "
          "posting order and kind: %ld do not", pairs, configs, bad);
    check(sim_bad == 0, "pipeline schedules: in %ld schedules with uneven stages, the event simulation with a core per "
          "rank gives the walk's step and bubbles, and with one core for all, a step of all the ranks' work (%ld off)",
          configs, sim_bad);
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

static void check_attention(void) {
    Rng rng;
    rng_init(&rng, 24);
    int tiles[3][2] = {{att_panel_rows, att_key_tile}, {16, 8}, {5, 7}};   // the default, then small and ragged
    for (int k = 0; k < 3; k++) {
        int qt = tiles[k][0], kt = tiles[k][1];
        check_attention_case(&rng, 1, 1, 2, 2, 32, qt, kt);      // T = 1
        check_attention_case(&rng, 2, 37, 2, 2, 48, qt, kt);     // head size 48, T not a multiple of a tile
        check_attention_case(&rng, 1, 70, 1, 1, 64, qt, kt);     // one (batch, head), head size 64
        check_attention_case(&rng, 1, 300, 4, 4, 32, qt, kt);    // head size 32, more than one key tile at the default
        check_attention_case(&rng, 2, 37, 4, 2, 16, qt, kt);     // grouped-query: 2 query heads per kv head
        check_attention_case(&rng, 1, 70, 4, 1, 16, qt, kt);     // multi-query: one kv head
        for (int qa = 0; qa < 2; qa++) {
            for (int kb = 0; kb < 2; kb++) {
                check_attention_block_case(&rng, 2, 19, 2, 2, 48, qa, kb, qt, kt);   // chunks of 19, head size 48
                check_attention_block_case(&rng, 2, 19, 4, 2, 16, qa, kb, qt, kt);   // grouped-query
            }
        }
        check_attention_block_case(&rng, 1, 1, 2, 2, 32, 1, 1, qt, kt);   // chunks of one token (cp 8 at T 16)
        check_attention_block_case(&rng, 1, 23, 4, 1, 16, 1, 0, qt, kt);  // multi-query
    }
    att_panel_rows = tiles[0][0]; att_key_tile = tiles[0][1];
    int kvs[3] = {1, 2, 4};   // for 4 query heads: multi-query, 2 per kv head, multi-head
    for (int i = 0; i < 3; i++) {
        check_gqa_definition(&rng, 2, 37, 4, kvs[i], 16);
        check_gqa_block_definition(&rng, 2, 19, 4, kvs[i], 16, 1, 0);   // a full block
        check_gqa_block_definition(&rng, 2, 19, 4, kvs[i], 16, 1, 1);   // a causal one
    }
}

// ----------------------------------------------------------------------------
// the phases of a test run

typedef struct {           // what every phase needs: the reference, the layout, the model's options
    Args args;
    ModelConfig config;     // the model tested (the reference's, or its upcycling with --experts)
    float *params;         // its initial parameters, file order
    RefState ref;
    RefMoE rmoe;
    MoEOptions moe;
    Grid grid;
    int world, accum;
    char data_path[1024];
    LRScheduler sched;
    OptConfig opt;
} TestRun;

// A model of the run's layout and options from the parameters `params` (file order), and its data loader
// at the start of the reference's data.
static void test_model(TestRun *t, Model *m, const ModelConfig *c, float *params, DataLoader *dl) {
    const Args *a = &t->args;
    ModelOptions o = model_options(a, t->moe, t->grid.dp);
    gpt2_init(m, c, params, &t->grid, &o);
    dataloader_init(dl, t->data_path, a->B, a->T, c->vocab_size, t->grid.dp, t->grid.dp_rank, 0, a->seed);
}

// The rows this rank's MoE dispatches moved to and from the other ep ranks in the logged step, from
// its routing and the others' (each micro-batch and MoE layer: counts per expert, all-gathered over ep).
static double ep_rows_moved(Model *m, const int *log, int accum) {
    Grid *g = m->grid;
    int E = m->config.num_experts, El = E / g->ep, k = m->config.topk, nmoe = stage_moe_layers(m);
    // padded (a capacity): every slot of P = B cap rows goes, whatever the routing: El slots to and from each
    // other ep rank, per MoE layer and micro-batch
    if (m->moe.padded) { CommShape s = gpt2_comm_shape(m); return comm_ep_rows_even(&s, accum); }
    int *cnt = (int *)malloc_check(sizeof(int) * E), *all = (int *)malloc_check(sizeof(int) * E * g->ep);
    double rows = 0;
    for (int q = 0; q < nmoe * accum; q++) {
        const int *choice = log + (size_t)q * route_entry(m), *keep = choice + (size_t)m->BT * k;
        for (int e = 0; e < E; e++) { cnt[e] = 0; }
        for (size_t i = 0; i < (size_t)m->BT * k; i++) { if (keep[i]) { cnt[choice[i]]++; } }
        MPI_Allgather(cnt, E, MPI_INT, all, E, MPI_INT, g->ep_group.mpi);
        for (int r = 0; r < g->ep; r++) {
            if (r == g->ep_rank) { continue; }
            for (int le = 0; le < El; le++) {
                rows += all[g->ep_rank * E + r * El + le] + all[r * E + g->ep_rank * El + le];
            }
        }
    }
    free(cnt); free(all);
    return rows;
}

// One step checked against a reference computed from the same parameters and batch (`what` names it):
// the loss, MoE's auxiliary losses, dropped fraction and routing, every owned gradient element, the
// norm; then the update. Only the summation order differs from the reference, which the tolerances at
// the top bound. Returns the step's result; *ep_rows: the rows the step's all-to-alls moved (check_comm).
static StepResult check_step(TestRun *t, Model *m, DataLoader *dl, const RefState *ref, const RefMoE *rmoe, int step,
                             const char *what, double *ep_rows) {
    const ModelConfig *c = &m->config;
    int accum = t->accum;
    int *log = (int *)malloc_check(sizeof(int) * (route_entry(m) * stage_moe_layers(m) * accum + 1));
    m->moe.route_log = log;
    m->moe.route_log_micro = accum;
    gpt2_forward_backward(m, dl, accum);
    float loss = gpt2_read_loss(m, accum);
    m->moe.route_log = NULL;
    check(fabs(loss - ref->loss0) <= LOSS_TOL * fabs(ref->loss0), "step %d: loss %.6f, %s %.6f", step, loss, what,
          ref->loss0);
    *ep_rows = 0;
    double flipped_share = 0;   // MoE: the share of (layer, token) pairs routed otherwise than the reference
    if (c->num_experts > 0) {
        double aux, z, dropped;
        moe_step_numbers(&m->moe, m->grid, (double)m->B * accum * m->grid->dp, (double)m->T * m->grid->cp, &aux, &z,
                         &dropped);
        if (rmoe->present) {
            check(fabs(aux - rmoe->aux0) <= LOSS_TOL * fabs(rmoe->aux0)
                  && fabs(z - rmoe->z0) <= LOSS_TOL * fabs(rmoe->z0),
                  "step %d: MoE auxiliary losses aux %.6f z %.6f, %s %.6f %.6f", step, aux, z, what, rmoe->aux0,
                      rmoe->z0);
            // the same choices give the same loads, so the same dropped count; each token whose choice differs
            // (only where its margin allows, checked above) moves at most k assignments, each changing the
            // count by at most 2 (one expert's load down, another's up): the fraction, a mean over the MoE
            // layers of dropped / (R T k), by at most 2 flips / (Lm R T). (tp ranks route the same tokens.)
            double flips = (double)compare_routing(m, rmoe, log, accum);
            MPI_Allreduce(MPI_IN_PLACE, &flips, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            flips /= t->grid.tp;
            flipped_share = flips / ((double)rmoe->Lm * rmoe->R * rmoe->T);
            double drop_tol = DROP_TOL + 2.0 * flipped_share;
            check(fabs(dropped - rmoe->dropped0) <= drop_tol,
                  "step %d: MoE dropped fraction %.6f, %s %.6f (%.0f tokens routed otherwise: tolerance %.1e)",
                  step, dropped, what, rmoe->dropped0, flips, drop_tol);
        }
        *ep_rows = ep_rows_moved(m, log, accum);
    }
    free(log);
    compare_grads(m, ref->grads, flipped_share);
    StepResult r = gpt2_update(m, &t->opt, lr_at(&t->sched, step), step);
    // the same sums divided in another order (fp64, then rounded to float): within 2 float ulps
    check(fabsf(r.loss - loss) <= ldexpf(fabsf(loss), -22),
          "step %d: the loss read with the norm (after the device all-reduce) %.9g = the loss read alone %.9g",
          step, r.loss, loss);
    check(fabs(r.norm - ref->norm0) <= NORM_RTOL * ref->norm0, "step %d: global grad norm %.6f, %s %.6f", step, r.norm,
          what, ref->norm0);
    return r;
}

// The memory plan (--plan, --memory-limit) of this rank, made without allocating, equals what the model
// allocated, category by category and in total (this build's sizes; test_gpt does not sample).
static void check_plan(TestRun *t, Model *m) {
    MemPlan plan = gpt2_plan(&t->args, &t->config, m->moe.opt, t->world, my_rank, plan_build(&t->args), NULL);
    int same = plan.peak_total == mem_peak_total;
    for (int k = 0; k < MEM_NCAT; k++) { same &= plan.peak[k] == mem_peak[k]; }
    check(same, "memory plan = measurement: planned peaks %.0f %.0f %.0f %.0f %.0f %.0f %.0f B (total %.0f), measured %.0f %.0f %.0f %.0f %.0f %.0f %.0f B (total %.0f)",
          (double)plan.peak[0], (double)plan.peak[1], (double)plan.peak[2], (double)plan.peak[3], (double)plan.peak[4],
              (double)plan.peak[5],
          (double)plan.peak[6], (double)plan.peak_total, (double)mem_peak[0], (double)mem_peak[1], (double)mem_peak[2],
              (double)mem_peak[3],
          (double)mem_peak[4], (double)mem_peak[5], (double)mem_peak[6], (double)mem_peak_total);
}

// The step's calls, as the flight recorder holds them (comm.h; check_first_step sizes its ring to hold a whole step),
// gathered on rank 0 in one form: a message sent (send 1) or received (0), or a collective (2, kind its operation);
// its peer's world rank; its group (its name and instance); a message's kind; its bytes.
typedef struct { int send, peer_world, group, kind; double bytes; } CallRecord;
static int call_group(const FlightGroup *g) {   // (a djb2 hash, in unsigned arithmetic: it wraps)
    unsigned h = 5381;
    for (const char *c = g->name; *c; c++) { h = h * 33 + (unsigned char)*c; }
    return (int)(h * 31 + (unsigned)g->instance);
}
static int ring_calls(CallRecord *out, int *lost) {
    FlightHeader *h = flight_header();
    uint64_t cap = (uint64_t)h->capacity, end = h->written, i = end > cap ? end - cap : 0;
    int n = 0;
    *lost = (int)i;
    for (; i < end; i++, n++) {
        const FlightRecord *x = flight_slot(i);
        int send = x->op == FL_SEND ? 1 : x->op == FL_RECV ? 0 : 2;
        out[n] = (CallRecord){send, x->peer, call_group(&h->groups[x->group - 1]), send == 2 ? x->op : x->tag,
                              (double)x->count * x->elem};
    }
    return n;
}

// whether a rank's calls hold a collective on group instance `group`
static int log_has_collective(const CallRecord *log, int n, int group) {
    for (int q = 0; q < n; q++) { if (log[q].send == 2 && log[q].group == group) { return 1; } }
    return 0;
}

// The step's point-to-point messages pair up as NCCL pairs them (by order, untagged: NCCL matches the messages
// between two ranks by their order alone): for every ordered pair of ranks, the sender's messages to the receiver,
// in posting order, are the receiver's receives from the sender, one for one in bytes, group and kind (pipeline
// exchanges, the ring's hops: the executed traffic, not a model of it). And every two ranks order the collectives of
// the communicators they share alike (NCCL documents communicators used concurrently in different orders as able to
// hang).
static void check_p2p_pairs(void) {
    int world = 1, most = 0, lost = 0;
    CallRecord *mine = (CallRecord *)calloc_check(flight_header()->capacity + 1, sizeof(CallRecord)), *all = NULL;
    int n = ring_calls(mine, &lost);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Allreduce(&n, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &lost, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int *counts = (int *)malloc_check(sizeof(int) * world);
    if (my_rank == 0) { all = (CallRecord *)calloc_check((size_t)world * (most + 1), sizeof(CallRecord)); }
    MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Gather(mine, (int)((most + 1) * sizeof(CallRecord)), MPI_BYTE, all, (int)((most + 1) * sizeof(CallRecord)),
               MPI_BYTE, 0, MPI_COMM_WORLD);
    if (my_rank == 0) {
        long pairs = 0, messages = 0, bad = 0;
        for (int i = 0; i < world; i++) {
            for (int j = 0; j < world; j++) {
                const CallRecord *si = all + (size_t)i * (most + 1), *rj = all + (size_t)j * (most + 1);
                int a = 0, b = 0, any = 0;
                for (;;) {   // the next send of i to j, the next receive of j from i (collectives: send 2, skipped)
                    while (a < counts[i] && !(si[a].send == 1 && si[a].peer_world == j)) { a++; }
                    while (b < counts[j] && !(rj[b].send == 0 && rj[b].peer_world == i)) { b++; }
                    if (a == counts[i] || b == counts[j]) { bad += (a < counts[i]) + (b < counts[j]); break; }
                    any = 1;
                    messages++;
                    bad += si[a].bytes != rj[b].bytes || si[a].group != rj[b].group || si[a].kind != rj[b].kind;
                    a++; b++;
                }
                pairs += any;
            }
        }
        check(bad == 0 && lost == 0, "point-to-point: %ld messages between %ld ordered pairs of ranks pair up in posting "
              "order (bytes, group, kind): %ld do not (%d not recorded)", messages, pairs, bad, lost);
        // collectives: every two ranks call those of the communicators they share in one order (the same
        // instances, operations and sizes, interleaved alike)
        long compared = 0, disorder = 0, shared_pairs = 0;
        for (int i = 0; i < world; i++) {
            for (int j = i + 1; j < world; j++) {
                const CallRecord *li = all + (size_t)i * (most + 1), *lj = all + (size_t)j * (most + 1);
                int a = 0, b = 0, any = 0;
                for (;;) {   // the next collective of each on an instance the other also uses
                    while (a < counts[i] && !(li[a].send == 2 && log_has_collective(lj, counts[j], li[a].group))) { a++; }
                    while (b < counts[j] && !(lj[b].send == 2 && log_has_collective(li, counts[i], lj[b].group))) { b++; }
                    if (a == counts[i] || b == counts[j]) { disorder += (a < counts[i]) + (b < counts[j]); break; }
                    any = 1;
                    compared++;
                    disorder += li[a].group != lj[b].group || li[a].kind != lj[b].kind ||
                                (li[a].kind != FL_ALL_TO_ALL && li[a].bytes != lj[b].bytes);
                    a++; b++;
                }
                shared_pairs += any;
            }
        }
        check(disorder == 0, "collectives: every two ranks (%ld pairs sharing communicators) call those they share in one "
              "order: %ld calls compared, %ld out of order", shared_pairs, compared, disorder);
        free(all);
    }
    free(mine); free(counts);
}

// Step 0 against the PyTorch reference (loss, routing, gradients, norm), then the memory and comm
// reports against their formulas.
static void check_first_step(TestRun *t, Model *m, DataLoader *dl, int check_mem, int check_comm_flag, float *loss0) {
    comm_reset_counters(&t->grid);
    double ep_rows;
    if (check_comm_flag) { flight_start_memory(1 << 16); }   // (a ring that holds the step's calls: check_p2p_pairs)
    *loss0 = check_step(t, m, dl, &t->ref, &t->rmoe, 0, "reference", &ep_rows).loss;
    if (check_comm_flag) { check_p2p_pairs(); }
    // ep_rows: the rows this rank's MoE dispatches sent to other ep ranks plus those it received from them
    // (each moves forward and back, in the forward and again in the backward), from the routing
    if (check_comm_flag) { check_comm(m, t->accum, ep_rows); }
    if (check_mem) {
        check_memory_model(m);
        check_memory_activations(m, t->accum);
        check_memory_buffers(m);
        check_plan(t, m);
    }
    if (t->args.memory_report) { mem_report(my_rank, t->world, "test"); }
    if (t->args.comm_report) { comm_report(&t->grid, 1, "test step 0"); }
}

// |got[i] - want[i]| <= LOSS_TOL |want[i]| for steps s0 + i, i < n.
static void check_losses(const float *got, const float *want, int n, int s0, const char *what) {
    double worst = 0;
    int at = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / fabs(want[i]);
        if (e > worst || e != e) { worst = e != e ? INFINITY : e; at = i; }
    }
    check(worst <= LOSS_TOL, "losses of steps %d..%d %s: worst relative error %.2e at step %d (%.6f vs %.6f)", s0,
          s0 + n - 1, what, worst,
          s0 + at, got[at], want[at]);
}

// A MoE reference with the loads of its steps (gpt2_ref.py, moe.bin version 2): the load of the step just run
// (the top-k assignments to each expert of each MoE layer before drops, over the global batch: main.log's load
// line) equals the reference's, count for count. They are integers that follow from the choices, and every
// choice of every step is the reference's: its data seed gives each decision of every step a margin of at
// least min_margin between the (biased) scores, far above their rounding differences (the 10-step losses
// rely on the same).
// (fp32 builds: bf16 rounds the scores by ~2^-8 of their size, far above the margins, so a bf16 run routes some
// tokens otherwise; its losses carry its own tolerance.)
static void check_moe_load(Model *m, const RefMoE *r, int step) {
    if (r->loads == NULL || sizeof(floatX) != 4) { return; }
    size_t n = (size_t)r->Lm * r->E;
    double *load = (double *)malloc_check(n * sizeof(double)), *kept = (double *)malloc_check(r->Lm * sizeof(double));
    moe_gather_load(&m->moe, m->grid, r->Lm, load, kept);
    if (my_rank == 0) {
        long differ = 0;
        for (size_t i = 0; i < n; i++) { differ += load[i] != r->loads[step * n + i]; }
        check(differ == 0, "step %d: MoE load (assignments per MoE layer and expert before drops, %zu counts) = the "
              "reference's: %ld differ", step, n, differ);
    }
    free(load); free(kept);
}

// After the last step: the routing bias of loss-free balancing equals the reference's bit for bit (each step
// moves it by +-rate or 0 by the sign of integer loads, the same on both sides: the same fp32 operations).
static void check_moe_bias(Model *m, const RefMoE *r) {
    if (r->bias == NULL || sizeof(floatX) != 4) { return; }   // (fp32 builds, as check_moe_load)
    float *b = moe_gather_bias(&m->moe, m->grid, num_moe_layers(&m->config));
    if (my_rank == 0) {
        size_t n = (size_t)r->Lm * r->E, differ = 0;
        float worst = 0.0f;
        for (size_t i = 0; i < n; i++) {
            differ += memcmp(&b[i], &r->bias[i], sizeof(float)) != 0;
            worst = fmaxf(worst, fabsf(b[i] - r->bias[i]));
        }
        check(differ == 0, "MoE routing bias after %d steps (rate %g) = the reference's bit for bit: %zu of %zu differ "
              "(worst %.3g)", r->nsteps, r->bias_rate, differ, n, worst);
    }
    free(b);
}

// Steps 1 .. nsteps-1 (AdamW, the reference's schedule): each step's loss against the reference's (and a MoE
// reference's loads and final routing bias).
static void check_training(TestRun *t, Model *m, DataLoader *dl, float loss0) {
    float *losses = (float *)malloc_check(sizeof(float) * t->ref.nsteps);
    losses[0] = loss0;
    check_moe_load(m, &t->rmoe, 0);
    for (int s = 1; s < t->ref.nsteps; s++) {
        gpt2_forward_backward(m, dl, t->accum);
        losses[s] = gpt2_update(m, &t->opt, lr_at(&t->sched, s), s).loss;
        check_moe_load(m, &t->rmoe, s);
    }
    check_losses(losses, t->ref.losses, t->ref.nsteps, 0, "(AdamW) against the reference's");
    check_moe_bias(m, &t->rmoe);
    free(losses);
}

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
    load_state(m, dir, step, dl, rng, t->args.total_batch);
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
        run.moe.route_log = log;
        run.moe.route_log_micro = accum;
        gpt2_forward_backward(&run, &dl, accum);
        run.moe.route_log = NULL;
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
        if (s + 1 == RESUME_STEP) { save_checkpoint(&run, dir, RESUME_STEP, &dl, &rng, t->args.total_batch, 0, t->ref.nsteps); }
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
    check_losses(losses, a5.losses, a5.nsteps, step, "against layout A's from the same checkpoint");
    check_losses(losses, t->ref.losses + step, a5.nsteps, step, "against the reference's");
}

// ----------------------------------------------------------------------------

// test_gpt's own flags (the rest are train_gpt's, left in rest).
typedef struct {
    const char *ref_dir, *resume_dir, *resume_from, *mutation;
    const char *bf16_grads;
    int check_mem, check_comm, check_layer, check_attention, check_schedules, check_tolerance, bad_rank;
} TestFlags;

static int parse_test_flags(int argc, char **argv, TestFlags *f, char **rest) {
    memset(f, 0, sizeof(*f));
    f->bad_rank = -1;
    int nrest = 0;
    rest[nrest++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ref") && i + 1 < argc) { f->ref_dir = argv[++i]; }
        else if (!strcmp(argv[i], "--check-resume") && i + 1 < argc) { f->resume_dir = argv[++i]; }
        else if (!strcmp(argv[i], "--resume-from") && i + 1 < argc) { f->resume_from = argv[++i]; }
        else if (!strcmp(argv[i], "--mutate") && i + 1 < argc) { f->mutation = argv[++i]; }
        else if (!strcmp(argv[i], "--check-memory")) { f->check_mem = 1; }
        else if (!strcmp(argv[i], "--check-comm")) { f->check_comm = 1; }
        else if (!strcmp(argv[i], "--check-comm-layer")) { f->check_layer = 1; }
        else if (!strcmp(argv[i], "--check-attention")) { f->check_attention = 1; }
        else if (!strcmp(argv[i], "--check-schedules")) { f->check_schedules = 1; }
        else if (!strcmp(argv[i], "--check-tolerance")) { f->check_tolerance = 1; }
        else if (!strcmp(argv[i], "--bf16-grads") && i + 1 < argc) { f->bf16_grads = argv[++i]; }
        else if (!strcmp(argv[i], "--bad-file-on-rank") && i + 1 < argc) { f->bad_rank = atoi(argv[++i]); }
        else { rest[nrest++] = argv[i]; }
    }
    if (f->ref_dir == NULL) {
        fail_all(my_rank, "test_gpt needs --ref DIR (a reference state from dev/reference/gpt2_ref.py)");
    }
    if (f->mutation && !f->resume_from) { fail_all(my_rank, "--mutate needs --resume-from DIR"); }
    return nrest;
}

// The model tested (the reference's, or its upcycling with --experts E), its options (a MoE reference's
// own), the grid, the reference's batch, schedule and optimizer.
static void test_setup(TestRun *t, const char *ref_dir, const ModelConfig *ref_config, const float *ref_params) {
    Args *args = &t->args;
    char path[1024];
    args->T = t->ref.T;
    args->total_batch = t->ref.R * t->ref.T;
    t->config = *ref_config;
    t->params = (float *)malloc_check(model_floats(ref_config) * sizeof(float));
    memcpy(t->params, ref_params, model_floats(ref_config) * sizeof(float));
    snprintf(path, sizeof(path), "%s/model.bin", ref_dir);
    t->params = apply_moe_flags(args, my_rank, &t->config, t->params, path, 0, 1);
    if (t->config.num_experts > 0 && ref_config->num_experts == 0) {
        // E = 1, k = 1 (and z-coeff 0) is the dense model: its expert's gradients are the dense MLP's,
        // its router's exactly zero
        float *g = upcycle_dense(ref_config, t->ref.grads, &t->config, 0, 1);
        free(t->ref.grads);
        t->ref.grads = g;
    }
    t->moe = moe_options(args, &t->config);   // a MoE reference: its own options
    if (t->rmoe.present) {
        t->moe = (MoEOptions){t->rmoe.F1000, t->rmoe.policy ? DROP_POSITION : DROP_PROBS, t->rmoe.aux_coeff,
                              t->rmoe.z_coeff, t->rmoe.bias_rate};
    }
    validate_layout(args, &t->config, t->world, my_rank);
    comm_one_stream = args->comm_streams == 1;   // (--comm-streams: before the groups make their streams)
    grid_init(&t->grid, args->tp, args->cp, args->pp, args->ep);
    t->accum = args->total_batch / (args->B * args->T * t->grid.dp);
    if (my_rank == 0) {
        printf("test_gpt: %s | world %d = tp %d x cp %d x pp %d x dp %d | zero %d%s | B %d T %d accum %d | ce chunk %d | %s\n", ref_dir,
               t->world, t->grid.tp, t->grid.cp, t->grid.pp, t->grid.dp, args->zero, args->sp ? " | sp" : "", args->B,
                   args->T, t->accum,
               args->ce_chunk, PRECISION_NAME);
        if (t->config.num_experts > 0) {
            printf("          MoE: E %d k %d every %d, %s scores | ep %d edp %d | capacity factor %.3f, drop %s, aux "
                   "%g, z %g, bias rate %g%s\n", t->config.num_experts, t->config.topk, t->config.moe_every,
                   t->config.router_score == ROUTER_SIGMOID ? "sigmoid" : "softmax", t->grid.ep,
                   t->grid.edp_group.size, t->moe.cap1000 / 1000.0, t->moe.policy == DROP_PROBS ? "probs" : "position",
                   t->moe.aux_coeff, t->moe.z_coeff, t->moe.bias_rate,
                   ref_config->num_experts == 0 ? " | upcycled from the dense reference" : "");
        }
    }
    snprintf(t->data_path, sizeof(t->data_path), "%s/data.bin", ref_dir);
    t->sched = (LRScheduler){"cosine", t->ref.lr, t->ref.final_frac, t->ref.warmup, t->ref.nsteps};
    t->opt = (OptConfig){t->ref.beta1, t->ref.beta2, t->ref.eps, t->ref.weight_decay, t->ref.clip, args->seed};
}

// The bf16 model file (version 5) of the reference's weights, if there is one, loads as their
// round-to-nearest-even.
static void check_bf16_model_file(const char *ref_dir, const ModelConfig *ref_config, const float *ref_params) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/model_bf16.bin", ref_dir);
    if (access(path, R_OK) != 0) { return; }
    ModelConfig c16;
    float *p16 = read_model_file(path, &c16);
    size_t P = num_parameters(ref_config), bad = 0;
    for (size_t i = 0; i < P; i++) { if (p16[i] != bf16_to_float(float_to_bf16(ref_params[i]))) { bad++; } }
    check(bad == 0 && !memcmp(&c16, ref_config, sizeof(*ref_config)),
          "model file version %d (bf16): %zu parameters load as bf16(fp32 file), %zu differ",
          ref_config->num_experts ? 15 : 5, P, bad);
    free(p16);
}

// The checks of one layout against the reference: the model files, the first step, training, resume.
static void check_model(TestRun *t, const TestFlags *f, const ModelConfig *ref_config, const float *ref_params) {
    check_bf16_model_file(f->ref_dir, ref_config, ref_params);
    Model model;
    DataLoader loader;
    test_model(t, &model, &t->config, t->params, &loader);
    float loss0;
    check_first_step(t, &model, &loader, f->check_mem, f->check_comm, &loss0);
    check_training(t, &model, &loader, loss0);
    if (f->resume_dir) { check_resume(t, f->resume_dir); }
}

int main(int argc, char **argv) {
    backend_env_before_init();    // (CUDA: before any context exists)
    mpi_init(&argc, &argv);
    TestRun t;
    memset(&t, 0, sizeof(t));
    MPI_Comm_size(MPI_COMM_WORLD, &t.world);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    plan_model = gpt2_plan;
    TestFlags f;
    char **rest = (char **)malloc_check(sizeof(char *) * (argc + 1));
    int nrest = parse_test_flags(argc, argv, &f, rest);
    char path[1024];
    snprintf(path, sizeof(path), "%s/model.bin", f.ref_dir);
    ModelConfig ref_config;   // the reference's shape; the model tested is the same, or (--experts E with a
                             // dense reference) its upcycling, compared with the dense reference's numbers
    float *ref_params = read_model_file(path, &ref_config);
    snprintf(path, sizeof(path), "%s/state.bin", f.ref_dir);
    read_ref_state(path, &ref_config, &t.ref);
    read_ref_moe(f.ref_dir, &t.rmoe);
    if (f.bad_rank >= 0) {
        // one rank meets a bad file while the others wait in a collective: all must exit, none hang
        if (my_rank == f.bad_rank) { ModelConfig c; read_model_file("/nonexistent/model.bin", &c); }
        MPI_Barrier(MPI_COMM_WORLD);
        if (my_rank == 0) { printf("--bad-file-on-rank %d: no rank failed?\n", f.bad_rank); }
        MPI_Finalize();
        return 1;
    }
    Args *args = &t.args;
    default_args(args);
    args->B = 1;
    parse_args(nrest, rest, args);
    args->sample_every = 0;   // (test_gpt does not sample: the MoE buffers are sized for the capacity)
    agree_on_args(args, my_rank, t.world);
    attention_path = attention_path_of(args);
    if (f.check_layer) {   // the comm layer alone, on the grid of --tp/--pp (any world size they divide)
        if (t.world % (args->tp * args->pp)) { fail_all(my_rank, "world %d is not divisible by tp*pp", t.world); }
        grid_init(&t.grid, args->tp, 1, args->pp, 1);
        check_comm_layer(&t.grid);
    } else if (f.check_attention) {   // the CPU attention (and MoE router, capacity) fast paths against their loops
        grid_init(&t.grid, 1, 1, 1, 1);
        check_attention();
#ifndef USE_CUDA
        check_moe_cpu();
#endif
    } else if (f.check_tolerance) {   // the bf16 gradient tolerances on the reference (host code, any rank)
        grid_init(&t.grid, 1, 1, 1, 1);
        check_tolerance(&ref_config, t.ref.grads, f.bf16_grads);
    } else if (f.check_schedules) {   // the pipeline schedules' message order (host logic, any rank)
        grid_init(&t.grid, 1, 1, 1, 1);
        if (my_rank == 0) { check_schedules(); }
    } else {
        test_setup(&t, f.ref_dir, &ref_config, ref_params);
        if (f.resume_from) { check_resume_from(&t, f.resume_from, f.mutation); }
        else { check_model(&t, &f, &ref_config, ref_params); }
    }
    int counts[2] = {n_passed, n_failed};
    MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (my_rank == 0) { printf("%d passed, %d failed\n", counts[0], counts[1]); }
    mem_free_all();
    grid_free(&t.grid);
    MPI_Finalize();
    return counts[1] == 0 ? 0 : 1;
}
