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
//    margin >= 1e-6 (gpt2_ref.py --min_margin), 25x this at step 0, so its gradients compare without
//    exclusions; later steps drift further (check_moe_load) and their loads and losses carry measured bounds.
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
// test_gpt --check-tolerance. MoE routing within ROUTE_MARGIN adds two terms, derived in compare_grads
// (test/grads.h): every block, for the tokens routed otherwise; an expert whose assignments differ from the
// reference's, 2 sqrt(moved / kept) of its rms.
// The attention backward's D adds a third (block_tolerances): D = rowsum(dY o Y) is taken from the stored bf16 Y
// (FlashAttention's recipe; the cuBLAS path and the ring do the same), and dS = P (dP - D) cancels, so D's error
// reaches the q and k blocks magnified (the D part of their gradients is up to 25x the gradient at L 8; a GPU run,
// 2026-12, measured 0.053 in the last layer's k block). The reference measures each block's share of it on its own
// activations (gpt2_ref.py's dterm.bin: the rms change when each row's D carries one rounding of Y, d_term), and the
// block gets 2 sqrt(kY) times that share (kY: the roundings Y took, 1, or up to 2 cp/U through the ring's merges):
// ~0.03 in the deepest q, k blocks, ~1e-5 elsewhere; a zeroed or lost dq, dk is still off by O(1).
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
    int muon;               // the reference trained with Muon (gpt2_ref.py --optimizer muon)
    float muon_momentum, fp64_dist;   // its momentum; its fp32 losses' and norms' distance from its fp64 run's
    float *grads;        // 16 tensors, file order
    float *losses, *norms;
    size_t P;            // its parameters
    float *dterm;        // (P) dterm.bin: each gradient's rms change from D's bf16 error (NULL: no file)
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
    s->muon = fh[9] == 1.0f; s->muon_momentum = fh[10]; s->fp64_dist = fh[11];
    size_t P = num_parameters(c);
    s->grads = (float *)malloc_check(P * sizeof(float));
    s->losses = (float *)malloc_check(s->nsteps * sizeof(float));
    s->norms = (float *)malloc_check(s->nsteps * sizeof(float));
    fread_check(s->grads, sizeof(float), P, f, path);
    fread_check(s->losses, sizeof(float), s->nsteps, f, path);
    fread_check(s->norms, sizeof(float), s->nsteps, f, path);
    // (the file ends with the parameters after the last step: not read, see compare_grads)
    fclose(f);
    s->P = P;
}

// dir/dterm.bin (gpt2_ref.py's d_term), or NULL where an older reference lacks it
static float *read_ref_dterm(const char *dir, size_t P) {
    char path[1100];
    snprintf(path, sizeof(path), "%s/dterm.bin", dir);
    FILE *f = fopen(path, "rb");
    if (!f) { return NULL; }
    int h[256];
    fread_check(h, sizeof(int), 256, f, path);
    if (h[0] != 20241204 || h[1] != 1) { fail("'%s' has bad magic/version (gpt2_ref.py writes it)", path); }
    float *d = (float *)malloc_check(P * sizeof(float));
    fread_check(d, sizeof(float), P, f, path);
    fclose(f);
    return d;
}

#include "test/routing.h"
#include "test/grads.h"
#include "test/memory.h"
#include "test/comm.h"
#include "test/attention.h"
#include "test/schedules.h"

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
    float norm0;           // our step 0's gradient norm (check_first_step)
} TestRun;

// A model of the run's layout and options from the parameters `params` (file order), and its data loader
// at the start of the reference's data.
static void test_model(TestRun *t, Model *m, const ModelConfig *c, float *params, DataLoader *dl) {
    const Args *a = &t->args;
    ModelOptions o = model_options(&a->layout, a, t->moe, t->grid.dp);
    gpt2_init(m, c, params, &t->grid, &o);
    dataloader_init(dl, t->data_path, a->layout.B, a->layout.T, c->vocab_size, t->grid.dp, t->grid.dp_rank, 0, a->seed);
}

// The rows this rank's MoE dispatches moved to and from the other ep ranks in the logged step, from
// its routing and the others' (each micro-batch and MoE layer: counts per expert, all-gathered over ep).
static double ep_rows_moved(Model *m, const int *log, int accum) {
    Grid *g = m->grid;
    int E = m->config.num_experts, El = E / g->ep, k = m->config.topk, nmoe = stage_moe_layers(m);
    // padded (a capacity): every slot of P = B cap rows goes, whatever the routing: El slots to and from each
    // other ep rank, per MoE layer and micro-batch
    if (m->moe.dispatch.padded) { CommShape s = gpt2_comm_shape(m); return comm_ep_rows_even(&s, accum); }
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
    m->moe.route_log.entries = log;
    m->moe.route_log.micros = accum;
    gpt2_forward_backward(m, dl, accum);
    float loss = gpt2_read_loss(m, accum);
    m->moe.route_log.entries = NULL;
    check(fabs(loss - ref->loss0) <= LOSS_TOL * fabs(ref->loss0), "step %d: loss %.6f, %s %.6f", step, loss, what,
          ref->loss0);
    *ep_rows = 0;
    RouteDiff rd;               // MoE: how the routing differs from the reference's (compare_grads)
    route_diff_init(&rd, rmoe);
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
            double flips = (double)compare_routing(m, rmoe, log, accum, &rd);
            MPI_Allreduce(MPI_IN_PLACE, &flips, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            flips /= t->grid.tp;
            rd.flipped_share = flips / ((double)rmoe->Lm * rmoe->R * rmoe->T);
            double drop_tol = DROP_TOL + 2.0 * rd.flipped_share;
            check(fabs(dropped - rmoe->dropped0) <= drop_tol,
                  "step %d: MoE dropped fraction %.6f, %s %.6f (%.0f tokens routed otherwise: tolerance %.1e)",
                  step, dropped, what, rmoe->dropped0, flips, drop_tol);
        }
        *ep_rows = ep_rows_moved(m, log, accum);
    }
    free(log);
    compare_grads(m, ref->grads, num_parameters(&m->config) == ref->P ? ref->dterm : NULL, &rd);
    route_diff_free(&rd);
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
    MemPlan plan = gpt2_plan(&t->args.layout, &t->config, m->moe.shape.opt, t->world, my_rank,
                             plan_build(t->args.plan_precision), NULL);
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
    long ns_before = m->muon.ns_calls;
    StepResult r0 = check_step(t, m, dl, &t->ref, &t->rmoe, 0, "reference", &ep_rows);
    *loss0 = r0.loss;
    t->norm0 = r0.norm;
    if (check_comm_flag && m->muon.world) {   // each Muon matrix orthogonalised on exactly one rank
        double ns = muon_ns_calls_world(&m->muon, ns_before);
        check(ns == m->muon.nmat, "Muon: Newton-Schulz ran %.0f times in the step over all %d ranks, once per Muon matrix "
              "(%d); this rank owns %d", ns, t->world, m->muon.nmat, m->muon.owned);
    }
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

// |got[i] - want[i]| <= tol |want[i]| for steps s0 + i, i < n.
static void check_losses(const float *got, const float *want, int n, int s0, const char *what, float tol) {
    double worst = 0;
    int at = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / fabs(want[i]);
        if (e > worst || e != e) { worst = e != e ? INFINITY : e; at = i; }
    }
    check(worst <= tol, "losses of steps %d..%d %s: worst relative error %.2e at step %d (%.6f vs %.6f; tolerance "
          "%.1e)", s0, s0 + n - 1, what, worst, s0 + at, got[at], want[at], tol);
}

// The losses' tolerance over a reference's steps. LOSS_TOL bounds the forward's own sums; where the steps amplify a
// rounding difference the bound is measured, not assumed: the reference ran the same steps in fp64 too (Muon:
// Newton-Schulz, five steps of slope up to a = 3.44 in a small singular direction; MoE: from the first AdamW step
// on, elements whose gradient is rounding noise of eps's size, and the routing near-ties their drift reaches), and
// its fp32 run's worst relative distance from that, d, is how far an fp32 computation of these steps lands from the
// exact one. Ours and the reference's are two such computations (other summation orders): at most 2 d apart when
// each lands as far as the reference did, 4 d leaving 2x for another order landing farther.
static float measured_loss_tol(const TestRun *t) { return fmaxf(LOSS_TOL, 4.0f * t->ref.fp64_dist); }

// A MoE reference with the loads of its steps (gpt2_ref.py, moe.bin version 3): the load of the step just run
// (the top-k assignments to each expert of each MoE layer before drops, over the global batch: main.log's load
// line) against the reference's, count for count. They are integers that follow from the choices. At step 0 every
// choice is the reference's: the data seed gives each decision a margin of at least min_margin (1e-6), 16x the
// scores' rounding (6e-8, ROUTE_MARGIN's derivation), and the allowance is 0. From the first AdamW step on, the
// scores of two fp32 runs drift apart ~100x further (an element whose gradient is rounding noise of eps's size moves
// by another fraction of lr in each): the reference measured its drift from its fp64 run, D, and counted, per
// step and layer, the assignments that can move to another expert when each score may be off by 3 D (ours within
// 2 D of the exact run's), each move changing two loads by 1 (fp64_twin, load_allowance in gpt2_ref.py): per
// layer, sum |load - ref| <= that allowance. Returns whether any load differs: a token routed otherwise changes
// the step's gradient by far more than rounding, the two runs separate there, and the reference's later
// near-ties no longer bound ours (check_training stops comparing loads; the losses keep their measured bound).
// (fp32 builds: bf16 rounds the scores by ~2^-8 of their size, far above the margins, so a bf16 run routes some
// tokens otherwise; its losses carry its own tolerance.)
static int check_moe_load(Model *m, const RefMoE *r, int step) {
    if (r->loads == NULL || sizeof(floatX) != 4) { return 0; }
    size_t n = (size_t)r->Lm * r->E;
    double *load = (double *)malloc_check(n * sizeof(double)), *kept = (double *)malloc_check(r->Lm * sizeof(double));
    moe_gather_load(&m->moe, m->grid, r->Lm, load, kept);
    long moved = 0, allowed = 0, over = 0;   // (rank 0 holds the loads: it decides for every rank)
    for (int l = 0; l < r->Lm && my_rank == 0; l++) {
        long d = 0, allow = r->allow ? r->allow[step * r->Lm + l] : 0;
        for (int e = 0; e < r->E; e++) { d += labs(lround(load[l * r->E + e]) - r->loads[step * n + l * r->E + e]); }
        moved += d; allowed += allow; over += d > allow;
    }
    if (my_rank == 0) {
        check(over == 0, "step %d: MoE load (assignments per MoE layer and expert before drops, %zu counts) against the "
              "reference's: sum |difference| %ld, allowed %ld by the near-ties (%ld layers over theirs)", step, n, moved,
              allowed, over);
    }
    free(load); free(kept);
    int differ = moved > 0;
    comm_host_bcast(&m->grid->world, &differ, 1, DT_INT, 0, "whether the MoE load differed");
    return differ;
}

// After the last step: the routing bias of loss-free balancing against the reference's. Each step moves it by
// +-rate or 0 by the sign of integer loads, the same fp32 operations on both sides: bit for bit when every step's
// loads were the reference's; from the step whose loads first differed (check_moe_load) on, a step may move a bias
// by -rate instead of +rate: within 2 rate per such step.
static void check_moe_bias(Model *m, const RefMoE *r, int steps_separated) {
    if (r->bias == NULL || sizeof(floatX) != 4) { return; }   // (fp32 builds, as check_moe_load)
    float *b = moe_gather_bias(&m->moe, m->grid, num_moe_layers(&m->config));
    if (my_rank == 0) {
        size_t n = (size_t)r->Lm * r->E, differ = 0, over = 0;
        float worst = 0.0f, bound = 2.0f * r->bias_rate * steps_separated;
        for (size_t i = 0; i < n; i++) {
            differ += memcmp(&b[i], &r->bias[i], sizeof(float)) != 0;
            over += !(fabsf(b[i] - r->bias[i]) <= bound * (1.0f + 1e-6f));
            worst = fmaxf(worst, fabsf(b[i] - r->bias[i]));
        }
        if (steps_separated == 0) {
            check(differ == 0, "MoE routing bias after %d steps (rate %g) = the reference's bit for bit: %zu of %zu "
                  "differ (worst %.3g)", r->nsteps, r->bias_rate, differ, n, worst);
        } else {
            check(over == 0, "MoE routing bias after %d steps (rate %g) within 2 rate x %d steps since the loads first "
                  "differed of the reference's: %zu of %zu outside (worst %.3g)", r->nsteps, r->bias_rate, steps_separated,
                  over, n, worst);
        }
    }
    free(b);
}

// Muon (gpt2_ref.py --optimizer muon): each step's loss and gradient norm against the reference's, within
// measured_loss_tol (Newton-Schulz amplifies a rounding difference).
static void check_muon_training(TestRun *t, const float *losses, const float *norms) {
    float tol = measured_loss_tol(t);
    double worst = 0;
    int at = 0;
    for (int s = 0; s < t->ref.nsteps; s++) {
        double e = fmax(fabs(losses[s] - t->ref.losses[s]) / fabs(t->ref.losses[s]),
                        fabs(norms[s] - t->ref.norms[s]) / fabs(t->ref.norms[s]));
        if (e > worst || e != e) { worst = e != e ? INFINITY : e; at = s; }
    }
    check(worst <= tol, "Muon (momentum %g): losses and gradient norms of steps 0..%d against the reference's: worst "
          "relative error %.2e at step %d (loss %.6f vs %.6f, norm %.6f vs %.6f); tolerance %.1e (the reference's fp32 "
          "run within %.1e of its fp64 run)", t->ref.muon_momentum, t->ref.nsteps - 1, worst, at, losses[at],
          t->ref.losses[at], norms[at], t->ref.norms[at], tol, t->ref.fp64_dist);
}

// Steps 1 .. nsteps-1 (AdamW, the reference's schedule): each step's loss against the reference's (and a MoE
// reference's loads and final routing bias).
static void check_training(TestRun *t, Model *m, DataLoader *dl, float loss0) {
    float *losses = (float *)malloc_check(sizeof(float) * t->ref.nsteps), *norms = (float *)malloc_check(sizeof(float) * t->ref.nsteps);
    losses[0] = loss0;
    norms[0] = t->norm0;
    int split = check_moe_load(m, &t->rmoe, 0) ? 0 : -1;   // the step whose loads first differ: the runs separate
    for (int s = 1; s < t->ref.nsteps; s++) {
        gpt2_forward_backward(m, dl, t->accum);
        StepResult r = gpt2_update(m, &t->opt, lr_at(&t->sched, s), s);
        losses[s] = r.loss;
        norms[s] = r.norm;
        if (split < 0 && check_moe_load(m, &t->rmoe, s)) { split = s; }
    }
    if (split >= 0 && split + 1 < t->ref.nsteps && my_rank == 0) {
        printf("       MoE loads of steps %d..%d not compared: the runs separated at step %d (its loads differed)\n",
               split + 1, t->ref.nsteps - 1, split);
    }
    if (t->ref.muon) { check_muon_training(t, losses, norms); }
    else { check_losses(losses, t->ref.losses, t->ref.nsteps, 0, "(AdamW) against the reference's", measured_loss_tol(t)); }
    check_moe_bias(m, &t->rmoe, split < 0 ? 0 : t->ref.nsteps - split);
    free(losses); free(norms);
}

#include "test/resume.h"

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
    args->layout.T = t->ref.T;
    args->layout.total_batch = t->ref.R * t->ref.T;
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
    grid_init(&t->grid, args->layout.tp, args->layout.cp, args->layout.pp, args->layout.ep);
    t->accum = args->layout.total_batch / (args->layout.B * args->layout.T * t->grid.dp);
    if (my_rank == 0) {
        printf("test_gpt: %s | world %d = tp %d x cp %d x pp %d x dp %d | zero %d%s | B %d T %d accum %d | ce chunk %d | %s\n", ref_dir,
               t->world, t->grid.tp, t->grid.cp, t->grid.pp, t->grid.dp, args->layout.zero, args->layout.sp ? " | sp" : "", args->layout.B,
                   args->layout.T, t->accum,
               args->layout.ce_chunk, PRECISION_NAME);
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
    if (t->ref.muon != !strcmp(args->optimizer, "muon") && strcmp(args->optimizer, "adamw")) {
        fail("--optimizer %s: the reference %s trained with %s", args->optimizer, ref_dir, t->ref.muon ? "muon" : "adamw");
    }
    if (t->ref.muon) { args->optimizer = "muon"; args->muon_momentum = t->ref.muon_momentum; }   // (the reference's)
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

// --bad-file-on-rank: rank bad_rank reads a model file that does not exist while the others wait in a barrier (its
// failure must end them all); if no rank failed, rank 0 says so. Finalizes MPI; returns main's exit status (1).
static int check_bad_file_on_rank(int bad_rank) {
    if (my_rank == bad_rank) { ModelConfig c; read_model_file("/nonexistent/model.bin", &c); }
    MPI_Barrier(MPI_COMM_WORLD);
    if (my_rank == 0) { printf("--bad-file-on-rank %d: no rank failed?\n", bad_rank); }
    MPI_Finalize();
    return 1;
}

// The checks the flags ask for: the comm layer, the CPU fast paths, the gradient tolerances or the pipeline
// schedules alone, else the model against the reference (or a resume from a run's checkpoint).
static void run_checks(TestRun *t, const TestFlags *f, const ModelConfig *ref_config, const float *ref_params) {
    Args *args = &t->args;
    if (f->check_layer) {   // the comm layer alone, on the grid of --tp/--pp (any world size they divide)
        if (t->world % (args->layout.tp * args->layout.pp)) { fail_all(my_rank, "world %d is not divisible by tp*pp", t->world); }
        grid_init(&t->grid, args->layout.tp, 1, args->layout.pp, 1);
        check_comm_layer(&t->grid);
    } else if (f->check_attention) {   // the CPU attention (and MoE router, capacity) fast paths against their loops
        grid_init(&t->grid, 1, 1, 1, 1);
        check_attention();
#ifndef USE_CUDA
        check_moe_cpu();
#endif
    } else if (f->check_tolerance) {   // the bf16 gradient tolerances on the reference (host code, any rank)
        grid_init(&t->grid, 1, 1, 1, 1);
        check_tolerance(ref_config, t->ref.grads, t->ref.dterm, f->bf16_grads);
    } else if (f->check_schedules) {   // the pipeline schedules' message order (host logic, any rank)
        grid_init(&t->grid, 1, 1, 1, 1);
        if (my_rank == 0) { check_schedules(); }
    } else {
        test_setup(t, f->ref_dir, ref_config, ref_params);
        if (f->resume_from) { check_resume_from(t, f->resume_from, f->mutation); }
        else { check_model(t, f, ref_config, ref_params); }
    }
}

int main(int argc, char **argv) {
    backend_env_before_init();    // (CUDA: before any context exists)
    mpi_init(&argc, &argv);
    TestRun t;
    memset(&t, 0, sizeof(t));
    MPI_Comm_size(MPI_COMM_WORLD, &t.world);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    plan_model = gpt2_plan;
    plan_args = &t.args;
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
    t.ref.dterm = read_ref_dterm(f.ref_dir, t.ref.P);
    read_ref_moe(f.ref_dir, &t.rmoe);
    if (f.bad_rank >= 0) {
        // one rank meets a bad file while the others wait in a collective: all must exit, none hang
        return check_bad_file_on_rank(f.bad_rank);
    }
    Args *args = &t.args;
    default_args(args);
    args->layout.B = 1;
    parse_args(nrest, rest, args);
    args->sample_every = 0;   // (test_gpt does not sample: the MoE buffers are sized for the capacity)
    agree_on_args(args, my_rank, t.world);
    attention_path = attention_path_of(args->layout.attention);
    run_checks(&t, &f, &ref_config, ref_params);
    int counts[2] = {n_passed, n_failed};
    MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (my_rank == 0) { printf("%d passed, %d failed\n", counts[0], counts[1]); }
    mem_free_all();
    grid_free(&t.grid);
    MPI_Finalize();
    return counts[1] == 0 ? 0 : 1;
}
