// Causal flash attention on the tensor cores, forward and backward (bf16 builds, head size 64 or 128;
// the default path there, attention.h). attention_forward_cpu and attention_backward_cpu are the
// specification; this is the same math tiled so that the (T, T) scores never reach global memory:
//   forward (block = 64 query rows of one (b, h), 4 warps of 16 rows; key tiles of 64 up to the diagonal,
//            the tiles above it skipped):  S = Q K^T (mma), causal mask, online softmax (running max m and
//            sum l per row, O rescaled by exp(m_old - m_new)), O += P V (mma);  out = O / l, lse = m + log l
//   backward (D = dY.Y per query row, p = exp(s scale - lse), ds = p (dp - D) scale, as the CPU loop):
//            dk/dv kernel: block = 64 keys, loops over the query tiles from the diagonal down; each warp
//                          holds dK, dV of its 16 keys in mma accumulators: dV += P^T dY, dK += dS^T Q
//            dq kernel:    block = 64 queries, loops over the key tiles up to the diagonal: dQ += dS K
//            Each output element is owned by one warp and summed in a fixed order: deterministic, no atomics.
// The mma operands are bf16 (P and dS rounded, as in FlashAttention and the cuBLAS path), accumulation fp32.
// WMMA fragments have no documented element layout, so the element-wise steps (mask, softmax, dS) go
// through a per-warp fp32 tile in shared memory: lane pair (2r, 2r+1) owns row r, 32 columns each.
#ifndef LLMC_FLASH_ATTENTION_H
#define LLMC_FLASH_ATTENTION_H

#if defined(USE_CUDA) && !defined(ENABLE_FP32)
#include <mma.h>

#define FA_TILE 64                 // query rows per block = keys per tile
#define FA_WARPS 4                 // 16 rows each
#define FA_THREADS (32 * FA_WARPS)
#define FA_LDS (FA_TILE + 4)       // fp32 score tiles (16, FA_LDS) per warp
#define FA_LDP (FA_TILE + 8)       // bf16 P / dS tiles (16, FA_LDP) per warp

typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, floatX, nvcuda::wmma::row_major> fa_a;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, floatX, nvcuda::wmma::row_major> fa_b;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, floatX, nvcuda::wmma::col_major> fa_bt;   // B = X^T
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> fa_acc;

// rows r0 .. r0 + 63 of a (T, ld) bf16 matrix (HS columns from src) -> dst (64, HS + 8); zeros past T
template <int HS>
__device__ __forceinline__ void fa_load_tile(floatX *dst, const floatX *src, int r0, int T, size_t ld) {
    constexpr int CHUNKS = HS / 8;   // 16-byte chunks per row
    for (int i = threadIdx.x; i < FA_TILE * CHUNKS; i += FA_THREADS) {
        int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        int4 v = make_int4(0, 0, 0, 0);
        if (r0 + r < T) { v = *(const int4 *)(src + (size_t)(r0 + r) * ld + c); }
        *(int4 *)(dst + r * (HS + 8) + c) = v;
    }
}

// tile (16, 64) = A (16 rows of a (.., HS + 8) tile) times B^T (64 rows of a (.., HS + 8) tile), stored fp32 (16, FA_LDS)
template <int HS>
__device__ __forceinline__ void fa_scores(float *S, const floatX *A, const floatX *B) {
    fa_acc s[FA_TILE / 16];
    for (int n = 0; n < FA_TILE / 16; n++) { nvcuda::wmma::fill_fragment(s[n], 0.0f); }
    for (int kk = 0; kk < HS / 16; kk++) {
        fa_a a;
        nvcuda::wmma::load_matrix_sync(a, A + kk * 16, HS + 8);
        for (int n = 0; n < FA_TILE / 16; n++) {
            fa_bt bt;
            nvcuda::wmma::load_matrix_sync(bt, B + n * 16 * (HS + 8) + kk * 16, HS + 8);
            nvcuda::wmma::mma_sync(s[n], a, bt, s[n]);
        }
    }
    for (int n = 0; n < FA_TILE / 16; n++) { nvcuda::wmma::store_matrix_sync(S + n * 16, s[n], FA_LDS, nvcuda::wmma::mem_row_major); }
}

// acc[n] (16, 16 n .. 16 n + 15) += A (16, 64; ld FA_LDP) times B (64 rows of a (.., HS + 8) tile)
template <int HS>
__device__ __forceinline__ void fa_accumulate(fa_acc *acc, const floatX *A, const floatX *B) {
    for (int kk = 0; kk < FA_TILE / 16; kk++) {
        fa_a a;
        nvcuda::wmma::load_matrix_sync(a, A + kk * 16, FA_LDP);
        for (int n = 0; n < HS / 16; n++) {
            fa_b bm;
            nvcuda::wmma::load_matrix_sync(bm, B + kk * 16 * (HS + 8) + n * 16, HS + 8);
            nvcuda::wmma::mma_sync(acc[n], a, bm, acc[n]);
        }
    }
}

// D = dY.Y and lse of query rows q0 .. q0 + 63 (two threads per row) -> Ds, Ls (0 past T)
template <int HS>
__device__ __forceinline__ void fa_row_stats(float *Ds, float *Ls, const floatX *dy, const floatX *y, const float *lse, int q0, int T, int C) {
    int i = threadIdx.x / 2, half = threadIdx.x % 2, t = q0 + i;
    float d = 0.0f;
    if (t < T) {
        for (int c = half * HS / 2; c < (half + 1) * HS / 2; c++) { d += (float)dy[(size_t)t * C + c] * (float)y[(size_t)t * C + c]; }
    }
    d += __shfl_xor_sync(0xffffffff, d, 1);
    if (half == 0) { Ds[i] = d; Ls[i] = t < T ? lse[t] : 0.0f; }
}

// shared memory: forward Q, K, V (64, HS + 8) bf16 | S (16, FA_LDS) fp32, P (16, FA_LDP) bf16, O (16, HS + 4) fp32 per warp
template <int HS> static size_t fa_forward_smem(void) {
    return 3 * FA_TILE * (HS + 8) * 2 + FA_WARPS * 16 * (FA_LDS * 4 + FA_LDP * 2 + (HS + 4) * 4);
}
// backward: Q, dY, K, V (64, HS + 8) bf16 | S, dP (16, FA_LDS) fp32 and P, dS (16, FA_LDP) bf16 per warp | D, lse (64)
template <int HS> static size_t fa_backward_smem(void) {
    return 4 * FA_TILE * (HS + 8) * 2 + FA_WARPS * 16 * (2 * FA_LDS * 4 + 2 * FA_LDP * 2) + 2 * FA_TILE * 4;
}

// qkv (B, T, 3C) -> out (B, T, C), lse (B, NH, T). grid (T / 64, NH, B), the longest rows first.
template <int HS>
__global__ void __launch_bounds__(FA_THREADS) flash_forward_kernel(floatX *out, float *lse, const floatX *qkv, int T, int C, int NH) {
    constexpr int LDX = HS + 8, LDO = HS + 4;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    floatX *Qs = (floatX *)fa_smem, *Ks = Qs + FA_TILE * LDX, *Vs = Ks + FA_TILE * LDX;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *S = (float *)(Vs + FA_TILE * LDX) + warp * 16 * FA_LDS;
    floatX *P = (floatX *)((float *)(Vs + FA_TILE * LDX) + FA_WARPS * 16 * FA_LDS) + warp * 16 * FA_LDP;
    float *O = (float *)((floatX *)((float *)(Vs + FA_TILE * LDX) + FA_WARPS * 16 * FA_LDS) + FA_WARPS * 16 * FA_LDP) + warp * 16 * LDO;
    int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, q0 = qt * FA_TILE;
    int r = lane / 2, half = lane % 2, qi = q0 + warp * 16 + r;   // this lane: half of row r of the warp's 16
    size_t C3 = 3 * (size_t)C;
    const floatX *base = qkv + (size_t)b * T * C3 + h * HS;
    float scale = rsqrtf((float)HS), m = -INFINITY, l = 0.0f;
    for (int c = half * HS / 2; c < (half + 1) * HS / 2; c++) { O[r * LDO + c] = 0.0f; }
    fa_load_tile<HS>(Qs, base, q0, T, C3);
    int last = (min(q0 + FA_TILE, T) - 1) / FA_TILE;   // = qt: the tiles above the diagonal are never loaded
    for (int kt = 0; kt <= last; kt++) {
        int k0 = kt * FA_TILE;
        __syncthreads();   // every warp is done with the previous K, V
        fa_load_tile<HS>(Ks, base + C, k0, T, C3);
        fa_load_tile<HS>(Vs, base + 2 * C, k0, T, C3);
        __syncthreads();
        fa_scores<HS>(S, Qs + warp * 16 * LDX, Ks);   // S (16, 64) = Q_w K^T
        __syncwarp();
        // online softmax of row r: mask, the new max, P = exp(s - m_new), l and O rescaled by exp(m_old - m_new)
        float mx = -INFINITY;
        for (int c = half * 32; c < half * 32 + 32; c++) {
            int key = k0 + c;
            float s = key <= qi && key < T ? S[r * FA_LDS + c] * scale : -INFINITY;
            S[r * FA_LDS + c] = s;
            mx = fmaxf(mx, s);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        float m_new = fmaxf(m, mx), alpha = expf(m - m_new), sum = 0.0f;   // key k0 <= qi: m_new is finite
        for (int c = half * 32; c < half * 32 + 32; c++) {
            float p = expf(S[r * FA_LDS + c] - m_new);
            P[r * FA_LDP + c] = (floatX)p;
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        for (int c = half * HS / 2; c < (half + 1) * HS / 2; c++) { O[r * LDO + c] *= alpha; }
        __syncwarp();
        // O_w (16, HS) += P (16, 64) V (64, HS), through the accumulators
        fa_acc o[HS / 16];
        for (int n = 0; n < HS / 16; n++) { nvcuda::wmma::load_matrix_sync(o[n], O + n * 16, LDO, nvcuda::wmma::mem_row_major); }
        fa_accumulate<HS>(o, P, Vs);
        for (int n = 0; n < HS / 16; n++) { nvcuda::wmma::store_matrix_sync(O + n * 16, o[n], LDO, nvcuda::wmma::mem_row_major); }
        __syncwarp();
    }
    if (qi < T) {
        float inv = 1.0f / l;
        floatX *y = out + ((size_t)b * T + qi) * C + h * HS;
        for (int c = half * HS / 2; c < (half + 1) * HS / 2; c++) { y[c] = (floatX)(O[r * LDO + c] * inv); }
        if (half == 0) { lse[((size_t)b * NH + h) * T + qi] = m + logf(l); }
    }
}

// The backward's shared memory, carved the same way by both kernels.
template <int HS>
struct FaBackwardSmem {
    floatX *Qs, *dYs, *Ks, *Vs, *P, *dS;   // P, dS: this warp's (16, FA_LDP)
    float *S, *dP, *Ds, *Ls;               // S, dP: this warp's (16, FA_LDS); contiguous, so (16, HS + 4) fits in S
    __device__ FaBackwardSmem(unsigned char *smem, int warp) {
        constexpr int LDX = HS + 8;
        Qs = (floatX *)smem; dYs = Qs + FA_TILE * LDX; Ks = dYs + FA_TILE * LDX; Vs = Ks + FA_TILE * LDX;
        float *f = (float *)(Vs + FA_TILE * LDX);
        S = f + warp * 2 * 16 * FA_LDS; dP = S + 16 * FA_LDS;
        floatX *x = (floatX *)(f + FA_WARPS * 2 * 16 * FA_LDS);
        P = x + warp * 2 * 16 * FA_LDP; dS = P + 16 * FA_LDP;
        Ds = (float *)(x + FA_WARPS * 2 * 16 * FA_LDP); Ls = Ds + FA_TILE;
    }
};

// A warp's accumulators (16, HS) -> rows row0 .. row0 + 15 of dst (ld C3), through its fp32 scratch; rows >= T skipped
template <int HS>
__device__ __forceinline__ void fa_store_rows(floatX *dst, fa_acc *acc, float *scratch, int row0, int T, size_t ld) {
    constexpr int LDO = HS + 4;
    int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
    __syncwarp();
    for (int n = 0; n < HS / 16; n++) { nvcuda::wmma::store_matrix_sync(scratch + n * 16, acc[n], LDO, nvcuda::wmma::mem_row_major); }
    __syncwarp();
    if (row0 + r < T) {
        for (int c = half * HS / 2; c < (half + 1) * HS / 2; c++) { dst[(size_t)(row0 + r) * ld + c] = (floatX)scratch[r * LDO + c]; }
    }
    __syncwarp();
}

// dK, dV (in dqkv) of keys k0 .. k0 + 63: grid (T / 64, NH, B), the longest loops (first keys) first.
template <int HS>
__global__ void __launch_bounds__(FA_THREADS) flash_backward_dkdv_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv,
                                                                        const floatX *out, const float *lse, int T, int C, int NH) {
    constexpr int LDX = HS + 8;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
    FaBackwardSmem<HS> sm(fa_smem, warp);
    int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z, k0 = kt * FA_TILE, key = k0 + warp * 16 + r;
    size_t C3 = 3 * (size_t)C;
    const floatX *base = qkv + (size_t)b * T * C3 + h * HS, *dy = dout + (size_t)b * T * C + h * HS, *y = out + (size_t)b * T * C + h * HS;
    const float *lse_bh = lse + ((size_t)b * NH + h) * T;
    float scale = rsqrtf((float)HS);
    fa_load_tile<HS>(sm.Ks, base + C, k0, T, C3);
    fa_load_tile<HS>(sm.Vs, base + 2 * C, k0, T, C3);
    fa_acc dk[HS / 16], dv[HS / 16];
    for (int n = 0; n < HS / 16; n++) { nvcuda::wmma::fill_fragment(dk[n], 0.0f); nvcuda::wmma::fill_fragment(dv[n], 0.0f); }
    for (int qt = kt; qt * FA_TILE < T; qt++) {
        int q0 = qt * FA_TILE;
        __syncthreads();   // every warp is done with the previous Q, dY
        fa_load_tile<HS>(sm.Qs, base, q0, T, C3);
        fa_load_tile<HS>(sm.dYs, dy, q0, T, C);
        fa_row_stats<HS>(sm.Ds, sm.Ls, dy, y, lse_bh, q0, T, C);
        __syncthreads();
        fa_scores<HS>(sm.S, sm.Ks + warp * 16 * LDX, sm.Qs);     // S^T (16 keys, 64 queries) = K_w Q^T
        fa_scores<HS>(sm.dP, sm.Vs + warp * 16 * LDX, sm.dYs);   // dP^T = V_w dY^T
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; c++) {       // row r = key, column c = query q0 + c
            int q = q0 + c;
            float p = key <= q && q < T && key < T ? expf(sm.S[r * FA_LDS + c] * scale - sm.Ls[c]) : 0.0f;
            sm.P[r * FA_LDP + c] = (floatX)p;
            sm.dS[r * FA_LDP + c] = (floatX)(p * (sm.dP[r * FA_LDS + c] - sm.Ds[c]) * scale);
        }
        __syncwarp();
        fa_accumulate<HS>(dv, sm.P, sm.dYs);   // dV_w += P^T dY
        fa_accumulate<HS>(dk, sm.dS, sm.Qs);   // dK_w += dS^T Q
    }
    floatX *dst = dqkv + (size_t)b * T * C3 + h * HS;
    fa_store_rows<HS>(dst + C, dk, sm.S, k0 + warp * 16, T, C3);
    fa_store_rows<HS>(dst + 2 * C, dv, sm.S, k0 + warp * 16, T, C3);
}

// dQ (in dqkv) of queries q0 .. q0 + 63: grid (T / 64, NH, B), the longest rows first.
template <int HS>
__global__ void __launch_bounds__(FA_THREADS) flash_backward_dq_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv,
                                                                      const floatX *out, const float *lse, int T, int C, int NH) {
    constexpr int LDX = HS + 8;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
    FaBackwardSmem<HS> sm(fa_smem, warp);
    int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, q0 = qt * FA_TILE, qrow = warp * 16 + r, qi = q0 + qrow;
    size_t C3 = 3 * (size_t)C;
    const floatX *base = qkv + (size_t)b * T * C3 + h * HS, *dy = dout + (size_t)b * T * C + h * HS, *y = out + (size_t)b * T * C + h * HS;
    float scale = rsqrtf((float)HS);
    fa_load_tile<HS>(sm.Qs, base, q0, T, C3);
    fa_load_tile<HS>(sm.dYs, dy, q0, T, C);
    fa_row_stats<HS>(sm.Ds, sm.Ls, dy, y, lse + ((size_t)b * NH + h) * T, q0, T, C);
    fa_acc dq[HS / 16];
    for (int n = 0; n < HS / 16; n++) { nvcuda::wmma::fill_fragment(dq[n], 0.0f); }
    int last = (min(q0 + FA_TILE, T) - 1) / FA_TILE;
    for (int kt = 0; kt <= last; kt++) {
        int k0 = kt * FA_TILE;
        __syncthreads();   // every warp is done with the previous K, V (and Q, dY, D, lse are in)
        fa_load_tile<HS>(sm.Ks, base + C, k0, T, C3);
        fa_load_tile<HS>(sm.Vs, base + 2 * C, k0, T, C3);
        __syncthreads();
        fa_scores<HS>(sm.S, sm.Qs + warp * 16 * LDX, sm.Ks);     // S (16 queries, 64 keys) = Q_w K^T
        fa_scores<HS>(sm.dP, sm.dYs + warp * 16 * LDX, sm.Vs);   // dP = dY_w V^T
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; c++) {
            int key = k0 + c;
            float p = key <= qi && qi < T && key < T ? expf(sm.S[r * FA_LDS + c] * scale - sm.Ls[qrow]) : 0.0f;
            sm.dS[r * FA_LDP + c] = (floatX)(p * (sm.dP[r * FA_LDS + c] - sm.Ds[qrow]) * scale);
        }
        __syncwarp();
        fa_accumulate<HS>(dq, sm.dS, sm.Ks);   // dQ_w += dS K
    }
    fa_store_rows<HS>(dqkv + (size_t)b * T * C3 + h * HS, dq, sm.S, q0 + warp * 16, T, C3);
}

template <int HS>
static void flash_forward_launch(floatX *out, float *lse, const floatX *qkv, int B, int T, int C, int NH) {
    size_t smem = fa_forward_smem<HS>();
    cudaCheck(cudaFuncSetAttribute(flash_forward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    flash_forward_kernel<HS><<<dim3(ceil_div(T, FA_TILE), NH, B), FA_THREADS, smem, main_stream>>>(out, lse, qkv, T, C, NH);
    cudaCheckLaunch();
}

template <int HS>
static void flash_backward_launch(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out, const float *lse,
                                  int B, int T, int C, int NH) {
    size_t smem = fa_backward_smem<HS>();
    dim3 grid(ceil_div(T, FA_TILE), NH, B);
    cudaCheck(cudaFuncSetAttribute(flash_backward_dkdv_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    flash_backward_dkdv_kernel<HS><<<grid, FA_THREADS, smem, main_stream>>>(dqkv, dout, qkv, out, lse, T, C, NH);
    cudaCheckLaunch();
    cudaCheck(cudaFuncSetAttribute(flash_backward_dq_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    flash_backward_dq_kernel<HS><<<grid, FA_THREADS, smem, main_stream>>>(dqkv, dout, qkv, out, lse, T, C, NH);
    cudaCheckLaunch();
}
#endif

#endif
