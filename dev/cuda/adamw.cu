// AdamW: CPU loop vs CUDA kernel, with an fp32 master copy (bf16 parameters rounded
// stochastically: each must be a bf16 neighbour of the master, the rounding unbiased) and
// without (parameters are the master). 16M parameters (a slice of GPT-2 124M's 124M).
#include "../../llmc/adamw.h"
#include "common.h"

// the step's size and hyperparameters
static const size_t n = (size_t)16 * 1024 * 1024 + 5;
static const float lr = 6e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.5f, no_update = 0.0f;
static const int t = 5;
static const unsigned int seed = 1234;

// the inputs (host) and both sides' buffers; the second device set (2) is a rerun's or a reference's
typedef struct {
    float *grad_scale, *skip;
    float *master, *params, *grads, *m, *v;
    floatX *d_params, *d_params2, *d_grads, *d_pb;
    float *d_master, *d_m, *d_v, *d_master2, *d_m2, *d_v2;
    float *cpu_master, *cpu_params, *cpu_m, *cpu_v, *cpu_pb;   // the CPU loop's results
} AdamWBuffers;

// the device scales and the random inputs (in this order: the generator's)
static void make_inputs(AdamWBuffers *b) {
    b->grad_scale = to_device_f32(&scale, 1);   // AdamW reads the scale on the device
    b->skip = to_device_f32(&no_update, 1);
    b->master = (float *)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { b->master[i] = 2.0f * rng_uniform() - 1.0f; }   // full fp32 precision
    b->params = make_random(n, -1.0f, 1.0f);   // path B: floatX parameters are the master
    b->grads = make_random(n, -1.0f, 1.0f);
    b->m = (float *)malloc_check(n * sizeof(float));
    b->v = (float *)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { b->m[i] = 0.1f * (2.0f * rng_uniform() - 1.0f); b->v[i] = 0.01f * rng_uniform(); }
}

// path A: master weights. The CPU loop, the kernel twice (the second a rerun: bitwise the same)
static int check_with_master(AdamWBuffers *b) {
    int fails = 0;
    b->d_params = to_device(b->master, n); b->d_params2 = to_device(b->master, n); b->d_grads = to_device(b->grads, n);
    b->d_master = to_device_f32(b->master, n); b->d_m = to_device_f32(b->m, n); b->d_v = to_device_f32(b->v, n);
    b->d_master2 = to_device_f32(b->master, n); b->d_m2 = to_device_f32(b->m, n); b->d_v2 = to_device_f32(b->v, n);
    b->cpu_master = copy_floats(b->master, n); b->cpu_params = copy_floats(b->master, n);
    b->cpu_m = copy_floats(b->m, n); b->cpu_v = copy_floats(b->v, n);
    adamw_update_cpu(b->cpu_params, b->cpu_master, b->grads, b->cpu_m, b->cpu_v, n, lr, beta1, beta2, eps, wd, &scale,
                     t, seed);
    adamw_update(b->d_params, b->d_master, b->d_grads, b->d_m, b->d_v, n, lr, beta1, beta2, eps, wd, b->grad_scale, t,
                 seed);
    adamw_update(b->d_params2, b->d_master2, b->d_grads, b->d_m2, b->d_v2, n, lr, beta1, beta2, eps, wd,
                 b->grad_scale, t, seed);
    printf("-- with fp32 master weights\n");
    fails += compare_device_f32("adamw master", b->d_master, b->cpu_master, n, TOL_FP32);
    fails += compare_device_f32("adamw m", b->d_m, b->cpu_m, n, TOL_FP32);
    fails += compare_device_f32("adamw v", b->d_v, b->cpu_v, n, TOL_FP32);
    fails += compare_bitwise("adamw params rerun", b->d_params, b->d_params2, n * sizeof(floatX));
    return fails;
}

// path A's parameters against its master: equal (fp32), or a bf16 neighbour of it with unbiased rounding
static int check_params_from_master(const AdamWBuffers *b) {
    int fails = 0;
    float *gp = from_device(b->d_params, n), *gm = from_device_f32(b->d_master, n);
#if defined(ENABLE_FP32)
    fails += compare("adamw params == master", gp, gm, n, TOL_FP32);
#else
    size_t off = 0;
    double bias = 0.0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &gm[i], 4);
        uint32_t lo_bits = bits & 0xffff0000u, hi_bits = lo_bits + 0x10000u;
        float lo, hi;
        memcpy(&lo, &lo_bits, 4);
        memcpy(&hi, &hi_bits, 4);
        if (gp[i] != lo && gp[i] != hi) {
            if (off < 5) { printf("    params[%zu] = %.9g is not a bf16 neighbour of master %.9g\n", i, gp[i], gm[i]); }
            off++;
        }
        if (hi != lo) { bias += (double)(gp[i] - gm[i]) / (double)(hi - lo); }
    }
    bias /= n;
    printf("  %-28s %zu of %zu not a bf16 neighbour; mean rounding error %.5f ulp (limit %.3f) %s\n",
           "adamw stochastic rounding", off, n, bias, ADAMW_MAX_MEAN_BIAS_ULP,
           off == 0 && fabs(bias) < ADAMW_MAX_MEAN_BIAS_ULP ? "ok" : "FAIL");
    fails += !(off == 0 && fabs(bias) < ADAMW_MAX_MEAN_BIAS_ULP);
#endif
    free(gp); free(gm);
    return fails;
}

// path A's update, timed
static void time_with_master(const AdamWBuffers *b) {
    report_time("adamw_update (master)", time_ms(20, [&] {
                    adamw_update(b->d_params, b->d_master, b->d_grads, b->d_m, b->d_v, n, lr, beta1, beta2, eps, wd,
                                 b->grad_scale, t, seed); }),
                (double)n * (2 * sizeof(floatX) + 6 * sizeof(float)), 0);
}

// path B: no master, the parameters are updated in place
static int check_without_master(AdamWBuffers *b) {
    int fails = 0;
    printf("-- without master weights\n");
    b->d_pb = to_device(b->params, n);
    upload_floats(b->d_params2, b->params, n);
    copy_to_device(b->d_m, b->m, n * sizeof(float));
    copy_to_device(b->d_v, b->v, n * sizeof(float));
    b->cpu_pb = copy_floats(b->params, n);
    memcpy(b->cpu_m, b->m, n * sizeof(float));
    memcpy(b->cpu_v, b->v, n * sizeof(float));
    adamw_update_cpu(b->cpu_pb, NULL, b->grads, b->cpu_m, b->cpu_v, n, lr, beta1, beta2, eps, wd, &scale, t, seed);
    adamw_update(b->d_pb, NULL, b->d_grads, b->d_m, b->d_v, n, lr, beta1, beta2, eps, wd, b->grad_scale, t, seed);
    fails += compare_device("adamw params (no master)", b->d_pb, b->cpu_pb, n, TOL_X);
    fails += compare_device_f32("adamw m (no master)", b->d_m, b->cpu_m, n, TOL_FP32);
    fails += compare_device_f32("adamw v (no master)", b->d_v, b->cpu_v, n, TOL_FP32);
    return fails;
}

// several tensors in one launch (a unit's update): three segments with gaps between them, against one
// launch per segment: bitwise the same (same seeds, same element indices), the gaps untouched
static int check_segments(AdamWBuffers *b) {
    int fails = 0;
    printf("-- three tensors in one launch (adamw_update_segments) vs one launch each\n");
    AdamWSegments sg = {3, {{5, 1000003, wd, 11u, 5}, {1000010, 77, 0.0f, 22u, 1000010}, {1000100, n - 1000200, wd, 33u, 1000100}}, {0}};
    upload_floats(b->d_params, b->master, n); upload_floats(b->d_params2, b->master, n);
    copy_to_device(b->d_master, b->master, n * sizeof(float));
    copy_to_device(b->d_master2, b->master, n * sizeof(float));
    copy_to_device(b->d_m, b->m, n * sizeof(float)); copy_to_device(b->d_m2, b->m, n * sizeof(float));
    copy_to_device(b->d_v, b->v, n * sizeof(float)); copy_to_device(b->d_v2, b->v, n * sizeof(float));
    adamw_update_segments(b->d_params, b->d_master, b->d_grads, b->d_m, b->d_v, &sg, lr, beta1, beta2, eps,
                          b->grad_scale, t);
    for (int k = 0; k < sg.n; k++) {
        size_t o = sg.s[k].start;
        adamw_update(b->d_params2 + o, b->d_master2 + o, b->d_grads + o, b->d_m2 + o, b->d_v2 + o, sg.s[k].len, lr,
                     beta1, beta2, eps, sg.s[k].weight_decay, b->grad_scale, t, sg.s[k].seed);
    }
    fails += compare_bitwise("segments: params", b->d_params, b->d_params2, n * sizeof(floatX));
    fails += compare_bitwise("segments: master", b->d_master, b->d_master2, n * sizeof(float));
    fails += compare_bitwise("segments: m", b->d_m, b->d_m2, n * sizeof(float));
    fails += compare_bitwise("segments: v", b->d_v, b->d_v2, n * sizeof(float));
    float *gm = from_device_f32(b->d_master, n);
    size_t changed = 0;
    for (size_t i = 0; i < n; i++) {
        int in_gap = i < 5 || (i >= 1000008 && i < 1000010) || (i >= 1000087 && i < 1000100) || i >= n - 100;
        if (in_gap && gm[i] != b->master[i]) { changed++; }
    }
    printf("  %-28s %zu elements in the gaps changed: %s\n", "segments: gaps", changed, changed ? "FAIL" : "ok");
    fails += changed != 0;
    free(gm);
    return fails;
}

// a scale of 0 (a skipped step: a non-finite loss or norm) writes nothing
static int check_skipped_step(AdamWBuffers *b) {
    int fails = 0;
    printf("-- scale 0: the update is skipped\n");
    copy_to_device(b->d_params2, b->d_params, n * sizeof(floatX));
    copy_to_device(b->d_master2, b->d_master, n * sizeof(float));
    copy_to_device(b->d_m2, b->d_m, n * sizeof(float)); copy_to_device(b->d_v2, b->d_v, n * sizeof(float));
    adamw_update(b->d_params, b->d_master, b->d_grads, b->d_m, b->d_v, n, lr, beta1, beta2, eps, wd, b->skip, t, seed);
    fails += compare_bitwise("skip: params", b->d_params, b->d_params2, n * sizeof(floatX));
    fails += compare_bitwise("skip: master", b->d_master, b->d_master2, n * sizeof(float));
    fails += compare_bitwise("skip: m", b->d_m, b->d_m2, n * sizeof(float));
    fails += compare_bitwise("skip: v", b->d_v, b->d_v2, n * sizeof(float));
    return fails;
}

// every buffer, device and host
static void free_buffers(AdamWBuffers *b) {
    cudaCheck(cudaFree(b->grad_scale)); cudaCheck(cudaFree(b->skip));
    cudaCheck(cudaFree(b->d_params)); cudaCheck(cudaFree(b->d_params2)); cudaCheck(cudaFree(b->d_grads));
    cudaCheck(cudaFree(b->d_master)); cudaCheck(cudaFree(b->d_m)); cudaCheck(cudaFree(b->d_v));
    cudaCheck(cudaFree(b->d_master2)); cudaCheck(cudaFree(b->d_m2)); cudaCheck(cudaFree(b->d_v2));
    cudaCheck(cudaFree(b->d_pb));
    free(b->master); free(b->params); free(b->grads); free(b->m); free(b->v); free(b->cpu_master);
    free(b->cpu_params); free(b->cpu_m); free(b->cpu_v); free(b->cpu_pb);
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "adamw");
    rng_seed(8);
    int fails = 0;
    AdamWBuffers b;
    memset(&b, 0, sizeof(b));
    make_inputs(&b);
    fails += check_with_master(&b);
    fails += check_params_from_master(&b);
    time_with_master(&b);
    fails += check_without_master(&b);
    fails += check_segments(&b);
    fails += check_skipped_step(&b);
    free_buffers(&b);
    return harness_finish(fails);
}
