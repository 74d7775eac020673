// The emulated device's cuBLASLt and the GEMM both it and cuBLAS run (cublas_batched.h: cuBLAS's handle and GEMMs):
// the GEMMs the project calls (matmul.h, attention.h), computed on the CPU when their stream reaches them
// (contract.h's emu_enqueue, EMU_BLAS).
//
// What it models: column-major GEMMs D (m, n) = epilogue(alpha op(A) op(B) + beta C), op = N or T, fp32 accumulation
// (CUBLAS_COMPUTE_32F, fp32 alpha and beta from host memory), A and B of one type (CUDA_R_16BF or CUDA_R_32F), C and D
// of one type (CUDA_R_16BF or CUDA_R_32F; fp32 inputs want an fp32 output). Each element of D is one float sum over k
// in order (the products rounded to float, or fused where the compiler contracts them), then alpha and beta, then the
// epilogue in fp32, then one rounding to D's type (bf16: to nearest even). The result is the same for every
// "algorithm" the heuristic hands out and for any blocking. cuBLASLt epilogues: DEFAULT, BIAS, GELU, GELU_BIAS,
// GELU_AUX, GELU_AUX_BIAS, DGELU, with GELU the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// (matmul.h's note on what the GPU's epilogue computes), DGELU its derivative at aux. Strided batches (the layouts'
// BATCH_COUNT and STRIDED_BATCH_OFFSET, the descriptor's bias and aux batch strides), cublasGemmStridedBatchedEx and
// cublasGemmGroupedBatchedEx (its pointer arrays in device memory, read when the GEMM runs).
// Every operand's whole extent is checked against device memory (emu_device_range) when the GEMM runs.
//
// What it does not model: other types, compute types, pointer modes (device or vector alpha), orders than COL,
// pointer-array batches, the RELU, BGRAD and DGELU_BGRAD epilogues, scale/amax pointers (fp8), TF32 or reduced
// precision math modes: these return CUBLAS_STATUS_NOT_SUPPORTED (or INVALID_VALUE where the arguments conflict), never
// a different result. Workspaces are accepted and not used; algorithms carry only an index; alignment preferences
// exclude nothing. Timing is the runtime's. EMU_LT_NO_EPILOGUES=1: the heuristic finds no algorithm for a problem
// with an epilogue (as cuBLASLt, for a type or an alignment it has none for), so matmul.h's fallbacks run.
#ifndef LLMC_EMU_CUBLAS_H
#define LLMC_EMU_CUBLAS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <string>
#include <vector>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include "contract.h"

// ---------------------------------------------------------------------------------------------------------------
// Elements: bf16 or fp32 in memory, fp32 in arithmetic

static int emu_blas_type_ok(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_32F; }
static size_t emu_blas_type_bytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

// element i of an array of type t, exactly as a float
static inline float emu_blas_load(const void *p, cudaDataType_t t, int64_t i) {
    if (t == CUDA_R_16BF) {
        uint16_t h;
        memcpy(&h, (const uint16_t *)p + i, 2);
        uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    return ((const float *)p)[i];
}

// element i of an array of type t := v (bf16: rounded to nearest even)
static inline void emu_blas_store(void *p, cudaDataType_t t, int64_t i, float v) {
    if (t == CUDA_R_16BF) {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        memcpy((uint16_t *)p + i, &h, 2);
    } else {
        ((float *)p)[i] = v;
    }
}

// GELU, tanh approximation: 0.5 x (1 + tanh(s (x + 0.044715 x^3))), s = sqrt(2/pi)
static inline float emu_blas_gelu(float x) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

// its derivative: 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) s (1 + 3 0.044715 x^2)
static inline float emu_blas_gelu_grad(float x) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}

// ---------------------------------------------------------------------------------------------------------------
// One GEMM, every operand's place and type: D (m, n) = epilogue(alpha op(A) (m, k) op(B) (k, n) + beta C (m, n))

// what follows alpha op(A) op(B) + beta C, in this order (flags)
enum {
    EMU_EPI_BIAS = 1,      // + bias[i] (length m)
    EMU_EPI_AUX_OUT = 2,   // aux(i, j) := the value so far (the GELU input)
    EMU_EPI_GELU = 4,      // := gelu(value)
    EMU_EPI_DGELU = 8,     // *= gelu'(aux(i, j))
};

typedef struct {
    int64_t m, n, k;
    int transa, transb;   // 1: op(X) = X^T
    const void *a; cudaDataType_t atype; int64_t lda;
    const void *b; cudaDataType_t btype; int64_t ldb;
    const void *c; cudaDataType_t ctype; int64_t ldc;
    void *d; cudaDataType_t dtype; int64_t ldd;
    float alpha, beta;
    int epi;   // EMU_EPI_* flags
    const void *bias; cudaDataType_t biastype;
    void *aux; cudaDataType_t auxtype; int64_t auxld;
} EmuGemm;

// count GEMMs like g, each operand of GEMM i at its batch-0 pointer + i times its stride (elements)
typedef struct {
    EmuGemm g;
    int count;
    int64_t sa, sb, sc, sd, sbias, saux;
    char what[128];   // the launch's name, for the queue and for errors
} EmuGemmBatch;

// op(A)(i, p): A[i + p lda] (N) or A[p + i lda] (T); likewise op(B)(p, j)
static inline float emu_blas_opa(const EmuGemm *g, int64_t i, int64_t p) {
    return emu_blas_load(g->a, g->atype, g->transa ? p + i * g->lda : i + p * g->lda);
}
static inline float emu_blas_opb(const EmuGemm *g, int64_t p, int64_t j) {
    return emu_blas_load(g->b, g->btype, g->transb ? j + p * g->ldb : p + j * g->ldb);
}

// Blocking (speed only: every element's sum runs over p = 0 .. k-1 in order, whatever the blocks):
// micro-tiles of EMU_BLAS_MR rows x EMU_BLAS_NR columns of D, in blocks of EMU_BLAS_MC rows x EMU_BLAS_NC columns.
#define EMU_BLAS_MR 16
#define EMU_BLAS_NR 4
#define EMU_BLAS_MC 64
#define EMU_BLAS_NC 128

// scratch floats for the packed operands (the device thread's own; grown, never shrunk)
static float *emu_blas_scratch(size_t floats) {
    static thread_local float *buf = NULL;
    static thread_local size_t cap = 0;
    if (floats > cap) {
        free(buf);
        buf = (float *)malloc(floats * sizeof(float));
        if (buf == NULL) { emu_fail("cuBLAS: out of host memory for %zu scratch floats", floats); }
        cap = floats;
    }
    return buf;
}

// rows i0 .. i0+mc of op(A), all k, as panels of EMU_BLAS_MR rows: panel q's (p, r) at ap[q k + p EMU_BLAS_MR + r]
// (q: the panel's first row, relative to i0), zero past row i0+mc
static void emu_blas_pack_a(float *ap, const EmuGemm *g, int64_t i0, int64_t mc) {
    for (int64_t q = 0; q < mc; q += EMU_BLAS_MR) {
        float *panel = ap + q * g->k;
        int rows = mc - q < EMU_BLAS_MR ? (int)(mc - q) : EMU_BLAS_MR;
        for (int64_t p = 0; p < g->k; p++) {
            for (int r = 0; r < EMU_BLAS_MR; r++) {
                panel[p * EMU_BLAS_MR + r] = r < rows ? emu_blas_opa(g, i0 + q + r, p) : 0.0f;
            }
        }
    }
}

// columns j0 .. j0+nc of op(B), all k, as panels of EMU_BLAS_NR columns: panel q's (p, c) at
// bp[q k + p EMU_BLAS_NR + c], zero past column j0+nc
static void emu_blas_pack_b(float *bp, const EmuGemm *g, int64_t j0, int64_t nc) {
    for (int64_t q = 0; q < nc; q += EMU_BLAS_NR) {
        float *panel = bp + q * g->k;
        int cols = nc - q < EMU_BLAS_NR ? (int)(nc - q) : EMU_BLAS_NR;
        for (int64_t p = 0; p < g->k; p++) {
            for (int c = 0; c < EMU_BLAS_NR; c++) {
                panel[p * EMU_BLAS_NR + c] = c < cols ? emu_blas_opb(g, p, j0 + q + c) : 0.0f;
            }
        }
    }
}

// acc[c][r] = sum over p = 0 .. k-1, in order, of a(r, p) b(p, c): one micro-tile from an A panel and a B panel.
// (Unrolled, the c and r loops keep t in registers at -O2 and -O3 alike: 25-50 GFLOP/s on one core; left to GCC's
// -O3, the plain loops ran at ~5.)
static void emu_blas_micro_tile(float acc[EMU_BLAS_NR][EMU_BLAS_MR], const float *ap, const float *bp, int64_t k) {
    float t[EMU_BLAS_NR][EMU_BLAS_MR];
    for (int c = 0; c < EMU_BLAS_NR; c++) {
        for (int r = 0; r < EMU_BLAS_MR; r++) { t[c][r] = 0.0f; }
    }
    for (int64_t p = 0; p < k; p++) {
        const float *a = ap + p * EMU_BLAS_MR, *b = bp + p * EMU_BLAS_NR;
        #pragma GCC unroll 4
        for (int c = 0; c < EMU_BLAS_NR; c++) {
            #pragma GCC unroll 16
            for (int r = 0; r < EMU_BLAS_MR; r++) { t[c][r] += a[r] * b[c]; }
        }
    }
    memcpy(acc, t, sizeof(t));
}

// D(i, j) from its sum: alpha sum + beta C(i, j) (C unread when beta is 0), the epilogue, rounded to D's type
static inline void emu_blas_finish(const EmuGemm *g, int64_t i, int64_t j, float sum) {
    float v = g->alpha * sum;
    if (g->beta != 0.0f) { v += g->beta * emu_blas_load(g->c, g->ctype, i + j * g->ldc); }
    if (g->epi & EMU_EPI_BIAS) { v += emu_blas_load(g->bias, g->biastype, i); }
    if (g->epi & EMU_EPI_AUX_OUT) { emu_blas_store(g->aux, g->auxtype, i + j * g->auxld, v); }
    if (g->epi & EMU_EPI_GELU) { v = emu_blas_gelu(v); }
    if (g->epi & EMU_EPI_DGELU) { v *= emu_blas_gelu_grad(emu_blas_load(g->aux, g->auxtype, i + j * g->auxld)); }
    emu_blas_store(g->d, g->dtype, i + j * g->ldd, v);
}

// D where the product is zero (k = 0, or alpha = 0: A and B unread, as BLAS)
static void emu_blas_gemm_no_product(const EmuGemm *g) {
    for (int64_t j = 0; j < g->n; j++) {
        for (int64_t i = 0; i < g->m; i++) { emu_blas_finish(g, i, j, 0.0f); }
    }
}

// The GEMM: for each block of columns, op(B) packed once; for each block of rows, op(A) packed; then micro-tiles.
static void emu_blas_gemm(const EmuGemm *g) {
    if (g->m <= 0 || g->n <= 0) { return; }
    if (g->k <= 0 || g->alpha == 0.0f) { emu_blas_gemm_no_product(g); return; }
    float *bp = emu_blas_scratch((size_t)(EMU_BLAS_MC + EMU_BLAS_NC) * g->k), *ap = bp + (size_t)EMU_BLAS_NC * g->k;
    float acc[EMU_BLAS_NR][EMU_BLAS_MR];
    for (int64_t j0 = 0; j0 < g->n; j0 += EMU_BLAS_NC) {
        int64_t nc = g->n - j0 < EMU_BLAS_NC ? g->n - j0 : EMU_BLAS_NC;
        emu_blas_pack_b(bp, g, j0, nc);
        for (int64_t i0 = 0; i0 < g->m; i0 += EMU_BLAS_MC) {
            int64_t mc = g->m - i0 < EMU_BLAS_MC ? g->m - i0 : EMU_BLAS_MC;
            emu_blas_pack_a(ap, g, i0, mc);
            for (int64_t qj = 0; qj < nc; qj += EMU_BLAS_NR) {
                for (int64_t qi = 0; qi < mc; qi += EMU_BLAS_MR) {
                    emu_blas_micro_tile(acc, ap + qi * g->k, bp + qj * g->k, g->k);
                    for (int c = 0; c < EMU_BLAS_NR && qj + c < nc; c++) {
                        for (int r = 0; r < EMU_BLAS_MR && qi + r < mc; r++) {
                            emu_blas_finish(g, i0 + qi + r, j0 + qj + c, acc[c][r]);
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Device memory checks, when the GEMM runs: each operand's whole extent lies in one device allocation

// a (rows, cols) matrix of type t, ld, count of them stride elements apart: emu_fail unless all inside device memory
static void emu_blas_check_operand(const char *what, const char *name, const void *p, cudaDataType_t t, int64_t rows,
                                   int64_t cols, int64_t ld, int count, int64_t stride) {
    if (rows <= 0 || cols <= 0 || count <= 0) { return; }
    int64_t last = (int64_t)(count - 1) * stride;   // (a negative stride: the batches lie below p)
    int64_t lo = last < 0 ? last : 0, hi = (last > 0 ? last : 0) + (cols - 1) * ld + rows;
    size_t es = emu_blas_type_bytes(t);
    const char *start = (const char *)p + lo * (int64_t)es;
    if (p == NULL || !emu_device_range(start, (size_t)(hi - lo) * es)) {
        emu_fail("%s: operand %s (%lld x %lld, ld %lld, batch %d stride %lld, %s) at %p is not inside device memory",
                 what, name, (long long)rows, (long long)cols, (long long)ld, count, (long long)stride,
                 t == CUDA_R_16BF ? "bf16" : "fp32", p);
    }
}

// every operand that the batch reads or writes (C only when beta != 0, A and B only when there is a product)
static void emu_blas_check_batch(const EmuGemmBatch *bt) {
    const EmuGemm *g = &bt->g;
    if (g->m <= 0 || g->n <= 0) { return; }
    if (g->k > 0 && g->alpha != 0.0f) {
        emu_blas_check_operand(bt->what, "A", g->a, g->atype, g->transa ? g->k : g->m, g->transa ? g->m : g->k, g->lda,
                               bt->count, bt->sa);
        emu_blas_check_operand(bt->what, "B", g->b, g->btype, g->transb ? g->n : g->k, g->transb ? g->k : g->n, g->ldb,
                               bt->count, bt->sb);
    }
    if (g->beta != 0.0f) {
        emu_blas_check_operand(bt->what, "C", g->c, g->ctype, g->m, g->n, g->ldc, bt->count, bt->sc);
    }
    emu_blas_check_operand(bt->what, "D", g->d, g->dtype, g->m, g->n, g->ldd, bt->count, bt->sd);
    if (g->epi & EMU_EPI_BIAS) {
        emu_blas_check_operand(bt->what, "bias", g->bias, g->biastype, g->m, 1, g->m, bt->count, bt->sbias);
    }
    if (g->epi & (EMU_EPI_AUX_OUT | EMU_EPI_DGELU)) {
        emu_blas_check_operand(bt->what, "aux", g->aux, g->auxtype, g->m, g->n, g->auxld, bt->count, bt->saux);
    }
}

// p moved by i strides of elements of type t
static const void *emu_blas_advance(const void *p, cudaDataType_t t, int64_t stride, int i) {
    return p == NULL ? NULL : (const char *)p + (int64_t)i * stride * (int64_t)emu_blas_type_bytes(t);
}

// GEMM i of the batch
static EmuGemm emu_blas_batch_item(const EmuGemmBatch *bt, int i) {
    EmuGemm g = bt->g;
    g.a = emu_blas_advance(g.a, g.atype, bt->sa, i);
    g.b = emu_blas_advance(g.b, g.btype, bt->sb, i);
    g.c = emu_blas_advance(g.c, g.ctype, bt->sc, i);
    g.d = (void *)emu_blas_advance(g.d, g.dtype, bt->sd, i);
    g.bias = emu_blas_advance(g.bias, g.biastype, bt->sbias, i);
    g.aux = (void *)emu_blas_advance(g.aux, g.auxtype, bt->saux, i);
    return g;
}

// the queued work of a (batched) GEMM: checks, then each GEMM of the batch in order
static void emu_blas_run_batch(const EmuGemmBatch *bt) {
    emu_blas_check_batch(bt);
    for (int i = 0; i < bt->count; i++) {
        EmuGemm g = emu_blas_batch_item(bt, i);
        emu_blas_gemm(&g);
    }
}

// queues the batch on stream, everything captured now (the descriptors may be destroyed right after the call)
static void emu_blas_enqueue_batch(cudaStream_t stream, const EmuGemmBatch *batch) {
    EmuGemmBatch bt = *batch;
    emu_enqueue(stream, EMU_BLAS, bt.what, [bt]() -> bool { emu_blas_run_batch(&bt); return true; });
}

// The supported type combinations (compute 32F): A = B in {bf16, fp32}, C = D in {bf16, fp32}, fp32 A with fp32 D
static cublasStatus_t emu_blas_types_ok(cudaDataType_t at, cudaDataType_t bt, cudaDataType_t ct, cudaDataType_t dt) {
    if (!emu_blas_type_ok(at) || at != bt || !emu_blas_type_ok(dt) || ct != dt) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    if (at == CUDA_R_32F && dt != CUDA_R_32F) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------------------------
// cuBLASLt: handle, descriptors, layouts, preferences (each our struct inside the header's opaque storage)

#define EMU_LT_MAGIC 0x454d554c54ULL   // "EMULT": a live handle / descriptor / layout / preference / algorithm
#define EMU_LT_ALGOS 2                 // candidates the heuristic offers (all compute the same)

struct cublasLtContext { uint64_t magic; };

typedef struct {
    uint64_t magic;
    int32_t compute_type, scale_type, pointer_mode, transa, transb, transc, fill_mode, sm_count_target;
    uint32_t epilogue;
    int32_t bias_type, aux_type;   // -1: D's type
    const void *bias;
    void *aux;
    int64_t bias_batch_stride, aux_ld, aux_batch_stride;
} EmuLtDesc;
static_assert(sizeof(EmuLtDesc) <= sizeof(cublasLtMatmulDescOpaque_t), "EmuLtDesc fits cuBLASLt's descriptor");

typedef struct {
    uint64_t magic;
    uint64_t rows, cols;
    int64_t ld, batch_stride, plane_offset;
    uint32_t type;
    int32_t order, batch_count;
    uint32_t batch_mode;
} EmuLtLayout;
static_assert(sizeof(EmuLtLayout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "EmuLtLayout fits cuBLASLt's layout");

typedef struct {
    uint64_t magic;
    uint32_t search_mode, reduction_mask, align_a, align_b, align_c, align_d;
    uint64_t max_workspace, impl_mask;
    float max_waves;
} EmuLtPref;
static_assert(sizeof(EmuLtPref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "EmuLtPref fits cuBLASLt's preference");

static EmuLtDesc *emu_lt_desc(cublasLtMatmulDesc_t d) {
    EmuLtDesc *e = (EmuLtDesc *)d;
    return e != NULL && e->magic == EMU_LT_MAGIC ? e : NULL;
}
static EmuLtLayout *emu_lt_layout(cublasLtMatrixLayout_t l) {
    EmuLtLayout *e = (EmuLtLayout *)l;
    return e != NULL && e->magic == EMU_LT_MAGIC ? e : NULL;
}
static EmuLtPref *emu_lt_pref(cublasLtMatmulPreference_t p) {
    EmuLtPref *e = (EmuLtPref *)p;
    return e != NULL && e->magic == EMU_LT_MAGIC ? e : NULL;
}

// the attribute's field in the descriptor and its size; NULL for an attribute not modelled
static void *emu_lt_desc_field(EmuLtDesc *d, cublasLtMatmulDescAttributes_t attr, size_t *size) {
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: *size = 4; return &d->compute_type;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: *size = 4; return &d->scale_type;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: *size = 4; return &d->pointer_mode;
    case CUBLASLT_MATMUL_DESC_TRANSA: *size = 4; return &d->transa;
    case CUBLASLT_MATMUL_DESC_TRANSB: *size = 4; return &d->transb;
    case CUBLASLT_MATMUL_DESC_TRANSC: *size = 4; return &d->transc;
    case CUBLASLT_MATMUL_DESC_FILL_MODE: *size = 4; return &d->fill_mode;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: *size = 4; return &d->epilogue;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: *size = sizeof(void *); return &d->bias;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: *size = 8; return &d->bias_batch_stride;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: *size = sizeof(void *); return &d->aux;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: *size = 8; return &d->aux_ld;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: *size = 8; return &d->aux_batch_stride;
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: *size = 4; return &d->sm_count_target;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: *size = 4; return &d->aux_type;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: *size = 4; return &d->bias_type;
    default: return NULL;
    }
}

static void *emu_lt_layout_field(EmuLtLayout *l, cublasLtMatrixLayoutAttribute_t attr, size_t *size) {
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: *size = 4; return &l->type;
    case CUBLASLT_MATRIX_LAYOUT_ORDER: *size = 4; return &l->order;
    case CUBLASLT_MATRIX_LAYOUT_ROWS: *size = 8; return &l->rows;
    case CUBLASLT_MATRIX_LAYOUT_COLS: *size = 8; return &l->cols;
    case CUBLASLT_MATRIX_LAYOUT_LD: *size = 8; return &l->ld;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: *size = 4; return &l->batch_count;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: *size = 8; return &l->batch_stride;
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: *size = 8; return &l->plane_offset;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: *size = 4; return &l->batch_mode;
    default: return NULL;
    }
}

static void *emu_lt_pref_field(EmuLtPref *p, cublasLtMatmulPreferenceAttributes_t attr, size_t *size) {
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: *size = 4; return &p->search_mode;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: *size = 8; return &p->max_workspace;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: *size = 4; return &p->reduction_mask;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: *size = 4; return &p->align_a;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: *size = 4; return &p->align_b;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: *size = 4; return &p->align_c;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: *size = 4; return &p->align_d;
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: *size = 4; return &p->max_waves;
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: *size = 8; return &p->impl_mask;
    default: return NULL;
    }
}

// Set/Get of one attribute through its field: sizes must match exactly (as cuBLASLt); an unmodelled attribute is
// NOT_SUPPORTED. Get with sizeInBytes 0 reports the size needed.
static cublasStatus_t emu_lt_set_field(void *field, size_t size, const void *buf, size_t bytes) {
    if (field == NULL) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    if (buf == NULL || bytes != size) { return CUBLAS_STATUS_INVALID_VALUE; }
    memcpy(field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}
static cublasStatus_t emu_lt_get_field(const void *field, size_t size, void *buf, size_t bytes, size_t *written) {
    if (field == NULL) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    if (bytes == 0) {
        if (written == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
        *written = size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (buf == NULL || bytes != size) { return CUBLAS_STATUS_INVALID_VALUE; }
    memcpy(buf, field, size);
    if (written != NULL) { *written = size; }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (lightHandle == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    struct cublasLtContext *h = (struct cublasLtContext *)malloc(sizeof(struct cublasLtContext));
    if (h == NULL) { return CUBLAS_STATUS_ALLOC_FAILED; }
    h->magic = EMU_LT_MAGIC;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (lightHandle == NULL || lightHandle->magic != EMU_LT_MAGIC) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    lightHandle->magic = 0;
    free(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

// the cuBLAS the headers are of (cublasLt.h has no version macro of its own: cuBLASLt's is cuBLAS's,
// major * 10000 + minor * 100 + patch)
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t matmulDesc, size_t size,
                                               cublasComputeType_t computeType, cudaDataType_t scaleType) {
    if (matmulDesc == NULL || size < sizeof(EmuLtDesc)) { return CUBLAS_STATUS_ALLOC_FAILED; }
    EmuLtDesc *d = (EmuLtDesc *)matmulDesc;
    memset(d, 0, sizeof(*d));
    d->magic = EMU_LT_MAGIC;
    d->compute_type = (int32_t)computeType;
    d->scale_type = (int32_t)scaleType;
    d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d->transa = d->transb = d->transc = CUBLAS_OP_N;
    d->fill_mode = CUBLAS_FILL_MODE_FULL;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias_type = d->aux_type = -1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
    if (matmulDesc == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    cublasLtMatmulDesc_t d = (cublasLtMatmulDesc_t)calloc(1, sizeof(cublasLtMatmulDescOpaque_t));
    if (d == NULL) { return CUBLAS_STATUS_ALLOC_FAILED; }
    cublasLtMatmulDescInit_internal(d, sizeof(*d), computeType, scaleType);
    *matmulDesc = d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    EmuLtDesc *d = emu_lt_desc(matmulDesc);
    if (d == NULL) { return matmulDesc == NULL ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE; }
    d->magic = 0;
    free(matmulDesc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes) {
    EmuLtDesc *d = emu_lt_desc(matmulDesc);
    if (d == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    size_t size = 0;
    void *field = emu_lt_desc_field(d, attr, &size);
    return emu_lt_set_field(field, size, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              void *buf, size_t sizeInBytes, size_t *sizeWritten) {
    EmuLtDesc *d = emu_lt_desc(matmulDesc);
    if (d == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    size_t size = 0;
    void *field = emu_lt_desc_field(d, attr, &size);
    return emu_lt_get_field(field, size, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t matLayout, size_t size, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld) {
    if (matLayout == NULL || size < sizeof(EmuLtLayout)) { return CUBLAS_STATUS_ALLOC_FAILED; }
    EmuLtLayout *l = (EmuLtLayout *)matLayout;
    memset(l, 0, sizeof(*l));
    l->magic = EMU_LT_MAGIC;
    l->type = (uint32_t)type;
    l->order = CUBLASLT_ORDER_COL;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    l->batch_count = 1;
    l->batch_mode = CUBLASLT_BATCH_MODE_STRIDED;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (matLayout == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    cublasLtMatrixLayout_t l = (cublasLtMatrixLayout_t)calloc(1, sizeof(cublasLtMatrixLayoutOpaque_t));
    if (l == NULL) { return CUBLAS_STATUS_ALLOC_FAILED; }
    cublasLtMatrixLayoutInit_internal(l, sizeof(*l), type, rows, cols, ld);
    *matLayout = l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    EmuLtLayout *l = emu_lt_layout(matLayout);
    if (l == NULL) { return matLayout == NULL ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE; }
    l->magic = 0;
    free(matLayout);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes) {
    EmuLtLayout *l = emu_lt_layout(matLayout);
    if (l == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    size_t size = 0;
    void *field = emu_lt_layout_field(l, attr, &size);
    return emu_lt_set_field(field, size, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                void *buf, size_t sizeInBytes, size_t *sizeWritten) {
    EmuLtLayout *l = emu_lt_layout(matLayout);
    if (l == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    size_t size = 0;
    void *field = emu_lt_layout_field(l, attr, &size);
    return emu_lt_get_field(field, size, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size) {
    if (pref == NULL || size < sizeof(EmuLtPref)) { return CUBLAS_STATUS_ALLOC_FAILED; }
    EmuLtPref *p = (EmuLtPref *)pref;
    memset(p, 0, sizeof(*p));
    p->magic = EMU_LT_MAGIC;
    p->search_mode = CUBLASLT_SEARCH_BEST_FIT;
    p->reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    p->align_a = p->align_b = p->align_c = p->align_d = 256;
    p->impl_mask = UINT64_MAX;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (pref == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    cublasLtMatmulPreference_t p = (cublasLtMatmulPreference_t)calloc(1, sizeof(cublasLtMatmulPreferenceOpaque_t));
    if (p == NULL) { return CUBLAS_STATUS_ALLOC_FAILED; }
    cublasLtMatmulPreferenceInit_internal(p, sizeof(*p));
    *pref = p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    EmuLtPref *p = emu_lt_pref(pref);
    if (p == NULL) { return pref == NULL ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE; }
    p->magic = 0;
    free(pref);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sizeInBytes) {
    EmuLtPref *p = emu_lt_pref(pref);
    if (p == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    size_t size = 0;
    void *field = emu_lt_pref_field(p, attr, &size);
    return emu_lt_set_field(field, size, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void *buf,
                                                    size_t sizeInBytes, size_t *sizeWritten) {
    EmuLtPref *p = emu_lt_pref(pref);
    if (p == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    size_t size = 0;
    void *field = emu_lt_pref_field(p, attr, &size);
    return emu_lt_get_field(field, size, buf, sizeInBytes, sizeWritten);
}

// ---------------------------------------------------------------------------------------------------------------
// cuBLASLt: the problem a descriptor and four layouts describe, validated; the heuristic; the matmul

// the EMU_EPI_* flags of a cuBLASLt epilogue; -1 if not modelled
static int emu_lt_epilogue_flags(uint32_t epilogue) {
    switch (epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: return 0;
    case CUBLASLT_EPILOGUE_BIAS: return EMU_EPI_BIAS;
    case CUBLASLT_EPILOGUE_GELU: return EMU_EPI_GELU;
    case CUBLASLT_EPILOGUE_GELU_BIAS: return EMU_EPI_BIAS | EMU_EPI_GELU;
    case CUBLASLT_EPILOGUE_GELU_AUX: return EMU_EPI_AUX_OUT | EMU_EPI_GELU;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return EMU_EPI_BIAS | EMU_EPI_AUX_OUT | EMU_EPI_GELU;
    case CUBLASLT_EPILOGUE_DGELU: return EMU_EPI_DGELU;
    default: return -1;
    }
}

// 0 for CUBLAS_OP_N, 1 for CUBLAS_OP_T and CUBLAS_OP_C (real data: the same), -1 otherwise
static int emu_blas_transposed(int32_t op) {
    return op == CUBLAS_OP_N ? 0 : op == CUBLAS_OP_T || op == CUBLAS_OP_C ? 1 : -1;
}

// what the descriptor itself allows: compute 32F, fp32 host scalars, a modelled epilogue
static cublasStatus_t emu_lt_check_desc(const EmuLtDesc *d) {
    if (d->compute_type != CUBLAS_COMPUTE_32F || d->scale_type != CUDA_R_32F) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    if (emu_blas_transposed(d->transa) < 0 || emu_blas_transposed(d->transb) < 0) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (d->transc != CUBLAS_OP_N || d->fill_mode != CUBLAS_FILL_MODE_FULL) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    if (emu_lt_epilogue_flags(d->epilogue) < 0) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    return CUBLAS_STATUS_SUCCESS;
}

// what a layout itself allows: column order, strided batches, no planes, ld >= rows
static cublasStatus_t emu_lt_check_layout(const EmuLtLayout *l) {
    if (l->order != CUBLASLT_ORDER_COL || l->batch_mode != CUBLASLT_BATCH_MODE_STRIDED || l->plane_offset != 0) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!emu_blas_type_ok((cudaDataType_t)l->type)) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    if (l->batch_count < 1 || l->rows > INT32_MAX || l->cols > INT32_MAX) { return CUBLAS_STATUS_INVALID_VALUE; }
    if (l->ld < 1 || (uint64_t)l->ld < l->rows) { return CUBLAS_STATUS_INVALID_VALUE; }
    return CUBLAS_STATUS_SUCCESS;
}

// the epilogue's bias and aux from the descriptor (types default to D's); aux: ld >= m and a multiple of 8, and so
// its batch stride (cuBLASLt's GELU aux rules)
static cublasStatus_t emu_lt_epilogue(EmuGemmBatch *bt, const EmuLtDesc *d) {
    EmuGemm *g = &bt->g;
    g->epi = emu_lt_epilogue_flags(d->epilogue);
    g->biastype = d->bias_type == -1 ? g->dtype : (cudaDataType_t)d->bias_type;
    g->auxtype = d->aux_type == -1 ? g->dtype : (cudaDataType_t)d->aux_type;
    if (g->epi & EMU_EPI_BIAS) {
        if (d->bias == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
        if (!emu_blas_type_ok(g->biastype)) { return CUBLAS_STATUS_NOT_SUPPORTED; }
        g->bias = d->bias;
        bt->sbias = d->bias_batch_stride;
    }
    if (g->epi & (EMU_EPI_AUX_OUT | EMU_EPI_DGELU)) {
        if (d->aux == NULL || d->aux_ld < g->m || d->aux_ld % 8 != 0) { return CUBLAS_STATUS_INVALID_VALUE; }
        if (bt->count > 1 && d->aux_batch_stride % 8 != 0) { return CUBLAS_STATUS_INVALID_VALUE; }
        if (!emu_blas_type_ok(g->auxtype)) { return CUBLAS_STATUS_NOT_SUPPORTED; }
        g->aux = d->aux;
        g->auxld = d->aux_ld;
        bt->saux = d->aux_batch_stride;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// The problem (all but the matrices' pointers and alpha, beta): m, n from D; k from A (op applied); B and C must
// agree; all four layouts one batch count.
static cublasStatus_t emu_lt_problem(EmuGemmBatch *bt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                                     cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
                                     cublasLtMatrixLayout_t Ddesc) {
    const EmuLtDesc *d = emu_lt_desc(desc);
    const EmuLtLayout *la = emu_lt_layout(Adesc), *lb = emu_lt_layout(Bdesc);
    const EmuLtLayout *lc = emu_lt_layout(Cdesc), *ld = emu_lt_layout(Ddesc);
    if (d == NULL || la == NULL || lb == NULL || lc == NULL || ld == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    cublasStatus_t st = emu_lt_check_desc(d);
    const EmuLtLayout *lay[4] = {la, lb, lc, ld};
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++) { st = emu_lt_check_layout(lay[i]); }
    if (st != CUBLAS_STATUS_SUCCESS) { return st; }
    st = emu_blas_types_ok((cudaDataType_t)la->type, (cudaDataType_t)lb->type, (cudaDataType_t)lc->type,
                           (cudaDataType_t)ld->type);
    if (st != CUBLAS_STATUS_SUCCESS) { return st; }
    memset(bt, 0, sizeof(*bt));
    EmuGemm *g = &bt->g;
    g->transa = emu_blas_transposed(d->transa);
    g->transb = emu_blas_transposed(d->transb);
    g->m = (int64_t)ld->rows;
    g->n = (int64_t)ld->cols;
    g->k = (int64_t)(g->transa ? la->rows : la->cols);
    int64_t am = (int64_t)(g->transa ? la->cols : la->rows);
    int64_t bk = (int64_t)(g->transb ? lb->cols : lb->rows), bn = (int64_t)(g->transb ? lb->rows : lb->cols);
    if (am != g->m || bk != g->k || bn != g->n || lc->rows != ld->rows || lc->cols != ld->cols) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (la->batch_count != ld->batch_count || lb->batch_count != ld->batch_count ||
        lc->batch_count != ld->batch_count) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    g->atype = (cudaDataType_t)la->type; g->lda = la->ld;
    g->btype = (cudaDataType_t)lb->type; g->ldb = lb->ld;
    g->ctype = (cudaDataType_t)lc->type; g->ldc = lc->ld;
    g->dtype = (cudaDataType_t)ld->type; g->ldd = ld->ld;
    bt->count = ld->batch_count;
    bt->sa = la->batch_stride; bt->sb = lb->batch_stride; bt->sc = lc->batch_stride; bt->sd = ld->batch_stride;
    return emu_lt_epilogue(bt, d);
}

// Candidates for the problem: EMU_LT_ALGOS (fewer if fewer are asked for), each only an index, no workspace.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount) {
    if (lightHandle == NULL || lightHandle->magic != EMU_LT_MAGIC) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    if (requestedAlgoCount <= 0 || heuristicResultsArray == NULL || returnAlgoCount == NULL) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (preference != NULL && emu_lt_pref(preference) == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    *returnAlgoCount = 0;
    EmuGemmBatch bt;
    cublasStatus_t st = emu_lt_problem(&bt, operationDesc, Adesc, Bdesc, Cdesc, Ddesc);
    if (st != CUBLAS_STATUS_SUCCESS) { return st; }
    if (bt.g.epi != 0 && getenv("EMU_LT_NO_EPILOGUES") != NULL) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    int n = requestedAlgoCount < EMU_LT_ALGOS ? requestedAlgoCount : EMU_LT_ALGOS;
    for (int i = 0; i < n; i++) {
        cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[i];
        memset(r, 0, sizeof(*r));
        r->algo.data[0] = EMU_LT_MAGIC;
        r->algo.data[1] = (uint64_t)i;
        r->workspaceSize = 0;
        r->state = CUBLAS_STATUS_SUCCESS;
        r->wavesCount = 1.0f;
    }
    *returnAlgoCount = n;
    return CUBLAS_STATUS_SUCCESS;
}

// D = epilogue(alpha op(A) op(B) + beta C), queued on stream; alpha, beta (host floats) and the descriptors read now,
// the matrices when the stream runs it. algo: NULL or one of the heuristic's.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
    (void)workspace; (void)workspaceSizeInBytes;   // (no algorithm needs one)
    if (lightHandle == NULL || lightHandle->magic != EMU_LT_MAGIC) { return CUBLAS_STATUS_NOT_INITIALIZED; }
    if (alpha == NULL || beta == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
    if (algo != NULL && (algo->data[0] != EMU_LT_MAGIC || algo->data[1] >= EMU_LT_ALGOS)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    EmuGemmBatch bt;
    cublasStatus_t st = emu_lt_problem(&bt, computeDesc, Adesc, Bdesc, Cdesc, Ddesc);
    if (st != CUBLAS_STATUS_SUCCESS) { return st; }
    EmuGemm *g = &bt.g;
    g->a = A; g->b = B; g->c = C; g->d = D;
    g->alpha = *(const float *)alpha;
    g->beta = *(const float *)beta;
    snprintf(bt.what, sizeof(bt.what), "cublasLtMatmul m=%lld n=%lld k=%lld batch=%d epilogue=%u", (long long)g->m,
             (long long)g->n, (long long)g->k, bt.count, emu_lt_desc(computeDesc)->epilogue);
    emu_blas_enqueue_batch(stream, &bt);
    return CUBLAS_STATUS_SUCCESS;
}

#endif
