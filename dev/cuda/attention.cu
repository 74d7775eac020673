// Causal attention forward (out, lse) and backward (dqkv): CPU loops vs EVERY CUDA path: flash (the
// tensor-core flash kernels of flash_attention.h: bf16 builds, head size 64 and 128), cuBLAS (the
// default: tensor-core GEMMs through an (NH, T, T) workspace) and tiled (fp32 CUDA cores), for every
// supported head size, odd T, grouped-query attention (KV < NH kv heads), determinism, timing.
// GPT-2 124M shape: B=4, T=1024, C=768, NH=12.
#include "../../llmc/attention.h"
#include "common.h"

static const char *path_name(int path) { return path == ATT_FLASH ? "flash" : path == ATT_CUBLAS ? "cublas" : "tiled"; }

// The tensor-core paths' precision contract: the tensor cores take floatX operands, so P (forward and
// backward) and dS are rounded to floatX before their products, as in FlashAttention and cuDNN. Each
// rounding changes a term a_j b_j of a sum by at most u |a_j b_j| (u = 2^-8 in bf16, 2^-24 in fp32),
// so those paths may differ from attention.h's fp32 loops by up to
//     kappa = u sum_j |a_j b_j|   over the rounded terms of each output element
// on top of TOL_X. Where an output cancels to ~0 that term dominates (measured on an H200 at B4 T1024:
// up to 4x TOL_X on 0.02% of the elements without it; the same loops with P and dS rounded on the CPU
// still differed where GPU and CPU round a large p to neighbouring bf16 values). kappa is a bound,
// not a fit; an indexing or masking error still gives O(rms) errors. The tiled path keeps P and dS in
// fp32 and gets no kappa. With grouped-query attention the cuBLAS path sums a kv head's dK, dV over its G
// query heads in floatX (a GEMM with beta = 1 per head), rounding each partial sum: u |partial| more for each
// but the last (the other paths sum in fp32: for them this only loosens the bound by as much).
#if defined(ENABLE_FP32)
static const float ATT_U = 0x1p-24f;
#else
static const float ATT_U = 0x1p-8f;
#endif

// kappa of out (B, T, NH hs): u sum_t2 p |v|
static void attention_forward_kappa(float *kappa, const float *qkv, const float *lse, int B, int T, int NH, int KV,
                                    int hs) {
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *kbase = qkv + (size_t)b * T * W + (NH + h / (NH / KV)) * hs;   // its kv head's k; v at + KV hs
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * W + h * hs;
                float *kap = kappa + ((size_t)b * T + t) * C + h * hs;
                float l = lse[((size_t)b * NH + h) * T + t];
                for (int i = 0; i < hs; i++) { kap[i] = 0.0f; }
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = kbase + t2 * W, *v = k + KV * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) { s += q[i] * k[i]; }
                    float p = expf(s * scale - l);
                    for (int i = 0; i < hs; i++) { kap[i] += ATT_U * p * fabsf(v[i]); }
                }
            }
        }
    }
}

// One query head h's terms of the backward's kappa (into kappa, (T, (NH + 2KV) hs) of batch index b): dq: u sum |ds|
// |k|, dk: u sum |ds| |q|, dv: u sum p |dy|; and its dk, dv added to pk, pv (T, hs): the kv head's partial sums
static void attention_backward_kappa_head(float *kappa, float *pk, float *pv, const float *dout, const float *qkv,
                                          const float *out, const float *lse, int b, int h, int T, int NH, int KV,
                                          int hs) {
    size_t W = (size_t)(NH + 2 * KV) * hs, C = (size_t)NH * hs, kcol = (size_t)(NH + h / (NH / KV)) * hs;
    float scale = 1.0f / sqrtf((float)hs);
    for (int t = 0; t < T; t++) {
        const float *q = qkv + ((size_t)b * T + t) * W + h * hs;
        const float *dy = dout + ((size_t)b * T + t) * C + h * hs, *y = out + ((size_t)b * T + t) * C + h * hs;
        float *kq = kappa + (size_t)t * W + h * hs;
        float l = lse[((size_t)b * NH + h) * T + t], D = 0.0f;
        for (int i = 0; i < hs; i++) { D += dy[i] * y[i]; }
        for (int t2 = 0; t2 <= t; t2++) {
            const float *k = qkv + ((size_t)b * T + t2) * W + kcol, *v = k + KV * hs;
            float *kk = kappa + (size_t)t2 * W + kcol, *kv = kk + KV * hs;
            float s = 0.0f, dp = 0.0f;
            for (int i = 0; i < hs; i++) { s += q[i] * k[i]; dp += dy[i] * v[i]; }
            float p = expf(s * scale - l), ds = p * (dp - D) * scale;
            for (int i = 0; i < hs; i++) {
                kq[i] += ATT_U * fabsf(ds) * fabsf(k[i]);
                kk[i] += ATT_U * fabsf(ds) * fabsf(q[i]);
                kv[i] += ATT_U * p * fabsf(dy[i]);
                pk[(size_t)t2 * hs + i] += ds * q[i];
                pv[(size_t)t2 * hs + i] += p * dy[i];
            }
        }
    }
}

// kappa of dqkv (B, T, (NH + 2KV) hs): the heads' terms, and u |partial| of a kv head's dk, dv after each of its
// query heads but the last (the cuBLAS path's floatX partial sums)
static void attention_backward_kappa(float *kappa, const float *dout, const float *qkv, const float *out,
                                     const float *lse, int B, int T, int NH, int KV, int hs) {
    size_t W = (size_t)(NH + 2 * KV) * hs;
    int G = NH / KV;
    memset(kappa, 0, (size_t)B * T * W * sizeof(float));
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int kh = 0; kh < KV; kh++) {   // this (b, kv head) owns its heads' slices
            float *pk = (float *)calloc((size_t)2 * T * hs, sizeof(float)), *pv = pk + (size_t)T * hs;
            float *kb = kappa + (size_t)b * T * W;
            for (int h = kh * G; h < (kh + 1) * G; h++) {
                attention_backward_kappa_head(kb, pk, pv, dout, qkv, out, lse, b, h, T, NH, KV, hs);
                for (int t = 0; t < T && h < (kh + 1) * G - 1; t++) {
                    for (int i = 0; i < hs; i++) {
                        kb[(size_t)t * W + (NH + kh) * hs + i] += ATT_U * fabsf(pk[(size_t)t * hs + i]);
                        kb[(size_t)t * W + (NH + KV + kh) * hs + i] += ATT_U * fabsf(pv[(size_t)t * hs + i]);
                    }
                }
            }
            free(pk);
        }
    }
}

// The CPU reference (plain loops) computes Bc = min(B, 4) sequences; sequence b >= Bc repeats sequence
// b % Bc (inputs and so results): the timed case runs at the step's shape, B16, every element checked.
static void repeat_sequences(float *x, size_t per_seq, int Bc, int B) {
    for (int b = Bc; b < B; b++) { memcpy(x + b * per_seq, x + (b % Bc) * per_seq, per_seq * sizeof(float)); }
}

static int run_case(int B, int T, int NH, int KV, int hs, int timed) {
    int fails = 0, Bc = B < 4 ? B : 4, W = (NH + 2 * KV) * hs, C = NH * hs;
    printf("-- B=%d T=%d NH=%d KV=%d (head size %d)%s\n", B, T, NH, KV, hs, Bc < B ? " (4 sequences repeated)" : "");
    size_t nqkv = (size_t)B * T * W, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    float *qkv = make_random(nqkv, -1.5f, 1.5f);
    repeat_sequences(qkv, (size_t)T * W, Bc, B);
    float *out = (float *)malloc_check(nout * sizeof(float)), *lse = (float *)malloc_check(nlse * sizeof(float));
    floatX *d_qkv = to_device(qkv, nqkv), *d_out;
    float *d_lse;
    cudaCheck(cudaMalloc(&d_out, nout * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_lse, nlse * sizeof(float)));
    attention_forward_cpu(out, lse, qkv, Bc, T, NH, KV, hs);
    repeat_sequences(out, (size_t)T * C, Bc, B);
    repeat_sequences(lse, (size_t)NH * T, Bc, B);
    // backward from the CPU forward results (rounded to floatX like the kernels' inputs)
    float *out_x = copy_floats(out, nout);
    for (size_t i = 0; i < nout; i++) { out_x[i] = floatX_to_float(float_to_floatX(out_x[i])); }
    float *dout = make_random(nout, -1.0f, 1.0f), *dqkv = (float *)malloc_check(nqkv * sizeof(float));
    repeat_sequences(dout, (size_t)T * C, Bc, B);
    attention_backward_cpu(dqkv, dout, qkv, out_x, lse, Bc, T, NH, KV, hs);
    repeat_sequences(dqkv, (size_t)T * W, Bc, B);
    float *kappa_out = (float *)malloc_check(nout * sizeof(float)), *kappa_dqkv = (float *)malloc_check(nqkv * sizeof(float));
    attention_forward_kappa(kappa_out, qkv, lse, Bc, T, NH, KV, hs);
    attention_backward_kappa(kappa_dqkv, dout, qkv, out_x, lse, Bc, T, NH, KV, hs);
    repeat_sequences(kappa_out, (size_t)T * C, Bc, B);
    repeat_sequences(kappa_dqkv, (size_t)T * W, Bc, B);
    floatX *d_dout = to_device(dout, nout), *d_dqkv, *d_dqkv2;
    cudaCheck(cudaMalloc(&d_dqkv, nqkv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_dqkv2, nqkv * sizeof(floatX)));

    double flops = 4.0 * B * NH * ((double)T * (T + 1) / 2) * hs;   // QK^T and PV, causal half
    float ms_fwd[3] = {0.0f, 0.0f, 0.0f}, ms_bwd[3] = {0.0f, 0.0f, 0.0f};
    for (int path = ATT_FLASH; path >= ATT_TILED; path--) {
        if (path == ATT_FLASH && !attention_flash_applies(hs, sizeof(floatX))) { continue; }
        attention_path = path;
        char what[64];
        printf("  [%s]\n", path_name(path));
        cudaCheck(cudaMemsetAsync(d_out, 0xff, nout * sizeof(floatX), main_stream));   // NaN garbage: every element must be written
        cudaCheck(cudaMemsetAsync(d_lse, 0xff, nlse * sizeof(float), main_stream));
        attention_forward_cuda(d_out, d_lse, d_qkv, B, T, NH, KV, hs);
        snprintf(what, sizeof(what), "%s forward out", path_name(path));
        fails += compare_device_bounded(what, d_out, out, path ? kappa_out : NULL, nout, TOL_X);
        snprintf(what, sizeof(what), "%s forward lse", path_name(path));
        fails += compare_device_f32(what, d_lse, lse, nlse, TOL_FP32);

        upload_floats(d_out, out_x, nout);
        copy_to_device(d_lse, lse, nlse * sizeof(float));
        cudaCheck(cudaMemsetAsync(d_dqkv, 0xff, nqkv * sizeof(floatX), main_stream));   // every element must be written
        attention_backward_cuda(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, NH, KV, hs);
        attention_backward_cuda(d_dqkv2, d_dout, d_qkv, d_out, d_lse, B, T, NH, KV, hs);
        snprintf(what, sizeof(what), "%s backward dqkv", path_name(path));
        fails += compare_device_bounded(what, d_dqkv, dqkv, path ? kappa_dqkv : NULL, nqkv, TOL_X);
        snprintf(what, sizeof(what), "%s backward rerun", path_name(path));
        fails += compare_bitwise(what, d_dqkv, d_dqkv2, nqkv * sizeof(floatX));

        if (timed) {
            snprintf(what, sizeof(what), "%s forward", path_name(path));
            ms_fwd[path] = time_ms(10, [&] { attention_forward_cuda(d_out, d_lse, d_qkv, B, T, NH, KV, hs); });
            report_time(what, ms_fwd[path], 0, flops);
            snprintf(what, sizeof(what), "%s backward", path_name(path));
            ms_bwd[path] = time_ms(10, [&] { attention_backward_cuda(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, NH, KV, hs); });
            report_time(what, ms_bwd[path], 0, 2.5 * flops);
        }
    }
    attention_path = ATT_CUBLAS;
    if (timed) {
        printf("  speedup cublas vs tiled: forward %.2fx, backward %.2fx\n",
               ms_fwd[1] > 0.0f ? ms_fwd[0] / ms_fwd[1] : 0.0f, ms_bwd[1] > 0.0f ? ms_bwd[0] / ms_bwd[1] : 0.0f);
        if (ms_fwd[2] > 0.0f) {
            printf("  speedup flash vs cublas: forward %.2fx, backward %.2fx\n", ms_fwd[1] / ms_fwd[2], ms_bwd[1] / ms_bwd[2]);
        }
    }
    cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_lse)); cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_dqkv)); cudaCheck(cudaFree(d_dqkv2));
    free(qkv); free(out); free(out_x); free(lse); free(dout); free(dqkv); free(kappa_out); free(kappa_dqkv);
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "attention");
    rng_seed(6);
    int fails = 0;
    fails += run_case(16, 1024, 12, 12, 64, 1);  // GPT-2 124M at the step's shape (B16 T1024), hs 64
    fails += run_case(2, 37, 3, 3, 16, 0);       // hs 16, T = 37: causal edges inside and past one warp of keys
    fails += run_case(2, 256, 4, 4, 16, 0);      // hs 16
    fails += run_case(2, 300, 4, 4, 32, 0);      // hs 32, T not a multiple of any tile
    fails += run_case(2, 200, 2, 2, 128, 0);     // hs 128
    fails += run_case(3, 1, 2, 2, 64, 0);        // a single token
    fails += run_case(1, 77, 6, 6, 64, 0);       // hs 64, tiny odd T
    fails += run_case(1, 1100, 12, 12, 64, 0);   // a larger T after the others: the workspace grows
    fails += run_case(1, 4096, 8, 8, 128, 1);    // hs 128 at T 4096 (flash: 64 tiles of queries and of keys)
    fails += run_case(2, 130, 4, 4, 64, 0);      // hs 64, T just past two flash tiles
    fails += run_case(2, 130, 8, 2, 64, 0);      // grouped-query: 4 query heads per kv head, hs 64
    fails += run_case(2, 77, 6, 1, 128, 0);      // multi-query, hs 128
    fails += run_case(2, 300, 4, 2, 32, 0);      // grouped-query, hs 32 (cuBLAS and tiled only)
    fails += run_case(2, 1024, 32, 8, 128, 1);   // a Llama 3 8B layer's heads (GQA, 4 per kv head) at T 1024
    return harness_finish(fails);
}
