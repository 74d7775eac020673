// QK-norm (OLMoE): q = RMSNorm(q) over the WHOLE q projection (all NH heads at once, one weight of NH hs), and k
// the same over the whole k projection, before RoPE. Under tensor parallelism a rank holds NH/tp heads of each
// token's row, so the norm spans the tp ranks: each rank's sum of squares of its part, all-reduced over tp, gives
// the row's; in the backward, the row's sum of (w dy)(x rstd) the same way. With s = rstd = 1/sqrt(sum x^2 / W + eps)
// over the W values of the whole row, xhat = x s, dn = w dy:
//   y = w xhat;   dx = s (dn - xhat sum(dn xhat) / W);   dw += sum over tokens of dy xhat
// The rows live in the qkv buffer ((NH + 2KV) hs wide): q at column 0, k after it (stride), their inputs kept in a
// buffer of their own for the backward.
#ifndef LLMC_QK_NORM_H
#define LLMC_QK_NORM_H

#include "backend.h"
#include "comm.h"

// raw (N, W) = the W values at the start of each row of x (N rows, `stride` apart)
static void rows_copy_cpu(float *raw, const float *x, int N, int W, int stride) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) { memcpy(raw + (size_t)n * W, x + (size_t)n * stride, W * sizeof(float)); }
}

// ss (N) = this rank's part of each row's sum of squares (raw (N, W))
static void rows_sumsq_cpu(float *ss, const float *raw, int N, int W) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float s = 0.0f;
        for (int i = 0; i < W; i++) { s += raw[(size_t)n * W + i] * raw[(size_t)n * W + i]; }
        ss[n] = s;
    }
}

// y (rows `stride` apart) = w (raw s), s = rstd (N) = 1 / sqrt(ss / total + eps): ss the whole rows' sums
static void rows_rmsnorm_apply_cpu(float *y, float *rstd, const float *raw, const float *ss, const float *w, float eps,
                                   int total, int N, int W, int stride) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float s = 1.0f / sqrtf(ss[n] / total + eps);
        for (int i = 0; i < W; i++) { y[(size_t)n * stride + i] = w[i] * (raw[(size_t)n * W + i] * s); }
        rstd[n] = s;
    }
}

// dot (N) = this rank's part of each row's sum of (w dy)(raw s): dy's rows `stride` apart
static void rows_rmsnorm_dot_cpu(float *dot, const float *dy, const float *raw, const float *w, const float *rstd,
                                 int N, int W, int stride) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float d = 0.0f;
        for (int i = 0; i < W; i++) { d += (w[i] * dy[(size_t)n * stride + i]) * (raw[(size_t)n * W + i] * rstd[n]); }
        dot[n] = d;
    }
}

// dw (W) += sum over the tokens of dy (raw s) (NULL: skipped; channels over threads, tokens in order), then dx
// written over dy (in place) = s (w dy - (raw s) dot / total): dot the whole rows' sums
static void rows_rmsnorm_backward_cpu(float *dy, float *dw, const float *raw, const float *w, const float *rstd,
                                      const float *dot, int total, int N, int W, int stride) {
    #pragma omp parallel for if (dw != NULL)
    for (int i = 0; i < (dw != NULL ? W : 0); i++) {
        float s = 0.0f;
        for (int n = 0; n < N; n++) { s += dy[(size_t)n * stride + i] * (raw[(size_t)n * W + i] * rstd[n]); }
        dw[i] += s;
    }
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float s = rstd[n], m = dot[n] / total;
        for (int i = 0; i < W; i++) {
            float *d = dy + (size_t)n * stride + i;
            *d = s * (w[i] * *d - (raw[(size_t)n * W + i] * s) * m);
        }
    }
}

#ifdef USE_CUDA
// one warp per row n for the row loops; one thread per channel for dw (tokens summed in order: deterministic)
__global__ void rows_copy_kernel(floatX *raw, const floatX *x, int N, int W, int stride) {
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) { return; }
    for (int i = lane; i < W; i += 32) { raw[(size_t)n * W + i] = x[(size_t)n * stride + i]; }
}
__global__ void rows_sumsq_kernel(float *ss, const floatX *raw, int N, int W) {
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) { return; }
    float s = 0.0f;
    for (int i = lane; i < W; i += 32) { float v = (float)raw[(size_t)n * W + i]; s += v * v; }
    s = warp_reduce_sum(s);
    if (lane == 0) { ss[n] = s; }
}
__global__ void rows_rmsnorm_apply_kernel(floatX *y, float *rstd, const floatX *raw, const float *ss, const floatX *w,
                                          float eps, int total, int N, int W, int stride) {
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) { return; }
    float s = rsqrtf(ss[n] / total + eps);
    for (int i = lane; i < W; i += 32) {
        y[(size_t)n * stride + i] = (floatX)((float)w[i] * ((float)raw[(size_t)n * W + i] * s));
    }
    if (lane == 0) { rstd[n] = s; }
}
__global__ void rows_rmsnorm_dot_kernel(float *dot, const floatX *dy, const floatX *raw, const floatX *w,
                                        const float *rstd, int N, int W, int stride) {
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) { return; }
    float d = 0.0f;
    for (int i = lane; i < W; i += 32) {
        d += ((float)w[i] * (float)dy[(size_t)n * stride + i]) * ((float)raw[(size_t)n * W + i] * rstd[n]);
    }
    d = warp_reduce_sum(d);
    if (lane == 0) { dot[n] = d; }
}
__global__ void rows_rmsnorm_dweight_kernel(floatX *dw, const floatX *dy, const floatX *raw, const float *rstd, int N,
                                            int W, int stride) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= W) { return; }
    float s = 0.0f;
    for (int n = 0; n < N; n++) { s += (float)dy[(size_t)n * stride + i] * ((float)raw[(size_t)n * W + i] * rstd[n]); }
    dw[i] = (floatX)((float)dw[i] + s);
}
__global__ void rows_rmsnorm_dinp_kernel(floatX *dy, const floatX *raw, const floatX *w, const float *rstd,
                                         const float *dot, int total, int N, int W, int stride) {
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) { return; }
    float s = rstd[n], m = dot[n] / total;
    for (int i = lane; i < W; i += 32) {
        floatX *d = dy + (size_t)n * stride + i;
        *d = (floatX)(s * ((float)w[i] * (float)*d - ((float)raw[(size_t)n * W + i] * s) * m));
    }
}
#endif

// ----------------------------------------------------------------------------
// the launchers: one projection's rows (N rows `stride` apart, W of each row's values on this rank)

static void rows_copy(floatX *raw, const floatX *x, int N, int W, int stride) {
#ifdef USE_CUDA
    LAUNCH(rows_copy_kernel, ceil_div(N, 8), 256, 0, main_stream)(raw, x, N, W, stride);
    cudaCheckLaunch();
#else
    rows_copy_cpu(raw, x, N, W, stride);
#endif
}

static void rows_sumsq(float *ss, const floatX *raw, int N, int W) {
#ifdef USE_CUDA
    LAUNCH(rows_sumsq_kernel, ceil_div(N, 8), 256, 0, main_stream)(ss, raw, N, W);
    cudaCheckLaunch();
#else
    rows_sumsq_cpu(ss, raw, N, W);
#endif
}

static void rows_rmsnorm_apply(floatX *y, float *rstd, const floatX *raw, const float *ss, const floatX *w, float eps,
                               int total, int N, int W, int stride) {
#ifdef USE_CUDA
    LAUNCH(rows_rmsnorm_apply_kernel, ceil_div(N, 8), 256, 0, main_stream)(y, rstd, raw, ss, w, eps, total, N, W, stride);
    cudaCheckLaunch();
#else
    rows_rmsnorm_apply_cpu(y, rstd, raw, ss, w, eps, total, N, W, stride);
#endif
}

static void rows_rmsnorm_dot(float *dot, const floatX *dy, const floatX *raw, const floatX *w, const float *rstd,
                             int N, int W, int stride) {
#ifdef USE_CUDA
    LAUNCH(rows_rmsnorm_dot_kernel, ceil_div(N, 8), 256, 0, main_stream)(dot, dy, raw, w, rstd, N, W, stride);
    cudaCheckLaunch();
#else
    rows_rmsnorm_dot_cpu(dot, dy, raw, w, rstd, N, W, stride);
#endif
}

static void rows_rmsnorm_backward(floatX *dy, floatX *dw, const floatX *raw, const floatX *w, const float *rstd,
                                  const float *dot, int total, int N, int W, int stride) {
#ifdef USE_CUDA
    if (dw) { LAUNCH(rows_rmsnorm_dweight_kernel, ceil_div(W, 256), 256, 0, main_stream)(dw, dy, raw, rstd, N, W, stride); }
    LAUNCH(rows_rmsnorm_dinp_kernel, ceil_div(N, 8), 256, 0, main_stream)(dy, raw, w, rstd, dot, total, N, W, stride);
    cudaCheckLaunch();
#else
    rows_rmsnorm_backward_cpu(dy, dw, raw, w, rstd, dot, total, N, W, stride);
#endif
}

// ----------------------------------------------------------------------------
// QK-norm of a layer: q = the first Wq values of each of the N rows of qkv (`stride` apart), k the next Wk (this
// tp rank's heads of each), each normalised in place over its whole projection (tp Wq, tp Wk values). raw
// (N Wq | N Wk) keeps the inputs and rstd (2, N) the scales for the backward; ss (2N) scratch. One all-reduce of
// the two sums of squares per token over tp.
static void qk_norm_forward(Group *tp, floatX *qkv, floatX *raw, float *rstd, float *ss, const floatX *wq,
                            const floatX *wk, float eps, int N, int Wq, int Wk, int stride) {
    floatX *rawk = raw + (size_t)N * Wq;
    rows_copy(raw, qkv, N, Wq, stride);
    rows_copy(rawk, qkv + Wq, N, Wk, stride);
    rows_sumsq(ss, raw, N, Wq);
    rows_sumsq(ss + N, rawk, N, Wk);
    comm_all_reduce(tp, ss, (size_t)2 * N, DT_FLOAT, NULL);   // (N, 2) -> the whole rows' sums
    rows_rmsnorm_apply(qkv, rstd, raw, ss, wq, eps, Wq * tp->size, N, Wq, stride);
    rows_rmsnorm_apply(qkv + Wq, rstd + N, rawk, ss + N, wk, eps, Wk * tp->size, N, Wk, stride);
}

// dqkv (rows as qkv's): the gradients of the normalised q and k in, of their inputs out (in place); dwq (Wq), dwk
// (Wk) += the weights' gradients (NULL: skipped). dot (2N) scratch: one all-reduce over tp.
static void qk_norm_backward(Group *tp, floatX *dqkv, floatX *dwq, floatX *dwk, const floatX *raw, const float *rstd,
                             float *dot, const floatX *wq, const floatX *wk, int N, int Wq, int Wk, int stride) {
    const floatX *rawk = raw + (size_t)N * Wq;
    rows_rmsnorm_dot(dot, dqkv, raw, wq, rstd, N, Wq, stride);
    rows_rmsnorm_dot(dot + N, dqkv + Wq, rawk, wk, rstd + N, N, Wk, stride);
    comm_all_reduce(tp, dot, (size_t)2 * N, DT_FLOAT, NULL);
    rows_rmsnorm_backward(dqkv, dwq, raw, wq, rstd, dot, Wq * tp->size, N, Wq, stride);
    rows_rmsnorm_backward(dqkv + Wq, dwk, rawk, wk, rstd + N, dot + N, Wk * tp->size, N, Wk, stride);
}

#endif // LLMC_QK_NORM_H
