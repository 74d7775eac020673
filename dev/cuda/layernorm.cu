// LayerNorm forward/backward: CPU loop vs CUDA kernels, determinism, timing.
// GPT-2 124M shapes: N = B*T = 8*1024 tokens, C = 768; plus an odd shape (N=333, C=100).
#include "../../llmc/layernorm.h"
#include "common.h"

static int run_case(int N, int C, int timed) {
    int fails = 0;
    printf("-- N=%d C=%d\n", N, C);
    size_t NC = (size_t)N * C;
    float *inp = make_random(NC, -2.0f, 3.0f);     // nonzero mean, like the residual stream
    float *w = make_random(C, 0.5f, 1.5f), *b = make_random(C, -0.5f, 0.5f);
    float *out = (float *)malloc_check(NC * sizeof(float));
    float *mean = (float *)malloc_check(N * sizeof(float)), *rstd = (float *)malloc_check(N * sizeof(float));
    floatX *d_inp = to_device(inp, NC), *d_w = to_device(w, C), *d_b = to_device(b, C), *d_out = to_device(inp, NC);
    float *d_mean, *d_rstd;
    cudaCheck(cudaMalloc(&d_mean, N * sizeof(float)));
    cudaCheck(cudaMalloc(&d_rstd, N * sizeof(float)));

    layernorm_forward_cpu(out, mean, rstd, inp, w, b, N, C);
    layernorm_forward_cuda(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
    fails += compare_device("layernorm_forward out", d_out, out, NC, TOL_X);
    fails += compare_device_f32("layernorm_forward mean", d_mean, mean, N, TOL_FP32);
    fails += compare_device_f32("layernorm_forward rstd", d_rstd, rstd, N, TOL_FP32);

    // backward from the CPU statistics (both sides get the same mean/rstd)
    float *dout = make_random(NC, -1.0f, 1.0f);
    float *dinp = make_random(NC, -1.0f, 1.0f);              // accumulated into
    float *dw = make_random(C, -1.0f, 1.0f), *db = make_random(C, -1.0f, 1.0f);
    floatX *d_dout = to_device(dout, NC), *d_dinp = to_device(dinp, NC), *d_dw = to_device(dw, C), *d_db = to_device(db, C);
    floatX *d_dinp2 = to_device(dinp, NC), *d_dw2 = to_device(dw, C), *d_db2 = to_device(db, C);
    copy_to_device(d_mean, mean, N * sizeof(float));
    copy_to_device(d_rstd, rstd, N * sizeof(float));
    layernorm_backward_cpu(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    layernorm_backward_cuda(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    layernorm_backward_cuda(d_dinp2, d_dw2, d_db2, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    fails += compare_device("layernorm_backward dinp", d_dinp, dinp, NC, TOL_X);
    fails += compare_device("layernorm_backward dweight", d_dw, dw, C, TOL_X);
    fails += compare_device("layernorm_backward dbias", d_db, db, C, TOL_X);
    fails += compare_bitwise("layernorm_backward rerun dw", d_dw, d_dw2, C * sizeof(floatX));
    fails += compare_bitwise("layernorm_backward rerun dinp", d_dinp, d_dinp2, NC * sizeof(floatX));

    if (timed) {
        report_time("layernorm_forward", time_ms(20, [&] { layernorm_forward_cuda(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C); }),
                    2.0 * NC * sizeof(floatX), 0);
        report_time("layernorm_backward", time_ms(20, [&] { layernorm_backward_cuda(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C); }),
                    6.0 * NC * sizeof(floatX), 0);
    }
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_b)); cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_mean)); cudaCheck(cudaFree(d_rstd)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_dinp));
    cudaCheck(cudaFree(d_dw)); cudaCheck(cudaFree(d_db)); cudaCheck(cudaFree(d_dinp2)); cudaCheck(cudaFree(d_dw2));
    cudaCheck(cudaFree(d_db2));
    free(inp); free(w); free(b); free(out); free(mean); free(rstd); free(dout); free(dinp); free(dw); free(db);
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "layernorm");
    rng_seed(2);
    int fails = 0;
    fails += run_case(8 * 1024, 768, 1);
    fails += run_case(333, 100, 0);
    return harness_finish(fails);
}
