// Shared pieces of the dev/cuda harnesses: random inputs, upload/download, comparison against the
// CPU loop (the specification, compiled from the same llmc header), determinism checks, timing.
//
// Each harness: make inputs on the host (rounded to floatX, so the CPU loop and the kernel see
// exactly the same numbers) -> run the CPU loop -> run the CUDA launcher -> compare -> time it.
//
// ---------------------------------------------------------------------------------------------
// TOLERANCES (the one place they are written down). An element passes when
//     |gpu - cpu| <= atol * rms(cpu) + rtol * |cpu|
// i.e. atol is relative to the RMS of the whole reference tensor (so it is independent of the
// input scale and covers values that cancel to ~0), rtol relative to the element itself.
//  bf16: a bf16 result is rounded once from fp32 (8 significant bits: unit roundoff u = 2^-8 = 0.4%
//        relative); the kernels accumulate in fp32 in another order than the CPU loop. 1% relative (2.5 u)
//        plus 1% of the RMS leaves room for both and still catches any indexing/masking error
//        (those give O(100%) errors).
//  fp32: only summation order and --use_fast_math intrinsics (expf, rsqrtf, division) differ:
//        1e-4 / 1e-4. GELU uses tanhf, which fast-math maps to tanh.approx.f32 (relative error
//        ~2^-11, i.e. up to ~1e-3 absolute in gelu' for |x| ~ 2), hence its own 5e-3.
//  fp32 outputs of the bf16 build (layernorm mean/rstd, attention lse, CE stats and losses,
//        AdamW master/m/v, the gradient norm) are checked with the fp32 numbers: the inputs are
//        identical, only the arithmetic order differs.
//  Fused launchers (matmul_gelu, residual_layernorm) use the tolerances of their parts: GELU outputs
//        and gradients TOL_X_GELU, the rest TOL_X. The fused kernels round less often than the CPU
//        sequence in a bf16 build sees (e.g. GELU of the fp32 pre-activation; LayerNorm of the stored
//        bf16 residual stream), so residual_layernorm's mean/rstd are checked with TOL_X against the
//        CPU sequence and with TOL_FP32 against the LayerNorm loop run on the rounded residual stream.
//        The GELU epilogue's formula (tanh vs erf: they differ by < 5e-4, inside any of these) has its
//        own probe in matmul_gelu.cu: within an explicit fp32 error bound of the tanh formula over x in
//        [-3.5, -2], a bound the erf formula falls outside of (checked too).
//  AdamW bf16 parameters are stochastically rounded: each must be one of the two bf16 neighbours
//        of the fp32 master weight, and the mean rounding error must be below 1% of an ulp.
// ---------------------------------------------------------------------------------------------
#ifndef DEV_CUDA_COMMON_H
#define DEV_CUDA_COMMON_H

#include "../../llmc/backend.h"

typedef struct { float atol, rtol; } Tol;

static const Tol TOL_FP32 = {1e-4f, 1e-4f};             // fp32 results, any build
#if defined(ENABLE_FP32)
static const Tol TOL_X = {1e-4f, 1e-4f};                // floatX results
static const Tol TOL_X_GELU = {5e-3f, 5e-3f};
#else
static const Tol TOL_X = {1e-2f, 1e-2f};
static const Tol TOL_X_GELU = {1e-2f, 1e-2f};
#endif
static const float ADAMW_MAX_MEAN_BIAS_ULP = 0.01f;     // stochastic rounding must be unbiased

// ---------------------------------------------------------------------------------------------
// set-up

static void harness_init(int *argc, char ***argv, const char *name) {
    MPI_Init(argc, argv);   // utils.h's fail() reports through MPI
    backend_init(0);
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("== %s (%s, floatX %s, %d SMs)\n", name, prop.name, PRECISION_NAME, prop.multiProcessorCount);
}

static int harness_finish(int failures) {
    printf("%s: %s\n", failures == 0 ? "PASS" : "FAIL", failures == 0 ? "all checks passed" : "some checks failed");
    fflush(stdout);
    MPI_Finalize();
    return failures == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// random inputs (fixed seeds: a failure reproduces)

static uint64_t rng_state = 0x853c49e6748fea9bull;
static void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 1; }
static uint32_t rng_u32(void) {   // xorshift64*
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static float rng_uniform(void) { return (rng_u32() >> 8) * (1.0f / 16777216.0f); }   // [0, 1)

// host array of n floats uniform in [lo, hi), already rounded to floatX
static float *make_random(size_t n, float lo, float hi) {
    float *x = (float *)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = floatX_to_float(float_to_floatX(lo + (hi - lo) * rng_uniform())); }
    return x;
}
static int *make_tokens(size_t n, int V) {
    int *t = (int *)malloc_check(n * sizeof(int));
    for (size_t i = 0; i < n; i++) { t[i] = (int)(rng_u32() % (uint32_t)V); }
    return t;
}
static float *copy_floats(const float *x, size_t n) {
    float *y = (float *)malloc_check(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

// ---------------------------------------------------------------------------------------------
// device buffers

static floatX *to_device(const float *h, size_t n) {       // host fp32 -> new device floatX
    floatX *d;
    cudaCheck(cudaMalloc(&d, (n > 0 ? n : 1) * sizeof(floatX)));
    upload_floats(d, h, n);
    return d;
}
static float *to_device_f32(const float *h, size_t n) {    // host fp32 -> new device fp32
    float *d;
    cudaCheck(cudaMalloc(&d, (n > 0 ? n : 1) * sizeof(float)));
    copy_to_device(d, h, n * sizeof(float));
    return d;
}
static int *to_device_int(const int *h, size_t n) {
    int *d;
    cudaCheck(cudaMalloc(&d, (n > 0 ? n : 1) * sizeof(int)));
    copy_to_device(d, h, n * sizeof(int));
    return d;
}
static float *from_device(const floatX *d, size_t n) {     // device floatX -> new host fp32
    float *h = (float *)malloc_check((n > 0 ? n : 1) * sizeof(float));
    download_floats(h, d, n);
    return h;
}
static float *from_device_f32(const float *d, size_t n) {
    float *h = (float *)malloc_check((n > 0 ? n : 1) * sizeof(float));
    copy_to_host(h, d, n * sizeof(float));
    return h;
}

// ---------------------------------------------------------------------------------------------
// comparison

// 0 if every element passes the tolerance (see the top of this file), else 1 (and the worst ones).
// kappa (or NULL): a per-element bound added to the allowance, for a launcher whose declared
// precision is below the loop's (attention's cuBLAS path rounds P and dS to floatX; attention.cu)
static int compare_bounded(const char *what, const float *gpu, const float *ref, const float *kappa, size_t n, Tol tol) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) { ss += (double)ref[i] * ref[i]; }
    float rms = n > 0 ? (float)sqrt(ss / n) : 0.0f;
    size_t bad = 0, worst = 0;
    float worst_excess = -1.0f, max_abs = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float err = fabsf(gpu[i] - ref[i]);
        float allowed = tol.atol * rms + tol.rtol * fabsf(ref[i]) + (kappa != NULL ? kappa[i] : 0.0f);
        if (!(err <= allowed)) {   // NaN fails
            if (bad < 5) { printf("    mismatch %s[%zu]: gpu %.7g cpu %.7g (allowed %.3g)\n", what, i, gpu[i], ref[i], allowed); }
            bad++;
        }
        if (err > max_abs || err != err) { max_abs = err; }
        float excess = allowed > 0.0f ? err / allowed : (err > 0.0f ? INFINITY : 0.0f);
        if (excess > worst_excess || excess != excess) { worst_excess = excess; worst = i; }
    }
    printf("  %-28s n=%-10zu rms %-10.4g max|err| %-10.4g worst err/allowed %-8.3f (at %zu) %s\n",
           what, n, rms, max_abs, worst_excess, worst, bad == 0 ? "ok" : "FAIL");
    if (bad) { printf("    %zu of %zu elements out of tolerance\n", bad, n); }
    return bad ? 1 : 0;
}

static int compare(const char *what, const float *gpu, const float *ref, size_t n, Tol tol) {
    return compare_bounded(what, gpu, ref, NULL, n, tol);
}

static int compare_device_bounded(const char *what, const floatX *d, const float *ref, const float *kappa, size_t n, Tol tol) {
    float *h = from_device(d, n);
    int r = compare_bounded(what, h, ref, kappa, n, tol);
    free(h);
    return r;
}
static int compare_device(const char *what, const floatX *d, const float *ref, size_t n, Tol tol) {
    return compare_device_bounded(what, d, ref, NULL, n, tol);
}
static int compare_device_f32(const char *what, const float *d, const float *ref, size_t n, Tol tol) {
    float *h = from_device_f32(d, n);
    int r = compare(what, h, ref, n, tol);
    free(h);
    return r;
}

// bitwise equality of two device buffers (determinism: the same kernel run twice)
static int compare_bitwise(const char *what, const void *a, const void *b, size_t bytes) {
    unsigned char *ha = (unsigned char *)malloc_check(bytes), *hb = (unsigned char *)malloc_check(bytes);
    copy_to_host(ha, a, bytes);
    copy_to_host(hb, b, bytes);
    int same = memcmp(ha, hb, bytes) == 0;
    printf("  %-28s %s\n", what, same ? "bitwise identical: ok" : "DIFFERENT between two runs: FAIL");
    free(ha);
    free(hb);
    return same ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// timing: average milliseconds of f() over reps launches on main_stream (after one warm-up)

template <typename F>
static float time_ms(int reps, F f) {
    f();
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    cudaCheck(cudaEventRecord(start, main_stream));
    for (int i = 0; i < reps; i++) { f(); }
    cudaCheck(cudaEventRecord(stop, main_stream));
    cudaCheck(cudaEventSynchronize(stop));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    cudaCheck(cudaGetLastError());
    return ms / reps;
}

static void report_time(const char *what, float ms, double bytes, double flops) {
    printf("  time %-24s %9.4f ms", what, ms);
    if (bytes > 0) { printf("  %8.1f GB/s", bytes / (ms * 1e-3) / 1e9); }
    if (flops > 0) { printf("  %8.1f TFLOP/s", flops / (ms * 1e-3) / 1e12); }
    printf("\n");
    fflush(stdout);
}

#endif
