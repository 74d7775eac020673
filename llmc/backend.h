// The seam between the two backends. Everything above this file is shared host code.
//   BACKEND=cpu : g++ compiles the .cu files as C++, floatX = float, "device" memory is host memory.
//   BACKEND=cuda: nvcc, floatX = bf16 (or float with PRECISION=FP32), device memory is GPU memory.
// The host code only touches device memory through the launchers and the copy helpers below.
#ifndef LLMC_BACKEND_H
#define LLMC_BACKEND_H

#include "utils.h"

#if defined(__CUDACC__)
#define USE_CUDA 1
#endif

#ifdef USE_CUDA
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <nccl.h>
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

#ifdef USE_CUDA
static void cuda_check(cudaError_t err, const char *file, int line) {
    if (err != cudaSuccess) { fail("CUDA: %s at %s:%d", cudaGetErrorString(err), file, line); }
}
#define cudaCheck(err) (cuda_check((err), __FILE__, __LINE__))
static void cublas_check(cublasStatus_t st, const char *file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) { fail("cuBLAS status %d at %s:%d", (int)st, file, line); }
}
#define cublasCheck(st) (cublas_check((st), __FILE__, __LINE__))
static void nccl_check(ncclResult_t r, const char *file, int line) {
    if (r != ncclSuccess) { fail("NCCL: %s at %s:%d", ncclGetErrorString(r), file, line); }
}
#define ncclCheck(r) (nccl_check((r), __FILE__, __LINE__))

static cudaStream_t main_stream;        // all compute
static cudaStream_t comm_stream;        // asynchronous collectives (overlap with compute)
static cublasLtHandle_t cublaslt_handle;
static void *cublaslt_workspace;
static const size_t cublaslt_workspace_size = 32 * 1024 * 1024;
static int device_sm_count;
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#endif

// ----------------------------------------------------------------------------
// device init, copies, synchronisation (no-ops or memcpy on the CPU)

static void backend_init(int local_rank) {
#ifdef USE_CUDA
    int ndev = 0;
    cudaCheck(cudaGetDeviceCount(&ndev));
    if (ndev == 0) { fail("no CUDA device found"); }
    cudaCheck(cudaSetDevice(local_rank % ndev));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, local_rank % ndev));
    device_sm_count = prop.multiProcessorCount;
    cudaCheck(cudaStreamCreate(&main_stream));
    cudaCheck(cudaStreamCreate(&comm_stream));
    cublasCheck(cublasLtCreate(&cublaslt_handle));
    cudaCheck(cudaMalloc(&cublaslt_workspace, cublaslt_workspace_size));
#else
    (void)local_rank;
#endif
}

static void device_synchronize(void) {
#ifdef USE_CUDA
    cudaCheck(cudaStreamSynchronize(main_stream));
#endif
}

static void copy_to_device(void *dst, const void *src, size_t bytes) {
#ifdef USE_CUDA
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
#else
    memcpy(dst, src, bytes);
#endif
}

static void copy_to_host(void *dst, const void *src, size_t bytes) {
#ifdef USE_CUDA
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
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

static void zero_on_device(void *dst, size_t bytes) {
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
