// Mixture of Experts: the layer's semantics, the router's kernels (CPU loops and CUDA kernels side by side); the
// token shuffle's (count, rows, permute, combine) are moe_dispatch.h's.
//
// THE LAYER. With --experts E --topk k, layer l is a MoE layer when l % every == every-1 (--moe-every,
// default 1): its MLP becomes E expert MLPs of the dense MLP's shape (fc C->4C with bias, GELU, fcproj
// 4C->C with bias) behind a router. For the tokens x (N, C) of the ln2 output:
//   router    logits = x W_r^T in fp32, W_r (E, C), no bias, the same on every rank; lse = logsumexp(logits);
//             the scores p (--router-score): softmax(logits) over all E (default), or sigmoid(logit_e)
//             each (DeepSeek-V3; the model file records which)
//   top-k     the k largest p_e + b_e of each token, ties to the LOWER expert index, in that order; b (E)
//             the layer's routing bias (loss-free balancing, below; zero unless trained with it) moves
//             the choice only: gates, the drop order and the aux loss use the unbiased p.
//             gates: k = 1 (softmax only): g = p_e (Switch: the router learns from the main loss); else
//             the k scores renormalised to sum 1 (Mixtral; sigmoid with k = 1 would give a constant gate 1 and
//             no router gradient: refused), or (the model's norm_topk 0: OLMoE, Qwen2-MoE) the k scores themselves
//   capacity  counted PER SEQUENCE of T tokens, so that the drops never depend on the layout (B, dp,
//             cp, pp, ep, accumulation; with cp each rank ranks its assignments against the whole
//             sequence's, all-gathered over cp, at their positions in it): each expert keeps at most cap = min(T,
//             ceil(k T F1000 / (1000 E)))
//             assignments of each sequence (integers; F1000 = round(1000 F), F = --capacity-factor,
//             at most 3 decimals, 0 = dropless). Which ones (--drop-policy):
//               probs     the cap with the highest p_e (the full softmax, not the gate), ties to the
//                         earlier position
//               position  first choices before second ones (choice rank), then the earlier position
//             A dropped assignment adds nothing (the token keeps its residual); the other gates are
//             not renormalised. Sampling runs dropless (cap = T).
//   output    out[t] = sum over its kept assignments j (in order) of g_j * expert_{e_j}(x[t])
// AUXILIARY LOSSES, also per sequence. Load balancing (Switch): per sequence and MoE layer
//   aux = E sum_i f_i P_i, f_i = (top-k assignments to i, before drops) / (k T) (no gradient),
//   P_i = the sequence's mean of p_i, with sigmoid scores of p_i / sum_e p_e (DeepSeek-V3's normalised
//   scores) (with cp: f summed over the cp ranks, P left as each rank's partial sum: aux is linear in P).
//   Router z-loss per token: lse^2 (a softmax router's regulariser: with sigmoid scores its coefficient must
//   be 0, the default there; main.log's z reports lse^2 still). The optimised loss is
//   CE + aux_coeff * (mean over the global batch's sequences of the sum over MoE layers of aux)
//      + z_coeff * (mean over its tokens of the sum over MoE layers of lse^2);
// main.log's trl stays the CE alone. E = 1, k = 1 is the dense model exactly when z_coeff = 0 (g = 1,
// and aux = 1 has no gradient; the z-loss would still train the router and the layers below it).
//
// LOSS-FREE BALANCING (DeepSeek-V3's auxiliary-loss-free strategy, --moe-bias-rate u, 0 = off): after each
// step that updates the parameters, per MoE layer, load_e = the top-k assignments to e before drops over the
// whole global batch (every dp and cp rank, every micro-batch, each token once; integers) and
//   b_e <- b_e - u sign(E load_e - sum_i load_i)     (sign(0) = 0)
// so an overloaded expert is chosen less and an underloaded one more. b is fp32, the same on every rank, no
// gradient, no weight decay, outside the gradient norm; it is model state (the model file keeps it).
// The update runs on the device after the optimizer step (a skipped step leaves b as it is): no host wait.
// EXPERT PARALLELISM (--ep N): expert_parallel.h runs a MoE layer over the ep group with these kernels and
// moe_dispatch.h's.
#ifndef LLMC_MOE_H
#define LLMC_MOE_H

#include "backend.h"
#include "alloc.h"
#include "comm.h"
#include "matmul.h"
#include "residual.h"
#include "seq_layout.h"
#include "model_config.h"

typedef enum { DROP_PROBS, DROP_POSITION } DropPolicy;

// The training options of the MoE layers (the shape, E, k, every and the scores, is in the model).
typedef struct {
    int cap1000;          // capacity factor x 1000; 0 = dropless
    DropPolicy policy;
    float aux_coeff, z_coeff;
    float bias_rate;      // loss-free balancing: the routing bias's step u (0: off)
} MoEOptions;

// Assignments one expert keeps from one sequence of T tokens (0 < cap <= T).
static int moe_capacity(int k, int T, int E, int cap1000) {
    if (cap1000 == 0) { return T; }
    long long c = ((long long)k * T * cap1000 + 1000LL * E - 1) / (1000LL * E);
    return c < T ? (int)c : T;
}

// ----------------------------------------------------------------------------
// CPU loops: the specification
// Where a kernel computes what its loop does in the same order, the loop's body is one __host__ __device__
// function of the thread's indices (token t, expert e, ...): the loop runs it for every index, the kernel
// for its thread's.

// Row t of probs (N, E) holds the token's logits and becomes their scores: softmax, or (sigmoid) each
// logit's sigmoid; lse[t] = their logsumexp.
#ifdef USE_CUDA
__host__ __device__
#endif
static inline void moe_scores_body(int t, float *probs, float *lse, int E, int sigmoid) {
    float *p = probs + (size_t)t * E, m = -INFINITY, s = 0.0f;
    for (int e = 0; e < E; e++) { if (p[e] > m) { m = p[e]; } }
    for (int e = 0; e < E; e++) { s += expf(p[e] - m); }
    for (int e = 0; e < E; e++) { p[e] = sigmoid ? 1.0f / (1.0f + expf(-p[e])) : expf(p[e] - m) / s; }
    lse[t] = m + logf(s);
}

// x (N, C), wr (E, C) -> probs (N, E) = the scores of x wr^T, lse (N). Each logit is one dot product in
// channel order, so a token's routing does not depend on the other tokens of the batch.
static void moe_router_forward_cpu(float *probs, float *lse, const float *x, const float *wr, int N, int C, int E,
                                   int sigmoid) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float *p = probs + (size_t)t * E;
        for (int e = 0; e < E; e++) {
            float z = 0.0f;
            for (int c = 0; c < C; c++) { z += x[(size_t)t * C + c] * wr[(size_t)e * C + c]; }
            p[e] = z;
        }
        moe_scores_body(t, probs, lse, E, sigmoid);
    }
}

// probs (N, E), bias (E) -> choice (N, k): the k largest keys p_e + b_e in order, ties to the lower index;
// cprob (N, k) their scores p_e (unbiased); gate (N, k). One pass over the experts keeps the k best so far in
// order (gate holds their keys meanwhile). Keys with a NaN have no order: then k passes, pass j choosing the
// first free expert unless a later one's key is strictly larger (the one pass's choice where there is no NaN).
#ifdef USE_CUDA
__host__ __device__
#endif
static inline void moe_topk_body(int t, int *choice, float *cprob, float *gate, const float *probs, const float *bias,
                                 int E, int k, int norm) {
    const float *p = probs + (size_t)t * E;
    int *ch = choice + (size_t)t * k, n = 0, nan = 0;
    float *key = gate + (size_t)t * k;
    for (int e = 0; e < E; e++) { float x = p[e] + bias[e]; nan |= x != x; }
    for (int e = 0; e < E && !nan; e++) {
        float x = p[e] + bias[e];
        if (n == k && !(x > key[k - 1])) { continue; }   // not above the k-th: an equal key keeps the lower index
        int i = n < k ? n++ : k - 1;                      // (k kept already: the k-th drops out)
        for (; i > 0 && x > key[i - 1]; i--) { key[i] = key[i - 1]; ch[i] = ch[i - 1]; }
        key[i] = x;
        ch[i] = e;
    }
    unsigned int taken[(MOE_MAX_EXPERTS + 31) / 32] = {0};   // (NaN: bit e, expert e chosen)
    for (int j = 0; j < k && nan; j++) {
        int best = -1;
        float key_best = 0.0f;
        for (int e = 0; e < E; e++) {
            float x = p[e] + bias[e];
            int free = !(taken[e / 32] >> (e % 32) & 1u);
            if (free && (best < 0 || x > key_best)) { best = e; key_best = x; }
        }
        taken[best / 32] |= 1u << (best % 32);
        ch[j] = best;
    }
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        cprob[(size_t)t * k + j] = p[ch[j]];
        sum += p[ch[j]];
    }
    for (int j = 0; j < k; j++) { gate[(size_t)t * k + j] = k == 1 || !norm ? p[ch[j]] : p[ch[j]] / sum; }
}
static void moe_topk_cpu(int *choice, float *cprob, float *gate, const float *probs, const float *bias, int N, int E,
                         int k, int norm) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) { moe_topk_body(t, choice, cprob, gate, probs, bias, E, k, norm); }
}

// Does assignment (t, j) come before (t2, j2) for their expert e? probs: higher p_e, then earlier t;
// position: lower choice rank j, then earlier t.
#ifdef USE_CUDA
__host__ __device__
#endif
static inline int moe_before(DropPolicy policy, float p, int t, int j, float p2, int t2, int j2) {
    if (policy == DROP_PROBS) { return p > p2 || (p == p2 && t < t2); }
    return j < j2 || (j == j2 && t < t2);
}

// keep (B*T, k) of this rank's T tokens of each of B sequences: 1 if assignment (t, j) is among the cap
// first of its expert in its WHOLE sequence (rank < cap), ordered by moe_before at the sequence positions.
// choice, cprob (S, B, T, k): the assignments (expert, its p) of the S parts of every sequence, part s2
// at positions seq_pos(seq_pos_of_rank(S, s2, T), t) (context parallelism: cp rank s2's tokens; S = 1:
// the whole sequence); this rank's part is `me`.
#ifdef USE_CUDA
__host__ __device__
#endif
static inline void moe_capacity_keep_body(int b, int t, int j, int *keep, const int *choice, const float *cprob, int S,
                                          int me, int B, int T, int k, int cap, DropPolicy policy) {
    size_t a = (((size_t)me * B + b) * T + t) * k + j;
    int e = choice[a], pos = seq_pos(seq_pos_of_rank(S, me, T), t), rank = 0;
    for (int s2 = 0; s2 < S; s2++) {
        SeqPos q = seq_pos_of_rank(S, s2, T);
        for (int t2 = 0; t2 < T; t2++) {
            for (int j2 = 0; j2 < k; j2++) {
                size_t a2 = (((size_t)s2 * B + b) * T + t2) * k + j2;
                if (choice[a2] != e) { continue; }
                rank += moe_before(policy, cprob[a2], seq_pos(q, t2), j2, cprob[a], pos, j);
            }
        }
    }
    keep[((size_t)b * T + t) * k + j] = rank < cap;
}
static void moe_capacity_keep_cpu(int *keep, const int *choice, const float *cprob, int S, int me, int B, int T, int k,
                                  int cap, DropPolicy policy) {
    #pragma omp parallel for
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int j = 0; j < k; j++) {
                moe_capacity_keep_body(b, t, j, keep, choice, cprob, S, me, B, T, k, cap, policy);
            }
        }
    }
}

// The sum of a token's scores that the aux loss divides them by: 1 for softmax (p sums to 1 already), the
// sum of the E sigmoids otherwise (DeepSeek-V3's normalised scores).
#ifdef USE_CUDA
__host__ __device__
#endif
static inline float moe_score_norm(const float *p, int E, int sigmoid) {
    float n = 0.0f;
    if (!sigmoid) { return 1.0f; }
    for (int e = 0; e < E; e++) { n += p[e]; }
    return n;
}

// Per sequence b of T tokens here, of Tg in all (context parallelism: the sequence's other tokens are on
// the other cp ranks, whose sums the caller adds): f (B, E) = top-k assignments to e (before drops) / (k Tg);
// pmean (B, E) = sum of p_e / (norm of the token's scores) / Tg; zsum (B) = sum over the tokens of lse^2.
static void moe_sequence_stats_cpu(float *f, float *pmean, float *zsum, const int *choice, const float *probs,
                                   const float *lse, int B, int T, int E, int k, int Tg, int sigmoid) {
    for (int b = 0; b < B; b++) {
        float *fb = f + (size_t)b * E, *pb = pmean + (size_t)b * E;
        float z = 0.0f;
        for (int e = 0; e < E; e++) { fb[e] = 0.0f; pb[e] = 0.0f; }
        for (int t = b * T; t < (b + 1) * T; t++) {
            const float *p = probs + (size_t)t * E;
            float norm = moe_score_norm(p, E, sigmoid);
            for (int j = 0; j < k; j++) { fb[choice[(size_t)t * k + j]] += 1.0f; }
            for (int e = 0; e < E; e++) { pb[e] += p[e] / norm; }
            z += lse[t] * lse[t];
        }
        for (int e = 0; e < E; e++) { fb[e] /= (float)(k * Tg); pb[e] /= (float)Tg; }
        zsum[b] = z;
    }
}

// The auxiliary losses' numbers of B sequences added to sums (2, fp64): sums[0] += E sum_e f[b][e] pmean[b][e]
// for each sequence (its aux loss before the coefficient), sums[1] += zsum[b] (its z loss's), in this
// order. The GPU runs this loop in one thread (B*E products): the step's numbers stay on the device
// until its log reads them, once.
#ifdef USE_CUDA
__host__ __device__
#endif
static inline void moe_loss_sums_body(double *sums, const float *f, const float *pmean, const float *zsum, int B,
                                      int E) {
    for (int b = 0; b < B; b++) {
        double aux = 0.0;
        for (int e = 0; e < E; e++) { aux += (double)f[(size_t)b * E + e] * pmean[(size_t)b * E + e]; }
        sums[0] += E * aux;
        sums[1] += zsum[b];
    }
}

// load (E) += the top-k assignments (before drops) of N tokens to each expert (loss-free balancing, the log).
static void moe_load_count_cpu(int *load, const int *choice, int N, int k) {
    for (size_t i = 0; i < (size_t)N * k; i++) { load[choice[i]]++; }
}

// Loss-free balancing's update of one MoE layer's bias (E) from its load (E) over the global batch, unless the
// step's update was skipped (*scale == 0: gpt2_update's clip scale).
#ifdef USE_CUDA
__host__ __device__
#endif
static inline void moe_bias_update_body(int e, float *bias, const int *load, int E, float rate, const float *scale) {
    if (*scale == 0.0f) { return; }
    long long total = 0;
    for (int i = 0; i < E; i++) { total += load[i]; }
    long long d = (long long)E * load[e] - total;
    bias[e] -= rate * (float)((d > 0) - (d < 0));
}
static void moe_bias_update_cpu(float *bias, const int *load, int nlayers, int E, float rate, const float *scale) {
    for (int l = 0; l < nlayers; l++) {
        for (int e = 0; e < E; e++) { moe_bias_update_body(e, bias + (size_t)l * E, load + (size_t)l * E, E, rate, scale); }
    }
}

// The router's backward to its logits, dlogits (N, E), from: dgate (N, k) (the gates' gradient, summed
// over tp), and the two auxiliary losses, aux_scale = aux_coeff E / (T * sequences in the global batch)
// times f (B, E) per token of sequence b, z_scale = z_coeff / (tokens in the global batch):
//   aux -> p:     softmax: dp_e = aux_scale f[b][e]; sigmoid (P of p' = p / S_all, S_all = sum_i p_i):
//                 a_e = aux_scale f[b][e], dp_e = (a_e - sum_i a_i p_i / S_all) / S_all
//   gates -> p:   k = 1 (or not renormalised): dp_{e_j} += dg_j;  k > 1: g_j = p_j / S, dp_{e_j} += (dg_j - sum_i dg_i
//                 g_i) / S
//   softmax:      dlogit_e = p_e (dp_e - sum_i p_i dp_i), then z: dlogit_e += z_scale 2 lse p_e
//   sigmoid:      dlogit_e = p_e (1 - p_e) dp_e (z_scale is 0)
#ifdef USE_CUDA
__host__ __device__
#endif
static inline void moe_router_backward_body(int t, float *dlogits, const float *dgate, const float *gate,
                                            const int *choice, const float *probs, const float *lse, const float *f,
                                            int T, int E, int k, float aux_scale, float z_scale, int sigmoid,
                                            int norm) {
    const float *p = probs + (size_t)t * E, *dg = dgate + (size_t)t * k, *g = gate + (size_t)t * k;
    const int *ch = choice + (size_t)t * k;
    float *dl = dlogits + (size_t)t * E;   // holds dp first, then the logits' gradient
    for (int e = 0; e < E; e++) { dl[e] = aux_scale * f[(size_t)(t / T) * E + e]; }
    if (sigmoid) {
        float S_all = moe_score_norm(p, E, 1), dot = 0.0f;
        for (int e = 0; e < E; e++) { dot += dl[e] * p[e]; }
        for (int e = 0; e < E; e++) { dl[e] = (dl[e] - dot / S_all) / S_all; }
    }
    if (k == 1 || !norm) {   // (the gates are the scores themselves)
        for (int j = 0; j < k; j++) { dl[ch[j]] += dg[j]; }
    } else {
        float S = 0.0f, dot = 0.0f;
        for (int j = 0; j < k; j++) { S += p[ch[j]]; dot += dg[j] * g[j]; }
        for (int j = 0; j < k; j++) { dl[ch[j]] += (dg[j] - dot) / S; }
    }
    if (sigmoid) {
        for (int e = 0; e < E; e++) { dl[e] = p[e] * (1.0f - p[e]) * dl[e]; }
        return;
    }
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) { pdp += p[e] * dl[e]; }
    for (int e = 0; e < E; e++) { dl[e] = p[e] * (dl[e] - pdp) + z_scale * 2.0f * lse[t] * p[e]; }
}
static void moe_router_backward_cpu(float *dlogits, const float *dgate, const float *gate, const int *choice,
                                    const float *probs, const float *lse, const float *f, int T, int N, int E, int k,
                                    float aux_scale, float z_scale, int sigmoid, int norm) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        moe_router_backward_body(t, dlogits, dgate, gate, choice, probs, lse, f, T, E, k, aux_scale, z_scale, sigmoid,
                                 norm);
    }
}

// dwr (E, C) += dlogits^T x, tokens summed in order.
static void moe_router_dweight_cpu(float *dwr, const float *dlogits, const float *x, int N, int C, int E) {
    #pragma omp parallel for
    for (int e = 0; e < E; e++) {
        for (int c = 0; c < C; c++) {
            float s = 0.0f;
            for (int t = 0; t < N; t++) { s += dlogits[(size_t)t * E + e] * x[(size_t)t * C + c]; }
            dwr[(size_t)e * C + c] += s;
        }
    }
}

// dx (N, C) += dlogits wr.
static void moe_router_dinput_cpu(float *dx, const float *dlogits, const float *wr, int N, int C, int E) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        for (int c = 0; c < C; c++) {
            float s = 0.0f;
            for (int e = 0; e < E; e++) { s += dlogits[(size_t)t * E + e] * wr[(size_t)e * C + c]; }
            dx[(size_t)t * C + c] += s;
        }
    }
}

// Qwen2-MoE's shared-expert gate: g[t] = sigmoid(x_t . w) (fp32), y[t] *= g[t]. x (N, C): the MLP's input, all
// tokens (the same on every tp rank); w (C); y (N, C): the shared experts' output (partial over tp: each part scaled
// alike). Its backward: ds (N, C) = g dy, the shared experts' output gradient; dlogit[t] = (dy_t . s_t) g (1 - g) with
// s the unscaled output (partial over tp: the caller sums dlogit over tp), then w's and x's gradients as a router's
// of one expert (moe_router_dweight, moe_router_dinput with E = 1).
static void moe_shared_gate_forward_cpu(float *g, float *y, const float *x, const float *w, int N, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float z = 0.0f;
        for (int c = 0; c < C; c++) { z += x[(size_t)t * C + c] * w[c]; }
        g[t] = 1.0f / (1.0f + expf(-z));
        for (int c = 0; c < C; c++) { y[(size_t)t * C + c] *= g[t]; }
    }
}
static void moe_shared_gate_backward_cpu(float *dlogit, float *ds, const float *dy, const float *s, const float *g,
                                         int N, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float dg = 0.0f;
        for (int c = 0; c < C; c++) {
            dg += dy[(size_t)t * C + c] * s[(size_t)t * C + c];
            ds[(size_t)t * C + c] = g[t] * dy[(size_t)t * C + c];
        }
        dlogit[t] = dg * g[t] * (1.0f - g[t]);
    }
}

// ----------------------------------------------------------------------------
// CUDA kernels, one per loop above

#ifdef USE_CUDA
// one warp per token: each logit a warp-reduced dot product, then the softmax in lane 0's registers
__global__ void moe_router_forward_kernel(float *probs, float *lse, const floatX *x, const floatX *wr, int N, int C,
                                          int E, int sigmoid) {
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= N) { return; }
    float *p = probs + (size_t)t * E;
    for (int e = 0; e < E; e++) {
        float z = 0.0f;
        for (int c = lane; c < C; c += 32) { z += (float)x[(size_t)t * C + c] * (float)wr[(size_t)e * C + c]; }
        z = warp_reduce_sum(z);
        if (lane == 0) { p[e] = z; }
    }
    __syncwarp();
    if (lane == 0) { moe_scores_body(t, probs, lse, E, sigmoid); }
}

__global__ void moe_topk_kernel(int *choice, float *cprob, float *gate, const float *probs, const float *bias, int N,
                                int E, int k, int norm) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < N) { moe_topk_body(t, choice, cprob, gate, probs, bias, E, k, norm); }
}

// one thread per assignment: the counts are integers, so the order of the atomic adds does not matter
__global__ void moe_load_count_kernel(int *load, const int *choice, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        atomicAdd(load + choice[i], 1);
    }
}

// grid (nlayers), one thread per expert
__global__ void moe_bias_update_kernel(float *bias, const int *load, int E, float rate, const float *scale) {
    size_t l = blockIdx.x;
    for (int e = threadIdx.x; e < E; e += blockDim.x) { moe_bias_update_body(e, bias + l * E, load + l * E, E, rate, scale); }
}

// grid (B), block 256: each thread ranks the assignments of its tokens against the whole sequence (all S parts)
__global__ void moe_capacity_keep_kernel(int *keep, const int *choice, const float *cprob, int S, int me, int B, int T,
                                         int k, int cap, DropPolicy policy) {
    int b = blockIdx.x;
    for (int i = threadIdx.x; i < T * k; i += blockDim.x) {
        moe_capacity_keep_body(b, i / k, i % k, keep, choice, cprob, S, me, B, T, k, cap, policy);
    }
}

__global__ void moe_loss_sums_kernel(double *sums, const float *f, const float *pmean, const float *zsum, int B,
                                     int E) {
    moe_loss_sums_body(sums, f, pmean, zsum, B, E);
}

// grid (B), one thread per expert
__global__ void moe_sequence_stats_kernel(float *f, float *pmean, float *zsum, const int *choice, const float *probs,
                                          const float *lse, int T, int E, int k, int Tg, int sigmoid) {
    int b = blockIdx.x;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float n = 0.0f, ps = 0.0f;
        for (int t = b * T; t < (b + 1) * T; t++) {
            const float *p = probs + (size_t)t * E;
            for (int j = 0; j < k; j++) { n += choice[(size_t)t * k + j] == e ? 1.0f : 0.0f; }
            ps += p[e] / moe_score_norm(p, E, sigmoid);
        }
        f[(size_t)b * E + e] = n / (float)(k * Tg);
        pmean[(size_t)b * E + e] = ps / (float)Tg;
    }
    if (threadIdx.x == 0) {
        float z = 0.0f;
        for (int t = b * T; t < (b + 1) * T; t++) { z += lse[t] * lse[t]; }
        zsum[b] = z;
    }
}

__global__ void moe_router_backward_kernel(float *dlogits, const float *dgate, const float *gate, const int *choice,
                                           const float *probs, const float *lse, const float *f, int T, int N, int E,
                                           int k, float aux_scale, float z_scale, int sigmoid, int norm) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < N) {
        moe_router_backward_body(t, dlogits, dgate, gate, choice, probs, lse, f, T, E, k, aux_scale, z_scale, sigmoid,
                                 norm);
    }
}

// grid (E, ceil(C / 32)), block (32, 32): a 32-channel slice of row e, tokens strided over threadIdx.y
// and the 32 partial sums added in a fixed order
__global__ void moe_router_dweight_kernel(floatX *dwr, const float *dlogits, const floatX *x, int N, int C, int E) {
    __shared__ float part[32][33];
    int e = blockIdx.x, c = blockIdx.y * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < C) { for (int t = threadIdx.y; t < N; t += 32) { s += dlogits[(size_t)t * E + e] * (float)x[(size_t)t * C + c]; } }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float sum = 0.0f;
        for (int r = 0; r < 32; r++) { sum += part[r][threadIdx.x]; }
        dwr[(size_t)e * C + c] = (floatX)((float)dwr[(size_t)e * C + c] + sum);
    }
}

__global__ void moe_router_dinput_kernel(floatX *dx, const float *dlogits, const floatX *wr, int N, int C, int E) {
    size_t total = (size_t)N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / C, c = i % C;
        float s = 0.0f;
        for (int e = 0; e < E; e++) { s += dlogits[t * E + e] * (float)wr[(size_t)e * C + c]; }
        dx[i] = (floatX)((float)dx[i] + s);
    }
}
// one warp per token: the shared-expert gate's forward and backward (the loops above)
__global__ void moe_shared_gate_forward_kernel(float *g, floatX *y, const floatX *x, const floatX *w, int N, int C) {
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= N) { return; }
    float z = 0.0f;
    for (int c = lane; c < C; c += 32) { z += (float)x[(size_t)t * C + c] * (float)w[c]; }
    float gt = 1.0f / (1.0f + expf(-warp_reduce_sum(z)));
    for (int c = lane; c < C; c += 32) { y[(size_t)t * C + c] = (floatX)((float)y[(size_t)t * C + c] * gt); }
    if (lane == 0) { g[t] = gt; }
}
__global__ void moe_shared_gate_backward_kernel(float *dlogit, floatX *ds, const floatX *dy, const floatX *s,
                                                const float *g, int N, int C) {
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= N) { return; }
    float dg = 0.0f, gt = g[t];
    for (int c = lane; c < C; c += 32) {
        dg += (float)dy[(size_t)t * C + c] * (float)s[(size_t)t * C + c];
        ds[(size_t)t * C + c] = (floatX)(gt * (float)dy[(size_t)t * C + c]);
    }
    dg = warp_reduce_sum(dg);
    if (lane == 0) { dlogit[t] = dg * gt * (1.0f - gt); }
}

#endif

#ifndef USE_CUDA
// The CPU build's router through BLAS: the loops above are the specification (dev/cuda/moe.cu holds the CUDA
// kernels to them); these are the same sums in BLAS's order (a routing decision's margin is compared above
// 1e-5: test_gpt), three sgemm calls instead of scalar loops (a fifth of a fine-grained E 64 step).
// x (N, C), wr (E, C) -> the logits (N, E) into probs, then each token's scores and lse
static void moe_router_forward_blas(float *probs, float *lse, const float *x, const float *wr, int N, int C, int E,
                                    int sigmoid) {
    if (N <= 0) { return; }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, E, C, 1.0f, x, C, wr, C, 0.0f, probs, E);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) { moe_scores_body(t, probs, lse, E, sigmoid); }
}
// dwr (E, C) += dlogits^T x
static void moe_router_dweight_blas(float *dwr, const float *dlogits, const float *x, int N, int C, int E) {
    if (N <= 0) { return; }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, E, C, N, 1.0f, dlogits, E, x, C, 1.0f, dwr, C);
}
// dx (N, C) += dlogits wr
static void moe_router_dinput_blas(float *dx, const float *dlogits, const float *wr, int N, int C, int E) {
    if (N <= 0) { return; }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, E, 1.0f, dlogits, E, wr, C, 1.0f, dx, C);
}

// The capacity keep masks by sorting: per sequence and expert, its assignments (every cp rank's) in
// moe_before's order, a strict total order (an expert is chosen once per token: (p, position) and (j, position)
// are unique), so an assignment's index there is moe_capacity_keep_body's rank: the same masks in O(T k log)
// per sequence instead of O((T k)^2).
typedef struct { float p; int pos, j, local; } MoEAssignment;   // local: its row (t k + j) here, or -1
static DropPolicy moe_sort_policy;
static int moe_assignment_order(const void *x, const void *y) {
    const MoEAssignment *a = (const MoEAssignment *)x, *b = (const MoEAssignment *)y;
    return moe_before(moe_sort_policy, a->p, a->pos, a->j, b->p, b->pos, b->j) ? -1
           : moe_before(moe_sort_policy, b->p, b->pos, b->j, a->p, a->pos, a->j) ? 1 : 0;
}
static void moe_capacity_keep_sorted(int *keep, const int *choice, const float *cprob, int S, int me, int B, int T,
                                     int k, int E, int cap, DropPolicy policy) {
    if (cap >= S * T) {   // (an expert meets each token at most once: at most S T assignments per sequence)
        for (size_t i = 0; i < (size_t)B * T * k; i++) { keep[i] = 1; }
        return;
    }
    moe_sort_policy = policy;
    #pragma omp parallel
    {
        MoEAssignment *all = (MoEAssignment *)malloc_check(sizeof(MoEAssignment) * (size_t)S * T * k);
        int *start = (int *)malloc_check(sizeof(int) * (E + 1)), *fill = (int *)malloc_check(sizeof(int) * E);
        #pragma omp for
        for (int b = 0; b < B; b++) {
            for (int e = 0; e <= E; e++) { start[e] = 0; }
            for (int s2 = 0; s2 < S; s2++) {   // counts per expert, then each expert's range
                for (int i = 0; i < T * k; i++) { start[choice[((size_t)s2 * B + b) * T * k + i] + 1]++; }
            }
            for (int e = 0; e < E; e++) { start[e + 1] += start[e]; fill[e] = start[e]; }
            for (int s2 = 0; s2 < S; s2++) {
                SeqPos q = seq_pos_of_rank(S, s2, T);
                for (int t2 = 0; t2 < T; t2++) {
                    for (int j2 = 0; j2 < k; j2++) {
                        size_t a2 = (((size_t)s2 * B + b) * T + t2) * k + j2;
                        all[fill[choice[a2]]++] = (MoEAssignment){cprob[a2], seq_pos(q, t2), j2, s2 == me ? t2 * k + j2 : -1};
                    }
                }
            }
            for (int e = 0; e < E; e++) {
                qsort(all + start[e], start[e + 1] - start[e], sizeof(MoEAssignment), moe_assignment_order);
                for (int i = start[e]; i < start[e + 1]; i++) {
                    if (all[i].local >= 0) { keep[(size_t)b * T * k + all[i].local] = i - start[e] < cap; }
                }
            }
        }
        free(all); free(start); free(fill);
    }
}
#endif

// ----------------------------------------------------------------------------
// launchers: one signature for both backends

static void moe_router_forward(float *probs, float *lse, const floatX *x, const floatX *wr, int N, int C, int E,
                               int sigmoid) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_router_forward_kernel, ceil_div(N, 8), 256, 0, main_stream)(probs, lse, x, wr, N, C, E, sigmoid);
    cudaCheckLaunch();
#else
    moe_router_forward_blas(probs, lse, x, wr, N, C, E, sigmoid);
#endif
}

static void moe_topk(int *choice, float *cprob, float *gate, const float *probs, const float *bias, int N, int E,
                     int k, int norm) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_topk_kernel, ceil_div(N, 256), 256, 0, main_stream)(choice, cprob, gate, probs, bias, N, E, k, norm);
    cudaCheckLaunch();
#else
    moe_topk_cpu(choice, cprob, gate, probs, bias, N, E, k, norm);
#endif
}

// load (E, device) += the top-k assignments of N tokens to each expert
static void moe_load_count(int *load, const int *choice, int N, int k) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_load_count_kernel, elementwise_grid((size_t)N * k, 256), 256, 0, main_stream)(load, choice, (size_t)N * k);
    cudaCheckLaunch();
#else
    moe_load_count_cpu(load, choice, N, k);
#endif
}

// bias (nlayers, E) from load (nlayers, E), on the device; scale: the step's clip scale (device)
static void moe_bias_update(float *bias, const int *load, int nlayers, int E, float rate, const float *scale) {
#ifdef USE_CUDA
    if (nlayers <= 0) { return; }
    LAUNCH(moe_bias_update_kernel, nlayers, 256, 0, main_stream)(bias, load, E, rate, scale);
    cudaCheckLaunch();
#else
    moe_bias_update_cpu(bias, load, nlayers, E, rate, scale);
#endif
}

static void moe_capacity_keep(int *keep, const int *choice, const float *cprob, int S, int me, int B, int T, int k,
                              int E, int cap, DropPolicy policy) {
#ifdef USE_CUDA
    (void)E;
    if (B <= 0) { return; }
    LAUNCH(moe_capacity_keep_kernel, B, 256, 0, main_stream)(keep, choice, cprob, S, me, B, T, k, cap, policy);
    cudaCheckLaunch();
#else
    moe_capacity_keep_sorted(keep, choice, cprob, S, me, B, T, k, E, cap, policy);
#endif
}

static void moe_sequence_stats(float *f, float *pmean, float *zsum, const int *choice, const float *probs,
                               const float *lse, int B, int T, int E, int k, int Tg, int sigmoid) {
#ifdef USE_CUDA
    if (B <= 0) { return; }
    LAUNCH(moe_sequence_stats_kernel, B, 32, 0, main_stream)(f, pmean, zsum, choice, probs, lse, T, E, k, Tg, sigmoid);
    cudaCheckLaunch();
#else
    moe_sequence_stats_cpu(f, pmean, zsum, choice, probs, lse, B, T, E, k, Tg, sigmoid);
#endif
}

static void moe_loss_sums(double *sums, const float *f, const float *pmean, const float *zsum, int B, int E) {
#ifdef USE_CUDA
    LAUNCH(moe_loss_sums_kernel, 1, 1, 0, main_stream)(sums, f, pmean, zsum, B, E);
    cudaCheckLaunch();
#else
    moe_loss_sums_body(sums, f, pmean, zsum, B, E);
#endif
}

static void moe_router_backward(float *dlogits, const float *dgate, const float *gate, const int *choice,
                                const float *probs, const float *lse, const float *f, int T, int N, int E, int k,
                                float aux_scale, float z_scale, int sigmoid, int norm) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_router_backward_kernel, ceil_div(N, 128), 128, 0, main_stream)(dlogits, dgate, gate, choice, probs, lse, f,
                                                                          T, N, E, k, aux_scale, z_scale, sigmoid, norm);
    cudaCheckLaunch();
#else
    moe_router_backward_cpu(dlogits, dgate, gate, choice, probs, lse, f, T, N, E, k, aux_scale, z_scale, sigmoid, norm);
#endif
}

static void moe_router_dweight(floatX *dwr, const float *dlogits, const floatX *x, int N, int C, int E) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_router_dweight_kernel, dim3(E, ceil_div(C, 32)), dim3(32, 32), 0, main_stream)(dwr, dlogits, x, N, C, E);
    cudaCheckLaunch();
#else
    moe_router_dweight_blas(dwr, dlogits, x, N, C, E);
#endif
}

static void moe_router_dinput(floatX *dx, const float *dlogits, const floatX *wr, int N, int C, int E) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_router_dinput_kernel, elementwise_grid((size_t)N * C, 256), 256, 0, main_stream)(dx, dlogits, wr, N, C, E);
    cudaCheckLaunch();
#else
    moe_router_dinput_blas(dx, dlogits, wr, N, C, E);
#endif
}

static void moe_shared_gate_forward(float *g, floatX *y, const floatX *x, const floatX *w, int N, int C) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_shared_gate_forward_kernel, ceil_div(N, 8), 256, 0, main_stream)(g, y, x, w, N, C);
    cudaCheckLaunch();
#else
    moe_shared_gate_forward_cpu(g, y, x, w, N, C);
#endif
}

static void moe_shared_gate_backward(float *dlogit, floatX *ds, const floatX *dy, const floatX *s, const float *g,
                                     int N, int C) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_shared_gate_backward_kernel, ceil_div(N, 8), 256, 0, main_stream)(dlogit, ds, dy, s, g, N, C);
    cudaCheckLaunch();
#else
    moe_shared_gate_backward_cpu(dlogit, ds, dy, s, g, N, C);
#endif
}

#endif
