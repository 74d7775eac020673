// Checks llmc/emu/cublas.h (the emulated device's cuBLASLt and cuBLAS) against a plain double-precision GEMM:
// each transpose of each operand, bf16 and fp32, the epilogues (BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS,
// DGELU) with aux_ld > m, strided batches (cuBLASLt and cublasGemmStridedBatchedEx), the grouped GEMM, the statuses of
// what is not modelled, and that results do not depend on the algorithm or on how the problem is cut.
// The queue here runs its steps only at run_queue(): the matrices are written after each call and before the GEMM
// runs, the descriptors destroyed right after the call, the grouped GEMM's pointer arrays filled after it, alpha
// changed after it.
//   g++ -std=c++17 -O2 -Wall -Wextra -Wno-unused-function -Wno-missing-field-initializers
//       -I/usr/local/cuda/include dev/emu/test_emu_cublas.cpp -o /tmp/test_emu_cublas && /tmp/test_emu_cublas
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <vector>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include "../../llmc/emu/contract.h"

// ---- the contract, trivially: a queue run on demand; all memory is "device" memory
static std::vector<EmuStep> queue;
static cudaStream_t last_stream;
static EmuKind last_kind;
static char last_what[256];

void emu_enqueue(cudaStream_t stream, EmuKind kind, const char *what, EmuStep step) {
    last_stream = stream;
    last_kind = kind;
    snprintf(last_what, sizeof(last_what), "%s", what);
    queue.push_back(step);
}

[[noreturn]] void emu_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emulated device: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

int emu_device_range(const void *p, size_t bytes) { (void)p; (void)bytes; return 1; }

static void run_queue(void) {
    for (size_t i = 0; i < queue.size(); i++) {
        while (!queue[i]()) {}
    }
    queue.clear();
}

#include "../../llmc/emu/cublas.h"
#include "../../llmc/emu/cublas_batched.h"

// ---- results
static int passed, failed;
static void expect(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (!ok) {
        printf("FAIL ");
        vprintf(fmt, ap);
        printf("\n");
    }
    va_end(ap);
    ok ? passed++ : failed++;
}

// ---- buffers of bf16 or fp32 elements
typedef struct { cudaDataType_t t; std::vector<uint8_t> bytes; } Buf;

static size_t tbytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }
static void *buf_init(Buf *b, cudaDataType_t t, size_t n) {
    b->t = t;
    b->bytes.assign((n > 0 ? n : 1) * tbytes(t), 0);
    return b->bytes.data();
}
static size_t buf_len(const Buf *b) { return b->bytes.size() / tbytes(b->t); }
static double buf_get(const Buf *b, size_t i) {
    if (b->t == CUDA_R_16BF) {
        uint16_t h;
        memcpy(&h, &b->bytes[i * 2], 2);
        uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    float f;
    memcpy(&f, &b->bytes[i * 4], 4);
    return f;
}
static void buf_set(Buf *b, size_t i, float v) {   // (bf16: rounded to nearest even)
    if (b->t == CUDA_R_16BF) {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        memcpy(&b->bytes[i * 2], &h, 2);
    } else {
        memcpy(&b->bytes[i * 4], &v, 4);
    }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static float rand_uniform(float lo, float hi) {   // xorshift64*
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 2685821657736338717ULL;
    return lo + (hi - lo) * (float)((r >> 40) / 16777216.0);
}
static void buf_random(Buf *b, float scale) {
    for (size_t i = 0; i < buf_len(b); i++) { buf_set(b, i, rand_uniform(-scale, scale)); }
}
static void buf_nan(Buf *b) {
    for (size_t i = 0; i < buf_len(b); i++) { buf_set(b, i, NAN); }
}

// ---- the reference: one GEMM in double, each element of D (and aux) against a bound on the emulation's error
static const double U32 = 1.0 / 16777216.0;   // fp32's unit roundoff, 2^-24
static double unit_roundoff(cudaDataType_t t) { return t == CUDA_R_16BF ? 1.0 / 256.0 : U32; }
static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
static double gelu_grad_ref(double x) {
    double s = sqrt(2.0 / M_PI), th = tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// a matrix (or vector) inside a buffer: element (i, j) at off + i + j ld
typedef struct { const Buf *b; size_t off; int64_t ld; } Mat;
static double mat(Mat x, int64_t i, int64_t j) { return buf_get(x.b, x.off + (size_t)(i + j * x.ld)); }

typedef struct {
    int64_t m, n, k;
    int ta, tb;
    double alpha, beta;
    int epi;                  // EMU_EPI_* flags
    Mat A, B, C, D;           // C: its values before the GEMM
    Mat bias, aux_in, aux;    // aux_in: DGELU's input; aux: what GELU_AUX wrote
} Ref;

// the worst |error| / tolerance over D (and aux); bad: elements over their tolerance (or NaN)
static double ref_check(const Ref *r, int *bad) {
    double worst = 0.0;
    double ud = unit_roundoff(r->D.b->t);
    for (int64_t j = 0; j < r->n; j++) {
        for (int64_t i = 0; i < r->m; i++) {
            double s = 0.0, mag = 0.0;
            for (int64_t p = 0; p < r->k && r->alpha != 0.0; p++) {
                double a = r->ta ? mat(r->A, p, i) : mat(r->A, i, p), b = r->tb ? mat(r->B, j, p) : mat(r->B, p, j);
                s += a * b;
                mag += fabs(a * b);
            }
            double c = r->beta != 0.0 ? mat(r->C, i, j) : 0.0;
            double pre = r->alpha * s + r->beta * c;
            mag = fabs(r->alpha) * mag + fabs(r->beta * c);
            if (r->epi & EMU_EPI_BIAS) { pre += mat(r->bias, i, 0); mag += fabs(mat(r->bias, i, 0)); }
            double err = (double)(r->k + 4) * U32 * mag + 1e-35;   // the fp32 sum, alpha, beta, bias
            if (r->epi & EMU_EPI_AUX_OUT) {
                double got = mat(r->aux, i, j), tol = err + unit_roundoff(r->aux.b->t) * (fabs(pre) + err);
                double e = fabs(got - pre);
                if (!(e <= tol)) { (*bad)++; }
                worst = fmax(worst, e / tol);
            }
            double want = pre;
            if (r->epi & EMU_EPI_GELU) {
                want = gelu_ref(pre);
                err = 1.13 * err + 16.0 * U32 * (1.0 + fabs(pre));   // |gelu'| <= 1.13; tanhf and the float ops
            }
            if (r->epi & EMU_EPI_DGELU) {
                double x = mat(r->aux_in, i, j), g = gelu_grad_ref(x);
                want = pre * g;
                err = err * fabs(g) + fabs(pre) * 16.0 * U32 * (1.0 + fabs(x) + fabs(x * x * x));
            }
            double tol = err + ud * (fabs(want) + err);
            double e = fabs(mat(r->D, i, j) - want);
            if (!(e <= tol)) { (*bad)++; }
            worst = fmax(worst, e / tol);
        }
    }
    return worst;
}

// ---- one test problem: a (batched) cuBLASLt matmul or cublasGemmStridedBatchedEx
typedef enum { API_LT, API_STRIDED } Api;
typedef struct {
    const char *name;
    Api api;
    int m, n, k, ta, tb;
    int pad;                     // leading dimensions this much past the rows
    cudaDataType_t ab, cd;       // A and B's type; C and D's
    float alpha, beta;
    cublasLtEpilogue_t epi;      // API_LT
    int aux_pad;                 // aux_ld = m rounded up to 8, + aux_pad (a multiple of 8)
    int batch;
    int separate_c;              // API_LT: C another buffer than D, another ld
    float scale;                 // A's values in [-scale, scale]
    int bias_aux_fp32;           // API_LT: bias and aux fp32 (CUBLASLT_MATMUL_DESC_{BIAS,EPILOGUE_AUX}_DATA_TYPE)
} Case;

static int round8(int x) { return (x + 7) / 8 * 8; }

static cublasLtHandle_t lt;
static cublasHandle_t blas;

static void lt_set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v, size_t bytes) {
    cublasStatus_t st = cublasLtMatmulDescSetAttribute(d, a, v, bytes);
    if (st != CUBLAS_STATUS_SUCCESS) { emu_fail("cublasLtMatmulDescSetAttribute(%d): status %d", (int)a, (int)st); }
}
static void lt_set_batch(cublasLtMatrixLayout_t l, int count, int64_t stride) {
    if (cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)) ||
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride))) {
        emu_fail("cublasLtMatrixLayoutSetAttribute failed");
    }
}

static void run_case(const Case *cs) {
    int flags = cs->api == API_LT ? emu_lt_epilogue_flags(cs->epi) : 0;
    int64_t m = cs->m, n = cs->n, k = cs->k;
    int64_t arows = cs->ta ? k : m, acols = cs->ta ? m : k, brows = cs->tb ? n : k, bcols = cs->tb ? k : n;
    int64_t lda = (arows > 0 ? arows : 1) + cs->pad, ldb = (brows > 0 ? brows : 1) + cs->pad, ldd = m + cs->pad;
    int64_t ldc = cs->separate_c ? m + cs->pad + 2 : ldd, auxld = round8(cs->m) + cs->aux_pad;
    int64_t sa = lda * acols + 3, sb = ldb * bcols + 5, sd = ldd * n + 1, sc = cs->separate_c ? ldc * n + 2 : sd;
    int64_t sbias = m + 3, saux = auxld * n + 8;
    int count = cs->batch;
    cudaDataType_t side = cs->bias_aux_fp32 ? CUDA_R_32F : cs->cd;
    Buf A, B, C, D, bias, aux;
    void *pa = buf_init(&A, cs->ab, sa * count), *pb = buf_init(&B, cs->ab, sb * count);
    void *pd = buf_init(&D, cs->cd, sd * count);
    void *pc = cs->separate_c ? buf_init(&C, cs->cd, sc * count) : pd;
    void *pbias = buf_init(&bias, side, sbias * count), *paux = buf_init(&aux, side, saux * count);
    float alpha = cs->alpha, beta = cs->beta;
    cublasStatus_t st;
    if (cs->api == API_LT) {
        cublasLtMatmulDesc_t desc = NULL;
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasOperation_t opa = cs->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = cs->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        lt_set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
        lt_set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
        lt_set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &cs->epi, sizeof(cs->epi));
        if (flags & EMU_EPI_BIAS) {
            lt_set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pbias, sizeof(pbias));
            lt_set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &sbias, sizeof(sbias));
        }
        if (flags & (EMU_EPI_AUX_OUT | EMU_EPI_DGELU)) {
            lt_set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &paux, sizeof(paux));
            lt_set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxld, sizeof(auxld));
            lt_set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &saux, sizeof(saux));
        }
        if (cs->bias_aux_fp32) {
            int32_t t = CUDA_R_32F;
            lt_set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t));
            lt_set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t, sizeof(t));
        }
        cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, ld = NULL;
        cublasLtMatrixLayoutCreate(&la, cs->ab, arows, acols, lda);
        cublasLtMatrixLayoutCreate(&lb, cs->ab, brows, bcols, ldb);
        cublasLtMatrixLayoutCreate(&lc, cs->cd, m, n, ldc);
        cublasLtMatrixLayoutCreate(&ld, cs->cd, m, n, ldd);
        if (count > 1) {
            lt_set_batch(la, count, sa); lt_set_batch(lb, count, sb);
            lt_set_batch(lc, count, sc); lt_set_batch(ld, count, sd);
        }
        cublasLtMatmulPreference_t pref = NULL;
        cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulHeuristicResult_t h[4];
        int found = 0;
        st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 4, h, &found);
        expect(st == CUBLAS_STATUS_SUCCESS && found >= 1 && h[0].workspaceSize == 0, "%s: heuristic status %d found %d",
               cs->name, (int)st, found);
        const cublasLtMatmulAlgo_t *algo = found > 0 ? &h[found - 1].algo : NULL;
        st = cublasLtMatmul(lt, desc, &alpha, pa, la, pb, lb, &beta, pc, lc, pd, ld, algo, NULL, 0, (cudaStream_t)0);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc); cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
    } else {
        st = cublasGemmStridedBatchedEx(blas, cs->ta ? CUBLAS_OP_T : CUBLAS_OP_N, cs->tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        cs->m, cs->n, cs->k, &alpha, pa, cs->ab, (int)lda, sa, pb, cs->ab, (int)ldb, sb,
                                        &beta, pd, cs->cd, (int)ldd, sd, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    expect(st == CUBLAS_STATUS_SUCCESS && last_kind == EMU_BLAS, "%s: status %d", cs->name, (int)st);
    if (st != CUBLAS_STATUS_SUCCESS) { return; }
    alpha = 1e9f; beta = 1e9f;   // (read at the call, not later)
    // the operands, written after the call: the GEMM reads them when it runs
    if (cs->alpha == 0.0f) { buf_nan(&A); buf_nan(&B); } else { buf_random(&A, cs->scale); buf_random(&B, 1.0f); }
    buf_random(&bias, 1.0f);
    if (flags & EMU_EPI_DGELU) { buf_random(&aux, 3.0f); } else { buf_nan(&aux); }
    if (cs->separate_c) { buf_random(&C, 1.0f); }
    if (cs->beta == 0.0f) { buf_nan(&D); } else if (cs->separate_c) { buf_nan(&D); } else { buf_random(&D, 1.0f); }
    Buf C0 = cs->separate_c ? C : D;   // C before the GEMM
    run_queue();
    int bad = 0;
    double worst = 0.0;
    for (int i = 0; i < count; i++) {
        Ref r = {m, n, k, cs->ta, cs->tb, cs->alpha, cs->beta, flags,
                 {&A, (size_t)(i * sa), lda}, {&B, (size_t)(i * sb), ldb}, {&C0, (size_t)(i * sc), ldc},
                 {&D, (size_t)(i * sd), ldd}, {&bias, (size_t)(i * sbias), 0}, {&aux, (size_t)(i * saux), auxld},
                 {&aux, (size_t)(i * saux), auxld}};
        worst = fmax(worst, ref_check(&r, &bad));
    }
    expect(bad == 0, "%s: %d elements off (worst error/tolerance %.3g)", cs->name, bad, worst);
    if (bad == 0 && worst > 0.0) { printf("ok   %-58s worst error/tolerance %.3f\n", cs->name, worst); }
}

// ---- the grouped GEMM: problems of three shapes, pointer arrays written after the call
static void run_grouped(cudaDataType_t ab, cudaDataType_t cd, const char *name) {
    enum { G = 3 };
    cublasOperation_t ta[G] = {CUBLAS_OP_T, CUBLAS_OP_N, CUBLAS_OP_N}, tb[G] = {CUBLAS_OP_N, CUBLAS_OP_N, CUBLAS_OP_T};
    int m[G] = {24, 16, 8}, n[G] = {5, 7, 3}, k[G] = {16, 9, 33}, size[G] = {2, 1, 1};
    float alpha[G] = {1.0f, 1.0f, 0.5f}, beta[G] = {0.0f, 1.0f, -1.0f};
    int lda[G], ldb[G], ldc[G];
    for (int g = 0; g < G; g++) {
        lda[g] = (ta[g] == CUBLAS_OP_T ? k[g] : m[g]) + 2;
        ldb[g] = (tb[g] == CUBLAS_OP_T ? n[g] : k[g]) + 1;
        ldc[g] = m[g] + 3;
    }
    const int P = 4;   // problems: group 0 twice, then groups 1 and 2
    int group_of[P] = {0, 0, 1, 2};
    Buf A[P], B[P], C[P];
    std::vector<const void *> pa(P), pb(P);
    std::vector<void *> pc(P);
    for (int i = 0; i < P; i++) {
        int g = group_of[i];
        buf_init(&A[i], ab, (size_t)lda[g] * (ta[g] == CUBLAS_OP_T ? m[g] : k[g]));
        buf_init(&B[i], ab, (size_t)ldb[g] * (tb[g] == CUBLAS_OP_T ? k[g] : n[g]));
        buf_init(&C[i], cd, (size_t)ldc[g] * n[g]);
    }
    std::vector<const void *> arrays_a(P, NULL), arrays_b(P, NULL);
    std::vector<void *> arrays_c(P, NULL);
    cublasStatus_t st = cublasGemmGroupedBatchedEx(blas, ta, tb, m, n, k, alpha, arrays_a.data(), ab, lda,
                                                   arrays_b.data(), ab, ldb, beta, arrays_c.data(), cd, ldc, G, size,
                                                   CUBLAS_COMPUTE_32F);
    expect(st == CUBLAS_STATUS_SUCCESS, "%s: status %d", name, (int)st);
    if (st != CUBLAS_STATUS_SUCCESS) { return; }
    alpha[0] = beta[1] = 1e9f;   // (host arrays: read at the call)
    std::vector<Buf> C0(P);
    for (int i = 0; i < P; i++) {   // the pointers and matrices, after the call
        arrays_a[i] = A[i].bytes.data(); arrays_b[i] = B[i].bytes.data(); arrays_c[i] = C[i].bytes.data();
        buf_random(&A[i], 1.0f); buf_random(&B[i], 1.0f);
        if (group_of[i] == 0) { buf_nan(&C[i]); } else { buf_random(&C[i], 1.0f); }
        C0[i] = C[i];
    }
    float alpha0[G] = {1.0f, 1.0f, 0.5f}, beta0[G] = {0.0f, 1.0f, -1.0f};
    run_queue();
    int bad = 0;
    double worst = 0.0;
    for (int i = 0; i < P; i++) {
        int g = group_of[i];
        Ref r = {m[g], n[g], k[g], ta[g] == CUBLAS_OP_T, tb[g] == CUBLAS_OP_T, alpha0[g], beta0[g], 0,
                 {&A[i], 0, lda[g]}, {&B[i], 0, ldb[g]}, {&C0[i], 0, ldc[g]}, {&C[i], 0, ldc[g]}, {NULL, 0, 0},
                 {NULL, 0, 0}, {NULL, 0, 0}};
        worst = fmax(worst, ref_check(&r, &bad));
    }
    expect(bad == 0, "%s: %d elements off (worst error/tolerance %.3g)", name, bad, worst);
    if (bad == 0) { printf("ok   %-58s worst error/tolerance %.3f\n", name, worst); }
}

// ---- statuses: what is not modelled is refused, conflicting arguments are invalid
typedef struct {
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
} LtSetup;
static LtSetup lt_setup(cudaDataType_t ab, cudaDataType_t cd, int m, int n, int k) {
    LtSetup s = {NULL, NULL, NULL, NULL};
    cublasLtMatmulDescCreate(&s.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&s.la, ab, m, k, m);
    cublasLtMatrixLayoutCreate(&s.lb, ab, k, n, k);
    cublasLtMatrixLayoutCreate(&s.ld, cd, m, n, m);
    return s;
}
static void lt_teardown(LtSetup *s) {
    cublasLtMatrixLayoutDestroy(s->la); cublasLtMatrixLayoutDestroy(s->lb); cublasLtMatrixLayoutDestroy(s->ld);
    cublasLtMatmulDescDestroy(s->desc);
}
static cublasStatus_t lt_heuristic(const LtSetup *s) {
    cublasLtMatmulHeuristicResult_t h[2];
    int found = -1;
    return cublasLtMatmulAlgoGetHeuristic(lt, s->desc, s->la, s->lb, s->ld, s->ld, NULL, 2, h, &found);
}

static void test_statuses(void) {
    float one = 1.0f, zero = 0.0f;
    static float mem[4096];
    expect(cublasLtGetVersion() == CUBLAS_VERSION, "cublasLtGetVersion %zu", cublasLtGetVersion());
    {   // a type other than bf16 / fp32; an fp32 A with a bf16 D
        LtSetup s = lt_setup(CUDA_R_16F, CUDA_R_16F, 8, 8, 8);
        expect(lt_heuristic(&s) == CUBLAS_STATUS_NOT_SUPPORTED, "fp16 layouts: not supported");
        expect(cublasLtMatmul(lt, s.desc, &one, mem, s.la, mem, s.lb, &zero, mem, s.ld, mem, s.ld, NULL, NULL, 0, 0) ==
               CUBLAS_STATUS_NOT_SUPPORTED, "fp16 matmul: not supported");
        lt_teardown(&s);
        s = lt_setup(CUDA_R_32F, CUDA_R_16BF, 8, 8, 8);
        expect(lt_heuristic(&s) == CUBLAS_STATUS_NOT_SUPPORTED, "fp32 inputs, bf16 output: not supported");
        lt_teardown(&s);
    }
    {   // compute and scale types
        LtSetup s = lt_setup(CUDA_R_16BF, CUDA_R_16BF, 8, 8, 8);
        cublasLtMatmulDescDestroy(s.desc);
        cublasLtMatmulDescCreate(&s.desc, CUBLAS_COMPUTE_16F, CUDA_R_16F);
        expect(lt_heuristic(&s) == CUBLAS_STATUS_NOT_SUPPORTED, "compute 16F: not supported");
        cublasLtMatmulDescDestroy(s.desc);
        cublasLtMatmulDescCreate(&s.desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F);
        expect(lt_heuristic(&s) == CUBLAS_STATUS_NOT_SUPPORTED, "compute 32F_FAST_TF32: not supported");
        lt_teardown(&s);
    }
    {   // epilogues not modelled; bias and aux rules
        LtSetup s = lt_setup(CUDA_R_16BF, CUDA_R_16BF, 12, 8, 8);
        cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_RELU;
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
        expect(lt_heuristic(&s) == CUBLAS_STATUS_NOT_SUPPORTED, "RELU: not supported");
        e = CUBLASLT_EPILOGUE_DGELU_BGRAD;
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
        expect(lt_heuristic(&s) == CUBLAS_STATUS_NOT_SUPPORTED, "DGELU_BGRAD: not supported");
        e = CUBLASLT_EPILOGUE_BIAS;
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
        expect(lt_heuristic(&s) == CUBLAS_STATUS_INVALID_VALUE, "BIAS without a bias pointer: invalid");
        e = CUBLASLT_EPILOGUE_GELU_AUX;
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
        void *aux = mem;
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux));
        int64_t aux_ld = 8;   // < m
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
        expect(lt_heuristic(&s) == CUBLAS_STATUS_INVALID_VALUE, "aux_ld < m: invalid");
        aux_ld = 20;   // not a multiple of 8
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
        expect(lt_heuristic(&s) == CUBLAS_STATUS_INVALID_VALUE, "aux_ld 20: invalid");
        aux_ld = 16;
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
        expect(lt_heuristic(&s) == CUBLAS_STATUS_SUCCESS, "aux_ld 16: fine");
        int32_t fp16 = CUDA_R_16F;
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &fp16, sizeof(fp16));
        expect(lt_heuristic(&s) == CUBLAS_STATUS_NOT_SUPPORTED, "fp16 aux: not supported");
        lt_teardown(&s);
    }
    {   // attributes: sizes, unmodelled ones, read back
        LtSetup s = lt_setup(CUDA_R_16BF, CUDA_R_16BF, 8, 8, 8);
        int32_t small = 0;
        expect(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &small, sizeof(small)) ==
               CUBLAS_STATUS_INVALID_VALUE, "aux_ld of 4 bytes: invalid");
        const void *scale = mem;
        expect(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof(scale)) ==
               CUBLAS_STATUS_NOT_SUPPORTED, "A scale pointer: not supported");
        int32_t pm = CUBLASLT_POINTER_MODE_DEVICE;
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm));
        expect(lt_heuristic(&s) == CUBLAS_STATUS_NOT_SUPPORTED, "device pointer mode: not supported");
        cublasOperation_t op = CUBLAS_OP_T, back = CUBLAS_OP_N;
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof(op));
        size_t written = 0;
        expect(cublasLtMatmulDescGetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSB, &back, sizeof(back), &written) ==
               CUBLAS_STATUS_SUCCESS && back == CUBLAS_OP_T && written == sizeof(back), "TRANSB reads back");
        int32_t order = CUBLASLT_ORDER_ROW;
        cublasLtMatrixLayoutSetAttribute(s.la, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order));
        pm = CUBLASLT_POINTER_MODE_HOST;
        lt_set_desc(s.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm));
        expect(lt_heuristic(&s) == CUBLAS_STATUS_NOT_SUPPORTED, "row order: not supported");
        lt_teardown(&s);
    }
    {   // shapes and batch counts that do not agree
        LtSetup s = lt_setup(CUDA_R_16BF, CUDA_R_16BF, 8, 8, 8);
        cublasLtMatrixLayoutDestroy(s.lb);
        cublasLtMatrixLayoutCreate(&s.lb, CUDA_R_16BF, 7, 8, 8);   // k 7 against A's 8
        expect(lt_heuristic(&s) == CUBLAS_STATUS_INVALID_VALUE, "k mismatch: invalid");
        cublasLtMatrixLayoutDestroy(s.lb);
        cublasLtMatrixLayoutCreate(&s.lb, CUDA_R_16BF, 8, 8, 8);
        lt_set_batch(s.la, 2, 64);
        lt_set_batch(s.lb, 2, 64);
        expect(lt_heuristic(&s) == CUBLAS_STATUS_INVALID_VALUE, "batch counts 2, 2, 1: invalid");
        lt_set_batch(s.ld, 2, 64);
        expect(lt_heuristic(&s) == CUBLAS_STATUS_SUCCESS, "batch counts 2, 2, 2: fine");
        cublasLtMatrixLayout_t bad = NULL;
        cublasLtMatrixLayoutCreate(&bad, CUDA_R_16BF, 8, 8, 4);   // ld < rows
        expect(cublasLtMatmulAlgoGetHeuristic(lt, s.desc, bad, s.lb, s.ld, s.ld, NULL, 1, NULL, NULL) ==
               CUBLAS_STATUS_INVALID_VALUE, "no result array: invalid");
        cublasLtMatmulHeuristicResult_t h;
        int found;
        expect(cublasLtMatmulAlgoGetHeuristic(lt, s.desc, bad, s.lb, s.ld, s.ld, NULL, 1, &h, &found) ==
               CUBLAS_STATUS_INVALID_VALUE, "ld < rows: invalid");
        cublasLtMatrixLayoutDestroy(bad);
        cublasLtMatmulAlgo_t junk;
        memset(&junk, 0, sizeof(junk));
        expect(cublasLtMatmul(lt, s.desc, &one, mem, s.la, mem, s.lb, &zero, mem, s.ld, mem, s.ld, &junk, NULL, 0, 0) ==
               CUBLAS_STATUS_INVALID_VALUE, "an algorithm not from the heuristic: invalid");
        lt_teardown(&s);
    }
    {   // matmul.h's preferences (their sizes), and the heuristic with them
        cublasLtMatmulPreference_t pref = NULL;
        cublasLtMatmulPreferenceCreate(&pref);
        size_t ws = 32 << 20;
        uint32_t al = 2, reduction = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        int ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)) ==
                 CUBLAS_STATUS_SUCCESS;
        const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++) {
            ok &= cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &al, sizeof(al)) == CUBLAS_STATUS_SUCCESS;
        }
        ok &= cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                   sizeof(reduction)) == CUBLAS_STATUS_SUCCESS;
        ok &= cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &al, sizeof(al)) ==
              CUBLAS_STATUS_INVALID_VALUE;
        LtSetup s = lt_setup(CUDA_R_16BF, CUDA_R_16BF, 8, 8, 8);
        cublasLtMatmulHeuristicResult_t h[8];
        int found = 0;
        ok &= cublasLtMatmulAlgoGetHeuristic(lt, s.desc, s.la, s.lb, s.ld, s.ld, pref, 8, h, &found) ==
              CUBLAS_STATUS_SUCCESS && found >= 1;
        for (int i = 0; i < found; i++) { ok &= h[i].state == CUBLAS_STATUS_SUCCESS && h[i].workspaceSize == 0; }
        expect(ok, "matmul.h's preference attributes and the heuristic with them");
        lt_teardown(&s);
        cublasLtMatmulPreferenceDestroy(pref);
    }
    {   // cuBLAS: math modes, types, leading dimensions; the handle's stream
        cublasHandle_t h = NULL;
        cublasCreate(&h);
        expect(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_NOT_SUPPORTED,
               "TF32 math: not supported");
        cublasMath_t fp32_sums = (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
        expect(cublasSetMathMode(h, fp32_sums) == CUBLAS_STATUS_SUCCESS,
               "default math, no reduced precision reduction: fine");
        expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, mem, CUDA_R_32F, 4, 16, mem,
                                          CUDA_R_32F, 4, 16, &zero, mem, CUDA_R_16BF, 4, 16, 2, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED,
               "strided: fp32 inputs, bf16 output: not supported");
        expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, mem, CUDA_R_16BF, 4, 16, mem,
                                          CUDA_R_16BF, 4, 16, &zero, mem, CUDA_R_16BF, 4, 16, 2, CUBLAS_COMPUTE_16F,
                                          CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED,
               "strided: compute 16F: not supported");
        expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, mem, CUDA_R_16BF, 3, 16, mem,
                                          CUDA_R_16BF, 4, 16, &zero, mem, CUDA_R_16BF, 4, 16, 2, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
               "strided: lda < m: invalid");
        cudaStream_t s = (cudaStream_t)(uintptr_t)0x1234;   // (an opaque value: the queue here only records it)
        cublasSetStream(h, s);
        expect(cublasSetWorkspace(h, mem, sizeof(mem)) == CUBLAS_STATUS_SUCCESS, "cublasSetWorkspace");
        cudaStream_t got = NULL;
        cublasGetStream(h, &got);
        expect(got == s, "cublasGetStream");
        expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, mem, CUDA_R_32F, 4, 16, mem,
                                          CUDA_R_32F, 4, 16, &zero, mem + 1024, CUDA_R_32F, 4, 16, 2,
                                          CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS && last_stream == s,
               "strided GEMM queued on the handle's stream");
        run_queue();
        cublasDestroy(h);
        cublasOperation_t t = CUBLAS_OP_N;
        int four = 4, sz = 1, bad_ld = 2;
        const void *p[1] = {mem};
        void *c[1] = {mem + 2048};
        expect(cublasGemmGroupedBatchedEx(blas, &t, &t, &four, &four, &four, &one, p, CUDA_R_32F, &bad_ld, p,
                                          CUDA_R_32F, &four, &zero, c, CUDA_R_32F, &four, 1, &sz, CUBLAS_COMPUTE_32F) ==
               CUBLAS_STATUS_INVALID_VALUE, "grouped: lda < m: invalid");
    }
}

// ---- results do not depend on the algorithm, nor on how the problem is cut (bit for bit)
static void test_independence(cudaDataType_t ab, cudaDataType_t cd, const char *name) {
    const int m = 150, n = 141, k = 70;   // (past the 64-row and 128-column blocks)
    Buf A, B, D0, D1, D2;
    void *pa = buf_init(&A, ab, (size_t)k * m), *pb = buf_init(&B, ab, (size_t)k * n);
    void *d[3] = {buf_init(&D0, cd, (size_t)m * n), buf_init(&D1, cd, (size_t)m * n), buf_init(&D2, cd, (size_t)m * n)};
    buf_random(&A, 1.0f);
    buf_random(&B, 1.0f);
    float one = 1.0f, zero = 0.0f;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t opt = CUBLAS_OP_T;
    lt_set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof(opt));
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatrixLayoutCreate(&la, ab, k, m, k);
    cublasLtMatrixLayoutCreate(&lb, ab, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, cd, m, n, m);
    cublasLtMatmulHeuristicResult_t h[8];
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, NULL, 8, h, &found);
    expect(found >= 2, "%s: the heuristic offers %d algorithms", name, found);
    for (int i = 0; i < 2 && i < found; i++) {   // whole, with algorithm 0 and the last
        cublasLtMatmul(lt, desc, &one, pa, la, pb, lb, &zero, d[i], ld, d[i], ld, &h[i == 0 ? 0 : found - 1].algo, NULL,
                       0, 0);
    }
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatrixLayoutCreate(&ld, cd, 1, 1, m);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutCreate(&la, ab, k, 1, k);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutCreate(&lb, ab, k, 1, k);
    for (int j = 0; j < n; j += 7) {   // element by element, a few columns
        for (int i = 0; i < m; i++) {
            const char *a = (const char *)pa + (size_t)i * k * tbytes(ab);
            const char *b = (const char *)pb + (size_t)j * k * tbytes(ab);
            char *out = (char *)d[2] + ((size_t)i + (size_t)j * m) * tbytes(cd);
            cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, out, ld, out, ld, NULL, NULL, 0, 0);
        }
    }
    run_queue();
    int same01 = D0.bytes == D1.bytes, same02 = 1;
    for (int j = 0; j < n; j += 7) {
        same02 &= !memcmp(&D0.bytes[(size_t)j * m * tbytes(cd)], &D2.bytes[(size_t)j * m * tbytes(cd)], m * tbytes(cd));
    }
    expect(same01, "%s: algorithms 0 and %d differ", name, found - 1);
    expect(same02, "%s: element by element differs from the whole", name);
#ifndef __FMA__
    // without fused multiply-adds the sum is exactly a float loop over k in order
    int exact = 1;
    for (int j = 0; j < n && exact; j++) {
        for (int i = 0; i < m; i++) {
            float s = 0.0f;
            for (int p = 0; p < k; p++) {
                s += (float)buf_get(&A, (size_t)i * k + p) * (float)buf_get(&B, (size_t)j * k + p);
            }
            Buf one_elem;
            buf_init(&one_elem, cd, 1);
            buf_set(&one_elem, 0, s);
            if (memcmp(one_elem.bytes.data(), &D0.bytes[((size_t)i + (size_t)j * m) * tbytes(cd)], tbytes(cd))) {
                exact = 0;
                break;
            }
        }
    }
    expect(exact, "%s: not the float sum over k in order", name);
#endif
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
}

int main(void) {
    cublasLtCreate(&lt);
    cublasCreate(&blas);
    const cudaDataType_t BF = CUDA_R_16BF, F = CUDA_R_32F;
    std::vector<Case> cases;
    // every transpose of each operand, each type combination, no epilogue
    const cudaDataType_t types[3][2] = {{BF, BF}, {F, F}, {BF, F}};
    static char names[64][96];
    int nn = 0;
    for (int t = 0; t < 3; t++) {
        for (int ta = 0; ta < 2; ta++) {
            for (int tb = 0; tb < 2; tb++) {
                snprintf(names[nn], sizeof(names[nn]), "lt %s->%s ta=%d tb=%d", types[t][0] == BF ? "bf16" : "fp32",
                         types[t][1] == BF ? "bf16" : "fp32", ta, tb);
                Case c = {names[nn++], API_LT, 37, 21, 45, ta, tb, 3, types[t][0], types[t][1], 1.0f, 0.0f,
                          CUBLASLT_EPILOGUE_DEFAULT, 0, 1, 0, 1.0f, 0};
                cases.push_back(c);
            }
        }
    }
    Case more[] = {
        // name                                    api     m    n    k  ta tb pad ab  cd  alpha  beta  epilogue                        auxpad batch sepC scale f32side
        {"lt bf16 BIAS (matmul forward)",          API_LT, 40, 19, 33, 1, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_BIAS,          0, 1, 0, 1.0f, 0},
        {"lt fp32 BIAS ta=0 tb=1",                 API_LT, 23, 17, 31, 0, 1, 2, F,  F,  1.0f, 0.0f, CUBLASLT_EPILOGUE_BIAS,          0, 1, 0, 1.0f, 0},
        {"lt bf16 GELU",                           API_LT, 24, 9, 20,  1, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_GELU,          0, 1, 0, 2.0f, 0},
        {"lt fp32 GELU_BIAS",                      API_LT, 24, 9, 20,  1, 0, 0, F,  F,  1.0f, 0.0f, CUBLASLT_EPILOGUE_GELU_BIAS,     0, 1, 0, 2.0f, 0},
        {"lt bf16 GELU_AUX",                       API_LT, 32, 13, 40, 1, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_GELU_AUX,      0, 1, 0, 2.0f, 0},
        {"lt bf16 GELU_AUX aux_ld > m",            API_LT, 20, 13, 40, 1, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_GELU_AUX,      16, 1, 0, 2.0f, 0},
        {"lt bf16 GELU_AUX_BIAS aux_ld > m",       API_LT, 20, 11, 24, 1, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 8, 1, 0, 2.0f, 0},
        {"lt fp32 GELU_AUX_BIAS ta=0 tb=1",        API_LT, 21, 11, 24, 0, 1, 1, F,  F,  1.0f, 0.0f, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 8, 1, 0, 2.0f, 0},
        {"lt bf16 GELU_AUX_BIAS fp32 bias, aux",   API_LT, 20, 11, 24, 1, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 8, 1, 0, 2.0f, 1},
        {"lt fp32 GELU_AUX tanh shape (k=1)",      API_LT, 64, 4, 1,   1, 0, 0, F,  F,  1.0f, 0.0f, CUBLASLT_EPILOGUE_GELU_AUX,      0, 1, 0, 4.0f, 0},
        {"lt bf16 DGELU (matmul backward)",        API_LT, 24, 10, 30, 0, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_DGELU,         0, 1, 0, 1.0f, 0},
        {"lt bf16 DGELU aux_ld > m",               API_LT, 13, 10, 30, 0, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_DGELU,         24, 1, 0, 1.0f, 0},
        {"lt fp32 DGELU beta, separate C",         API_LT, 16, 10, 30, 1, 1, 2, F,  F,  0.5f, 0.5f, CUBLASLT_EPILOGUE_DGELU,         8, 1, 1, 1.0f, 0},
        {"lt fp32 alpha, beta, separate C",        API_LT, 19, 22, 17, 1, 1, 1, F,  F,  0.75f, -0.5f, CUBLASLT_EPILOGUE_DEFAULT,     0, 1, 1, 1.0f, 0},
        {"lt bf16 beta=1 (dweight accumulate)",    API_LT, 33, 18, 50, 0, 1, 0, BF, BF, 1.0f, 1.0f, CUBLASLT_EPILOGUE_DEFAULT,       0, 1, 0, 1.0f, 0},
        {"lt bf16 alpha=0: A, B unread",           API_LT, 9, 7, 5,    0, 0, 0, BF, BF, 0.0f, 2.0f, CUBLASLT_EPILOGUE_DEFAULT,       0, 1, 0, 1.0f, 0},
        {"lt bf16 blocks (m 150, n 140)",          API_LT, 150, 140, 70, 1, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_DEFAULT,     0, 1, 0, 1.0f, 0},
        {"lt bf16 batch 3 beta=1 ta=0 tb=1",       API_LT, 24, 16, 20, 0, 1, 0, BF, BF, 1.0f, 1.0f, CUBLASLT_EPILOGUE_DEFAULT,       0, 3, 0, 1.0f, 0},
        {"lt bf16 batch 3 BIAS",                   API_LT, 24, 16, 20, 1, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_BIAS,          0, 3, 0, 1.0f, 0},
        {"lt bf16 batch 3 GELU_AUX_BIAS",          API_LT, 24, 16, 20, 1, 0, 0, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 8, 3, 0, 2.0f, 0},
        {"lt fp32 batch 4 DGELU",                  API_LT, 16, 12, 20, 0, 0, 1, F,  F,  1.0f, 0.0f, CUBLASLT_EPILOGUE_DGELU,         0, 4, 0, 1.0f, 0},
        {"lt fp32 batch 2 separate C",             API_LT, 16, 12, 20, 1, 1, 1, F,  F,  1.0f, 1.0f, CUBLASLT_EPILOGUE_DEFAULT,       0, 2, 1, 1.0f, 0},
        {"strided bf16->fp32 T N (scores)",        API_STRIDED, 16, 16, 8, 1, 0, 0, BF, F, 1.0f, 0.0f, CUBLASLT_EPILOGUE_DEFAULT,    0, 4, 0, 1.0f, 0},
        {"strided bf16 N N (P V)",                 API_STRIDED, 8, 16, 16, 0, 0, 4, BF, BF, 1.0f, 0.0f, CUBLASLT_EPILOGUE_DEFAULT,   0, 4, 0, 1.0f, 0},
        {"strided bf16 N T beta=1 (dK sum)",       API_STRIDED, 8, 16, 16, 0, 1, 4, BF, BF, 1.0f, 1.0f, CUBLASLT_EPILOGUE_DEFAULT,   0, 3, 0, 1.0f, 0},
        {"strided fp32 T T alpha, beta",           API_STRIDED, 11, 9, 13, 1, 1, 2, F, F, 2.0f, 0.25f, CUBLASLT_EPILOGUE_DEFAULT,    0, 2, 0, 1.0f, 0},
        {"strided fp32 k=0: D = beta C",           API_STRIDED, 5, 6, 0, 0, 0, 0, F, F, 1.0f, 0.5f, CUBLASLT_EPILOGUE_DEFAULT,       0, 2, 0, 1.0f, 0},
    };
    for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++) { cases.push_back(more[i]); }
    for (size_t i = 0; i < cases.size(); i++) { run_case(&cases[i]); }
    run_grouped(BF, BF, "grouped bf16");
    run_grouped(F, F, "grouped fp32");
    run_grouped(BF, F, "grouped bf16->fp32");
    test_statuses();
    test_independence(BF, BF, "independence bf16");
    test_independence(F, F, "independence fp32");
    cublasDestroy(blas);
    cublasLtDestroy(lt);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
