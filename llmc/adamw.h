// AdamW as in llm.c: decoupled weight decay, bias correction, gradients pre-scaled by the clip factor.
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr (mhat / (sqrt(vhat) + eps) + wd p)
// With bf16 parameters (CUDA) the fp32 master copy is updated and rounded stochastically into
// the bf16 parameters; on the CPU (fp32 everywhere) master is NULL and the parameters are the master.
#ifndef LLMC_ADAMW_H
#define LLMC_ADAMW_H

#include "backend.h"

static void adamw_update_cpu(float *params, float *master, const float *grads, float *m, float *v, size_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             float grad_scale, int t, unsigned int seed) {
    (void)seed;
    float b1c = 1.0f - powf(beta1, (float)t), b2c = 1.0f - powf(beta2, (float)t);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = master ? master[i] : params[i];
        p -= lr * ((mi / b1c) / (sqrtf(vi / b2c) + eps) + weight_decay * p);
        if (master) { master[i] = p; }
        params[i] = p;
    }
}

#ifdef USE_CUDA
// One thread per parameter (grid-stride). With master != NULL the fp32 master weight is updated and
// rounded stochastically into params (random bits: a hash of (seed, i)); without, params is the
// master (fp32 build; a bf16 params-only update is rounded stochastically too).
__global__ void adamw_kernel(floatX *params, float *master, const floatX *grads, float *m, float *v, size_t n,
                             float lr, float beta1, float beta2, float b1c, float b2c, float eps, float weight_decay,
                             float grad_scale, unsigned int seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = (float)grads[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = master != NULL ? master[i] : (float)params[i];
        p -= lr * ((mi / b1c) / (sqrtf(vi / b2c) + eps) + weight_decay * p);
        if (master != NULL) { master[i] = p; }
        params[i] = float_to_floatX_stochastic(p, random_bits(seed, i));
    }
}

static void adamw_update_cuda(floatX *params, float *master, const floatX *grads, float *m, float *v, size_t n,
                              float lr, float beta1, float beta2, float eps, float weight_decay,
                              float grad_scale, int t, unsigned int seed) {
    if (n == 0) { return; }
    float b1c = 1.0f - powf(beta1, (float)t), b2c = 1.0f - powf(beta2, (float)t);   // as the CPU loop
    adamw_kernel<<<elementwise_grid(n, 256), 256, 0, main_stream>>>(params, master, grads, m, v, n, lr, beta1, beta2,
                                                                     b1c, b2c, eps, weight_decay, grad_scale, seed);
    cudaCheckLaunch();
}
#endif

static void adamw_update(floatX *params, float *master, const floatX *grads, float *m, float *v, size_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         float grad_scale, int t, unsigned int seed) {
#ifdef USE_CUDA
    adamw_update_cuda(params, master, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t, seed);
#else
    adamw_update_cpu(params, master, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t, seed);
#endif
}

#endif
