// The MLP's GELU-fused linear layers (llmc/matmul.h): matmul_forward_gelu (fc: cuBLASLt GELU_AUX_BIAS
// epilogue) and matmul_backward_dgelu (fcproj: DGELU epilogue for dpre, plain GEMM for dweight), against
// their CPU versions (matmul + gelu loops), then timed against the unfused launcher sequences.
// GPT-2 124M shapes at N = B*T = 4*1024: fc 768->3072, fcproj 3072->768; odd shapes whose leading
// dimension is not a multiple of 8 (the fallback path), a misaligned one; and a probe that tells the
// tanh GELU from the erf GELU (the epilogue must compute GPT-2's tanh approximation).
#include "../../llmc/matmul.h"
#include "common.h"

static const char *path_name(int fused) { return fused ? "fused epilogue" : "FALLBACK (unfused kernels)"; }

// fused must be what the shape allows: expect 1 (fused), 0 (fallback forced), -1 (either)
static int check_path(const char *what, int fused, int expect) {
    printf("  %-28s path: %s\n", what, path_name(fused));
    if (expect >= 0 && fused != expect) {
        printf("    expected the %s path: FAIL\n", path_name(expect));
        return 1;
    }
    return 0;
}

// buffers are carved out of one allocation at offset `skew` elements, to test unaligned pointers
static int run_forward(const char *name, int N, int IC, int OC, int use_bias, int skew, int expect, int timed) {
    int fails = 0;
    printf("-- forward %s: N=%d IC=%d OC=%d bias=%d pointer skew=%d elements\n", name, N, IC, OC, use_bias, skew);
    size_t nin = (size_t)N * IC, nw = (size_t)OC * IC, nout = (size_t)N * OC;
    float *inp = make_random(nin, -1.0f, 1.0f), *w = make_random(nw, -0.1f, 0.1f), *bias = make_random(OC, -1.0f, 1.0f);
    float *pre = (float *)malloc_check(nout * sizeof(float)), *out = (float *)malloc_check(nout * sizeof(float));
    floatX *buf;
    size_t total = nin + nw + OC + 2 * nout + 5 * (size_t)skew + 64;
    cudaCheck(cudaMalloc(&buf, total * sizeof(floatX)));
    floatX *d_inp = buf + skew, *d_w = d_inp + nin + skew, *d_bias = d_w + nw + skew, *d_pre = d_bias + OC + skew;
    floatX *d_out = d_pre + nout + skew;
    upload_floats(d_inp, inp, nin);
    upload_floats(d_w, w, nw);
    upload_floats(d_bias, bias, OC);
    const floatX *d_b = use_bias ? d_bias : NULL;

    matmul_forward_gelu_cpu(out, pre, inp, w, use_bias ? bias : NULL, N, IC, OC);
    int fused = matmul_forward_gelu_cuda(d_out, d_pre, d_inp, d_w, d_b, N, IC, OC);
    fails += check_path("matmul_forward_gelu", fused, expect);
    fails += compare_device("matmul_forward_gelu pre", d_pre, pre, nout, TOL_X);
    fails += compare_device("matmul_forward_gelu out", d_out, out, nout, TOL_X_GELU);

    if (timed) {
        double flops = 2.0 * N * IC * OC;
        char label[64];
        snprintf(label, sizeof(label), "fc fwd %s", fused ? "fused" : "FALLBACK");
        report_time(label, time_ms(20, [&] { matmul_forward_gelu_cuda(d_out, d_pre, d_inp, d_w, d_b, N, IC, OC); }), 0, flops);
        report_time("fc fwd matmul+gelu", time_ms(20, [&] {
            matmul_forward_cuda(d_pre, d_inp, d_w, d_b, N, IC, OC);
            gelu_forward_cuda(d_out, d_pre, nout);
        }), 0, flops);
    }
    cudaCheck(cudaFree(buf));
    free(inp); free(w); free(bias); free(pre); free(out);
    return fails;
}

static int run_backward(const char *name, int N, int IC, int OC, int skew, int expect, int timed) {
    int fails = 0;
    printf("-- backward %s: N=%d IC=%d OC=%d pointer skew=%d elements\n", name, N, IC, OC, skew);
    size_t nin = (size_t)N * IC, nw = (size_t)OC * IC, nout = (size_t)N * OC;
    float *pre = make_random(nin, -3.0f, 3.0f);
    float *inp = (float *)malloc_check(nin * sizeof(float));   // inp = gelu(pre), rounded like a stored activation
    gelu_forward_cpu(inp, pre, nin);
    for (size_t i = 0; i < nin; i++) { inp[i] = floatX_to_float(float_to_floatX(inp[i])); }
    float *w = make_random(nw, -0.1f, 0.1f), *dout = make_random(nout, -1.0f, 1.0f);
    float *dw = make_random(nw, -1.0f, 1.0f);                  // accumulated into
    float *dw0 = copy_floats(dw, nw);
    float *dpre = (float *)malloc_check(nin * sizeof(float));
    floatX *buf;
    size_t total = 3 * nin + 2 * nw + nout + 7 * (size_t)skew + 64;
    cudaCheck(cudaMalloc(&buf, total * sizeof(floatX)));
    floatX *d_pre = buf + skew, *d_inp = d_pre + nin + skew, *d_w = d_inp + nin + skew, *d_dout = d_w + nw + skew;
    floatX *d_dw = d_dout + nout + skew, *d_dpre = d_dw + nw + skew;
    upload_floats(d_pre, pre, nin);
    upload_floats(d_inp, inp, nin);
    upload_floats(d_w, w, nw);
    upload_floats(d_dout, dout, nout);
    upload_floats(d_dw, dw, nw);

    matmul_backward_dgelu_cpu(dpre, dw, dout, inp, w, pre, N, IC, OC);
    int fused = matmul_backward_dgelu_cuda(d_dpre, d_dw, d_dout, d_inp, d_w, d_pre, N, IC, OC);
    fails += check_path("matmul_backward_dgelu", fused, expect);
    fails += compare_device("matmul_backward_dgelu dpre", d_dpre, dpre, nin, TOL_X_GELU);
    fails += compare_device("matmul_backward_dgelu dweight", d_dw, dw, nw, TOL_X);
    // the NULL-skip paths: dpre only (dweight untouched), then dweight only (accumulated once more)
    memset_zero_device(d_dpre, nin * sizeof(floatX));
    matmul_backward_dgelu_cuda(d_dpre, NULL, d_dout, d_inp, d_w, d_pre, N, IC, OC);
    fails += compare_device("dgelu dpre only: dpre", d_dpre, dpre, nin, TOL_X_GELU);
    fails += compare_device("dgelu dpre only: dweight", d_dw, dw, nw, TOL_X);
    matmul_backward_dgelu_cuda(NULL, d_dw, d_dout, d_inp, d_w, d_pre, N, IC, OC);
    matmul_backward_dgelu_cpu(NULL, dw, dout, inp, w, pre, N, IC, OC);
    fails += compare_device("dgelu dweight only: dweight", d_dw, dw, nw, TOL_X);

    if (timed) {
        double flops = 4.0 * N * IC * OC;
        char label[64];
        snprintf(label, sizeof(label), "fcproj bwd %s", fused ? "fused" : "FALLBACK");
        upload_floats(d_dw, dw0, nw);
        report_time(label, time_ms(20, [&] { matmul_backward_dgelu_cuda(d_dpre, d_dw, d_dout, d_inp, d_w, d_pre, N, IC, OC); }), 0, flops);
        upload_floats(d_dw, dw0, nw);
        report_time("fcproj bwd matmul+gelu", time_ms(20, [&] {
            matmul_backward_cuda(d_dpre, d_dw, NULL, d_dout, d_inp, d_w, N, IC, OC);
            gelu_backward_cuda(d_dpre, d_pre, d_dpre, nin);
        }), 0, flops);
    }
    cudaCheck(cudaFree(buf));
    free(pre); free(inp); free(w); free(dout); free(dw); free(dw0); free(dpre);
    return fails;
}

// ---- which GELU does the epilogue compute? ----
static double gelu_tanh_ref(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_erf_ref(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double dgelu_tanh_ref(double x) {
    double th = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}
static double dgelu_erf_ref(double x) { return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI); }

// An explicit error bound, not a ratio between two close formulas. The epilogue gets pre = x exactly
// (identity weight, zero bias, fp32 accumulation), evaluates the GELU (or its derivative) in fp32 and
// rounds to floatX. With th = tanh(k (x + c x^3)) evaluated to within a relative error EPS_TANH (its
// argument's rounding included), an element of the tanh formula is within
//   gelu:  U |gelu| + 0.5 |x| EPS_TANH |th| + 16 u (|gelu| + 0.5 |x|)
//   gelu': U |gelu'| + EPS_TANH |th| (0.5 + |x| k (1 + 3 c x^2) |th|) + 16 u (0.5 + 0.5 |x| k (1 + 3 c x^2))
// (d gelu / d th = x / 2; d gelu' / d th = 1/2 - x th k (1 + 3 c x^2)). U: the floatX rounding (bf16
// 2^-8, fp32 2^-24); u = 2^-24 for the other fp32 operations; EPS_TANH = 2^-18 (64 ulp: CUDA's tanhf is
// within 2). Every element must be within it. Over x in [-3.5, -2] the erf GELU is outside the same bound
// at most points (the two differ by 3..30% there); the probe requires that at >= 75% of them, or it could
// not tell the formulas apart and says so.
static const double EPS_TANH = 0x1p-18;
static const double GELU_K = 0.7978845608028654, GELU_C = 0.044715;
static double gelu_bound(double x, int derivative) {
#if defined(ENABLE_FP32)
    const double U = 0x1p-24;
#else
    const double U = 0x1p-8;
#endif
    const double u = 0x1p-24;
    double th = fabs(tanh(GELU_K * (x + GELU_C * x * x * x))), slope = fabs(x) * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
    if (!derivative) { return U * fabs(gelu_tanh_ref(x)) + 0.5 * fabs(x) * EPS_TANH * th + 16 * u * (fabs(gelu_tanh_ref(x)) + 0.5 * fabs(x)); }
    return U * fabs(dgelu_tanh_ref(x)) + EPS_TANH * th * (0.5 + slope * th) + 16 * u * (0.5 + 0.5 * slope);
}
static int verdict(const char *what, const float *gpu, const float *x, size_t n, double (*f)(double), double (*g)(double), int derivative) {
    size_t bad = 0, erf_outside = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double bound = gelu_bound(x[i], derivative), err = fabs(gpu[i] - f(x[i]));
        if (!(err <= bound)) { bad++; }
        if (err / bound > worst) { worst = err / bound; }
        erf_outside += fabs(g(x[i]) - f(x[i])) > bound;
    }
    int powerful = erf_outside >= 3 * n / 4, ok = bad == 0 && powerful;
    printf("  %-28s %zu of %zu outside the tanh formula's bound (worst err/bound %.3f); the erf formula is outside it at %zu: %s\n",
           what, bad, n, worst, erf_outside, ok ? "tanh: ok" : !powerful ? "the probe cannot tell tanh from erf: FAIL"
                                                                           : "NOT the tanh GELU: FAIL (set matmul_gelu_epilogue_enabled = 0)");
    return ok ? 0 : 1;
}

// identity weight, zero bias: pre = x exactly, over x in [-3.5, -2] where the two GELUs (and their
// derivatives) differ by 3..30% (so floatX rounding stays well below the difference)
static int probe_formula(void) {
    printf("-- probe: the epilogue's GELU formula (x in [-3.5, -2])\n");
    const int N = 64, C = 64;
    size_t n = (size_t)N * C;
    float *x = (float *)malloc_check(n * sizeof(float)), *eye = (float *)malloc_check((size_t)C * C * sizeof(float));
    float *zero = (float *)malloc_check(C * sizeof(float)), *ones = (float *)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = floatX_to_float(float_to_floatX(-3.5f + 1.5f * (float)i / (float)(n - 1))); ones[i] = 1.0f; }
    for (int i = 0; i < C * C; i++) { eye[i] = (i / C == i % C) ? 1.0f : 0.0f; }
    for (int i = 0; i < C; i++) { zero[i] = 0.0f; }
    floatX *d_x = to_device(x, n), *d_eye = to_device(eye, (size_t)C * C), *d_zero = to_device(zero, C);
    floatX *d_ones = to_device(ones, n), *d_pre = to_device(ones, n), *d_out = to_device(ones, n);
    int fails = 0;
    int fused = matmul_forward_gelu_cuda(d_out, d_pre, d_x, d_eye, d_zero, N, C, C);
    fails += check_path("probe forward", fused, -1);
    fails += compare_device("probe pre (= x)", d_pre, x, n, TOL_X);
    float *gpu = from_device(d_out, n);
    fails += verdict("probe gelu(x)", gpu, x, n, gelu_tanh_ref, gelu_erf_ref, 0);
    free(gpu);
    // dpre = (1 @ I) * gelu'(x) = gelu'(x)
    fused = matmul_backward_dgelu_cuda(d_out, NULL, d_ones, d_x, d_eye, d_x, N, C, C);
    fails += check_path("probe backward", fused, -1);
    gpu = from_device(d_out, n);
    fails += verdict("probe gelu'(x)", gpu, x, n, dgelu_tanh_ref, dgelu_erf_ref, 1);
    free(gpu);
    cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_eye)); cudaCheck(cudaFree(d_zero)); cudaCheck(cudaFree(d_ones));
    cudaCheck(cudaFree(d_pre)); cudaCheck(cudaFree(d_out));
    free(x); free(eye); free(zero); free(ones);
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "matmul_gelu");
    rng_seed(11);
    int fails = 0;
    const int N = 4 * 1024, C = 768;
    fails += probe_formula();
    fails += run_forward("fc", N, C, 4 * C, 1, 0, -1, 1);
    fails += run_backward("fcproj", N, 4 * C, C, 0, -1, 1);
    fails += run_forward("fc, no bias", 256, C, 4 * C, 0, 0, -1, 0);
    fails += run_forward("odd OC (not a multiple of 8)", 97, 72, 100, 1, 0, 0, 0);
    fails += run_backward("odd IC (not a multiple of 8)", 97, 100, 72, 0, 0, 0);
    fails += run_forward("misaligned", 33, 64, 40, 1, 3, -1, 0);
    fails += run_backward("misaligned aux", 33, 40, 64, 3, 0, 0);
    return harness_finish(fails);
}
