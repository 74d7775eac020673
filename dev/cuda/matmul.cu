// Linear layers through cuBLASLt: forward (with and without the bias epilogue), backward
// (dinp written, dweight and dbias accumulated): CPU loop vs CUDA, timing.
// GPT-2 124M shapes at N = B*T = 4*1024: qkv 768->2304, fc 768->3072, fcproj 3072->768, and the LM
// head chunk of the fused CE (256 tokens x 768 -> 50304); plus an odd, misaligned shape.
#include "../../llmc/matmul.h"
#include "common.h"

// buffers are carved out of one allocation at offset `skew` elements, to test unaligned pointers
static int run_case(const char *name, int N, int IC, int OC, int use_bias, int skew, int timed) {
    int fails = 0;
    printf("-- %s: N=%d IC=%d OC=%d bias=%d pointer skew=%d elements\n", name, N, IC, OC, use_bias, skew);
    size_t nin = (size_t)N * IC, nw = (size_t)OC * IC, nout = (size_t)N * OC;
    float *inp = make_random(nin, -1.0f, 1.0f), *w = make_random(nw, -0.1f, 0.1f), *bias = make_random(OC, -1.0f, 1.0f);
    float *out = (float *)malloc_check(nout * sizeof(float));
    floatX *buf;
    size_t total = nin + nw + OC + nout + 4 * (size_t)skew + 64;
    cudaCheck(cudaMalloc(&buf, total * sizeof(floatX)));
    floatX *d_inp = buf + skew, *d_w = d_inp + nin + skew, *d_bias = d_w + nw + skew, *d_out = d_bias + OC + skew;
    upload_floats(d_inp, inp, nin);
    upload_floats(d_w, w, nw);
    upload_floats(d_bias, bias, OC);

    matmul_forward_cpu(out, inp, w, use_bias ? bias : NULL, N, IC, OC);
    matmul_forward_cuda(d_out, d_inp, d_w, use_bias ? d_bias : NULL, N, IC, OC);
    fails += compare_device("matmul_forward out", d_out, out, nout, TOL_X);

    float *dout = make_random(nout, -1.0f, 1.0f);
    float *dinp = (float *)malloc_check(nin * sizeof(float));
    float *dw = make_random(nw, -1.0f, 1.0f), *db = make_random(OC, -1.0f, 1.0f);
    floatX *d_dout = to_device(dout, nout), *d_dinp = to_device(inp, nin), *d_dw = to_device(dw, nw), *d_db = to_device(db, OC);
    matmul_backward_cpu(dinp, dw, use_bias ? db : NULL, dout, inp, w, N, IC, OC);
    matmul_backward_cuda(d_dinp, d_dw, use_bias ? d_db : NULL, d_dout, d_inp, d_w, N, IC, OC);
    fails += compare_device("matmul_backward dinp", d_dinp, dinp, nin, TOL_X);
    fails += compare_device("matmul_backward dweight", d_dw, dw, nw, TOL_X);
    if (use_bias) { fails += compare_device("matmul_backward dbias", d_db, db, OC, TOL_X); }
    // the NULL-skip paths must leave the others alone
    matmul_backward_cuda(NULL, d_dw, NULL, d_dout, d_inp, d_w, N, IC, OC);
    matmul_backward_cpu(NULL, dw, NULL, dout, inp, w, N, IC, OC);
    fails += compare_device("matmul_backward dweight x2", d_dw, dw, nw, TOL_X);

    if (timed) {
        double flops = 2.0 * N * IC * OC;
        report_time("matmul_forward", time_ms(20, [&] { matmul_forward_cuda(d_out, d_inp, d_w, use_bias ? d_bias : NULL, N, IC, OC); }), 0, flops);
        report_time("matmul_backward", time_ms(20, [&] { matmul_backward_cuda(d_dinp, d_dw, use_bias ? d_db : NULL, d_dout, d_inp, d_w, N, IC, OC); }), 0, 2 * flops);
    }
    cudaCheck(cudaFree(buf)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_dinp)); cudaCheck(cudaFree(d_dw)); cudaCheck(cudaFree(d_db));
    free(inp); free(w); free(bias); free(out); free(dout); free(dinp); free(dw); free(db);
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "matmul");
    rng_seed(5);
    int fails = 0;
    const int N = 16 * 1024, C = 768;   // GPT-2 124M's step: B16 x T1024 rows
    fails += run_case("qkv", N, C, 3 * C, 1, 0, 1);
    fails += run_case("fc", N, C, 4 * C, 1, 0, 1);
    fails += run_case("fcproj", N, 4 * C, C, 1, 0, 1);
    fails += run_case("lm head chunk", 256, C, 50304, 0, 0, 1);
    fails += run_case("odd + misaligned", 97, 72, 200, 1, 1, 0);
    fails += run_case("odd, no bias", 33, 64, 40, 0, 3, 0);
    return harness_finish(fails);
}
