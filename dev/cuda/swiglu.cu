// SwiGLU forward/backward (llmc/swiglu.h; backward also in place over inp): CPU loops vs CUDA kernels, timing.
// Shapes: Llama 3 8B's MLP, N = 4*1024 tokens, F = 14336; an odd one (N=33, F=1001). Gates include
// extremes (+-100, +-90) where exp(-g) overflows or underflows.
#include "../../llmc/swiglu.h"
#include "common.h"

static int run_case(int N, int F, int timed) {
    int fails = 0;
    printf("-- N=%d F=%d\n", N, F);
    size_t NF = (size_t)N * F, N2F = 2 * NF;
    float *inp = make_random(N2F, -8.0f, 8.0f);
    const float extremes[6] = {-100.0f, -90.0f, -20.0f, 20.0f, 90.0f, 100.0f};
    for (int i = 0; i < 6 && i < F; i++) { inp[i] = extremes[i]; }
    float *out = (float *)malloc_check(NF * sizeof(float));
    floatX *d_inp = to_device(inp, N2F), *d_out = to_device(inp, NF);
    swiglu_forward_cpu(out, inp, N, F);
    swiglu_forward_cuda(d_out, d_inp, N, F);
    fails += compare_device("swiglu_forward out", d_out, out, NF, TOL_X);

    float *dout = make_random(NF, -1.0f, 1.0f), *dinp = (float *)malloc_check(N2F * sizeof(float));
    floatX *d_dout = to_device(dout, NF), *d_dinp = to_device(inp, N2F);
    swiglu_backward_cpu(dinp, dout, inp, N, F);
    swiglu_backward_cuda(d_dinp, d_dout, d_inp, N, F);
    fails += compare_device("swiglu_backward dinp", d_dinp, dinp, N2F, TOL_X);
    floatX *d_inplace = to_device(inp, N2F);
    swiglu_backward_cuda(d_inplace, d_dout, d_inplace, N, F);   // dinp aliases inp
    fails += compare_bitwise("swiglu_backward in place", d_inplace, d_dinp, N2F * sizeof(floatX));

    if (timed) {
        report_time("swiglu_forward", time_ms(20, [&] { swiglu_forward_cuda(d_out, d_inp, N, F); }),
                    3.0 * NF * sizeof(floatX), 0);
        report_time("swiglu_backward", time_ms(20, [&] { swiglu_backward_cuda(d_dinp, d_dout, d_inp, N, F); }),
                    5.0 * NF * sizeof(floatX), 0);
    }
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_dinp));
    cudaCheck(cudaFree(d_inplace));
    free(inp); free(out); free(dout); free(dinp);
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "swiglu");
    rng_seed(23);
    int fails = 0;
    fails += run_case(4 * 1024, 14336, 1);
    fails += run_case(33, 1001, 0);
    return harness_finish(fails);
}
