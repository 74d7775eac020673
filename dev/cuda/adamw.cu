// AdamW: CPU loop vs CUDA kernel, with an fp32 master copy (bf16 parameters rounded
// stochastically: each must be a bf16 neighbour of the master, the rounding unbiased) and
// without (parameters are the master). 16M parameters (a slice of GPT-2 124M's 124M).
#include "../../llmc/adamw.h"
#include "common.h"

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "adamw");
    rng_seed(8);
    int fails = 0;
    const size_t n = (size_t)16 * 1024 * 1024 + 5;
    const float lr = 6e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.5f, no_update = 0.0f;
    const int t = 5;
    const unsigned int seed = 1234;
    float *grad_scale = to_device_f32(&scale, 1), *skip = to_device_f32(&no_update, 1);   // AdamW reads the scale on the device

    float *master = (float *)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { master[i] = 2.0f * rng_uniform() - 1.0f; }   // full fp32 precision
    float *params = make_random(n, -1.0f, 1.0f);   // path B: floatX parameters are the master
    float *grads = make_random(n, -1.0f, 1.0f);
    float *m = (float *)malloc_check(n * sizeof(float)), *v = (float *)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { m[i] = 0.1f * (2.0f * rng_uniform() - 1.0f); v[i] = 0.01f * rng_uniform(); }

    // path A: master weights
    floatX *d_params = to_device(master, n), *d_params2 = to_device(master, n), *d_grads = to_device(grads, n);
    float *d_master = to_device_f32(master, n), *d_m = to_device_f32(m, n), *d_v = to_device_f32(v, n);
    float *d_master2 = to_device_f32(master, n), *d_m2 = to_device_f32(m, n), *d_v2 = to_device_f32(v, n);
    float *cpu_master = copy_floats(master, n), *cpu_params = copy_floats(master, n);
    float *cpu_m = copy_floats(m, n), *cpu_v = copy_floats(v, n);
    adamw_update_cpu(cpu_params, cpu_master, grads, cpu_m, cpu_v, n, lr, beta1, beta2, eps, wd, &scale, t, seed);
    adamw_update(d_params, d_master, d_grads, d_m, d_v, n, lr, beta1, beta2, eps, wd, grad_scale, t, seed);
    adamw_update(d_params2, d_master2, d_grads, d_m2, d_v2, n, lr, beta1, beta2, eps, wd, grad_scale, t, seed);
    printf("-- with fp32 master weights\n");
    fails += compare_device_f32("adamw master", d_master, cpu_master, n, TOL_FP32);
    fails += compare_device_f32("adamw m", d_m, cpu_m, n, TOL_FP32);
    fails += compare_device_f32("adamw v", d_v, cpu_v, n, TOL_FP32);
    fails += compare_bitwise("adamw params rerun", d_params, d_params2, n * sizeof(floatX));
    {
        float *gp = from_device(d_params, n), *gm = from_device_f32(d_master, n);
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
    }
    report_time("adamw_update (master)", time_ms(20, [&] { adamw_update(d_params, d_master, d_grads, d_m, d_v, n, lr, beta1, beta2, eps, wd, grad_scale, t, seed); }),
                (double)n * (2 * sizeof(floatX) + 6 * sizeof(float)), 0);

    // path B: no master, the parameters are updated in place
    printf("-- without master weights\n");
    floatX *d_pb = to_device(params, n);
    upload_floats(d_params2, params, n);
    copy_to_device(d_m, m, n * sizeof(float));
    copy_to_device(d_v, v, n * sizeof(float));
    float *cpu_pb = copy_floats(params, n);
    memcpy(cpu_m, m, n * sizeof(float));
    memcpy(cpu_v, v, n * sizeof(float));
    adamw_update_cpu(cpu_pb, NULL, grads, cpu_m, cpu_v, n, lr, beta1, beta2, eps, wd, &scale, t, seed);
    adamw_update(d_pb, NULL, d_grads, d_m, d_v, n, lr, beta1, beta2, eps, wd, grad_scale, t, seed);
    fails += compare_device("adamw params (no master)", d_pb, cpu_pb, n, TOL_X);
    fails += compare_device_f32("adamw m (no master)", d_m, cpu_m, n, TOL_FP32);
    fails += compare_device_f32("adamw v (no master)", d_v, cpu_v, n, TOL_FP32);

    // several tensors in one launch (a unit's update): three segments with gaps between them, against one
    // launch per segment: bitwise the same (same seeds, same element indices), the gaps untouched
    printf("-- three tensors in one launch (adamw_update_segments) vs one launch each\n");
    {
        AdamWSegments sg = {3, {{5, 1000003, wd, 11u}, {1000010, 77, 0.0f, 22u}, {1000100, n - 1000200, wd, 33u}}, {0}};
        upload_floats(d_params, master, n); upload_floats(d_params2, master, n);
        copy_to_device(d_master, master, n * sizeof(float)); copy_to_device(d_master2, master, n * sizeof(float));
        copy_to_device(d_m, m, n * sizeof(float)); copy_to_device(d_m2, m, n * sizeof(float));
        copy_to_device(d_v, v, n * sizeof(float)); copy_to_device(d_v2, v, n * sizeof(float));
        adamw_update_segments(d_params, d_master, d_grads, d_m, d_v, &sg, lr, beta1, beta2, eps, grad_scale, t);
        for (int k = 0; k < sg.n; k++) {
            size_t o = sg.s[k].start;
            adamw_update(d_params2 + o, d_master2 + o, d_grads + o, d_m2 + o, d_v2 + o, sg.s[k].len, lr, beta1, beta2, eps,
                              sg.s[k].weight_decay, grad_scale, t, sg.s[k].seed);
        }
        fails += compare_bitwise("segments: params", d_params, d_params2, n * sizeof(floatX));
        fails += compare_bitwise("segments: master", d_master, d_master2, n * sizeof(float));
        fails += compare_bitwise("segments: m", d_m, d_m2, n * sizeof(float));
        fails += compare_bitwise("segments: v", d_v, d_v2, n * sizeof(float));
        float *gm = from_device_f32(d_master, n);
        size_t changed = 0;
        for (size_t i = 0; i < n; i++) {
            int in_gap = i < 5 || (i >= 1000008 && i < 1000010) || (i >= 1000087 && i < 1000100) || i >= n - 100;
            if (in_gap && gm[i] != master[i]) { changed++; }
        }
        printf("  %-28s %zu elements in the gaps changed: %s\n", "segments: gaps", changed, changed ? "FAIL" : "ok");
        fails += changed != 0;
        free(gm);
    }

    // a scale of 0 (a skipped step: a non-finite loss or norm) writes nothing
    printf("-- scale 0: the update is skipped\n");
    {
        copy_to_device(d_params2, d_params, n * sizeof(floatX)); copy_to_device(d_master2, d_master, n * sizeof(float));
        copy_to_device(d_m2, d_m, n * sizeof(float)); copy_to_device(d_v2, d_v, n * sizeof(float));
        adamw_update(d_params, d_master, d_grads, d_m, d_v, n, lr, beta1, beta2, eps, wd, skip, t, seed);
        fails += compare_bitwise("skip: params", d_params, d_params2, n * sizeof(floatX));
        fails += compare_bitwise("skip: master", d_master, d_master2, n * sizeof(float));
        fails += compare_bitwise("skip: m", d_m, d_m2, n * sizeof(float));
        fails += compare_bitwise("skip: v", d_v, d_v2, n * sizeof(float));
    }

    cudaCheck(cudaFree(grad_scale)); cudaCheck(cudaFree(skip));
    cudaCheck(cudaFree(d_params)); cudaCheck(cudaFree(d_params2)); cudaCheck(cudaFree(d_grads)); cudaCheck(cudaFree(d_master));
    cudaCheck(cudaFree(d_m)); cudaCheck(cudaFree(d_v)); cudaCheck(cudaFree(d_master2)); cudaCheck(cudaFree(d_m2));
    cudaCheck(cudaFree(d_v2)); cudaCheck(cudaFree(d_pb));
    free(master); free(params); free(grads); free(m); free(v); free(cpu_master); free(cpu_params); free(cpu_m);
    free(cpu_v); free(cpu_pb);
    return harness_finish(fails);
}
