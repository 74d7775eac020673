// Linear layers: out = inp @ weight^T + bias, weight (OC, IC) like PyTorch and llm.c.
// CPU: OpenBLAS sgemm (row-major). CUDA: cuBLASLt.
#ifndef LLMC_MATMUL_H
#define LLMC_MATMUL_H

#include "backend.h"

// inp (N, IC), weight (OC, IC), bias (OC) or NULL -> out (N, OC)
static void matmul_forward_cpu(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f, out, OC);
    if (bias != NULL) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) {
            float *o = out + (size_t)n * OC;
            for (int o2 = 0; o2 < OC; o2++) { o[o2] += bias[o2]; }
        }
    }
}

// dinp (N, IC) = dout @ weight        (written, not accumulated; NULL to skip)
// dweight (OC, IC) += dout^T @ inp    (NULL to skip)
// dbias (OC) += sum over N of dout    (NULL to skip)
static void matmul_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                const float *weight, int N, int IC, int OC) {
    if (dinp != NULL) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
    }
    if (dweight != NULL) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
    }
    if (dbias != NULL) {
        #pragma omp parallel for
        for (int o = 0; o < OC; o++) {
            float sum = 0.0f;
            for (int n = 0; n < N; n++) { sum += dout[(size_t)n * OC + o]; }
            dbias[o] += sum;
        }
    }
}

#ifdef USE_CUDA
// cuBLASLt matmuls go here
#endif

static void matmul_forward(floatX *out, const floatX *inp, const floatX *weight, const floatX *bias, int N, int IC, int OC) {
#ifdef USE_CUDA
    matmul_forward_cuda(out, inp, weight, bias, N, IC, OC);
#else
    matmul_forward_cpu(out, inp, weight, bias, N, IC, OC);
#endif
}

static void matmul_backward(floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout, const floatX *inp,
                            const floatX *weight, int N, int IC, int OC) {
#ifdef USE_CUDA
    matmul_backward_cuda(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
#else
    matmul_backward_cpu(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
#endif
}

#endif
