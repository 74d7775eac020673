// Residual add fused with the LayerNorm that follows it (llmc/layernorm.h residual_layernorm_forward):
// against its CPU version (residual_bias_forward_cpu, then layernorm_forward_cpu), in place (res_out
// aliasing res or x), without bias, then timed against the two separate kernels.
// GPT-2 124M shape: N = 8*1024 tokens, C = 768; also C = 1600 (GPT-2 XL), odd/misaligned rows (the
// element-by-element kernel), rows long enough for 2 and 4 packs per thread, and rows too long for the
// kernel (the two-kernel fallback).
#include "../../llmc/layernorm.h"
#include "common.h"

// alias: 0 res_out is its own buffer, 1 res_out = res, 2 res_out = x
static int run_case(int N, int C, int use_bias, int alias, int skew, int timed) {
    int fails = 0;
    printf("-- N=%d C=%d bias=%d res_out%s pointer skew=%d elements\n", N, C, use_bias,
           alias == 1 ? " = res" : alias == 2 ? " = x" : " separate", skew);
    size_t NC = (size_t)N * C;
    float *res = make_random(NC, -2.0f, 3.0f), *x = make_random(NC, -1.0f, 1.0f), *bias = make_random(C, -0.5f, 0.5f);
    float *w = make_random(C, 0.5f, 1.5f), *b = make_random(C, -0.5f, 0.5f);
    float *res_out = (float *)malloc_check(NC * sizeof(float)), *ln = (float *)malloc_check(NC * sizeof(float));
    float *mean = (float *)malloc_check(N * sizeof(float)), *rstd = (float *)malloc_check(N * sizeof(float));
    floatX *buf;
    size_t total = 4 * NC + 3 * (size_t)C + 8 * (size_t)skew + 64;
    cudaCheck(cudaMalloc(&buf, total * sizeof(floatX)));
    floatX *d_res = buf + skew, *d_x = d_res + NC + skew, *d_out = d_x + NC + skew, *d_ln = d_out + NC + skew;
    floatX *d_bias = d_ln + NC + skew, *d_w = d_bias + C + skew, *d_b = d_w + C + skew;
    upload_floats(d_res, res, NC);
    upload_floats(d_x, x, NC);
    upload_floats(d_bias, bias, C);
    upload_floats(d_w, w, C);
    upload_floats(d_b, b, C);
    float *d_mean, *d_rstd;
    cudaCheck(cudaMalloc(&d_mean, N * sizeof(float)));
    cudaCheck(cudaMalloc(&d_rstd, N * sizeof(float)));
    floatX *d_res_out = alias == 1 ? d_res : alias == 2 ? d_x : d_out;
    const floatX *d_bb = use_bias ? d_bias : NULL;

    residual_layernorm_forward_cpu(res_out, ln, mean, rstd, res, x, use_bias ? bias : NULL, w, b, N, C);
    residual_layernorm_forward_cuda(d_res_out, d_ln, d_mean, d_rstd, d_res, d_x, d_bb, d_w, d_b, N, C);
    fails += compare_device("residual_layernorm res_out", d_res_out, res_out, NC, TOL_X);
    fails += compare_device("residual_layernorm ln_out", d_ln, ln, NC, TOL_X);
    fails += compare_device_f32("residual_layernorm mean", d_mean, mean, N, TOL_X);
    fails += compare_device_f32("residual_layernorm rstd", d_rstd, rstd, N, TOL_X);
    // the statistics describe the stored (floatX) residual stream: against the LayerNorm loop on the
    // rounded res_out, they must match to fp32 accuracy (bf16 build; the same check again in fp32)
    float *rounded = copy_floats(res_out, NC);
    for (size_t i = 0; i < NC; i++) { rounded[i] = floatX_to_float(float_to_floatX(rounded[i])); }
    layernorm_forward_cpu(ln, mean, rstd, rounded, w, b, N, C);
    fails += compare_device("ln_out of stored res_out", d_ln, ln, NC, TOL_X);
    fails += compare_device_f32("mean of stored res_out", d_mean, mean, N, TOL_FP32);
    fails += compare_device_f32("rstd of stored res_out", d_rstd, rstd, N, TOL_FP32);

    if (timed) {
        report_time("residual_layernorm fused", time_ms(20, [&] {
            residual_layernorm_forward_cuda(d_out, d_ln, d_mean, d_rstd, d_res, d_x, d_bb, d_w, d_b, N, C);
        }), 4.0 * NC * sizeof(floatX), 0);
        report_time("residual + layernorm", time_ms(20, [&] {
            residual_bias_forward_cuda(d_out, d_res, d_x, d_bb, N, C);
            layernorm_forward_cuda(d_ln, d_mean, d_rstd, d_out, d_w, d_b, N, C);
        }), 4.0 * NC * sizeof(floatX), 0);
    }
    cudaCheck(cudaFree(buf)); cudaCheck(cudaFree(d_mean)); cudaCheck(cudaFree(d_rstd));
    free(res); free(x); free(bias); free(w); free(b); free(res_out); free(ln); free(mean); free(rstd); free(rounded);
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "residual_layernorm");
    rng_seed(12);
    int fails = 0;
    fails += run_case(8 * 1024, 768, 1, 0, 0, 1);     // GPT-2 124M
    fails += run_case(1024, 768, 0, 1, 0, 0);         // in place over res, no bias
    fails += run_case(1024, 768, 1, 2, 0, 0);         // in place over x
    fails += run_case(64, 1600, 1, 0, 0, 0);          // GPT-2 XL width
    fails += run_case(333, 100, 1, 0, 1, 0);          // odd width, misaligned: element by element
    fails += run_case(257, 768, 1, 1, 3, 0);          // aligned width, misaligned pointers
    fails += run_case(16, 10000, 1, 0, 0, 0);         // 2 (bf16) / 4 (fp32) packs per thread
    fails += run_case(7, 2999, 1, 0, 0, 0);           // element by element, 3 per thread
    fails += run_case(4, 33000, 1, 0, 0, 0);          // too long for the kernel: two kernels
    fails += run_case(5, 5001, 0, 1, 0, 0);           // too long element by element: two kernels
    return harness_finish(fails);
}
