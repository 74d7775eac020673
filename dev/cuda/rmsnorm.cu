// RMSNorm forward/backward and the residual add fused with it (llmc/rmsnorm.h): CPU loops vs CUDA kernels,
// the backward's two parts apart (ZB's B and W) and together, determinism, timing.
// Shapes: N = 8*1024 tokens at C = 768 and C = 4096 (Llama 3 8B); an odd one (N=333, C=100).
#include "../../llmc/rmsnorm.h"
#include "common.h"

static int run_case(int N, int C, float eps, int timed) {
    int fails = 0;
    printf("-- rmsnorm N=%d C=%d eps=%g\n", N, C, eps);
    size_t NC = (size_t)N * C;
    float *inp = make_random(NC, -2.0f, 3.0f), *w = make_random(C, 0.5f, 1.5f);
    float *out = (float *)malloc_check(NC * sizeof(float)), *rstd = (float *)malloc_check(N * sizeof(float));
    floatX *d_inp = to_device(inp, NC), *d_w = to_device(w, C), *d_out = to_device(inp, NC);
    float *d_rstd;
    cudaCheck(cudaMalloc(&d_rstd, N * sizeof(float)));

    rmsnorm_forward_cpu(out, rstd, inp, w, eps, N, C);
    rmsnorm_forward_cuda(d_out, d_rstd, d_inp, d_w, eps, N, C);
    fails += compare_device("rmsnorm_forward out", d_out, out, NC, TOL_X);
    fails += compare_device_f32("rmsnorm_forward rstd", d_rstd, rstd, N, TOL_FP32);

    // backward from the CPU rstd (both sides get the same); dinp and dweight are accumulated into
    float *dout = make_random(NC, -1.0f, 1.0f), *dinp = make_random(NC, -1.0f, 1.0f), *dw = make_random(C, -1.0f, 1.0f);
    floatX *d_dout = to_device(dout, NC), *d_dinp = to_device(dinp, NC), *d_dw = to_device(dw, C);
    floatX *d_dinp2 = to_device(dinp, NC), *d_dw2 = to_device(dw, C);
    copy_to_device(d_rstd, rstd, N * sizeof(float));
    rmsnorm_backward_cpu(dinp, dw, dout, inp, w, rstd, N, C);
    rmsnorm_backward_cuda(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, C);
    fails += compare_device("rmsnorm_backward dinp", d_dinp, dinp, NC, TOL_X);
    fails += compare_device("rmsnorm_backward dweight", d_dw, dw, C, TOL_X);
    // the two parts apart (dweight NULL, then dinp NULL): the same bits as together
    rmsnorm_backward_cuda(d_dinp2, NULL, d_dout, d_inp, d_w, d_rstd, N, C);
    rmsnorm_backward_cuda(NULL, d_dw2, d_dout, d_inp, NULL, d_rstd, N, C);
    fails += compare_bitwise("rmsnorm_backward B, W apart dinp", d_dinp, d_dinp2, NC * sizeof(floatX));
    fails += compare_bitwise("rmsnorm_backward B, W apart dw", d_dw, d_dw2, C * sizeof(floatX));

    if (timed) {
        report_time("rmsnorm_forward", time_ms(20, [&] { rmsnorm_forward_cuda(d_out, d_rstd, d_inp, d_w, eps, N, C); }),
                    2.0 * NC * sizeof(floatX), 0);
        report_time("rmsnorm_backward", time_ms(20, [&] { rmsnorm_backward_cuda(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, C); }),
                    6.0 * NC * sizeof(floatX), 0);
    }
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_rstd));
    cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_dinp)); cudaCheck(cudaFree(d_dw)); cudaCheck(cudaFree(d_dinp2));
    cudaCheck(cudaFree(d_dw2));
    free(inp); free(w); free(out); free(rstd); free(dout); free(dinp); free(dw);
    return fails;
}

// residual_rmsnorm_forward against residual_bias_forward_cpu + rmsnorm_forward_cpu.
// alias: 0 res_out is its own buffer, 1 res_out = res, 2 res_out = x
static int run_residual_case(int N, int C, int use_bias, int alias, int timed) {
    int fails = 0;
    printf("-- residual_rmsnorm N=%d C=%d bias=%d res_out%s\n", N, C, use_bias,
           alias == 1 ? " = res" : alias == 2 ? " = x" : " separate");
    const float eps = 1e-5f;
    size_t NC = (size_t)N * C;
    float *res = make_random(NC, -2.0f, 3.0f), *x = make_random(NC, -1.0f, 1.0f), *bias = make_random(C, -0.5f, 0.5f);
    float *w = make_random(C, 0.5f, 1.5f);
    float *res_out = (float *)malloc_check(NC * sizeof(float)), *ln = (float *)malloc_check(NC * sizeof(float));
    float *rstd = (float *)malloc_check(N * sizeof(float));
    floatX *d_res = to_device(res, NC), *d_x = to_device(x, NC), *d_bias = to_device(bias, C), *d_w = to_device(w, C);
    floatX *d_out = to_device(res, NC), *d_ln = to_device(res, NC);
    float *d_rstd;
    cudaCheck(cudaMalloc(&d_rstd, N * sizeof(float)));
    floatX *d_res_out = alias == 1 ? d_res : alias == 2 ? d_x : d_out;
    const floatX *d_bb = use_bias ? d_bias : NULL;

    residual_rmsnorm_forward_cpu(res_out, ln, rstd, res, x, use_bias ? bias : NULL, w, eps, N, C);
    residual_rmsnorm_forward_cuda(d_res_out, d_ln, d_rstd, d_res, d_x, d_bb, d_w, eps, N, C);
    fails += compare_device("residual_rmsnorm res_out", d_res_out, res_out, NC, TOL_X);
    fails += compare_device("residual_rmsnorm ln_out", d_ln, ln, NC, TOL_X);
    fails += compare_device_f32("residual_rmsnorm rstd", d_rstd, rstd, N, TOL_X);
    // rstd and ln_out describe the stored (floatX) residual stream: against the RMSNorm loop on the rounded
    // res_out, rstd must match to fp32 accuracy
    float *rounded = copy_floats(res_out, NC);
    for (size_t i = 0; i < NC; i++) { rounded[i] = floatX_to_float(float_to_floatX(rounded[i])); }
    rmsnorm_forward_cpu(ln, rstd, rounded, w, eps, N, C);
    fails += compare_device("ln_out of stored res_out", d_ln, ln, NC, TOL_X);
    fails += compare_device_f32("rstd of stored res_out", d_rstd, rstd, N, TOL_FP32);

    if (timed) {
        report_time("residual_rmsnorm fused", time_ms(20, [&] {
            residual_rmsnorm_forward_cuda(d_out, d_ln, d_rstd, d_res, d_x, d_bb, d_w, eps, N, C);
        }), 4.0 * NC * sizeof(floatX), 0);
        report_time("residual + rmsnorm", time_ms(20, [&] {
            residual_bias_forward_cuda(d_out, d_res, d_x, d_bb, N, C);
            rmsnorm_forward_cuda(d_ln, d_rstd, d_out, d_w, eps, N, C);
        }), 4.0 * NC * sizeof(floatX), 0);
    }
    cudaCheck(cudaFree(d_res)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_bias)); cudaCheck(cudaFree(d_w));
    cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_ln)); cudaCheck(cudaFree(d_rstd));
    free(res); free(x); free(bias); free(w); free(res_out); free(ln); free(rstd); free(rounded);
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "rmsnorm");
    rng_seed(21);
    int fails = 0;
    fails += run_case(8 * 1024, 768, 1e-5f, 1);
    fails += run_case(8 * 1024, 4096, 1e-5f, 1);     // Llama 3 8B width
    fails += run_case(333, 100, 1e-6f, 0);           // odd shape, another eps
    fails += run_residual_case(8 * 1024, 4096, 0, 0, 1);
    fails += run_residual_case(1024, 768, 1, 1, 0);  // in place over res, with bias
    fails += run_residual_case(1024, 768, 0, 2, 0);  // in place over x
    fails += run_residual_case(333, 100, 1, 0, 0);   // odd width
    return harness_finish(fails);
}
