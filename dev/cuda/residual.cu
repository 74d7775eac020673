// Residual + bias forward (also in place), bias gradient (deterministic), accumulate: CPU vs CUDA.
// GPT-2 124M shapes: N = 8*1024 tokens, C = 768 (and 3072 for the fc bias gradient).
#include "../../llmc/residual.h"
#include "common.h"

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "residual");
    rng_seed(4);
    int fails = 0;
    const int N = 8 * 1024, C = 768;
    const size_t NC = (size_t)N * C;
    float *res = make_random(NC, -1.0f, 1.0f), *x = make_random(NC, -1.0f, 1.0f), *bias = make_random(C, -1.0f, 1.0f);
    float *out = (float *)malloc_check(NC * sizeof(float)), *out_nb = (float *)malloc_check(NC * sizeof(float));
    floatX *d_res = to_device(res, NC), *d_x = to_device(x, NC), *d_bias = to_device(bias, C), *d_out = to_device(res, NC);
    residual_bias_forward_cpu(out, res, x, bias, N, C);
    residual_bias_forward_cpu(out_nb, res, x, NULL, N, C);
    residual_bias_forward_cuda(d_out, d_res, d_x, d_bias, N, C);
    fails += compare_device("residual_bias_forward", d_out, out, NC, TOL_X);
    residual_bias_forward_cuda(d_out, d_res, d_x, NULL, N, C);
    fails += compare_device("residual_forward (no bias)", d_out, out_nb, NC, TOL_X);
    residual_bias_forward_cuda(d_res, d_res, d_x, d_bias, N, C);   // out aliases res
    fails += compare_device("residual_bias_forward in place", d_res, out, NC, TOL_X);

    const int Cs[2] = {768, 3072};
    for (int k = 0; k < 2; k++) {
        int Cb = Cs[k];
        float *dout = make_random((size_t)N * Cb, -1.0f, 1.0f), *db = make_random(Cb, -1.0f, 1.0f);
        floatX *d_dout = to_device(dout, (size_t)N * Cb), *d_db = to_device(db, Cb), *d_db2 = to_device(db, Cb);
        bias_backward_cpu(db, dout, N, Cb);
        bias_backward_cuda(d_db, d_dout, N, Cb);
        bias_backward_cuda(d_db2, d_dout, N, Cb);
        fails += compare_device(Cb == 768 ? "bias_backward C=768" : "bias_backward C=3072", d_db, db, Cb, TOL_X);
        fails += compare_bitwise("bias_backward rerun", d_db, d_db2, Cb * sizeof(floatX));
        report_time("bias_backward", time_ms(20, [&] { bias_backward_cuda(d_db, d_dout, N, Cb); }), (double)N * Cb * sizeof(floatX), 0);
        cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_db)); cudaCheck(cudaFree(d_db2));
        free(dout); free(db);
    }

    float *dst = make_random(NC, -1.0f, 1.0f);
    floatX *d_dst = to_device(dst, NC);
    accumulate_cpu(dst, x, NC);
    accumulate_cuda(d_dst, d_x, NC);
    fails += compare_device("accumulate", d_dst, dst, NC, TOL_X);

    report_time("residual_bias_forward", time_ms(20, [&] { residual_bias_forward_cuda(d_out, d_res, d_x, d_bias, N, C); }),
                3.0 * NC * sizeof(floatX), 0);
    report_time("accumulate", time_ms(20, [&] { accumulate_cuda(d_dst, d_x, NC); }), 3.0 * NC * sizeof(floatX), 0);
    cudaCheck(cudaFree(d_res)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_bias)); cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_dst));
    free(res); free(x); free(bias); free(out); free(out_nb); free(dst);
    return harness_finish(fails);
}
