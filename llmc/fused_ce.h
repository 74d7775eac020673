// Fused, chunked, vocab-parallel LM head + softmax cross-entropy.
// The (B*T, Vp) logits never exist: tokens are processed in chunks of n; for each chunk
//   logits (n, Vl) = h_chunk @ wte_local^T            this tp rank's vocab rows [v0, v0 + Vl)
//   per token: local max m, local sum exp(z - m), target logit  (one read of the logits)
//   tp > 1: one all-gather over tp of the (n, 3) stats; global M = max m, S = sum s exp(m - M)
//   loss = log S + M - target logit                   (global, identical on every tp rank)
//   dlogits = (exp(z - M) / S - onehot) * dloss, written over the logits in place (one read, one write)
//   dh_chunk (n, C) = dlogits @ wte_local   (a partial sum: the caller reduces it over tp)
//   dwte_local += dlogits^T @ h_chunk
// At tp = 1 the two passes are one kernel: each row is read from memory once (the second read hits
// the L2) and written once. Padded vocab columns (>= V) never enter the softmax and get zero gradient.
#ifndef LLMC_FUSED_CE_H
#define LLMC_FUSED_CE_H

#include "backend.h"
#include "comm.h"
#include "matmul.h"

// logits (n, Vl) -> stats (n, 3): [local max m, sum exp(z - m), target logit or 0] over the valid
// columns j < V - v0 (m = -inf, s = 0 where this rank holds none). The logits are only read.
static void ce_stats_cpu(float *stats, const float *logits, const int *targets, int v0, int V, int n, int Vl) {
    int valid = V - v0 < Vl ? V - v0 : Vl;   // columns of real tokens on this rank (may be <= 0)
    #pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * Vl;
        float m = -INFINITY, s = 0.0f, zt = 0.0f;
        int t = targets[i] - v0;
        if (t >= 0 && t < valid) { zt = z[t]; }
        #pragma omp simd reduction(max : m)
        for (int j = 0; j < valid; j++) { m = z[j] > m ? z[j] : m; }
        #pragma omp simd reduction(+ : s)
        for (int j = 0; j < valid; j++) { s += exp_poly(z[j] - m); }
        stats[3 * i + 0] = m;
        stats[3 * i + 1] = s;
        stats[3 * i + 2] = zt;
    }
}

// stats_all (tp, n, 3) from every tp rank -> losses (n). If write_dlogits: the logits z become
// dlogits = (exp(z - M) / S - onehot) * dloss, M and S the global max and sum; padding columns 0.
static void ce_loss_dlogits_cpu(float *logits, float *losses, const float *stats_all, const int *targets,
                                int v0, int V, int n, int Vl, int tp, float dloss, int write_dlogits) {
    int valid = V - v0 < Vl ? V - v0 : Vl;
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
        float *z = logits + (size_t)i * Vl, inv_S = 1.0f / S;
        int t = targets[i] - v0;
        float pt = t >= 0 && t < valid ? exp_poly(z[t] - M) * inv_S : 0.0f;
        #pragma omp simd
        for (int j = 0; j < valid; j++) { z[j] = exp_poly(z[j] - M) * inv_S * dloss; }
        for (int j = valid < 0 ? 0 : valid; j < Vl; j++) { z[j] = 0.0f; }
        if (t >= 0 && t < valid) { z[t] = (pt - 1.0f) * dloss; }
    }
}

// tp = 1, training: ce_stats_cpu then ce_loss_dlogits_cpu row by row, while the row is in the cache, and with one
// exp per logit: exp(z - m) is written over the logit as it is summed, then scaled. M = m and S = s here, so
// these are the two functions' numbers exactly (their loss, their dlogits), with one read of the logits
// from memory instead of two.
static void ce_fused_train_cpu(float *logits, float *losses, const int *targets, int V, int n, int Vl, float dloss) {
    int valid = V < Vl ? V : Vl;
    #pragma omp parallel for
    for (int i = 0; i < n; i++) {
        float *z = logits + (size_t)i * Vl;
        float m = -INFINITY, s = 0.0f, zt = 0.0f;
        int t = targets[i];
        if (t >= 0 && t < valid) { zt = z[t]; }
        #pragma omp simd reduction(max : m)
        for (int j = 0; j < valid; j++) { m = z[j] > m ? z[j] : m; }
        #pragma omp simd reduction(+ : s)
        for (int j = 0; j < valid; j++) { float e = exp_poly(z[j] - m); z[j] = e; s += e; }
        float S = s > 0.0f ? s : 0.0f, inv_S = 1.0f / S;   // (ce_loss_dlogits_cpu's S at tp = 1, NaN included)
        losses[i] = logf(S) + m - zt;
        float pt = t >= 0 && t < valid ? z[t] * inv_S : 0.0f;
        #pragma omp simd
        for (int j = 0; j < valid; j++) { z[j] = z[j] * inv_S * dloss; }
        for (int j = valid; j < Vl; j++) { z[j] = 0.0f; }
        if (t >= 0 && t < valid) { z[t] = (pt - 1.0f) * dloss; }
    }
}

#ifdef USE_CUDA
// One block of nt = ce_threads(Vl, W) threads per token row (CE_THREADS, fewer for a short row). Thread t reads
// the row in 16-byte vectors of W elements: columns W (t + k nt) .. + W - 1, k = 0, 1, ... (W = CE_VEC where the row length and the
// pointer allow, else 1). The thread bodies are functions of their indices, replayed on the CPU by
// dev/cuda/fused_ce_replay.cu; the block's max and sum are fixed-shape reductions (deterministic).
#define CE_THREADS 1024
#define CE_VEC ((int)(16 / sizeof(floatX)))
template <int W> struct alignas(W * sizeof(floatX)) CEVec { floatX x[W]; };

// threads per row: one vector of W each, in whole warps, at most CE_THREADS (a block of 1,024 threads on a row
// of 256 columns would leave 960 of them idle)
__host__ __device__ inline int ce_threads(int Vl, int W) {
    int t = ((Vl + W - 1) / W + 31) / 32 * 32;
    return t < 32 ? 32 : t > CE_THREADS ? CE_THREADS : t;
}

// the vector width for rows of Vl elements starting at logits
static int ce_vector_width(const floatX *logits, int Vl) {
    return Vl % CE_VEC == 0 && (uintptr_t)logits % 16 == 0 ? CE_VEC : 1;
}

// thread t's online softmax over its valid columns of row z: m its max, s = sum exp(z - m)
template <int W>
__host__ __device__ inline void ce_thread_stats(float *m_out, float *s_out, const floatX *z, int valid, int t, int nt) {
    float m = -INFINITY, s = 0.0f;
    for (int j0 = W * t; j0 < valid; j0 += W * nt) {
        CEVec<W> v = *(const CEVec<W> *)(z + j0);
        float vm = m;
        for (int k = 0; k < W; k++) { if (j0 + k < valid) { vm = fmaxf(vm, (float)v.x[k]); } }
        if (vm > m) { s *= expf(m - vm); m = vm; }   // rescale the running sum to the new max
        for (int k = 0; k < W; k++) { if (j0 + k < valid) { s += expf((float)v.x[k] - m); } }
    }
    *m_out = m;
    *s_out = s;
}

// thread t's columns of row z (all Vl, padding included) become (exp(z - M) inv_S - onehot[tcol]) dloss
template <int W>
__host__ __device__ inline void ce_thread_dlogits(floatX *z, int valid, int Vl, int tcol, float M, float inv_S,
                                                  float dloss, int t, int nt) {
    for (int j0 = W * t; j0 < Vl; j0 += W * nt) {
        CEVec<W> v = *(CEVec<W> *)(z + j0);
        for (int k = 0; k < W; k++) {
            int j = j0 + k;
            float p = j < valid ? expf((float)v.x[k] - M) * inv_S : 0.0f;
            v.x[k] = (floatX)((p - (j == tcol ? 1.0f : 0.0f)) * dloss);
        }
        *(CEVec<W> *)(z + j0) = v;
    }
}

// the row's max and sum over the block: every thread's (m, s) rescaled to the block max M
__device__ inline void ce_block_stats(float *M, float *S, float m, float s) {
    *M = block_reduce_max(m);
    *S = block_reduce_sum(m == -INFINITY ? 0.0f : s * expf(m - *M));
}

// logits (n, Vl) -> stats (n, 3), as ce_stats_cpu; the logits are only read
template <int W>
__global__ void ce_stats_kernel(float *stats, const floatX *logits, const int *targets, int v0, int V, int Vl) {
    int i = blockIdx.x, valid = V - v0 < Vl ? V - v0 : Vl, t = targets[i] - v0;
    const floatX *z = logits + (size_t)i * Vl;
    float m, s, M, S;
    ce_thread_stats<W>(&m, &s, z, valid, threadIdx.x, blockDim.x);
    ce_block_stats(&M, &S, m, s);
    if (threadIdx.x == 0) {
        stats[3 * i + 0] = M;
        stats[3 * i + 1] = S;
        stats[3 * i + 2] = t >= 0 && t < valid ? (float)z[t] : 0.0f;
    }
}

// row i's global max M and sum S from the tp ranks' stats (n, 3) each, in rank order, as ce_loss_dlogits_cpu:
// M = max_r m_r, S = sum_r s_r exp(m_r - M) over the ranks with s_r > 0 (a rank of padding only has m = -inf, s = 0),
// and the target logit zt = sum_r (the one rank holding the target wrote it, the others 0).
// A pointer walks the ranks and the loops are not unrolled: nvcc 13.0 (V13.0.88) unrolled the loop written as
// st = stats_all + (r n + i) 3, with st[0] read under if (st[1] > 0), by 4 and read the second and third copies' st[0]
// at st[1]'s address and the fourth's st[2] at st[3] (the next row's m: -inf on a rank of padding only), so at tp >= 4
// S and the loss were wrong on the GPU (an infinite loss, dev/cuda/fused_ce.cu's tp 4 case) and right under g++.
#ifdef __CUDA_ARCH__
#define CE_NO_UNROLL _Pragma("unroll 1")
#else
#define CE_NO_UNROLL   // (host code: the replay)
#endif
__host__ __device__ inline void ce_global_stats(float *M_out, float *S_out, float *zt_out, const float *stats_all,
                                                int i, int n, int tp) {
    const size_t stride = (size_t)n * 3;   // from one rank's (m, s, zt) of row i to the next rank's
    float M = -INFINITY, S = 0.0f, zt = 0.0f;
    const float *st = stats_all + (size_t)i * 3;
    CE_NO_UNROLL
    for (int r = 0; r < tp; r++, st += stride) { M = fmaxf(M, st[0]); }
    st = stats_all + (size_t)i * 3;
    CE_NO_UNROLL
    for (int r = 0; r < tp; r++, st += stride) {
        float m = st[0], s = st[1];
        if (s > 0.0f) { S += s * expf(m - M); }
        zt += st[2];
    }
    *M_out = M;
    *S_out = S;
    *zt_out = zt;
}

// the global max and sum from the tp ranks' stats (ce_global_stats), the loss, and optionally dlogits
template <int W>
__global__ void ce_loss_dlogits_kernel(floatX *logits, float *losses, const float *stats_all, const int *targets,
                                       int v0, int V, int n, int Vl, int tp, float dloss, int write_dlogits) {
    int i = blockIdx.x, valid = V - v0 < Vl ? V - v0 : Vl;
    float M, S, zt;
    ce_global_stats(&M, &S, &zt, stats_all, i, n, tp);
    if (threadIdx.x == 0) { losses[i] = logf(S) + M - zt; }
    if (write_dlogits) {
        ce_thread_dlogits<W>(logits + (size_t)i * Vl, valid, Vl, targets[i] - v0, M, 1.0f / S, dloss, threadIdx.x, blockDim.x);
    }
}

// tp = 1: stats, loss and dlogits of a row in one kernel (the row read once from memory, once from L2)
template <int W>
__global__ void ce_fused_kernel(floatX *logits, float *losses, const int *targets, int V, int Vl, float dloss,
                                int write_dlogits) {
    int i = blockIdx.x, valid = V < Vl ? V : Vl, t = targets[i];
    floatX *z = logits + (size_t)i * Vl;
    float zt = t >= 0 && t < valid ? (float)z[t] : 0.0f;   // read before the reductions' barriers: before any write
    float m, s, M, S;
    ce_thread_stats<W>(&m, &s, z, valid, threadIdx.x, blockDim.x);
    ce_block_stats(&M, &S, m, s);
    if (threadIdx.x == 0) { losses[i] = logf(S) + M - zt; }
    if (write_dlogits) { ce_thread_dlogits<W>(z, valid, Vl, t, M, 1.0f / S, dloss, threadIdx.x, blockDim.x); }
}

static void ce_stats_cuda(float *stats, const floatX *logits, const int *targets, int v0, int V, int n, int Vl) {
    if (n <= 0) { return; }
    if (ce_vector_width(logits, Vl) > 1) {
        LAUNCH(ce_stats_kernel<CE_VEC>, n, ce_threads(Vl, CE_VEC), 0, main_stream)(stats, logits, targets, v0, V, Vl);
    }
    else { LAUNCH(ce_stats_kernel<1>, n, ce_threads(Vl, 1), 0, main_stream)(stats, logits, targets, v0, V, Vl); }
    cudaCheckLaunch();
}

static void ce_loss_dlogits_cuda(floatX *logits, float *losses, const float *stats_all, const int *targets,
                                 int v0, int V, int n, int Vl, int tp, float dloss, int write_dlogits) {
    if (n <= 0) { return; }
    if (ce_vector_width(logits, Vl) > 1) {
        LAUNCH(ce_loss_dlogits_kernel<CE_VEC>, n, ce_threads(Vl, CE_VEC), 0, main_stream)(logits, losses, stats_all, targets, v0, V, n,
                Vl, tp, dloss, write_dlogits);
    } else {
        LAUNCH(ce_loss_dlogits_kernel<1>, n, ce_threads(Vl, 1), 0, main_stream)(logits, losses, stats_all, targets, v0, V, n, Vl,
                                                                     tp, dloss, write_dlogits);
    }
    cudaCheckLaunch();
}

static void ce_fused_cuda(floatX *logits, float *losses, const int *targets, int V, int n, int Vl, float dloss,
                          int write_dlogits) {
    if (n <= 0) { return; }
    if (ce_vector_width(logits, Vl) > 1) {
        LAUNCH(ce_fused_kernel<CE_VEC>, n, ce_threads(Vl, CE_VEC), 0, main_stream)(logits, losses, targets, V, Vl, dloss,
                                                                   write_dlogits);
    }
    else {
        LAUNCH(ce_fused_kernel<1>, n, ce_threads(Vl, 1), 0, main_stream)(logits, losses, targets, V, Vl, dloss, write_dlogits);
    }
    cudaCheckLaunch();
}
#endif

// acc[0] += the sum of losses (n), in double: the step's loss stays on the device until it is read once
static void loss_accumulate_cpu(double *acc, const float *losses, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) { s += losses[i]; }
    acc[0] += s;
}
#ifdef USE_CUDA
// one block: each thread's strided sum in double, then a fixed-order tree (deterministic)
#define LOSS_THREADS 1024
__global__ void loss_accumulate_kernel(double *acc, const float *losses, int n) {
    __shared__ double part[LOSS_THREADS];
    double s = 0.0;
    for (int i = (int)threadIdx.x; i < n; i += LOSS_THREADS) { s += losses[i]; }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int stride = LOSS_THREADS / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride) { part[threadIdx.x] += part[threadIdx.x + stride]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { acc[0] += part[0]; }
}
#endif
static void loss_accumulate(double *acc, const float *losses, int n) {
#ifdef USE_CUDA
    LAUNCH(loss_accumulate_kernel, 1, LOSS_THREADS, 0, main_stream)(acc, losses, n);
    cudaCheckLaunch();
#else
    loss_accumulate_cpu(acc, losses, n);
#endif
}

static void ce_stats(float *stats, floatX *logits, const int *targets, int v0, int V, int n, int Vl) {
#ifdef USE_CUDA
    ce_stats_cuda(stats, logits, targets, v0, V, n, Vl);
#else
    ce_stats_cpu(stats, logits, targets, v0, V, n, Vl);
#endif
}

static void ce_loss_dlogits(floatX *logits, float *losses, const float *stats_all, const int *targets,
                            int v0, int V, int n, int Vl, int tp, float dloss, int write_dlogits) {
#ifdef USE_CUDA
    ce_loss_dlogits_cuda(logits, losses, stats_all, targets, v0, V, n, Vl, tp, dloss, write_dlogits);
#else
    ce_loss_dlogits_cpu(logits, losses, stats_all, targets, v0, V, n, Vl, tp, dloss, write_dlogits);
#endif
}

// tp = 1: the stats and the loss (and dlogits) of every row, without a collective in between
static void ce_fused(float *stats, floatX *logits, float *losses, const int *targets, int V, int n, int Vl,
                     float dloss, int write_dlogits) {
#ifdef USE_CUDA
    (void)stats;
    ce_fused_cuda(logits, losses, targets, V, n, Vl, dloss, write_dlogits);
#else
    if (write_dlogits) {
        ce_fused_train_cpu(logits, losses, targets, V, n, Vl, dloss);
        return;
    }
    ce_stats_cpu(stats, logits, targets, 0, V, n, Vl);
    ce_loss_dlogits_cpu(logits, losses, stats, targets, 0, V, n, Vl, 1, dloss, 0);
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
        if (tp == 1) {
            ce_fused(buf->stats, buf->logits, losses + c0, targets + c0, V, n, Vl, dloss, dh != NULL);
        } else {
            ce_stats(buf->stats, buf->logits, targets + c0, v0, V, n, Vl);
            // one collective per chunk: every rank's (max, sum-exp, target logit) for the n tokens
            comm_all_gather(tp_group, buf->stats, buf->stats_all, 3 * (size_t)n, DT_FLOAT, NULL);
            ce_loss_dlogits(buf->logits, losses + c0, buf->stats_all, targets + c0, v0, V, n, Vl, tp, dloss,
                            dh != NULL);
        }
        if (dh != NULL) {
            matmul_backward(dh + (size_t)c0 * C, dwte_local, NULL, buf->logits, hc, wte_local, n, C, Vl);
        }
    }
}

#endif
