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
// Deterministic two-pass sum of squares: a FIXED grid of SOS_BLOCKS blocks (independent of the
// device) each writes one partial (fp64) to a static device array, then one block adds the
// partials in a fixed tree order. Launches are ordered on main_stream, so one array suffices.
#define SOS_BLOCKS 512
#define SOS_THREADS 512
static __device__ double sos_partials[SOS_BLOCKS];

__device__ __forceinline__ double warp_reduce_sum_f64(double v) {
    for (int off = 16; off > 0; off >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, off); }
    return v;
}
__device__ double block_reduce_sum_f64(double v) {
    __shared__ double buf[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_reduce_sum_f64(v);
    __syncthreads();
    if (lane == 0) { buf[warp] = v; }
    __syncthreads();
    return warp_reduce_sum_f64(lane < nwarps ? buf[lane] : 0.0);
}

// x (n) -> sos_partials[blockIdx.x]: block b sums elements b*SOS_THREADS + tid + k*SOS_BLOCKS*SOS_THREADS
__global__ void sum_of_squares_partial_kernel(const floatX *x, size_t n) {
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double xi = (double)(float)x[i];
        acc += xi * xi;
    }
    acc = block_reduce_sum_f64(acc);
    if (threadIdx.x == 0) { sos_partials[blockIdx.x] = acc; }
}

// one block: *out = sum of the SOS_BLOCKS partials
__global__ void sum_of_squares_final_kernel(float *out) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < SOS_BLOCKS; i += blockDim.x) { acc += sos_partials[i]; }
    acc = block_reduce_sum_f64(acc);
    if (threadIdx.x == 0) { *out = (float)acc; }
}

static void sum_of_squares_cuda(float *out, const floatX *x, size_t n) {
    sum_of_squares_partial_kernel<<<SOS_BLOCKS, SOS_THREADS, 0, main_stream>>>(x, n);
    cudaCheckLaunch();
    sum_of_squares_final_kernel<<<1, SOS_THREADS, 0, main_stream>>>(out);
    cudaCheckLaunch();
}
#endif

static void sum_of_squares(float *out, const floatX *x, size_t n) {
#ifdef USE_CUDA
    sum_of_squares_cuda(out, x, n);
#else
    sum_of_squares_cpu(out, x, n);
#endif
}

#endif
