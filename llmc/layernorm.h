// LayerNorm over the channels of each token: out = (x - mean) * rstd * w + b, eps 1e-5.
#ifndef LLMC_LAYERNORM_H
#define LLMC_LAYERNORM_H

#include "backend.h"

// inp (N, C) -> out (N, C), mean (N), rstd (N)
static void layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                                  const float *weight, const float *bias, int N, int C) {
    const float eps = 1e-5f;
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) { m += x[c]; }
        m /= C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) { float d = x[c] - m; v += d * d; }
        v /= C;
        float s = 1.0f / sqrtf(v + eps);
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) { o[c] = (s * (x[c] - m)) * weight[c] + bias[c]; }
        mean[n] = m;
        rstd[n] = s;
    }
}

// dinp (N, C) += d/dx;  dweight, dbias (C) += their gradients.
static void layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                   const float *weight, const float *mean, const float *rstd, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *dy = dout + (size_t)n * C;
        const float *x = inp + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        // two reductions: mean(dy*w) and mean(dy*w*xhat)
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            float dnorm = weight[c] * dy[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * xhat;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            float dnorm = weight[c] * dy[c];
            dx[c] += (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * s;
        }
    }
    // parameter gradients: threads split the channels, tokens summed in order (deterministic)
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        float dw = 0.0f, db = 0.0f;
        for (int n = 0; n < N; n++) {
            float xhat = (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
            float dy = dout[(size_t)n * C + c];
            dw += xhat * dy;
            db += dy;
        }
        dweight[c] += dw;
        dbias[c] += db;
    }
}

#ifdef USE_CUDA
// One warp per row n: inp (N, C) -> out (N, C), mean (N), rstd (N). Two passes over the row
// (mean, then variance about the mean) like the CPU loop; the row is re-read from L1/L2.
__global__ void layernorm_forward_kernel(floatX *out, float *mean, float *rstd, const floatX *inp,
                                         const floatX *weight, const floatX *bias, int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) { return; }
    const floatX *x = inp + (size_t)n * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) { sum += (float)x[c]; }
    float m = warp_reduce_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) { float d = (float)x[c] - m; var += d * d; }
    float s = rsqrtf(warp_reduce_sum(var) / C + 1e-5f);
    floatX *o = out + (size_t)n * C;
    for (int c = lane; c < C; c += 32) {
        o[c] = (floatX)((s * ((float)x[c] - m)) * (float)weight[c] + (float)bias[c]);
    }
    if (lane == 0) { mean[n] = m; rstd[n] = s; }
}

// One warp per row n: dinp (N, C) += the input gradient (the two row reductions of the CPU loop).
__global__ void layernorm_backward_dinp_kernel(floatX *dinp, const floatX *dout, const floatX *inp, const floatX *weight,
                                               const float *mean, const float *rstd, int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) { return; }
    const floatX *dy = dout + (size_t)n * C;
    const floatX *x = inp + (size_t)n * C;
    floatX *dx = dinp + (size_t)n * C;
    float m = mean[n], s = rstd[n];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xhat = ((float)x[c] - m) * s;
        float dnorm = (float)weight[c] * (float)dy[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * xhat;
    }
    dnorm_mean = warp_reduce_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_reduce_sum(dnorm_norm_mean) / C;
    for (int c = lane; c < C; c += 32) {
        float xhat = ((float)x[c] - m) * s;
        float dnorm = (float)weight[c] * (float)dy[c];
        dx[c] = (floatX)((float)dx[c] + (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * s);
    }
}

// dweight, dbias (C) += sums over the N rows of xhat * dy and dy. Deterministic column reduction:
// block (32, 32) owns 32 channels, thread row y sums rows y, y+32, ... in order, then the 32
// partials are added in a fixed order. grid CEIL_DIV(C, 32).
__global__ void layernorm_backward_params_kernel(floatX *dweight, floatX *dbias, const floatX *dout, const floatX *inp,
                                                 const float *mean, const float *rstd, int N, int C) {
    __shared__ float pw[32][33], pb[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float dw = 0.0f, db = 0.0f;
    if (c < C) {
        for (int n = threadIdx.y; n < N; n += 32) {
            size_t i = (size_t)n * C + c;
            float dy = (float)dout[i];
            dw += ((float)inp[i] - mean[n]) * rstd[n] * dy;
            db += dy;
        }
    }
    pw[threadIdx.y][threadIdx.x] = dw;
    pb[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float sw = 0.0f, sb = 0.0f;
        for (int r = 0; r < 32; r++) { sw += pw[r][threadIdx.x]; sb += pb[r][threadIdx.x]; }
        dweight[c] = (floatX)((float)dweight[c] + sw);
        dbias[c] = (floatX)((float)dbias[c] + sb);
    }
}

static void layernorm_forward_cuda(floatX *out, float *mean, float *rstd, const floatX *inp,
                                   const floatX *weight, const floatX *bias, int N, int C) {
    if (N <= 0) { return; }
    const int block = 256, rows_per_block = block / 32;
    layernorm_forward_kernel<<<CEIL_DIV(N, rows_per_block), block, 0, main_stream>>>(out, mean, rstd, inp, weight, bias, N, C);
    cudaCheckLaunch();
}

static void layernorm_backward_cuda(floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout, const floatX *inp,
                                    const floatX *weight, const float *mean, const float *rstd, int N, int C) {
    if (N <= 0) { return; }
    const int block = 256, rows_per_block = block / 32;
    layernorm_backward_dinp_kernel<<<CEIL_DIV(N, rows_per_block), block, 0, main_stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
    cudaCheckLaunch();
    layernorm_backward_params_kernel<<<CEIL_DIV(C, 32), dim3(32, 32), 0, main_stream>>>(dweight, dbias, dout, inp, mean, rstd, N, C);
    cudaCheckLaunch();
}
#endif

static void layernorm_forward(floatX *out, float *mean, float *rstd, const floatX *inp,
                              const floatX *weight, const floatX *bias, int N, int C) {
#ifdef USE_CUDA
    layernorm_forward_cuda(out, mean, rstd, inp, weight, bias, N, C);
#else
    layernorm_forward_cpu(out, mean, rstd, inp, weight, bias, N, C);
#endif
}

static void layernorm_backward(floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout, const floatX *inp,
                               const floatX *weight, const float *mean, const float *rstd, int N, int C) {
#ifdef USE_CUDA
    layernorm_backward_cuda(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
#else
    layernorm_backward_cpu(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
#endif
}

#endif
