// Context parallelism (--cp N), in one place: the sequence is cut into 2N chunks of c = T/(2N) tokens
// and cp rank i holds chunks i and 2N-1-i (its local sequence: chunk i's c tokens, then chunk
// 2N-1-i's), so that every rank has the same share of the causal attention's work (chunk 0 attends
// to itself only, chunk 2N-1 to everything). Everything but attention works token by token on the
// local tokens. Attention is ring attention: each rank keeps its queries and passes the keys and
// values around the cp ring; at step s it holds rank j = i - s's, and adds each of its query chunks'
// attention over each of j's key chunks that are not in its future (earlier chunks in full, the same
// chunk causally) to what it has, by the log-sum-exp merge:
//   lse = log(exp(lse1) + exp(lse2)),  out = out1 exp(lse1 - lse) + out2 exp(lse2 - lse)
// The backward recomputes the probabilities from the final lse (as the one-device backward does):
// the keys and values go around again, now with their gradients dk, dv, which collect each rank's
// part and, after a last hop, arrive back at their owner.
//   forward  (N-1) hops of k, v (B, T/cp, 2 KV hs / tp: the kv heads'); backward (N-1) hops of k, v and N of dk, dv.
// Each hop of k, v is started before the blocks that use the k, v held now and waited for after them,
// so it travels while they compute (the blocks only read what is sent; what arrives goes to the other
// buffer); dk, dv are sent once the blocks have added to them.
// Rank i's local rows: [0, c) are sequence positions i*c .., [c, 2c) positions (2N-1-i)*c .. .
// A block is flash attention over offset rows, causal or whole, merged: in the bf16 CUDA build at head size 64
// or 128 it runs through flash_attention.h's kernels (FaArgs: the rows, the merge, the adds; D once per
// backward); elsewhere through the blocks below (CUDA: a warp per query row; CPU: attention.h's BLAS panels).
#ifndef LLMC_CONTEXT_PARALLEL_H
#define LLMC_CONTEXT_PARALLEL_H

#include "backend.h"
#include "comm.h"
#include "attention.h"

// The sequence layout, the one definition (the encoder's positions, the ring's causal blocks, the MoE
// capacity's whole sequences, the tokens each rank reads, sampling): the sequence chunk of local rows
// [half*c, half*c + c) of cp rank i (of N) is i, or 2N-1-i.
#ifdef USE_CUDA
__host__ __device__
#endif
static inline int cp_chunk(int i, int N, int half) { return half ? 2 * N - 1 - i : i; }

// Where in the sequence the local position t is (0 <= t < T, the tokens of a sequence this rank
// holds): two chunks of `half` tokens starting at sequence positions off0 and off1; without context
// parallelism, half = T and off0 = 0: t itself.
typedef struct { int half, off0, off1; } SeqPos;
#ifdef USE_CUDA
__host__ __device__
#endif
static inline int seq_pos(SeqPos p, int t) { return t < p.half ? p.off0 + t : p.off1 + t - p.half; }

// Cp rank r of N holds T tokens of each sequence: its chunks cp_chunk(r, N, 0) and cp_chunk(r, N, 1) of
// T/2 tokens each (N = 1: all).
#ifdef USE_CUDA
__host__ __device__
#endif
static inline SeqPos seq_pos_of_rank(int N, int r, int T) {
    if (N == 1) { SeqPos p = {T, 0, 0}; return p; }
    SeqPos p = {T / 2, cp_chunk(r, N, 0) * T / 2, cp_chunk(r, N, 1) * T / 2};
    return p;
}

// The inverse: the cp rank (of N, each holding T tokens of a sequence) that holds sequence position pos,
// and its local row there.
static void seq_pos_owner(int N, int T, int pos, int *rank, int *row) {
    if (N == 1) { *rank = 0; *row = pos; return; }
    int c = T / 2, chunk = pos / c, half = chunk >= N;
    *rank = cp_chunk(chunk, N, half);   // (cp_chunk is its own inverse: chunk i <-> rank i, chunk 2N-1-i <-> rank i)
    *row = half * c + pos % c;
}

// ----------------------------------------------------------------------------
// one block: queries rows [q0, q0+n) of qkv (B, T, (NH + 2KV) hs), keys and values rows [k0, k0+n) of kv
// (B, T, 2 KV hs) = [k heads | v heads]; causal: the blocks are the same chunk (key j only for query t >= j).
// Query head h reads kv head h / (NH / KV) (attention.h).

// Adds the key block to the attention of the query block: out (B, T, NH hs) and lse (B, NH, T) at the
// query rows hold the attention over the blocks added so far (lse -inf, out 0: none).
static void attention_block_forward_cpu(float *out, float *lse, const float *qkv, const float *kv, int B, int T, int NH,
                                        int KV, int hs, int q0, int k0, int n, int causal) {
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs, W2 = (size_t)2 * KV * hs;   // row widths
    int G = NH / KV;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float *p = (float *)malloc_check(sizeof(float) * n);
        float *o = (float *)malloc_check(sizeof(float) * hs);
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float *kbase = kv + ((size_t)b * T + k0) * W2 + (h / G) * hs, *vbase = kbase + KV * hs;
                for (int t = 0; t < n; t++) {
                    const float *q = qkv + ((size_t)b * T + q0 + t) * W + h * hs;
                    int nk = causal ? t + 1 : n;
                    float maxv = -INFINITY;
                    for (int j = 0; j < nk; j++) {
                        const float *k = kbase + j * W2;
                        float s = 0.0f;
                        for (int i = 0; i < hs; i++) { s += q[i] * k[i]; }
                        p[j] = s * scale;
                        if (p[j] > maxv) { maxv = p[j]; }
                    }
                    float sum = 0.0f;
                    for (int j = 0; j < nk; j++) { p[j] = expf(p[j] - maxv); sum += p[j]; }
                    for (int i = 0; i < hs; i++) { o[i] = 0.0f; }
                    for (int j = 0; j < nk; j++) {
                        const float *v = vbase + j * W2;
                        for (int i = 0; i < hs; i++) { o[i] += p[j] / sum * v[i]; }
                    }
                    // merge (out1, lse1) with this block's (o, lse2)
                    float *l = lse + ((size_t)b * NH + h) * T + q0 + t, lse2 = maxv + logf(sum);
                    float mx = *l > lse2 ? *l : lse2, l12 = mx + logf(expf(*l - mx) + expf(lse2 - mx));
                    float w1 = expf(*l - l12), w2 = expf(lse2 - l12);
                    float *y = out + ((size_t)b * T + q0 + t) * C + h * hs;
                    for (int i = 0; i < hs; i++) { y[i] = y[i] * w1 + o[i] * w2; }
                    *l = l12;
                }
            }
        }
        free(p); free(o);
    }
}

// One query head h of batch index b in a block's backward: its dq, and its kv head's dk, dv, added to.
static void attention_block_backward_head_cpu(float *dqkv, float *dkv, const float *dout, const float *qkv,
                                              const float *out, const float *lse, const float *kv, int b, int h, int T,
                                              int NH, int KV, int hs, int q0, int k0, int n, int causal) {
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs, W2 = (size_t)2 * KV * hs;
    size_t kcol = (size_t)(h / (NH / KV)) * hs;   // its kv head's k; v at + KV hs
    float scale = 1.0f / sqrtf((float)hs);
    for (int t = 0; t < n; t++) {
        size_t row = (size_t)b * T + q0 + t;
        const float *q = qkv + row * W + h * hs, *dy = dout + row * C + h * hs, *y = out + row * C + h * hs;
        float *dq = dqkv + row * W + h * hs, l = lse[((size_t)b * NH + h) * T + q0 + t], D = 0.0f;
        for (int i = 0; i < hs; i++) { D += dy[i] * y[i]; }
        for (int j = 0; j < (causal ? t + 1 : n); j++) {
            const float *k = kv + ((size_t)b * T + k0 + j) * W2 + kcol, *v = k + KV * hs;
            float *dk = dkv + ((size_t)b * T + k0 + j) * W2 + kcol, *dv = dk + KV * hs;
            float s = 0.0f, dp = 0.0f;
            for (int i = 0; i < hs; i++) { s += q[i] * k[i]; dp += dy[i] * v[i]; }
            float p = expf(s * scale - l), ds = p * (dp - D) * scale;
            for (int i = 0; i < hs; i++) { dq[i] += ds * k[i]; dk[i] += ds * q[i]; dv[i] += p * dy[i]; }
        }
    }
}

// The block's part of the backward, with out and lse the final ones (over every block):
//   p = exp(q.k scale - lse), ds = p (dout.v - dout.out) scale;  dq += ds k, dk += ds q, dv += p dout
// dq into the q part of dqkv (B, T, (NH + 2KV) hs), dk and dv into dkv (B, T, 2 KV hs), both added to.
// One task per (batch, kv head): its G query heads in order.
static void attention_block_backward_cpu(float *dqkv, float *dkv, const float *dout, const float *qkv,
                                         const float *out, const float *lse, const float *kv, int B, int T, int NH,
                                         int KV, int hs, int q0, int k0, int n, int causal) {
    int G = NH / KV;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int kh = 0; kh < KV; kh++) {   // this (b, kv head) owns its heads' slices of dq, dk, dv
            for (int h = kh * G; h < (kh + 1) * G; h++) {
                attention_block_backward_head_cpu(dqkv, dkv, dout, qkv, out, lse, kv, b, h, T, NH, KV, hs, q0, k0, n,
                                                  causal);
            }
        }
    }
}

// The two blocks above through BLAS (attention.h's panels: what the CPU build runs), so that the ring
// computes what the one-device attention_forward_blas / attention_backward_blas compute, block by block.
// Threads as there: forward one task per (batch, query head, panel), backward one per (batch, kv head).
// Row i of a panel starting at block row t0 sees block keys j <= t0 + i (causal), all n otherwise.
static void attention_block_forward_blas(float *out, float *lse, const float *qkv, const float *kv, int B, int T,
                                         int NH, int KV, int hs, int q0, int k0, int n, int causal) {
    int W = (NH + 2 * KV) * hs, C = NH * hs, W2 = 2 * KV * hs, G = NH / KV, QT = att_panel_rows;
    int np = (n + QT - 1) / QT;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        AttPanel w = att_panel_alloc(hs);
        #pragma omp for schedule(dynamic, 1)
        for (int r = 0; r < B * NH * np; r++) {
            int b, h, t0, nq;
            att_panel_task(r, NH, np, QT, n, &b, &h, &t0, &nq);
            const float *k = kv + ((size_t)b * T + k0) * W2 + (h / G) * hs;
            AttHead a = {qkv + ((size_t)b * T + q0 + t0) * W + h * hs, k, k + KV * hs, NULL, W, W2, 0, hs, scale};
            att_panel_forward(&w, a, nq, n, causal ? t0 : n);
            for (int i = 0; i < nq; i++) {   // merge (out1, lse1) with this block's (o / l, lse2)
                float *lp = lse + ((size_t)b * NH + h) * T + q0 + t0 + i, lse2 = w.m[i] + logf(w.l[i]);
                float mx = *lp > lse2 ? *lp : lse2, l12 = mx + logf(expf(*lp - mx) + expf(lse2 - mx));
                float w1 = expf(*lp - l12), w2 = expf(lse2 - l12) / w.l[i];
                float *y = out + ((size_t)b * T + q0 + t0 + i) * C + h * hs;
                for (int c = 0; c < hs; c++) { y[c] = y[c] * w1 + w.o[(size_t)i * hs + c] * w2; }
                *lp = l12;
            }
        }
        att_panel_free(&w);
    }
}

static void attention_block_backward_blas(float *dqkv, float *dkv, const float *dout, const float *qkv,
                                          const float *out, const float *lse, const float *kv, int B, int T, int NH,
                                          int KV, int hs, int q0, int k0, int n, int causal) {
    int W = (NH + 2 * KV) * hs, C = NH * hs, W2 = 2 * KV * hs, G = NH / KV, QT = att_panel_rows;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel if (B * KV >= att_threads())
    {
        float *s = (float *)malloc_check(sizeof(float) * 2 * QT * att_key_tile), *dp = s + QT * att_key_tile;
        float *D = (float *)malloc_check(sizeof(float) * QT);
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int kh = 0; kh < KV; kh++) {   // this (b, kv head) owns its heads' slices of dq, dk, dv
                const float *k = kv + ((size_t)b * T + k0) * W2 + kh * hs;
                float *dk = dkv + ((size_t)b * T + k0) * W2 + kh * hs;
                for (int h = kh * G; h < (kh + 1) * G; h++) {
                    size_t row = (size_t)b * T + q0;
                    AttHead a = {qkv + row * W + h * hs, k, k + KV * hs, dout + row * C + h * hs, W, W2, C, hs, scale};
                    AttGrad g = {dqkv + row * W + h * hs, dk, dk + KV * hs, W, W2};
                    att_head_backward(g, a, out + row * C + h * hs, C, lse + ((size_t)b * NH + h) * T + q0, n, causal,
                                      s, dp, D);
                }
            }
        }
        free(s); free(D);
    }
}

#ifdef USE_CUDA
// One warp per (query row, query head, batch index): lane i of the warp holds dims i, i+32, ... of the
// head; each key's score is a warp sum; online softmax over the block's keys, then the lse merge.
// grid (n, NH, B), block 32.
__global__ void attention_block_forward_kernel(floatX *out, float *lse, const floatX *qkv, const floatX *kv, int T,
                                               int NH, int KV, int hs, int q0, int k0, int n, int causal) {
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x;
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs, W2 = (size_t)2 * KV * hs;
    float scale = rsqrtf((float)hs);
    const floatX *q = qkv + ((size_t)b * T + q0 + t) * W + h * hs;
    const floatX *kbase = kv + ((size_t)b * T + k0) * W2 + (h / (NH / KV)) * hs;   // its kv head's k; v at + KV hs
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, maxv = -INFINITY, sum = 0.0f;   // hs <= 128: 4 dims per lane
    int nk = causal ? t + 1 : n;
    for (int j = 0; j < nk; j++) {
        const floatX *k = kbase + j * W2, *v = k + KV * hs;
        float s = 0.0f;
        for (int i = lane; i < hs; i += 32) { s += (float)q[i] * (float)k[i]; }
        s = warp_reduce_sum(s) * scale;
        float mx = fmaxf(maxv, s), a = expf(maxv - mx), e = expf(s - mx);
        sum = sum * a + e;
        for (int r = 0, i = lane; i < hs; r++, i += 32) { acc[r] = acc[r] * a + e * (float)v[i]; }
        maxv = mx;
    }
    float *l = lse + ((size_t)b * NH + h) * T + q0 + t, lse2 = maxv + logf(sum);
    float l1 = *l, mx = fmaxf(l1, lse2), l12 = mx + logf(expf(l1 - mx) + expf(lse2 - mx));
    float w1 = expf(l1 - l12), w2 = expf(lse2 - l12) / sum;
    floatX *y = out + ((size_t)b * T + q0 + t) * C + h * hs;
    for (int r = 0, i = lane; i < hs; r++, i += 32) { y[i] = (floatX)((float)y[i] * w1 + acc[r] * w2); }
    __syncwarp();
    if (lane == 0) { *l = l12; }
}

// dq of one query row (warp per (row, query head, batch)): grid (n, NH, B), block 32.
__global__ void attention_block_backward_dq_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv,
                                                   const floatX *out, const float *lse, const floatX *kv, int T,
                                                   int NH, int KV, int hs, int q0, int k0, int n, int causal) {
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x;
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs, W2 = (size_t)2 * KV * hs;
    float scale = rsqrtf((float)hs);
    size_t row = (size_t)b * T + q0 + t;
    const floatX *q = qkv + row * W + h * hs, *dy = dout + row * C + h * hs, *y = out + row * C + h * hs;
    const floatX *kbase = kv + ((size_t)b * T + k0) * W2 + (h / (NH / KV)) * hs;   // its kv head's k; v at + KV hs
    float l = lse[((size_t)b * NH + h) * T + q0 + t], D = 0.0f, dq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = lane; i < hs; i += 32) { D += (float)dy[i] * (float)y[i]; }
    D = warp_reduce_sum(D);
    for (int j = 0; j < (causal ? t + 1 : n); j++) {
        const floatX *k = kbase + j * W2, *v = k + KV * hs;
        float s = 0.0f, dp = 0.0f;
        for (int i = lane; i < hs; i += 32) { s += (float)q[i] * (float)k[i]; dp += (float)dy[i] * (float)v[i]; }
        s = warp_reduce_sum(s); dp = warp_reduce_sum(dp);
        float p = expf(s * scale - l), ds = p * (dp - D) * scale;
        for (int r = 0, i = lane; i < hs; r++, i += 32) { dq[r] += ds * (float)k[i]; }
    }
    floatX *d = dqkv + row * W + h * hs;
    for (int r = 0, i = lane; i < hs; r++, i += 32) { d[i] = (floatX)((float)d[i] + dq[r]); }
}

// dk, dv of one key row (warp per (row, kv head, batch)), over its G query heads in order and the block's
// queries in ascending order (deterministic): grid (n, KV, B), block 32.
__global__ void attention_block_backward_dkdv_kernel(floatX *dkv, const floatX *dout, const floatX *qkv,
                                                     const floatX *out, const float *lse, const floatX *kv, int T,
                                                     int NH, int KV, int hs, int q0, int k0, int n, int causal) {
    int j = blockIdx.x, kh = blockIdx.y, b = blockIdx.z, lane = threadIdx.x, G = NH / KV;
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs, W2 = (size_t)2 * KV * hs;
    float scale = rsqrtf((float)hs);
    const floatX *k = kv + ((size_t)b * T + k0 + j) * W2 + kh * hs, *v = k + KV * hs;
    float dk[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int h = kh * G; h < (kh + 1) * G; h++) {
        for (int t = causal ? j : 0; t < n; t++) {
            size_t row = (size_t)b * T + q0 + t;
            const floatX *q = qkv + row * W + h * hs, *dy = dout + row * C + h * hs, *y = out + row * C + h * hs;
            float s = 0.0f, dp = 0.0f, D = 0.0f;
            for (int i = lane; i < hs; i += 32) {
                s += (float)q[i] * (float)k[i];
                dp += (float)dy[i] * (float)v[i];
                D += (float)dy[i] * (float)y[i];
            }
            s = warp_reduce_sum(s); dp = warp_reduce_sum(dp); D = warp_reduce_sum(D);
            float p = expf(s * scale - lse[((size_t)b * NH + h) * T + q0 + t]), ds = p * (dp - D) * scale;
            for (int r = 0, i = lane; i < hs; r++, i += 32) { dk[r] += ds * (float)q[i]; dv[r] += p * (float)dy[i]; }
        }
    }
    floatX *d = dkv + ((size_t)b * T + k0 + j) * W2 + kh * hs;
    for (int r = 0, i = lane; i < hs; r++, i += 32) {
        d[i] = (floatX)((float)d[i] + dk[r]);
        d[KV * hs + i] = (floatX)((float)d[KV * hs + i] + dv[r]);
    }
}

// kv (N, w) = columns [c0, c0 + w) of qkv's rows (N, W), or (unpack) the reverse: dkv into dqkv's k and v parts
__global__ void cp_kv_copy_kernel(floatX *kv, floatX *qkv, size_t N, int W, int c0, int w, int pack) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * w) { return; }
    size_t row = i / w, c = i % w;
    if (pack) { kv[i] = qkv[row * W + c0 + c]; } else { qkv[row * W + c0 + c] = kv[i]; }
}

// out = 0 and lse = -inf before the first block
__global__ void attention_block_init_kernel(floatX *out, float *lse, size_t nout, size_t nlse) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < nout) { out[i] = (floatX)0.0f; }
    if (i < nlse) { lse[i] = -INFINITY; }
}
#endif

#if defined(USE_CUDA) && !defined(ENABLE_FP32)
// A ring block through the flash kernels (bf16, head size 64 or 128): queries rows [q0, q0 + n) of qkv, keys and
// values rows [k0, k0 + n) of kv, merged into out and lse (row q0 + i of (B, NH, T)); the backward adds into dqkv's
// q part and dkv, with D (flash_row_dot of the final out, once per backward) in fa_D.
static FaArgs cp_flash_args(floatX *out, float *lse, const floatX *qkv, const floatX *kv, int T, int NH, int KV, int hs,
                            int q0, int k0, int n, int causal) {
    FaArgs a;
    memset(&a, 0, sizeof(a));
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs, W2 = (size_t)2 * KV * hs;
    a.q = qkv + (size_t)q0 * W; a.k = kv + (size_t)k0 * W2; a.v = a.k + (size_t)KV * hs;
    a.q_ld = W; a.q_bs = (size_t)T * W; a.kv_ld = W2; a.kv_bs = (size_t)T * W2;
    a.nq = a.nk = n; a.causal = causal; a.NH = NH; a.KV = KV;
    a.out = out + (size_t)q0 * C; a.out_ld = C; a.out_bs = (size_t)T * C;
    a.lse = lse; a.lse_T = T; a.lse_off = q0; a.merge = 1;
    return a;
}
#endif
// whether the ring's blocks run through the flash kernels (bf16 CUDA build, head size 64 or 128; else the
// warp-per-row kernels below, or the CPU's BLAS panels)
static int cp_flash(int hs) {
    return attention_flash_applies(hs, sizeof(floatX));
}

static void attention_block_forward(floatX *out, float *lse, const floatX *qkv, const floatX *kv, int B, int T, int NH,
                                    int KV, int hs, int q0, int k0, int n, int causal) {
#if defined(USE_CUDA) && !defined(ENABLE_FP32)
    if (cp_flash(hs)) {
        FaArgs a = cp_flash_args(out, lse, qkv, kv, T, NH, KV, hs, q0, k0, n, causal);
        if (hs == 64) { flash_forward_args<64>(a, B); } else { flash_forward_args<128>(a, B); }
        return;
    }
#endif
#ifdef USE_CUDA
    attention_block_forward_kernel<<<dim3(n, NH, B), 32, 0, main_stream>>>(out, lse, qkv, kv, T, NH, KV, hs, q0, k0, n,
            causal);
    cudaCheckLaunch();
#else
    attention_block_forward_blas(out, lse, qkv, kv, B, T, NH, KV, hs, q0, k0, n, causal);
#endif
}

static void attention_block_backward(floatX *dqkv, floatX *dkv, const floatX *dout, const floatX *qkv,
                                     const floatX *out, const float *lse, const floatX *kv, int B, int T, int NH,
                                     int KV, int hs, int q0, int k0, int n, int causal) {
#if defined(USE_CUDA) && !defined(ENABLE_FP32)
    if (cp_flash(hs)) {
        size_t W = (size_t)(NH + 2 * KV) * hs, W2 = (size_t)2 * KV * hs;
        FaArgs a = cp_flash_args((floatX *)out, (float *)lse, qkv, kv, T, NH, KV, hs, q0, k0, n, causal);
        a.merge = 0;
        a.dout = dout + (size_t)q0 * NH * hs; a.D = fa_D;
        a.dq = dqkv + (size_t)q0 * W; a.dq_ld = W; a.dq_bs = (size_t)T * W;
        a.dk = dkv + (size_t)k0 * W2; a.dv = a.dk + (size_t)KV * hs; a.dkv_ld = W2; a.dkv_bs = (size_t)T * W2;
        a.add = 1;
        if (hs == 64) { flash_backward_args<64>(a, B); } else { flash_backward_args<128>(a, B); }
        return;
    }
#endif
#ifdef USE_CUDA
    attention_block_backward_dq_kernel<<<dim3(n, NH, B), 32, 0, main_stream>>>(dqkv, dout, qkv, out, lse, kv, T, NH, KV,
            hs, q0, k0, n, causal);
    cudaCheckLaunch();
    attention_block_backward_dkdv_kernel<<<dim3(n, KV, B), 32, 0, main_stream>>>(dkv, dout, qkv, out, lse, kv, T, NH,
            KV, hs, q0, k0, n, causal);
    cudaCheckLaunch();
#else
    attention_block_backward_blas(dqkv, dkv, dout, qkv, out, lse, kv, B, T, NH, KV, hs, q0, k0, n, causal);
#endif
}

// kv (N, 2 KV hs) <- the k and v parts of qkv (N, (NH + 2KV) hs) (pack), or the reverse into dqkv
static void cp_kv_copy(floatX *kv, floatX *qkv, size_t N, int NH, int KV, int hs, int pack) {
    int W = (NH + 2 * KV) * hs, c0 = NH * hs, w = 2 * KV * hs;   // qkv's row width, where k starts, k and v's width
#ifdef USE_CUDA
    size_t total = N * w;
    if (total == 0) { return; }
    cp_kv_copy_kernel<<<(unsigned int)ceil_div(total, 256), 256, 0, main_stream>>>(kv, qkv, N, W, c0, w, pack);
    cudaCheckLaunch();
#else
    for (size_t r = 0; r < N; r++) {
        if (pack) { memcpy(kv + r * w, qkv + r * W + c0, w * sizeof(float)); }
        else { memcpy(qkv + r * W + c0, kv + r * w, w * sizeof(float)); }
    }
#endif
}

static void attention_block_init(floatX *out, float *lse, size_t nout, size_t nlse) {
#ifdef USE_CUDA
    size_t total = nout > nlse ? nout : nlse;
    attention_block_init_kernel<<<(unsigned int)ceil_div(total, 256), 256, 0, main_stream>>>(out, lse, nout, nlse);
    cudaCheckLaunch();
#else
    for (size_t i = 0; i < nout; i++) { out[i] = 0.0f; }
    for (size_t i = 0; i < nlse; i++) { lse[i] = -INFINITY; }
#endif
}

// ----------------------------------------------------------------------------
// the ring

typedef struct {
    Group *cp;
    floatX *kv[2], *dkv[2];   // (B, T, 2 KV hs) each: the keys and values held now and arriving; their gradients
} CPRing;

// Adds the attention of each local query chunk over each of rank j's key chunks that is not in its future.
static void cp_blocks(CPRing *r, int j, int cur, int backward, floatX *out, float *lse, floatX *dqkv,
                      const floatX *dout, floatX *qkv, int B, int T, int NH, int KV, int hs) {
    int N = r->cp->size, i = r->cp->rank, c = T / 2;
    for (int qa = 0; qa < 2; qa++) {
        for (int kb = 0; kb < 2; kb++) {
            int qc = cp_chunk(i, N, qa), kc = cp_chunk(j, N, kb);
            if (kc > qc) { continue; }   // the future
            if (backward) {
                attention_block_backward(dqkv, r->dkv[cur], dout, qkv, out, lse, r->kv[cur], B, T, NH, KV, hs, qa * c,
                                         kb * c, c, kc == qc);
            }
            else { attention_block_forward(out, lse, qkv, r->kv[cur], B, T, NH, KV, hs, qa * c, kb * c, c, kc == qc); }
        }
    }
}

// One hop around the ring: this rank's buffer [cur] to the next rank, the previous rank's into [!cur]
// (buf: r->kv or r->dkv; with both in flight, every rank starts them in the same order, which is what
// matches them). With `hop` the hop is started and cp_hop_wait completes it; without, it is complete on return.
static void cp_hop(CPRing *r, floatX **buf, int cur, size_t n, CommRequest hop[2]) {
    int N = r->cp->size, next = (r->cp->rank + 1) % N, prev = (r->cp->rank + N - 1) % N;
    int kind = buf == r->kv ? 1 : 2;   // keys and values, or their gradients (the point-to-point log's)
    P2POp ops[2] = {{1, buf[cur], n, next, kind}, {0, buf[!cur], n, prev, kind}};
    comm_p2p(r->cp, ops, 2, DT_FLOATX, hop ? &hop[0] : NULL, hop ? &hop[1] : NULL);
}

static void cp_hop_wait(CommRequest hop[2]) { comm_wait(&hop[1]); comm_wait(&hop[0]); }

// qkv (B, T, (NH + 2KV) hs) -> out (B, T, NH hs), lse (B, NH, T): causal attention of the local queries over the
// whole sequence (T = the local tokens of a sequence, two chunks). A hop carries the KV heads' k and v.
static void cp_attention_forward(CPRing *r, floatX *out, float *lse, floatX *qkv, int B, int T, int NH, int KV,
                                 int hs) {
    int N = r->cp->size, i = r->cp->rank, cur = 0;
    size_t n = (size_t)B * T * 2 * KV * hs;
    attention_block_init(out, lse, (size_t)B * T * NH * hs, (size_t)B * NH * T);
    cp_kv_copy(r->kv[0], qkv, (size_t)B * T, NH, KV, hs, 1);
    for (int s = 0; s < N; s++, cur = !cur) {
        CommRequest hop[2] = {};
        if (s < N - 1) { cp_hop(r, r->kv, cur, n, hop); }   // the next rank's k, v arrive meanwhile
        cp_blocks(r, (i - s + N) % N, cur, 0, out, lse, NULL, NULL, qkv, B, T, NH, KV, hs);
        if (s < N - 1) { cp_hop_wait(hop); }
    }
}

// dout (B, T, NH hs) -> dqkv (B, T, (NH + 2KV) hs) (written), from the forward's qkv, out and final lse.
static void cp_attention_backward(CPRing *r, floatX *dqkv, const floatX *dout, floatX *qkv, floatX *out, float *lse,
                                  int B, int T, int NH, int KV, int hs) {
    int N = r->cp->size, i = r->cp->rank, cur = 0;
    size_t n = (size_t)B * T * 2 * KV * hs;
    memset_zero_device(dqkv, (size_t)B * T * (NH + 2 * KV) * hs * sizeof(floatX));
    memset_zero_device(r->dkv[0], n * sizeof(floatX));
    cp_kv_copy(r->kv[0], qkv, (size_t)B * T, NH, KV, hs, 1);
#if defined(USE_CUDA) && !defined(ENABLE_FP32)
    if (cp_flash(hs)) {   // D = dY.Y of every local query row, once (the flash blocks read it)
        if (hs == 64) { flash_row_dot<64>(dout, out, B, T, NH); } else { flash_row_dot<128>(dout, out, B, T, NH); }
    }
#endif
    for (int s = 0; s < N; s++, cur = !cur) {
        CommRequest hop[2] = {};
        if (s < N - 1) { cp_hop(r, r->kv, cur, n, hop); }
        cp_blocks(r, (i - s + N) % N, cur, 1, out, lse, dqkv, dout, qkv, B, T, NH, KV, hs);
        cp_hop(r, r->dkv, cur, n, NULL);   // the dk, dv just added to (the last hop takes each home)
        if (s < N - 1) { cp_hop_wait(hop); }
    }
    cp_kv_copy(r->dkv[cur], dqkv, (size_t)B * T, NH, KV, hs, 0);
}

#endif
