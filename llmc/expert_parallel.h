// Expert parallelism (--ep N): a MoE layer's MLP over the ep group, in one place. moe.h has the layer's
// semantics (router, top-k, capacity per sequence, auxiliary losses) and their kernels, moe_dispatch.h the token
// shuffle's; this file runs them for one MoE layer and one micro-batch, every rank of the ep group at once.
// moe_forward reads as Megatron's verbs, one function each:
//   moe_route           1. router probabilities, top-k, the capacity keep masks per whole sequence (with cp, the
//                          sequence's other parts' assignments all-gathered over cp), the auxiliary losses' statistics
//   moe_dispatch_plan   2. one of two:
//      padded (a capacity: --capacity-factor > 0): every (source rank, expert) slot holds P = B cap rows, the
//        kept ones first, the rest zero (GShard's layout): the sizes are known in advance, so nothing is
//        counted on the host and the step has no host wait here;
//      counted (dropless, and sampling): count the kept rows per expert; all-gather the counts over the ep
//        group (host ints: a host wait) and check the whole (ep, E) table on every rank, so a bad count stops
//        every rank alike, never a hang.
//      Either way the rest reads one (ep, E) table of rows per (source rank, expert): P everywhere when padded.
//   moe_dispatch        3. permute: the kept rows of x, grouped by expert = by owner rank ("send layout");
//                       4. all-to-all(v): the rows to the ranks owning their experts; arriving grouped by source
//                          rank, they are regrouped by local expert (copies of contiguous segments)
//   moe_experts_apply   5. each local expert runs its MLP on its contiguous rows (with TP the experts are
//                          column/row-parallel like the dense MLP: partial outputs, fcproj's bias on tp rank 0)
//   moe_undispatch      6. the outputs back: regrouped by source, all-to-all(v) in reverse, into the send layout
//   moe_combine         7. with the gates, in the fixed order of each token's choices -> (BT, C), summed over tp
//                          by the caller like any row-parallel output
//   moe_shared_forward  8. the shared experts (--shared-experts S): one MLP of width S*H on every token,
//                          tensor-parallel like the dense MLP (its fcproj bias added on tp rank 0), added to it
// The backward (moe_backward) runs the same exchanges in reverse with the gradients, a function per verb. The gradient of the gates needs
// the full expert outputs: each tp rank has a partial sum, so dgate (BT, k floats) is all-reduced over
// tp. Then the router's backward runs identically on every tp rank: its weight gradient is complete on
// each (counted once, never summed over tp), and its input gradient is added on tp rank 0 only.
// ep rank r holds the El = E/ep experts [r El, (r+1) El); the dp/ep x cp ranks holding the same experts
// form the expert-data-parallel (edp) group, over which their gradients are summed (zero.h).
#ifndef LLMC_EXPERT_PARALLEL_H
#define LLMC_EXPERT_PARALLEL_H

#include "backend.h"
#include "alloc.h"
#include "comm.h"
#include "matmul.h"
#include "moe.h"
#include "moe_dispatch.h"
#include "swiglu.h"
#include "model_file.h"

// One MoE layer of one micro-batch, stored for the backward.
typedef struct {
    float *probs;       // (BT, E) router probabilities
    float *lse;         // (BT) router log-sum-exp (the z-loss)
    int *choice;        // (BT, k) the top-k experts
    float *gate;        // (BT, k)
    int *keep, *row;    // (BT, k) kept after capacity; the row in the send layout (-1: dropped)
    float *f;           // (B, E) top-k assignment fractions per sequence (the aux loss)
    floatX *xe;         // (Rr, C) the rows this rank's experts received, grouped by local expert
    floatX *h, *hg;     // (Rr, Hw), (Rr, Hl) their fc output, after GELU or SwiGLU (H: an expert's hidden width,
                        // Hl = H/tp; Hw = Hl, or SwiGLU's [gate | up] 2Hl)
    floatX *sh, *shg;   // (BT, SHw), (BT, SHl) the shared experts' (SHl = S*H/tp; S = 0: none)
    float *sgate;       // (BT) Qwen2-MoE: the shared experts' gate per token
    floatX *ys;         // (Rs, C) the expert outputs back, in the send layout
    int *counts;        // host (ep, E): rows each rank of the ep group keeps for each expert
} MoEActs;

// The MoE layers' shared state: the groups, the shapes, the dispatch buffers (worst case: Rs rows sent,
// Rr received) and the step's numbers. One per model; every MoE layer of the stage uses it in turn.
typedef struct {
    Group *tp, *cp, *ep;     // the gates' gradient (tp); the whole sequences (cp); the all-to-alls (ep)
    int tp_rank;             // (fcproj's bias is added once, on tp rank 0)
    int E, k, El, C, Cl;     // experts, top-k, experts per ep rank, channels, channels per tp rank
    int Hl, SHl;             // an expert's hidden width per tp rank (H/tp); the shared experts' (S*H/tp, 0: none)
    int swiglu, Hw, SHw;     // SwiGLU experts (Llama): their fc outputs [gate | up], 2Hl and 2SHl wide (GELU: Hl, SHl)
    int shared_gate;         // the shared experts' output scaled per token by a sigmoid gate (Qwen2-MoE)
    int B, T, BT;            // a micro-batch: sequences, the tokens of each this rank holds (cp: T/cp)
    MoEOptions opt;          // capacity factor, drop policy, auxiliary loss coefficients, bias rate
    int sigmoid;             // the router's scores: sigmoids (else softmax)
    int norm_topk;           // k > 1 gates renormalised to sum 1 (GPT-2's MoE, Mixtral), else the scores themselves
    int nlayers, layer;      // the stage's MoE layers; the one running now (numbered in the stage's order)
    int *layer_index;        // host (nlayers): each one's number among the model's MoE layers (its slice of the
                             // MoE tensors, of the routing bias, of the load lines)
    float *bias;             // device (nlayers, E): their routing bias (loss-free balancing; model state)
    int *load;               // device (nlayers, E): the step's top-k assignments per expert, before drops (this
                             // rank's tokens; the same on every tp rank)
    int *load_all;           // device (nlayers, E), --moe-bias-rate: load summed over the dp x cp ranks
    int cap;                 // assignments an expert keeps per whole sequence, now (sampling: dropless)
    int padded;              // the padded dispatch (a capacity), now (sampling: counted); P = B cap rows a slot
    size_t rows_send, rows_recv;   // Rs, Rr: rows of the dispatch buffers
    float aux_scale, z_scale;      // the auxiliary losses' seeds for this step (moe.h)
    int count_stats;         // add the forward's numbers to the step's (training, not validation)
    double assigned;         // the step's assignments made (a sum over this rank's layers)
    int *kept;               // device (nlayers): the step's assignments kept per MoE layer (this rank's tokens)
    double *sums;            // device (2): the step's aux and z sums over this rank's MoE layers and micro-batches
    int time_a2a;            // --comm-report: time the all-to-alls (the device synchronised around them)
    double a2a_seconds;      // this step's time in them
    // workspace, shared by the layers and micro-batches
    floatX *msend;           // (Rs, C) rows in the send layout: x, then the gradients
    floatX *mrecv;           // (Rr, C) rows as the all-to-all delivers them, grouped by source rank
    floatX *mexp;            // (Rr, C) rows grouped by local expert: the outputs, the gradients
    floatX *mdh;             // (Rr, Hw) the gradient of the experts' fc output
    floatX *sdh;             // (BT, SHw) the gradient of the shared experts' fc output
    floatX *mdact, *sdact;   // SwiGLU: (Rr, Hl), (BT, SHl) the gradients of the activations
    floatX *sdy;             // shared gate: (BT, C) the gradient of the shared experts' unscaled output
    float *sglogit;          // shared gate: (BT) the gradient of its logit
    floatX *sout;            // (BT, C) the shared experts' output (partial over tp), then their input's gradient
    float *dgate;            // (BT, k)
    float *dlogits;          // (BT, E)
    float *cprob;            // (BT, k) the probability of each assignment (top-k's values)
    int *choice_all;         // cp > 1: (cp, BT, k) the assignments of every part of the sequences (all-gathered)
    float *cprob_all;        // cp > 1: (cp, BT, k) their probabilities
    float *pmean, *zsum;     // (B, E), (B): aux and z statistics per sequence
    int *counts, *offsets;   // (E) kept rows per expert; their first rows in the send layout
    int *pad_offsets;        // (E) the padded send layout's first rows: e P
    // test hook (test_gpt): when route_log is set, each forward of micro-batch micro < route_log_micro logs
    // the routing of MoE layer `layer` (of the stage's nlayers) into entry micro * nlayers + layer:
    // choice (BT, k) ints, keep (BT, k) ints, probs (BT, E) floats
    int *route_log, route_log_micro, micro;
} ExpertParallel;

// Rows the dispatch buffers need at most: counted with a capacity of cap per sequence (count_cap), this rank
// sends each token to at most k experts and at most cap tokens of a sequence to one expert, and receives from
// each of the ep ranks at most min(k, El) rows per token and cap per local expert; padded (x->padded, at the
// capacity x->cap), E slots of P = B cap rows each way.
static void moe_dispatch_rows(ExpertParallel *x, int count_cap) {
    size_t B = x->B, T = x->T, k = x->k, E = x->E, El = x->El, kl = k < El ? k : El, cap = count_cap;
    x->rows_send = B * (T * k < E * cap ? T * k : E * cap);
    x->rows_recv = (size_t)x->ep->size * B * (T * kl < El * cap ? T * kl : El * cap);
    size_t padded = E * B * (size_t)x->cap;
    if (x->padded && padded > x->rows_send) { x->rows_send = padded; }
    if (x->padded && padded > x->rows_recv) { x->rows_recv = padded; }
}

// A micro-batch of B sequences of T tokens on this rank (cp ranks share each sequence): the capacity per whole
// sequence, the dispatch (a capacity: padded; sampling runs dropless, counted; a test hook counts always), and the
// dispatch buffers' rows (any: the stage has MoE layers; dropless: sized for dropless routing).
static void moe_set_batch(ExpertParallel *x, int B, int T, int cp, int any, int dropless) {
    x->B = B; x->T = T; x->BT = B * T;
    x->cap = x->E > 0 ? moe_capacity(x->k, T * cp, x->E, x->opt.cap1000) : 0;
    x->padded = x->opt.cap1000 > 0 && !test_hook_counted_dispatch();
    if (any) { moe_dispatch_rows(x, dropless ? T : x->cap); }
}

// --recompute mlp: the stored MoE layers (n of a slot) compute their experts' hidden rows in the scratch's one set.
static void moe_acts_share_hidden(MoEActs *stored, int n, const MoEActs *scratch) {
    for (int l = 0; l < n; l++) {
        stored[l].h = scratch->h; stored[l].hg = scratch->hg; stored[l].sh = scratch->sh; stored[l].shg = scratch->shg;
    }
}

// The workspace, for micro-batches of B sequences of T local tokens (the dispatch rows already set).
static void moe_work_alloc(ExpertParallel *x) {
    size_t BT = x->BT, C = x->C, Hl = x->Hl, SHl = x->SHl, E = x->E, k = x->k, Rs = x->rows_send, Rr = x->rows_recv,
        cp = x->cp->size;
    size_t X = floatx_bytes(), F = sizeof(float), I = sizeof(int);
    size_t a2a = x->ep->size > 1;   // (ep 1: no exchange, no exchange buffers: moe_forward)
    x->msend = (floatX *)mem_alloc(a2a * Rs * C * X, MEM_COMM);
    x->mrecv = (floatX *)mem_alloc(a2a * Rr * C * X, MEM_COMM);
    x->mexp = (floatX *)mem_alloc(Rr * C * X, MEM_WORKSPACE);
    x->mdh = (floatX *)mem_alloc(Rr * x->Hw * X, MEM_WORKSPACE);
    if (x->swiglu) { x->mdact = (floatX *)mem_alloc(Rr * Hl * X, MEM_WORKSPACE); }
    if (SHl > 0) {
        x->sdh = (floatX *)mem_alloc(BT * x->SHw * X, MEM_WORKSPACE);
        x->sout = (floatX *)mem_alloc(BT * C * X, MEM_WORKSPACE);
        if (x->swiglu) { x->sdact = (floatX *)mem_alloc(BT * SHl * X, MEM_WORKSPACE); }
    }
    if (x->shared_gate) {
        x->sdy = (floatX *)mem_alloc(BT * C * X, MEM_WORKSPACE);
        x->sglogit = (float *)mem_alloc(BT * F, MEM_WORKSPACE);
    }
    x->dgate = (float *)mem_alloc(BT * k * F, MEM_WORKSPACE);
    x->dlogits = (float *)mem_alloc(BT * E * F, MEM_WORKSPACE);
    x->cprob = (float *)mem_alloc(BT * k * F, MEM_WORKSPACE);
    if (cp > 1) {
        x->choice_all = (int *)mem_alloc(cp * BT * k * I, MEM_WORKSPACE);
        x->cprob_all = (float *)mem_alloc(cp * BT * k * F, MEM_WORKSPACE);
    }
    x->pmean = (float *)mem_alloc((size_t)x->B * E * F, MEM_WORKSPACE);
    x->load = (int *)mem_alloc((size_t)x->nlayers * E * I, MEM_WORKSPACE);
    if (x->opt.bias_rate > 0.0f) { x->load_all = (int *)mem_alloc((size_t)x->nlayers * E * I, MEM_WORKSPACE); }
    x->kept = (int *)mem_alloc((size_t)x->nlayers * I, MEM_WORKSPACE);
    if (x->padded) {   // the padded layout's first rows, e P: fixed, uploaded once (not when planning)
        x->pad_offsets = (int *)mem_alloc(E * I, MEM_WORKSPACE);
        int off[MOE_MAX_EXPERTS];
        for (size_t e = 0; e < E; e++) { off[e] = (int)(e * x->B * x->cap); }
        if (!mem_planning) { copy_to_device(x->pad_offsets, off, E * I); mem_keep(x->pad_offsets); }
    }
    x->zsum = (float *)mem_alloc((size_t)x->B * F, MEM_WORKSPACE);
    x->sums = (double *)mem_alloc(2 * sizeof(double), MEM_WORKSPACE);
    x->counts = (int *)mem_alloc(E * I, MEM_WORKSPACE);
    x->offsets = (int *)mem_alloc(E * I, MEM_WORKSPACE);
}

// One layer's stored tensors: the routing and the dispatched rows (routing), and the experts' fc and
// GELU outputs, the shared experts' too (hidden).
static void moe_acts_alloc(MoEActs *ma, const ExpertParallel *x, int routing, int hidden) {
    size_t BT = x->BT, C = x->C, Hl = x->Hl, SHl = x->SHl, E = x->E, k = x->k, Rs = x->rows_send, Rr = x->rows_recv;
    size_t X = floatx_bytes(), F = sizeof(float), I = sizeof(int);
    if (routing) {
        ma->probs = (float *)mem_alloc(BT * E * F, MEM_ACTIVATIONS);
        ma->lse = (float *)mem_alloc(BT * F, MEM_ACTIVATIONS);
        ma->choice = (int *)mem_alloc(BT * k * I, MEM_ACTIVATIONS);
        ma->gate = (float *)mem_alloc(BT * k * F, MEM_ACTIVATIONS);
        ma->keep = (int *)mem_alloc(BT * k * I, MEM_ACTIVATIONS);
        ma->row = (int *)mem_alloc(BT * k * I, MEM_ACTIVATIONS);
        ma->f = (float *)mem_alloc((size_t)x->B * E * F, MEM_ACTIVATIONS);
        ma->xe = (floatX *)mem_alloc(Rr * C * X, MEM_ACTIVATIONS);
        ma->ys = (floatX *)mem_alloc(Rs * C * X, MEM_ACTIVATIONS);
        ma->counts = (int *)malloc_check((size_t)x->ep->size * E * I);
        if (x->shared_gate) { ma->sgate = (float *)mem_alloc(BT * F, MEM_ACTIVATIONS); }
    }
    if (hidden) {
        ma->h = (floatX *)mem_alloc(Rr * x->Hw * X, MEM_ACTIVATIONS);
        ma->hg = (floatX *)mem_alloc(Rr * Hl * X, MEM_ACTIVATIONS);
        if (SHl > 0) {
            ma->sh = (floatX *)mem_alloc(BT * x->SHw * X, MEM_ACTIVATIONS);
            ma->shg = (floatX *)mem_alloc(BT * SHl * X, MEM_ACTIVATIONS);
        }
    }
}

// The step's numbers start at zero, with this step's auxiliary-loss seeds.
static void moe_step_begin(ExpertParallel *x, float aux_scale, float z_scale) {
    x->aux_scale = aux_scale;
    x->z_scale = z_scale;
    x->assigned = 0.0;
    if (x->sums) { memset_zero_device(x->sums, 2 * sizeof(double)); }
    if (x->load) { memset_zero_device(x->load, (size_t)x->nlayers * x->E * sizeof(int)); }
    if (x->kept) { memset_zero_device(x->kept, (size_t)x->nlayers * sizeof(int)); }
    x->count_stats = 1;
}

// Loss-free balancing, after the step's optimizer update (moe.h): the loads summed over the ranks that share
// the step's tokens (dp x cp: group), then each layer's bias moved, on the device, unless the update was
// skipped (scale: the step's clip scale, 0 then). Every rank of the group ends with the same bias.
static void moe_balance_bias(ExpertParallel *x, Group *group, const float *scale) {
    if (x->opt.bias_rate <= 0.0f || x->nlayers == 0) { return; }
    size_t n = (size_t)x->nlayers * x->E;
    copy_on_device(x->load_all, x->load, n * sizeof(int));
    comm_all_reduce(group, x->load_all, n, DT_INT, NULL);
    moe_bias_update(x->bias, x->load_all, x->nlayers, x->E, x->opt.bias_rate, scale);
}

// Step 2's check of the (ep, E) table of kept rows (identical on every rank of the ep group, so every
// rank decides alike): each rank's counts must fit the buffers (a bad count would overrun them).
static void moe_check_counts(const ExpertParallel *x, const int *counts) {
    int ep = x->ep->size, E = x->E, El = x->El;
    for (int s = 0; s < ep; s++) {
        size_t sent = 0;
        for (int e = 0; e < E; e++) {
            int n = counts[s * E + e];
            if (n < 0 || n > x->B * x->cap) {
                fail("MoE dispatch: ep rank %d reports %d rows for expert %d (at most %d)", s, n, e, x->B * x->cap);
            }
            sent += n;
        }
        if (sent > x->rows_send) {
            fail("MoE dispatch: ep rank %d sends %zu rows, its buffer holds %zu", s, sent, x->rows_send);
        }
    }
    for (int r = 0; r < ep; r++) {
        size_t got = 0;
        for (int s = 0; s < ep; s++) { for (int le = 0; le < El; le++) { got += counts[s * E + r * El + le]; } }
        if (got > x->rows_recv) {
            fail("MoE dispatch: ep rank %d receives %zu rows, its buffer holds %zu", r, got, x->rows_recv);
        }
    }
}

// Steps 4 and 6: all-to-all(v) over the ep group, in rows of C: to_experts = 1 sends the rows of the send
// layout to the ranks owning their experts, where they arrive grouped by source rank; 0 sends them back.
static void moe_all_to_all(ExpertParallel *x, const int *counts, const floatX *send, floatX *recv, int to_experts) {
    Group *g = x->ep;
    int ep = g->size, me = g->rank, E = x->E, El = x->El;
    size_t C = x->C;
    size_t *buf = (size_t *)malloc_check(sizeof(size_t) * 4 * ep), *to = buf, *to_off = buf + ep, *from = buf + 2 * ep,
        *from_off = buf + 3 * ep;
    size_t a = 0, b = 0;
    for (int r = 0; r < ep; r++) {
        to[r] = from[r] = 0;
        for (int le = 0; le < El; le++) {
            to[r] += counts[me * E + r * El + le];
            from[r] += counts[r * E + me * El + le];
        }
        to[r] *= C; from[r] *= C;
        to_off[r] = a; from_off[r] = b;
        a += to[r]; b += from[r];
    }
    double t0 = 0.0;
    if (x->time_a2a) { device_synchronize(); t0 = monotonic_seconds(); }
    if (to_experts) { comm_all_to_allv(g, send, to, to_off, recv, from, from_off, DT_FLOATX); }
    else { comm_all_to_allv(g, send, from, from_off, recv, to, to_off, DT_FLOATX); }
    if (x->time_a2a) { device_synchronize(); x->a2a_seconds += monotonic_seconds() - t0; }
    free(buf);
}

// The rows received from the ep ranks (grouped by source, then local expert) regrouped by local
// expert (then source), so each expert's rows are contiguous (to_experts = 1), or back (0).
static void moe_regroup(const ExpertParallel *x, const int *counts, const floatX *src, floatX *dst, int to_experts) {
    int ep = x->ep->size, me = x->ep->rank, E = x->E, El = x->El;
    size_t C = x->C, by_source = 0;
    for (int s = 0; s < ep; s++) {
        for (int le = 0; le < El; le++) {
            size_t n = counts[s * E + me * El + le], by_expert = 0;
            for (int l2 = 0; l2 < le; l2++) { for (int s2 = 0; s2 < ep; s2++) { by_expert += counts[s2 * E + me * El + l2]; } }
            for (int s2 = 0; s2 < s; s2++) { by_expert += counts[s2 * E + me * El + le]; }
            size_t from = to_experts ? by_source : by_expert, to = to_experts ? by_expert : by_source;
            if (n) { copy_on_device(dst + to * C, src + from * C, n * C * sizeof(floatX)); }
            by_source += n;
        }
    }
}

// Rows each local expert runs, and where its rows start (grouped by local expert).
static size_t moe_expert_rows(const ExpertParallel *x, const int *counts, int le, size_t *start) {
    int ep = x->ep->size, me = x->ep->rank, E = x->E, El = x->El;
    size_t n = 0;
    *start = 0;
    for (int l2 = 0; l2 <= le; l2++) {
        for (int s = 0; s < ep; s++) { size_t c = counts[s * E + me * El + l2]; if (l2 < le) { *start += c; } else { n += c; } }
    }
    return n;
}

// The layer's experts (local, tp-sliced; as the model stores them), its router and its shared experts
// (tp-sliced; NULL without).
// The parameters (ExpertWeights) or their gradients (ExpertGrads): one layout, made by expert_tensors.
typedef struct {
    floatX *fcw, *fcb, *fcprojw, *fcprojb, *router, *sfcw, *sfcb, *sfcprojw, *sfcprojb, *sgate;
} ExpertTensors;
typedef ExpertTensors ExpertWeights;
typedef ExpertTensors ExpertGrads;

// A MoE layer's tensors from the pointers of its two units (model_file.h's ids): the layer's (router, shared
// experts) and its experts'.
static ExpertTensors expert_tensors(floatX *const *layer, floatX *const *experts) {
    ExpertTensors t = {experts[T_EFCW], experts[T_EFCB], experts[T_EFCPROJW], experts[T_EFCPROJB], layer[T_ROUTERW],
                       layer[T_SFCW], layer[T_SFCB], layer[T_SFCPROJW], layer[T_SFCPROJB], layer[T_SGATEW]};
    return t;
}

// ---- 5. the local experts of the counted dispatch (dropless): their rows grouped by expert, each expert's on its own
// weights. The loop over the experts is the specification (the CPU's path); CUDA runs each projection of SwiGLU
// experts (no biases) as one grouped GEMM over the experts with rows (matmul_forward_grouped: cuBLAS 12.5 on).

// rows (El) of each local expert (host, from the dispatch's counts); their sum
static size_t moe_expert_row_counts(const ExpertParallel *x, const int *counts, int *rows) {
    size_t R = 0, r0;
    for (int le = 0; le < x->El; le++) { rows[le] = (int)moe_expert_rows(x, counts, le, &r0); R += (size_t)rows[le]; }
    return R;
}

// xe -> h, hg (the fc and activation outputs) -> mexp (the rows' outputs), expert by expert
static void moe_experts_forward_loop(ExpertParallel *x, MoEActs *ma, ExpertWeights w, floatX *out) {
    int C = x->C, Hl = x->Hl, Hw = x->Hw;
#ifndef USE_CUDA
    // (CPU: the local experts side by side, each on one thread, its GEMMs single-threaded inside: one parallel
    // region for all of them, where each expert's small GEMMs would each split over every thread)
    #pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int le = 0; le < x->El; le++) {
        size_t r0, n = moe_expert_rows(x, ma->counts, le, &r0);
        if (n == 0) { continue; }
        const floatX *b2 = x->tp_rank == 0 && w.fcprojb ? w.fcprojb + (size_t)le * C : NULL;   // added once over tp
        mlp_fc_forward(x->swiglu, ma->hg + r0 * Hl, ma->h + r0 * Hw, ma->xe + r0 * C, w.fcw + (size_t)le * Hw * C,
                       w.fcb ? w.fcb + (size_t)le * Hl : NULL, (int)n, C, Hl);
        matmul_forward(out + r0 * C, ma->hg + r0 * Hl, w.fcprojw + (size_t)le * C * Hl, b2, (int)n, Hl, C);
    }
}

#ifdef MATMUL_GROUPED
// the grouped GEMMs' case: SwiGLU experts, no biases (GELU experts keep their fused epilogues in the loop)
static int moe_experts_grouped(const ExpertParallel *x, ExpertTensors w) {
    return matmul_grouped_enabled && x->swiglu && w.fcb == NULL && w.fcprojb == NULL;
}

// SwiGLU's fc rows of every expert (h: (R, 2Hl) [gate | up]; hg: (R, Hl)), one grouped GEMM
static void moe_experts_fc_grouped(ExpertParallel *x, MoEActs *ma, ExpertWeights w, const int *rows, size_t R) {
    matmul_forward_grouped(ma->h, ma->xe, w.fcw, rows, x->C, x->Hw, x->El);
    swiglu_forward(ma->hg, ma->h, (int)R, x->Hl);
}
#endif

// the launcher: the grouped GEMMs where they apply, else the loop; out (rows grouped by local expert, C)
static void moe_experts_forward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, floatX *out) {
#ifdef MATMUL_GROUPED
    if (moe_experts_grouped(x, w)) {
        int rows[MOE_MAX_EXPERTS];
        size_t R = moe_expert_row_counts(x, ma->counts, rows);
        moe_experts_fc_grouped(x, ma, w, rows, R);
        matmul_forward_grouped(out, ma->hg, w.fcprojw, rows, x->Hl, x->C, x->El);
        return;
    }
#endif
    moe_experts_forward_loop(x, ma, w, out);
}

// 1. route: the router's scores, the top k, the capacity per sequence, the statistics of the auxiliary losses.
// Capacity and f count per whole sequence: with cp its other parts are on the other cp ranks (a capacity needs
// their assignments: all-gathered; f is a sum: all-reduced; P and z stay partial sums).
static void moe_route(ExpertParallel *x, MoEActs *ma, ExpertWeights w, const floatX *in, int record) {
    int B = x->B, T = x->T, BT = x->BT, C = x->C, E = x->E, k = x->k;
    moe_router_forward(ma->probs, ma->lse, in, w.router, BT, C, E, x->sigmoid);
    moe_topk(ma->choice, x->cprob, ma->gate, ma->probs, x->bias + (size_t)x->layer * E, BT, E, k, x->norm_topk);
    if (x->count_stats && record) { moe_load_count(x->load + (size_t)x->layer * E, ma->choice, BT, k); }
    Group *cpg = x->cp;
    int cp = cpg->size, Tg = T * cp;
    if (cp > 1 && x->cap < Tg) {
        comm_all_gather(cpg, ma->choice, x->choice_all, (size_t)BT * k, DT_INT, NULL);
        comm_all_gather(cpg, x->cprob, x->cprob_all, (size_t)BT * k, DT_FLOAT, NULL);
        moe_capacity_keep(ma->keep, x->choice_all, x->cprob_all, cp, cpg->rank, B, T, k, x->E, x->cap, x->opt.policy);
    } else {   // (dropless: every assignment kept, whatever the positions)
        moe_capacity_keep(ma->keep, ma->choice, x->cprob, 1, 0, B, T, k, x->E, x->cap, x->opt.policy);
    }
    moe_sequence_stats(ma->f, x->pmean, x->zsum, ma->choice, ma->probs, ma->lse, B, T, E, k, Tg, x->sigmoid);
    comm_all_reduce(cpg, ma->f, (size_t)B * E, DT_FLOAT, NULL);
}

// 2. the dispatch plan: each kept row's place in the send layout, and the (ep, E) table of rows
static void moe_dispatch_plan(ExpertParallel *x, MoEActs *ma, int record) {
    int BT = x->BT, E = x->E, k = x->k;
    moe_count(x->counts, ma->choice, ma->keep, BT, E, k);
    if (x->count_stats && record) { moe_kept_add(x->kept + x->layer, x->counts, E); }
    size_t P = (size_t)x->B * x->cap;
    if (x->padded) {   // P rows per slot, the kept ones first: known on the host without asking the device
        for (int i = 0; i < x->ep->size * E; i++) { ma->counts[i] = (int)P; }
        moe_rows(ma->row, ma->choice, ma->keep, x->pad_offsets, BT, E, k, (int)P);
    } else {           // counted, exchanged over the ep group and checked
        int mine[MOE_MAX_EXPERTS], offsets[MOE_MAX_EXPERTS];
        copy_to_host(mine, x->counts, E * sizeof(int));
        comm_host_all_gather(x->ep, mine, E, ma->counts, DT_INT, "all-gather of the MoE dispatch counts");
        moe_check_counts(x, ma->counts);
        for (int e = 0, o = 0; e < E; e++) { offsets[e] = o; o += mine[e]; }
        copy_to_device(x->offsets, offsets, E * sizeof(int));
        moe_rows(ma->row, ma->choice, ma->keep, x->offsets, BT, E, k, BT * k);
    }
}

// 3-4. dispatch: in's kept rows permuted into the send layout, then sent to their experts' ep ranks -> ma->xe, rows
// grouped by local expert (ep 1: the send layout is the experts' layout, the exchange an identity: straight to xe)
static void moe_dispatch(ExpertParallel *x, MoEActs *ma, const floatX *in) {
    int a2a = x->ep->size > 1, C = x->C;
    floatX *send = a2a ? x->msend : ma->xe;
    if (x->padded) { memset_zero_device(send, (size_t)x->E * x->B * x->cap * C * sizeof(floatX)); }   // (padding: 0)
    moe_permute(send, in, ma->row, x->BT, x->k, C);
    if (a2a) {
        moe_all_to_all(x, ma->counts, x->msend, x->mrecv, 1);
        moe_regroup(x, ma->counts, x->mrecv, ma->xe, 1);
    }
}

// 5. the local experts: ma->xe -> yexp, rows grouped by local expert
static void moe_experts_apply(ExpertParallel *x, MoEActs *ma, ExpertWeights w, floatX *yexp) {
    int C = x->C, Hl = x->Hl, El = x->El;
    if (x->padded) {   // every local expert has the same rows: one strided-batched GEMM per projection
        size_t r0, n = moe_expert_rows(x, ma->counts, 0, &r0);
        mlp_fc_forward_batched(x->swiglu, ma->hg, ma->h, ma->xe, w.fcw, w.fcb, (int)n, C, Hl, El);
        matmul_forward_batched(yexp, ma->hg, w.fcprojw, x->tp_rank == 0 ? w.fcprojb : NULL, (int)n, Hl, C, El);
    } else {
        moe_experts_forward(x, ma, w, yexp);
    }
}

// 6. back: the experts' outputs (mexp) to their tokens' ep ranks, in the send layout -> ma->ys (ep 1: already there)
static void moe_undispatch(ExpertParallel *x, MoEActs *ma) {
    if (x->ep->size == 1) { return; }
    moe_regroup(x, ma->counts, x->mexp, x->mrecv, 0);
    moe_all_to_all(x, ma->counts, x->mrecv, ma->ys, 0);
}

// 8. the shared experts, on every token, added to out (Qwen2-MoE: scaled per token by their sigmoid gate)
static void moe_shared_forward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, const floatX *in, floatX *out) {
    if (x->SHl == 0) { return; }
    int BT = x->BT, C = x->C;
    mlp_fc_forward(x->swiglu, ma->shg, ma->sh, in, w.sfcw, w.sfcb, BT, C, x->SHl);
    matmul_forward(x->sout, ma->shg, w.sfcprojw, x->tp_rank == 0 ? w.sfcprojb : NULL, BT, x->SHl, C);
    if (x->shared_gate) { moe_shared_gate_forward(ma->sgate, x->sout, in, w.sgate, BT, C); }
    accumulate(out, x->sout, (size_t)BT * C);
}

// The layer's records of a micro-batch that counts: the routing (a test hook's log), aux and z (on the device), the
// assignments
static void moe_record(ExpertParallel *x, MoEActs *ma) {
    int BT = x->BT, E = x->E, k = x->k;
    if (x->route_log && x->micro < x->route_log_micro) {
        int *log = x->route_log + ((size_t)x->micro * x->nlayers + x->layer) * BT * (2 * k + E);
        copy_to_host(log, ma->choice, (size_t)BT * k * sizeof(int));
        copy_to_host(log + (size_t)BT * k, ma->keep, (size_t)BT * k * sizeof(int));
        copy_to_host(log + (size_t)BT * 2 * k, ma->probs, (size_t)BT * E * sizeof(float));   // (bits of floats)
    }
    if (x->count_stats) {
        moe_loss_sums(x->sums, ma->f, x->pmean, x->zsum, x->B, E);
        x->assigned += (double)BT * k;
    }
}

// x (BT, C): the ln2 output of all tokens (the same on every tp rank) -> out (BT, C), a partial sum over
// tp. record: count the step's numbers and log the routing (not when the forward is a recomputation).
static void moe_forward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, const floatX *in, floatX *out, int record) {
    moe_route(x, ma, w, in, record);
    moe_dispatch_plan(x, ma, record);
    moe_dispatch(x, ma, in);
    moe_experts_apply(x, ma, w, x->ep->size > 1 ? x->mexp : ma->ys);
    moe_undispatch(x, ma);
    moe_combine(out, ma->ys, ma->gate, ma->row, x->BT, x->k, x->C);   // 7. out = the kept rows times their gates
    moe_shared_forward(x, ma, w, in, out);
    if (record) { moe_record(x, ma); }
}

// ZB (--pp-schedule zb): what a MoE layer's W pass (moe_backward_weights) needs, kept by its B (moe_backward
// with d set), which computes the input gradients only. The rows' activations it reads (xe, hg, shg) are ma's;
// a recomputation's (--recompute) the caller points ma at buffers of the pending W's own.
typedef struct {
    floatX *dy;            // (BT, C) the gradient of the layer's output, all tokens (the shared experts' fcproj)
    floatX *sdh;           // (BT, SHl) of the shared experts' fc output
    floatX *dye, *dh;      // (Rr, C), (Rr, Hl) of the experts' outputs and fc outputs, rows grouped by local expert
    float *dlogits;        // (BT, E) of the router's logits
    float *dsgate;         // (BT) of the shared experts' gate's logit (Qwen2-MoE)
    int *counts;           // host (ep, E): the dispatch's rows, as B had them
} MoEWGrads;

// 5.'s backward (the counted dispatch): mexp (the rows' output gradients) -> mdh (fc outputs') -> mexp := the rows'
// input gradients; g's fcprojw, fcprojb, fcw, fcb += theirs (weights 0: ZB's B, g not touched). recompute_mlp: h
// and hg again first. Expert by expert (the specification)
static void moe_experts_backward_loop(ExpertParallel *x, MoEActs *ma, ExpertWeights w, ExpertGrads g, floatX *mdh,
                                      int recompute_mlp, int weights) {
    int C = x->C, Hl = x->Hl, Hw = x->Hw;
#ifndef USE_CUDA
    #pragma omp parallel for schedule(dynamic, 1)   // (as in the forward: the experts side by side)
#endif
    for (int le = 0; le < x->El; le++) {
        size_t r0, n = moe_expert_rows(x, ma->counts, le, &r0);
        if (n == 0) { continue; }
        floatX *dye = x->mexp + r0 * C, *dh = mdh + r0 * Hw;
        const floatX *fcw = w.fcw + (size_t)le * Hw * C, *fcb = w.fcb ? w.fcb + (size_t)le * Hl : NULL;
        if (recompute_mlp) {   // the rows' fc and activation outputs again, from their stored input
            mlp_fc_forward(x->swiglu, ma->hg + r0 * Hl, ma->h + r0 * Hw, ma->xe + r0 * C, fcw, fcb, (int)n, C, Hl);
        }
        mlp_proj_backward(x->swiglu, dh, !weights ? NULL : g.fcprojw + (size_t)le * C * Hl, dye, ma->hg + r0 * Hl,
                          w.fcprojw + (size_t)le * C * Hl, ma->h + r0 * Hw, x->mdact + r0 * Hl, (int)n, Hl, C);
        if (weights && g.fcprojb) { bias_backward(g.fcprojb + (size_t)le * C, dye, (int)n, C); }   // (complete on each tp rank)
        floatX *dfcw = weights ? g.fcw + (size_t)le * Hw * C : NULL, *dfcb = weights && g.fcb ? g.fcb + (size_t)le * Hl : NULL;
        matmul_backward(dye, dfcw, dfcb, dh, ma->xe + r0 * C, fcw, (int)n, C, Hw);   // dye := the rows' dx
    }
}

// the launcher (as moe_experts_forward's): the grouped GEMMs' products are the loop's, in the same order
static void moe_experts_backward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, ExpertGrads g, floatX *mdh,
                                 int recompute_mlp, int weights) {
#ifdef MATMUL_GROUPED
    if (moe_experts_grouped(x, w)) {
        int rows[MOE_MAX_EXPERTS], C = x->C, Hl = x->Hl, Hw = x->Hw, El = x->El;
        size_t R = moe_expert_row_counts(x, ma->counts, rows);
        if (recompute_mlp) { moe_experts_fc_grouped(x, ma, w, rows, R); }
        matmul_backward_grouped(x->mdact, weights ? g.fcprojw : NULL, x->mexp, ma->hg, w.fcprojw, rows, Hl, C, El);
        swiglu_backward(mdh, x->mdact, ma->h, (int)R, Hl);
        matmul_backward_grouped(x->mexp, weights ? g.fcw : NULL, mdh, ma->xe, w.fcw, rows, C, Hw, El);   // := dx
        return;
    }
#endif
    moe_experts_backward_loop(x, ma, w, g, mdh, recompute_mlp, weights);
}

// ZB's W pass of 5.: g's fcprojw, fcprojb, fcw, fcb += the products moe_experts_backward skipped, from what B kept
static void moe_experts_dweight(ExpertParallel *x, const MoEActs *ma, const MoEWGrads *d, ExpertGrads g) {
    int C = x->C, Hl = x->Hl, Hw = x->Hw, El = x->El;
#ifdef MATMUL_GROUPED
    if (moe_experts_grouped(x, g)) {   // (the gradients have the weights' layout: no biases either)
        int rows[MOE_MAX_EXPERTS];
        moe_expert_row_counts(x, d->counts, rows);
        matmul_backward_grouped(NULL, g.fcprojw, d->dye, ma->hg, NULL, rows, Hl, C, El);
        matmul_backward_grouped(NULL, g.fcw, d->dh, ma->xe, NULL, rows, C, Hw, El);
        return;
    }
#endif
#ifndef USE_CUDA
    #pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int le = 0; le < El; le++) {
        size_t r0, n = moe_expert_rows(x, d->counts, le, &r0);
        if (n == 0) { continue; }
        const floatX *dye = d->dye + r0 * C, *dh = d->dh + r0 * Hw;
        matmul_backward(NULL, g.fcprojw + (size_t)le * C * Hl, NULL, dye, ma->hg + r0 * Hl, NULL, (int)n, Hl, C);
        if (g.fcprojb) { bias_backward(g.fcprojb + (size_t)le * C, dye, (int)n, C); }
        matmul_backward(NULL, g.fcw + (size_t)le * Hw * C, g.fcb ? g.fcb + (size_t)le * Hl : NULL, dh,
                        ma->xe + r0 * C, NULL, (int)n, C, Hw);
    }
}

// 8.'s backward, first (dy may share its buffer with dx: read it before dx is written); the shared experts' input
// gradient waits in sout. ZB (d): their output's gradient (and the gate's) kept for W, g not touched.
static void moe_shared_backward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, ExpertGrads g, const floatX *in,
                                const floatX *dy, int recompute_mlp, const MoEWGrads *d) {
    if (x->SHl == 0) { return; }
    int BT = x->BT, C = x->C;
    if (recompute_mlp) { mlp_fc_forward(x->swiglu, ma->shg, ma->sh, in, w.sfcw, w.sfcb, BT, C, x->SHl); }
    const floatX *ds = dy;   // the gradient of the shared experts' output
    if (x->shared_gate) {    // (their output again, unscaled: the gate's gradient; summed over tp as the parts)
        matmul_forward(x->sout, ma->shg, w.sfcprojw, NULL, BT, x->SHl, C);
        moe_shared_gate_backward(x->sglogit, x->sdy, dy, x->sout, ma->sgate, BT, C);
        comm_all_reduce(x->tp, x->sglogit, BT, DT_FLOAT, NULL);
        ds = x->sdy;
    }
    if (d) {
        copy_on_device(d->dy, ds, (size_t)BT * C * sizeof(floatX));
        if (x->shared_gate) { copy_on_device(d->dsgate, x->sglogit, BT * sizeof(float)); }
    } else {
        bias_backward(g.sfcprojb, ds, BT, C);   // complete on every tp rank (as the experts' fcproj bias)
        if (x->shared_gate) { moe_router_dweight(g.sgate, x->sglogit, in, BT, C, 1); }   // (complete on each)
    }
    floatX *sdh = d ? d->sdh : x->sdh;
    mlp_proj_backward(x->swiglu, sdh, g.sfcprojw, ds, ma->shg, w.sfcprojw, ma->sh, x->sdact, BT, x->SHl, C);
    matmul_backward(x->sout, g.sfcw, g.sfcb, sdh, in, w.sfcw, BT, C, x->SHw);
}

// 7.'s backward: the gradient of each kept row in the send layout (padded: the padding rows' zero) and of the gates
// (all-reduced over tp: the expert outputs are partial sums over tp); 6.'s: the rows to their experts (mexp, grouped
// by local expert; ep 1: the exchanges are identities, as in the forward: in mexp throughout). Returns the send
// layout's buffer, which 4-3.'s backward fills again.
static floatX *moe_combine_backward_to_experts(ExpertParallel *x, MoEActs *ma, const floatX *dy) {
    int BT = x->BT, C = x->C, k = x->k, a2a = x->ep->size > 1;
    floatX *send = a2a ? x->msend : x->mexp;
    if (x->padded) { memset_zero_device(send, (size_t)x->E * x->B * x->cap * C * sizeof(floatX)); }
    moe_combine_backward(send, x->dgate, dy, ma->ys, ma->gate, ma->row, BT, k, C);
    comm_all_reduce(x->tp, x->dgate, (size_t)BT * k, DT_FLOAT, NULL);
    if (a2a) {
        moe_all_to_all(x, ma->counts, x->msend, x->mrecv, 1);
        moe_regroup(x, ma->counts, x->mrecv, x->mexp, 1);
    }
    return send;
}

// 5.'s backward: mexp (the rows' output gradients) := the rows' input gradients; g's experts += theirs (ZB, d: what W
// needs kept in d instead, g not touched)
static void moe_experts_apply_backward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, ExpertGrads g,
                                       int recompute_mlp, const MoEWGrads *d) {
    int C = x->C, Hl = x->Hl, Hw = x->Hw, El = x->El;
    size_t rows = 0, r0;
    for (int le = 0; le < El; le++) { rows += moe_expert_rows(x, ma->counts, le, &r0); }
    if (d) {   // (the rows' output gradients: mexp becomes their input's gradient below)
        copy_on_device(d->dye, x->mexp, rows * C * sizeof(floatX));
        memcpy(d->counts, ma->counts, (size_t)x->ep->size * x->E * sizeof(int));
    }
    floatX *mdh = d ? d->dh : x->mdh;
    if (x->padded) {   // (as in the forward: one strided-batched GEMM per product)
        size_t n = moe_expert_rows(x, ma->counts, 0, &r0);
        if (recompute_mlp) { mlp_fc_forward_batched(x->swiglu, ma->hg, ma->h, ma->xe, w.fcw, w.fcb, (int)n, C, Hl, El); }
        mlp_proj_backward_batched(x->swiglu, mdh, g.fcprojw, x->mexp, ma->hg, w.fcprojw, ma->h, x->mdact, (int)n, Hl, C,
                                  El);
        for (int le = 0; le < El && !d && g.fcprojb; le++) {   // complete on every tp rank
            bias_backward(g.fcprojb + (size_t)le * C, x->mexp + (size_t)le * n * C, (int)n, C);
        }
        matmul_backward_batched(x->mexp, g.fcw, g.fcb, mdh, ma->xe, w.fcw, (int)n, C, Hw, El);   // := the rows' dx
    } else {
        moe_experts_backward(x, ma, w, g, mdh, recompute_mlp, d == NULL);
    }
}

// 4-3.'s backward: the rows' input gradients back to their tokens' ep ranks (send layout), summed per token -> dx
static void moe_dispatch_backward(ExpertParallel *x, MoEActs *ma, floatX *send, floatX *dx) {
    if (x->ep->size > 1) {
        moe_regroup(x, ma->counts, x->mexp, x->mrecv, 0);
        moe_all_to_all(x, ma->counts, x->mrecv, x->msend, 0);
    }
    moe_unpermute(dx, send, ma->row, x->BT, x->k, x->C);
}

// 1.'s backward: the router, identical on every tp rank (complete gates' gradient); its input gradient added once
static void moe_route_backward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, ExpertGrads g, const floatX *in,
                               floatX *dx, const MoEWGrads *d) {
    int BT = x->BT, C = x->C, E = x->E;
    moe_router_backward(x->dlogits, x->dgate, ma->gate, ma->choice, ma->probs, ma->lse, ma->f, x->T, BT, E, x->k,
                        x->aux_scale, x->z_scale, x->sigmoid, x->norm_topk);
    if (d) { copy_on_device(d->dlogits, x->dlogits, (size_t)BT * E * sizeof(float)); }
    else { moe_router_dweight(g.router, x->dlogits, in, BT, C, E); }
    if (x->tp_rank == 0) { moe_router_dinput(dx, x->dlogits, w.router, BT, C, E); }
}

// The backward of moe_forward. dy (BT, C): the gradient of out on every tp rank (all tokens; its buffer may be
// dx's) -> dx (BT, C), the gradient of in, a partial sum over tp (written); g: the experts' gradients and the router's (+=).
// recompute_mlp: the experts' (and shared experts') fc and GELU outputs are not stored (--recompute mlp):
// computed again here. ZB (d not NULL): B only (g not touched); what W needs is kept in d.
static void moe_backward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, ExpertGrads g, const floatX *in,
                         const floatX *dy, floatX *dx, int recompute_mlp, const MoEWGrads *d) {
    int BT = x->BT, C = x->C;
    moe_shared_backward(x, ma, w, g, in, dy, recompute_mlp, d);
    floatX *send = moe_combine_backward_to_experts(x, ma, dy);
    moe_experts_apply_backward(x, ma, w, g, recompute_mlp, d);
    moe_dispatch_backward(x, ma, send, dx);
    if (x->SHl > 0) { accumulate(dx, x->sout, (size_t)BT * C); }   // (8.'s input gradient)
    if (x->shared_gate && x->tp_rank == 0) { moe_router_dinput(dx, x->sglogit, w.sgate, BT, C, 1); }   // (its gate's, once)
    moe_route_backward(x, ma, w, g, in, dx, d);
}

// ZB: the W pass of a MoE layer, from what its B kept in d and the rows' activations in ma (xe, hg, shg): the
// same products into the same gradients as moe_backward's, so the same sums. No parameter is read.
static void moe_backward_weights(ExpertParallel *x, const MoEActs *ma, const MoEWGrads *d, ExpertGrads g,
                                 const floatX *in) {
    int BT = x->BT, C = x->C, Hl = x->Hl, Hw = x->Hw, E = x->E, El = x->El;
    if (x->SHl > 0) {
        bias_backward(g.sfcprojb, d->dy, BT, C);
        matmul_backward(NULL, g.sfcprojw, NULL, d->dy, ma->shg, NULL, BT, x->SHl, C);
        matmul_backward(NULL, g.sfcw, g.sfcb, d->sdh, in, NULL, BT, C, x->SHw);
        if (x->shared_gate) { moe_router_dweight(g.sgate, d->dsgate, in, BT, C, 1); }
    }
    size_t r0;
    if (x->padded) {
        size_t n = moe_expert_rows(x, d->counts, 0, &r0);
        matmul_backward_batched(NULL, g.fcprojw, NULL, d->dye, ma->hg, NULL, (int)n, Hl, C, El);
        for (int le = 0; le < El && g.fcprojb; le++) {
            bias_backward(g.fcprojb + (size_t)le * C, d->dye + (size_t)le * n * C, (int)n, C);
        }
        matmul_backward_batched(NULL, g.fcw, g.fcb, d->dh, ma->xe, NULL, (int)n, C, Hw, El);
    } else {
        moe_experts_dweight(x, ma, d, g);
    }
    moe_router_dweight(g.router, d->dlogits, in, BT, C, E);
}


// ----------------------------------------------------------------------------
// set-up: the shapes, this stage's MoE layers in model order, their routing bias

// The MoE layers of a stage that holds the model's layers layer_id[0 .. Ls), on this rank of the grid.
static void moe_setup(ExpertParallel *x, const ModelConfig *c, Grid *grid, MoEOptions opt, const int *layer_id, int Ls) {
    int tp = grid->tp;
    x->tp = &grid->tp_group; x->cp = &grid->cp_group; x->ep = &grid->ep_group; x->tp_rank = grid->tp_rank;
    x->E = c->num_experts; x->k = c->topk; x->El = c->num_experts / grid->ep; x->C = c->channels; x->Cl = c->channels / tp;
    x->Hl = c->expert_hidden / tp; x->SHl = c->shared_experts * c->expert_hidden / tp;
    x->swiglu = c->arch == ARCH_LLAMA;
    x->Hw = x->swiglu ? 2 * x->Hl : x->Hl; x->SHw = x->swiglu ? 2 * x->SHl : x->SHl;
    x->shared_gate = c->shared_gate;
    x->opt = opt;
    x->sigmoid = c->router_score == ROUTER_SIGMOID;
    x->norm_topk = c->norm_topk;
    x->layer_index = (int *)malloc_check((Ls + 1) * sizeof(int));
    for (int l = 0; l < Ls; l++) {
        if (is_moe_layer(c, layer_id[l])) { x->layer_index[x->nlayers++] = tensor_layer_slice(c, T_ROUTERW, layer_id[l]); }
    }
    // the routing bias: model state beside the parameters (moe.h), fp32 on every rank
    if (x->nlayers > 0) { x->bias = (float *)mem_alloc((size_t)x->nlayers * x->E * sizeof(float), MEM_PARAMS); }
}

// The stage's layers' routing bias from the whole model's (Lm, E), host.
static void moe_set_bias(ExpertParallel *x, const float *all) {
    for (int j = 0; j < x->nlayers; j++) {
        copy_to_device(x->bias + (size_t)j * x->E, all + (size_t)x->layer_index[j] * x->E, x->E * sizeof(float));
    }
}

// The MoE layers' routing bias (Lm, E) of the whole model on rank 0 (NULL elsewhere, and without MoE layers):
// each stage's first rank (tp, cp, dp rank 0) gives its layers' (every rank of a stage holds the same).
static float *moe_gather_bias(const ExpertParallel *x, Grid *g, int Lm) {
    size_t n = (size_t)Lm * x->E;
    if (n == 0) { return NULL; }
    float *all = (float *)calloc_check(n, sizeof(float));
    if (g->tp_rank == 0 && g->cp_rank == 0 && g->dp_rank == 0) {
        for (int j = 0; j < x->nlayers; j++) {
            copy_to_host(all + (size_t)x->layer_index[j] * x->E, x->bias + (size_t)j * x->E, x->E * sizeof(float));
        }
    }
    comm_host_reduce_sum(&g->world, all, n, DT_FLOAT, 0, "gather of the routing bias (checkpoint)");
    if (g->rank != 0) { free(all); return NULL; }
    return all;
}

// ----------------------------------------------------------------------------
// the step's numbers

// The MoE numbers of the last step, on every rank: aux and z as the loss defines them (means over the global
// batch's sequences and tokens of the sums over the MoE layers of every stage; tp ranks hold copies: tp rank 0
// counts) and the fraction of the top-k assignments dropped by the capacity. T: a whole sequence's tokens.
static void moe_step_numbers(const ExpertParallel *x, Grid *g, double sequences, double T, double *aux, double *z,
                             double *dropped) {
    double v[4] = {0.0, 0.0, 0.0, 0.0};
    if (g->tp_rank == 0) {
        if (x->sums) { copy_to_host(v, x->sums, 2 * sizeof(double)); }
        int *kept = (int *)malloc_check((x->nlayers + 1) * sizeof(int));
        if (x->kept) { copy_to_host(kept, x->kept, x->nlayers * sizeof(int)); }
        for (int l = 0; x->kept && l < x->nlayers; l++) { v[2] += kept[l]; }
        free(kept);
        v[3] = x->assigned;
    }
    comm_host_all_reduce(&g->world, v, 4, DT_DOUBLE, HOST_SUM, "all-reduce of the MoE numbers");
    *aux = v[0] / sequences;
    *z = v[1] / (sequences * T);
    *dropped = v[3] > 0 ? 1.0 - v[2] / v[3] : 0.0;
}

// The MoE layers' load in the last step, on rank 0 (every rank takes part): load (Lm, E) the top-k
// assignments to each expert before drops, kept (Lm) the assignments kept, each summed over the global
// batch (tp ranks hold copies: tp rank 0 counts). Integers, exact in doubles.
static void moe_gather_load(const ExpertParallel *x, Grid *g, int Lm, double *load, double *kept) {
    int E = x->E;
    size_t n = (size_t)Lm * (E + 1);
    double *v = (double *)calloc_check(n, sizeof(double));
    if (g->tp_rank == 0 && x->nlayers > 0 && x->load) {
        int *mine = (int *)malloc_check((size_t)x->nlayers * (E + 1) * sizeof(int)), *mk = mine + (size_t)x->nlayers * E;
        copy_to_host(mine, x->load, (size_t)x->nlayers * E * sizeof(int));
        copy_to_host(mk, x->kept, (size_t)x->nlayers * sizeof(int));
        for (int j = 0; j < x->nlayers; j++) {
            int gm = x->layer_index[j];
            for (int e = 0; e < E; e++) { v[(size_t)gm * E + e] = mine[(size_t)j * E + e]; }
            v[(size_t)Lm * E + gm] = mk[j];
        }
        free(mine);
    }
    comm_host_reduce_sum(&g->world, v, n, DT_DOUBLE, 0, "reduce of the MoE load");
    memcpy(load, v, (size_t)Lm * E * sizeof(double));
    memcpy(kept, v + (size_t)Lm * E, Lm * sizeof(double));
    free(v);
}

// What the step line and main.log say of the MoE layers (report.h): moe_step_numbers and moe_gather_load's.
typedef struct { int layers, E; double aux, z, dropped, *load, *kept; } MoEStepLoad;   // layers 0: a dense model

static MoEStepLoad moe_step_load(const ExpertParallel *x, Grid *g, int Lm, double sequences, double T) {
    MoEStepLoad s = {Lm, x->E, 0, 0, 0, NULL, NULL};
    if (Lm == 0) { return s; }
    moe_step_numbers(x, g, sequences, T, &s.aux, &s.z, &s.dropped);
    s.load = (double *)malloc_check((size_t)Lm * x->E * sizeof(double));
    s.kept = (double *)malloc_check(Lm * sizeof(double));
    moe_gather_load(x, g, Lm, s.load, s.kept);
    return s;
}

#endif // LLMC_EXPERT_PARALLEL_H
