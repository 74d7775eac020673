// Elementwise pieces of the residual stream: out = res + x + bias, bias gradients, accumulation.
#ifndef LLMC_RESIDUAL_H
#define LLMC_RESIDUAL_H

#include "backend.h"

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
__global__ void residual_bias_forward_kernel(floatX *out, const floatX *res, const floatX *x, const floatX *bias, int N, int C) {
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

static void residual_bias_forward_cuda(floatX *out, const floatX *res, const floatX *x, const floatX *bias, int N, int C) {
    size_t total = (size_t)N * C;
    if (total == 0) { return; }
    residual_bias_forward_kernel<<<elementwise_grid(total, 256), 256, 0, main_stream>>>(out, res, x, bias, N, C);
    cudaCheckLaunch();
}

// dbias (C) += column sums of dout (N, C): the deterministic kernel in backend.h
static void bias_backward_cuda(floatX *dbias, const floatX *dout, int N, int C) {
    column_sum_accumulate(dbias, dout, N, C);
}

static void accumulate_cuda(floatX *dst, const floatX *src, size_t n) {
    if (n == 0) { return; }
    accumulate_kernel<<<elementwise_grid(n, 256), 256, 0, main_stream>>>(dst, src, n);
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

static void bias_backward(floatX *dbias, const floatX *dout, int N, int C) {
#ifdef USE_CUDA
    bias_backward_cuda(dbias, dout, N, C);
#else
    bias_backward_cpu(dbias, dout, N, C);
#endif
}

static void accumulate(floatX *dst, const floatX *src, size_t n) {
#ifdef USE_CUDA
    accumulate_cuda(dst, src, n);
#else
    accumulate_cpu(dst, src, n);
#endif
}

#endif
