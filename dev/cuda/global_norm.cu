// Sum of squares (global-norm clipping): CPU loop (fp64) vs CUDA (fixed grid, fp64 partials),
// sizes from 0 to all of GPT-2 124M's parameters, determinism, timing.
#include "../../llmc/global_norm.h"
#include "common.h"

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
    return harness_finish(fails);
}
