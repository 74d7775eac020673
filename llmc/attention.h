// Causal multi-head self-attention on the local heads, without storing the (B, NH, T, T)
// attention matrix: forward keeps only the log-sum-exp of each score row, backward recomputes
// the probabilities from it (the FlashAttention recipe, written as plain loops).
// qkv (B, T, 3C) holds [q | k | v], head h in channels h*hs .. (h+1)*hs of each; C = NH * hs.
#ifndef LLMC_ATTENTION_H
#define LLMC_ATTENTION_H

#include "backend.h"

// qkv (B, T, 3C) -> out (B, T, C), lse (B, NH, T)
static void attention_forward_cpu(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float *p = (float *)malloc_check(sizeof(float) * T);   // one score row
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int t = 0; t < T; t++) {
                    const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                    float maxv = -INFINITY;
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                        float s = 0.0f;
                        for (int i = 0; i < hs; i++) { s += q[i] * k[i]; }
                        s *= scale;
                        p[t2] = s;
                        if (s > maxv) { maxv = s; }
                    }
                    float sum = 0.0f;
                    for (int t2 = 0; t2 <= t; t2++) { p[t2] = expf(p[t2] - maxv); sum += p[t2]; }
                    float inv = 1.0f / sum;
                    float *o = out + ((size_t)b * T + t) * C + h * hs;
                    for (int i = 0; i < hs; i++) { o[i] = 0.0f; }
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float *v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                        float w = p[t2] * inv;
                        for (int i = 0; i < hs; i++) { o[i] += w * v[i]; }
                    }
                    lse[((size_t)b * NH + h) * T + t] = maxv + logf(sum);
                }
            }
        }
        free(p);
    }
}

// dout (B, T, C) -> dqkv (B, T, 3C) (written). p = exp(s - lse); ds = p * (dout.v - dout.out).
static void attention_backward_cpu(float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {     // this (b, h) owns its slices of dq, dk, dv
                float *d = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                for (int i = 0; i < hs; i++) { d[i] = 0.0f; d[C + i] = 0.0f; d[2 * C + i] = 0.0f; }
            }
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                const float *dy = dout + ((size_t)b * T + t) * C + h * hs;
                const float *y = out + ((size_t)b * T + t) * C + h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float l = lse[((size_t)b * NH + h) * T + t];
                float D = 0.0f;
                for (int i = 0; i < hs; i++) { D += dy[i] * y[i]; }
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    const float *v = k + C;
                    float *dk = dqkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    float *dv = dk + C;
                    float s = 0.0f, dp = 0.0f;
                    for (int i = 0; i < hs; i++) { s += q[i] * k[i]; dp += dy[i] * v[i]; }
                    float p = expf(s * scale - l);
                    float ds = p * (dp - D) * scale;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                        dv[i] += p * dy[i];
                    }
                }
            }
        }
    }
}

#ifdef USE_CUDA
// CUDA kernels go here
#endif

static void attention_forward(floatX *out, float *lse, const floatX *qkv, int B, int T, int C, int NH) {
#ifdef USE_CUDA
    attention_forward_cuda(out, lse, qkv, B, T, C, NH);
#else
    attention_forward_cpu(out, lse, qkv, B, T, C, NH);
#endif
}

static void attention_backward(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                               const float *lse, int B, int T, int C, int NH) {
#ifdef USE_CUDA
    attention_backward_cuda(dqkv, dout, qkv, out, lse, B, T, C, NH);
#else
    attention_backward_cpu(dqkv, dout, qkv, out, lse, B, T, C, NH);
#endif
}

#endif
