// Linear layers: out = inp @ weight^T + bias, weight (OC, IC) like PyTorch and llm.c.
// CPU: OpenBLAS sgemm (row-major). CUDA: cuBLASLt.
#ifndef LLMC_MATMUL_H
#define LLMC_MATMUL_H

#include "backend.h"
#include "alloc.h"
#include "gelu.h"
#include "residual.h"

// inp (N, IC), weight (OC, IC), bias (OC) or NULL -> out (N, OC)
static void matmul_forward_cpu(float *out, const float *inp, const float *weight, const float *bias, int N, int IC,
                               int OC) {
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


// The MLP's two GELU-adjacent linear layers, fused where the backend can (the CUDA launchers below
// run them as one cuBLASLt call with a GELU epilogue). These CPU versions are the specification.

// fc forward: out_pre (N, OC) = inp @ weight^T + bias (bias may be NULL), out_gelu (N, OC) = gelu(out_pre).
// out_gelu and out_pre must be different buffers.
static void matmul_forward_gelu_cpu(float *out_gelu, float *out_pre, const float *inp, const float *weight,
                                    const float *bias, int N, int IC, int OC) {
    matmul_forward_cpu(out_pre, inp, weight, bias, N, IC, OC);
    gelu_forward_cpu(out_gelu, out_pre, (size_t)N * OC);
}

// fcproj backward, for a linear layer whose input was inp = gelu(pre) (both (N, IC)):
// dpre (N, IC) = (dout @ weight) * gelu'(pre)   (written; NULL to skip)
// dweight (OC, IC) += dout^T @ inp              (NULL to skip)
// dpre must not alias dout, inp, weight or pre.
static void matmul_backward_dgelu_cpu(float *dpre, float *dweight, const float *dout, const float *inp,
                                      const float *weight, const float *pre, int N, int IC, int OC) {
    matmul_backward_cpu(dpre, dweight, NULL, dout, inp, weight, N, IC, OC);
    if (dpre != NULL) { gelu_backward_cpu(dpre, pre, dpre, (size_t)N * IC); }
}

// How the CUDA build picks each GEMM's cuBLASLt algorithm (set by main; the CPU build has none to pick):
// matmul_tune 1 times the heuristic's candidates on a problem's first call (a single-rank run only: two ranks
// that computed one replicated product with two algorithms could differ in its last bits, and a MoE router
// would then route otherwise on one of them), 0 takes the heuristic's first (--deterministic). The choices
// are kept in matmul_choices_path (the run's -o directory), so a resumed or repeated run computes with the
// same algorithms, bit for bit.
static int matmul_tune = 0;
static const char *matmul_choices_path = NULL;

#ifdef USE_CUDA
#if defined(ENABLE_FP32)
#define CUBLAS_FLOATX CUDA_R_32F
#else
#define CUBLAS_FLOATX CUDA_R_16BF
#endif

// cuBLASLt's workspace (the attention's cuBLAS GEMMs share it: one stream), allocated at set-up.
static void matmul_setup(void) {
    if (cublaslt_workspace == NULL) { cublaslt_workspace = mem_alloc(cublaslt_workspace_size, MEM_WORKSPACE); }
}

// Largest power of two (<= 256) dividing the address: tells cuBLASLt how aligned a buffer is,
// so it never picks a kernel that assumes more (shards and chunks start at arbitrary offsets).
static uint32_t matmul_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t align = 256;
    while (align > 1 && (a % align) != 0) { align /= 2; }
    return align;
}

// The heuristic's choice per problem, cached: cuBLASLt's query costs more host time than launching the
// GEMM, and a step asks the same few dozen problems again and again. The key is everything the query
// reads: shapes, transposes, leading dimensions, the epilogue, aux_ld and the operands' alignments.
typedef struct { int m, n, k, transa, transb, lda, ldb, epilogue; int64_t aux_ld; uint32_t align[5]; int batch;
                 int64_t stride[5]; } MatmulKey;
// count GEMMs of one shape on stacked operands, operand i at base + i * stride (elements): a strided batch
typedef struct { int count; int64_t sa, sb, sd, sbias, saux; } MatmulBatch;
// found: an algorithm exists; index: which of the heuristic's candidates (-1: not chosen yet: first seen
// accumulating into its output, beta != 0, where timing would add to it; the first candidate meanwhile)
typedef struct { MatmulKey key; int found, index; cublasLtMatmulAlgo_t algo; } MatmulChoice;
#define MATMUL_CHOICES 256
#define MATMUL_CANDIDATES 8
static MatmulChoice matmul_choices[MATMUL_CHOICES];
static int matmul_nchoices;
static MatmulChoice *matmul_choice_find(const MatmulKey *key) {
    for (int i = 0; i < matmul_nchoices; i++) {
        if (!memcmp(&matmul_choices[i].key, key, sizeof(*key))) { return &matmul_choices[i]; }
    }
    return NULL;
}

// cuBLASLt's heuristic's candidates (up to MATMUL_CANDIDATES, best first) for desc and the layouts, limited to
// the pointers' alignments and to split-K sums in fp32: their number (0: none) in algos.
static int matmul_heuristic(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                            cublasLtMatrixLayout_t ld, const void *a, const void *b, const void *d,
                            cublasLtMatmulAlgo_t algos[MATMUL_CANDIDATES]) {
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = cublaslt_workspace_size;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    uint32_t al_a = matmul_alignment(a), al_b = matmul_alignment(b), al_d = matmul_alignment(d);
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                     sizeof(al_a)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                     sizeof(al_b)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                     sizeof(al_d)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                     sizeof(al_d)));
    // split-K partial sums in fp32 only: the INPLACE and OUTPUT_TYPE schemes would add them in floatX
    uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                     sizeof(reduction)));
    cublasLtMatmulHeuristicResult_t heuristic[MATMUL_CANDIDATES];
    int found = 0;
    // a configuration cuBLASLt does not support (e.g. an epilogue for this type) may come back as an
    // error status instead of zero results: both mean "no algorithm", and the caller falls back
    if (cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, la, lb, ld, ld, pref, MATMUL_CANDIDATES, heuristic,
                                       &found) != CUBLAS_STATUS_SUCCESS) {
        found = 0;
    }
    for (int i = 0; i < found; i++) { algos[i] = heuristic[i].algo; }
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    return found;
}

// The fastest of n candidates on this problem (beta 0: each run overwrites d, which the caller's call then
// writes again): one warm-up call, then 3 timed; a candidate that fails to launch is passed over.
static int matmul_fastest(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                          cublasLtMatrixLayout_t ld, const void *a, const void *b, void *d,
                          const cublasLtMatmulAlgo_t *algos, int n) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    float alpha = 1.0f, beta = 0.0f, best_ms = INFINITY;
    int best = 0;
    for (int i = 0; i < n; i++) {
        if (cublasLtMatmul(cublaslt_handle, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &algos[i],
                           cublaslt_workspace, cublaslt_workspace_size, main_stream) != CUBLAS_STATUS_SUCCESS) {
            continue;
        }
        cudaCheck(cudaEventRecord(start, main_stream));
        for (int r = 0; r < 3; r++) {
            cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &algos[i],
                                       cublaslt_workspace, cublaslt_workspace_size, main_stream));
        }
        cudaCheck(cudaEventRecord(stop, main_stream));
        cudaCheck(cudaEventSynchronize(stop));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, start, stop));
        if (ms < best_ms) { best_ms = ms; best = i; }
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return best;
}

// The choices file: a first line naming the device and cuBLASLt's version (a file of another is not read),
// then one line per problem, its key's 14 numbers and the candidate's index. Loaded at set-up, written after
// the first step (each choice is made on a problem's first call).
static void matmul_choices_id(char *id, size_t len) {
    cudaDeviceProp prop;
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    snprintf(id, len, "cublaslt %zu device %s", cublasLtGetVersion(), prop.name);
    for (char *c = id; *c; c++) { if (*c == '\n') { *c = ' '; } }
}
static void matmul_choices_load(void) {
    FILE *f = matmul_choices_path ? fopen(matmul_choices_path, "r") : NULL;
    if (f == NULL) { return; }
    char id[512], line[512];
    matmul_choices_id(id, sizeof(id));
    if (fgets(line, sizeof(line), f) && !strncmp(line, id, strlen(id))) {
        MatmulChoice c;
        memset(&c, 0, sizeof(c));
        MatmulKey *k = &c.key;
        long long aux_ld;
        while (matmul_nchoices < MATMUL_CHOICES &&
               fscanf(f, "%d %d %d %d %d %d %d %d %lld %u %u %u %u %u %d", &k->m, &k->n, &k->k, &k->transa, &k->transb,
                      &k->lda, &k->ldb, &k->epilogue, &aux_ld, &k->align[0], &k->align[1], &k->align[2], &k->align[3],
                      &k->align[4], &c.index) == 15) {
            k->aux_ld = aux_ld;
            k->batch = 1;   // (the file holds single GEMMs)
            c.found = -1;   // (the algorithm itself: from the heuristic at the first call)
            matmul_choices[matmul_nchoices++] = c;
            memset(&c, 0, sizeof(c));
        }
    }
    fclose(f);
}
static void matmul_choices_save(void) {
    if (matmul_choices_path == NULL || matmul_nchoices == 0) { return; }
    char id[512], tmp[1100];
    matmul_choices_id(id, sizeof(id));
    snprintf(tmp, sizeof(tmp), "%s.tmp", matmul_choices_path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) { return; }   // (a cache: a run without it only times again)
    fprintf(f, "%s\n", id);
    for (int i = 0; i < matmul_nchoices; i++) {
        const MatmulChoice *c = &matmul_choices[i];
        const MatmulKey *k = &c->key;
        if (c->found != 1 || c->index < 0 || k->batch != 1) { continue; }
        fprintf(f, "%d %d %d %d %d %d %d %d %lld %u %u %u %u %u %d\n", k->m, k->n, k->k, k->transa, k->transb, k->lda,
                k->ldb, k->epilogue, (long long)k->aux_ld, k->align[0], k->align[1], k->align[2], k->align[3],
                k->align[4], c->index);
    }
    if (fclose(f) == 0) { rename(tmp, matmul_choices_path); }
}

// A strided batch (matmul_cublaslt_epilogue's bt) on the layouts and the descriptor: the batch count, each operand's
// stride, the bias's and aux's (has_bias, has_aux).
static void matmul_set_batch(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                             cublasLtMatrixLayout_t ld, const MatmulBatch *bt, int has_bias, int has_aux) {
    cublasLtMatrixLayout_t lay[3] = {la, lb, ld};
    int64_t stride[3] = {bt->sa, bt->sb, bt->sd};
    int batch = bt->count;
    for (int i = 0; i < 3; i++) {
        cublasCheck(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
        cublasCheck(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride[i],
                                                     sizeof(stride[i])));
    }
    if (has_bias) {
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bt->sbias,
                                                   sizeof(bt->sbias)));
    }
    if (has_aux) {
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &bt->saux,
                                                   sizeof(bt->saux)));
    }
}

// The algorithm for problem key: the one chosen before, or the heuristic's candidates and a pick among them (the
// first; tuning: the fastest, timed when beta is 0 so that running a candidate changes nothing). A new problem takes
// a place in the table (a full table: later problems are asked each time, in a scratch entry).
static MatmulChoice *matmul_choose(const MatmulKey *key, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld, const floatX *a,
                                   const floatX *b, floatX *d, float beta) {
    static MatmulChoice fresh;
    MatmulChoice *choice = matmul_choice_find(key);
    if (choice == NULL) {
        memset(&fresh, 0, sizeof(fresh));
        fresh.key = *key;
        fresh.found = -1;
        fresh.index = -1;
        choice = matmul_nchoices < MATMUL_CHOICES ? &matmul_choices[matmul_nchoices++] : &fresh;
        *choice = fresh;
    }
    if (choice->found == -1 || (choice->index < 0 && beta == 0.0f)) {   // the heuristic's candidates; pick one
        cublasLtMatmulAlgo_t algos[MATMUL_CANDIDATES];
        int n = matmul_heuristic(desc, la, lb, ld, a, b, d, algos);
        int index = choice->index >= 0 && choice->index < n ? choice->index   // (from the choices file)
                    : !matmul_tune || n <= 1 || choice == &fresh ? 0
                    : beta == 0.0f ? matmul_fastest(desc, la, lb, ld, a, b, d, algos, n) : -1;
        choice->found = n > 0;
        choice->index = n > 0 ? index : 0;
        if (n > 0) { choice->algo = algos[index < 0 ? 0 : index]; }
    }
    return choice;
}

// D (m, n) = epilogue(alpha op(A) op(B) + beta D), column-major (cuBLAS) view, fp32 accumulation.
// A is (m, k) after op, stored with leading dimension lda; likewise B (k, n); D (m, n) ld = m.
// epilogue, with its extra operands:
//   CUBLASLT_EPILOGUE_DEFAULT         nothing
//   CUBLASLT_EPILOGUE_BIAS            bias (m): added to every column of D
//   CUBLASLT_EPILOGUE_GELU_AUX[_BIAS] [bias (m) added, then] aux (m, n), ld aux_ld, written with the GELU
//                                     input, and D := gelu(that)
//   CUBLASLT_EPILOGUE_DGELU           aux (m, n), ld aux_ld, read (the GELU input of the forward pass):
//                                     D := (alpha op(A) op(B) + beta D) * gelu'(aux)
// aux has D's element type (the default of CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE); cuBLASLt wants
// aux_ld a multiple of 8 and >= m (the callers check that, and 16-byte alignment of aux, beforehand).
// Returns 0 (and queues nothing) if cuBLASLt has no algorithm for this shape/alignment/epilogue.
// bt: NULL, or a strided batch of bt->count such GEMMs (bias and aux strided too)
static int matmul_cublaslt_epilogue(floatX *d, const floatX *a, const floatX *b, const floatX *bias, const floatX *aux,
                                    int64_t aux_ld, cublasLtEpilogue_t epilogue, int m, int n, int k,
                                    int transa, int transb, int lda, int ldb, float beta, const MatmulBatch *bt) {
    matmul_setup();
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    // pointers are set before the heuristic query: it reads their alignment
    if (bias != NULL) {
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (aux != NULL) {
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                   sizeof(aux_ld)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, CUBLAS_FLOATX, transa ? k : m, transa ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUBLAS_FLOATX, transb ? n : k, transb ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, CUBLAS_FLOATX, m, n, m));
    int batch = bt ? bt->count : 1;
    if (batch > 1) { matmul_set_batch(desc, la, lb, ld, bt, bias != NULL, aux != NULL); }
    MatmulKey key;
    memset(&key, 0, sizeof(key));   // (no padding left undefined for memcmp)
    key.m = m; key.n = n; key.k = k; key.transa = transa; key.transb = transb; key.lda = lda; key.ldb = ldb;
    key.epilogue = (int)epilogue; key.aux_ld = aux_ld;
    key.align[0] = matmul_alignment(a); key.align[1] = matmul_alignment(b); key.align[2] = matmul_alignment(d);
    key.align[3] = bias != NULL ? matmul_alignment(bias) : 0; key.align[4] = aux != NULL ? matmul_alignment(aux) : 0;
    key.batch = batch;
    if (batch > 1) {
        key.stride[0] = bt->sa; key.stride[1] = bt->sb; key.stride[2] = bt->sd;
        key.stride[3] = bias != NULL ? bt->sbias : 0; key.stride[4] = aux != NULL ? bt->saux : 0;
    }
    MatmulChoice *choice = matmul_choose(&key, desc, la, lb, ld, a, b, d, beta);
    if (choice->found) {
        float alpha = 1.0f;
        cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &choice->algo,
                                   cublaslt_workspace, cublaslt_workspace_size, main_stream));
    }
    int found = choice->found;
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
    return found;
}

// The plain call: bias (m) or NULL, added through the BIAS epilogue. 0 if there is no algorithm.
static int matmul_cublaslt(floatX *d, const floatX *a, const floatX *b, const floatX *bias, int m, int n, int k,
                            int transa, int transb, int lda, int ldb, float beta) {
    cublasLtEpilogue_t epilogue = bias != NULL ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    return matmul_cublaslt_epilogue(d, a, b, bias, NULL, 0, epilogue, m, n, k, transa, transb, lda, ldb, beta, NULL);
}

static void matmul_cublaslt_check(floatX *d, const floatX *a, const floatX *b, int m, int n, int k,
                                  int transa, int transb, int lda, int ldb, float beta) {
    if (!matmul_cublaslt(d, a, b, NULL, m, n, k, transa, transb, lda, ldb, beta)) {
        fail("cuBLASLt has no algorithm for m=%d n=%d k=%d transa=%d transb=%d (alignments %u %u %u bytes)",
             m, n, k, transa, transb, matmul_alignment(a), matmul_alignment(b), matmul_alignment(d));
    }
}

// out (N, OC) += bias (OC): only used when the BIAS epilogue is unavailable (e.g. unaligned bias)
__global__ void add_bias_kernel(floatX *out, const floatX *bias, int N, int OC) {
    size_t total = (size_t)N * OC;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = (floatX)((float)out[i] + (float)bias[i % OC]);
    }
}

// Row-major (N, OC) = (N, IC) @ (OC, IC)^T is, seen column-major, out^T (OC, N) = W (OC, IC) . inp^T:
// A = weight read transposed (lda IC), B = inp (ldb IC), m = OC, n = N, k = IC.
static void matmul_forward_cuda(floatX *out, const floatX *inp, const floatX *weight, const floatX *bias, int N,
                                int IC, int OC) {
    if (N <= 0 || OC <= 0) { return; }
    if (matmul_cublaslt(out, weight, inp, bias, OC, N, IC, 1, 0, IC, IC, 0.0f)) { return; }
    matmul_cublaslt_check(out, weight, inp, OC, N, IC, 1, 0, IC, IC, 0.0f);   // no epilogue, then the bias
    if (bias != NULL) {
        LAUNCH(add_bias_kernel, elementwise_grid((size_t)N * OC, 256), 256, 0, main_stream)(out, bias, N, OC);
        cudaCheckLaunch();
    }
}

// dinp^T (IC, N) = W^T (IC, OC) . dout^T:   A = weight (lda IC), B = dout (ldb OC), m = IC, n = N, k = OC
// dweight^T (IC, OC) += inp^T (IC, N) . dout (N, OC):  A = inp (lda IC), B = dout read transposed (ldb OC)
// dbias (OC) += column sums of dout (deterministic kernel in backend.h)
static void matmul_backward_cuda(floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout, const floatX *inp,
                                 const floatX *weight, int N, int IC, int OC) {
    if (N <= 0) { return; }   // nothing to accumulate; dinp has no rows
    if (dinp != NULL) { matmul_cublaslt_check(dinp, weight, dout, IC, N, OC, 0, 0, IC, OC, 0.0f); }
    if (dweight != NULL) { matmul_cublaslt_check(dweight, inp, dout, IC, OC, N, 0, 1, IC, OC, 1.0f); }
    if (dbias != NULL) { column_sums_accumulate(dbias, NULL, dout, NULL, NULL, NULL, N, OC); }
}

// ---- GELU epilogues ----
// What cuBLASLt's GELU computes: the cuBLASLt documentation and cublasLt.h name the epilogues
// ("apply GELU point-wise transform", "GELU gradient") without writing the formula down. PyTorch
// routes its tanh GELU (torch._addmm_activation, use_gelu=True, compared against
// gelu(approximate="tanh") in its tests) and TensorRT-LLM its gelu_tanh MLPs through these epilogues:
// the tanh approximation of GPT-2, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as in gelu.h.
// Where it and erf's GELU differ most (x in [-3.5, -2.2]: ~2e-4..4.4e-4 absolute, 3..30% relative)
// dev/cuda/matmul_gelu.cu probes it and fails if the epilogue is nearer to erf than to tanh.
// Set matmul_gelu_epilogue_enabled = 0 to take the unfused kernels (same results up to rounding).
static int matmul_gelu_epilogue_enabled = 1;

// the GELU input/gradient matrix: ld a multiple of 8, start 16-byte aligned (cuBLASLt's aux rules)
static int matmul_gelu_aux_ok(const floatX *aux, int ld) {
    return matmul_gelu_epilogue_enabled && ld % 8 == 0 && matmul_alignment(aux) >= 16;
}

// out_pre (N, OC) = inp @ weight^T + bias, out_gelu = gelu(out_pre): one cuBLASLt call, GELU_AUX_BIAS
// epilogue (GELU_AUX without bias): D = out_gelu^T (OC, N), aux = out_pre^T (OC, N) with ld OC.
// The fused GELU is computed from the fp32 pre-activation; the fallback (matmul_forward_cuda, then
// gelu_forward_cuda) from the floatX-rounded out_pre. Returns 1 if the fused epilogue ran, 0 if not.
static int matmul_forward_gelu_cuda(floatX *out_gelu, floatX *out_pre, const floatX *inp, const floatX *weight,
                                    const floatX *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) { return 0; }
    if (matmul_gelu_aux_ok(out_pre, OC)) {
        cublasLtEpilogue_t epilogue = bias != NULL ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        if (matmul_cublaslt_epilogue(out_gelu, weight, inp, bias, out_pre, OC, epilogue, OC, N, IC, 1, 0, IC, IC,
                                     0.0f, NULL)) {
            return 1;
        }
    }
    matmul_forward_cuda(out_pre, inp, weight, bias, N, IC, OC);
    gelu_forward_cuda(out_gelu, out_pre, (size_t)N * OC);
    return 0;
}

// dpre^T (IC, N) = (W^T (IC, OC) . dout^T) * gelu'(pre^T): DGELU epilogue, aux = pre with ld IC;
// dweight (OC, IC) += dout^T @ inp as in matmul_backward_cuda. Fallback: the plain GEMM into dpre,
// then gelu_backward_cuda in place. Returns 1 if the fused epilogue ran for dpre, 0 if not.
static int matmul_backward_dgelu_cuda(floatX *dpre, floatX *dweight, const floatX *dout, const floatX *inp,
                                      const floatX *weight, const floatX *pre, int N, int IC, int OC) {
    if (N <= 0) { return 0; }
    int fused = 0;
    if (dpre != NULL && IC > 0) {
        if (matmul_gelu_aux_ok(pre, IC)) {
            fused = matmul_cublaslt_epilogue(dpre, weight, dout, NULL, pre, IC, CUBLASLT_EPILOGUE_DGELU, IC, N, OC, 0,
                                             0, IC, OC, 0.0f, NULL);
        }
        if (!fused) {
            matmul_cublaslt_check(dpre, weight, dout, IC, N, OC, 0, 0, IC, OC, 0.0f);
            gelu_backward_cuda(dpre, pre, dpre, (size_t)N * IC);
        }
    }
    if (dweight != NULL) { matmul_cublaslt_check(dweight, inp, dout, IC, OC, N, 0, 1, IC, OC, 1.0f); }
    return fused;
}
#endif

static void matmul_forward(floatX *out, const floatX *inp, const floatX *weight, const floatX *bias, int N, int IC,
                           int OC) {
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

static void matmul_forward_gelu(floatX *out_gelu, floatX *out_pre, const floatX *inp, const floatX *weight,
                                const floatX *bias, int N, int IC, int OC) {
#ifdef USE_CUDA
    matmul_forward_gelu_cuda(out_gelu, out_pre, inp, weight, bias, N, IC, OC);
#else
    matmul_forward_gelu_cpu(out_gelu, out_pre, inp, weight, bias, N, IC, OC);
#endif
}

static void matmul_backward_dgelu(floatX *dpre, floatX *dweight, const floatX *dout, const floatX *inp,
                                  const floatX *weight, const floatX *pre, int N, int IC, int OC) {
#ifdef USE_CUDA
    matmul_backward_dgelu_cuda(dpre, dweight, dout, inp, weight, pre, N, IC, OC);
#else
    matmul_backward_dgelu_cpu(dpre, dweight, dout, inp, weight, pre, N, IC, OC);
#endif
}


// ---- strided batches: count linear layers of one shape on stacked operands (the local experts of a padded
// MoE dispatch, N rows each): inp (count, N, IC), weight (count, OC, IC), bias (count, OC) or NULL,
// out (count, N, OC), and the same for the backward's and the GELU's operands. CPU: the loop over the count is
// the specification (each layer on one thread, its GEMMs single-threaded inside); CUDA: one strided-batched
// cuBLASLt call per product (epilogues batched too), the loop where cuBLASLt has no batched algorithm.
#ifdef USE_CUDA
static MatmulBatch matmul_batch(int count, int64_t sa, int64_t sb, int64_t sd, int64_t sbias, int64_t saux) {
    MatmulBatch b = {count, sa, sb, sd, sbias, saux};
    return b;
}
#endif

static void matmul_forward_batched(floatX *out, const floatX *inp, const floatX *weight, const floatX *bias, int N,
                                   int IC, int OC, int count) {
    if (N <= 0 || count <= 0) { return; }
#ifdef USE_CUDA
    MatmulBatch bt = matmul_batch(count, (int64_t)OC * IC, (int64_t)N * IC, (int64_t)N * OC, OC, 0);
    cublasLtEpilogue_t epilogue = bias != NULL ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (count > 1 && matmul_cublaslt_epilogue(out, weight, inp, bias, NULL, 0, epilogue, OC, N, IC, 1, 0, IC, IC, 0.0f,
                                              &bt)) {
        return;
    }
#else
    #pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int i = 0; i < count; i++) {
        matmul_forward(out + (size_t)i * N * OC, inp + (size_t)i * N * IC, weight + (size_t)i * OC * IC,
                       bias ? bias + (size_t)i * OC : NULL, N, IC, OC);
    }
}

static void matmul_forward_gelu_batched(floatX *out_gelu, floatX *out_pre, const floatX *inp, const floatX *weight,
                                        const floatX *bias, int N, int IC, int OC, int count) {
    if (N <= 0 || count <= 0) { return; }
#ifdef USE_CUDA
    MatmulBatch bt = matmul_batch(count, (int64_t)OC * IC, (int64_t)N * IC, (int64_t)N * OC, OC, (int64_t)N * OC);
    cublasLtEpilogue_t epilogue = bias != NULL ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (count > 1 && matmul_gelu_aux_ok(out_pre, OC) && ((int64_t)N * OC) % 8 == 0 &&
        matmul_cublaslt_epilogue(out_gelu, weight, inp, bias, out_pre, OC, epilogue, OC, N, IC, 1, 0, IC, IC, 0.0f,
                                 &bt)) {
        return;
    }
#else
    #pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int i = 0; i < count; i++) {
        matmul_forward_gelu(out_gelu + (size_t)i * N * OC, out_pre + (size_t)i * N * OC, inp + (size_t)i * N * IC,
                            weight + (size_t)i * OC * IC, bias ? bias + (size_t)i * OC : NULL, N, IC, OC);
    }
}

#ifdef USE_CUDA
// dweight (count, OC, IC) += dout^T inp for each layer: one batched call, else layer by layer
static void matmul_dweight_batched(floatX *dweight, const floatX *dout, const floatX *inp, int N, int IC, int OC,
                                   int count) {
    MatmulBatch bw = matmul_batch(count, (int64_t)N * IC, (int64_t)N * OC, (int64_t)OC * IC, 0, 0);
    if (count > 1 && matmul_cublaslt_epilogue(dweight, inp, dout, NULL, NULL, 0, CUBLASLT_EPILOGUE_DEFAULT, IC, OC, N, 0,
                                              1, IC, OC, 1.0f, &bw)) {
        return;
    }
    for (int i = 0; i < count; i++) {
        matmul_cublaslt_check(dweight + (size_t)i * OC * IC, inp + (size_t)i * N * IC, dout + (size_t)i * N * OC, IC,
                              OC, N, 0, 1, IC, OC, 1.0f);
    }
}
#endif

// dinp (written), dweight and dbias (added to), as matmul_backward for each of the count layers
static void matmul_backward_batched(floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout, const floatX *inp,
                                    const floatX *weight, int N, int IC, int OC, int count) {
    if (N <= 0 || count <= 0) { return; }
#ifdef USE_CUDA
    MatmulBatch bi = matmul_batch(count, (int64_t)OC * IC, (int64_t)N * OC, (int64_t)N * IC, 0, 0);
    if (count > 1 && (dinp == NULL || matmul_cublaslt_epilogue(dinp, weight, dout, NULL, NULL, 0,
                                                               CUBLASLT_EPILOGUE_DEFAULT, IC, N, OC, 0, 0, IC, OC, 0.0f,
                                                               &bi))) {
        if (dweight != NULL) { matmul_dweight_batched(dweight, dout, inp, N, IC, OC, count); }
        for (int i = 0; dbias != NULL && i < count; i++) {
            column_sums_accumulate(dbias + (size_t)i * OC, NULL, dout + (size_t)i * N * OC, NULL, NULL, NULL, N, OC);
        }
        return;
    }
#else
    #pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int i = 0; i < count; i++) {
        matmul_backward(dinp ? dinp + (size_t)i * N * IC : NULL, dweight ? dweight + (size_t)i * OC * IC : NULL,
                        dbias ? dbias + (size_t)i * OC : NULL, dout + (size_t)i * N * OC, inp + (size_t)i * N * IC,
                        weight ? weight + (size_t)i * OC * IC : NULL, N, IC, OC);   // (weight: NULL without dinp)
    }
}


// dpre (written) = (dout weight) * gelu'(pre), dweight (added to), as matmul_backward_dgelu for each layer
static void matmul_backward_dgelu_batched(floatX *dpre, floatX *dweight, const floatX *dout, const floatX *inp,
                                          const floatX *weight, const floatX *pre, int N, int IC, int OC, int count) {
    if (N <= 0 || count <= 0) { return; }
#ifdef USE_CUDA
    if (count > 1 && dpre != NULL && matmul_gelu_aux_ok(pre, IC) && ((int64_t)N * IC) % 8 == 0) {
        MatmulBatch bi = matmul_batch(count, (int64_t)OC * IC, (int64_t)N * OC, (int64_t)N * IC, 0, (int64_t)N * IC);
        if (matmul_cublaslt_epilogue(dpre, weight, dout, NULL, pre, IC, CUBLASLT_EPILOGUE_DGELU, IC, N, OC, 0, 0, IC, OC,
                                     0.0f, &bi)) {
            if (dweight != NULL) { matmul_dweight_batched(dweight, dout, inp, N, IC, OC, count); }
            return;
        }
    }
#else
    #pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int i = 0; i < count; i++) {
        matmul_backward_dgelu(dpre ? dpre + (size_t)i * N * IC : NULL, dweight ? dweight + (size_t)i * OC * IC : NULL,
                              dout + (size_t)i * N * OC, inp + (size_t)i * N * IC, weight + (size_t)i * OC * IC,
                              pre + (size_t)i * N * IC, N, IC, OC);
    }
}


// ---- groups: count linear layers of one shape on row blocks of different heights (the local experts of a dropless
// MoE dispatch): layer i has rows[i] rows (host ints; 0: nothing to do), its block right after layer i-1's:
// inp (R, IC), weight (count, OC, IC), out (R, OC), R = the sum of rows; no bias. CPU: the loop over the layers is
// the specification (each layer on one thread, its GEMMs single-threaded inside). CUDA: one grouped GEMM per
// product (cuBLAS's cublasGemmGroupedBatchedEx, cuBLAS 12.5 on), the layers with rows only; the loop of the
// per-layer launchers where cuBLAS lacks it, matmul_grouped_enabled is 0, or an operand is not 16-byte aligned.
#define MATMUL_GROUPED_MAX 256   // layers in a group at most (MOE_MAX_EXPERTS)

// each layer's first row (off[i]) and R, off[count]
static void matmul_group_offsets(size_t *off, const int *rows, int count) {
    if (count > MATMUL_GROUPED_MAX) { fail("a group of %d linear layers: at most %d", count, MATMUL_GROUPED_MAX); }
    off[0] = 0;
    for (int i = 0; i < count; i++) { off[i + 1] = off[i] + (size_t)rows[i]; }
}

#if defined(USE_CUDA) && defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
#define MATMUL_GROUPED 1
static int matmul_grouped_enabled = 1;   // 0: the per-layer loop (dev/cuda/moe.cu compares the two)
static cublasHandle_t matmul_grouped_cublas = NULL;
// the device pointer arrays (3 MATMUL_GROUPED_MAX pointers: 6 KiB) lie in the cuBLASLt workspace's head, queued
// right before their GEMM on the one stream (nothing uses the workspace in between: no allocation of their own,
// so --plan's numbers stay the measured ones); the grouped GEMMs get the rest as cuBLAS's workspace
#define MATMUL_GROUPED_HEAD ((size_t)64 * 1024)

// One grouped call's problems, one per layer with rows: C_i (m_i, n_i) = op(A_i) op(B_i) + beta C_i, column-major
// as matmul_cublaslt_epilogue's; host arrays (cuBLAS reads them in the call), but the pointers: p, A_i at i, B_i at
// MATMUL_GROUPED_MAX + i, C_i at 2 MATMUL_GROUPED_MAX + i, queued to the device in one copy
typedef struct {
    int g;
    cublasOperation_t ta[MATMUL_GROUPED_MAX], tb[MATMUL_GROUPED_MAX];
    int m[MATMUL_GROUPED_MAX], n[MATMUL_GROUPED_MAX], k[MATMUL_GROUPED_MAX], size[MATMUL_GROUPED_MAX];
    int lda[MATMUL_GROUPED_MAX], ldb[MATMUL_GROUPED_MAX], ldc[MATMUL_GROUPED_MAX];
    float alpha[MATMUL_GROUPED_MAX], beta[MATMUL_GROUPED_MAX];
    const void *p[3 * MATMUL_GROUPED_MAX];
} MatmulGroup;
static MatmulGroup matmul_group;
static_assert(sizeof(matmul_group.p) <= MATMUL_GROUPED_HEAD, "the pointer arrays fit the workspace's head");

static cublasHandle_t matmul_grouped_handle(void) {
    if (matmul_grouped_cublas == NULL) {
        matmul_setup();
        cublasCheck(cublasCreate(&matmul_grouped_cublas));
        cublasCheck(cublasSetStream(matmul_grouped_cublas, main_stream));   // resets the workspace: set it after
        cublasCheck(cublasSetMathMode(matmul_grouped_cublas,   // (split-K partial sums in fp32, as cuBLASLt's)
                                      (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
        cublasCheck(cublasSetWorkspace(matmul_grouped_cublas, (char *)cublaslt_workspace + MATMUL_GROUPED_HEAD,
                                       cublaslt_workspace_size - MATMUL_GROUPED_HEAD));
    }
    return matmul_grouped_cublas;
}

// a pointer and a leading dimension cuBLAS can take without asking: 16-byte aligned, rows of whole 16 bytes
static int matmul_grouped_aligned(const void *p, int ld) {
    return matmul_alignment(p) >= 16 && ((size_t)ld * sizeof(floatX)) % 16 == 0;
}

// one problem more (an empty one is left out); 0 if its operands are not aligned
static int matmul_group_add(MatmulGroup *G, int transa, int transb, int m, int n, int k, const void *a, int lda,
                            const void *b, int ldb, void *c, int ldc, float beta) {
    if (m == 0 || n == 0 || k == 0) { return 1; }
    if (!matmul_grouped_aligned(a, lda) || !matmul_grouped_aligned(b, ldb) || !matmul_grouped_aligned(c, ldc)) {
        return 0;
    }
    int i = G->g++;
    G->ta[i] = transa ? CUBLAS_OP_T : CUBLAS_OP_N; G->tb[i] = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    G->m[i] = m; G->n[i] = n; G->k[i] = k; G->size[i] = 1;
    G->lda[i] = lda; G->ldb[i] = ldb; G->ldc[i] = ldc; G->alpha[i] = 1.0f; G->beta[i] = beta;
    G->p[i] = a; G->p[MATMUL_GROUPED_MAX + i] = b; G->p[2 * MATMUL_GROUPED_MAX + i] = c;
    return 1;
}

// the group's problems in one cuBLAS call (fp32 accumulation, floatX operands)
static void matmul_group_run(MatmulGroup *G) {
    int g = G->g;
    if (g == 0) { return; }
    cublasHandle_t h = matmul_grouped_handle();
    const void **dp = (const void **)cublaslt_workspace, **b = dp + MATMUL_GROUPED_MAX, **c = b + MATMUL_GROUPED_MAX;
    copy_to_device_async(dp, G->p, sizeof(G->p));   // (pageable: staged before the call returns)
    cublasCheck(cublasGemmGroupedBatchedEx(h, G->ta, G->tb, G->m, G->n, G->k, G->alpha, dp, CUBLAS_FLOATX, G->lda,
                                           b, CUBLAS_FLOATX, G->ldb, G->beta, (void *const *)c, CUBLAS_FLOATX, G->ldc,
                                           g, G->size, CUBLAS_COMPUTE_32F));
}

// out (R, OC) = the rows @ their layer's weight^T: one grouped call; 0 (nothing queued) where it cannot
static int matmul_forward_grouped_cuda(floatX *out, const floatX *inp, const floatX *weight, const size_t *off,
                                       int IC, int OC, int count) {
    MatmulGroup *G = &matmul_group;
    G->g = 0;
    for (int i = 0; i < count; i++) {   // (as matmul_forward_cuda: m = OC, n = rows, k = IC)
        if (!matmul_group_add(G, 1, 0, OC, (int)(off[i + 1] - off[i]), IC, weight + (size_t)i * OC * IC, IC,
                              inp + off[i] * IC, IC, out + off[i] * OC, OC, 0.0f)) {
            return 0;
        }
    }
    matmul_group_run(G);
    return 1;
}

// dinp (R, IC) = each block's dout @ its weight (written), or dweight (count, OC, IC) += dout^T inp per layer
// (dinp NULL): one grouped call; 0 (nothing queued) where it cannot
static int matmul_backward_grouped_cuda(floatX *dinp, floatX *dweight, const floatX *dout, const floatX *inp,
                                        const floatX *weight, const size_t *off, int IC, int OC, int count) {
    MatmulGroup *G = &matmul_group;
    G->g = 0;
    for (int i = 0; i < count; i++) {   // (as matmul_backward_cuda's two products)
        int n = (int)(off[i + 1] - off[i]), ok;
        if (dinp != NULL) {
            ok = matmul_group_add(G, 0, 0, IC, n, OC, weight + (size_t)i * OC * IC, IC, dout + off[i] * OC, OC,
                                  dinp + off[i] * IC, IC, 0.0f);
        } else {
            ok = matmul_group_add(G, 0, 1, IC, OC, n, inp + off[i] * IC, IC, dout + off[i] * OC, OC,
                                  dweight + (size_t)i * OC * IC, IC, 1.0f);
        }
        if (!ok) { return 0; }
    }
    matmul_group_run(G);
    return 1;
}
#endif

// out (R, OC): block i = its rows of inp @ weight_i^T (written)
static void matmul_forward_grouped(floatX *out, const floatX *inp, const floatX *weight, const int *rows, int IC,
                                   int OC, int count) {
    size_t off[MATMUL_GROUPED_MAX + 1];
    matmul_group_offsets(off, rows, count);
#ifdef MATMUL_GROUPED
    if (matmul_grouped_enabled && matmul_forward_grouped_cuda(out, inp, weight, off, IC, OC, count)) { return; }
#elif !defined(USE_CUDA)
    #pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int i = 0; i < count; i++) {
        if (rows[i] == 0) { continue; }
        matmul_forward(out + off[i] * OC, inp + off[i] * IC, weight + (size_t)i * OC * IC, NULL, rows[i], IC, OC);
    }
}

// dinp (R, IC) (written; NULL: skipped) and dweight (count, OC, IC) (added to; NULL: skipped), as matmul_backward
// for each block (weight: NULL without dinp)
static void matmul_backward_grouped(floatX *dinp, floatX *dweight, const floatX *dout, const floatX *inp,
                                    const floatX *weight, const int *rows, int IC, int OC, int count) {
    size_t off[MATMUL_GROUPED_MAX + 1];
    matmul_group_offsets(off, rows, count);
#ifdef MATMUL_GROUPED
    if (matmul_grouped_enabled) {
        if (dinp != NULL && matmul_backward_grouped_cuda(dinp, NULL, dout, inp, weight, off, IC, OC, count)) {
            dinp = NULL;
        }
        if (dweight != NULL && matmul_backward_grouped_cuda(NULL, dweight, dout, inp, weight, off, IC, OC, count)) {
            dweight = NULL;
        }
        if (dinp == NULL && dweight == NULL) { return; }
    }
#elif !defined(USE_CUDA)
    #pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int i = 0; i < count; i++) {
        if (rows[i] == 0) { continue; }
        matmul_backward(dinp ? dinp + off[i] * IC : NULL, dweight ? dweight + (size_t)i * OC * IC : NULL, NULL,
                        dout + off[i] * OC, inp + off[i] * IC, weight ? weight + (size_t)i * OC * IC : NULL, rows[i],
                        IC, OC);
    }
}

#endif
