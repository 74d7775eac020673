// The seam between the two backends. Everything above this file is shared host code.
//   BACKEND=cpu : g++ compiles the .cu files as C++, floatX = float, "device" memory is host memory.
//   BACKEND=cuda: nvcc, floatX = bf16 (or float with PRECISION=FP32), device memory is GPU memory.
// The host code only touches device memory through the launchers and the copy helpers below.
#ifndef LLMC_BACKEND_H
#define LLMC_BACKEND_H

#include "utils.h"
#include "guard.h"

// USE_CUDA: the CUDA code paths, compiled by nvcc for a GPU or by g++ for the emulated device (BACKEND=emu, which
// defines it; llmc/emu/device.h)
#if defined(__CUDACC__) && !defined(USE_CUDA)
#define USE_CUDA 1
#endif
#if defined(USE_CUDA) && !defined(NO_MPI) && !defined(USE_NCCL)
#define USE_NCCL 1     // multi-GPU collectives; a NO_MPI build runs one process and needs none
#endif

// The CUDA build's cuBLAS/cuBLASLt workspace (allocated at the first GEMM; a memory plan counts it).
#define CUBLASLT_WORKSPACE_BYTES ((size_t)32 * 1024 * 1024)

#ifdef USE_CUDA
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#ifdef USE_NCCL
#include <nccl.h>
#endif
// kernel<<<grid, block, smem, stream>>>(args) written LAUNCH(kernel, grid, block, smem, stream)(args), and the
// dynamic shared memory of a kernel, so that the emulated device can run the same source
#define LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#else
#include "emu/device.h"   // the CUDA runtime, cuBLASLt, NCCL and a block's threads on the CPU
#endif
#if defined(ENABLE_FP32)
typedef float floatX;
#define PRECISION_NAME "fp32"
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#endif
#else
#include <cblas.h>
typedef float floatX;
#define PRECISION_NAME "fp32"
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

// exp(x) in a form the compiler vectorises (expf is a library call per element): 2^n exp(r) with
// n = round(x / ln 2) (by the 1.5 * 2^23 trick: no floorf, which blocks vectorisation), r = x - n ln 2 in
// two parts (Cody-Waite), exp(r) by Cephes' degree-7 polynomial. Within 1.43 u (u = 2^-24) of exp over
// [-87, 1] (checked exhaustively against double exp; expf: 1.0 u); x below -87 gives exp(-87) ~ 1.6e-38
// (the softmaxes that call it add it to a sum of at least 1, the row's largest term); exp(0) = 1.
// The CPU softmaxes (attention.h, fused_ce.h) use it with `#pragma omp simd`.
static inline float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float t = x * 1.44269504088896341f + 12582912.0f, n = t - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t ti, e;
    memcpy(&ti, &t, 4);
    e = (ti - 0x4B400000 + 127) << 23;   // 2^n: n + 127 in the exponent bits
    float s;
    memcpy(&s, &e, 4);
    return p * s;
}

#ifdef USE_CUDA
static void cuda_check(cudaError_t err, const char *file, int line) {
    if (err != cudaSuccess) { fail("CUDA: %s at %s:%d", cudaGetErrorString(err), file, line); }
}
#define cudaCheck(err) (cuda_check((err), __FILE__, __LINE__))
static void cublas_check(cublasStatus_t st, const char *file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) { fail("cuBLAS status %d at %s:%d", (int)st, file, line); }
}
#define cublasCheck(st) (cublas_check((st), __FILE__, __LINE__))
#ifdef USE_NCCL
static void nccl_check(ncclResult_t r, const char *file, int line) {
    if (r != ncclSuccess) { fail("NCCL: %s at %s:%d", ncclGetErrorString(r), file, line); }
}
#define ncclCheck(r) (nccl_check((r), __FILE__, __LINE__))
#endif

static cudaStream_t main_stream;        // all compute (each communication group has its own stream: comm.h)
static cublasLtHandle_t cublaslt_handle;
static void *cublaslt_workspace;   // allocated on first use through the allocator (matmul.h)
static const size_t cublaslt_workspace_size = CUBLASLT_WORKSPACE_BYTES;
static int device_sm_count;
static int device_ready = 0;        // backend_init has run: a device to ask (cudnn_attention.h: the workspace's need)

// A kernel launch is checked right after it is queued (launch configuration errors).
#define cudaCheckLaunch() cudaCheck(cudaGetLastError())

// The CPU loops are compiled in the CUDA build too (they are the specification the dev/cuda
// harnesses check against), but the CUDA build links no BLAS. This plain row-major sgemm stands
// in for OpenBLAS there; train_gpt never calls it (every launcher takes the CUDA path).
typedef enum { CblasRowMajor = 101, CblasColMajor = 102 } cblas_order_t;
typedef enum { CblasNoTrans = 111, CblasTrans = 112 } cblas_transpose_t;
static void cblas_sgemm(cblas_order_t order, cblas_transpose_t ta, cblas_transpose_t tb, int M, int N, int K,
                        float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *Cm, int ldc) {
    if (order != CblasRowMajor) { fail("reference cblas_sgemm: only row-major is supported"); }
    // C (M, N) = alpha op(A) (M, K) op(B) (K, N) + beta C
    #pragma omp parallel
    {
        float *row = (float *)malloc_check(sizeof(float) * (N > 0 ? N : 1));
        #pragma omp for
        for (int i = 0; i < M; i++) {
            for (int j = 0; j < N; j++) { row[j] = 0.0f; }
            if (ta == CblasNoTrans && tb == CblasTrans) {     // rows of A and B are contiguous: dot products
                for (int j = 0; j < N; j++) {
                    const float *a = A + (size_t)i * lda, *b = B + (size_t)j * ldb;
                    float s = 0.0f;
                    for (int k = 0; k < K; k++) { s += a[k] * b[k]; }
                    row[j] = s;
                }
            } else {                                          // row i of C as a sum of rows of op(B)
                for (int k = 0; k < K; k++) {
                    float a = ta == CblasNoTrans ? A[(size_t)i * lda + k] : A[(size_t)k * lda + i];
                    if (tb == CblasNoTrans) {
                        const float *b = B + (size_t)k * ldb;
                        for (int j = 0; j < N; j++) { row[j] += a * b[j]; }
                    } else {
                        for (int j = 0; j < N; j++) { row[j] += a * B[(size_t)j * ldb + k]; }
                    }
                }
            }
            float *c = Cm + (size_t)i * ldc;
            for (int j = 0; j < N; j++) { c[j] = alpha * row[j] + (beta == 0.0f ? 0.0f : beta * c[j]); }
        }
        free(row);
    }
}

// ---- device helpers shared by the kernels (all math in fp32, floatX only in memory) ----

// xor-butterfly: every lane ends with the same value, and the order of additions is fixed,
// so the result is deterministic.
__device__ __forceinline__ float warp_reduce_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, off); }
    return v;
}
__device__ __forceinline__ float warp_reduce_max(float v) {
    for (int off = 16; off > 0; off >>= 1) { v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off)); }
    return v;
}

// Sum (or max) over the whole block, returned to every thread. blockDim.x must be a multiple of
// 32 (at most 1024); every thread of the block must call it. Safe to call repeatedly.
__device__ __forceinline__ float block_reduce_sum(float v) {
    __shared__ float buf[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_reduce_sum(v);
    __syncthreads();                       // buf may still be read by a previous call
    if (lane == 0) { buf[warp] = v; }
    __syncthreads();
    return warp_reduce_sum(lane < nwarps ? buf[lane] : 0.0f);
}
__device__ __forceinline__ float block_reduce_max(float v) {
    __shared__ float buf[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_reduce_max(v);
    __syncthreads();
    if (lane == 0) { buf[warp] = v; }
    __syncthreads();
    return warp_reduce_max(lane < nwarps ? buf[lane] : -INFINITY);
}

// A cheap, well-mixed 32-bit hash (the "lowbias32" finaliser) of (seed, index): random bits for
// stochastic rounding, reproducible for a given seed.
__host__ __device__ __forceinline__ unsigned int hash_u32(unsigned int x) {
    x ^= x >> 16; x *= 0x7feb352du;
    x ^= x >> 15; x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
__host__ __device__ __forceinline__ unsigned int random_bits(unsigned int seed, size_t i) {
    return hash_u32((unsigned int)i ^ hash_u32(seed ^ hash_u32((unsigned int)(i >> 32) + 0x9e3779b9u)));
}

// fp32 -> floatX with stochastic rounding (bf16: add 16 random bits below the kept mantissa,
// then truncate, so E[result] = x). fp32 build: identity.
__device__ __forceinline__ floatX float_to_floatX_stochastic(float x, unsigned int bits) {
#if defined(ENABLE_FP32)
    (void)bits;
    return x;
#else
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) { return __float2bfloat16_rn(x); }   // inf / nan unchanged
    u = (u + (bits & 0xffffu)) & 0xffff0000u;
    return __ushort_as_bfloat16((unsigned short)(u >> 16));
#endif
}

// Grid for an elementwise kernel over n items: enough blocks to fill the GPU, grid-stride beyond
static unsigned int elementwise_grid(size_t n, int block) {
    size_t blocks = ceil_div(n, (size_t)block), cap = (size_t)(device_sm_count > 0 ? device_sm_count : 132) * 16;
    return (unsigned int)(blocks < cap ? blocks : cap);
}

#endif

// ----------------------------------------------------------------------------
// device init, copies, synchronisation (no-ops or memcpy on the CPU)

// Before anything can create a CUDA context (MPI_Init included), what the multi-stream design needs, unless the
// user set it: a hardware queue per stream (CUDA_DEVICE_MAX_CONNECTIONS: the compute stream and up to 9
// communicators' streams would otherwise share 8, ordering unrelated work), and NCCL (>= 2.26) ordering the
// kernels of different communicators as the host issued them (NCCL_LAUNCH_ORDER_IMPLICIT: every rank issues
// them in the same order, so concurrent communicators cannot deadlock). Older NCCLs ignore the variable.
static void backend_env_before_init(void) {
#ifdef USE_CUDA
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);
#endif
}

static void backend_init(int local_rank) {
#ifdef USE_CUDA
    int ndev = 0;
    cudaCheck(cudaGetDeviceCount(&ndev));
    if (ndev == 0) { fail("no CUDA device found"); }
    cudaCheck(cudaSetDevice(local_rank % ndev));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, local_rank % ndev));
    device_sm_count = prop.multiProcessorCount;
    // non-blocking: no implicit wait on the legacy stream (nothing here uses it: every copy, memset and
    // kernel names its stream)
    cudaCheck(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking));
    cublasCheck(cublasLtCreate(&cublaslt_handle));
    device_ready = 1;
#else
    (void)local_rank;
#endif
}

// Bytes free on this rank's device (0 on the CPU: no limit known).
static double device_free_bytes(void) {
#ifdef USE_CUDA
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    return (double)free_b;
#else
    return 0.0;
#endif
}

// Every host wait on the device is watched (guard.h): with NCCL a hung collective shows as a wait that never ends,
// and the watchdog only sees a wait it watches. Not only the synchronisations wait: a cudaMemcpyAsync between
// device and pageable host memory (most of the copies below: the host arrays are the callers' own) returns only
// once the copy landed (to the host) or may wait for the stream to stage it (from the host), so the copy is
// watched as well. (On an H200 a copy of the step's loss to the stack, unwatched, waited forever behind a peer's
// stopped all-reduce: rank 0's watchdog never fired.)
static void device_synchronize(void) {
#ifdef USE_CUDA
    WATCHED("device synchronize", "-", cudaCheck(cudaStreamSynchronize(main_stream)));
#endif
}

static void copy_to_device(void *dst, const void *src, size_t bytes) {
#ifdef USE_CUDA
    watch_enter("device synchronize (a copy to the device)", "-");
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    watch_leave();
#else
    memcpy(dst, src, bytes);
#endif
}

// Queued on the compute stream, no wait: src must stay unchanged until the device has run the copy
// (page-locked from host_alloc_pinned; pageable memory is staged by the driver before the call returns).
static void copy_to_device_async(void *dst, const void *src, size_t bytes) {
#ifdef USE_CUDA   // (watched: staging a pageable source may wait for the stream)
    WATCHED("device synchronize (a copy to the device)", "-",
            cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, main_stream)));
#else
    memcpy(dst, src, bytes);
#endif
}

// Set-up is over (mem_setup_done, alloc.h): from the first step on nothing is allocated or freed (on CUDA a
// device or page-locked allocation, and a free, waits for the whole device).
static int device_setup_done = 0;
static void fail_after_setup(const char *what, size_t bytes, const char *of) {
    fail("%s of %zu bytes (%s) after set-up: every buffer is allocated before the first step (a bug)", what, bytes, of);
}

// Host memory the device copies from without staging (page-locked on CUDA)
static void *host_alloc_pinned(size_t bytes) {
    if (device_setup_done) { fail_after_setup("a page-locked host allocation", bytes, "host_alloc_pinned"); }
#ifdef USE_CUDA
    void *p = NULL;
    cudaCheck(cudaMallocHost(&p, bytes > 0 ? bytes : 1));
    return p;
#else
    return malloc_check(bytes > 0 ? bytes : 1);
#endif
}

static void copy_to_host(void *dst, const void *src, size_t bytes) {
#ifdef USE_CUDA   // (the copy itself waits when dst is pageable: watched with the synchronisation)
    watch_enter("device synchronize (a copy to the host)", "-");
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    watch_leave();
#else
    memcpy(dst, src, bytes);
#endif
}

static void copy_on_device(void *dst, const void *src, size_t bytes) {
#ifdef USE_CUDA
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, main_stream));
#else
    memmove(dst, src, bytes);
#endif
}

static void memset_zero_device(void *dst, size_t bytes) {
#ifdef USE_CUDA
    cudaCheck(cudaMemsetAsync(dst, 0, bytes, main_stream));
#else
    memset(dst, 0, bytes);
#endif
}

// floatX <-> float on the host (for loading, saving and testing)
static float floatX_to_float(floatX x) { return (float)x; }
static floatX float_to_floatX(float x) { return (floatX)x; }

// host fp32 array -> device floatX array
static void upload_floats(floatX *dst, const float *src, size_t n) {
#ifdef USE_CUDA
    floatX *tmp = (floatX *)malloc_check(n * sizeof(floatX));
    for (size_t i = 0; i < n; i++) { tmp[i] = float_to_floatX(src[i]); }
    copy_to_device(dst, tmp, n * sizeof(floatX));
    free(tmp);
#else
    memcpy(dst, src, n * sizeof(float));
#endif
}

// device floatX array -> host fp32 array
static void download_floats(float *dst, const floatX *src, size_t n) {
#ifdef USE_CUDA
    floatX *tmp = (floatX *)malloc_check(n * sizeof(floatX));
    copy_to_host(tmp, src, n * sizeof(floatX));
    for (size_t i = 0; i < n; i++) { dst[i] = floatX_to_float(tmp[i]); }
    free(tmp);
#else
    memcpy(dst, src, n * sizeof(float));
#endif
}

#endif
