// Elementwise pieces of the residual stream: out = res + x + bias, bias gradients, accumulation.
#ifndef LLMC_RESIDUAL_H
#define LLMC_RESIDUAL_H

#include "backend.h"
#include "alloc.h"

// res, x (N, C), bias (C) or NULL -> out (N, C). out may alias res or x.
static void residual_bias_forward_cpu(float *out, const float *res, const float *x, const float *bias, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)n * C + c;
            out[i] = res[i] + x[i] + (bias ? bias[c] : 0.0f);
        }
    }
}

// dbias (C) += sum over the N rows of dout (N, C); rows summed in order (deterministic)
static void bias_backward_cpu(float *dbias, const float *dout, int N, int C) {
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        float sum = 0.0f;
        for (int n = 0; n < N; n++) { sum += dout[(size_t)n * C + c]; }
        dbias[c] += sum;
    }
}

// dst (n) += src (n)
static void accumulate_cpu(float *dst, const float *src, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { dst[i] += src[i]; }
}

#ifdef USE_CUDA
// out (N, C) = res + x + bias; out may alias res or x (each element read before written)
__global__ void residual_bias_forward_kernel(floatX *out, const floatX *res, const floatX *x, const floatX *bias,
                                             int N, int C) {
    size_t total = (size_t)N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float b = bias != NULL ? (float)bias[i % C] : 0.0f;
        out[i] = (floatX)((float)res[i] + (float)x[i] + b);
    }
}

// dst (n) += src (n)
__global__ void accumulate_kernel(floatX *dst, const floatX *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = (floatX)((float)dst[i] + (float)src[i]);
    }
}

static void residual_bias_forward_cuda(floatX *out, const floatX *res, const floatX *x, const floatX *bias, int N,
                                       int C) {
    size_t total = (size_t)N * C;
    if (total == 0) { return; }
    LAUNCH(residual_bias_forward_kernel, elementwise_grid(total, 256), 256, 0, main_stream)(out, res, x, bias, N, C);
    cudaCheckLaunch();
}

// Column sums on every SM, deterministic (bias gradients; LayerNorm's and RMSNorm's weight and bias gradients):
//   pass 1, grid (C / 256, R): thread (block (cx, r), t) sums column c = 256 cx + t over the rows of slice r,
//           r*rows .. (r+1)*rows - 1, in order: part[r][c] = sum dy; with LayerNorm's inp, mean, rstd also
//           part[R + r][c] = sum xhat dy (mean NULL: RMSNorm's xhat = inp rstd)
//   pass 2: thread c adds part[0..R)[c] (and part[R..2R)[c]) in order into dbias[c] (dweight[c]); dbias NULL
//           (RMSNorm: no bias): dweight only.
// rows = 64 (doubled until the 2 R C partials fit the cuBLASLt workspace): the order depends on N and C
// only, not on the GPU. The partials live in the cuBLASLt workspace (the same stream as the GEMMs, so
// never used at the same time). Each thread's work is a function of its indices alone (no shared memory,
// no synchronisation): column_partials and column_finish are the kernels' bodies, replayed on the CPU by
// dev/cuda/column_sums_replay.cu.
#define COLSUM_THREADS 256
__host__ __device__ inline void column_partials(float *part, const floatX *dout, const floatX *inp, const float *mean,
                                                const float *rstd, int N, int C, int rows, int R, int cx, int r,
                                                int t) {
    int c = cx * COLSUM_THREADS + t, n1 = (r + 1) * rows < N ? (r + 1) * rows : N;
    if (c >= C) { return; }
    float s = 0.0f, sx = 0.0f;
    for (int n = r * rows; n < n1; n++) {
        float dy = (float)dout[(size_t)n * C + c];
        s += dy;
        if (inp != NULL) { sx += ((float)inp[(size_t)n * C + c] - (mean != NULL ? mean[n] : 0.0f)) * rstd[n] * dy; }
    }
    part[(size_t)r * C + c] = s;
    if (inp != NULL) { part[(size_t)(R + r) * C + c] = sx; }
}
__host__ __device__ inline void column_finish(floatX *dbias, floatX *dweight, const float *part, int C, int R, int c) {
    if (c >= C) { return; }
    float s = 0.0f, sx = 0.0f;
    for (int r = 0; r < R; r++) {
        s += part[(size_t)r * C + c];
        if (dweight != NULL) { sx += part[(size_t)(R + r) * C + c]; }
    }
    if (dbias != NULL) { dbias[c] = (floatX)((float)dbias[c] + s); }
    if (dweight != NULL) { dweight[c] = (floatX)((float)dweight[c] + sx); }
}
__global__ void column_partials_kernel(float *part, const floatX *dout, const floatX *inp, const float *mean,
                                       const float *rstd, int N, int C, int rows) {
    column_partials(part, dout, inp, mean, rstd, N, C, rows, gridDim.y, blockIdx.x, blockIdx.y, threadIdx.x);
}
__global__ void column_finish_kernel(floatX *dbias, floatX *dweight, const float *part, int C, int R) {
    column_finish(dbias, dweight, part, C, R, blockIdx.x * blockDim.x + threadIdx.x);
}
// the row slice length for N rows, C columns, `sums` sums per column: 64, doubled until the partials fit
static int column_slice_rows(int N, int C, int sums, size_t workspace_bytes) {
    int rows = 64;
    while ((size_t)ceil_div(N, rows) * C * sums * sizeof(float) > workspace_bytes) { rows *= 2; }
    return rows;
}
// dbias (C) += column sums of dout (N, C); with inp, mean, rstd (LayerNorm): dweight (C) += sums of xhat dout
// (RMSNorm: mean NULL, xhat = inp rstd; dbias NULL: not summed into)
static void column_sums_accumulate(floatX *dbias, floatX *dweight, const floatX *dout, const floatX *inp,
                                   const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) { return; }
    if (cublaslt_workspace == NULL) { cublaslt_workspace = mem_alloc(cublaslt_workspace_size, MEM_WORKSPACE); }
    int rows = column_slice_rows(N, C, inp != NULL ? 2 : 1, cublaslt_workspace_size), R = ceil_div(N, rows);
    float *part = (float *)cublaslt_workspace;
    LAUNCH(column_partials_kernel, dim3(ceil_div(C, COLSUM_THREADS), R), COLSUM_THREADS, 0, main_stream)(part, dout, inp,
            mean, rstd, N, C, rows);
    cudaCheckLaunch();
    LAUNCH(column_finish_kernel, ceil_div(C, COLSUM_THREADS), COLSUM_THREADS, 0, main_stream)(dbias, dweight, part, C, R);
    cudaCheckLaunch();
}

// dbias (C) += column sums of dout (N, C)
static void bias_backward_cuda(floatX *dbias, const floatX *dout, int N, int C) {
    column_sums_accumulate(dbias, NULL, dout, NULL, NULL, NULL, N, C);
}

static void accumulate_cuda(floatX *dst, const floatX *src, size_t n) {
    if (n == 0) { return; }
    LAUNCH(accumulate_kernel, elementwise_grid(n, 256), 256, 0, main_stream)(dst, src, n);
    cudaCheckLaunch();
}
#endif

static void residual_bias_forward(floatX *out, const floatX *res, const floatX *x, const floatX *bias, int N, int C) {
#ifdef USE_CUDA
    residual_bias_forward_cuda(out, res, x, bias, N, C);
#else
    residual_bias_forward_cpu(out, res, x, bias, N, C);
#endif
}

// dbias (C) += column sums of dout (N, C); NULL: a model without that bias (Llama), nothing to do
static void bias_backward(floatX *dbias, const floatX *dout, int N, int C) {
    if (dbias == NULL) { return; }
#ifdef USE_CUDA
    bias_backward_cuda(dbias, dout, N, C);
#else
    bias_backward_cpu(dbias, dout, N, C);
#endif
}

// dst (n) += src; NULL dst: nothing to do
static void accumulate(floatX *dst, const floatX *src, size_t n) {
    if (dst == NULL) { return; }
#ifdef USE_CUDA
    accumulate_cuda(dst, src, n);
#else
    accumulate_cpu(dst, src, n);
#endif
}

#endif
