// GELU forward/backward (backward also in place): CPU loop vs CUDA kernel, timing.
// GPT-2 124M shape: the fc activations, B*T*4C = 8*1024*3072.
#include "../../llmc/gelu.h"
#include "common.h"

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "gelu");
    rng_seed(3);
    int fails = 0;
    const size_t n = (size_t)8 * 1024 * 3072 + 7;   // + 7: a tail that is not a multiple of anything
    float *inp = make_random(n, -6.0f, 6.0f), *out = (float *)malloc_check(n * sizeof(float));
    floatX *d_inp = to_device(inp, n), *d_out = to_device(inp, n);
    gelu_forward_cpu(out, inp, n);
    gelu_forward_cuda(d_out, d_inp, n);
    fails += compare_device("gelu_forward out", d_out, out, n, TOL_X_GELU);

    float *dout = make_random(n, -1.0f, 1.0f), *dinp = (float *)malloc_check(n * sizeof(float));
    floatX *d_dout = to_device(dout, n), *d_dinp = to_device(dout, n);
    gelu_backward_cpu(dinp, inp, dout, n);
    gelu_backward_cuda(d_dinp, d_inp, d_dout, n);
    fails += compare_device("gelu_backward dinp", d_dinp, dinp, n, TOL_X_GELU);
    gelu_backward_cuda(d_dout, d_inp, d_dout, n);           // in place: dinp aliases dout
    fails += compare_device("gelu_backward in place", d_dout, dinp, n, TOL_X_GELU);

    report_time("gelu_forward", time_ms(20, [&] { gelu_forward_cuda(d_out, d_inp, n); }), 2.0 * n * sizeof(floatX), 0);
    report_time("gelu_backward", time_ms(20, [&] { gelu_backward_cuda(d_dinp, d_inp, d_dinp, n); }), 3.0 * n * sizeof(floatX), 0);
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_dinp));
    free(inp); free(out); free(dout); free(dinp);
    return harness_finish(fails);
}
