// The CPU build's attention: attention.h's loops (the specification) computed through BLAS, the FlashAttention
// way, and the pieces ring attention (context_parallel.h) computes its blocks with.
// Shapes as attention.h states them: qkv (B, T, (NH + 2KV) hs), out (B, T, NH hs), lse (B, NH, T).
#ifndef LLMC_ATTENTION_BLAS_H
#define LLMC_ATTENTION_BLAS_H

#include "backend.h"

// Zeroes what the task of kv head kh owns in T rows of dqkv (row width (NH + 2KV) hs): the dq of its G query
// heads kh G .. kh G + G - 1 (adjacent), its dk and dv.
static void att_zero_group(float *dqkv, int T, int NH, int KV, int hs, int kh) {
    size_t W = (size_t)(NH + 2 * KV) * hs;
    int G = NH / KV;
    for (int t = 0; t < T; t++) {
        float *d = dqkv + t * W;
        for (int c = 0; c < G * hs; c++) { d[kh * G * hs + c] = 0.0f; }
        for (int c = 0; c < hs; c++) { d[(NH + kh) * hs + c] = 0.0f; d[(NH + KV + kh) * hs + c] = 0.0f; }
    }
}

// ---- through BLAS ---------------------------------------------------------------------------------
// attention_forward_cpu / attention_backward_cpu's math the FlashAttention way (the formulation of the CUDA flash kernels and of the ring's
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

// The forward of one block (ring attention's, context_parallel.h; the whole sequence for one device): query rows
// q0 .. q0 + n - 1 of qkv over key rows k0 .. k0 + n - 1 of kv (row width ldkv, its kv heads' k then their v),
// row i of a panel at t0 seeing keys j <= t0 + i (causal) or all n. One task per (batch, query head, panel), the
// longest panels (the last rows) first. merge 0: out and lse written; 1: merged with the (out, lse) they hold.
static void att_block_forward(float *out, float *lse, const float *qkv, const float *kv, int ldkv, int B, int T,
                              int NH, int KV, int hs, int q0, int k0, int n, int causal, int merge) {
    int W = (NH + 2 * KV) * hs, C = NH * hs, G = NH / KV, QT = att_panel_rows, np = (n + QT - 1) / QT;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        AttPanel w = att_panel_alloc(hs);
        #pragma omp for schedule(dynamic, 1)
        for (int r = 0; r < B * NH * np; r++) {
            int b, h, t0, nq;
            att_panel_task(r, NH, np, QT, n, &b, &h, &t0, &nq);
            const float *k = kv + ((size_t)b * T + k0) * ldkv + (h / G) * hs;   // its kv head's k, v
            AttHead a = {qkv + ((size_t)b * T + q0 + t0) * W + h * hs, k, k + KV * hs, NULL, W, ldkv, 0, hs, scale};
            att_panel_forward(&w, a, nq, n, causal ? t0 : n);
            for (int i = 0; i < nq; i++) {
                float *y = out + ((size_t)b * T + q0 + t0 + i) * C + h * hs;
                float *lp = lse + ((size_t)b * NH + h) * T + q0 + t0 + i, lse2 = w.m[i] + logf(w.l[i]);
                if (merge) {   // (out1, lse1) with this block's (o / l, lse2)
                    float mx = *lp > lse2 ? *lp : lse2, l12 = mx + logf(expf(*lp - mx) + expf(lse2 - mx));
                    float w1 = expf(*lp - l12), w2 = expf(lse2 - l12) / w.l[i];
                    for (int c = 0; c < hs; c++) { y[c] = y[c] * w1 + w.o[(size_t)i * hs + c] * w2; }
                    *lp = l12;
                } else {
                    float inv = 1.0f / w.l[i];
                    for (int c = 0; c < hs; c++) { y[c] = w.o[(size_t)i * hs + c] * inv; }
                    *lp = lse2;
                }
            }
        }
        att_panel_free(&w);
    }
}

// qkv (B, T, (NH + 2KV) hs) -> out (B, T, NH hs), lse (B, NH, T): attention_forward_cpu through BLAS, one block
static void attention_forward_blas(float *out, float *lse, const float *qkv, int B, int T, int NH, int KV, int hs) {
    att_block_forward(out, lse, qkv, qkv + NH * hs, (NH + 2 * KV) * hs, B, T, NH, KV, hs, 0, 0, T, 1, 0);
}

// Backward of one query head's n rows over n keys, panel by panel (a, g at row 0; y: its out rows, ld ldy; lse:
// its rows'): causal, row i sees keys j <= i, else all n. s, dp: two scratch tiles of att_panel_rows x att_key_tile;
// D: att_panel_rows floats.
static void att_head_backward(AttGrad g, AttHead a, const float *y, int ldy, const float *lse, int n, int causal,
                              float *s, float *dp, float *D) {
    for (int t0 = 0; t0 < n; t0 += att_panel_rows) {
        int nq = n - t0 < att_panel_rows ? n - t0 : att_panel_rows;
        AttHead ap = a;
        AttGrad gp = g;
        ap.q += (size_t)t0 * a.ldq; ap.dout += (size_t)t0 * a.ldo; gp.dq += (size_t)t0 * g.lddq;
        att_row_dots(D, ap.dout, a.ldo, y + (size_t)t0 * ldy, ldy, nq, a.hs);
        att_panel_backward(gp, s, dp, ap, lse + t0, D, nq, n, causal ? t0 : n);
    }
}

// The backward of one block (as att_block_forward's), with out and lse the final ones (over every block): dq into
// the q part of dqkv, dk and dv into dkv (row width ldkv, as kv), added to, or written where zero (dkv then dqkv's
// k and v part). One task per (batch, kv head): it owns its G query heads' dq and its dk, dv, which it sums over
// them in order.
static void att_block_backward(float *dqkv, float *dkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, const float *kv, int ldkv, int B, int T, int NH, int KV, int hs,
                               int q0, int k0, int n, int causal, int zero) {
    int W = (NH + 2 * KV) * hs, C = NH * hs, G = NH / KV, QT = att_panel_rows;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel if (B * KV >= att_threads())
    {
        float *s = (float *)malloc_check(sizeof(float) * 2 * QT * att_key_tile), *dp = s + QT * att_key_tile;
        float *D = (float *)malloc_check(sizeof(float) * QT);
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int kh = 0; kh < KV; kh++) {
                const float *k = kv + ((size_t)b * T + k0) * ldkv + kh * hs;
                float *dk = dkv + ((size_t)b * T + k0) * ldkv + kh * hs;
                if (zero) { att_zero_group(dqkv + (size_t)b * T * W, T, NH, KV, hs, kh); }
                for (int h = kh * G; h < (kh + 1) * G; h++) {
                    size_t row = (size_t)b * T + q0;
                    AttHead a = {qkv + row * W + h * hs, k, k + KV * hs, dout + row * C + h * hs, W, ldkv, C, hs, scale};
                    AttGrad g = {dqkv + row * W + h * hs, dk, dk + KV * hs, W, ldkv};
                    att_head_backward(g, a, out + row * C + h * hs, C, lse + ((size_t)b * NH + h) * T + q0, n, causal,
                                      s, dp, D);
                }
            }
        }
        free(s); free(D);
    }
}

// dout (B, T, NH hs) -> dqkv (B, T, (NH + 2KV) hs) (written): attention_backward_cpu through BLAS, one block
static void attention_backward_blas(float *dqkv, const float *dout, const float *qkv, const float *out,
                                    const float *lse, int B, int T, int NH, int KV, int hs) {
    att_block_backward(dqkv, dqkv + NH * hs, dout, qkv, out, lse, qkv + NH * hs, (NH + 2 * KV) * hs, B, T, NH, KV, hs,
                       0, 0, T, 1, 1);
}

#endif
