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
// CUDA kernels go here
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
