// Fused, chunked, vocab-parallel LM head + softmax cross-entropy.
// The (B*T, Vp) logits never exist: tokens are processed in chunks of n; for each chunk
//   logits (n, Vl) = h_chunk @ wte_local^T            this tp rank's vocab rows [v0, v0 + Vl)
//   per token: local max, local sum-exp, target logit  -> one all-gather over tp of (n, 3) floats
//              (the logits become exp(z - local max) in place: one exp per logit in all)
//   loss = log(sum-exp) + max - target logit           (global, identical on every tp rank)
//   dlogits = (softmax - onehot) * dloss, written over the logits in place
//   dh_chunk (n, C) = dlogits @ wte_local   (a partial sum: the caller reduces it over tp)
//   dwte_local += dlogits^T @ h_chunk
// Padded vocab columns (>= V) never enter the softmax and get zero gradient.
#ifndef LLMC_FUSED_CE_H
#define LLMC_FUSED_CE_H

#include "backend.h"
#include "comm.h"
#include "matmul.h"

// logits (n, Vl) -> stats (n, 3): [local max m, sum exp(z - m), target logit or 0]; the logits are
// overwritten with exp(z - m), so that the second pass needs no exp (padding columns: 0).
static void ce_stats_cpu(float *stats, float *logits, const int *targets, int v0, int V, int n, int Vl) {
    int valid = V - v0 < Vl ? V - v0 : Vl;   // columns of real tokens on this rank (may be <= 0)
    #pragma omp parallel for
    for (int i = 0; i < n; i++) {
        float *z = logits + (size_t)i * Vl;
        float m = -INFINITY, s = 0.0f, zt = 0.0f;
        int t = targets[i] - v0;
        if (t >= 0 && t < valid) { zt = z[t]; }
        for (int j = 0; j < valid; j++) { if (z[j] > m) { m = z[j]; } }
        for (int j = 0; j < valid; j++) { z[j] = expf(z[j] - m); s += z[j]; }
        for (int j = valid > 0 ? valid : 0; j < Vl; j++) { z[j] = 0.0f; }
        stats[3 * i + 0] = m;
        stats[3 * i + 1] = s;
        stats[3 * i + 2] = zt;
    }
}

// stats_all (tp, n, 3) from every tp rank -> losses (n). If write_dlogits: e = exp(z - m_local) in
// logits becomes dlogits = (e * exp(m_local - M) / S - onehot) * dloss, M and S the global max and sum.
static void ce_loss_dlogits_cpu(float *logits, float *losses, const float *stats_all, const int *targets,
                                int v0, int n, int Vl, int tp, int tp_rank, float dloss, int write_dlogits) {
    #pragma omp parallel for
    for (int i = 0; i < n; i++) {
        float M = -INFINITY;
        for (int r = 0; r < tp; r++) { float m = stats_all[((size_t)r * n + i) * 3]; if (m > M) { M = m; } }
        float S = 0.0f, zt = 0.0f;
        for (int r = 0; r < tp; r++) {
            const float *st = stats_all + ((size_t)r * n + i) * 3;
            if (st[1] > 0.0f) { S += st[1] * expf(st[0] - M); }
            zt += st[2];
        }
        losses[i] = logf(S) + M - zt;
        if (!write_dlogits) { continue; }
        float *e = logits + (size_t)i * Vl;
        float mine = stats_all[((size_t)tp_rank * n + i) * 3];
        float scale = mine > -INFINITY ? expf(mine - M) / S : 0.0f;
        int t = targets[i] - v0;
        for (int j = 0; j < Vl; j++) { e[j] = (e[j] * scale - (j == t ? 1.0f : 0.0f)) * dloss; }
    }
}

#ifdef USE_CUDA
// One block per token row i: logits (n, Vl) -> stats (n, 3) = [local max m, sum exp(z - m), target
// logit or 0] over the valid columns j < V - v0; the row becomes e = exp(z - m) in place (padding
// columns 0). Fixed-shape block reductions (deterministic).
__global__ void ce_stats_kernel(float *stats, floatX *logits, const int *targets, int v0, int V, int n, int Vl) {
    int i = blockIdx.x;
    int valid = V - v0 < Vl ? V - v0 : Vl;
    floatX *z = logits + (size_t)i * Vl;
    int t = targets[i] - v0;
    float zt = (t >= 0 && t < valid) ? (float)z[t] : 0.0f;   // read by every thread before any write
    float m = -INFINITY;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) { m = fmaxf(m, (float)z[j]); }
    m = block_reduce_max(m);                                  // (its __syncthreads also orders zt before the writes)
    float s = 0.0f;
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        float e = 0.0f;
        if (j < valid) { e = expf((float)z[j] - m); s += e; }
        z[j] = (floatX)e;
    }
    s = block_reduce_sum(s);
    if (threadIdx.x == 0) {
        stats[3 * i + 0] = m;
        stats[3 * i + 1] = s;
        stats[3 * i + 2] = zt;
    }
}

// One block per token row i: global max M and sum S from the tp ranks' stats (in rank order), the
// loss, and optionally e = exp(z - m_local) -> dlogits = (e exp(m_local - M) / S - onehot) * dloss.
__global__ void ce_loss_dlogits_kernel(floatX *logits, float *losses, const float *stats_all, const int *targets,
                                       int v0, int n, int Vl, int tp, int tp_rank, float dloss, int write_dlogits) {
    int i = blockIdx.x;
    float M = -INFINITY;
    for (int r = 0; r < tp; r++) { M = fmaxf(M, stats_all[((size_t)r * n + i) * 3]); }
    float S = 0.0f, zt = 0.0f;
    for (int r = 0; r < tp; r++) {
        const float *st = stats_all + ((size_t)r * n + i) * 3;
        if (st[1] > 0.0f) { S += st[1] * expf(st[0] - M); }
        zt += st[2];
    }
    if (threadIdx.x == 0) { losses[i] = logf(S) + M - zt; }
    if (!write_dlogits) { return; }
    floatX *e = logits + (size_t)i * Vl;
    float mine = stats_all[((size_t)tp_rank * n + i) * 3];
    float scale = mine > -INFINITY ? expf(mine - M) / S : 0.0f;
    int t = targets[i] - v0;
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        e[j] = (floatX)(((float)e[j] * scale - (j == t ? 1.0f : 0.0f)) * dloss);
    }
}

static void ce_stats_cuda(float *stats, floatX *logits, const int *targets, int v0, int V, int n, int Vl) {
    if (n <= 0) { return; }
    ce_stats_kernel<<<n, 1024, 0, main_stream>>>(stats, logits, targets, v0, V, n, Vl);
    cudaCheckLaunch();
}

static void ce_loss_dlogits_cuda(floatX *logits, float *losses, const float *stats_all, const int *targets,
                                 int v0, int n, int Vl, int tp, int tp_rank, float dloss, int write_dlogits) {
    if (n <= 0) { return; }
    ce_loss_dlogits_kernel<<<n, 1024, 0, main_stream>>>(logits, losses, stats_all, targets, v0, n, Vl, tp, tp_rank,
                                                         dloss, write_dlogits);
    cudaCheckLaunch();
}
#endif

static void ce_stats(float *stats, floatX *logits, const int *targets, int v0, int V, int n, int Vl) {
#ifdef USE_CUDA
    ce_stats_cuda(stats, logits, targets, v0, V, n, Vl);
#else
    ce_stats_cpu(stats, logits, targets, v0, V, n, Vl);
#endif
}

static void ce_loss_dlogits(floatX *logits, float *losses, const float *stats_all, const int *targets,
                            int v0, int n, int Vl, int tp, int tp_rank, float dloss, int write_dlogits) {
#ifdef USE_CUDA
    ce_loss_dlogits_cuda(logits, losses, stats_all, targets, v0, n, Vl, tp, tp_rank, dloss, write_dlogits);
#else
    ce_loss_dlogits_cpu(logits, losses, stats_all, targets, v0, n, Vl, tp, tp_rank, dloss, write_dlogits);
#endif
}

// ----------------------------------------------------------------------------
// the chunk loop (host code, shared by both backends)

typedef struct {
    int chunk;          // tokens per chunk
    floatX *logits;     // (chunk, Vl): the only logits buffer
    float *stats;       // (chunk, 3)
    float *stats_all;   // (tp, chunk, 3)
} CEBuffers;

// h (N, C): hidden states of all N tokens (the same on every tp rank); targets (N).
// losses (N) written. If dh != NULL (training): dh (N, C) written with this rank's partial
// gradient and dwte_local (Vl, C) accumulated. dloss = d(mean loss)/d(loss of one token).
static void fused_classifier(float *losses, floatX *dh, floatX *dwte_local, const floatX *h, const floatX *wte_local,
                             const int *targets, CEBuffers *buf, Group *tp_group, int v0, int V, int Vl,
                             int N, int C, float dloss) {
    int tp = tp_group->size;
    for (int c0 = 0; c0 < N; c0 += buf->chunk) {
        int n = N - c0 < buf->chunk ? N - c0 : buf->chunk;
        const floatX *hc = h + (size_t)c0 * C;
        matmul_forward(buf->logits, hc, wte_local, NULL, n, C, Vl);
        ce_stats(buf->stats, buf->logits, targets + c0, v0, V, n, Vl);
        // one collective per chunk: every rank's (max, sum-exp, target logit) for the n tokens
        comm_all_gather(tp_group, buf->stats, buf->stats_all, 3 * (size_t)n, DT_FLOAT, NULL);
        ce_loss_dlogits(buf->logits, losses + c0, buf->stats_all, targets + c0, v0, n, Vl, tp, tp_group->rank, dloss, dh != NULL);
        if (dh != NULL) {
            matmul_backward(dh + (size_t)c0 * C, dwte_local, NULL, buf->logits, hc, wte_local, n, C, Vl);
        }
    }
}

#endif
