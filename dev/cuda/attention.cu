// Causal attention forward (out, lse) and backward (dqkv): CPU loops vs EVERY CUDA path: flash (the
// tensor-core flash kernels of flash_attention.h: bf16 builds, head size 64 and 128), cuBLAS (the
// default: tensor-core GEMMs through an (NH, T, T) workspace) and tiled (fp32 CUDA cores), for every
// supported head size, odd T, determinism, timing. GPT-2 124M shape: B=4, T=1024, C=768, NH=12.
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
// fp32 and gets no kappa.
#if defined(ENABLE_FP32)
static const float ATT_U = 0x1p-24f;
#else
static const float ATT_U = 0x1p-8f;
#endif

// kappa of out (B, T, C): u sum_t2 p |v|
static void attention_forward_kappa(float *kappa, const float *qkv, const float *lse, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float *kap = kappa + ((size_t)b * T + t) * C + h * hs;
                float l = lse[((size_t)b * NH + h) * T + t];
                for (int i = 0; i < hs; i++) { kap[i] = 0.0f; }
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) { s += q[i] * k[i]; }
                    float p = expf(s * scale - l);
                    for (int i = 0; i < hs; i++) { kap[i] += ATT_U * p * fabsf(k[C + i]); }
                }
            }
        }
    }
}

// kappa of dqkv (B, T, 3C): dq: u sum |ds| |k|, dk: u sum |ds| |q|, dv: u sum p |dy|
static void attention_backward_kappa(float *kappa, const float *dout, const float *qkv, const float *out,
                                     const float *lse, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    memset(kappa, 0, (size_t)B * T * 3 * C * sizeof(float));
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {   // this (b, h) owns its slices of dq, dk, dv
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                const float *dy = dout + ((size_t)b * T + t) * C + h * hs, *y = out + ((size_t)b * T + t) * C + h * hs;
                float *kq = kappa + ((size_t)b * T + t) * 3 * C + h * hs;
                float l = lse[((size_t)b * NH + h) * T + t], D = 0.0f;
                for (int i = 0; i < hs; i++) { D += dy[i] * y[i]; }
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs, *v = k + C;
                    float *kk = kappa + ((size_t)b * T + t2) * 3 * C + C + h * hs, *kv = kk + C;
                    float s = 0.0f, dp = 0.0f;
                    for (int i = 0; i < hs; i++) { s += q[i] * k[i]; dp += dy[i] * v[i]; }
                    float p = expf(s * scale - l);
                    float ds = fabsf(p * (dp - D) * scale);
                    for (int i = 0; i < hs; i++) {
                        kq[i] += ATT_U * ds * fabsf(k[i]);
                        kk[i] += ATT_U * ds * fabsf(q[i]);
                        kv[i] += ATT_U * p * fabsf(dy[i]);
                    }
                }
            }
        }
    }
}

// The CPU reference (plain loops) computes Bc = min(B, 4) sequences; sequence b >= Bc repeats sequence
// b % Bc (inputs and so results): the timed case runs at the step's shape, B16, every element checked.
static void repeat_sequences(float *x, size_t per_seq, int Bc, int B) {
    for (int b = Bc; b < B; b++) { memcpy(x + b * per_seq, x + (b % Bc) * per_seq, per_seq * sizeof(float)); }
}

static int run_case(int B, int T, int C, int NH, int timed) {
    int fails = 0, Bc = B < 4 ? B : 4;
    printf("-- B=%d T=%d C=%d NH=%d (head size %d)%s\n", B, T, C, NH, C / NH, Bc < B ? " (4 sequences repeated)" : "");
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    float *qkv = make_random(nqkv, -1.5f, 1.5f);
    repeat_sequences(qkv, (size_t)T * 3 * C, Bc, B);
    float *out = (float *)malloc_check(nout * sizeof(float)), *lse = (float *)malloc_check(nlse * sizeof(float));
    floatX *d_qkv = to_device(qkv, nqkv), *d_out;
    float *d_lse;
    cudaCheck(cudaMalloc(&d_out, nout * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_lse, nlse * sizeof(float)));
    attention_forward_cpu(out, lse, qkv, Bc, T, C, NH);
    repeat_sequences(out, (size_t)T * C, Bc, B);
    repeat_sequences(lse, (size_t)NH * T, Bc, B);
    // backward from the CPU forward results (rounded to floatX like the kernels' inputs)
    float *out_x = copy_floats(out, nout);
    for (size_t i = 0; i < nout; i++) { out_x[i] = floatX_to_float(float_to_floatX(out_x[i])); }
    float *dout = make_random(nout, -1.0f, 1.0f), *dqkv = (float *)malloc_check(nqkv * sizeof(float));
    repeat_sequences(dout, (size_t)T * C, Bc, B);
    attention_backward_cpu(dqkv, dout, qkv, out_x, lse, Bc, T, C, NH);
    repeat_sequences(dqkv, (size_t)T * 3 * C, Bc, B);
    float *kappa_out = (float *)malloc_check(nout * sizeof(float)), *kappa_dqkv = (float *)malloc_check(nqkv * sizeof(float));
    attention_forward_kappa(kappa_out, qkv, lse, Bc, T, C, NH);
    attention_backward_kappa(kappa_dqkv, dout, qkv, out_x, lse, Bc, T, C, NH);
    repeat_sequences(kappa_out, (size_t)T * C, Bc, B);
    repeat_sequences(kappa_dqkv, (size_t)T * 3 * C, Bc, B);
    floatX *d_dout = to_device(dout, nout), *d_dqkv, *d_dqkv2;
    cudaCheck(cudaMalloc(&d_dqkv, nqkv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_dqkv2, nqkv * sizeof(floatX)));

    double flops = 4.0 * B * NH * ((double)T * (T + 1) / 2) * (C / NH);   // QK^T and PV, causal half
    float ms_fwd[3] = {0.0f, 0.0f, 0.0f}, ms_bwd[3] = {0.0f, 0.0f, 0.0f};
    for (int path = ATT_FLASH; path >= ATT_TILED; path--) {
        if (path == ATT_FLASH && !attention_flash_applies(C / NH, sizeof(floatX))) { continue; }
        attention_path = path;
        char what[64];
        printf("  [%s]\n", path_name(path));
        cudaCheck(cudaMemsetAsync(d_out, 0xff, nout * sizeof(floatX), main_stream));   // NaN garbage: every element must be written
        cudaCheck(cudaMemsetAsync(d_lse, 0xff, nlse * sizeof(float), main_stream));
        attention_forward_cuda(d_out, d_lse, d_qkv, B, T, C, NH);
        snprintf(what, sizeof(what), "%s forward out", path_name(path));
        fails += compare_device_bounded(what, d_out, out, path ? kappa_out : NULL, nout, TOL_X);
        snprintf(what, sizeof(what), "%s forward lse", path_name(path));
        fails += compare_device_f32(what, d_lse, lse, nlse, TOL_FP32);

        upload_floats(d_out, out_x, nout);
        copy_to_device(d_lse, lse, nlse * sizeof(float));
        cudaCheck(cudaMemsetAsync(d_dqkv, 0xff, nqkv * sizeof(floatX), main_stream));   // every element must be written
        attention_backward_cuda(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
        attention_backward_cuda(d_dqkv2, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
        snprintf(what, sizeof(what), "%s backward dqkv", path_name(path));
        fails += compare_device_bounded(what, d_dqkv, dqkv, path ? kappa_dqkv : NULL, nqkv, TOL_X);
        snprintf(what, sizeof(what), "%s backward rerun", path_name(path));
        fails += compare_bitwise(what, d_dqkv, d_dqkv2, nqkv * sizeof(floatX));

        if (timed) {
            snprintf(what, sizeof(what), "%s forward", path_name(path));
            ms_fwd[path] = time_ms(10, [&] { attention_forward_cuda(d_out, d_lse, d_qkv, B, T, C, NH); });
            report_time(what, ms_fwd[path], 0, flops);
            snprintf(what, sizeof(what), "%s backward", path_name(path));
            ms_bwd[path] = time_ms(10, [&] { attention_backward_cuda(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH); });
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
    fails += run_case(16, 1024, 768, 12, 1);  // GPT-2 124M at the step's shape (B16 T1024), hs 64
    fails += run_case(2, 37, 48, 3, 0);       // hs 16, T = 37: causal edges inside and past one warp of keys
    fails += run_case(2, 256, 64, 4, 0);      // hs 16
    fails += run_case(2, 300, 128, 4, 0);     // hs 32, T not a multiple of any tile
    fails += run_case(2, 200, 256, 2, 0);     // hs 128
    fails += run_case(3, 1, 128, 2, 0);       // a single token
    fails += run_case(1, 77, 384, 6, 0);      // hs 64, tiny odd T
    fails += run_case(1, 1100, 768, 12, 0);   // a larger T after the others: the workspace grows
    fails += run_case(1, 4096, 1024, 8, 1);   // hs 128 at T 4096 (flash: 64 tiles of queries and of keys)
    fails += run_case(2, 130, 256, 4, 0);     // hs 64, T just past two flash tiles
    return harness_finish(fails);
}
