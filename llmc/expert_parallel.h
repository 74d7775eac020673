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

// The MoE layers' shape: where they run, their sizes and options; the same for every MoE layer of the stage
// (moe_setup), B, T and BT those of a micro-batch (moe_set_batch).
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
    int nlayers;             // the stage's MoE layers (a call names one by its number in the stage's order)
    int *layer_index;        // host (nlayers): each one's number among the model's MoE layers (its slice of the
                             // MoE tensors, of the routing bias, of the load lines)
} MoEShape;

// The dispatch in force, state of the step (neither shape nor statistics): cap, the assignments an expert keeps per
// whole sequence; padded: the padded dispatch (a capacity; P = B cap rows a slot), else counted. moe_set_batch sets
// them from the capacity factor; sampling and HellaSwag switch to the dropless counted dispatch and back.
typedef struct { int cap, padded; } MoEDispatch;

// The workspace, shared by the MoE layers and micro-batches (moe_work_alloc): the dispatch buffers, sized for the
// worst case (Rs rows sent, Rr received), the gradients' scratch, the routing's per-call tables.
typedef struct {
    size_t rows_send, rows_recv;   // Rs, Rr: rows of the dispatch buffers (moe_dispatch_rows)
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
} MoEBuffers;

// The step's numbers: the auxiliary losses' seeds, and what the forwards that count add up (moe_step_begin).
typedef struct {
    float aux_scale, z_scale;      // the auxiliary losses' seeds for this step (moe.h)
    int count_stats;         // add the forward's numbers to the step's (training, not validation)
    double assigned;         // the step's assignments made (a sum over this rank's layers)
    int *load;               // device (nlayers, E): the step's top-k assignments per expert, before drops (this
                             // rank's tokens; the same on every tp rank)
    int *load_all;           // device (nlayers, E), --moe-bias-rate: load summed over the dp x cp ranks
    int *kept;               // device (nlayers): the step's assignments kept per MoE layer (this rank's tokens)
    double *sums;            // device (2): the step's aux and z sums over this rank's MoE layers and micro-batches
    int time_a2a;            // --comm-report: time the all-to-alls (the device synchronised around them)
    double a2a_seconds;      // this step's time in them
} MoEStepStats;

// Test hook (test_gpt): when entries is set, each forward that counts of micro-batch micro < micros logs the
// routing of MoE layer l (of the stage's nlayers) into entry micro * nlayers + l, of BT (2k + E) ints:
// choice (BT, k) ints, keep (BT, k) ints, probs (BT, E) floats
typedef struct { int *entries, micros; } MoERouteLog;

// The MoE layers of a stage: one per model; every MoE layer of the stage uses it in turn (moe_forward is told
// which layer and micro-batch).
typedef struct {
    MoEShape shape;          // where and at what sizes the layers run (set once; B, T, BT per micro-batch shape)
    float *bias;             // device (nlayers, E): the layers' routing bias (loss-free balancing; model state)
    MoEDispatch dispatch;    // the capacity and the dispatch in force
    MoEBuffers buf;          // the workspace
    MoEStepStats stats;      // the step's numbers
    MoERouteLog route_log;   // test_gpt's routing log (entries NULL: none)
} ExpertParallel;

// Rows the dispatch buffers need at most: counted with a capacity of cap per sequence (count_cap), this rank
// sends each token to at most k experts and at most cap tokens of a sequence to one expert, and receives from
// each of the ep ranks at most min(k, El) rows per token and cap per local expert; padded (dispatch.padded, at the
// capacity dispatch.cap), E slots of P = B cap rows each way.
static void moe_dispatch_rows(ExpertParallel *x, int count_cap) {
    const MoEShape *s = &x->shape;
    MoEBuffers *b = &x->buf;
    size_t B = s->B, T = s->T, k = s->k, E = s->E, El = s->El, kl = k < El ? k : El, cap = count_cap;
    b->rows_send = B * (T * k < E * cap ? T * k : E * cap);
    b->rows_recv = (size_t)s->ep->size * B * (T * kl < El * cap ? T * kl : El * cap);
    size_t padded = E * B * (size_t)x->dispatch.cap;
    if (x->dispatch.padded && padded > b->rows_send) { b->rows_send = padded; }
    if (x->dispatch.padded && padded > b->rows_recv) { b->rows_recv = padded; }
}

// A micro-batch of B sequences of T tokens on this rank (cp ranks share each sequence): the capacity per whole
// sequence, the dispatch (a capacity: padded; sampling runs dropless, counted; a test hook counts always), and the
// dispatch buffers' rows (any: the stage has MoE layers; dropless: sized for dropless routing).
static void moe_set_batch(ExpertParallel *x, int B, int T, int cp, int any, int dropless) {
    MoEShape *s = &x->shape;
    s->B = B; s->T = T; s->BT = B * T;
    x->dispatch.cap = s->E > 0 ? moe_capacity(s->k, T * cp, s->E, s->opt.cap1000) : 0;
    x->dispatch.padded = s->opt.cap1000 > 0 && !test_hook_counted_dispatch();
    if (any) { moe_dispatch_rows(x, dropless ? T : x->dispatch.cap); }
}

// --recompute mlp: the stored MoE layers (n of a slot) compute their experts' hidden rows in the scratch's one set.
static void moe_acts_share_hidden(MoEActs *stored, int n, const MoEActs *scratch) {
    for (int l = 0; l < n; l++) {
        stored[l].h = scratch->h; stored[l].hg = scratch->hg; stored[l].sh = scratch->sh; stored[l].shg = scratch->shg;
    }
}

// The workspace, for micro-batches of B sequences of T local tokens (the dispatch rows already set).
static void moe_work_alloc(ExpertParallel *x) {
    const MoEShape *s = &x->shape;
    MoEBuffers *b = &x->buf;
    MoEStepStats *st = &x->stats;
    size_t BT = s->BT, C = s->C, Hl = s->Hl, SHl = s->SHl, E = s->E, k = s->k, Rs = b->rows_send, Rr = b->rows_recv,
        cp = s->cp->size, L = s->nlayers;
    size_t X = floatx_bytes(), F = sizeof(float), I = sizeof(int);
    size_t a2a = s->ep->size > 1;   // (ep 1: no exchange, no exchange buffers: moe_forward)
    b->msend = (floatX *)mem_alloc(a2a * Rs * C * X, MEM_COMM);
    b->mrecv = (floatX *)mem_alloc(a2a * Rr * C * X, MEM_COMM);
    b->mexp = (floatX *)mem_alloc(Rr * C * X, MEM_WORKSPACE);
    b->mdh = (floatX *)mem_alloc(Rr * s->Hw * X, MEM_WORKSPACE);
    if (s->swiglu) { b->mdact = (floatX *)mem_alloc(Rr * Hl * X, MEM_WORKSPACE); }
    if (SHl > 0) {
        b->sdh = (floatX *)mem_alloc(BT * s->SHw * X, MEM_WORKSPACE);
        b->sout = (floatX *)mem_alloc(BT * C * X, MEM_WORKSPACE);
        if (s->swiglu) { b->sdact = (floatX *)mem_alloc(BT * SHl * X, MEM_WORKSPACE); }
    }
    if (s->shared_gate) {
        b->sdy = (floatX *)mem_alloc(BT * C * X, MEM_WORKSPACE);
        b->sglogit = (float *)mem_alloc(BT * F, MEM_WORKSPACE);
    }
    b->dgate = (float *)mem_alloc(BT * k * F, MEM_WORKSPACE);
    b->dlogits = (float *)mem_alloc(BT * E * F, MEM_WORKSPACE);
    b->cprob = (float *)mem_alloc(BT * k * F, MEM_WORKSPACE);
    if (cp > 1) {
        b->choice_all = (int *)mem_alloc(cp * BT * k * I, MEM_WORKSPACE);
        b->cprob_all = (float *)mem_alloc(cp * BT * k * F, MEM_WORKSPACE);
    }
    b->pmean = (float *)mem_alloc((size_t)s->B * E * F, MEM_WORKSPACE);
    st->load = (int *)mem_alloc(L * E * I, MEM_WORKSPACE);   // (the step's numbers, with the workspace)
    if (s->opt.bias_rate > 0.0f) { st->load_all = (int *)mem_alloc(L * E * I, MEM_WORKSPACE); }
    st->kept = (int *)mem_alloc(L * I, MEM_WORKSPACE);
    if (x->dispatch.padded) {   // the padded layout's first rows, e P: fixed, uploaded once (not when planning)
        b->pad_offsets = (int *)mem_alloc(E * I, MEM_WORKSPACE);
        int off[MOE_MAX_EXPERTS];
        for (size_t e = 0; e < E; e++) { off[e] = (int)(e * s->B * x->dispatch.cap); }
        if (!mem_planning) { copy_to_device(b->pad_offsets, off, E * I); mem_keep(b->pad_offsets); }
    }
    b->zsum = (float *)mem_alloc((size_t)s->B * F, MEM_WORKSPACE);
    st->sums = (double *)mem_alloc(2 * sizeof(double), MEM_WORKSPACE);
    b->counts = (int *)mem_alloc(E * I, MEM_WORKSPACE);
    b->offsets = (int *)mem_alloc(E * I, MEM_WORKSPACE);
}

// One layer's stored tensors: the routing and the dispatched rows (routing), and the experts' fc and
// GELU outputs, the shared experts' too (hidden).
static void moe_acts_alloc(MoEActs *ma, const ExpertParallel *x, int routing, int hidden) {
    const MoEShape *s = &x->shape;
    size_t BT = s->BT, C = s->C, Hl = s->Hl, SHl = s->SHl, E = s->E, k = s->k, Rs = x->buf.rows_send,
        Rr = x->buf.rows_recv;
    size_t X = floatx_bytes(), F = sizeof(float), I = sizeof(int);
    if (routing) {
        ma->probs = (float *)mem_alloc(BT * E * F, MEM_ACTIVATIONS);
        ma->lse = (float *)mem_alloc(BT * F, MEM_ACTIVATIONS);
        ma->choice = (int *)mem_alloc(BT * k * I, MEM_ACTIVATIONS);
        ma->gate = (float *)mem_alloc(BT * k * F, MEM_ACTIVATIONS);
        ma->keep = (int *)mem_alloc(BT * k * I, MEM_ACTIVATIONS);
        ma->row = (int *)mem_alloc(BT * k * I, MEM_ACTIVATIONS);
        ma->f = (float *)mem_alloc((size_t)s->B * E * F, MEM_ACTIVATIONS);
        ma->xe = (floatX *)mem_alloc(Rr * C * X, MEM_ACTIVATIONS);
        ma->ys = (floatX *)mem_alloc(Rs * C * X, MEM_ACTIVATIONS);
        ma->counts = (int *)malloc_check((size_t)s->ep->size * E * I);
        if (s->shared_gate) { ma->sgate = (float *)mem_alloc(BT * F, MEM_ACTIVATIONS); }
    }
    if (hidden) {
        ma->h = (floatX *)mem_alloc(Rr * s->Hw * X, MEM_ACTIVATIONS);
        ma->hg = (floatX *)mem_alloc(Rr * Hl * X, MEM_ACTIVATIONS);
        if (SHl > 0) {
            ma->sh = (floatX *)mem_alloc(BT * s->SHw * X, MEM_ACTIVATIONS);
            ma->shg = (floatX *)mem_alloc(BT * SHl * X, MEM_ACTIVATIONS);
        }
    }
}

// The step's numbers start at zero, with this step's auxiliary-loss seeds.
static void moe_step_begin(ExpertParallel *x, float aux_scale, float z_scale) {
    MoEStepStats *st = &x->stats;
    st->aux_scale = aux_scale;
    st->z_scale = z_scale;
    st->assigned = 0.0;
    if (st->sums) { memset_zero_device(st->sums, 2 * sizeof(double)); }
    if (st->load) { memset_zero_device(st->load, (size_t)x->shape.nlayers * x->shape.E * sizeof(int)); }
    if (st->kept) { memset_zero_device(st->kept, (size_t)x->shape.nlayers * sizeof(int)); }
    st->count_stats = 1;
}

// Loss-free balancing, after the step's optimizer update (moe.h): the loads summed over the ranks that share
// the step's tokens (dp x cp: group), then each layer's bias moved, on the device, unless the update was
// skipped (scale: the step's clip scale, 0 then). Every rank of the group ends with the same bias.
static void moe_balance_bias(ExpertParallel *x, Group *group, const float *scale) {
    const MoEShape *s = &x->shape;
    if (s->opt.bias_rate <= 0.0f || s->nlayers == 0) { return; }
    size_t n = (size_t)s->nlayers * s->E;
    copy_on_device(x->stats.load_all, x->stats.load, n * sizeof(int));
    comm_all_reduce(group, x->stats.load_all, n, DT_INT, NULL);
    moe_bias_update(x->bias, x->stats.load_all, s->nlayers, s->E, s->opt.bias_rate, scale);
}

// Step 2's check of the (ep, E) table of kept rows (identical on every rank of the ep group, so every
// rank decides alike): each rank's counts must fit the buffers (a bad count would overrun them).
static void moe_check_counts(const ExpertParallel *x, const int *counts) {
    int ep = x->shape.ep->size, E = x->shape.E, El = x->shape.El, P = x->shape.B * x->dispatch.cap;
    for (int s = 0; s < ep; s++) {
        size_t sent = 0;
        for (int e = 0; e < E; e++) {
            int n = counts[s * E + e];
            if (n < 0 || n > P) { fail("MoE dispatch: ep rank %d reports %d rows for expert %d (at most %d)", s, n, e, P); }
            sent += n;
        }
        if (sent > x->buf.rows_send) {
            fail("MoE dispatch: ep rank %d sends %zu rows, its buffer holds %zu", s, sent, x->buf.rows_send);
        }
    }
    for (int r = 0; r < ep; r++) {
        size_t got = 0;
        for (int s = 0; s < ep; s++) { for (int le = 0; le < El; le++) { got += counts[s * E + r * El + le]; } }
        if (got > x->buf.rows_recv) {
            fail("MoE dispatch: ep rank %d receives %zu rows, its buffer holds %zu", r, got, x->buf.rows_recv);
        }
    }
}

// Steps 4 and 6: all-to-all(v) over the ep group, in rows of C: to_experts = 1 sends the rows of the send
// layout to the ranks owning their experts, where they arrive grouped by source rank; 0 sends them back.
static void moe_all_to_all(ExpertParallel *x, const int *counts, const floatX *send, floatX *recv, int to_experts) {
    Group *g = x->shape.ep;
    int ep = g->size, me = g->rank, E = x->shape.E, El = x->shape.El;
    size_t C = x->shape.C;
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
    if (x->stats.time_a2a) { device_synchronize(); t0 = monotonic_seconds(); }
    if (to_experts) { comm_all_to_allv(g, send, to, to_off, recv, from, from_off, DT_FLOATX); }
    else { comm_all_to_allv(g, send, from, from_off, recv, to, to_off, DT_FLOATX); }
    if (x->stats.time_a2a) { device_synchronize(); x->stats.a2a_seconds += monotonic_seconds() - t0; }
    free(buf);
}

// The rows received from the ep ranks (grouped by source, then local expert) regrouped by local
// expert (then source), so each expert's rows are contiguous (to_experts = 1), or back (0).
static void moe_regroup(const ExpertParallel *x, const int *counts, const floatX *src, floatX *dst, int to_experts) {
    int ep = x->shape.ep->size, me = x->shape.ep->rank, E = x->shape.E, El = x->shape.El;
    size_t C = x->shape.C, by_source = 0;
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
    int ep = x->shape.ep->size, me = x->shape.ep->rank, E = x->shape.E, El = x->shape.El;
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
    for (int le = 0; le < x->shape.El; le++) { rows[le] = (int)moe_expert_rows(x, counts, le, &r0); R += rows[le]; }
    return R;
}

// xe -> h, hg (the fc and activation outputs) -> mexp (the rows' outputs), expert by expert
static void moe_experts_forward_loop(ExpertParallel *x, MoEActs *ma, ExpertWeights w, floatX *out) {
    int C = x->shape.C, Hl = x->shape.Hl, Hw = x->shape.Hw, b2once = x->shape.tp_rank == 0;
#ifndef USE_CUDA
    // (CPU: the local experts side by side, each on one thread, its GEMMs single-threaded inside: one parallel
    // region for all of them, where each expert's small GEMMs would each split over every thread)
    #pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int le = 0; le < x->shape.El; le++) {
        size_t r0, n = moe_expert_rows(x, ma->counts, le, &r0);
        if (n == 0) { continue; }
        const floatX *b2 = b2once && w.fcprojb ? w.fcprojb + (size_t)le * C : NULL;   // added once over tp
        mlp_fc_forward(x->shape.swiglu, ma->hg + r0 * Hl, ma->h + r0 * Hw, ma->xe + r0 * C, w.fcw + (size_t)le * Hw * C,
                       w.fcb ? w.fcb + (size_t)le * Hl : NULL, (int)n, C, Hl);
        matmul_forward(out + r0 * C, ma->hg + r0 * Hl, w.fcprojw + (size_t)le * C * Hl, b2, (int)n, Hl, C);
    }
}

#ifdef MATMUL_GROUPED
// the grouped GEMMs' case: SwiGLU experts, no biases (GELU experts keep their fused epilogues in the loop)
static int moe_experts_grouped(const ExpertParallel *x, ExpertTensors w) {
    return matmul_grouped_enabled && x->shape.swiglu && w.fcb == NULL && w.fcprojb == NULL;
}

// SwiGLU's fc rows of every expert (h: (R, 2Hl) [gate | up]; hg: (R, Hl)), one grouped GEMM
static void moe_experts_fc_grouped(ExpertParallel *x, MoEActs *ma, ExpertWeights w, const int *rows, size_t R) {
    matmul_forward_grouped(ma->h, ma->xe, w.fcw, rows, x->shape.C, x->shape.Hw, x->shape.El);
    swiglu_forward(ma->hg, ma->h, (int)R, x->shape.Hl);
}
#endif

// the launcher: the grouped GEMMs where they apply, else the loop; out (rows grouped by local expert, C)
static void moe_experts_forward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, floatX *out) {
#ifdef MATMUL_GROUPED
    if (moe_experts_grouped(x, w)) {
        int rows[MOE_MAX_EXPERTS];
        size_t R = moe_expert_row_counts(x, ma->counts, rows);
        moe_experts_fc_grouped(x, ma, w, rows, R);
        matmul_forward_grouped(out, ma->hg, w.fcprojw, rows, x->shape.Hl, x->shape.C, x->shape.El);
        return;
    }
#endif
    moe_experts_forward_loop(x, ma, w, out);
}

// 1. route: the router's scores, the top k, the capacity per sequence, the statistics of the auxiliary losses.
// Capacity and f count per whole sequence: with cp its other parts are on the other cp ranks (a capacity needs
// their assignments: all-gathered; f is a sum: all-reduced; P and z stay partial sums).
static void moe_route(ExpertParallel *x, MoEActs *ma, ExpertWeights w, const floatX *in, int layer, int record) {
    const MoEShape *s = &x->shape;
    MoEBuffers *b = &x->buf;
    int B = s->B, T = s->T, BT = s->BT, C = s->C, E = s->E, k = s->k, cap = x->dispatch.cap;
    moe_router_forward(ma->probs, ma->lse, in, w.router, BT, C, E, s->sigmoid);
    moe_topk(ma->choice, b->cprob, ma->gate, ma->probs, x->bias + (size_t)layer * E, BT, E, k, s->norm_topk);
    if (x->stats.count_stats && record) { moe_load_count(x->stats.load + (size_t)layer * E, ma->choice, BT, k); }
    Group *cpg = s->cp;
    int cp = cpg->size, Tg = T * cp;
    if (cp > 1 && cap < Tg) {
        comm_all_gather(cpg, ma->choice, b->choice_all, (size_t)BT * k, DT_INT, NULL);
        comm_all_gather(cpg, b->cprob, b->cprob_all, (size_t)BT * k, DT_FLOAT, NULL);
        moe_capacity_keep(ma->keep, b->choice_all, b->cprob_all, cp, cpg->rank, B, T, k, E, cap, s->opt.policy);
    } else {   // (dropless: every assignment kept, whatever the positions)
        moe_capacity_keep(ma->keep, ma->choice, b->cprob, 1, 0, B, T, k, E, cap, s->opt.policy);
    }
    moe_sequence_stats(ma->f, b->pmean, b->zsum, ma->choice, ma->probs, ma->lse, B, T, E, k, Tg, s->sigmoid);
    comm_all_reduce(cpg, ma->f, (size_t)B * E, DT_FLOAT, NULL);
}

// 2. the dispatch plan: each kept row's place in the send layout, and the (ep, E) table of rows
static void moe_dispatch_plan(ExpertParallel *x, MoEActs *ma, int layer, int record) {
    MoEBuffers *b = &x->buf;
    int BT = x->shape.BT, E = x->shape.E, k = x->shape.k;
    moe_count(b->counts, ma->choice, ma->keep, BT, E, k);
    if (x->stats.count_stats && record) { moe_kept_add(x->stats.kept + layer, b->counts, E); }
    size_t P = (size_t)x->shape.B * x->dispatch.cap;
    if (x->dispatch.padded) {   // P rows per slot, the kept ones first: known on the host without asking the device
        for (int i = 0; i < x->shape.ep->size * E; i++) { ma->counts[i] = (int)P; }
        moe_rows(ma->row, ma->choice, ma->keep, b->pad_offsets, BT, E, k, (int)P);
    } else {           // counted, exchanged over the ep group and checked
        int mine[MOE_MAX_EXPERTS], offsets[MOE_MAX_EXPERTS];
        copy_to_host(mine, b->counts, E * sizeof(int));
        comm_host_all_gather(x->shape.ep, mine, E, ma->counts, DT_INT, "all-gather of the MoE dispatch counts");
        moe_check_counts(x, ma->counts);
        for (int e = 0, o = 0; e < E; e++) { offsets[e] = o; o += mine[e]; }
        copy_to_device(b->offsets, offsets, E * sizeof(int));
        moe_rows(ma->row, ma->choice, ma->keep, b->offsets, BT, E, k, BT * k);
    }
}

// 3-4. dispatch: in's kept rows permuted into the send layout, then sent to their experts' ep ranks -> ma->xe, rows
// grouped by local expert (ep 1: the send layout is the experts' layout, the exchange an identity: straight to xe)
static void moe_dispatch(ExpertParallel *x, MoEActs *ma, const floatX *in) {
    const MoEShape *s = &x->shape;
    int a2a = s->ep->size > 1, C = s->C;
    floatX *send = a2a ? x->buf.msend : ma->xe;
    if (x->dispatch.padded) { memset_zero_device(send, (size_t)s->E * s->B * x->dispatch.cap * C * sizeof(floatX)); }   // (padding: 0)
    moe_permute(send, in, ma->row, s->BT, s->k, C);
    if (a2a) {
        moe_all_to_all(x, ma->counts, x->buf.msend, x->buf.mrecv, 1);
        moe_regroup(x, ma->counts, x->buf.mrecv, ma->xe, 1);
    }
}

// 5. the local experts: ma->xe -> yexp, rows grouped by local expert
static void moe_experts_apply(ExpertParallel *x, MoEActs *ma, ExpertWeights w, floatX *yexp) {
    const MoEShape *s = &x->shape;
    int C = s->C, Hl = s->Hl, El = s->El;
    if (x->dispatch.padded) {   // every local expert has the same rows: one strided-batched GEMM per projection
        size_t r0, n = moe_expert_rows(x, ma->counts, 0, &r0);
        mlp_fc_forward_batched(s->swiglu, ma->hg, ma->h, ma->xe, w.fcw, w.fcb, (int)n, C, Hl, El);
        matmul_forward_batched(yexp, ma->hg, w.fcprojw, s->tp_rank == 0 ? w.fcprojb : NULL, (int)n, Hl, C, El);
    } else {
        moe_experts_forward(x, ma, w, yexp);
    }
}

// 6. back: the experts' outputs (mexp) to their tokens' ep ranks, in the send layout -> ma->ys (ep 1: already there)
static void moe_undispatch(ExpertParallel *x, MoEActs *ma) {
    if (x->shape.ep->size == 1) { return; }
    moe_regroup(x, ma->counts, x->buf.mexp, x->buf.mrecv, 0);
    moe_all_to_all(x, ma->counts, x->buf.mrecv, ma->ys, 0);
}

// 8. the shared experts, on every token, added to out (Qwen2-MoE: scaled per token by their sigmoid gate)
static void moe_shared_forward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, const floatX *in, floatX *out) {
    const MoEShape *s = &x->shape;
    if (s->SHl == 0) { return; }
    int BT = s->BT, C = s->C;
    mlp_fc_forward(s->swiglu, ma->shg, ma->sh, in, w.sfcw, w.sfcb, BT, C, s->SHl);
    matmul_forward(x->buf.sout, ma->shg, w.sfcprojw, s->tp_rank == 0 ? w.sfcprojb : NULL, BT, s->SHl, C);
    if (s->shared_gate) { moe_shared_gate_forward(ma->sgate, x->buf.sout, in, w.sgate, BT, C); }
    accumulate(out, x->buf.sout, (size_t)BT * C);
}

// The layer's records of a micro-batch that counts: the routing (a test hook's log), aux and z (on the device), the
// assignments
static void moe_record(ExpertParallel *x, MoEActs *ma, int layer, int micro) {
    int BT = x->shape.BT, E = x->shape.E, k = x->shape.k;
    if (x->route_log.entries && micro < x->route_log.micros) {
        int *log = x->route_log.entries + ((size_t)micro * x->shape.nlayers + layer) * BT * (2 * k + E);
        copy_to_host(log, ma->choice, (size_t)BT * k * sizeof(int));
        copy_to_host(log + (size_t)BT * k, ma->keep, (size_t)BT * k * sizeof(int));
        copy_to_host(log + (size_t)BT * 2 * k, ma->probs, (size_t)BT * E * sizeof(float));   // (bits of floats)
    }
    if (x->stats.count_stats) {
        moe_loss_sums(x->stats.sums, ma->f, x->buf.pmean, x->buf.zsum, x->shape.B, E);
        x->stats.assigned += (double)BT * k;
    }
}

// x (BT, C): the ln2 output of all tokens (the same on every tp rank) -> out (BT, C), a partial sum over tp; MoE
// layer `layer` of the stage ([0, nlayers): its bias, load, kept, log entry), micro-batch `micro` of the step.
// record: count the step's numbers and log the routing (not when the forward is a recomputation).
static void moe_forward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, const floatX *in, floatX *out, int layer,
                        int micro, int record) {
    const MoEShape *s = &x->shape;
    moe_route(x, ma, w, in, layer, record);
    moe_dispatch_plan(x, ma, layer, record);
    moe_dispatch(x, ma, in);
    moe_experts_apply(x, ma, w, s->ep->size > 1 ? x->buf.mexp : ma->ys);
    moe_undispatch(x, ma);
    moe_combine(out, ma->ys, ma->gate, ma->row, s->BT, s->k, s->C);   // 7. out = the kept rows times their gates
    moe_shared_forward(x, ma, w, in, out);
    if (record) { moe_record(x, ma, layer, micro); }
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
    const MoEShape *s = &x->shape;
    int C = s->C, Hl = s->Hl, Hw = s->Hw;
#ifndef USE_CUDA
    #pragma omp parallel for schedule(dynamic, 1)   // (as in the forward: the experts side by side)
#endif
    for (int le = 0; le < s->El; le++) {
        size_t r0, n = moe_expert_rows(x, ma->counts, le, &r0);
        if (n == 0) { continue; }
        floatX *dye = x->buf.mexp + r0 * C, *dh = mdh + r0 * Hw;
        const floatX *fcw = w.fcw + (size_t)le * Hw * C, *fcb = w.fcb ? w.fcb + (size_t)le * Hl : NULL;
        if (recompute_mlp) {   // the rows' fc and activation outputs again, from their stored input
            mlp_fc_forward(s->swiglu, ma->hg + r0 * Hl, ma->h + r0 * Hw, ma->xe + r0 * C, fcw, fcb, (int)n, C, Hl);
        }
        mlp_proj_backward(s->swiglu, dh, !weights ? NULL : g.fcprojw + (size_t)le * C * Hl, dye, ma->hg + r0 * Hl,
                          w.fcprojw + (size_t)le * C * Hl, ma->h + r0 * Hw, x->buf.mdact + r0 * Hl, (int)n, Hl, C);
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
        int rows[MOE_MAX_EXPERTS], C = x->shape.C, Hl = x->shape.Hl, Hw = x->shape.Hw, El = x->shape.El;
        floatX *mexp = x->buf.mexp, *mdact = x->buf.mdact;
        size_t R = moe_expert_row_counts(x, ma->counts, rows);
        if (recompute_mlp) { moe_experts_fc_grouped(x, ma, w, rows, R); }
        matmul_backward_grouped(mdact, weights ? g.fcprojw : NULL, mexp, ma->hg, w.fcprojw, rows, Hl, C, El);
        swiglu_backward(mdh, mdact, ma->h, (int)R, Hl);
        matmul_backward_grouped(mexp, weights ? g.fcw : NULL, mdh, ma->xe, w.fcw, rows, C, Hw, El);   // := dx
        return;
    }
#endif
    moe_experts_backward_loop(x, ma, w, g, mdh, recompute_mlp, weights);
}

// ZB's W pass of 5.: g's fcprojw, fcprojb, fcw, fcb += the products moe_experts_backward skipped, from what B kept
static void moe_experts_dweight(ExpertParallel *x, const MoEActs *ma, const MoEWGrads *d, ExpertGrads g) {
    int C = x->shape.C, Hl = x->shape.Hl, Hw = x->shape.Hw, El = x->shape.El;
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
    const MoEShape *s = &x->shape;
    MoEBuffers *b = &x->buf;
    if (s->SHl == 0) { return; }
    int BT = s->BT, C = s->C;
    if (recompute_mlp) { mlp_fc_forward(s->swiglu, ma->shg, ma->sh, in, w.sfcw, w.sfcb, BT, C, s->SHl); }
    const floatX *ds = dy;   // the gradient of the shared experts' output
    if (s->shared_gate) {    // (their output again, unscaled: the gate's gradient; summed over tp as the parts)
        matmul_forward(b->sout, ma->shg, w.sfcprojw, NULL, BT, s->SHl, C);
        moe_shared_gate_backward(b->sglogit, b->sdy, dy, b->sout, ma->sgate, BT, C);
        comm_all_reduce(s->tp, b->sglogit, BT, DT_FLOAT, NULL);
        ds = b->sdy;
    }
    if (d) {
        copy_on_device(d->dy, ds, (size_t)BT * C * sizeof(floatX));
        if (s->shared_gate) { copy_on_device(d->dsgate, b->sglogit, BT * sizeof(float)); }
    } else {
        bias_backward(g.sfcprojb, ds, BT, C);   // complete on every tp rank (as the experts' fcproj bias)
        if (s->shared_gate) { moe_router_dweight(g.sgate, b->sglogit, in, BT, C, 1); }   // (complete on each)
    }
    floatX *sdh = d ? d->sdh : b->sdh;
    mlp_proj_backward(s->swiglu, sdh, g.sfcprojw, ds, ma->shg, w.sfcprojw, ma->sh, b->sdact, BT, s->SHl, C);
    matmul_backward(b->sout, g.sfcw, g.sfcb, sdh, in, w.sfcw, BT, C, s->SHw);
}

// 7.'s backward: the gradient of each kept row in the send layout (padded: the padding rows' zero) and of the gates
// (all-reduced over tp: the expert outputs are partial sums over tp); 6.'s: the rows to their experts (mexp, grouped
// by local expert; ep 1: the exchanges are identities, as in the forward: in mexp throughout). Returns the send
// layout's buffer, which 4-3.'s backward fills again.
static floatX *moe_combine_backward_to_experts(ExpertParallel *x, MoEActs *ma, const floatX *dy) {
    const MoEShape *s = &x->shape;
    MoEBuffers *b = &x->buf;
    int BT = s->BT, C = s->C, k = s->k, a2a = s->ep->size > 1;
    floatX *send = a2a ? b->msend : b->mexp;
    if (x->dispatch.padded) { memset_zero_device(send, (size_t)s->E * s->B * x->dispatch.cap * C * sizeof(floatX)); }
    moe_combine_backward(send, b->dgate, dy, ma->ys, ma->gate, ma->row, BT, k, C);
    comm_all_reduce(s->tp, b->dgate, (size_t)BT * k, DT_FLOAT, NULL);
    if (a2a) {
        moe_all_to_all(x, ma->counts, b->msend, b->mrecv, 1);
        moe_regroup(x, ma->counts, b->mrecv, b->mexp, 1);
    }
    return send;
}

// 5.'s backward: mexp (the rows' output gradients) := the rows' input gradients; g's experts += theirs (ZB, d: what W
// needs kept in d instead, g not touched)
static void moe_experts_apply_backward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, ExpertGrads g,
                                       int recompute_mlp, const MoEWGrads *d) {
    const MoEShape *s = &x->shape;
    int C = s->C, Hl = s->Hl, Hw = s->Hw, El = s->El;
    floatX *mexp = x->buf.mexp;
    size_t rows = 0, r0;
    for (int le = 0; le < El; le++) { rows += moe_expert_rows(x, ma->counts, le, &r0); }
    if (d) {   // (the rows' output gradients: mexp becomes their input's gradient below)
        copy_on_device(d->dye, mexp, rows * C * sizeof(floatX));
        memcpy(d->counts, ma->counts, (size_t)s->ep->size * s->E * sizeof(int));
    }
    floatX *mdh = d ? d->dh : x->buf.mdh;
    if (x->dispatch.padded) {   // (as in the forward: one strided-batched GEMM per product)
        size_t n = moe_expert_rows(x, ma->counts, 0, &r0);
        if (recompute_mlp) { mlp_fc_forward_batched(s->swiglu, ma->hg, ma->h, ma->xe, w.fcw, w.fcb, (int)n, C, Hl, El); }
        mlp_proj_backward_batched(s->swiglu, mdh, g.fcprojw, mexp, ma->hg, w.fcprojw, ma->h, x->buf.mdact, (int)n, Hl, C,
                                  El);
        for (int le = 0; le < El && !d && g.fcprojb; le++) {   // complete on every tp rank
            bias_backward(g.fcprojb + (size_t)le * C, mexp + (size_t)le * n * C, (int)n, C);
        }
        matmul_backward_batched(mexp, g.fcw, g.fcb, mdh, ma->xe, w.fcw, (int)n, C, Hw, El);   // := the rows' dx
    } else {
        moe_experts_backward(x, ma, w, g, mdh, recompute_mlp, d == NULL);
    }
}

// 4-3.'s backward: the rows' input gradients back to their tokens' ep ranks (send layout), summed per token -> dx
static void moe_dispatch_backward(ExpertParallel *x, MoEActs *ma, floatX *send, floatX *dx) {
    const MoEShape *s = &x->shape;
    if (s->ep->size > 1) {
        moe_regroup(x, ma->counts, x->buf.mexp, x->buf.mrecv, 0);
        moe_all_to_all(x, ma->counts, x->buf.mrecv, x->buf.msend, 0);
    }
    moe_unpermute(dx, send, ma->row, s->BT, s->k, s->C);
}

// 1.'s backward: the router, identical on every tp rank (complete gates' gradient); its input gradient added once
static void moe_route_backward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, ExpertGrads g, const floatX *in,
                               floatX *dx, const MoEWGrads *d) {
    const MoEShape *s = &x->shape;
    int BT = s->BT, C = s->C, E = s->E;
    moe_router_backward(x->buf.dlogits, x->buf.dgate, ma->gate, ma->choice, ma->probs, ma->lse, ma->f, s->T, BT, E, s->k,
                        x->stats.aux_scale, x->stats.z_scale, s->sigmoid, s->norm_topk);
    if (d) { copy_on_device(d->dlogits, x->buf.dlogits, (size_t)BT * E * sizeof(float)); }
    else { moe_router_dweight(g.router, x->buf.dlogits, in, BT, C, E); }
    if (s->tp_rank == 0) { moe_router_dinput(dx, x->buf.dlogits, w.router, BT, C, E); }
}

// The backward of moe_forward. dy (BT, C): the gradient of out on every tp rank (all tokens; its buffer may be
// dx's) -> dx (BT, C), the gradient of in, a partial sum over tp (written); g: the experts' gradients and the router's (+=).
// recompute_mlp: the experts' (and shared experts') fc and GELU outputs are not stored (--recompute mlp):
// computed again here. ZB (d not NULL): B only (g not touched); what W needs is kept in d.
static void moe_backward(ExpertParallel *x, MoEActs *ma, ExpertWeights w, ExpertGrads g, const floatX *in,
                         const floatX *dy, floatX *dx, int recompute_mlp, const MoEWGrads *d) {
    const MoEShape *s = &x->shape;
    int BT = s->BT, C = s->C;
    moe_shared_backward(x, ma, w, g, in, dy, recompute_mlp, d);
    floatX *send = moe_combine_backward_to_experts(x, ma, dy);
    moe_experts_apply_backward(x, ma, w, g, recompute_mlp, d);
    moe_dispatch_backward(x, ma, send, dx);
    if (s->SHl > 0) { accumulate(dx, x->buf.sout, (size_t)BT * C); }   // (8.'s input gradient)
    if (s->shared_gate && s->tp_rank == 0) { moe_router_dinput(dx, x->buf.sglogit, w.sgate, BT, C, 1); }   // (its gate's, once)
    moe_route_backward(x, ma, w, g, in, dx, d);
}

// ZB: the W pass of a MoE layer, from what its B kept in d and the rows' activations in ma (xe, hg, shg): the
// same products into the same gradients as moe_backward's, so the same sums. No parameter is read.
static void moe_backward_weights(ExpertParallel *x, const MoEActs *ma, const MoEWGrads *d, ExpertGrads g,
                                 const floatX *in) {
    const MoEShape *s = &x->shape;
    int BT = s->BT, C = s->C, Hl = s->Hl, Hw = s->Hw, E = s->E, El = s->El;
    if (s->SHl > 0) {
        bias_backward(g.sfcprojb, d->dy, BT, C);
        matmul_backward(NULL, g.sfcprojw, NULL, d->dy, ma->shg, NULL, BT, s->SHl, C);
        matmul_backward(NULL, g.sfcw, g.sfcb, d->sdh, in, NULL, BT, C, s->SHw);
        if (s->shared_gate) { moe_router_dweight(g.sgate, d->dsgate, in, BT, C, 1); }
    }
    size_t r0;
    if (x->dispatch.padded) {
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
    MoEShape *s = &x->shape;
    int tp = grid->tp;
    s->tp = &grid->tp_group; s->cp = &grid->cp_group; s->ep = &grid->ep_group; s->tp_rank = grid->tp_rank;
    s->E = c->num_experts; s->k = c->topk; s->El = c->num_experts / grid->ep; s->C = c->channels; s->Cl = c->channels / tp;
    s->Hl = c->expert_hidden / tp; s->SHl = c->shared_experts * c->expert_hidden / tp;
    s->swiglu = c->arch == ARCH_LLAMA;
    s->Hw = s->swiglu ? 2 * s->Hl : s->Hl; s->SHw = s->swiglu ? 2 * s->SHl : s->SHl;
    s->shared_gate = c->shared_gate;
    s->opt = opt;
    s->sigmoid = c->router_score == ROUTER_SIGMOID;
    s->norm_topk = c->norm_topk;
    s->layer_index = (int *)malloc_check((Ls + 1) * sizeof(int));
    for (int l = 0; l < Ls; l++) {
        if (is_moe_layer(c, layer_id[l])) { s->layer_index[s->nlayers++] = tensor_layer_slice(c, T_ROUTERW, layer_id[l]); }
    }
    // the routing bias: model state beside the parameters (moe.h), fp32 on every rank
    if (s->nlayers > 0) { x->bias = (float *)mem_alloc((size_t)s->nlayers * s->E * sizeof(float), MEM_PARAMS); }
}

// The stage's layers' routing bias from the whole model's (Lm, E), host.
static void moe_set_bias(ExpertParallel *x, const float *all) {
    const MoEShape *s = &x->shape;
    for (int j = 0; j < s->nlayers; j++) {
        copy_to_device(x->bias + (size_t)j * s->E, all + (size_t)s->layer_index[j] * s->E, s->E * sizeof(float));
    }
}

// The MoE layers' routing bias (Lm, E) of the whole model on rank 0 (NULL elsewhere, and without MoE layers):
// each stage's first rank (tp, cp, dp rank 0) gives its layers' (every rank of a stage holds the same).
static float *moe_gather_bias(const ExpertParallel *x, Grid *g, int Lm) {
    const MoEShape *s = &x->shape;
    size_t n = (size_t)Lm * s->E;
    if (n == 0) { return NULL; }
    float *all = (float *)calloc_check(n, sizeof(float));
    if (g->tp_rank == 0 && g->cp_rank == 0 && g->dp_rank == 0) {
        for (int j = 0; j < s->nlayers; j++) {
            copy_to_host(all + (size_t)s->layer_index[j] * s->E, x->bias + (size_t)j * s->E, s->E * sizeof(float));
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
    const MoEStepStats *st = &x->stats;
    int L = x->shape.nlayers;
    double v[4] = {0.0, 0.0, 0.0, 0.0};
    if (g->tp_rank == 0) {
        if (st->sums) { copy_to_host(v, st->sums, 2 * sizeof(double)); }
        int *kept = (int *)malloc_check((L + 1) * sizeof(int));
        if (st->kept) { copy_to_host(kept, st->kept, L * sizeof(int)); }
        for (int l = 0; st->kept && l < L; l++) { v[2] += kept[l]; }
        free(kept);
        v[3] = st->assigned;
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
    int E = x->shape.E, L = x->shape.nlayers;
    size_t n = (size_t)Lm * (E + 1);
    double *v = (double *)calloc_check(n, sizeof(double));
    if (g->tp_rank == 0 && L > 0 && x->stats.load) {
        int *mine = (int *)malloc_check((size_t)L * (E + 1) * sizeof(int)), *mk = mine + (size_t)L * E;
        copy_to_host(mine, x->stats.load, (size_t)L * E * sizeof(int));
        copy_to_host(mk, x->stats.kept, (size_t)L * sizeof(int));
        for (int j = 0; j < L; j++) {
            int gm = x->shape.layer_index[j];
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
    MoEStepLoad s = {Lm, x->shape.E, 0, 0, 0, NULL, NULL};
    if (Lm == 0) { return s; }
    moe_step_numbers(x, g, sequences, T, &s.aux, &s.z, &s.dropped);
    s.load = (double *)malloc_check((size_t)Lm * x->shape.E * sizeof(double));
    s.kept = (double *)malloc_check(Lm * sizeof(double));
    moe_gather_load(x, g, Lm, s.load, s.kept);
    return s;
}

#endif // LLMC_EXPERT_PARALLEL_H
