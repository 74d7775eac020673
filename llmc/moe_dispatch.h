// The MoE layer's token shuffle (expert_parallel.h's dispatch and combine, moe.h's routing decided): the kept
// assignments counted per expert, each given its row in the send layout (experts in order), the tokens permuted
// into those rows, the experts' outputs combined back with the gates; and the backward of each. CPU loops and
// CUDA kernels side by side. choice, keep, row (N, k); x, out (N, C); xs, ys (rows, C); gate (N, k).
#ifndef LLMC_MOE_DISPATCH_H
#define LLMC_MOE_DISPATCH_H

#include "backend.h"
#include "model_config.h"   // MOE_MAX_EXPERTS

// counts (E): kept assignments per expert.
static void moe_count_cpu(int *counts, const int *choice, const int *keep, int N, int E, int k) {
    for (int e = 0; e < E; e++) { counts[e] = 0; }
    for (size_t i = 0; i < (size_t)N * k; i++) { if (keep[i]) { counts[choice[i]]++; } }
}

// row (N, k): where each kept assignment goes in the send layout (experts in order, offsets (E) their
// first rows; within an expert, tokens in order); -1 if dropped. An expert's rows past `limit` (a padded
// slot's P: the capacity makes that impossible) are dropped rather than written into the next slot.
static void moe_rows_cpu(int *row, const int *choice, const int *keep, const int *offsets, int N, int E, int k,
                         int limit) {
    int next[MOE_MAX_EXPERTS];
    for (int e = 0; e < E; e++) { next[e] = 0; }
    for (size_t i = 0; i < (size_t)N * k; i++) {
        int e = choice[i];
        row[i] = keep[i] && next[e] < limit ? offsets[e] + next[e]++ : -1;
    }
}

// kept (1) += the kept rows of all experts, counts (E).
#ifdef USE_CUDA
__host__ __device__
#endif
static inline void moe_kept_add_body(int *kept, const int *counts, int E) {
    for (int e = 0; e < E; e++) { *kept += counts[e]; }
}

// xs (rows, C): xs[row[t][j]] = x[t] for every kept assignment.
static void moe_permute_cpu(float *xs, const float *x, const int *row, int N, int k, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            if (r >= 0) { memcpy(xs + (size_t)r * C, x + (size_t)t * C, C * sizeof(float)); }
        }
    }
}

// out (N, C) = sum over the kept j of gate[t][j] * ys[row[t][j]], in the order j = 0..k-1.
static void moe_combine_cpu(float *out, const float *ys, const float *gate, const int *row, int N, int k, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) { o[c] = 0.0f; }
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            if (r < 0) { continue; }
            float g = gate[(size_t)t * k + j];
            for (int c = 0; c < C; c++) { o[c] += g * ys[(size_t)r * C + c]; }
        }
    }
}

// The combine's backward: dys[row] = gate * dout[t]; dgate[t][j] = dout[t] . ys[row] (0 if dropped).
static void moe_combine_backward_cpu(float *dys, float *dgate, const float *dout, const float *ys, const float *gate,
                                     const int *row, int N, int k, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const float *d = dout + (size_t)t * C;
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            float dg = 0.0f;
            if (r >= 0) {
                float g = gate[(size_t)t * k + j];
                for (int c = 0; c < C; c++) { dys[(size_t)r * C + c] = g * d[c]; dg += d[c] * ys[(size_t)r * C + c]; }
            }
            dgate[(size_t)t * k + j] = dg;
        }
    }
}

// The permute's backward: dx (N, C) = sum over the kept j of dxs[row[t][j]] (written).
static void moe_unpermute_cpu(float *dx, const float *dxs, const int *row, int N, int k, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float *o = dx + (size_t)t * C;
        for (int c = 0; c < C; c++) { o[c] = 0.0f; }
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            if (r >= 0) { for (int c = 0; c < C; c++) { o[c] += dxs[(size_t)r * C + c]; } }
        }
    }
}

#ifdef USE_CUDA
// grid (E), block 1024: the assignments to expert e counted and numbered in (token, choice) order with a
// block-wide running count (a count per 1024-wide tile, added in tile order). offsets == NULL: count only.
__global__ void moe_rows_kernel(int *counts, int *row, const int *choice, const int *keep, const int *offsets, int N,
                                int k, int limit) {
    __shared__ int warp_sums[32];
    __shared__ int base;
    int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    if (threadIdx.x == 0) { base = offsets ? offsets[e] : 0; }
    __syncthreads();
    size_t n = (size_t)N * k;
    for (size_t tile = 0; tile < n; tile += blockDim.x) {
        size_t i = tile + threadIdx.x;
        int mine = i < n && keep[i] && choice[i] == e;
        // exclusive prefix of `mine` over the block: within the warp by ballot, across warps in shared memory
        unsigned int ballot = __ballot_sync(0xffffffffu, mine);
        int before = __popc(ballot & ((1u << lane) - 1u));
        if (lane == 0) { warp_sums[warp] = __popc(ballot); }
        __syncthreads();
        int warp_base = 0, total = 0;
        for (int w = 0; w < nwarps; w++) { if (w < warp) { warp_base += warp_sums[w]; } total += warp_sums[w]; }
        if (row != NULL && i < n && keep[i] && choice[i] == e) {
            int idx = base + warp_base + before - (offsets ? offsets[e] : 0);
            row[i] = idx < limit ? base + warp_base + before : -1;
        }
        __syncthreads();
        if (threadIdx.x == 0) { base += total; }
        __syncthreads();
    }
    if (threadIdx.x == 0 && counts != NULL) { counts[e] = base - (offsets ? offsets[e] : 0); }
}

__global__ void moe_dropped_rows_kernel(int *row, const int *keep, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (!keep[i]) { row[i] = -1; }
    }
}

// one block per (token, choice): copy the token's row to its place
__global__ void moe_permute_kernel(floatX *xs, const floatX *x, const int *row, int k, int C) {
    int t = blockIdx.x / k, r = row[blockIdx.x];
    if (r < 0) { return; }
    for (int c = threadIdx.x; c < C; c += blockDim.x) { xs[(size_t)r * C + c] = x[(size_t)t * C + c]; }
}

// one block per token
__global__ void moe_combine_kernel(floatX *out, const floatX *ys, const float *gate, const int *row, int k, int C) {
    int t = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float o = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            if (r >= 0) { o += gate[(size_t)t * k + j] * (float)ys[(size_t)r * C + c]; }
        }
        out[(size_t)t * C + c] = (floatX)o;
    }
}

// one block per (token, choice)
__global__ void moe_combine_backward_kernel(floatX *dys, float *dgate, const floatX *dout, const floatX *ys,
                                            const float *gate, const int *row, int k, int C) {
    int t = blockIdx.x / k, r = row[blockIdx.x];
    float dg = 0.0f;
    if (r >= 0) {
        float g = gate[blockIdx.x];
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float d = (float)dout[(size_t)t * C + c];
            dys[(size_t)r * C + c] = (floatX)(g * d);
            dg += d * (float)ys[(size_t)r * C + c];
        }
    }
    dg = block_reduce_sum(dg);
    if (threadIdx.x == 0) { dgate[blockIdx.x] = dg; }
}

__global__ void moe_unpermute_kernel(floatX *dx, const floatX *dxs, const int *row, int k, int C) {
    int t = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            if (r >= 0) { s += (float)dxs[(size_t)r * C + c]; }
        }
        dx[(size_t)t * C + c] = (floatX)s;
    }
}
#endif

// counts (E, device): kept assignments per expert
static void moe_count(int *counts, const int *choice, const int *keep, int N, int E, int k) {
#ifdef USE_CUDA
    LAUNCH(moe_rows_kernel, E, 1024, 0, main_stream)(counts, NULL, choice, keep, NULL, N, k, N * k);
    cudaCheckLaunch();
#else
    moe_count_cpu(counts, choice, keep, N, E, k);
#endif
}

// row (N, k) from offsets (E, device); at most limit rows an expert
static void moe_rows(int *row, const int *choice, const int *keep, const int *offsets, int N, int E, int k, int limit) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_rows_kernel, E, 1024, 0, main_stream)(NULL, row, choice, keep, offsets, N, k, limit);
    cudaCheckLaunch();
    LAUNCH(moe_dropped_rows_kernel, elementwise_grid((size_t)N * k, 256), 256, 0, main_stream)(row, keep, (size_t)N * k);
    cudaCheckLaunch();
#else
    moe_rows_cpu(row, choice, keep, offsets, N, E, k, limit);
#endif
}

// kept (1, device) += the sum of counts (E, device): one thread, E additions
#ifdef USE_CUDA
__global__ void moe_kept_add_kernel(int *kept, const int *counts, int E) { moe_kept_add_body(kept, counts, E); }
#endif
static void moe_kept_add(int *kept, const int *counts, int E) {
#ifdef USE_CUDA
    LAUNCH(moe_kept_add_kernel, 1, 1, 0, main_stream)(kept, counts, E);
    cudaCheckLaunch();
#else
    moe_kept_add_body(kept, counts, E);
#endif
}

static void moe_permute(floatX *xs, const floatX *x, const int *row, int N, int k, int C) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_permute_kernel, N * k, 256, 0, main_stream)(xs, x, row, k, C);
    cudaCheckLaunch();
#else
    moe_permute_cpu(xs, x, row, N, k, C);
#endif
}

static void moe_combine(floatX *out, const floatX *ys, const float *gate, const int *row, int N, int k, int C) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_combine_kernel, N, 256, 0, main_stream)(out, ys, gate, row, k, C);
    cudaCheckLaunch();
#else
    moe_combine_cpu(out, ys, gate, row, N, k, C);
#endif
}

static void moe_combine_backward(floatX *dys, float *dgate, const floatX *dout, const floatX *ys, const float *gate,
                                 const int *row, int N, int k, int C) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_combine_backward_kernel, N * k, 256, 0, main_stream)(dys, dgate, dout, ys, gate, row, k, C);
    cudaCheckLaunch();
#else
    moe_combine_backward_cpu(dys, dgate, dout, ys, gate, row, N, k, C);
#endif
}

static void moe_unpermute(floatX *dx, const floatX *dxs, const int *row, int N, int k, int C) {
#ifdef USE_CUDA
    if (N <= 0) { return; }
    LAUNCH(moe_unpermute_kernel, N, 256, 0, main_stream)(dx, dxs, row, k, C);
    cudaCheckLaunch();
#else
    moe_unpermute_cpu(dx, dxs, row, N, k, C);
#endif
}

#endif
