// Causal multi-head self-attention on the local heads, without storing the (B, NH, T, T)
// attention matrix: forward keeps only the log-sum-exp of each score row, backward recomputes
// the probabilities from it (the FlashAttention recipe, written as plain loops).
// qkv (B, T, 3C) holds [q | k | v], head h in channels h*hs .. (h+1)*hs of each; C = NH * hs.
#ifndef LLMC_ATTENTION_H
#define LLMC_ATTENTION_H

#include "backend.h"
#include "alloc.h"
#include "matmul.h"            // (matmul_setup: the cuBLASLt workspace the attention GEMMs share)
#include "flash_attention.h"
#include "cudnn_attention.h"       // (--attention cudnn: a build with USE_CUDNN=1)

// The CUDA build's attention paths (--attention): cuBLAS, the default (tensor-core GEMMs through an
// (NH, T, T) workspace), flash (flash_attention.h: tensor cores, no (T, T) anywhere; bf16 builds, head
// size 64 or 128, else cuBLAS), tiled (fp32 CUDA cores; the harness's third). The CPU build runs the
// loops below. Build-independent, so that a memory plan counts what the GPU allocates.
#define ATT_TILED 0
#define ATT_CUBLAS 1
#define ATT_FLASH 2
#define ATT_CUDNN 3
static int attention_path = ATT_CUBLAS;
static int attention_flash_applies(int hs, size_t floatx) { return floatx == 2 && (hs == 64 || hs == 128); }
static int attention_cudnn_applies(int hs, size_t floatx) { return floatx == 2 && hs % 8 == 0 && hs <= 128; }

// The cuBLAS path's workspace for one batch index (att_cublas_setup below): S and dP in fp32, P and dS
// in floatX, (NH, T, T) each, every region 256-byte aligned.
static size_t attention_cublas_workspace_bytes(int T, int NH, size_t floatx) {
    size_t n = (size_t)NH * T * T;
    return 2 * ((n * 4 + 255) / 256 * 256) + 2 * ((n * floatx + 255) / 256 * 256);
}
// ... what path `path` allocates: flash (where it applies) its backward's D (B, NH, T), cuDNN its workspace
static size_t attention_workspace_bytes(int path, int B, int T, int NH, int hs, size_t floatx) {
    if (path == ATT_FLASH && attention_flash_applies(hs, floatx)) { return flash_workspace_bytes(B, T, NH); }
    if (path == ATT_CUDNN && attention_cudnn_applies(hs, floatx)) { return cudnn_workspace_bytes(B, T, NH * hs, NH); }
    return attention_cublas_workspace_bytes(T, NH, floatx);
}

// qkv (B, T, 3C) -> out (B, T, C), lse (B, NH, T)
static void attention_forward_cpu(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float *p = (float *)malloc_check(sizeof(float) * T);   // one score row
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int t = 0; t < T; t++) {
                    const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                    float maxv = -INFINITY;
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                        float s = 0.0f;
                        for (int i = 0; i < hs; i++) { s += q[i] * k[i]; }
                        s *= scale;
                        p[t2] = s;
                        if (s > maxv) { maxv = s; }
                    }
                    float sum = 0.0f;
                    for (int t2 = 0; t2 <= t; t2++) { p[t2] = expf(p[t2] - maxv); sum += p[t2]; }
                    float inv = 1.0f / sum;
                    float *o = out + ((size_t)b * T + t) * C + h * hs;
                    for (int i = 0; i < hs; i++) { o[i] = 0.0f; }
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float *v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                        float w = p[t2] * inv;
                        for (int i = 0; i < hs; i++) { o[i] += w * v[i]; }
                    }
                    lse[((size_t)b * NH + h) * T + t] = maxv + logf(sum);
                }
            }
        }
        free(p);
    }
}

// dout (B, T, C) -> dqkv (B, T, 3C) (written). p = exp(s - lse); ds = p * (dout.v - dout.out).
static void attention_backward_cpu(float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {     // this (b, h) owns its slices of dq, dk, dv
                float *d = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                for (int i = 0; i < hs; i++) { d[i] = 0.0f; d[C + i] = 0.0f; d[2 * C + i] = 0.0f; }
            }
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                const float *dy = dout + ((size_t)b * T + t) * C + h * hs;
                const float *y = out + ((size_t)b * T + t) * C + h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float l = lse[((size_t)b * NH + h) * T + t];
                float D = 0.0f;
                for (int i = 0; i < hs; i++) { D += dy[i] * y[i]; }
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    const float *v = k + C;
                    float *dk = dqkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    float *dv = dk + C;
                    float s = 0.0f, dp = 0.0f;
                    for (int i = 0; i < hs; i++) { s += q[i] * k[i]; dp += dy[i] * v[i]; }
                    float p = expf(s * scale - l);
                    float ds = p * (dp - D) * scale;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                        dv[i] += p * dy[i];
                    }
                }
            }
        }
    }
}

// ---- the CPU build's attention: the loops above, through BLAS ---------------------------------------
// The same math the FlashAttention way (the formulation of the CUDA flash kernels and of the ring's
// blocks): per (batch, head), a panel of query rows walks the key tiles it can see; the scores
// S = scale Q K^T and the products with P (forward) or P and dS (backward) are sgemm calls on
// (panel, tile) blocks; the softmax is online (running max m and sum l per row, the accumulator
// rescaled by exp(m_old - m_new) when m grows); the backward recomputes P from the lse. Memory per
// thread: two (panel, tile) score blocks and a (panel, hs) accumulator, whatever T (never (T, T)).
// Threads: an OpenMP loop over (batch, head[, panel]) holds them and every sgemm inside it runs on the
// calling thread (the OpenMP OpenBLAS does not nest): many small independent GEMMs, no fork per call,
// no barrier. Where there are fewer (batch, head) pairs than threads the backward's loop runs on one
// thread (an inactive region) and each sgemm takes all of them.
// The tiles are variables so that test_gpt --check-attention can shrink them to reach every edge.
static int att_panel_rows = 64;    // query rows per panel
static int att_key_tile = 256;     // keys per tile

static int att_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// How many of a tile's nk keys query row i sees: causal, its first i + diag + 1 (diag: the row's
// position minus the tile's first key's); a caller without a mask passes diag >= nk.
static inline int att_visible(int i, int diag, int nk) {
    int n = i + diag + 1;
    return n < 0 ? 0 : (n > nk ? nk : n);
}

// One head's slices: row r of Q at q + r * ldq (hs floats), of K and V at k, v + r * ldkv; of the
// output gradient at dout + r * ldo (backward only).
typedef struct { const float *q, *k, *v, *dout; int ldq, ldkv, ldo, hs; float scale; } AttHead;
// ... and the gradients added to: dq at dq + r * lddq, dk and dv at dk, dv + r * lddkv
typedef struct { float *dq, *dk, *dv; int lddq, lddkv; } AttGrad;

// Row-major c (m, n; ldc) = alpha op(a) op(b) + beta c, op(x) = x^T where tx: OpenBLAS's sgemm
static void att_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                     int ldb, float beta, float *c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
                b, ldb, beta, c, ldc);
}

// Forward, one score tile, row by row: s (nq, nk) scaled scores, row i seeing att_visible(i, diag, nk)
// keys; m, l (nq) the running max and sum of exp; o (nq, hs) the unnormalised output so far.
// s becomes p = exp(s - m_new) (0 where hidden); o and l shrink by exp(m_old - m_new) where m grew.
static void att_online_softmax(float *s, float *m, float *l, float *o, int nq, int nk, int hs, int diag) {
    for (int i = 0; i < nq; i++) {
        float *si = s + (size_t)i * nk, mx = m[i], sum = 0.0f;
        int nv = att_visible(i, diag, nk);
        #pragma omp simd reduction(max : mx)
        for (int j = 0; j < nv; j++) { mx = si[j] > mx ? si[j] : mx; }
        #pragma omp simd reduction(+ : sum)
        for (int j = 0; j < nv; j++) { si[j] = exp_poly(si[j] - mx); sum += si[j]; }
        for (int j = nv; j < nk; j++) { si[j] = 0.0f; }
        if (mx != m[i]) {
            float corr = expf(m[i] - mx);   // 0 before the first key (m = -inf)
            l[i] *= corr;
            for (int d = 0; d < hs; d++) { o[(size_t)i * hs + d] *= corr; }
        }
        l[i] += sum;
        m[i] = mx;
    }
}

// One thread's forward panel: the unnormalised output o (att_panel_rows, hs), the running max m and sum l
// (att_panel_rows), and a scratch score tile s (att_panel_rows, att_key_tile).
typedef struct { float *o, *m, *l, *s; } AttPanel;
static AttPanel att_panel_alloc(int hs) {
    int QT = att_panel_rows;
    AttPanel w = {(float *)malloc_check(sizeof(float) * QT * hs), (float *)malloc_check(sizeof(float) * 2 * QT), NULL,
                  (float *)malloc_check(sizeof(float) * QT * att_key_tile)};
    w.l = w.m + QT;
    return w;
}
static void att_panel_free(AttPanel *w) { free(w->o); free(w->m); free(w->s); }

// Task r of B * NH * np (np panels of QT rows over n query rows): its batch, head, first row and rows,
// the longest panels (the last rows) first.
static void att_panel_task(int r, int NH, int np, int QT, int n, int *b, int *h, int *t0, int *nq) {
    *b = r / (NH * np);
    *h = r / np % NH;
    *t0 = (np - 1 - r % np) * QT;
    *nq = n - *t0 < QT ? n - *t0 : QT;
}

// Forward of a panel of nq query rows (from a.q) over keys 0 .. nk-1 (from a.k, a.v), row i seeing the
// keys j <= i + diag: w->o (nq, hs), w->m, w->l (nq) from scratch.
static void att_panel_forward(AttPanel *w, AttHead a, int nq, int nk, int diag) {
    float *o = w->o, *m = w->m, *l = w->l, *s = w->s;
    for (int i = 0; i < nq; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
    for (int i = 0; i < nq * a.hs; i++) { o[i] = 0.0f; }
    int kend = att_visible(nq - 1, diag, nk);   // the keys the panel's last row sees
    for (int k0 = 0; k0 < kend; k0 += att_key_tile) {
        int nkt = kend - k0 < att_key_tile ? kend - k0 : att_key_tile;
        const float *k = a.k + (size_t)k0 * a.ldkv, *v = a.v + (size_t)k0 * a.ldkv;
        att_gemm(0, 1, nq, nkt, a.hs, a.scale, a.q, a.ldq, k, a.ldkv, 0.0f, s, nkt);   // s (nq, nkt) = scale q k^T
        att_online_softmax(s, m, l, o, nq, nkt, a.hs, diag - k0);
        att_gemm(0, 0, nq, a.hs, nkt, 1.0f, s, nkt, v, a.ldkv, 1.0f, o, a.hs);          // o (nq, hs) += p v
    }
}

// Backward, one tile: s (nq, nk) scaled scores, dp (nq, nk) = dout v^T; lse, D = dout . out (nq).
// s becomes p = exp(s - lse), dp becomes ds = p (dp - D) scale (both 0 where hidden).
static void att_softmax_backward(float *s, float *dp, const float *lse, const float *D, int nq, int nk, int diag,
                                 float scale) {
    for (int i = 0; i < nq; i++) {
        float *si = s + (size_t)i * nk, *dpi = dp + (size_t)i * nk;
        int nv = att_visible(i, diag, nk);
        float L = lse[i], Di = D[i];
        #pragma omp simd
        for (int j = 0; j < nv; j++) {
            float p = exp_poly(si[j] - L);
            si[j] = p;
            dpi[j] = p * (dpi[j] - Di) * scale;
        }
        for (int j = nv; j < nk; j++) { si[j] = 0.0f; dpi[j] = 0.0f; }
    }
}

// Backward of a panel of nq query rows over keys 0 .. nk-1 (visible as in att_panel_forward), with the
// final lse and D (nq): g.dq (nq rows) += dS K;  g.dk, g.dv (nk rows) += dS^T Q, P^T dout.
// s, dp: scratch tiles of nq x att_key_tile.
static void att_panel_backward(AttGrad g, float *s, float *dp, AttHead a, const float *lse, const float *D, int nq,
                               int nk, int diag) {
    int kend = att_visible(nq - 1, diag, nk), hs = a.hs;
    for (int k0 = 0; k0 < kend; k0 += att_key_tile) {
        int nkt = kend - k0 < att_key_tile ? kend - k0 : att_key_tile;
        const float *k = a.k + (size_t)k0 * a.ldkv, *v = a.v + (size_t)k0 * a.ldkv;
        float *dk = g.dk + (size_t)k0 * g.lddkv, *dv = g.dv + (size_t)k0 * g.lddkv;
        att_gemm(0, 1, nq, nkt, hs, a.scale, a.q, a.ldq, k, a.ldkv, 0.0f, s, nkt);     // s (nq, nkt) = scale q k^T
        att_gemm(0, 1, nq, nkt, hs, 1.0f, a.dout, a.ldo, v, a.ldkv, 0.0f, dp, nkt);     // dp (nq, nkt) = dout v^T
        att_softmax_backward(s, dp, lse, D, nq, nkt, diag - k0, a.scale);
        att_gemm(1, 0, nkt, hs, nq, 1.0f, s, nkt, a.dout, a.ldo, 1.0f, dv, g.lddkv);  // dv (nkt, hs) += p^T dout
        att_gemm(1, 0, nkt, hs, nq, 1.0f, dp, nkt, a.q, a.ldq, 1.0f, dk, g.lddkv);     // dk (nkt, hs) += ds^T q
        att_gemm(0, 0, nq, hs, nkt, 1.0f, dp, nkt, k, a.ldkv, 1.0f, g.dq, g.lddq);     // dq (nq, hs) += ds k
    }
}

// D (nq) = dout . out per row, for rows at dout + r * ldo and out + r * ldy (hs each)
static void att_row_dots(float *D, const float *dout, int ldo, const float *out, int ldy, int nq, int hs) {
    for (int i = 0; i < nq; i++) {
        float d = 0.0f;
        for (int c = 0; c < hs; c++) { d += dout[(size_t)i * ldo + c] * out[(size_t)i * ldy + c]; }
        D[i] = d;
    }
}

// qkv (B, T, 3C) -> out (B, T, C), lse (B, NH, T): attention_forward_cpu through BLAS. One task per
// (batch, head, panel), the longest panels (the last rows) first.
static void attention_forward_blas(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH, QT = att_panel_rows, np = (T + QT - 1) / QT;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        AttPanel w = att_panel_alloc(hs);
        #pragma omp for schedule(dynamic, 1)
        for (int r = 0; r < B * NH * np; r++) {
            int b, h, t0, nq;
            att_panel_task(r, NH, np, QT, T, &b, &h, &t0, &nq);
            const float *q = qkv + (size_t)b * T * 3 * C + h * hs;   // this head's q at row 0; k, v at + C, 2C
            AttHead a = {q + (size_t)t0 * 3 * C, q + C, q + 2 * C, NULL, 3 * C, 3 * C, 0, hs, scale};
            att_panel_forward(&w, a, nq, T, t0);
            for (int i = 0; i < nq; i++) {
                float *y = out + ((size_t)b * T + t0 + i) * C + h * hs, inv = 1.0f / w.l[i];
                for (int c = 0; c < hs; c++) { y[c] = w.o[(size_t)i * hs + c] * inv; }
                lse[((size_t)b * NH + h) * T + t0 + i] = w.m[i] + logf(w.l[i]);
            }
        }
        att_panel_free(&w);
    }
}

// dout (B, T, C) -> dqkv (B, T, 3C) (written): attention_backward_cpu through BLAS. One task per
// (batch, head): it owns that head's dq, dk, dv.
static void attention_backward_blas(float *dqkv, const float *dout, const float *qkv, const float *out,
                                    const float *lse, int B, int T, int C, int NH) {
    int hs = C / NH, QT = att_panel_rows;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel if (B * NH >= att_threads())
    {
        float *s = (float *)malloc_check(sizeof(float) * 2 * QT * att_key_tile), *dp = s + QT * att_key_tile;
        float *D = (float *)malloc_check(sizeof(float) * QT);
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float *q = qkv + (size_t)b * T * 3 * C + h * hs;
                float *dq = dqkv + (size_t)b * T * 3 * C + h * hs;
                for (int t = 0; t < T; t++) {   // this head's dq, dk, dv
                    float *d = dq + (size_t)t * 3 * C;
                    for (int c = 0; c < hs; c++) { d[c] = 0.0f; d[C + c] = 0.0f; d[2 * C + c] = 0.0f; }
                }
                for (int t0 = 0; t0 < T; t0 += QT) {
                    int nq = T - t0 < QT ? T - t0 : QT;
                    const float *dy = dout + ((size_t)b * T + t0) * C + h * hs;
                    att_row_dots(D, dy, C, out + ((size_t)b * T + t0) * C + h * hs, C, nq, hs);
                    AttHead a = {q + (size_t)t0 * 3 * C, q + C, q + 2 * C, dy, 3 * C, 3 * C, C, hs, scale};
                    AttGrad g = {dq + (size_t)t0 * 3 * C, dq + C, dq + 2 * C, 3 * C, 3 * C};
                    att_panel_backward(g, s, dp, a, lse + ((size_t)b * NH + h) * T + t0, D, nq, T, t0);
                }
            }
        }
        free(s); free(D);
    }
}

#ifdef USE_CUDA
// Tiled causal attention in fp32 CUDA-core math (no tensor cores), never materialising (T, T).
// Work split: a "group" of TPQ = HS/16 consecutive threads owns one query (or one key) row; each
// thread of the group holds 16 of the HS dimensions, as 4 float4 chunks, chunk j of thread p
// covering dims 4*(j*TPQ + p) .. +3 (interleaved, so a group reads 4*TPQ consecutive float4 of
// a shared-memory row: conflict free). Dot products are finished with TPQ-wide xor shuffles.
// Every loop bound is uniform in the block (masking, not branching), so full-warp shuffles are safe.
#define ATT_THREADS 256
#define ATT_TILE 32          // keys (forward, dq) or queries (dk/dv) per shared-memory tile

__device__ __forceinline__ float4 att_load4(const floatX *p) {
    return make_float4((float)p[0], (float)p[1], (float)p[2], (float)p[3]);
}
__device__ __forceinline__ void att_store4(floatX *p, float4 v) {
    p[0] = (floatX)v.x; p[1] = (floatX)v.y; p[2] = (floatX)v.z; p[3] = (floatX)v.w;
}
__device__ __forceinline__ float att_dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
__device__ __forceinline__ void att_axpy4(float4 &y, float a, float4 x) {
    y.x += a * x.x;
    y.y += a * x.y;
    y.z += a * x.z;
    y.w += a * x.w;
}
// The keys and values of positions k0 .. k0 + ATT_TILE - 1 (zeros past T) into shared memory.
template <int H4>
__device__ __forceinline__ void att_load_kv_tile(float4 (*ks)[H4], float4 (*vs)[H4], const floatX *base, int k0, int T,
                                                 size_t C3, int C) {
    for (int i = threadIdx.x; i < ATT_TILE * H4; i += ATT_THREADS) {
        int r = i / H4, d4 = i % H4, tk = k0 + r;
        float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
        if (tk < T) {
            kv = att_load4(base + (size_t)tk * C3 + C + 4 * d4);
            vv = att_load4(base + (size_t)tk * C3 + 2 * C + 4 * d4);
        }
        ks[r][d4] = kv;
        vs[r][d4] = vv;
    }
}
template <int TPQ> __device__ __forceinline__ float att_group_sum(float v) {
    for (int off = TPQ / 2; off > 0; off >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, off); }
    return v;
}

// Forward. grid (ceil_div(T, QT), NH, B), block ATT_THREADS = QT queries x TPQ threads.
// qkv (B, T, 3C) -> out (B, T, C), lse (B, NH, T). Online softmax over key tiles of ATT_TILE.
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS)
attention_forward_kernel(floatX *out, float *lse, const floatX *qkv, int T, int C, int NH) {
    constexpr int TPQ = HS / 16, QT = ATT_THREADS / TPQ, H4 = HS / 4;
    __shared__ float4 ks[ATT_TILE][H4], vs[ATT_TILE][H4];
    int h = blockIdx.y, b = blockIdx.z;
    int q0 = (gridDim.x - 1 - blockIdx.x) * QT;            // the longest (latest) query tiles start first
    int part = threadIdx.x % TPQ;
    int t = q0 + threadIdx.x / TPQ;
    int tq = t < T ? t : T - 1;                             // rows past T compute garbage, never stored
    size_t C3 = 3 * (size_t)C;
    const floatX *base = qkv + (size_t)b * T * C3 + h * HS;  // q of (b, 0, h); k at +C, v at +2C
    const float scale = 1.0f / sqrtf((float)HS);
    float4 q[4], o[4];
    for (int j = 0; j < 4; j++) {
        q[j] = att_load4(base + (size_t)tq * C3 + 4 * (j * TPQ + part));
        o[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float m = -INFINITY, l = 0.0f;
    int kend = min(T, q0 + QT);
    for (int k0 = 0; k0 < kend; k0 += ATT_TILE) {
        __syncthreads();
        att_load_kv_tile<H4>(ks, vs, base, k0, T, C3, C);
        __syncthreads();
        float s[ATT_TILE];
        float tile_max = -INFINITY;
        #pragma unroll
        for (int kk = 0; kk < ATT_TILE; kk++) {
            float acc = 0.0f;
            #pragma unroll
            for (int j = 0; j < 4; j++) { acc += att_dot4(q[j], ks[kk][j * TPQ + part]); }
            acc = att_group_sum<TPQ>(acc) * scale;
            s[kk] = (k0 + kk <= t) ? acc : -INFINITY;       // causal (also hides keys >= T)
            tile_max = fmaxf(tile_max, s[kk]);
        }
        // m_new is finite: key 0 is in the first tile and visible to every query
        float m_new = fmaxf(m, tile_max);
        float corr = expf(m - m_new);
        l *= corr;
        for (int j = 0; j < 4; j++) { o[j].x *= corr; o[j].y *= corr; o[j].z *= corr; o[j].w *= corr; }
        #pragma unroll
        for (int kk = 0; kk < ATT_TILE; kk++) {
            float p = expf(s[kk] - m_new);
            l += p;
            #pragma unroll
            for (int j = 0; j < 4; j++) { att_axpy4(o[j], p, vs[kk][j * TPQ + part]); }
        }
        m = m_new;
    }
    if (t < T) {
        float inv = 1.0f / l;
        floatX *y = out + ((size_t)b * T + t) * C + h * HS;
        for (int j = 0; j < 4; j++) {
            att_store4(y + 4 * (j * TPQ + part), make_float4(o[j].x * inv, o[j].y * inv, o[j].z * inv, o[j].w * inv));
        }
        if (part == 0) { lse[((size_t)b * NH + h) * T + t] = m + logf(l); }
    }
}

// Backward 1/2: dk, dv. grid (ceil_div(T, KB), NH, B), block = KB keys x TPQ threads. Each group
// keeps its key's k, v in registers and walks the query tiles from its block's first key to T
// (queries in ascending order: deterministic), with D = dout.out recomputed per query tile.
//   p = exp(q.k scale - lse);  dv += p dout;  ds = p (dout.v - D) scale;  dk += ds q
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS)
attention_backward_dkdv_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                               const float *lse, int T, int C, int NH) {
    constexpr int TPQ = HS / 16, KB = ATT_THREADS / TPQ, H4 = HS / 4;
    __shared__ float4 qs[ATT_TILE][H4], dos[ATT_TILE][H4];
    __shared__ float lse_s[ATT_TILE], D_s[ATT_TILE];
    int h = blockIdx.y, b = blockIdx.z;
    int k_first = (gridDim.x - 1 - blockIdx.x) * KB;        // blocks with few queries to visit start last
    int part = threadIdx.x % TPQ;
    int key = k_first + threadIdx.x / TPQ;
    int tk = key < T ? key : T - 1;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    size_t C3 = 3 * (size_t)C;
    const floatX *base = qkv + (size_t)b * T * C3 + h * HS;
    const floatX *dout_b = dout + (size_t)b * T * C + h * HS;
    const floatX *out_b = out + (size_t)b * T * C + h * HS;
    const float *lse_b = lse + ((size_t)b * NH + h) * T;
    const float scale = 1.0f / sqrtf((float)HS);
    float4 k[4], v[4], dk[4], dv[4];
    for (int j = 0; j < 4; j++) {
        k[j] = att_load4(base + (size_t)tk * C3 + C + 4 * (j * TPQ + part));
        v[j] = att_load4(base + (size_t)tk * C3 + 2 * C + 4 * (j * TPQ + part));
        dk[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        dv[j] = dk[j];
    }
    for (int q0 = k_first; q0 < T; q0 += ATT_TILE) {
        __syncthreads();
        for (int i = threadIdx.x; i < ATT_TILE * H4; i += ATT_THREADS) {
            int r = i / H4, d4 = i % H4, t = q0 + r;
            float4 qv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), dv4 = qv;
            if (t < T) {
                qv = att_load4(base + (size_t)t * C3 + 4 * d4);
                dv4 = att_load4(dout_b + (size_t)t * C + 4 * d4);
            }
            qs[r][d4] = qv;
            dos[r][d4] = dv4;
        }
        for (int r = warp; r < ATT_TILE; r += ATT_THREADS / 32) {   // D = dout . out, one warp per query
            int t = q0 + r;
            float acc = 0.0f;
            if (t < T) {
                for (int d = lane; d < HS; d += 32) {
                    acc += (float)dout_b[(size_t)t * C + d] * (float)out_b[(size_t)t * C + d];
                }
            }
            acc = warp_reduce_sum(acc);
            if (lane == 0) { D_s[r] = acc; lse_s[r] = t < T ? lse_b[t] : 0.0f; }
        }
        __syncthreads();
        for (int qq = 0; qq < ATT_TILE; qq++) {
            int t = q0 + qq;
            float s = 0.0f, dp = 0.0f;
            float4 qv[4], dy[4];
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                qv[j] = qs[qq][j * TPQ + part];
                dy[j] = dos[qq][j * TPQ + part];
                s += att_dot4(k[j], qv[j]);
                dp += att_dot4(v[j], dy[j]);
            }
            s = att_group_sum<TPQ>(s);
            dp = att_group_sum<TPQ>(dp);
            float p = (t >= key && t < T) ? expf(s * scale - lse_s[qq]) : 0.0f;
            float ds = p * (dp - D_s[qq]) * scale;
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                att_axpy4(dv[j], p, dy[j]);
                att_axpy4(dk[j], ds, qv[j]);
            }
        }
    }
    if (key < T) {
        floatX *d = dqkv + ((size_t)b * T + key) * C3 + h * HS;
        for (int j = 0; j < 4; j++) {
            att_store4(d + C + 4 * (j * TPQ + part), dk[j]);
            att_store4(d + 2 * C + 4 * (j * TPQ + part), dv[j]);
        }
    }
}

// Backward 2/2: dq. grid (ceil_div(T, QT), NH, B), block = QT queries x TPQ threads; key tiles in
// ascending order.   ds = p (dout.v - D) scale;  dq += ds k
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS)
attention_backward_dq_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out, const float *lse,
                             int T, int C, int NH) {
    constexpr int TPQ = HS / 16, QT = ATT_THREADS / TPQ, H4 = HS / 4;
    __shared__ float4 ks[ATT_TILE][H4], vs[ATT_TILE][H4];
    int h = blockIdx.y, b = blockIdx.z;
    int q0 = (gridDim.x - 1 - blockIdx.x) * QT;
    int part = threadIdx.x % TPQ;
    int t = q0 + threadIdx.x / TPQ;
    int tq = t < T ? t : T - 1;
    size_t C3 = 3 * (size_t)C;
    const floatX *base = qkv + (size_t)b * T * C3 + h * HS;
    const float scale = 1.0f / sqrtf((float)HS);
    float4 q[4], dy[4], dq[4];
    float D = 0.0f;
    for (int j = 0; j < 4; j++) {
        size_t off = 4 * (j * TPQ + part);
        q[j] = att_load4(base + (size_t)tq * C3 + off);
        dy[j] = att_load4(dout + ((size_t)b * T + tq) * C + h * HS + off);
        D += att_dot4(dy[j], att_load4(out + ((size_t)b * T + tq) * C + h * HS + off));
        dq[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    D = att_group_sum<TPQ>(D);
    float l = lse[((size_t)b * NH + h) * T + tq];
    int kend = min(T, q0 + QT);
    for (int k0 = 0; k0 < kend; k0 += ATT_TILE) {
        __syncthreads();
        att_load_kv_tile<H4>(ks, vs, base, k0, T, C3, C);
        __syncthreads();
        #pragma unroll 4
        for (int kk = 0; kk < ATT_TILE; kk++) {
            float s = 0.0f, dp = 0.0f;
            float4 kv[4];
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                kv[j] = ks[kk][j * TPQ + part];
                s += att_dot4(q[j], kv[j]);
                dp += att_dot4(dy[j], vs[kk][j * TPQ + part]);
            }
            s = att_group_sum<TPQ>(s);
            dp = att_group_sum<TPQ>(dp);
            float p = (k0 + kk <= t) ? expf(s * scale - l) : 0.0f;
            float ds = p * (dp - D) * scale;
            #pragma unroll
            for (int j = 0; j < 4; j++) { att_axpy4(dq[j], ds, kv[j]); }
        }
    }
    if (t < T) {
        floatX *d = dqkv + ((size_t)b * T + t) * C3 + h * HS;
        for (int j = 0; j < 4; j++) { att_store4(d + 4 * (j * TPQ + part), dq[j]); }
    }
}

static int attention_head_size(int C, int NH) {
    if (NH <= 0 || C % NH != 0) { fail("attention: C=%d is not a multiple of NH=%d", C, NH); }
    int hs = C / NH;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128) {
        fail("attention: head size %d is not supported by the CUDA kernels (16, 32, 64 or 128)", hs);
    }
    return hs;
}

template <int HS>
static void attention_forward_launch(floatX *out, float *lse, const floatX *qkv, int B, int T, int C, int NH) {
    constexpr int QT = ATT_THREADS / (HS / 16);
    dim3 grid(ceil_div(T, QT), NH, B);
    attention_forward_kernel<HS><<<grid, ATT_THREADS, 0, main_stream>>>(out, lse, qkv, T, C, NH);
    cudaCheckLaunch();
}

template <int HS>
static void attention_backward_launch(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                                      const float *lse, int B, int T, int C, int NH) {
    constexpr int R = ATT_THREADS / (HS / 16);   // keys (dk/dv) or queries (dq) per block
    dim3 grid(ceil_div(T, R), NH, B);
    attention_backward_dkdv_kernel<HS><<<grid, ATT_THREADS, 0, main_stream>>>(dqkv, dout, qkv, out, lse, T, C, NH);
    cudaCheckLaunch();
    attention_backward_dq_kernel<HS><<<grid, ATT_THREADS, 0, main_stream>>>(dqkv, dout, qkv, out, lse, T, C, NH);
    cudaCheckLaunch();
}

// ---- cuBLAS path (the default) ----------------------------------------------------------------
// Tensor cores through cuBLAS: for one batch index b at a time (host loop), the (NH, T, T) score
// matrices of all heads live in a workspace (never kept across layers or batch indices):
//   forward:  S = Q K^T (GEMM, fp32 out) -> kernel: causal mask, scale, softmax -> P (floatX), lse
//             Y = P V (GEMM) into out
//   backward: S = Q K^T, dP = dY V^T (GEMMs, fp32 out) -> kernel: D = dY.Y, P = exp(S scale - lse),
//             dS = P (dP - D) scale (both floatX, zero above the diagonal)
//             dV = P^T dY, dQ = dS K, dK = dS^T Q (GEMMs, written into dqkv with beta = 0)
// The GEMMs compute the full T x T (the masked half comes out of the kernels as exact zeros).

#if defined(ENABLE_FP32)
#define ATT_CUDA_X CUDA_R_32F      // the cudaDataType of floatX
#else
#define ATT_CUDA_X CUDA_R_16BF
#endif
#define ATT_ROWS_PER_BLOCK 8        // row kernels: one warp per (head, query) row, 8 warps per block

static cublasHandle_t att_cublas_handle = NULL;
// workspace for one batch index: n = NH*T*T elements per region, each region 256-byte aligned
//   S fp32 | dP fp32 | P floatX | dS floatX      (the forward uses S and P only)
static void *att_ws = NULL;
static size_t att_ws_bytes = 0;
static float *att_ws_S, *att_ws_dP;
static floatX *att_ws_P, *att_ws_dS;

static size_t att_round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

static void att_cublas_setup(int T, int NH) {
    if (att_cublas_handle == NULL) {
        cublasCheck(cublasCreate(&att_cublas_handle));
        cublasCheck(cublasSetStream(att_cublas_handle, main_stream));   // resets the workspace: set it after
        // split-K partial sums of the k = T GEMMs in fp32, never in floatX
        cublasCheck(cublasSetMathMode(att_cublas_handle,
                                      (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
        // cuBLAS's GEMM workspace: the cuBLASLt one (same stream, so never used concurrently)
        matmul_setup();
        cublasCheck(cublasSetWorkspace(att_cublas_handle, cublaslt_workspace, cublaslt_workspace_size));
    }
    size_t n = (size_t)NH * T * T;
    size_t f32 = att_round256(n * sizeof(float)), fx = att_round256(n * sizeof(floatX));
    size_t need = attention_cublas_workspace_bytes(T, NH, sizeof(floatX));   // = 2 f32 + 2 fx
    if (need > att_ws_bytes) {   // (set-up: attention_setup; a longer T later fails in the allocator)
        if (att_ws != NULL) { mem_free(att_ws); }
        att_ws = mem_alloc(need, MEM_WORKSPACE);
        att_ws_bytes = need;
    }
    char *base = (char *)att_ws;
    att_ws_S = (float *)base;
    att_ws_dP = (float *)(base + f32);
    att_ws_P = (floatX *)(base + 2 * f32);
    att_ws_dS = (floatX *)(base + 2 * f32 + fx);
}

// Column-major (cuBLAS) strided-batched GEMM, fp32 accumulation, alpha = 1, beta = 0 (C is written,
// never read): for i < batch, C_i (m, n; ldc) = op(A_i) (m, k) op(B_i) (k, n), X_i = X + i * strideX.
static void att_gemm(cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k,
                     const void *A, cudaDataType ta, int lda, long long sa,
                     const void *B, cudaDataType tb, int ldb, long long sb,
                     void *Cm, cudaDataType tc, int ldc, long long sc, int batch) {
    const float alpha = 1.0f, beta = 0.0f;
    cublasCheck(cublasGemmStridedBatchedEx(att_cublas_handle, opa, opb, m, n, k, &alpha, A, ta, lda, sa, B, tb, ldb, sb,
                                           &beta, Cm, tc, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Row-major (T, T) matrices of one head, stored with row stride T, are, seen column-major, their
// transposes: buffer X with X[t][t2] at t*T + t2 is the column-major (T, T) matrix Xc, Xc(t2, t) = X[t][t2].
// A head's Q (T, hs) rows at q + t*3C (row stride 3C) is the column-major (hs, T) Qc, ld 3C; heads are
// hs apart (batch stride hs). Likewise K, V (ld 3C) and dY, Y (ld C).
//
// S[t][t2] = sum_i Q[t][i] K[t2][i]   ->  Sc (T, T) = Kc^T Qc:      A = K (op T, lda 3C), B = Q (op N, ldb 3C),
//                                          m = n = T, k = hs; C = S (ldc T, stride T*T)
// dP[t][t2] = sum_i dY[t][i] V[t2][i] ->  dPc = Vc^T dYc:           A = V (op T, lda 3C), B = dY (op N, ldb C)
static void att_gemm_scores(float *S, const floatX *kv, const floatX *qdy, int ld_qdy, int T, int C, int NH) {
    int hs = C / NH;
    att_gemm(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, kv, ATT_CUDA_X, 3 * C, hs, qdy, ATT_CUDA_X, ld_qdy, hs,
             S, CUDA_R_32F, T, (long long)T * T, NH);
}

// P (floatX), lse from S: causal mask, scale, softmax. grid (ceil_div(T, ATT_ROWS_PER_BLOCK), NH),
// block 32 * ATT_ROWS_PER_BLOCK; warp w of block x owns query t = x * ATT_ROWS_PER_BLOCK + w of head
// blockIdx.y. S, P: (NH, T, T) of one batch index; lse: (NH, T) of that batch index.
// lse = max + log(sum_{t2 <= t} exp(s scale - max)), P = exp(s scale - max) / sum, 0 for t2 > t.
__global__ void __launch_bounds__(32 * ATT_ROWS_PER_BLOCK)
attention_softmax_forward_kernel(floatX *P, float *lse, const float *S, int T, float scale) {
    int lane = threadIdx.x % 32, h = blockIdx.y;
    int t = blockIdx.x * ATT_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (t >= T) { return; }                       // the whole warp: its shuffles stay full
    size_t row = ((size_t)h * T + t) * T;
    const float *s = S + row;
    floatX *p = P + row;
    // per lane: online max and sum of exp over its keys t2 = lane, lane + 32, ... <= t
    float m = -INFINITY, l = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        float x = s[t2] * scale;
        if (x > m) { l = l * expf(m - x) + 1.0f; m = x; } else { l += expf(x - m); }
    }
    float mx = warp_reduce_max(m);                // finite: key 0 is always visible
    l = m == -INFINITY ? 0.0f : l * expf(m - mx);  // lanes without a key (t < 31) add nothing
    float sum = warp_reduce_sum(l);
    float inv = 1.0f / sum;
    for (int t2 = lane; t2 < T; t2 += 32) {
        p[t2] = (floatX)(t2 <= t ? expf(s[t2] * scale - mx) * inv : 0.0f);
    }
    if (lane == 0) { lse[(size_t)h * T + t] = mx + logf(sum); }
}

// P, dS (floatX) from S, dP (fp32), lse, and D = dout . out per row, same grid/block/rows as above.
// dout, out: (T, C) of this batch index (head h at column h*hs). 0 above the diagonal.
//   p = exp(s scale - lse);  ds = p (dp - D) scale
__global__ void __launch_bounds__(32 * ATT_ROWS_PER_BLOCK)
attention_softmax_backward_kernel(floatX *P, floatX *dS, const float *S, const float *dP, const float *lse,
                                  const floatX *dout, const floatX *out, int T, int C, int hs, float scale) {
    int lane = threadIdx.x % 32, h = blockIdx.y;
    int t = blockIdx.x * ATT_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (t >= T) { return; }
    const floatX *dy = dout + (size_t)t * C + h * hs, *y = out + (size_t)t * C + h * hs;
    float D = 0.0f;
    for (int i = lane; i < hs; i += 32) { D += (float)dy[i] * (float)y[i]; }
    D = warp_reduce_sum(D);
    float l = lse[(size_t)h * T + t];
    size_t row = ((size_t)h * T + t) * T;
    for (int t2 = lane; t2 < T; t2 += 32) {
        float p = 0.0f, ds = 0.0f;
        if (t2 <= t) {
            p = expf(S[row + t2] * scale - l);
            ds = p * (dP[row + t2] - D) * scale;
        }
        P[row + t2] = (floatX)p;
        dS[row + t2] = (floatX)ds;
    }
}

// Y[t][i] = sum_t2 P[t][t2] V[t2][i]  ->  Yc (hs, T) = Vc Pc:        A = V (op N, lda 3C), B = P (op N, ldb T),
//                                          m = hs, n = T, k = T; C = out + h*hs (ldc C, stride hs)
static void attention_forward_cublas(floatX *out, float *lse, const floatX *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    att_cublas_setup(T, NH);
    size_t C3 = 3 * (size_t)C;
    long long TT = (long long)T * T;
    dim3 grid(ceil_div(T, ATT_ROWS_PER_BLOCK), NH);
    for (int b = 0; b < B; b++) {
        const floatX *q = qkv + (size_t)b * T * C3, *k = q + C, *v = q + 2 * C;
        att_gemm_scores(att_ws_S, k, q, 3 * C, T, C, NH);
        attention_softmax_forward_kernel<<<grid, 32 * ATT_ROWS_PER_BLOCK, 0, main_stream>>>(
            att_ws_P, lse + (size_t)b * NH * T, att_ws_S, T, scale);
        cudaCheckLaunch();
        att_gemm(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, v, ATT_CUDA_X, 3 * C, hs, att_ws_P, ATT_CUDA_X, T, TT,
                 out + (size_t)b * T * C, ATT_CUDA_X, C, hs, NH);
    }
}

// dV[t2][i] = sum_t P[t][t2] dY[t][i]   ->  dVc (hs, T) = dYc Pc^T:  A = dY (op N, lda C), B = P (op T, ldb T)
// dQ[t][i]  = sum_t2 dS[t][t2] K[t2][i] ->  dQc (hs, T) = Kc dSc:    A = K (op N, lda 3C), B = dS (op N, ldb T)
// dK[t2][i] = sum_t dS[t][t2] Q[t][i]   ->  dKc (hs, T) = Qc dSc^T:  A = Q (op N, lda 3C), B = dS (op T, ldb T)
// all m = hs, n = T, k = T; C = dqkv q/k/v part + h*hs (ldc 3C, stride hs)
static void attention_backward_cublas(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                                      const float *lse, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    att_cublas_setup(T, NH);
    size_t C3 = 3 * (size_t)C;
    long long TT = (long long)T * T;
    dim3 grid(ceil_div(T, ATT_ROWS_PER_BLOCK), NH);
    for (int b = 0; b < B; b++) {
        const floatX *q = qkv + (size_t)b * T * C3, *k = q + C, *v = q + 2 * C;
        const floatX *dy = dout + (size_t)b * T * C, *y = out + (size_t)b * T * C;
        floatX *dq = dqkv + (size_t)b * T * C3, *dk = dq + C, *dv = dq + 2 * C;
        att_gemm_scores(att_ws_S, k, q, 3 * C, T, C, NH);
        att_gemm_scores(att_ws_dP, v, dy, C, T, C, NH);
        attention_softmax_backward_kernel<<<grid, 32 * ATT_ROWS_PER_BLOCK, 0, main_stream>>>(
            att_ws_P, att_ws_dS, att_ws_S, att_ws_dP, lse + (size_t)b * NH * T, dy, y, T, C, hs, scale);
        cudaCheckLaunch();
        att_gemm(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, dy, ATT_CUDA_X, C, hs, att_ws_P, ATT_CUDA_X, T, TT,
                 dv, ATT_CUDA_X, 3 * C, hs, NH);
        att_gemm(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, k, ATT_CUDA_X, 3 * C, hs, att_ws_dS, ATT_CUDA_X, T, TT,
                 dq, ATT_CUDA_X, 3 * C, hs, NH);
        att_gemm(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, q, ATT_CUDA_X, 3 * C, hs, att_ws_dS, ATT_CUDA_X, T, TT,
                 dk, ATT_CUDA_X, 3 * C, hs, NH);
    }
}
// ---- end of the cuBLAS path -------------------------------------------------------------------

// the path a call takes: attention_path, flash and cuDNN only where they apply
static int attention_path_for(int hs) {
    if (attention_path == ATT_FLASH && !attention_flash_applies(hs, sizeof(floatX))) { return ATT_CUBLAS; }
    if (attention_path == ATT_CUDNN && !attention_cudnn_applies(hs, sizeof(floatX))) { return ATT_CUBLAS; }
    return attention_path;
}

static void attention_forward_cuda(floatX *out, float *lse, const floatX *qkv, int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0) { return; }
    int hs = attention_head_size(C, NH), path = attention_path_for(hs);
#if !defined(ENABLE_FP32)
    if (path == ATT_FLASH) {
        if (hs == 64) {
            flash_forward_launch<64>(out, lse, qkv, B, T, C, NH);
        } else {
            flash_forward_launch<128>(out, lse, qkv, B, T, C, NH);
        }
        return;
    }
#endif
#if defined(USE_CUDNN) && !defined(ENABLE_FP32)
    if (path == ATT_CUDNN) { attention_forward_cudnn(out, lse, qkv, B, T, C, NH); return; }
#endif
    if (path == ATT_CUBLAS) { attention_forward_cublas(out, lse, qkv, B, T, C, NH); return; }
    switch (hs) {
        case 16: attention_forward_launch<16>(out, lse, qkv, B, T, C, NH); break;
        case 32: attention_forward_launch<32>(out, lse, qkv, B, T, C, NH); break;
        case 64: attention_forward_launch<64>(out, lse, qkv, B, T, C, NH); break;
        default: attention_forward_launch<128>(out, lse, qkv, B, T, C, NH); break;
    }
}

static void attention_backward_cuda(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                                    const float *lse, int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0) { return; }
    int hs = attention_head_size(C, NH), path = attention_path_for(hs);
#if !defined(ENABLE_FP32)
    if (path == ATT_FLASH) {
        if (hs == 64) { flash_backward_launch<64>(dqkv, dout, qkv, out, lse, B, T, C, NH); }
        else { flash_backward_launch<128>(dqkv, dout, qkv, out, lse, B, T, C, NH); }
        return;
    }
#endif
#if defined(USE_CUDNN) && !defined(ENABLE_FP32)
    if (path == ATT_CUDNN) { attention_backward_cudnn(dqkv, dout, qkv, out, lse, B, T, C, NH); return; }
#endif
    if (path == ATT_CUBLAS) { attention_backward_cublas(dqkv, dout, qkv, out, lse, B, T, C, NH); return; }
    switch (hs) {
        case 16: attention_backward_launch<16>(dqkv, dout, qkv, out, lse, B, T, C, NH); break;
        case 32: attention_backward_launch<32>(dqkv, dout, qkv, out, lse, B, T, C, NH); break;
        case 64: attention_backward_launch<64>(dqkv, dout, qkv, out, lse, B, T, C, NH); break;
        default: attention_backward_launch<128>(dqkv, dout, qkv, out, lse, B, T, C, NH); break;
    }
}
#endif

// Set-up: the workspace of the largest batch B x T the attention will see (the cuBLAS path's (NH, T, T)
// panels, flash's D (B, NH, T); the CPU needs none).
static void attention_setup(int B, int T, int C, int NH) {
#ifdef USE_CUDA
    int path = attention_path_for(attention_head_size(C, NH));
    if (path == ATT_CUBLAS) { att_cublas_setup(T, NH); }
#if !defined(ENABLE_FP32)
    if (path == ATT_FLASH) { flash_setup(B, T, NH); }
#endif
#if defined(USE_CUDNN) && !defined(ENABLE_FP32)
    if (path == ATT_CUDNN) { cudnn_attention_setup(B, T, C, NH); }
#endif
#else
    (void)B; (void)T; (void)C; (void)NH;
#endif
}

static void attention_forward(floatX *out, float *lse, const floatX *qkv, int B, int T, int C, int NH) {
#ifdef USE_CUDA
    attention_forward_cuda(out, lse, qkv, B, T, C, NH);
#else
    attention_forward_blas(out, lse, qkv, B, T, C, NH);
#endif
}

static void attention_backward(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                               const float *lse, int B, int T, int C, int NH) {
#ifdef USE_CUDA
    attention_backward_cuda(dqkv, dout, qkv, out, lse, B, T, C, NH);
#else
    attention_backward_blas(dqkv, dout, qkv, out, lse, B, T, C, NH);
#endif
}

#endif
