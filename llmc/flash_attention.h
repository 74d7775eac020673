// Causal flash attention on the tensor cores, forward and backward (bf16 builds, head size 64 or 128).
// attention_forward_cpu and attention_backward_cpu are the specification; this is the same math tiled so
// that the (T, T) scores never reach global memory (FlashAttention-2's order):
// Grouped-query attention (attention.h): query head h reads kv head h / G, G = NH / KV.
//   forward (block = 64 query rows of one (b, h), 4 warps of 16 rows; key tiles of 64 up to the diagonal,
//            the tiles above it skipped):  S = Q K^T, causal mask, online softmax (running max m and sum l
//            per row, O rescaled by exp(m_old - m_new)), O += P V;  out = O / l, lse = m + log l
//   backward (D = dY.Y per query row, p = exp(s scale - lse), ds = p (dp - D) scale, as the CPU loop):
//            D kernel:     D of every query row, once, into a (B, NH, T) fp32 buffer both kernels read
//            dK/dV kernel: block = 64 keys of one kv head, for each of its G query heads in order the query
//                          tiles from the diagonal down; each warp accumulates dV += P^T dY and dK += dS^T Q
//                          for its 16 keys
//            dQ kernel:    block = 64 queries, the key tiles up to the diagonal: dQ += dS K
//            Every output element is summed by one thread in a fixed order: deterministic, no atomics.
// The causal and length masks apply on the edge tiles only (the diagonal tile, and tiles reaching past T);
// exponentials are exp2 with log2(e) folded into the softmax scale (scores and lse kept in base 2 inside).
// The products are mma.sync m16n8k16 (bf16 operands, fp32 accumulation) on register fragments, so S, P
// and O never leave the registers: a lane holds rows g = lane/4 and g + 8 of its warp's 16, columns
// 2t, 2t + 1 (t = lane % 4) of each 8-wide tile (PTX ISA, "Matrix Fragments for mma.m16n8k16"); a row's
// max and sum are finished over the 4 lanes that share it. An S tile in accumulator layout is already
// the A operand of the next product (P V, dS K, ...), two 8-wide tiles per 16-wide k step. Operands come
// from shared memory by ldmatrix (four 8 x 8 matrices per instruction; .trans for the B operand of P V,
// dS K, ... whose k runs down the tile's rows); tile rows are HS + 8 elements apart, so the 8 rows of a
// matrix fall in 8 distinct groups of 4 banks.
// The kernel bodies are __host__ __device__ functions of the thread's indices: on the GPU the warp
// operations (fa_mma, fa_shfl_xor, fa_sync, fa_ldmatrix_x4) are the hardware's; dev/cuda/flash_replay.cu runs
// the same bodies on CPU threads with those four emulated from the PTX layouts, against the CPU loops.
#ifndef LLMC_FLASH_ATTENTION_H
#define LLMC_FLASH_ATTENTION_H

#include <stddef.h>

// The backward's workspace: D (B, NH, T) fp32 (in every build: a memory plan counts what the GPU allocates)
static size_t flash_workspace_bytes(int B, int T, int NH) { return ((size_t)B * NH * T * sizeof(float) + 255) / 256 * 256; }

#if defined(USE_CUDA) && !defined(ENABLE_FP32)
#include <stdint.h>
#include <string.h>

#define FA_TILE 64                 // query rows per block = keys per tile
#define FA_WARPS 4                 // 16 rows each
#define FA_THREADS (32 * FA_WARPS)
#define FA_LOG2E 1.4426950408889634f   // exp(x) = exp2(x log2 e)

// The warp operations of a host compile: the emulated device's (FA_HOST_OPS, llmc/emu/threads.h), or the CPU
// replay's (set by dev/cuda/flash_replay.cu). nvcc's device code runs the PTX instead.
typedef struct {
    void (*mma)(float c[4], const uint32_t a[4], const uint32_t b[2]);
    float (*shfl_xor)(float v, int mask);
    void (*sync)(void);
    void (*ldmatrix)(uint32_t r[4], const void *row, int trans);
    void (*cp_async)(void *dst, const void *src, int bytes);   // bytes 16, or 0: zeros
    void (*cp_commit)(void);
    void (*cp_wait)(int pending);
} FaHostOps;
#ifndef FA_HOST_OPS
#define FA_HOST_OPS {}
#endif
static FaHostOps fa_host_ops = FA_HOST_OPS;

// c (16 x 8, fp32) += A (16 x 16, bf16, row) B (16 x 8, bf16, col): lane (g, t) holds a = {A[g][2t..], A[g+8][2t..],
// A[g][2t+8..], A[g+8][2t+8..]}, b = {B[2t..][g], B[2t+8..][g]}, c = {C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]}
__host__ __device__ inline void fa_mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef __CUDA_ARCH__
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    fa_host_ops.mma(c, a, b);
#endif
}
__host__ __device__ inline float fa_shfl_xor(float v, int mask) {
#ifdef __CUDA_ARCH__
    return __shfl_xor_sync(0xffffffffu, v, mask);
#else
    return fa_host_ops.shfl_xor(v, mask);
#endif
}
__host__ __device__ inline void fa_sync(void) {
#ifdef __CUDA_ARCH__
    __syncthreads();
#else
    fa_host_ops.sync();
#endif
}

// r[j] (j < 4) = 8 x 8 bf16 matrix j, from shared memory: lane l gives the address of row l % 8 of matrix l / 8
// (16 contiguous bytes, 16-byte aligned); lane (g, t) = (l / 4, l % 4) receives row g, columns 2t, 2t + 1 of each
// matrix, or with trans column g, rows 2t, 2t + 1 (PTX ISA, "ldmatrix": the fragment of an mma operand).
__host__ __device__ inline void fa_ldmatrix_x4(uint32_t r[4], const floatX *row, int trans) {
#ifdef __CUDA_ARCH__
    unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    if (trans) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    }
#else
    fa_host_ops.ldmatrix(r, row, trans);
#endif
}

// Asynchronous copies global -> shared (PTX "cp.async"): 16 bytes, or zeros when src_bytes is 0; commit closes
// this thread's group of copies issued since the last commit; wait(N) returns once all but this thread's
// newest N groups have landed (then a barrier makes every thread's copies visible to the block).
__host__ __device__ inline void fa_cp_async16(floatX *dst, const floatX *src, int src_bytes) {
#ifdef __CUDA_ARCH__
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d), "l"(src), "r"(src_bytes));
#else
    fa_host_ops.cp_async(dst, src, src_bytes);
#endif
}
__host__ __device__ inline void fa_cp_commit(void) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;");
#else
    fa_host_ops.cp_commit();
#endif
}
template <int N>
__host__ __device__ inline void fa_cp_wait(void) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;" :: "n"(N));
#else
    fa_host_ops.cp_wait(N);
#endif
}

// two bf16 as one 32-bit register, the first in the low half
__host__ __device__ inline uint32_t fa_bits2(floatX lo, floatX hi) {
    uint16_t a, b;
    memcpy(&a, &lo, 2);
    memcpy(&b, &hi, 2);
    return (uint32_t)a | ((uint32_t)b << 16);
}
__host__ __device__ inline uint32_t fa_pack(float lo, float hi) { return fa_bits2((floatX)lo, (floatX)hi); }

// rows r0 .. r0 + 63 of a (T, ld) bf16 matrix (HS columns from src) -> dst (64, HS + 8); zeros past T
template <int HS>
__host__ __device__ inline void fa_load_tile(floatX *dst, const floatX *src, int r0, int T, size_t ld, int tid) {
    constexpr int CHUNKS = HS / 8;   // 16-byte chunks per row
    for (int i = tid; i < FA_TILE * CHUNKS; i += FA_THREADS) {
        int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        int4 v = make_int4(0, 0, 0, 0);
        if (r0 + r < T) { v = *(const int4 *)(src + (size_t)(r0 + r) * ld + c); }
        *(int4 *)(dst + r * (HS + 8) + c) = v;
    }
}

// ... the same copies issued asynchronously (fa_cp_async16), not waited for
template <int HS>
__host__ __device__ inline void fa_load_tile_async(floatX *dst, const floatX *src, int r0, int T, size_t ld, int tid) {
    constexpr int CHUNKS = HS / 8;
    for (int i = tid; i < FA_TILE * CHUNKS; i += FA_THREADS) {
        int r = i / CHUNKS, c = (i % CHUNKS) * 8, in = r0 + r < T;
        fa_cp_async16(dst + r * (HS + 8) + c, src + (size_t)(in ? r0 + r : 0) * ld + c, in ? 16 : 0);
    }
}

// Double-buffered K, V tiles (keys 64 kt .. 64 kt + 63 of rows k, v (ld, nk rows) in buffer kt % 2): kv points at
// K0, V0, K1, V1. fa_kv_first issues tile 0; fa_kv_next(kt, last) issues tile kt + 1 (when kt < last) into the
// other buffer, waits for tile kt and returns it, the copies overlapping the compute on tile kt - 1 ... kt.
// The caller's fa_sync after its compute frees the buffer the next call refills.
template <int HS>
__host__ __device__ inline void fa_kv_first(floatX *kv, const floatX *k, const floatX *v, size_t ld, int nk, int tid) {
    fa_load_tile_async<HS>(kv, k, 0, nk, ld, tid);
    fa_load_tile_async<HS>(kv + FA_TILE * (HS + 8), v, 0, nk, ld, tid);
    fa_cp_commit();
}
template <int HS>
__host__ __device__ inline floatX *fa_kv_next(floatX *kv, const floatX *k, const floatX *v, size_t ld, int nk, int kt,
                                              int last, int tid) {
    constexpr int TILE = FA_TILE * (HS + 8);
    if (kt < last) {
        floatX *next = kv + ((kt + 1) % 2) * 2 * TILE;
        fa_load_tile_async<HS>(next, k, (kt + 1) * FA_TILE, nk, ld, tid);
        fa_load_tile_async<HS>(next + TILE, v, (kt + 1) * FA_TILE, nk, ld, tid);
    }
    fa_cp_commit();   // (an empty group past the last tile: the wait below counts groups)
    fa_cp_wait<1>();  // tile kt's copies (all but the newest group) have landed
    fa_sync();        // ... every thread's
    return kv + (kt % 2) * 2 * TILE;
}

// The row this lane addresses in an ldmatrix x4 of a (64, HS + 8) tile whose four 8 x 8 matrices start at row
// r0 + 8 * (m & 1) and column c0 + 8 * (m >> 1), m = lane / 8: the A fragment of the 16 x 16 block at (r0, c0);
// as the B fragments of X^T (B[k][n] = X[n][k]) the same matrices are the 16 x 8 blocks of n at r0 and r0 + 8
// (registers 0, 2 and 1, 3); with trans, the B fragments of X (16 x 8 blocks of k at c0 and c0 + 8).
template <int HS>
__host__ __device__ inline const floatX *fa_ldm_row(const floatX *tile, int r0, int c0, int lane) {
    int m = lane / 8;
    return tile + (r0 + lane % 8 + 8 * (m & 1)) * (HS + 8) + c0 + 8 * (m >> 1);
}

// the A fragments (16 rows from row0 of a (64, HS + 8) tile) for the HS / 16 k steps over its columns
template <int HS>
__host__ __device__ inline void fa_a_rows(uint32_t a[][4], const floatX *tile, int row0, int lane) {
    for (int kk = 0; kk < HS / 16; kk++) { fa_ldmatrix_x4(a[kk], fa_ldm_row<HS>(tile, row0, kk * 16, lane), 0); }
}

// s[j] (16 x 8: the warp's rows against rows 8j .. 8j + 7 of tile X) = A X^T over the HS columns
template <int HS>
__host__ __device__ inline void fa_scores(float s[FA_TILE / 8][4], const uint32_t a[][4], const floatX *X, int lane) {
    for (int j = 0; j < FA_TILE / 8; j++) { s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f; }
    for (int kk = 0; kk < HS / 16; kk++) {
        for (int j = 0; j < FA_TILE / 8; j += 2) {   // B = X^T for rows 8j .. 8j + 15 of X: two n blocks
            uint32_t r[4];
            fa_ldmatrix_x4(r, fa_ldm_row<HS>(X, j * 8, kk * 16, lane), 0);
            uint32_t b0[2] = {r[0], r[2]}, b1[2] = {r[1], r[3]};
            fa_mma(s[j], a[kk], b0);
            fa_mma(s[j + 1], a[kk], b1);
        }
    }
}

// acc[n] (16 x 8: dims 8n .. 8n + 7) += P (16 x 64, accumulator layout, rounded to bf16) times tile X (64 x HS)
template <int HS>
__host__ __device__ inline void fa_accumulate(float acc[HS / 8][4], float p[FA_TILE / 8][4], const floatX *X,
                                              int lane) {
    for (int kk = 0; kk < FA_TILE / 16; kk++) {
        uint32_t a[4] = {fa_pack(p[2 * kk][0], p[2 * kk][1]), fa_pack(p[2 * kk][2], p[2 * kk][3]),
                         fa_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), fa_pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        for (int n = 0; n < HS / 8; n += 2) {   // B = X (rows 16kk .., columns 8n ..): transposed loads, two n blocks
            uint32_t r[4];
            fa_ldmatrix_x4(r, fa_ldm_row<HS>(X, kk * 16, n * 8, lane), 1);
            uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            fa_mma(acc[n], a, b0);
            fa_mma(acc[n + 1], a, b1);
        }
    }
}

// D[q] = dY.Y of query row q of head h (dy, y (B, T, NH HS) at the head's columns) -> D (B, NH, T): one thread
// per row
template <int HS>
__host__ __device__ inline void flash_row_dot_body(float *D, const floatX *dout, const floatX *out, int b, int h, int q,
                                                   int T, int NH) {
    if (q >= T) { return; }
    size_t C = (size_t)NH * HS;
    const floatX *dy = dout + ((size_t)b * T + q) * C + h * HS, *y = out + ((size_t)b * T + q) * C + h * HS;
    float d = 0.0f;
    for (int c = 0; c < HS; c += 8) {   // 16-byte loads
        int4 u = *(const int4 *)(dy + c), v = *(const int4 *)(y + c);
        floatX a[8], e[8];
        memcpy((void *)a, &u, 16);   // (memcpy: no aliasing through another type; registers on the GPU)
        memcpy((void *)e, &v, 16);
        for (int k = 0; k < 8; k++) { d += (float)a[k] * (float)e[k]; }
    }
    D[((size_t)b * NH + h) * T + q] = d;
}

// D and lse (in base 2: lse log2 e) of query rows q0 .. q0 + 63 -> Ds, Ls (0 past T)
__host__ __device__ inline void fa_row_stats(float *Ds, float *Ls, const float *D, const float *lse, int q0, int T,
                                             int tid) {
    if (tid < FA_TILE) {
        int q = q0 + tid;
        Ds[tid] = q < T ? D[q] : 0.0f;
        Ls[tid] = q < T ? lse[q] * FA_LOG2E : 0.0f;
    }
}

// a warp's accumulators (16 x HS) -> rows row0 + g, row0 + g + 8 of dst (ld), rows >= n skipped; add: added to
// what dst holds (each element is one thread's)
template <int HS>
__host__ __device__ inline void fa_store_rows(floatX *dst, float acc[HS / 8][4], int row0, int n, size_t ld, int g,
                                              int t, int add) {
    for (int i = 0; i < 2; i++) {
        int r = row0 + g + 8 * i;
        if (r >= n) { continue; }
        for (int c = 0; c < HS / 8; c++) {
            floatX *x = dst + (size_t)r * ld + c * 8 + 2 * t;
            x[0] = (floatX)(acc[c][2 * i] + (add ? (float)x[0] : 0.0f));
            x[1] = (floatX)(acc[c][2 * i + 1] + (add ? (float)x[1] : 0.0f));
        }
    }
}

// shared memory, tiles of (64, HS + 8): forward Q and two K, V; dK/dV Q, dY, K, V and D, lse (64); dQ Q, dY and
// two K, V and D, lse
template <int HS> static size_t fa_forward_smem(void) { return 5 * FA_TILE * (HS + 8) * sizeof(floatX); }
template <int HS> static size_t fa_dkdv_smem(void) {
    return 4 * FA_TILE * (HS + 8) * sizeof(floatX) + 2 * FA_TILE * sizeof(float);
}
template <int HS> static size_t fa_dq_smem(void) {
    return 6 * FA_TILE * (HS + 8) * sizeof(floatX) + 2 * FA_TILE * sizeof(float);
}

// One attention problem of the flash bodies, per (batch b, query head h): queries rows [0, nq) of q, keys and values
// rows [0, nk) of k, v (head h at column h HS of q, its kv head h / (NH / KV) at that head's column of k and v; rows
// ld apart, batches bs apart); causal: key j is visible to query i iff j <= i (the same positions: the one-device
// attention, a ring block of one chunk), else every key is (a ring block of an earlier chunk). Results: out rows
// (ld out_ld), lse and D at row lse_off + i of (B, NH, lse_T); merge: (out, lse) hold the attention over other
// keys, merged with this (the ring's log-sum-exp merge); dq, dk, dv rows, added to what they hold when add.
typedef struct {
    const floatX *q, *k, *v;
    size_t q_ld, q_bs, kv_ld, kv_bs;
    int nq, nk, causal, NH, KV;
    floatX *out; size_t out_ld, out_bs;   // forward out; the backward's dout and the D kernel's out share the layout
    float *lse; int lse_T, lse_off, merge;
    const floatX *dout; const float *D;
    floatX *dq, *dk, *dv; size_t dq_ld, dq_bs, dkv_ld, dkv_bs; int add;
} FaArgs;

// The one-device attention: qkv (B, T, (NH + 2KV) hs) -> out (B, T, NH hs), lse (B, NH, T); the backward's dqkv,
// dout, D.
static FaArgs fa_args_full(const floatX *qkv, floatX *out, float *lse, int T, int NH, int KV, int hs) {
    FaArgs a;
    memset(&a, 0, sizeof(a));
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs;
    a.q = qkv; a.k = qkv + C; a.v = a.k + (size_t)KV * hs;
    a.q_ld = a.kv_ld = W; a.q_bs = a.kv_bs = (size_t)T * W;
    a.nq = a.nk = T; a.causal = 1; a.NH = NH; a.KV = KV;
    a.out = out; a.out_ld = C; a.out_bs = (size_t)T * C;
    a.lse = lse; a.lse_T = T;
    return a;
}

// the last key tile of query tile q0's block (causal: the diagonal, the only tile with keys past a query), and
// whether a (query tile, key tile) pair needs the mask: the diagonal, or rows past nq or nk
__host__ __device__ inline int fa_last_key_tile(const FaArgs &a, int q0) {
    return a.causal ? q0 / FA_TILE : (a.nk - 1) / FA_TILE;
}
__host__ __device__ inline int fa_edge(const FaArgs &a, int q0, int k0) {
    return (a.causal && q0 == k0) || q0 + FA_TILE > a.nq || k0 + FA_TILE > a.nk;
}
__host__ __device__ inline int fa_visible(const FaArgs &a, int q, int key) {
    return (!a.causal || key <= q) && q < a.nq && key < a.nk;
}

// Forward, the online softmax of one key tile (keys k0 .. k0 + 63; masked where edge): s (the scores of this lane's two
// rows qrow, accumulator layout) -> P = exp2(s scale2 - m_new); the rows' max m (base 2) and sum l and the output
// accumulators o rescaled by exp2(m_old - m_new): the max and the sum over the 4 lanes that share a row.
template <int HS>
__host__ __device__ inline void fa_online_softmax(float s[FA_TILE / 8][4], float m[2], float l[2], float o[HS / 8][4],
                                                  const FaArgs &a, const int qrow[2], int k0, int edge, int t,
                                                  float scale2) {
    float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f}, alpha[2];
    for (int j = 0; j < FA_TILE / 8; j++) {
        for (int e = 0; e < 4; e++) {
            int key = k0 + j * 8 + 2 * t + (e & 1), i = e / 2;
            s[j][e] = !edge || fa_visible(a, qrow[i], key) ? s[j][e] * scale2 : -INFINITY;
            mx[i] = fmaxf(mx[i], s[j][e]);
        }
    }
    float mref[2];   // the max the exponents subtract: -inf only for a row past nq (every key masked, its
                     // results unused), which subtracts 0 instead (exp2(-inf) = 0, not NaN)
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], fa_shfl_xor(mx[i], 1));
        mx[i] = fmaxf(mx[i], fa_shfl_xor(mx[i], 2));
        float m_new = fmaxf(m[i], mx[i]);
        mref[i] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[i] = exp2f(m[i] - mref[i]);
        m[i] = m_new;
    }
    for (int j = 0; j < FA_TILE / 8; j++) {
        for (int e = 0; e < 4; e++) { s[j][e] = exp2f(s[j][e] - mref[e / 2]); sum[e / 2] += s[j][e]; }
    }
    for (int i = 0; i < 2; i++) {
        sum[i] += fa_shfl_xor(sum[i], 1);
        sum[i] += fa_shfl_xor(sum[i], 2);
        l[i] = l[i] * alpha[i] + sum[i];
    }
    for (int n = 0; n < HS / 8; n++) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
    }
}

// -> out, lse of query rows q0 .. q0 + 63: block (qt, h, b), the longest rows first (qt = nqt - 1 - bx)
template <int HS>
__host__ __device__ void flash_forward_body(unsigned char *smem, int bx, int h, int b, int nqt, int tid,
                                            const FaArgs &a) {
    constexpr int LDX = HS + 8;
    floatX *Qs = (floatX *)smem, *kv = Qs + FA_TILE * LDX;   // then K0, V0, K1, V1
    int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4, kh = h / (a.NH / a.KV);   // kh: its kv head
    int q0 = (nqt - 1 - bx) * FA_TILE, qrow[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};   // this lane's two rows
    const floatX *q = a.q + (size_t)b * a.q_bs + h * HS, *k = a.k + (size_t)b * a.kv_bs + kh * HS,
        *v = a.v + (size_t)b * a.kv_bs + kh * HS;
    // scores in base 2 (s scale log2 e): p = exp2(s2 - m2); m and lse in the same units until the end
    float scale2 = FA_LOG2E / sqrtf((float)HS), m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[HS / 8][4], s[FA_TILE / 8][4];
    for (int n = 0; n < HS / 8; n++) { o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f; }
    fa_kv_first<HS>(kv, k, v, a.kv_ld, a.nk, tid);
    fa_load_tile<HS>(Qs, q, q0, a.nq, a.q_ld, tid);
    fa_sync();
    uint32_t qa[HS / 16][4];
    fa_a_rows<HS>(qa, Qs, warp * 16, lane);
    int last = fa_last_key_tile(a, q0);
    for (int kt = 0; kt <= last; kt++) {
        int k0 = kt * FA_TILE, edge = fa_edge(a, q0, k0);
        floatX *Ks = fa_kv_next<HS>(kv, k, v, a.kv_ld, a.nk, kt, last, tid), *Vs = Ks + FA_TILE * LDX;
        fa_scores<HS>(s, qa, Ks, lane);   // S (16, 64) = Q_w K^T
        fa_online_softmax<HS>(s, m, l, o, a, qrow, k0, edge, t, scale2);   // P; the rows' m, l and O updated
        fa_accumulate<HS>(o, s, Vs, lane);   // O_w += P V
        fa_sync();   // every warp is done with this K, V buffer: the next call refills it
    }
    // this block's lse; with merge, the weights of what out holds (w_old) and of this block (w_new)
    float *lse_bh = a.lse + ((size_t)b * a.NH + h) * a.lse_T + a.lse_off, lse_new[2], w_old[2], w_new[2];
    for (int i = 0; i < 2; i++) {
        lse_new[i] = m[i] / FA_LOG2E + logf(l[i]);
        w_old[i] = 0.0f;
        w_new[i] = 1.0f / l[i];
        if (a.merge && qrow[i] < a.nq) {
            float l1 = lse_bh[qrow[i]], mx = fmaxf(l1, lse_new[i]);
            float l12 = mx + logf(expf(l1 - mx) + expf(lse_new[i] - mx));
            w_old[i] = expf(l1 - l12);
            w_new[i] = expf(lse_new[i] - l12) / l[i];
            lse_new[i] = l12;
        }
    }
    fa_sync();   // every lane has read the lse it merges with: now it is overwritten
    floatX *out = a.out + (size_t)b * a.out_bs + h * HS;
    for (int i = 0; i < 2; i++) {
        int r = qrow[i];
        if (r >= a.nq) { continue; }
        if (t == 0) { lse_bh[r] = lse_new[i]; }
        for (int n = 0; n < HS / 8; n++) {
            floatX *y = out + (size_t)r * a.out_ld + n * 8 + 2 * t;
            y[0] = (floatX)(o[n][2 * i] * w_new[i] + (a.merge ? (float)y[0] * w_old[i] : 0.0f));
            y[1] = (floatX)(o[n][2 * i + 1] * w_new[i] + (a.merge ? (float)y[1] * w_old[i] : 0.0f));
        }
    }
}

// dK, dV of keys k0 .. k0 + 63 of kv head kh: block (kt, kh, b), the longest loops (first keys) first; summed over
// the kv head's G query heads in order, each one's query tiles in order
template <int HS>
__host__ __device__ void flash_backward_dkdv_body(unsigned char *smem, int kt, int kh, int b, int tid,
                                                  const FaArgs &a) {
    constexpr int LDX = HS + 8;
    floatX *Qs = (floatX *)smem, *dYs = Qs + FA_TILE * LDX, *Ks = dYs + FA_TILE * LDX, *Vs = Ks + FA_TILE * LDX;
    float *Ds = (float *)(Vs + FA_TILE * LDX), *Ls = Ds + FA_TILE;
    int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4, k0 = kt * FA_TILE, G = a.NH / a.KV;
    int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};   // this lane's two keys
    float scale = 1.0f / sqrtf((float)HS), scale2 = scale * FA_LOG2E;
    fa_load_tile<HS>(Ks, a.k + (size_t)b * a.kv_bs + kh * HS, k0, a.nk, a.kv_ld, tid);
    fa_load_tile<HS>(Vs, a.v + (size_t)b * a.kv_bs + kh * HS, k0, a.nk, a.kv_ld, tid);
    float dk[HS / 8][4], dv[HS / 8][4], s[FA_TILE / 8][4], dp[FA_TILE / 8][4];
    for (int n = 0; n < HS / 8; n++) { for (int e = 0; e < 4; e++) { dk[n][e] = 0.0f; dv[n][e] = 0.0f; } }
    for (int h = kh * G; h < kh * G + G; h++) {
        const floatX *q = a.q + (size_t)b * a.q_bs + h * HS, *dy = a.dout + (size_t)b * a.out_bs + h * HS;
        size_t stats = ((size_t)b * a.NH + h) * a.lse_T + a.lse_off;
        for (int qt = a.causal ? kt : 0; qt * FA_TILE < a.nq; qt++) {
            int q0 = qt * FA_TILE;
            fa_sync();   // every warp is done with the previous Q, dY, D, lse
            fa_load_tile<HS>(Qs, q, q0, a.nq, a.q_ld, tid);
            fa_load_tile<HS>(dYs, dy, q0, a.nq, a.out_ld, tid);
            fa_row_stats(Ds, Ls, a.D + stats, a.lse + stats, q0, a.nq, tid);
            fa_sync();
            {   // the warp's K and V rows as A fragments, read again each tile (held across the loop, they would
                // spill at head size 128 next to the dK, dV accumulators)
                uint32_t ka[HS / 16][4], va[HS / 16][4];
                fa_a_rows<HS>(ka, Ks, warp * 16, lane);
                fa_a_rows<HS>(va, Vs, warp * 16, lane);
                fa_scores<HS>(s, ka, Qs, lane);    // S^T (16 keys, 64 queries) = K_w Q^T
                fa_scores<HS>(dp, va, dYs, lane);  // dP^T = V_w dY^T
            }
            int edge = fa_edge(a, q0, k0);
            for (int j = 0; j < FA_TILE / 8; j++) {
                for (int e = 0; e < 4; e++) {   // row = this lane's key e / 2, column = query q0 + c
                    int c = j * 8 + 2 * t + (e & 1);
                    float p = !edge || fa_visible(a, q0 + c, key[e / 2]) ? exp2f(s[j][e] * scale2 - Ls[c]) : 0.0f;
                    s[j][e] = p;
                    dp[j][e] = p * (dp[j][e] - Ds[c]) * scale;
                }
            }
            fa_accumulate<HS>(dv, s, dYs, lane);   // dV_w += P^T dY
            fa_accumulate<HS>(dk, dp, Qs, lane);   // dK_w += dS^T Q
        }
    }
    fa_store_rows<HS>(a.dk + (size_t)b * a.dkv_bs + kh * HS, dk, k0 + warp * 16, a.nk, a.dkv_ld, g, t, a.add);
    fa_store_rows<HS>(a.dv + (size_t)b * a.dkv_bs + kh * HS, dv, k0 + warp * 16, a.nk, a.dkv_ld, g, t, a.add);
}

// dQ of queries q0 .. q0 + 63: block (qt, h, b), the longest rows first (qt = nqt - 1 - bx)
template <int HS>
__host__ __device__ void flash_backward_dq_body(unsigned char *smem, int bx, int h, int b, int nqt, int tid,
                                                const FaArgs &a) {
    constexpr int LDX = HS + 8;
    floatX *Qs = (floatX *)smem, *dYs = Qs + FA_TILE * LDX, *kv = dYs + FA_TILE * LDX;   // then K0, V0, K1, V1
    float *Ds = (float *)(kv + 4 * FA_TILE * LDX), *Ls = Ds + FA_TILE;
    int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4, q0 = (nqt - 1 - bx) * FA_TILE;
    int qr[2] = {warp * 16 + g, warp * 16 + g + 8}, kh = h / (a.NH / a.KV);   // this lane's two query rows; its kv head
    const floatX *k = a.k + (size_t)b * a.kv_bs + kh * HS, *v = a.v + (size_t)b * a.kv_bs + kh * HS;
    size_t stats = ((size_t)b * a.NH + h) * a.lse_T + a.lse_off;
    float scale = 1.0f / sqrtf((float)HS), scale2 = scale * FA_LOG2E;
    fa_kv_first<HS>(kv, k, v, a.kv_ld, a.nk, tid);
    fa_load_tile<HS>(Qs, a.q + (size_t)b * a.q_bs + h * HS, q0, a.nq, a.q_ld, tid);
    fa_load_tile<HS>(dYs, a.dout + (size_t)b * a.out_bs + h * HS, q0, a.nq, a.out_ld, tid);
    fa_row_stats(Ds, Ls, a.D + stats, a.lse + stats, q0, a.nq, tid);
    fa_sync();
    uint32_t qa[HS / 16][4], dya[HS / 16][4];
    fa_a_rows<HS>(qa, Qs, warp * 16, lane);
    fa_a_rows<HS>(dya, dYs, warp * 16, lane);
    float dq[HS / 8][4], s[FA_TILE / 8][4], dp[FA_TILE / 8][4];
    for (int n = 0; n < HS / 8; n++) { dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f; }
    int last = fa_last_key_tile(a, q0);
    for (int kt = 0; kt <= last; kt++) {
        int k0 = kt * FA_TILE, edge = fa_edge(a, q0, k0);
        floatX *Ks = fa_kv_next<HS>(kv, k, v, a.kv_ld, a.nk, kt, last, tid), *Vs = Ks + FA_TILE * LDX;
        fa_scores<HS>(s, qa, Ks, lane);     // S (16 queries, 64 keys) = Q_w K^T
        fa_scores<HS>(dp, dya, Vs, lane);   // dP = dY_w V^T
        for (int j = 0; j < FA_TILE / 8; j++) {
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * t + (e & 1), r = qr[e / 2];
                float p = !edge || fa_visible(a, q0 + r, key) ? exp2f(s[j][e] * scale2 - Ls[r]) : 0.0f;
                dp[j][e] = p * (dp[j][e] - Ds[r]) * scale;
            }
        }
        fa_accumulate<HS>(dq, dp, Ks, lane);   // dQ_w += dS K
        fa_sync();   // every warp is done with this K, V buffer
    }
    fa_store_rows<HS>(a.dq + (size_t)b * a.dq_bs + h * HS, dq, q0 + warp * 16, a.nq, a.dq_ld, g, t, a.add);
}

template <int HS>
__global__ void __launch_bounds__(FA_THREADS) flash_forward_kernel(const FaArgs a) {
    DYNAMIC_SHARED(unsigned char, fa_smem);
    flash_forward_body<HS>(fa_smem, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, threadIdx.x, a);
}
template <int HS>
__global__ void __launch_bounds__(FA_THREADS) flash_backward_dkdv_kernel(const FaArgs a) {
    DYNAMIC_SHARED(unsigned char, fa_smem);
    flash_backward_dkdv_body<HS>(fa_smem, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, a);
}
template <int HS>
__global__ void __launch_bounds__(FA_THREADS) flash_backward_dq_kernel(const FaArgs a) {
    DYNAMIC_SHARED(unsigned char, fa_smem);
    flash_backward_dq_body<HS>(fa_smem, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, threadIdx.x, a);
}
template <int HS>
__global__ void flash_row_dot_kernel(float *D, const floatX *dout, const floatX *out, int T, int NH) {
    flash_row_dot_body<HS>(D, dout, out, blockIdx.z, blockIdx.y, blockIdx.x * blockDim.x + threadIdx.x, T, NH);
}

// the backward's D (B, NH, T) fp32: set up by flash_setup (attention.h), before the first step
static float *fa_D = NULL;
static size_t fa_D_bytes = 0;
static void flash_setup(int B, int T, int NH) {
    size_t need = flash_workspace_bytes(B, T, NH);
    if (need > fa_D_bytes) {
        if (fa_D != NULL) { mem_free(fa_D); }
        fa_D = (float *)mem_alloc(need, MEM_WORKSPACE);
        fa_D_bytes = need;
    }
}

// D = dY.Y of every row of out, dout (B, T, NH HS) -> fa_D (B, NH, T)
template <int HS>
static void flash_row_dot(const floatX *dout, const floatX *out, int B, int T, int NH) {
    flash_setup(B, T, NH);   // (set up before: a no-op)
    LAUNCH(flash_row_dot_kernel<HS>, dim3(ceil_div(T, 128), NH, B), 128, 0, main_stream)(fa_D, dout, out, T, NH);
    cudaCheckLaunch();
}

template <int HS>
static void flash_forward_args(const FaArgs &a, int B) {
    size_t smem = fa_forward_smem<HS>();
    cudaCheck(cudaFuncSetAttribute(flash_forward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    LAUNCH(flash_forward_kernel<HS>, dim3(ceil_div(a.nq, FA_TILE), a.NH, B), FA_THREADS, smem, main_stream)(a);
    cudaCheckLaunch();
}

// (a.D set: fa_D from flash_row_dot) dK, dV: a block per kv head; dQ: per query head
template <int HS>
static void flash_backward_args(const FaArgs &a, int B) {
    size_t smem = fa_dkdv_smem<HS>(), smem_dq = fa_dq_smem<HS>();
    cudaCheck(cudaFuncSetAttribute(flash_backward_dkdv_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem));
    LAUNCH(flash_backward_dkdv_kernel<HS>, dim3(ceil_div(a.nk, FA_TILE), a.KV, B), FA_THREADS, smem, main_stream)(a);
    cudaCheckLaunch();
    cudaCheck(cudaFuncSetAttribute(flash_backward_dq_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem_dq));
    LAUNCH(flash_backward_dq_kernel<HS>, dim3(ceil_div(a.nq, FA_TILE), a.NH, B), FA_THREADS, smem_dq, main_stream)(a);
    cudaCheckLaunch();
}

// qkv (B, T, (NH + 2KV) HS) -> out (B, T, NH HS), lse (B, NH, T)
template <int HS>
static void flash_forward_launch(floatX *out, float *lse, const floatX *qkv, int B, int T, int NH, int KV) {
    flash_forward_args<HS>(fa_args_full(qkv, out, lse, T, NH, KV, HS), B);
}

// dout (B, T, NH HS) -> dqkv (B, T, (NH + 2KV) HS) (written)
template <int HS>
static void flash_backward_launch(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                                  const float *lse, int B, int T, int NH, int KV) {
    flash_row_dot<HS>(dout, out, B, T, NH);
    FaArgs a = fa_args_full(qkv, (floatX *)out, (float *)lse, T, NH, KV, HS);
    a.dout = dout; a.D = fa_D;
    a.dq = dqkv; a.dk = dqkv + (size_t)NH * HS; a.dv = a.dk + (size_t)KV * HS;
    a.dq_ld = a.dkv_ld = a.q_ld; a.dq_bs = a.dkv_bs = a.q_bs;
    flash_backward_args<HS>(a, B);
}
#endif

#endif
