// Sum of squares of a gradient range, the building block of global-norm clipping.
// The caller sums the pieces it owns and reduces them over the grid (see zero.h).
#ifndef LLMC_GLOBAL_NORM_H
#define LLMC_GLOBAL_NORM_H

#include "backend.h"

// *out = sum of x[i]^2 (one float written to device memory), in fp64. Fixed summation order, whatever the
// threads: blocks of SOS_CPU_BLOCK elements, each summed in 8 lanes (lane l: elements i = l mod 8, then the
// lanes in order), the block sums added in block order. The lanes vectorize and the blocks run in parallel
// (one long chain of dependent adds ran at one add per 3-4 cycles).
#define SOS_CPU_BLOCK 16384
#define SOS_CPU_BATCH 256   // blocks summed in parallel before their sums are added in order
static double sum_of_squares_block_cpu(const float *x, size_t n) {
    double lane[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}, sum = 0.0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8; l++) { lane[l] += (double)x[i + l] * x[i + l]; }
    }
    for (; i < n; i++) { lane[i % 8] += (double)x[i] * x[i]; }
    for (int l = 0; l < 8; l++) { sum += lane[l]; }
    return sum;
}
static void sum_of_squares_cpu(float *out, const float *x, size_t n) {
    double sum = 0.0, block[SOS_CPU_BATCH];
    size_t nblocks = (n + SOS_CPU_BLOCK - 1) / SOS_CPU_BLOCK;
    for (size_t b0 = 0; b0 < nblocks; b0 += SOS_CPU_BATCH) {
        int nb = nblocks - b0 < SOS_CPU_BATCH ? (int)(nblocks - b0) : SOS_CPU_BATCH;
        #pragma omp parallel for if (nb > 1)
        for (int b = 0; b < nb; b++) {
            size_t i0 = (b0 + b) * SOS_CPU_BLOCK, len = n - i0 < SOS_CPU_BLOCK ? n - i0 : SOS_CPU_BLOCK;
            block[b] = sum_of_squares_block_cpu(x + i0, len);
        }
        for (int b = 0; b < nb; b++) { sum += block[b]; }
    }
    *out = (float)sum;
}

#ifdef USE_CUDA
// Deterministic two-pass sum of squares: a grid of at most SOS_BLOCKS blocks, its size a function of n alone
// (never of the device: the same n sums in the same order everywhere), each block writes one partial (fp64) to a
// static device array, then one block adds the partials in a fixed tree order. A block covers at least
// SOS_PER_THREAD elements a thread (a small tensor gets few blocks, not 512 idle ones). Launches are ordered on
// main_stream, so one array suffices.
#define SOS_BLOCKS 512
#define SOS_PER_THREAD 8
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

// x (n) -> sos_partials[blockIdx.x]: block b sums elements b*SOS_THREADS + tid + k*gridDim.x*SOS_THREADS
__global__ void sum_of_squares_partial_kernel(const floatX *x, size_t n) {
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double xi = (double)(float)x[i];
        acc += xi * xi;
    }
    acc = block_reduce_sum_f64(acc);
    if (threadIdx.x == 0) { sos_partials[blockIdx.x] = acc; }
}

// one block: *out = sum of the nblocks partials
__global__ void sum_of_squares_final_kernel(float *out, int nblocks) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < nblocks; i += blockDim.x) { acc += sos_partials[i]; }
    acc = block_reduce_sum_f64(acc);
    if (threadIdx.x == 0) { *out = (float)acc; }
}

static void sum_of_squares_cuda(float *out, const floatX *x, size_t n) {
    size_t per_block = (size_t)SOS_THREADS * SOS_PER_THREAD, want = (n + per_block - 1) / per_block;
    int nblocks = want < 1 ? 1 : want > SOS_BLOCKS ? SOS_BLOCKS : (int)want;
    LAUNCH(sum_of_squares_partial_kernel, nblocks, SOS_THREADS, 0, main_stream)(x, n);
    cudaCheckLaunch();
    LAUNCH(sum_of_squares_final_kernel, 1, SOS_THREADS, 0, main_stream)(out, nblocks);
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

// ----------------------------------------------------------------------------
// The end of a step without the host: the loss and the squared gradient norm summed on the device, one
// all-reduce of the two over every rank (the caller's), then the factor AdamW scales the gradients by:
// clip / norm above the clip, 1 below, 0 when the loss or the norm is not finite or above its limit (a
// divergence: the limits come from earlier steps, guard.h) (AdamW then skips the update: adamw.h). The
// host reads the struct once, when the step is over.
enum { SKIP_NONE, SKIP_NOT_FINITE, SKIP_LOSS, SKIP_NORM };

// The guard's counters: AdamW updates applied; skipped (a non-finite or diverging loss or norm): in all, in a row;
// and the limits the next update is held to (above either, it is skipped: step_stats_clip).
typedef struct { int updates, skips, skips_in_a_row; float loss_limit, norm_limit; } UpdateGuard;
typedef struct {
    double loss_sum, norm_sq;   // this rank's part, then (after the all-reduce) every rank's
    float loss, norm, scale;    // loss_sum / tokens, sqrt(norm_sq); the gradient scale (0: skip)
    float why;                  // why the update is skipped (SKIP_*)
} StepStats;

// The CPU loops, run by one GPU thread as they are.
// st->norm_sq = the n partial sums of squares added in order; st->loss_sum = *loss_sum (NULL: 0)
#ifdef USE_CUDA
__host__ __device__
#endif
static inline void step_stats_gather_body(StepStats *st, const float *parts, int n, const double *loss_sum) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) { sum += parts[i]; }
    st->norm_sq = sum;
    st->loss_sum = loss_sum != NULL ? *loss_sum : 0.0;
}

// loss = loss_sum / tokens; norm = sqrt(norm_sq); scale as above (clip 0: no clipping)
#ifdef USE_CUDA
__host__ __device__
#endif
static inline void step_stats_clip_body(StepStats *st, double tokens, float clip, float loss_limit, float norm_limit) {
    float loss = (float)(st->loss_sum / tokens), norm = (float)sqrt(st->norm_sq);
    st->loss = loss;
    st->norm = norm;
    st->why = !isfinite(loss) || !isfinite(norm) ? SKIP_NOT_FINITE : loss > loss_limit ? SKIP_LOSS
              : norm > norm_limit ? SKIP_NORM : SKIP_NONE;
    if (st->why != SKIP_NONE) { st->scale = 0.0f; }
    // (fp64: exact under fast math)
    else {
        st->scale = clip > 0.0f && norm > clip ? (float)((double)clip / norm) : 1.0f;
    }
}

#ifdef USE_CUDA
// one thread each: a few hundred parts, in the CPU loop's order
__global__ void step_stats_gather_kernel(StepStats *st, const float *parts, int n, const double *loss_sum) {
    step_stats_gather_body(st, parts, n, loss_sum);
}
__global__ void step_stats_clip_kernel(StepStats *st, double tokens, float clip, float loss_limit, float norm_limit) {
    step_stats_clip_body(st, tokens, clip, loss_limit, norm_limit);
}
#endif

static void step_stats_gather(StepStats *st, const float *parts, int n, const double *loss_sum) {
#ifdef USE_CUDA
    LAUNCH(step_stats_gather_kernel, 1, 1, 0, main_stream)(st, parts, n, loss_sum);
    cudaCheckLaunch();
#else
    step_stats_gather_body(st, parts, n, loss_sum);
#endif
}

static void step_stats_clip(StepStats *st, double tokens, float clip, float loss_limit, float norm_limit) {
#ifdef USE_CUDA
    LAUNCH(step_stats_clip_kernel, 1, 1, 0, main_stream)(st, tokens, clip, loss_limit, norm_limit);
    cudaCheckLaunch();
#else
    step_stats_clip_body(st, tokens, clip, loss_limit, norm_limit);
#endif
}

#endif
