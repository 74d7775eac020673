// Context parallelism (--cp N, --cp-kind ring|ulysses|hybrid, --cp-ulysses U), in one place: the sequence is cut
// into 2N chunks of c = T/(2N) tokens
// and cp rank i holds chunks i and 2N-1-i (its local sequence: chunk i's c tokens, then chunk
// 2N-1-i's), so that every rank has the same share of the causal attention's work (chunk 0 attends
// to itself only, chunk 2N-1 to everything). Everything but attention works token by token on the
// local tokens. Attention is ring attention (the default; Ulysses and the hybrid of the two: below, after the
// ring, which the hybrid runs across its all-to-all groups): each rank keeps its queries and passes the keys and
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
#include "seq_layout.h"

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

// The two blocks above through BLAS (attention_blas.h's panels: what the CPU build runs), the code of the one-device
// attention_forward_blas / attention_backward_blas, so that the ring computes what they compute, block by block:
// the forward merged into (out, lse), the backward added to dqkv and dkv (2 KV hs wide, as kv).
static void attention_block_forward_blas(float *out, float *lse, const float *qkv, const float *kv, int B, int T,
                                         int NH, int KV, int hs, int q0, int k0, int n, int causal) {
    att_block_forward(out, lse, qkv, kv, 2 * KV * hs, B, T, NH, KV, hs, q0, k0, n, causal, 1);
}

static void attention_block_backward_blas(float *dqkv, float *dkv, const float *dout, const float *qkv,
                                          const float *out, const float *lse, const float *kv, int B, int T, int NH,
                                          int KV, int hs, int q0, int k0, int n, int causal) {
    att_block_backward(dqkv, dkv, dout, qkv, out, lse, kv, 2 * KV * hs, B, T, NH, KV, hs, q0, k0, n, causal, 0);
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
    LAUNCH(attention_block_forward_kernel, dim3(n, NH, B), 32, 0, main_stream)(out, lse, qkv, kv, T, NH, KV, hs, q0, k0, n,
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
    LAUNCH(attention_block_backward_dq_kernel, dim3(n, NH, B), 32, 0, main_stream)(dqkv, dout, qkv, out, lse, kv, T, NH, KV,
            hs, q0, k0, n, causal);
    cudaCheckLaunch();
    LAUNCH(attention_block_backward_dkdv_kernel, dim3(n, KV, B), 32, 0, main_stream)(dkv, dout, qkv, out, lse, kv, T, NH,
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
    LAUNCH(cp_kv_copy_kernel, (unsigned int)ceil_div(total, 256), 256, 0, main_stream)(kv, qkv, N, W, c0, w, pack);
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
    LAUNCH(attention_block_init_kernel, (unsigned int)ceil_div(total, 256), 256, 0, main_stream)(out, lse, nout, nlse);
    cudaCheckLaunch();
#else
    for (size_t i = 0; i < nout; i++) { out[i] = 0.0f; }
    for (size_t i = 0; i < nlse; i++) { lse[i] = -INFINITY; }
#endif
}

// ----------------------------------------------------------------------------
// the layout of the cp group's attention: the ring, Ulysses, or the hybrid

// U, the all-to-all group's size (Ulysses degree): 1 the ring, N Ulysses, 1 < U < N the hybrid, whose all-to-all
// groups are U consecutive cp ranks and whose ring runs across the N/U groups (each member with the members at
// its own position in the other groups: cp ranks U apart). With U > 1 a head shard has Hq = NH/U query heads and
// Hkv kv heads: KV/U, or (U a multiple of KV: fewer kv heads than members) one, replicated on the U/KV members
// whose query heads read it; its qkv rows are (Hq + 2 Hkv) hs wide. All the counts are the tp rank's.
typedef struct {
    Group *cp;
    int U;                        // the all-to-all group's size (1: the ring alone)
    int NH, KV, hs;               // the tp-local heads
    int Hq, Hkv;                  // a head shard's query and kv heads (U 1: NH, KV)
    int qkv_w;                    // the stored qkv rows' width: (NH + 2 U Hkv) hs (more than (NH + 2KV) hs only
                                  // with replicated kv heads); y.qkv holds the head shard after the forward
    floatX *kv[2], *dkv[2];       // the ring (N/U > 1): (B, U T, 2 Hkv hs) each, the keys and values held now and
                                  // arriving; their gradients
    floatX *a2a[2];               // U > 1: (B T qkv_w) each, what an all-to-all sends and what it receives
} CPRing;

// The layout (before the buffers: the stored qkv rows' width decides the activations').
static void cp_attention_init(CPRing *r, Group *cp, int U, int NH, int KV, int hs) {
    memset(r, 0, sizeof(*r));
    r->cp = cp; r->U = U; r->NH = NH; r->KV = KV; r->hs = hs;
    r->Hq = NH / U;
    r->Hkv = KV % U == 0 ? KV / U : 1;   // (layout.h's checks: U divides NH, and KV or U % KV == 0)
    r->qkv_w = (NH + 2 * U * r->Hkv) * hs;
}

// The ring's size and this rank's position on it (the all-to-all groups': N/U and cp rank / U).
static int cp_ring_n(const CPRing *r) { return r->cp->size / r->U; }
static int cp_ring_i(const CPRing *r) { return r->cp->rank / r->U; }

// The buffers for BT = B*T local tokens (cp > 1; one rank: none).
static void cp_attention_alloc(CPRing *r, size_t BT) {
    size_t X = floatx_bytes(), kv = BT * 2 * r->U * r->Hkv * r->hs;   // (U T rows of 2 Hkv hs)
    if (r->cp->size == 1) { return; }
    for (int i = 0; i < 2 && cp_ring_n(r) > 1; i++) {   // the ring: the keys and values held and arriving, their gradients
        r->kv[i] = (floatX *)mem_alloc(kv * X, MEM_COMM);
        r->dkv[i] = (floatX *)mem_alloc(kv * X, MEM_COMM);
    }
    for (int i = 0; i < 2 && r->U > 1; i++) { r->a2a[i] = (floatX *)mem_alloc(BT * r->qkv_w * X, MEM_COMM); }
}

// What the attention needs set up beside (attention.h's workspace at the shape it runs: one rank's, or Ulysses'
// full sequence of a head shard; the ring's flash blocks: D), and its bytes for a plan (path: --attention's).
static void cp_attention_setup(const CPRing *r, int B, int T) {
    if (cp_ring_n(r) == 1) { attention_setup(B, T * r->U, r->Hq, r->Hkv, r->hs); return; }
#if defined(USE_CUDA) && !defined(ENABLE_FP32)
    if (cp_flash(r->hs)) { flash_setup(B, T * r->U, r->Hq); }
#else
    (void)B; (void)T;
#endif
}
static size_t cp_attention_workspace_bytes(const CPRing *r, int path, int B, int T, size_t floatx) {
    if (cp_ring_n(r) == 1) { return attention_workspace_bytes(path, B, T * r->U, r->Hq, r->Hkv, r->hs, floatx); }
    return attention_flash_applies(r->hs, floatx) ? flash_workspace_bytes(B, T * r->U, r->Hq) : 0;
}

// ----------------------------------------------------------------------------
// the ring: over N' = N/U positions (U 1: the cp ranks), each holding T rows (U 1: its local tokens; the hybrid:
// the U T tokens of its group, super-chunks i and 2N'-1-i of U c tokens, in sequence order within each) of NH
// query and KV kv heads (the hybrid: a head shard's)

// Adds the attention of each local query chunk over each of position j's key chunks that is not in its future.
static void cp_blocks(CPRing *r, int j, int cur, int backward, floatX *out, float *lse, floatX *dqkv,
                      const floatX *dout, floatX *qkv, int B, int T, int NH, int KV, int hs) {
    int N = cp_ring_n(r), i = cp_ring_i(r), c = T / 2;
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

// One hop around the ring: this rank's buffer [cur] to the next position, the previous position's into [!cur]
// (buf: r->kv or r->dkv; with both in flight, every rank starts them in the same order, which is what
// matches them). With `hop` the hop is started and cp_hop_wait completes it; without, it is complete on return.
// The next position's rank is U cp ranks on (the same member of the next all-to-all group).
static void cp_hop(CPRing *r, floatX **buf, int cur, size_t n, CommRequest hop[2]) {
    int N = r->cp->size, next = (r->cp->rank + r->U) % N, prev = (r->cp->rank + N - r->U) % N;
    int kind = buf == r->kv ? 1 : 2;   // keys and values, or their gradients (the point-to-point log's)
    P2POp ops[2] = {{1, buf[cur], n, next, kind}, {0, buf[!cur], n, prev, kind}};
    comm_p2p(r->cp, ops, 2, DT_FLOATX, hop ? &hop[0] : NULL, hop ? &hop[1] : NULL);
}

static void cp_hop_wait(CommRequest hop[2]) { comm_wait(&hop[1]); comm_wait(&hop[0]); }

// qkv (B, T, (NH + 2KV) hs) -> out (B, T, NH hs), lse (B, NH, T): causal attention of the position's queries over
// the whole sequence (T = the rows of a sequence the position holds, two chunks). A hop carries the KV heads' k, v.
static void cp_ring_forward(CPRing *r, floatX *out, float *lse, floatX *qkv, int B, int T, int NH, int KV, int hs) {
    int N = cp_ring_n(r), i = cp_ring_i(r), cur = 0;
    size_t n = (size_t)B * T * 2 * KV * hs;
    attention_block_init(out, lse, (size_t)B * T * NH * hs, (size_t)B * NH * T);
    cp_kv_copy(r->kv[0], qkv, (size_t)B * T, NH, KV, hs, 1);
    for (int s = 0; s < N; s++, cur = !cur) {
        CommRequest hop[2] = {};
        if (s < N - 1) { cp_hop(r, r->kv, cur, n, hop); }   // the next position's k, v arrive meanwhile
        cp_blocks(r, (i - s + N) % N, cur, 0, out, lse, NULL, NULL, qkv, B, T, NH, KV, hs);
        if (s < N - 1) { cp_hop_wait(hop); }
    }
}

// dout (B, T, NH hs) -> dqkv (B, T, (NH + 2KV) hs) (written), from the forward's qkv, out and final lse.
static void cp_ring_backward(CPRing *r, floatX *dqkv, const floatX *dout, floatX *qkv, floatX *out, float *lse,
                             int B, int T, int NH, int KV, int hs) {
    int N = cp_ring_n(r), i = cp_ring_i(r), cur = 0;
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

// ----------------------------------------------------------------------------
// Ulysses (DeepSpeed-Ulysses): one all-to-all in the group of U turns each member's T local tokens of all its
// heads into the group's U T tokens of a head shard: member m gets query heads [m Hq, (m+1) Hq) and the kv heads
// they read, [kv0(m), kv0(m) + Hkv) with kv0(m) = m Hq / (NH/KV). Member m's T rows (its chunks, cp_chunk(gU+m, N,
// 0) and (.., 1), of c = T/2 tokens each) go to rows cp_chunk(m, U, 0) c and cp_chunk(m, U, 1) c of the group's
// U T (a local copy after the all-to-all), which puts them in sequence order within super-chunks g and 2N/U-1-g of
// U c tokens: the ring's layout at N/U positions (Ulysses alone, U = N: the whole sequence in order). So the
// unchanged causal kernels run on it: attention_forward on the whole sequence (any path: cuBLAS, flash, cuDNN,
// the BLAS panels), or the ring's blocks. The output goes back by the reverse copy and all-to-all. RoPE was
// applied before, at each token's global position (seq_pos): it does not see the layout.
//   per layer, one rank sends (U-1)/U of: forward (B T)(Cl + 2 U Hkv hs) (q, k, v) + (B T) Cl (out); backward
//   (B T) Cl (out again: the stored output is the local one, which attproj's gradient needs) + (B T) Cl (dout) +
//   (B T)(Cl + 2 U Hkv hs) (dq, dk, dv back); replicated kv heads (U > KV) cost U/KV times their k, v.
// The head shard's qkv stays in y.qkv for the backward (the local rows are in the send buffer by then) and its lse
// in y.lse (B, Hq, U T): the sizes of the local ones (qkv: with replicated kv heads wider, r->qkv_w).

// The heads of a row: the local rows' NH query heads (and KV kv heads if kv: [q | k | v]); a member's head shard's
// Hq (and Hkv: [q | k | v]).
typedef struct { int U, NH, KV, Hq, Hkv, hs, kv; } UlyHeads;

static UlyHeads uly_heads(const CPRing *r, int kv) {
    UlyHeads h = {r->U, r->NH, r->KV, r->Hq, r->Hkv, r->hs, kv};
    return h;
}
#ifdef USE_CUDA
__host__ __device__
#endif
static inline int uly_local_width(UlyHeads h) { return (h.NH + (h.kv ? 2 * h.KV : 0)) * h.hs; }
#ifdef USE_CUDA
__host__ __device__
#endif
static inline int uly_shard_width(UlyHeads h) { return (h.Hq + (h.kv ? 2 * h.Hkv : 0)) * h.hs; }
#ifdef USE_CUDA
__host__ __device__
#endif
static inline int uly_kv0(UlyHeads h, int m) { return m * h.Hq / (h.NH / h.KV); }   // member m's first kv head

// The local row's column that column c of member m's head-shard row holds.
#ifdef USE_CUDA
__host__ __device__
#endif
static inline int uly_col(UlyHeads h, int m, int c) {
    int q = h.Hq * h.hs, kv = h.Hkv * h.hs;
    if (c < q) { return m * q + c; }
    c -= q;
    int k0 = uly_kv0(h, m) * h.hs;
    return c < kv ? h.NH * h.hs + k0 + c : (h.NH + h.KV) * h.hs + k0 + c - kv;
}

// Column L of a local row from the members' head-shard rows (src + m * stride: member m's), rows r: its query
// column from the one member holding it; a k or v column summed over the members holding its kv head (one, or
// U/KV replicas: their gradients), in member order.
#ifdef USE_CUDA
__host__ __device__
#endif
static inline float uly_gather_one(UlyHeads h, const floatX *src, size_t stride, size_t r, int L) {
    int w = uly_shard_width(h), q = h.Hq * h.hs;
    if (L < h.NH * h.hs) { return (float)src[(size_t)(L / q) * stride + r * w + L % q]; }
    int part = L < (h.NH + h.KV) * h.hs ? 0 : 1, off = L - (h.NH + part * h.KV) * h.hs, kh = off / h.hs;
    float s = 0.0f;
    for (int m = 0; m < h.U; m++) {
        int k0 = uly_kv0(h, m);
        if (kh < k0 || kh >= k0 + h.Hkv) { continue; }
        s += (float)src[(size_t)m * stride + r * w + q + part * h.Hkv * h.hs + (kh - k0) * h.hs + off % h.hs];
    }
    return s;
}

#ifdef USE_CUDA
// dst (U, rows, w): member m's head-shard columns of the local rows src (rows, W)
__global__ void uly_select_kernel(floatX *dst, const floatX *src, size_t rows, UlyHeads h) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, w = uly_shard_width(h);
    if (i >= h.U * rows * w) { return; }
    size_t m = i / (rows * w), r = (i / w) % rows;
    dst[i] = src[r * uly_local_width(h) + uly_col(h, (int)m, (int)(i % w))];
}

// dst (rows, W) <- the members' head-shard rows src (U, rows, w)
__global__ void uly_gather_kernel(floatX *dst, const floatX *src, size_t rows, UlyHeads h) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, W = uly_local_width(h);
    if (i >= rows * W) { return; }
    dst[i] = (floatX)uly_gather_one(h, src, rows * uly_shard_width(h), i / W, (int)(i % W));
}

// The rows of member m's T (its two chunks of T/2) <-> rows cp_chunk(m, U, half) T/2 .. of the group's U T:
// to_shard: dst (B, U T, w) from src (U, B, T, w); else the reverse. One thread per element of the (U, B, T, w) side.
__global__ void uly_rows_kernel(floatX *dst, const floatX *src, int B, int T, int U, int w, int to_shard) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = (size_t)U * B * T * w;
    if (i >= n) { return; }
    size_t c = i % w, row = i / w;
    int t = (int)(row % T), b = (int)((row / T) % B), m = (int)(row / ((size_t)T * B)), half = T / 2;
    size_t g = ((size_t)b * U * T + (size_t)cp_chunk(m, U, t / half) * half + t % half) * w + c;
    if (to_shard) { dst[g] = src[i]; } else { dst[i] = src[g]; }
}
#endif

static void uly_select(floatX *dst, const floatX *src, size_t rows, UlyHeads h) {
    size_t w = uly_shard_width(h);
#ifdef USE_CUDA
    size_t n = h.U * rows * w;
    LAUNCH(uly_select_kernel, (unsigned int)ceil_div(n, (size_t)256), 256, 0, main_stream)(dst, src, rows, h);
    cudaCheckLaunch();
#else
    size_t W = uly_local_width(h);
    for (int m = 0; m < h.U; m++) {   // (runs of a head's hs columns)
        for (size_t r = 0; r < rows; r++) {
            for (size_t c = 0; c < w; c += h.hs) {
                memcpy(dst + (m * rows + r) * w + c, src + r * W + uly_col(h, m, (int)c), h.hs * sizeof(float));
            }
        }
    }
#endif
}

static void uly_gather(floatX *dst, const floatX *src, size_t rows, UlyHeads h) {
    size_t W = uly_local_width(h);
#ifdef USE_CUDA
    LAUNCH(uly_gather_kernel, (unsigned int)ceil_div(rows * W, (size_t)256), 256, 0, main_stream)(dst, src, rows, h);
    cudaCheckLaunch();
#else
    size_t stride = rows * uly_shard_width(h), q = (size_t)h.NH * h.hs;
    for (size_t r = 0; r < rows; r++) {   // the query heads by runs of hs; k and v element by element (their sums)
        for (size_t L = 0; L < q; L += h.hs) {
            memcpy(dst + r * W + L, src + (L / (h.Hq * h.hs)) * stride + r * (stride / rows) + L % (h.Hq * h.hs),
                   h.hs * sizeof(float));
        }
        for (size_t L = q; L < W; L++) { dst[r * W + L] = uly_gather_one(h, src, stride, r, (int)L); }
    }
#endif
}

static void uly_rows(floatX *dst, const floatX *src, int B, int T, int U, int w, int to_shard) {
#ifdef USE_CUDA
    size_t n = (size_t)U * B * T * w;
    LAUNCH(uly_rows_kernel, (unsigned int)ceil_div(n, (size_t)256), 256, 0, main_stream)(dst, src, B, T, U, w, to_shard);
    cudaCheckLaunch();
#else
    int half = T / 2;
    for (int m = 0; m < U; m++) {   // (runs of T/2 rows)
        for (int b = 0; b < B; b++) {
            for (int a = 0; a < 2; a++) {
                float *blk = (float *)(to_shard ? src : dst) + (((size_t)m * B + b) * T + (size_t)a * half) * w;
                float *grp = (float *)(to_shard ? dst : src) + ((size_t)b * U * T + (size_t)cp_chunk(m, U, a) * half) * w;
                if (to_shard) { memcpy(grp, blk, (size_t)half * w * sizeof(float)); }
                else { memcpy(blk, grp, (size_t)half * w * sizeof(float)); }
            }
        }
    }
#endif
}

// Equal blocks of n elements within this rank's all-to-all group (cp ranks g U .. g U + U - 1): block m of send to
// member m, block m of recv from member m. One all-to-all over the cp group, in which the other groups' ranks
// exchange nothing with this one (the hybrid: every group's at once).
static void uly_all_to_all(CPRing *r, const floatX *send, floatX *recv, size_t n) {
    int N = r->cp->size, g0 = r->cp->rank / r->U * r->U;
    size_t *a = (size_t *)calloc_check(4 * (size_t)N, sizeof(size_t)), *sc = a, *so = a + N, *rc = a + 2 * N, *ro = a + 3 * N;
    for (int m = 0; m < r->U; m++) { sc[g0 + m] = rc[g0 + m] = n; so[g0 + m] = ro[g0 + m] = m * n; }
    comm_all_to_allv(r->cp, send, sc, so, recv, rc, ro, DT_FLOATX);
    free(a);
}

// local rows src (B, T, W) -> dst (B, U T, w): this member's head shard of the group's tokens in sequence order,
// through a (the members' blocks) and b (received). dst may be src.
static void uly_to_shard(CPRing *r, floatX *dst, const floatX *src, floatX *a, floatX *b, int B, int T, UlyHeads h) {
    size_t rows = (size_t)B * T, w = uly_shard_width(h);
    uly_select(a, src, rows, h);
    uly_all_to_all(r, a, b, rows * w);
    uly_rows(dst, b, B, T, h.U, (int)w, 1);
}

// the reverse: head-shard rows src (B, U T, w) -> the local rows dst (B, T, W), through a and b (src may be b)
static void uly_to_tokens(CPRing *r, floatX *dst, const floatX *src, floatX *a, floatX *b, int B, int T, UlyHeads h) {
    size_t rows = (size_t)B * T, w = uly_shard_width(h);
    uly_rows(a, src, B, T, h.U, (int)w, 0);
    uly_all_to_all(r, a, b, rows * w);
    uly_gather(dst, b, rows, h);
}

// ----------------------------------------------------------------------------
// the model's two calls (cp > 1): the ring, Ulysses or the hybrid, as the layout says

// qkv (B, T, (NH + 2KV) hs) -> out (B, T, NH hs), lse: causal attention of the local queries over the whole sequence
// (T = the local tokens of a sequence, two chunks). The ring: lse (B, NH, T); U > 1: qkv and lse are left holding
// the head shard's (B, U T, (Hq + 2Hkv) hs) and (B, Hq, U T) for the backward.
static void cp_attention_forward(CPRing *r, floatX *out, float *lse, floatX *qkv, int B, int T, int NH, int KV,
                                 int hs) {
    if (r->U == 1) { cp_ring_forward(r, out, lse, qkv, B, T, NH, KV, hs); return; }
    floatX *snd = r->a2a[0], *rcv = r->a2a[1];
    int Tu = r->U * T;
    uly_to_shard(r, qkv, qkv, snd, rcv, B, T, uly_heads(r, 1));
    if (cp_ring_n(r) == 1) { attention_forward(snd, lse, qkv, B, Tu, r->Hq, r->Hkv, hs); }   // the head shard's out
    else { cp_ring_forward(r, snd, lse, qkv, B, Tu, r->Hq, r->Hkv, hs); }
    uly_to_tokens(r, out, snd, rcv, snd, B, T, uly_heads(r, 0));
}

// dout (B, T, NH hs) -> dqkv (B, T, (NH + 2KV) hs) (written), from the forward's qkv, out (local) and lse.
// U > 1: the head shard's out goes to dqkv's space until the last step writes it.
static void cp_attention_backward(CPRing *r, floatX *dqkv, const floatX *dout, floatX *qkv, floatX *out, float *lse,
                                  int B, int T, int NH, int KV, int hs) {
    if (r->U == 1) { cp_ring_backward(r, dqkv, dout, qkv, out, lse, B, T, NH, KV, hs); return; }
    floatX *snd = r->a2a[0], *rcv = r->a2a[1], *outh = dqkv;
    int Tu = r->U * T;
    uly_to_shard(r, outh, out, snd, rcv, B, T, uly_heads(r, 0));
    uly_to_shard(r, snd, dout, snd, rcv, B, T, uly_heads(r, 0));   // the head shard's dout
    if (cp_ring_n(r) == 1) { attention_backward(rcv, snd, qkv, outh, lse, B, Tu, r->Hq, r->Hkv, hs); }
    else { cp_ring_backward(r, rcv, snd, qkv, outh, lse, B, Tu, r->Hq, r->Hkv, hs); }
    uly_to_tokens(r, dqkv, rcv, snd, rcv, B, T, uly_heads(r, 1));
}

#endif
