// Causal multi-head self-attention on the local heads, without storing the (B, NH, T, T)
// attention matrix: forward keeps only the log-sum-exp of each score row, backward recomputes
// the probabilities from it (the FlashAttention recipe, written as plain loops).
// Grouped-query attention: NH query heads share KV <= NH key/value heads (NH % KV == 0), query head h
// reading kv head h / G, G = NH / KV (GPT-2: KV = NH, G = 1; KV = 1: multi-query).
// qkv (B, T, (NH + 2KV) hs): each row is [q heads (NH hs) | k heads (KV hs) | v heads (KV hs)], head h of
// each part in its channels h*hs .. (h+1)*hs (KV = NH: [q | k | v] of 3C, C = NH hs). out (B, T, NH hs).
#ifndef LLMC_ATTENTION_H
#define LLMC_ATTENTION_H

#include "backend.h"
#include "alloc.h"
#include "matmul.h"            // (matmul_setup: the cuBLASLt workspace the attention GEMMs share)
#include "flash_attention.h"
#include "cudnn_attention.h"       // (--attention cudnn: a build with USE_CUDNN=1)
#include "attention_blas.h"        // (the CPU build's: the loops below through BLAS; att_zero_group)

// The CUDA build's attention paths (--attention): cuBLAS, the default (tensor-core GEMMs through an
// (NH, T, T) workspace), flash (flash_attention.h: tensor cores, no (T, T) anywhere; bf16 builds, head
// size 64 or 128, else cuBLAS), tiled (fp32 CUDA cores; the harness's third). The CPU build runs the
// loops below through BLAS (attention_blas.h). Build-independent, so that a memory plan counts what the GPU
// allocates.
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
// ... what path `path` allocates: flash (where it applies) its backward's D (B, NH, T), cuDNN its workspace (what
// its graphs at this shape report, in a run: cudnn_attention.h; the only one that depends on the kv heads)
static size_t attention_workspace_bytes(int path, int B, int T, int NH, int KV, int hs, size_t floatx) {
    if (path == ATT_FLASH && attention_flash_applies(hs, floatx)) { return flash_workspace_bytes(B, T, NH); }
    if (path == ATT_CUDNN && attention_cudnn_applies(hs, floatx)) { return cudnn_workspace_bytes(B, T, NH, KV, hs); }
    return attention_cublas_workspace_bytes(T, NH, floatx);
}

// qkv (B, T, (NH + 2KV) hs) -> out (B, T, NH hs), lse (B, NH, T)
static void attention_forward_cpu(float *out, float *lse, const float *qkv, int B, int T, int NH, int KV, int hs) {
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs;   // the widths of a qkv row, an out row
    int G = NH / KV;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float *p = (float *)malloc_check(sizeof(float) * T);   // one score row
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float *kbase = qkv + (size_t)b * T * W + (NH + h / G) * hs;   // its kv head's k
                const float *vbase = kbase + KV * hs;
                for (int t = 0; t < T; t++) {
                    const float *q = qkv + ((size_t)b * T + t) * W + h * hs;
                    float maxv = -INFINITY;
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float *k = kbase + t2 * W;
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
                        const float *v = vbase + t2 * W;
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

// One query head h of batch index b, added into dqkv: its dq, and its kv head's dk, dv.
static void attention_backward_head_cpu(float *dqkv, const float *dout, const float *qkv, const float *out,
                                        const float *lse, int b, int h, int T, int NH, int KV, int hs) {
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs, kcol = (size_t)(NH + h / (NH / KV)) * hs;
    float scale = 1.0f / sqrtf((float)hs);
    for (int t = 0; t < T; t++) {
        const float *q = qkv + ((size_t)b * T + t) * W + h * hs;
        const float *dy = dout + ((size_t)b * T + t) * C + h * hs;
        const float *y = out + ((size_t)b * T + t) * C + h * hs;
        float *dq = dqkv + ((size_t)b * T + t) * W + h * hs;
        float l = lse[((size_t)b * NH + h) * T + t];
        float D = 0.0f;
        for (int i = 0; i < hs; i++) { D += dy[i] * y[i]; }
        for (int t2 = 0; t2 <= t; t2++) {
            const float *k = qkv + ((size_t)b * T + t2) * W + kcol;
            const float *v = k + KV * hs;
            float *dk = dqkv + ((size_t)b * T + t2) * W + kcol;
            float *dv = dk + KV * hs;
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

// dout (B, T, NH hs) -> dqkv (B, T, (NH + 2KV) hs) (written). p = exp(s - lse); ds = p * (dout.v - dout.out).
// One task per (batch, kv head): its G query heads in order, their sums into its dk, dv in that order.
static void attention_backward_cpu(float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, int B, int T, int NH, int KV, int hs) {
    size_t W = (size_t)(NH + 2 * KV) * hs;
    int G = NH / KV;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int kh = 0; kh < KV; kh++) {
            att_zero_group(dqkv + (size_t)b * T * W, T, NH, KV, hs, kh);
            for (int h = kh * G; h < (kh + 1) * G; h++) {
                attention_backward_head_cpu(dqkv, dout, qkv, out, lse, b, h, T, NH, KV, hs);
            }
        }
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
// The keys and values of positions k0 .. k0 + ATT_TILE - 1 (zeros past T) into shared memory: rows of k and v
// (one kv head's) ld apart.
template <int H4>
__device__ __forceinline__ void att_load_kv_tile(float4 (*ks)[H4], float4 (*vs)[H4], const floatX *k, const floatX *v,
                                                 int k0, int T, size_t ld) {
    for (int i = threadIdx.x; i < ATT_TILE * H4; i += ATT_THREADS) {
        int r = i / H4, d4 = i % H4, tk = k0 + r;
        float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
        if (tk < T) {
            kv = att_load4(k + (size_t)tk * ld + 4 * d4);
            vv = att_load4(v + (size_t)tk * ld + 4 * d4);
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
// qkv (B, T, (NH + 2KV) HS) -> out (B, T, NH HS), lse (B, NH, T). Online softmax over key tiles of ATT_TILE.
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS)
attention_forward_kernel(floatX *out, float *lse, const floatX *qkv, int T, int NH, int KV) {
    constexpr int TPQ = HS / 16, QT = ATT_THREADS / TPQ, H4 = HS / 4;
    __shared__ float4 ks[ATT_TILE][H4], vs[ATT_TILE][H4];
    int h = blockIdx.y, b = blockIdx.z;
    int q0 = (gridDim.x - 1 - blockIdx.x) * QT;            // the longest (latest) query tiles start first
    int part = threadIdx.x % TPQ;
    int t = q0 + threadIdx.x / TPQ;
    int tq = t < T ? t : T - 1;                             // rows past T compute garbage, never stored
    size_t W = (size_t)(NH + 2 * KV) * HS;
    const floatX *base = qkv + (size_t)b * T * W;           // (b, 0): q of head h at h HS, its kv head's k, v after
    const floatX *k = base + (NH + h / (NH / KV)) * HS, *v = k + KV * HS;
    const float scale = 1.0f / sqrtf((float)HS);
    float4 q[4], o[4];
    for (int j = 0; j < 4; j++) {
        q[j] = att_load4(base + (size_t)tq * W + h * HS + 4 * (j * TPQ + part));
        o[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float m = -INFINITY, l = 0.0f;
    int kend = min(T, q0 + QT);
    for (int k0 = 0; k0 < kend; k0 += ATT_TILE) {
        __syncthreads();
        att_load_kv_tile<H4>(ks, vs, k, v, k0, T, W);
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
        floatX *y = out + ((size_t)b * T + t) * NH * HS + h * HS;
        for (int j = 0; j < 4; j++) {
            att_store4(y + 4 * (j * TPQ + part), make_float4(o[j].x * inv, o[j].y * inv, o[j].z * inv, o[j].w * inv));
        }
        if (part == 0) { lse[((size_t)b * NH + h) * T + t] = m + logf(l); }
    }
}

// The queries q0 .. q0 + ATT_TILE - 1 of one query head into shared memory (zeros past T): q (rows ld apart),
// dout and out (rows C apart) -> qs, dos, and D = dout . out (one warp per query), lse -> D_s, lse_s.
template <int HS>
__device__ __forceinline__ void att_load_q_tile(float4 (*qs)[HS / 4], float4 (*dos)[HS / 4], float *D_s, float *lse_s,
                                                const floatX *q, size_t ld, const floatX *dout, const floatX *out,
                                                size_t C, const float *lse, int q0, int T) {
    constexpr int H4 = HS / 4;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int i = threadIdx.x; i < ATT_TILE * H4; i += ATT_THREADS) {
        int r = i / H4, d4 = i % H4, t = q0 + r;
        float4 qv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), dv4 = qv;
        if (t < T) {
            qv = att_load4(q + (size_t)t * ld + 4 * d4);
            dv4 = att_load4(dout + (size_t)t * C + 4 * d4);
        }
        qs[r][d4] = qv;
        dos[r][d4] = dv4;
    }
    for (int r = warp; r < ATT_TILE; r += ATT_THREADS / 32) {
        int t = q0 + r;
        float acc = 0.0f;
        if (t < T) {
            for (int d = lane; d < HS; d += 32) {
                acc += (float)dout[(size_t)t * C + d] * (float)out[(size_t)t * C + d];
            }
        }
        acc = warp_reduce_sum(acc);
        if (lane == 0) { D_s[r] = acc; lse_s[r] = t < T ? lse[t] : 0.0f; }
    }
}

// Backward 1/2: dk, dv. grid (ceil_div(T, KB), KV, B), block = KB keys x TPQ threads. Each group
// keeps its key's k, v in registers and walks, for each of its kv head's G query heads in order, the query
// tiles from its block's first key to T (queries in ascending order: deterministic), with D = dout.out
// recomputed per query tile.
//   p = exp(q.k scale - lse);  dv += p dout;  ds = p (dout.v - D) scale;  dk += ds q
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS)
attention_backward_dkdv_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                               const float *lse, int T, int NH, int KV) {
    constexpr int TPQ = HS / 16, KB = ATT_THREADS / TPQ, H4 = HS / 4;
    __shared__ float4 qs[ATT_TILE][H4], dos[ATT_TILE][H4];
    __shared__ float lse_s[ATT_TILE], D_s[ATT_TILE];
    int kh = blockIdx.y, b = blockIdx.z, G = NH / KV;
    int k_first = (gridDim.x - 1 - blockIdx.x) * KB;        // blocks with few queries to visit start last
    int part = threadIdx.x % TPQ;
    int key = k_first + threadIdx.x / TPQ;
    int tk = key < T ? key : T - 1;
    size_t W = (size_t)(NH + 2 * KV) * HS, C = (size_t)NH * HS;
    const floatX *base = qkv + (size_t)b * T * W, *kbase = base + (NH + kh) * HS;   // k; v at + KV HS
    const float scale = 1.0f / sqrtf((float)HS);
    float4 k[4], v[4], dk[4], dv[4];
    for (int j = 0; j < 4; j++) {
        k[j] = att_load4(kbase + (size_t)tk * W + 4 * (j * TPQ + part));
        v[j] = att_load4(kbase + (size_t)tk * W + KV * HS + 4 * (j * TPQ + part));
        dk[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        dv[j] = dk[j];
    }
    for (int h = kh * G; h < (kh + 1) * G; h++) {
        size_t o = (size_t)b * T * C + h * HS;   // head h's column of batch b's dout, out
        for (int q0 = k_first; q0 < T; q0 += ATT_TILE) {
            __syncthreads();
            att_load_q_tile<HS>(qs, dos, D_s, lse_s, base + h * HS, W, dout + o, out + o, C,
                                lse + ((size_t)b * NH + h) * T, q0, T);
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
    }
    if (key < T) {
        floatX *d = dqkv + ((size_t)b * T + key) * W + (NH + kh) * HS;
        for (int j = 0; j < 4; j++) {
            att_store4(d + 4 * (j * TPQ + part), dk[j]);
            att_store4(d + KV * HS + 4 * (j * TPQ + part), dv[j]);
        }
    }
}

// Backward 2/2: dq. grid (ceil_div(T, QT), NH, B), block = QT queries x TPQ threads; key tiles in
// ascending order.   ds = p (dout.v - D) scale;  dq += ds k
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS)
attention_backward_dq_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out, const float *lse,
                             int T, int NH, int KV) {
    constexpr int TPQ = HS / 16, QT = ATT_THREADS / TPQ, H4 = HS / 4;
    __shared__ float4 ks[ATT_TILE][H4], vs[ATT_TILE][H4];
    int h = blockIdx.y, b = blockIdx.z;
    int q0 = (gridDim.x - 1 - blockIdx.x) * QT;
    int part = threadIdx.x % TPQ;
    int t = q0 + threadIdx.x / TPQ;
    int tq = t < T ? t : T - 1;
    size_t W = (size_t)(NH + 2 * KV) * HS, C = (size_t)NH * HS;
    const floatX *base = qkv + (size_t)b * T * W;
    const floatX *k = base + (NH + h / (NH / KV)) * HS, *v = k + KV * HS;   // its kv head's
    const float scale = 1.0f / sqrtf((float)HS);
    float4 q[4], dy[4], dq[4];
    float D = 0.0f;
    for (int j = 0; j < 4; j++) {
        size_t off = 4 * (j * TPQ + part);
        q[j] = att_load4(base + (size_t)tq * W + h * HS + off);
        dy[j] = att_load4(dout + ((size_t)b * T + tq) * C + h * HS + off);
        D += att_dot4(dy[j], att_load4(out + ((size_t)b * T + tq) * C + h * HS + off));
        dq[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    D = att_group_sum<TPQ>(D);
    float l = lse[((size_t)b * NH + h) * T + tq];
    int kend = min(T, q0 + QT);
    for (int k0 = 0; k0 < kend; k0 += ATT_TILE) {
        __syncthreads();
        att_load_kv_tile<H4>(ks, vs, k, v, k0, T, W);
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
        floatX *d = dqkv + ((size_t)b * T + t) * W + h * HS;
        for (int j = 0; j < 4; j++) { att_store4(d + 4 * (j * TPQ + part), dq[j]); }
    }
}

// The shape the CUDA kernels take: KV kv heads shared by NH query heads (NH % KV == 0), head size 16, 32, 64 or
// 128. Returns hs.
static int attention_head_size(int NH, int KV, int hs) {
    if (KV <= 0 || NH % KV != 0) { fail("attention: NH=%d query heads do not share KV=%d kv heads evenly", NH, KV); }
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128) {
        fail("attention: head size %d is not supported by the CUDA kernels (16, 32, 64 or 128)", hs);
    }
    return hs;
}

template <int HS>
static void attention_forward_launch(floatX *out, float *lse, const floatX *qkv, int B, int T, int NH, int KV) {
    constexpr int QT = ATT_THREADS / (HS / 16);
    dim3 grid(ceil_div(T, QT), NH, B);
    LAUNCH(attention_forward_kernel<HS>, grid, ATT_THREADS, 0, main_stream)(out, lse, qkv, T, NH, KV);
    cudaCheckLaunch();
}

template <int HS>
static void attention_backward_launch(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                                      const float *lse, int B, int T, int NH, int KV) {
    constexpr int R = ATT_THREADS / (HS / 16);   // keys (dk/dv) or queries (dq) per block
    LAUNCH(attention_backward_dkdv_kernel<HS>, dim3(ceil_div(T, R), KV, B), ATT_THREADS, 0, main_stream)(
        dqkv, dout, qkv, out, lse, T, NH, KV);
    cudaCheckLaunch();
    LAUNCH(attention_backward_dq_kernel<HS>, dim3(ceil_div(T, R), NH, B), ATT_THREADS, 0, main_stream)(
        dqkv, dout, qkv, out, lse, T, NH, KV);
    cudaCheckLaunch();
}

// ---- cuBLAS path (the default) ----------------------------------------------------------------
// Tensor cores through cuBLAS: for one batch index b at a time (host loop), the (NH, T, T) score
// matrices of all heads live in a workspace (never kept across layers or batch indices):
//   forward:  S = Q K^T (GEMM, fp32 out) -> kernel: causal mask, scale, softmax -> P (floatX), lse
//             Y = P V (GEMM) into out
//   backward: S = Q K^T, dP = dY V^T (GEMMs, fp32 out) -> kernel: D = dY.Y, P = exp(S scale - lse),
//             dS = P (dP - D) scale (both floatX, zero above the diagonal)
//             dV = P^T dY, dQ = dS K, dK = dS^T Q (GEMMs into dqkv; dK, dV summed over a kv head's G
//             query heads with beta = 1, each partial sum stored in floatX)
// The GEMMs compute the full T x T (the masked half comes out of the kernels as exact zeros).

#if defined(ENABLE_FP32)
#define ATT_CUDA_X CUDA_R_32F      // the cudaDataType of floatX
#else
#define ATT_CUDA_X CUDA_R_16BF
#endif
#define ATT_ROWS_PER_BLOCK 8        // row kernels: one warp per (head, query) row, 8 warps per block
#define ATT_ROW_THREADS (32 * ATT_ROWS_PER_BLOCK)

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

// One operand of the per-head GEMMs of one batch index: head 0's matrix at p (type `type`, leading dimension
// ld), head i's `head` elements further; of the query heads (query = 1: Q, dY, Y, dQ and the (T, T) S, P, dP, dS)
// or of the kv heads (query = 0: K, V, dK, dV).
typedef struct { const void *p; cudaDataType type; int ld; long long head; int query; } AttMat;

// Where the g-th GEMM's batch 0 is (query heads: head g; kv heads: head 0), and its batch stride (G heads; one)
static const void *att_mat_at(AttMat x, int g) {
    size_t bytes = x.type == CUDA_R_32F ? sizeof(float) : sizeof(floatX);
    return (const char *)x.p + (x.query ? g * x.head : 0) * bytes;
}
static long long att_mat_stride(AttMat x, int G) { return x.query ? G * x.head : x.head; }

// Column-major (cuBLAS) GEMMs of every query head h, fp32 accumulation: C_h (m, n) = op(A_h) (m, k) op(B_h) (k, n),
// an operand of the kv heads taken at h's kv head. G = NH / KV strided-batched GEMMs, the g-th over the KV
// groups (batch i: query head i G + g, kv head i). A query-head C is written (beta = 0); a kv-head C sums its G
// query heads' products in order (beta = 1 after the first: deterministic; each partial sum stored as floatX).
static void att_gemm_heads(cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k, AttMat A, AttMat B,
                           AttMat Cm, int NH, int KV) {
    int G = NH / KV;
    const float alpha = 1.0f, zero = 0.0f, one = 1.0f;
    for (int g = 0; g < G; g++) {
        const float *beta = !Cm.query && g > 0 ? &one : &zero;
        cublasCheck(cublasGemmStridedBatchedEx(att_cublas_handle, opa, opb, m, n, k, &alpha,
                                               att_mat_at(A, g), A.type, A.ld, att_mat_stride(A, G),
                                               att_mat_at(B, g), B.type, B.ld, att_mat_stride(B, G), beta,
                                               (void *)att_mat_at(Cm, g), Cm.type, Cm.ld, att_mat_stride(Cm, G), KV,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

// Row-major (T, T) matrices of one head, stored with row stride T, are, seen column-major, their
// transposes: buffer X with X[t][t2] at t*T + t2 is the column-major (T, T) matrix Xc, Xc(t2, t) = X[t][t2].
// A head's Q (T, hs) rows at q + t*W (row stride W = (NH + 2KV) hs) is the column-major (hs, T) Qc, ld W;
// heads are hs apart. Likewise K, V (ld W, kv heads) and dY, Y (ld C = NH hs).
//
// S[t][t2] = sum_i Q[t][i] K[t2][i]   ->  Sc (T, T) = Kc^T Qc:      A = K (op T, lda W), B = Q (op N, ldb W),
//                                          m = n = T, k = hs; C = S (ldc T, heads T*T apart)
// dP[t][t2] = sum_i dY[t][i] V[t2][i] ->  dPc = Vc^T dYc:           A = V (op T, lda W), B = dY (op N, ldb C)
static void att_gemm_scores(float *S, const floatX *kv, const floatX *qdy, int ld_qdy, int T, int NH, int KV, int hs) {
    AttMat A = {kv, ATT_CUDA_X, (NH + 2 * KV) * hs, hs, 0}, B = {qdy, ATT_CUDA_X, ld_qdy, hs, 1};
    AttMat Sm = {S, CUDA_R_32F, T, (long long)T * T, 1};
    att_gemm_heads(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, A, B, Sm, NH, KV);
}

// P (floatX), lse from S: causal mask, scale, softmax. grid (ceil_div(T, ATT_ROWS_PER_BLOCK), NH),
// block 32 * ATT_ROWS_PER_BLOCK; warp w of block x owns query t = x * ATT_ROWS_PER_BLOCK + w of head
// blockIdx.y. S, P: (NH, T, T) of one batch index; lse: (NH, T) of that batch index.
// lse = max + log(sum_{t2 <= t} exp(s scale - max)), P = exp(s scale - max) / sum, 0 for t2 > t.
__global__ void __launch_bounds__(ATT_ROW_THREADS)
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
__global__ void __launch_bounds__(ATT_ROW_THREADS)
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

// Y[t][i] = sum_t2 P[t][t2] V[t2][i]  ->  Yc (hs, T) = Vc Pc:        A = V (op N, lda W), B = P (op N, ldb T),
//                                          m = hs, n = T, k = T; C = out + h*hs (ldc C, heads hs apart)
static void attention_forward_cublas(floatX *out, float *lse, const floatX *qkv, int B, int T, int NH, int KV, int hs) {
    float scale = 1.0f / sqrtf((float)hs);
    att_cublas_setup(T, NH);
    int W = (NH + 2 * KV) * hs, C = NH * hs;
    dim3 grid(ceil_div(T, ATT_ROWS_PER_BLOCK), NH);
    for (int b = 0; b < B; b++) {
        const floatX *q = qkv + (size_t)b * T * W, *k = q + NH * hs, *v = k + KV * hs;
        att_gemm_scores(att_ws_S, k, q, W, T, NH, KV, hs);
        LAUNCH(attention_softmax_forward_kernel, grid, ATT_ROW_THREADS, 0, main_stream)(
            att_ws_P, lse + (size_t)b * NH * T, att_ws_S, T, scale);
        cudaCheckLaunch();
        AttMat Vm = {v, ATT_CUDA_X, W, hs, 0}, P = {att_ws_P, ATT_CUDA_X, T, (long long)T * T, 1};
        AttMat Y = {out + (size_t)b * T * C, ATT_CUDA_X, C, hs, 1};
        att_gemm_heads(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, Vm, P, Y, NH, KV);
    }
}

// dV[t2][i] = sum_t P[t][t2] dY[t][i]   ->  dVc (hs, T) = dYc Pc^T:  A = dY (op N, lda C), B = P (op T, ldb T)
// dQ[t][i]  = sum_t2 dS[t][t2] K[t2][i] ->  dQc (hs, T) = Kc dSc:    A = K (op N, lda W), B = dS (op N, ldb T)
// dK[t2][i] = sum_t dS[t][t2] Q[t][i]   ->  dKc (hs, T) = Qc dSc^T:  A = Q (op N, lda W), B = dS (op T, ldb T)
// all m = hs, n = T, k = T; C = dqkv q/k/v part + head * hs (ldc W); dK, dV summed over a group's query heads
static void attention_backward_cublas(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                                      const float *lse, int B, int T, int NH, int KV, int hs) {
    float scale = 1.0f / sqrtf((float)hs);
    att_cublas_setup(T, NH);
    int W = (NH + 2 * KV) * hs, C = NH * hs;
    long long TT = (long long)T * T;
    dim3 grid(ceil_div(T, ATT_ROWS_PER_BLOCK), NH);
    AttMat P = {att_ws_P, ATT_CUDA_X, T, TT, 1}, dS = {att_ws_dS, ATT_CUDA_X, T, TT, 1};
    for (int b = 0; b < B; b++) {
        const floatX *q = qkv + (size_t)b * T * W, *k = q + NH * hs, *v = k + KV * hs;
        const floatX *dy = dout + (size_t)b * T * C, *y = out + (size_t)b * T * C;
        floatX *dq = dqkv + (size_t)b * T * W, *dk = dq + NH * hs, *dv = dk + KV * hs;
        att_gemm_scores(att_ws_S, k, q, W, T, NH, KV, hs);
        att_gemm_scores(att_ws_dP, v, dy, C, T, NH, KV, hs);
        LAUNCH(attention_softmax_backward_kernel, grid, ATT_ROW_THREADS, 0, main_stream)(
            att_ws_P, att_ws_dS, att_ws_S, att_ws_dP, lse + (size_t)b * NH * T, dy, y, T, C, hs, scale);
        cudaCheckLaunch();
        AttMat Qm = {q, ATT_CUDA_X, W, hs, 1}, Km = {k, ATT_CUDA_X, W, hs, 0}, dY = {dy, ATT_CUDA_X, C, hs, 1};
        AttMat dQ = {dq, ATT_CUDA_X, W, hs, 1}, dK = {dk, ATT_CUDA_X, W, hs, 0}, dV = {dv, ATT_CUDA_X, W, hs, 0};
        att_gemm_heads(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, dY, P, dV, NH, KV);
        att_gemm_heads(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, Km, dS, dQ, NH, KV);
        att_gemm_heads(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, Qm, dS, dK, NH, KV);
    }
}
// ---- end of the cuBLAS path -------------------------------------------------------------------

// the path a call takes: attention_path, flash and cuDNN only where they apply
static int attention_path_for(int hs) {
    if (attention_path == ATT_FLASH && !attention_flash_applies(hs, sizeof(floatX))) { return ATT_CUBLAS; }
    if (attention_path == ATT_CUDNN && !attention_cudnn_applies(hs, sizeof(floatX))) { return ATT_CUBLAS; }
    return attention_path;
}

static void attention_forward_cuda(floatX *out, float *lse, const floatX *qkv, int B, int T, int NH, int KV, int hs) {
    if (B <= 0 || T <= 0) { return; }
    int path = attention_path_for(attention_head_size(NH, KV, hs));
#if !defined(ENABLE_FP32)
    if (path == ATT_FLASH) {
        if (hs == 64) {
            flash_forward_launch<64>(out, lse, qkv, B, T, NH, KV);
        } else {
            flash_forward_launch<128>(out, lse, qkv, B, T, NH, KV);
        }
        return;
    }
#endif
#if defined(USE_CUDNN) && !defined(ENABLE_FP32)
    if (path == ATT_CUDNN) { attention_forward_cudnn(out, lse, qkv, B, T, NH, KV, hs); return; }
#endif
    if (path == ATT_CUBLAS) { attention_forward_cublas(out, lse, qkv, B, T, NH, KV, hs); return; }
    switch (hs) {
        case 16: attention_forward_launch<16>(out, lse, qkv, B, T, NH, KV); break;
        case 32: attention_forward_launch<32>(out, lse, qkv, B, T, NH, KV); break;
        case 64: attention_forward_launch<64>(out, lse, qkv, B, T, NH, KV); break;
        default: attention_forward_launch<128>(out, lse, qkv, B, T, NH, KV); break;
    }
}

static void attention_backward_cuda(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                                    const float *lse, int B, int T, int NH, int KV, int hs) {
    if (B <= 0 || T <= 0) { return; }
    int path = attention_path_for(attention_head_size(NH, KV, hs));
#if !defined(ENABLE_FP32)
    if (path == ATT_FLASH) {
        if (hs == 64) { flash_backward_launch<64>(dqkv, dout, qkv, out, lse, B, T, NH, KV); }
        else { flash_backward_launch<128>(dqkv, dout, qkv, out, lse, B, T, NH, KV); }
        return;
    }
#endif
#if defined(USE_CUDNN) && !defined(ENABLE_FP32)
    if (path == ATT_CUDNN) { attention_backward_cudnn(dqkv, dout, qkv, out, lse, B, T, NH, KV, hs); return; }
#endif
    if (path == ATT_CUBLAS) { attention_backward_cublas(dqkv, dout, qkv, out, lse, B, T, NH, KV, hs); return; }
    switch (hs) {
        case 16: attention_backward_launch<16>(dqkv, dout, qkv, out, lse, B, T, NH, KV); break;
        case 32: attention_backward_launch<32>(dqkv, dout, qkv, out, lse, B, T, NH, KV); break;
        case 64: attention_backward_launch<64>(dqkv, dout, qkv, out, lse, B, T, NH, KV); break;
        default: attention_backward_launch<128>(dqkv, dout, qkv, out, lse, B, T, NH, KV); break;
    }
}
#endif

// Set-up: the workspace of the largest batch B x T the attention will see (the cuBLAS path's (NH, T, T)
// panels, flash's D (B, NH, T), cuDNN's workspace and graphs; the CPU needs none).
static void attention_setup(int B, int T, int NH, int KV, int hs) {
#ifdef USE_CUDA
    int path = attention_path_for(attention_head_size(NH, KV, hs));
    if (path == ATT_CUBLAS) { att_cublas_setup(T, NH); }
    (void)B;   // (the fp32 build has neither flash nor cuDNN)
#if !defined(ENABLE_FP32)
    if (path == ATT_FLASH) { flash_setup(B, T, NH); }
#endif
#if defined(USE_CUDNN) && !defined(ENABLE_FP32)
    if (path == ATT_CUDNN) { cudnn_attention_setup(B, T, NH, KV, hs); }
#endif
#else
    (void)B; (void)T; (void)NH; (void)KV; (void)hs;
#endif
}

// qkv (B, T, (NH + 2KV) hs) -> out (B, T, NH hs), lse (B, NH, T)
static void attention_forward(floatX *out, float *lse, const floatX *qkv, int B, int T, int NH, int KV, int hs) {
#ifdef USE_CUDA
    attention_forward_cuda(out, lse, qkv, B, T, NH, KV, hs);
#else
    attention_forward_blas(out, lse, qkv, B, T, NH, KV, hs);
#endif
}

// dout (B, T, NH hs) -> dqkv (B, T, (NH + 2KV) hs) (written), from the forward's qkv, out, lse
static void attention_backward(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                               const float *lse, int B, int T, int NH, int KV, int hs) {
#ifdef USE_CUDA
    attention_backward_cuda(dqkv, dout, qkv, out, lse, B, T, NH, KV, hs);
#else
    attention_backward_blas(dqkv, dout, qkv, out, lse, B, T, NH, KV, hs);
#endif
}

#endif
