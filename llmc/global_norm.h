// Sum of squares of a gradient range, the building block of global-norm clipping.
// The caller sums the pieces it owns and reduces them over the grid (see zero.h).
#ifndef LLMC_GLOBAL_NORM_H
#define LLMC_GLOBAL_NORM_H

#include "backend.h"

// *out = sum of x[i]^2 (one float written to device memory). Fixed summation order.
static void sum_of_squares_cpu(float *out, const float *x, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) { sum += (double)x[i] * x[i]; }
    *out = (float)sum;
}

#ifdef USE_CUDA
// CUDA kernel goes here
#endif

static void sum_of_squares(float *out, const floatX *x, size_t n) {
#ifdef USE_CUDA
    sum_of_squares_cuda(out, x, n);
#else
    sum_of_squares_cpu(out, x, n);
#endif
}

#endif
