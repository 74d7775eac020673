// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#ifndef LLMC_GELU_H
#define LLMC_GELU_H

#include "backend.h"

#define GELU_SCALE 0.7978845608028654f   // sqrt(2 / pi)

// The CPU loops use 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)), the same function, in a form
// that stays accurate where 1 + tanh(u) is small (x < -2) and vectorises with exp_poly (tanhf does not):
// out = x s, s = 1 / (1 + e), e = exp(-2u); 1 - s = e s; 1 - tanh^2(u) = 4 s (1 - s).
static void gelu_forward_cpu(float *out, const float *inp, size_t n) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + exp_poly(-2.0f * u));
    }
}
static void gelu_backward_cpu(float *dinp, const float *inp, const float *dout, size_t n) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float e = exp_poly(-2.0f * u), s = 1.0f / (1.0f + e);
        // d/dx [x s(2u)] = s + x 2 s (1 - s) du/dx,  du/dx = GELU_SCALE (1 + 3 0.044715 x^2)
        float grad = s + 2.0f * x * s * (e * s) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = grad * dout[i];
    }
}

#ifdef USE_CUDA
// out (n) = gelu(inp), elementwise, grid-stride
__global__ void gelu_forward_kernel(floatX *out, const floatX *inp, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = (float)inp[i];
        out[i] = (floatX)(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))));
    }
}

// dinp (n) = gelu'(inp) * dout; each element is read before it is written, so dinp may alias dout
__global__ void gelu_backward_kernel(floatX *dinp, const floatX *inp, const floatX *dout, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = (float)inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = (floatX)(grad * (float)dout[i]);
    }
}

static void gelu_forward_cuda(floatX *out, const floatX *inp, size_t n) {
    if (n == 0) { return; }
    LAUNCH(gelu_forward_kernel, elementwise_grid(n, 256), 256, 0, main_stream)(out, inp, n);
    cudaCheckLaunch();
}

static void gelu_backward_cuda(floatX *dinp, const floatX *inp, const floatX *dout, size_t n) {
    if (n == 0) { return; }
    LAUNCH(gelu_backward_kernel, elementwise_grid(n, 256), 256, 0, main_stream)(dinp, inp, dout, n);
    cudaCheckLaunch();
}
#endif

static void gelu_forward(floatX *out, const floatX *inp, size_t n) {
#ifdef USE_CUDA
    gelu_forward_cuda(out, inp, n);
#else
    gelu_forward_cpu(out, inp, n);
#endif
}

static void gelu_backward(floatX *dinp, const floatX *inp, const floatX *dout, size_t n) {
#ifdef USE_CUDA
    gelu_backward_cuda(dinp, inp, dout, n);
#else
    gelu_backward_cpu(dinp, inp, dout, n);
#endif
}

#endif
