// LayerNorm over the channels of each token: out = (x - mean) * rstd * w + b, eps 1e-5.
#ifndef LLMC_LAYERNORM_H
#define LLMC_LAYERNORM_H

#include "backend.h"
#include "residual.h"

// inp (N, C) -> out (N, C), mean (N), rstd (N)
static void layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                                  const float *weight, const float *bias, int N, int C) {
    const float eps = 1e-5f;
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) { m += x[c]; }
        m /= C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) { float d = x[c] - m; v += d * d; }
        v /= C;
        float s = 1.0f / sqrtf(v + eps);
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) { o[c] = (s * (x[c] - m)) * weight[c] + bias[c]; }
        mean[n] = m;
        rstd[n] = s;
    }
}

// dinp (N, C) += d/dx (NULL: skipped, and weight is not read);  dweight, dbias (C) += their gradients (NULL, NULL:
// skipped). The two parts are independent loops (ZB's B and W run them apart: the same sums either way).
static void layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                   const float *weight, const float *mean, const float *rstd, int N, int C) {
    #pragma omp parallel for if (dinp != NULL)
    for (int n = 0; n < (dinp != NULL ? N : 0); n++) {
        const float *dy = dout + (size_t)n * C;
        const float *x = inp + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        // two reductions: mean(dy*w) and mean(dy*w*xhat)
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            float dnorm = weight[c] * dy[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * xhat;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            float dnorm = weight[c] * dy[c];
            dx[c] += (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * s;
        }
    }
    // parameter gradients: threads split the channels, tokens summed in order (deterministic)
    #pragma omp parallel for if (dweight != NULL)
    for (int c = 0; c < (dweight != NULL ? C : 0); c++) {
        float dw = 0.0f, db = 0.0f;
        for (int n = 0; n < N; n++) {
            float xhat = (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
            float dy = dout[(size_t)n * C + c];
            dw += xhat * dy;
            db += dy;
        }
        dweight[c] += dw;
        dbias[c] += db;
    }
}

// The residual add fused with the next LayerNorm (the pre-LN block: res_out = res + x + bias is the
// residual stream, ln_out its normalisation). res, x (N, C), bias (C) or NULL; res_out (N, C) may alias
// res or x; ln_out (N, C), mean, rstd (N) as layernorm_forward. The specification: the two CPU loops.
static void residual_layernorm_forward_cpu(float *res_out, float *ln_out, float *mean, float *rstd, const float *res,
                                           const float *x, const float *bias, const float *weight, const float *lnbias,
                                           int N, int C) {
    residual_bias_forward_cpu(res_out, res, x, bias, N, C);
    layernorm_forward_cpu(ln_out, mean, rstd, res_out, weight, lnbias, N, C);
}

#ifdef USE_CUDA
// One warp per row n: inp (N, C) -> out (N, C), mean (N), rstd (N). Two passes over the row
// (mean, then variance about the mean) like the CPU loop; the row is re-read from L1/L2.
__global__ void layernorm_forward_kernel(floatX *out, float *mean, float *rstd, const floatX *inp,
                                         const floatX *weight, const floatX *bias, int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) { return; }
    const floatX *x = inp + (size_t)n * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) { sum += (float)x[c]; }
    float m = warp_reduce_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) { float d = (float)x[c] - m; var += d * d; }
    float s = rsqrtf(warp_reduce_sum(var) / C + 1e-5f);
    floatX *o = out + (size_t)n * C;
    for (int c = lane; c < C; c += 32) {
        o[c] = (floatX)((s * ((float)x[c] - m)) * (float)weight[c] + (float)bias[c]);
    }
    if (lane == 0) { mean[n] = m; rstd[n] = s; }
}

// One warp per row n: dinp (N, C) += the input gradient (the two row reductions of the CPU loop).
__global__ void layernorm_backward_dinp_kernel(floatX *dinp, const floatX *dout, const floatX *inp,
                                               const floatX *weight, const float *mean, const float *rstd, int N,
                                               int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) { return; }
    const floatX *dy = dout + (size_t)n * C;
    const floatX *x = inp + (size_t)n * C;
    floatX *dx = dinp + (size_t)n * C;
    float m = mean[n], s = rstd[n];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xhat = ((float)x[c] - m) * s;
        float dnorm = (float)weight[c] * (float)dy[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * xhat;
    }
    dnorm_mean = warp_reduce_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_reduce_sum(dnorm_norm_mean) / C;
    for (int c = lane; c < C; c += 32) {
        float xhat = ((float)x[c] - m) * s;
        float dnorm = (float)weight[c] * (float)dy[c];
        dx[c] = (floatX)((float)dx[c] + (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * s);
    }
}

static void layernorm_forward_cuda(floatX *out, float *mean, float *rstd, const floatX *inp,
                                   const floatX *weight, const floatX *bias, int N, int C) {
    if (N <= 0) { return; }
    const int block = 256, rows_per_block = block / 32;
    LAUNCH(layernorm_forward_kernel, ceil_div(N, rows_per_block), block, 0, main_stream)(out, mean, rstd, inp, weight,
            bias, N, C);
    cudaCheckLaunch();
}

static void layernorm_backward_cuda(floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout, const floatX *inp,
                                    const floatX *weight, const float *mean, const float *rstd, int N, int C) {
    if (N <= 0) { return; }
    const int block = 256, rows_per_block = block / 32;
    if (dinp != NULL) {
        LAUNCH(layernorm_backward_dinp_kernel, ceil_div(N, rows_per_block), block, 0, main_stream)(dinp, dout, inp, weight,
                mean, rstd, N, C);
        cudaCheckLaunch();
    }
    // dbias += sum dy, dweight += sum xhat dy (residual.h)
    if (dweight != NULL) { column_sums_accumulate(dbias, dweight, dout, inp, mean, rstd, N, C); }
}

// ---- residual add + LayerNorm, one kernel ----
// V consecutive floatX moved as one load/store (16 bytes when V = 16 / sizeof(floatX))
template <int V> struct __align__(sizeof(floatX) * V) FloatXPack { floatX v[V]; };

// One block per row n; thread t owns the packs t, t + blockDim.x, ... (at most P of them) of V channels.
// It reads res, x, bias once, writes res_out, keeps the row in registers (as the floatX value stored in
// res_out, so mean/rstd/ln_out describe exactly what the backward pass will read back), and after the
// two block reductions (mean, then the variance about it, as the CPU loop) writes ln_out.
// res_out may alias res or x: every element is read before it is written, by the same thread.
template <int V, int P>
__global__ void residual_layernorm_forward_kernel(floatX *res_out, floatX *ln_out, float *mean, float *rstd,
                                                  const floatX *res, const floatX *x, const floatX *bias,
                                                  const floatX *weight, const floatX *lnbias, int C) {
    typedef FloatXPack<V> Pack;
    const int n = blockIdx.x, npacks = C / V;
    const size_t row = (size_t)n * C;
    float v[P][V];
    float sum = 0.0f;
    #pragma unroll
    for (int p = 0; p < P; p++) {
        int i = threadIdx.x + p * blockDim.x;
        if (i < npacks) {
            Pack r = *(const Pack *)(res + row + (size_t)i * V);
            Pack a = *(const Pack *)(x + row + (size_t)i * V);
            float bv[V];
            if (bias != NULL) {
                Pack b = *(const Pack *)(bias + (size_t)i * V);
                #pragma unroll
                for (int j = 0; j < V; j++) { bv[j] = (float)b.v[j]; }
            } else {
                #pragma unroll
                for (int j = 0; j < V; j++) { bv[j] = 0.0f; }
            }
            Pack o;
            #pragma unroll
            for (int j = 0; j < V; j++) {
                o.v[j] = (floatX)((float)r.v[j] + (float)a.v[j] + bv[j]);
                v[p][j] = (float)o.v[j];
                sum += v[p][j];
            }
            *(Pack *)(res_out + row + (size_t)i * V) = o;
        } else {
            #pragma unroll
            for (int j = 0; j < V; j++) { v[p][j] = 0.0f; }
        }
    }
    const float m = block_reduce_sum(sum) / C;
    float var = 0.0f;
    #pragma unroll
    for (int p = 0; p < P; p++) {
        if ((int)(threadIdx.x + p * blockDim.x) < npacks) {
            #pragma unroll
            for (int j = 0; j < V; j++) { float d = v[p][j] - m; var += d * d; }
        }
    }
    const float s = rsqrtf(block_reduce_sum(var) / C + 1e-5f);
    #pragma unroll
    for (int p = 0; p < P; p++) {
        int i = threadIdx.x + p * blockDim.x;
        if (i < npacks) {
            Pack w = *(const Pack *)(weight + (size_t)i * V);
            Pack b = *(const Pack *)(lnbias + (size_t)i * V);
            Pack o;
            #pragma unroll
            for (int j = 0; j < V; j++) { o.v[j] = (floatX)((s * (v[p][j] - m)) * (float)w.v[j] + (float)b.v[j]); }
            *(Pack *)(ln_out + row + (size_t)i * V) = o;
        }
    }
    if (threadIdx.x == 0) { mean[n] = m; rstd[n] = s; }
}

template <int V>
static int residual_layernorm_forward_launch(floatX *res_out, floatX *ln_out, float *mean, float *rstd,
                                             const floatX *res, const floatX *x, const floatX *bias,
                                             const floatX *weight, const floatX *lnbias, int N, int C) {
    const int npacks = C / V;
    const int block = npacks >= 1024 ? 1024 : ceil_div(npacks, 32) * 32;
    const int per_thread = ceil_div(npacks, block);
    #define RLN_LAUNCH(P) LAUNCH((residual_layernorm_forward_kernel<V, P>), N, block, 0, main_stream)( \
        res_out, ln_out, mean, rstd, res, x, bias, weight, lnbias, C)
    if (per_thread <= 1) { RLN_LAUNCH(1); }
    else if (per_thread <= 2) { RLN_LAUNCH(2); }
    else if (per_thread <= 4) { RLN_LAUNCH(4); }
    else { return 0; }
    #undef RLN_LAUNCH
    cudaCheckLaunch();
    return 1;
}

// res_out = res + x + bias, then ln_out = layernorm(res_out): one kernel (16-byte loads when C and
// every pointer allow, else element by element). Rows too long for its registers (C > 4096 * V):
// the two separate kernels. ln_out must not alias res, x or res_out.
static void residual_layernorm_forward_cuda(floatX *res_out, floatX *ln_out, float *mean, float *rstd,
                                            const floatX *res, const floatX *x, const floatX *bias,
                                            const floatX *weight, const floatX *lnbias, int N, int C) {
    if (N <= 0 || C <= 0) { return; }
    const int VEC = 16 / (int)sizeof(floatX);
    uintptr_t addr = (uintptr_t)res_out | (uintptr_t)ln_out | (uintptr_t)res | (uintptr_t)x | (uintptr_t)bias |
                     (uintptr_t)weight | (uintptr_t)lnbias;   // bias NULL: 0, no constraint
    int vec_ok = C % VEC == 0 && addr % 16 == 0;
    if (vec_ok && residual_layernorm_forward_launch<VEC>(res_out, ln_out, mean, rstd, res, x, bias, weight, lnbias, N,
                                                         C)) {
        return;
    }
    if (!vec_ok && residual_layernorm_forward_launch<1>(res_out, ln_out, mean, rstd, res, x, bias, weight, lnbias, N,
                                                        C)) {
        return;
    }
    residual_bias_forward_cuda(res_out, res, x, bias, N, C);
    layernorm_forward_cuda(ln_out, mean, rstd, res_out, weight, lnbias, N, C);
}
#endif

static void layernorm_forward(floatX *out, float *mean, float *rstd, const floatX *inp,
                              const floatX *weight, const floatX *bias, int N, int C) {
#ifdef USE_CUDA
    layernorm_forward_cuda(out, mean, rstd, inp, weight, bias, N, C);
#else
    layernorm_forward_cpu(out, mean, rstd, inp, weight, bias, N, C);
#endif
}

static void layernorm_backward(floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout, const floatX *inp,
                               const floatX *weight, const float *mean, const float *rstd, int N, int C) {
#ifdef USE_CUDA
    layernorm_backward_cuda(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
#else
    layernorm_backward_cpu(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
#endif
}

static void residual_layernorm_forward(floatX *res_out, floatX *ln_out, float *mean, float *rstd, const floatX *res,
                                       const floatX *x, const floatX *bias, const floatX *weight, const floatX *lnbias,
                                       int N, int C) {
#ifdef USE_CUDA
    residual_layernorm_forward_cuda(res_out, ln_out, mean, rstd, res, x, bias, weight, lnbias, N, C);
#else
    residual_layernorm_forward_cpu(res_out, ln_out, mean, rstd, res, x, bias, weight, lnbias, N, C);
#endif
}

#endif
