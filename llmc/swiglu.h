// SwiGLU (Llama's MLP activation): h = silu(gate) * up, silu(g) = g sigmoid(g) = g / (1 + exp(-g)).
// The fc output row is [gate (F) | up (F)] (under tensor parallelism: this rank's [gate_local | up_local]).
#ifndef LLMC_SWIGLU_H
#define LLMC_SWIGLU_H

#include "backend.h"

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
    swiglu_forward_kernel<<<elementwise_grid(total, 256), 256, 0, main_stream>>>(out, inp, N, F);
    cudaCheckLaunch();
}

static void swiglu_backward_cuda(floatX *dinp, const floatX *dout, const floatX *inp, int N, int F) {
    size_t total = (size_t)N * F;
    if (N <= 0 || F <= 0) { return; }
    swiglu_backward_kernel<<<elementwise_grid(total, 256), 256, 0, main_stream>>>(dinp, dout, inp, N, F);
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

#endif
