// Sum of squares (global-norm clipping): CPU loop (fp64) vs CUDA (fixed grid, fp64 partials),
// sizes from 0 to all of GPT-2 124M's parameters, determinism, timing; the step's loss, norm and clip
// scale made on the device.
#include "../../llmc/global_norm.h"
#include "common.h"

// bitwise equal, or both NaN (a NaN's payload is not kept alike by CUDA and x86)
static int same_or_both_nan(double a, double b) { return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof(a)); }

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "global_norm");
    rng_seed(9);
    int fails = 0;
    const size_t sizes[5] = {0, 1, 1000, 1000003, 124475904};
    float *d_out;
    cudaCheck(cudaMalloc(&d_out, 2 * sizeof(float)));
    for (int k = 0; k < 5; k++) {
        size_t n = sizes[k];
        float *x = make_random(n > 0 ? n : 1, -0.01f, 0.01f);
        floatX *d_x = to_device(x, n);
        float ref;
        sum_of_squares_cpu(&ref, x, n);
        sum_of_squares_cuda(d_out, d_x, n);
        sum_of_squares_cuda(d_out + 1, d_x, n);
        char what[64];
        snprintf(what, sizeof(what), "sum_of_squares n=%zu", n);
        fails += compare_device_f32(what, d_out, &ref, 1, TOL_FP32);
        fails += compare_bitwise("sum_of_squares rerun", d_out, d_out + 1, sizeof(float));
        if (k == 4) {
            report_time("sum_of_squares 124M", time_ms(20, [&] { sum_of_squares_cuda(d_out, d_x, n); }), (double)n * sizeof(floatX), 0);
        }
        cudaCheck(cudaFree(d_x));
        free(x);
    }
    cudaCheck(cudaFree(d_out));

    // the end of a step (step_stats_gather, the all-reduce, step_stats_clip): one GPU thread runs the CPU
    // loops, so the struct must be the CPU's field by field (bitwise, or both NaN: CUDA need not keep a NaN's
    // payload): a clipped step, an unclipped one, no clipping, a non-finite norm part and a non-finite loss, a
    // loss and a norm above their limits (scale 0: skip)
    printf("-- step stats: loss, norm, clip scale\n");
    {
        const int np = 300;
        float *parts = make_random(np, 0.0f, 0.02f);
        float *d_parts = to_device_f32(parts, np);
        double loss_sum = 5.25 * 4096, *d_loss;
        StepStats *d_st;
        cudaCheck(cudaMalloc(&d_loss, sizeof(double)));
        cudaCheck(cudaMalloc(&d_st, sizeof(StepStats)));
        struct { const char *what; float clip; float part0; double loss; float want_scale, loss_limit, norm_limit; } cases[7] = {
            {"clipped", 1.0f, 10.0f, loss_sum, -1.0f, INFINITY, INFINITY},
            {"not clipped", 1e3f, 10.0f, loss_sum, -1.0f, INFINITY, INFINITY},
            {"no clip", 0.0f, 10.0f, loss_sum, 1.0f, INFINITY, INFINITY},
            {"NaN norm: skip", 1.0f, NAN, loss_sum, 0.0f, INFINITY, INFINITY},
            {"inf loss: skip", 1.0f, 10.0f, INFINITY, 0.0f, INFINITY, INFINITY},
            {"loss over its limit: skip", 1.0f, 10.0f, loss_sum, 0.0f, 5.0f, INFINITY},
            {"norm over its limit: skip", 1.0f, 10.0f, loss_sum, 0.0f, INFINITY, 1.0f}};
        for (int c = 0; c < 7; c++) {
            parts[0] = cases[c].part0;
            copy_to_device(d_parts, parts, sizeof(float) * np);
            copy_to_device(d_loss, &cases[c].loss, sizeof(double));
            StepStats cpu, gpu;
            memset(&cpu, 0, sizeof(cpu));
            cudaCheck(cudaMemsetAsync(d_st, 0, sizeof(StepStats), main_stream));
            step_stats_gather_body(&cpu, parts, np, &cases[c].loss);
            step_stats_clip_body(&cpu, 4096.0, cases[c].clip, cases[c].loss_limit, cases[c].norm_limit);
            step_stats_gather(d_st, d_parts, np, d_loss);
            step_stats_clip(d_st, 4096.0, cases[c].clip, cases[c].loss_limit, cases[c].norm_limit);
            copy_to_host(&gpu, d_st, sizeof(gpu));
            int same = same_or_both_nan(cpu.loss_sum, gpu.loss_sum) && same_or_both_nan(cpu.norm_sq, gpu.norm_sq)
                       && same_or_both_nan(cpu.loss, gpu.loss) && same_or_both_nan(cpu.norm, gpu.norm)
                       && same_or_both_nan(cpu.scale, gpu.scale) && same_or_both_nan(cpu.why, gpu.why);
            int scale_ok = cases[c].want_scale < 0 ? (cpu.scale > 0 && cpu.scale < 1) == (cases[c].clip < cpu.norm) : cpu.scale == cases[c].want_scale;
            printf("  %-28s loss %.6g norm %.6g scale %.6g (CPU %.6g): %s\n", cases[c].what, gpu.loss, gpu.norm, gpu.scale, cpu.scale,
                   same && scale_ok ? "ok" : "FAIL");
            fails += !(same && scale_ok);
        }
        cudaCheck(cudaFree(d_parts)); cudaCheck(cudaFree(d_loss)); cudaCheck(cudaFree(d_st));
        free(parts);
    }
    return harness_finish(fails);
}
