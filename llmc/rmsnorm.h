// RMSNorm over the channels of each token (Llama): out = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps).
// No mean subtraction, no bias (transformers' LlamaRMSNorm in fp32).
#ifndef LLMC_RMSNORM_H
#define LLMC_RMSNORM_H

#include "backend.h"
#include "residual.h"
#include "layernorm.h"

// inp (N, C) -> out (N, C), rstd (N)
static void rmsnorm_forward_cpu(float *out, float *rstd, const float *inp, const float *weight, float eps, int N,
                                int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) { v += x[c] * x[c]; }
        v /= C;
        float s = 1.0f / sqrtf(v + eps);
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) { o[c] = weight[c] * (x[c] * s); }
        rstd[n] = s;
    }
}

// With xhat = x rstd, dn = w dy:  dx = rstd (dn - xhat mean(dn xhat));  dw = sum over tokens of dy xhat.
// dinp (N, C) += dx (NULL: skipped, and weight is not read);  dweight (C) += dw (NULL: skipped).
// The two parts are independent loops (ZB's B and W run them apart: the same sums either way).
static void rmsnorm_backward_cpu(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                                 const float *rstd, int N, int C) {
    #pragma omp parallel for if (dinp != NULL)
    for (int n = 0; n < (dinp != NULL ? N : 0); n++) {
        const float *dy = dout + (size_t)n * C;
        const float *x = inp + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float s = rstd[n];
        float dnorm_norm_mean = 0.0f;   // mean(dn xhat)
        for (int c = 0; c < C; c++) { dnorm_norm_mean += (weight[c] * dy[c]) * (x[c] * s); }
        dnorm_norm_mean /= C;
        for (int c = 0; c < C; c++) { dx[c] += s * (weight[c] * dy[c] - (x[c] * s) * dnorm_norm_mean); }
    }
    // weight gradient: threads split the channels, tokens summed in order (deterministic)
    #pragma omp parallel for if (dweight != NULL)
    for (int c = 0; c < (dweight != NULL ? C : 0); c++) {
        float dw = 0.0f;
        for (int n = 0; n < N; n++) { dw += (inp[(size_t)n * C + c] * rstd[n]) * dout[(size_t)n * C + c]; }
        dweight[c] += dw;
    }
}

// The residual add fused with the next RMSNorm (the Llama block: res_out = res + x + bias is the residual
// stream, ln_out its normalisation). res, x (N, C), bias (C) or NULL; res_out (N, C) may alias res or x;
// ln_out (N, C), rstd (N) as rmsnorm_forward. The specification: the two CPU loops.
static void residual_rmsnorm_forward_cpu(float *res_out, float *ln_out, float *rstd, const float *res, const float *x,
                                         const float *bias, const float *weight, float eps, int N, int C) {
    residual_bias_forward_cpu(res_out, res, x, bias, N, C);
    rmsnorm_forward_cpu(ln_out, rstd, res_out, weight, eps, N, C);
}

#ifdef USE_CUDA
// One warp per row n: inp (N, C) -> out (N, C), rstd (N)
__global__ void rmsnorm_forward_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *weight, float eps,
                                       int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) { return; }
    const floatX *x = inp + (size_t)n * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) { float v = (float)x[c]; ss += v * v; }
    float s = rsqrtf(warp_reduce_sum(ss) / C + eps);
    floatX *o = out + (size_t)n * C;
    for (int c = lane; c < C; c += 32) { o[c] = (floatX)((float)weight[c] * ((float)x[c] * s)); }
    if (lane == 0) { rstd[n] = s; }
}

// One warp per row n: dinp (N, C) += the input gradient (the row reduction of the CPU loop)
__global__ void rmsnorm_backward_dinp_kernel(floatX *dinp, const floatX *dout, const floatX *inp, const floatX *weight,
                                             const float *rstd, int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) { return; }
    const floatX *dy = dout + (size_t)n * C;
    const floatX *x = inp + (size_t)n * C;
    floatX *dx = dinp + (size_t)n * C;
    float s = rstd[n];
    float dnorm_norm_mean = 0.0f;
    for (int c = lane; c < C; c += 32) { dnorm_norm_mean += ((float)weight[c] * (float)dy[c]) * ((float)x[c] * s); }
    dnorm_norm_mean = warp_reduce_sum(dnorm_norm_mean) / C;
    for (int c = lane; c < C; c += 32) {
        float dnorm = (float)weight[c] * (float)dy[c];
        dx[c] = (floatX)((float)dx[c] + s * (dnorm - ((float)x[c] * s) * dnorm_norm_mean));
    }
}

// One warp per row n: res_out = res + x + bias (stored as floatX), then ln_out = rmsnorm(res_out), rstd.
// The sum of squares is of the stored floatX values, and the second pass re-reads res_out (what this lane
// wrote; from L1/L2), so rstd and ln_out describe exactly what the backward pass will read back.
// res_out may alias res or x: every element is read before it is written, by the same lane.
__global__ void residual_rmsnorm_forward_kernel(floatX *res_out, floatX *ln_out, float *rstd, const floatX *res,
                                                const floatX *x, const floatX *bias, const floatX *weight, float eps,
                                                int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) { return; }
    const size_t row = (size_t)n * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        floatX r = (floatX)((float)res[row + c] + (float)x[row + c] + (bias != NULL ? (float)bias[c] : 0.0f));
        res_out[row + c] = r;
        ss += (float)r * (float)r;
    }
    float s = rsqrtf(warp_reduce_sum(ss) / C + eps);
    for (int c = lane; c < C; c += 32) {
        ln_out[row + c] = (floatX)((float)weight[c] * ((float)res_out[row + c] * s));
    }
    if (lane == 0) { rstd[n] = s; }
}

static void rmsnorm_forward_cuda(floatX *out, float *rstd, const floatX *inp, const floatX *weight, float eps, int N,
                                 int C) {
    if (N <= 0) { return; }
    const int block = 256, rows_per_block = block / 32;
    LAUNCH(rmsnorm_forward_kernel, ceil_div(N, rows_per_block), block, 0, main_stream)(out, rstd, inp, weight, eps, N, C);
    cudaCheckLaunch();
}

static void rmsnorm_backward_cuda(floatX *dinp, floatX *dweight, const floatX *dout, const floatX *inp,
                                  const floatX *weight, const float *rstd, int N, int C) {
    if (N <= 0) { return; }
    const int block = 256, rows_per_block = block / 32;
    if (dinp != NULL) {
        LAUNCH(rmsnorm_backward_dinp_kernel, ceil_div(N, rows_per_block), block, 0, main_stream)(dinp, dout, inp, weight,
                rstd, N, C);
        cudaCheckLaunch();
    }
    // dweight += sum xhat dy (residual.h's column sums: no mean, no bias)
    if (dweight != NULL) { column_sums_accumulate(NULL, dweight, dout, inp, NULL, rstd, N, C); }
}

// ln_out must not alias res, x or res_out
static void residual_rmsnorm_forward_cuda(floatX *res_out, floatX *ln_out, float *rstd, const floatX *res,
                                          const floatX *x, const floatX *bias, const floatX *weight, float eps, int N,
                                          int C) {
    if (N <= 0) { return; }
    const int block = 256, rows_per_block = block / 32;
    LAUNCH(residual_rmsnorm_forward_kernel, ceil_div(N, rows_per_block), block, 0, main_stream)(res_out, ln_out, rstd, res,
            x, bias, weight, eps, N, C);
    cudaCheckLaunch();
}
#endif

static void rmsnorm_forward(floatX *out, float *rstd, const floatX *inp, const floatX *weight, float eps, int N,
                            int C) {
#ifdef USE_CUDA
    rmsnorm_forward_cuda(out, rstd, inp, weight, eps, N, C);
#else
    rmsnorm_forward_cpu(out, rstd, inp, weight, eps, N, C);
#endif
}

static void rmsnorm_backward(floatX *dinp, floatX *dweight, const floatX *dout, const floatX *inp,
                             const floatX *weight, const float *rstd, int N, int C) {
#ifdef USE_CUDA
    rmsnorm_backward_cuda(dinp, dweight, dout, inp, weight, rstd, N, C);
#else
    rmsnorm_backward_cpu(dinp, dweight, dout, inp, weight, rstd, N, C);
#endif
}

static void residual_rmsnorm_forward(floatX *res_out, floatX *ln_out, float *rstd, const floatX *res, const floatX *x,
                                     const floatX *bias, const floatX *weight, float eps, int N, int C) {
#ifdef USE_CUDA
    residual_rmsnorm_forward_cuda(res_out, ln_out, rstd, res, x, bias, weight, eps, N, C);
#else
    residual_rmsnorm_forward_cpu(res_out, ln_out, rstd, res, x, bias, weight, eps, N, C);
#endif
}

// ----------------------------------------------------------------------------
// a model's norm: LayerNorm (GPT-2: mean, bias; eps 1e-5) or RMSNorm (Llama: rms; mean and bias unused)

static void norm_forward(int rms, floatX *out, float *mean, float *rstd, const floatX *inp, const floatX *weight,
                         const floatX *bias, float eps, int N, int C) {
    if (rms) { rmsnorm_forward(out, rstd, inp, weight, eps, N, C); }
    else { layernorm_forward(out, mean, rstd, inp, weight, bias, N, C); }
}

static void norm_backward(int rms, floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout, const floatX *inp,
                          const floatX *weight, const float *mean, const float *rstd, int N, int C) {
    if (rms) { rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C); }
    else { layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C); }
}

// res_out = res + x + bias (bias may be NULL), then its norm
static void residual_norm_forward(int rms, floatX *res_out, floatX *ln_out, float *mean, float *rstd, const floatX *res,
                                  const floatX *x, const floatX *bias, const floatX *weight, const floatX *lnbias,
                                  float eps, int N, int C) {
    if (rms) { residual_rmsnorm_forward(res_out, ln_out, rstd, res, x, bias, weight, eps, N, C); }
    else { residual_layernorm_forward(res_out, ln_out, mean, rstd, res, x, bias, weight, lnbias, N, C); }
}

#endif
