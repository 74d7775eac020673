// The emulated device's cuBLAS (cublas_v2.h's API): the handle (a stream, a workspace, a math mode),
// cublasGemmStridedBatchedEx and cublasGemmGroupedBatchedEx, on cublas.h's GEMM (what it models and what it does not:
// cublas.h's opening).
#ifndef LLMC_EMU_CUBLAS_BATCHED_H
#define LLMC_EMU_CUBLAS_BATCHED_H

#include "cublas.h"

// ---------------------------------------------------------------------------------------------------------------
// cuBLAS: the handle (a stream, a workspace, a math mode) and the two batched GEMMs

struct cublasContext {
    uint64_t magic;
    cudaStream_t stream;   // NULL: the legacy default stream
    void *workspace;
    size_t workspace_bytes;
    cublasMath_t math;
};

static int emu_blas_handle_ok(cublasHandle_t h) { return h != NULL && h->magic == EMU_LT_MAGIC; }

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (handle == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    struct cublasContext *h = (struct cublasContext *)calloc(1, sizeof(struct cublasContext));
    if (h == NULL) { return CUBLAS_STATUS_ALLOC_FAILED; }
    h->magic = EMU_LT_MAGIC;
    h->math = CUBLAS_DEFAULT_MATH;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (!emu_blas_handle_ok(handle)) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    handle->magic = 0;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

// (as cuBLAS: a new stream drops the workspace set before; set it again after)
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
    if (!emu_blas_handle_ok(handle)) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    handle->stream = streamId;
    handle->workspace = NULL;
    handle->workspace_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId) {
    if (!emu_blas_handle_ok(handle)) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    if (streamId == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    *streamId = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes) {
    if (!emu_blas_handle_ok(handle)) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    if (workspace == NULL && workspaceSizeInBytes > 0) { return CUBLAS_STATUS_INVALID_VALUE; }
    handle->workspace = workspace;
    handle->workspace_bytes = workspaceSizeInBytes;
    return CUBLAS_STATUS_SUCCESS;
}

// Default or pedantic math, with or without DISALLOW_REDUCED_PRECISION_REDUCTION (the sums are fp32 either way).
// TF32, the deprecated tensor-op mode (fp16 inputs) and BF16x9 emulation would change fp32 GEMMs' results: refused.
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!emu_blas_handle_ok(handle)) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    unsigned flags = (unsigned)mode & CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    unsigned base = (unsigned)mode & ~flags;
    if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_PEDANTIC_MATH) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
    if (!emu_blas_handle_ok(handle)) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    if (mode == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

// The arguments of one cuBLAS GEMM (C = alpha op(A) op(B) + beta C): sizes >= 0, ld >= the stored rows (>= 1),
// ops N, T or C; types as emu_blas_types_ok with C for both C and D; compute 32F.
static cublasStatus_t emu_blas_check_args(cublasOperation_t transa, cublasOperation_t transb, int64_t m, int64_t n,
                                          int64_t k, cudaDataType_t at, int64_t lda, cudaDataType_t btype, int64_t ldb,
                                          cudaDataType_t ct, int64_t ldc, cublasComputeType_t computeType) {
    int ta = emu_blas_transposed(transa), tb = emu_blas_transposed(transb);
    if (ta < 0 || tb < 0 || m < 0 || n < 0 || k < 0) { return CUBLAS_STATUS_INVALID_VALUE; }
    int64_t arows = ta ? k : m, brows = tb ? n : k;
    if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (computeType != CUBLAS_COMPUTE_32F) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    return emu_blas_types_ok(at, btype, ct, ct);
}

// one GEMM's EmuGemm from cuBLAS's arguments (C is also D; no epilogue); pointers left to the caller
static EmuGemm emu_blas_plain_gemm(cublasOperation_t transa, cublasOperation_t transb, int64_t m, int64_t n, int64_t k,
                                   float alpha, cudaDataType_t at, int64_t lda, cudaDataType_t btype, int64_t ldb,
                                   float beta, cudaDataType_t ct, int64_t ldc) {
    EmuGemm g;
    memset(&g, 0, sizeof(g));
    g.m = m; g.n = n; g.k = k;
    g.transa = emu_blas_transposed(transa); g.transb = emu_blas_transposed(transb);
    g.atype = at; g.lda = lda;
    g.btype = btype; g.ldb = ldb;
    g.ctype = ct; g.ldc = ldc;
    g.dtype = ct; g.ldd = ldc;
    g.alpha = alpha; g.beta = beta;
    return g;
}

// batchCount GEMMs C_i = alpha op(A_i) op(B_i) + beta C_i, X_i at X + i strideX (elements); alpha, beta host floats
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
    (void)algo;   // (every algorithm computes the same)
    if (!emu_blas_handle_ok(handle)) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    if (alpha == NULL || beta == NULL || batchCount < 0) { return CUBLAS_STATUS_INVALID_VALUE; }
    cublasStatus_t st = emu_blas_check_args(transa, transb, m, n, k, Atype, lda, Btype, ldb, Ctype, ldc, computeType);
    if (st != CUBLAS_STATUS_SUCCESS) { return st; }
    if (batchCount == 0) { return CUBLAS_STATUS_SUCCESS; }
    EmuGemmBatch bt;
    memset(&bt, 0, sizeof(bt));
    bt.g = emu_blas_plain_gemm(transa, transb, m, n, k, *(const float *)alpha, Atype, lda, Btype, ldb,
                               *(const float *)beta, Ctype, ldc);
    bt.g.a = A; bt.g.b = B; bt.g.c = C; bt.g.d = C;
    bt.count = batchCount;
    bt.sa = strideA; bt.sb = strideB; bt.sc = strideC; bt.sd = strideC;
    snprintf(bt.what, sizeof(bt.what), "cublasGemmStridedBatchedEx m=%d n=%d k=%d batch=%d", m, n, k, batchCount);
    emu_blas_enqueue_batch(handle->stream, &bt);
    return CUBLAS_STATUS_SUCCESS;
}

// The grouped GEMM's queued work: problem i's A, B, C pointers read now (the step runs) from the device arrays
// Aarray, Barray, Carray; then each problem as one GEMM.
static void emu_blas_run_grouped(const std::vector<EmuGemm> &problems, const void *const *Aarray,
                                 const void *const *Barray, void *const *Carray, const char *what) {
    size_t bytes = problems.size() * sizeof(void *);
    if (!emu_device_range(Aarray, bytes) || !emu_device_range(Barray, bytes) || !emu_device_range(Carray, bytes)) {
        emu_fail("%s: the pointer arrays (%zu pointers each at %p, %p, %p) are not inside device memory", what,
                 problems.size(), (const void *)Aarray, (const void *)Barray, (const void *)Carray);
    }
    for (size_t i = 0; i < problems.size(); i++) {
        EmuGemmBatch bt;
        memset(&bt, 0, sizeof(bt));
        bt.g = problems[i];
        bt.g.a = Aarray[i]; bt.g.b = Barray[i]; bt.g.c = Carray[i]; bt.g.d = Carray[i];
        bt.count = 1;
        snprintf(bt.what, sizeof(bt.what), "%s problem %zu", what, i);
        emu_blas_run_batch(&bt);
    }
}

// group_count groups of GEMMs, group g: group_size[g] problems of one shape (transa_array[g], m_array[g], ...,
// alpha_array[g], beta_array[g]: host arrays, read now); the problems' matrices through the device pointer arrays
// Aarray, Barray, Carray (problem i at index i, groups one after another), read when the step runs.
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t handle, const cublasOperation_t transa_array[],
                                          const cublasOperation_t transb_array[], const int m_array[],
                                          const int n_array[], const int k_array[], const void *alpha_array,
                                          const void *const Aarray[], cudaDataType_t Atype, const int lda_array[],
                                          const void *const Barray[], cudaDataType_t Btype, const int ldb_array[],
                                          const void *beta_array, void *const Carray[], cudaDataType_t Ctype,
                                          const int ldc_array[], int group_count, const int group_size[],
                                          cublasComputeType_t computeType) {
    if (!emu_blas_handle_ok(handle)) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    if (group_count < 0) { return CUBLAS_STATUS_INVALID_VALUE; }
    if (group_count == 0) { return CUBLAS_STATUS_SUCCESS; }
    if (transa_array == NULL || transb_array == NULL || m_array == NULL || n_array == NULL || k_array == NULL ||
        alpha_array == NULL || beta_array == NULL || lda_array == NULL || ldb_array == NULL || ldc_array == NULL ||
        group_size == NULL) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    std::vector<EmuGemm> problems;
    const float *alphas = (const float *)alpha_array, *betas = (const float *)beta_array;
    for (int g = 0; g < group_count; g++) {
        if (group_size[g] < 0) { return CUBLAS_STATUS_INVALID_VALUE; }
        cublasStatus_t st = emu_blas_check_args(transa_array[g], transb_array[g], m_array[g], n_array[g], k_array[g],
                                                Atype, lda_array[g], Btype, ldb_array[g], Ctype, ldc_array[g],
                                                computeType);
        if (st != CUBLAS_STATUS_SUCCESS) { return st; }
        EmuGemm one = emu_blas_plain_gemm(transa_array[g], transb_array[g], m_array[g], n_array[g], k_array[g],
                                          alphas[g], Atype, lda_array[g], Btype, ldb_array[g], betas[g], Ctype,
                                          ldc_array[g]);
        for (int i = 0; i < group_size[g]; i++) { problems.push_back(one); }
    }
    if (problems.empty()) { return CUBLAS_STATUS_SUCCESS; }
    char what[128];
    snprintf(what, sizeof(what), "cublasGemmGroupedBatchedEx groups=%d problems=%zu", group_count, problems.size());
    std::string name = what;
    emu_enqueue(handle->stream, EMU_BLAS, what, [problems, Aarray, Barray, Carray, name]() -> bool {
        emu_blas_run_grouped(problems, Aarray, Barray, Carray, name.c_str());
        return true;
    });
    return CUBLAS_STATUS_SUCCESS;
}

#endif
