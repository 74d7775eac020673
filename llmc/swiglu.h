// SwiGLU (Llama's MLP activation): h = silu(gate) * up, silu(g) = g sigmoid(g) = g / (1 + exp(-g)).
// The fc output row is [gate (F) | up (F)] (under tensor parallelism: this rank's [gate_local | up_local]).
#ifndef LLMC_SWIGLU_H
#define LLMC_SWIGLU_H

#include "backend.h"
#include "matmul.h"

// inp (N, 2F) rows [gate | up] -> out (N, F) = silu(gate) * up. (exp_poly: vectorises, as gelu.h's loops)
static void swiglu_forward_cpu(float *out, const float *inp, int N, int F) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F;
        float *o = out + (size_t)n * F;
        #pragma omp simd
        for (int j = 0; j < F; j++) { o[j] = g[j] / (1.0f + exp_poly(-g[j])) * u[j]; }
    }
}

// dinp (N, 2F) = [dgate | dup] (written, not accumulated), from dout (N, F) and inp (N, 2F):
//   sig = sigmoid(g): dgate = dout up sig (1 + g (1 - sig)), dup = dout g sig;  1 - sig = e sig, e = exp(-g).
// dinp may alias inp (each (gate, up) pair is read before its gradients are written).
static void swiglu_backward_cpu(float *dinp, const float *dout, const float *inp, int N, int F) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F, *dy = dout + (size_t)n * F;
        float *dg = dinp + (size_t)n * 2 * F, *du = dg + F;
        #pragma omp simd
        for (int j = 0; j < F; j++) {
            float x = g[j], up = u[j], e = exp_poly(-x), sig = 1.0f / (1.0f + e);
            dg[j] = dy[j] * up * sig * (1.0f + x * (e * sig));
            du[j] = dy[j] * x * sig;
        }
    }
}

#ifdef USE_CUDA
// out (N, F) = silu(gate) * up, one thread per output element, grid-stride
__global__ void swiglu_forward_kernel(floatX *out, const floatX *inp, int N, int F) {
    size_t total = (size_t)N * F;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / F, j = i % F;
        const floatX *g = inp + n * 2 * F;
        float x = (float)g[j];
        out[i] = (floatX)(x / (1.0f + expf(fminf(-x, 88.0f))) * (float)g[F + j]);   // (as exp_poly: no inf)
    }
}

// dinp (N, 2F) = [dgate | dup], one thread per (gate, up) pair; dinp may alias inp
__global__ void swiglu_backward_kernel(floatX *dinp, const floatX *dout, const floatX *inp, int N, int F) {
    size_t total = (size_t)N * F;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / F, j = i % F, row = n * 2 * F;
        float x = (float)inp[row + j], up = (float)inp[row + F + j], dy = (float)dout[i];
        float e = expf(fminf(-x, 88.0f)), sig = 1.0f / (1.0f + e);   // (e finite: e sig is never inf * 0)
        dinp[row + j] = (floatX)(dy * up * sig * (1.0f + x * (e * sig)));
        dinp[row + F + j] = (floatX)(dy * x * sig);
    }
}

static void swiglu_forward_cuda(floatX *out, const floatX *inp, int N, int F) {
    size_t total = (size_t)N * F;
    if (N <= 0 || F <= 0) { return; }
    LAUNCH(swiglu_forward_kernel, elementwise_grid(total, 256), 256, 0, main_stream)(out, inp, N, F);
    cudaCheckLaunch();
}

static void swiglu_backward_cuda(floatX *dinp, const floatX *dout, const floatX *inp, int N, int F) {
    size_t total = (size_t)N * F;
    if (N <= 0 || F <= 0) { return; }
    LAUNCH(swiglu_backward_kernel, elementwise_grid(total, 256), 256, 0, main_stream)(dinp, dout, inp, N, F);
    cudaCheckLaunch();
}
#endif

static void swiglu_forward(floatX *out, const floatX *inp, int N, int F) {
#ifdef USE_CUDA
    swiglu_forward_cuda(out, inp, N, F);
#else
    swiglu_forward_cpu(out, inp, N, F);
#endif
}

static void swiglu_backward(floatX *dinp, const floatX *dout, const floatX *inp, int N, int F) {
#ifdef USE_CUDA
    swiglu_backward_cuda(dinp, dout, inp, N, F);
#else
    swiglu_backward_cpu(dinp, dout, inp, N, F);
#endif
}

// ----------------------------------------------------------------------------
// a model's MLP activation: GELU fused with fc (GPT-2: fc's output F wide) or SwiGLU after it (Llama: fc's output
// 2F wide, [gate | up])

// x (N, C) -> pre (N, F or 2F) fc's output (+ bias; NULL: none), act (N, F) the activation
static void mlp_fc_forward(int swiglu, floatX *act, floatX *pre, const floatX *x, const floatX *weight,
                           const floatX *bias, int N, int C, int F) {
    if (!swiglu) { matmul_forward_gelu(act, pre, x, weight, bias, N, C, F); return; }
    matmul_forward(pre, x, weight, bias, N, C, 2 * F);
    swiglu_forward(act, pre, N, F);
}

// fcproj's backward through the activation: dy (N, C) -> dpre (N, F or 2F) the gradient of fc's output (written;
// NULL: skipped), dweight (C, F) += fcproj's weight gradient (NULL: skipped). dact (N, F): SwiGLU's scratch.
static void mlp_proj_backward(int swiglu, floatX *dpre, floatX *dweight, const floatX *dy, const floatX *act,
                              const floatX *weight, const floatX *pre, floatX *dact, int N, int F, int C) {
    if (!swiglu) { matmul_backward_dgelu(dpre, dweight, dy, act, weight, pre, N, F, C); return; }
    matmul_backward(dpre ? dact : NULL, dweight, NULL, dy, act, weight, N, F, C);
    if (dpre) { swiglu_backward(dpre, dact, pre, N, F); }
}

// The same for count layers of N rows each, side by side in memory (a MoE layer's local experts, padded dispatch).
static void mlp_fc_forward_batched(int swiglu, floatX *act, floatX *pre, const floatX *x, const floatX *weight,
                                   const floatX *bias, int N, int C, int F, int count) {
    if (!swiglu) { matmul_forward_gelu_batched(act, pre, x, weight, bias, N, C, F, count); return; }
    matmul_forward_batched(pre, x, weight, bias, N, C, 2 * F, count);
    swiglu_forward(act, pre, N * count, F);
}
static void mlp_proj_backward_batched(int swiglu, floatX *dpre, floatX *dweight, const floatX *dy, const floatX *act,
                                      const floatX *weight, const floatX *pre, floatX *dact, int N, int F, int C,
                                      int count) {
    if (!swiglu) { matmul_backward_dgelu_batched(dpre, dweight, dy, act, weight, pre, N, F, C, count); return; }
    matmul_backward_batched(dpre ? dact : NULL, dweight, NULL, dy, act, weight, N, F, C, count);
    if (dpre) { swiglu_backward(dpre, dact, pre, N * count, F); }
}

#endif
