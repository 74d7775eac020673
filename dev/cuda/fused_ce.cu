// Fused CE pieces: per-row stats (local max, sum-exp, target logit) over the valid vocab columns
// with the logits turned into e = exp(z - max) in place, and loss + in-place dlogits from the tp
// ranks' stats. CPU loop vs CUDA, timing.
// GPT-2 124M: a chunk of n=256 tokens x Vp=50304 columns (V=50257: 47 padding columns), and the
// two halves of a tp=2 split (the second half holds all the padding).
#include "../../llmc/fused_ce.h"
#include "common.h"

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "fused_ce");
    rng_seed(7);
    int fails = 0;
    const int n = 256, V = 50257, Vp = 50304;
    int *targets = make_tokens(n, V);
    int *d_targets = to_device_int(targets, n);
    const float dloss = 1.0f / (8 * 1024);

    for (int tp = 1; tp <= 2; tp++) {
        int Vl = Vp / tp;
        size_t nl = (size_t)n * Vl;
        printf("-- tp=%d: %d tokens x %d local columns\n", tp, n, Vl);
        // every rank's stats (the all-gather is simulated on the host); e[r]: rank r's exp(z - m)
        float **e = (float **)malloc_check(tp * sizeof(float *));
        float *stats_all = (float *)malloc_check((size_t)tp * n * 3 * sizeof(float));
        float *d_stats;
        cudaCheck(cudaMalloc(&d_stats, 3 * n * sizeof(float)));
        for (int r = 0; r < tp; r++) {
            float *logits = make_random(nl, -4.0f, 4.0f);
            for (int i = 0; i < n; i++) { if (rng_u32() % 4 == 0) { logits[(size_t)i * Vl + (i % Vl)] = 12.0f; } }   // some peaked rows
            floatX *d_logits = to_device(logits, nl);
            e[r] = logits;
            ce_stats_cpu(stats_all + (size_t)r * n * 3, e[r], targets, r * Vl, V, n, Vl);
            ce_stats_cuda(d_stats, d_logits, d_targets, r * Vl, V, n, Vl);
            fails += compare_device_f32("ce_stats stats", d_stats, stats_all + (size_t)r * n * 3, 3 * n, TOL_FP32);
            fails += compare_device("ce_stats exp(z - m)", d_logits, e[r], nl, TOL_X);
            if (tp == 1) {
                report_time("ce_stats", time_ms(20, [&] { ce_stats_cuda(d_stats, d_logits, d_targets, 0, V, n, Vl); }),
                            2.0 * nl * sizeof(floatX), 0);
            }
            cudaCheck(cudaFree(d_logits));
            for (size_t k = 0; k < nl; k++) { e[r][k] = floatX_to_float(float_to_floatX(e[r][k])); }   // what the device holds
        }
        float *d_stats_all = to_device_f32(stats_all, (size_t)tp * n * 3);
        for (int r = 0; r < tp; r++) {
            float *losses = (float *)malloc_check(n * sizeof(float));
            floatX *d_e = to_device(e[r], nl);
            float *d_losses;
            cudaCheck(cudaMalloc(&d_losses, n * sizeof(float)));
            // loss only (evaluation): e untouched
            ce_loss_dlogits_cuda(d_e, d_losses, d_stats_all, d_targets, r * Vl, n, Vl, tp, r, dloss, 0);
            fails += compare_device("ce e untouched (no dlogits)", d_e, e[r], nl, TOL_X);
            ce_loss_dlogits_cpu(e[r], losses, stats_all, targets, r * Vl, n, Vl, tp, r, dloss, 1);
            fails += compare_device_f32("ce losses (no dlogits)", d_losses, losses, n, TOL_FP32);
            cudaCheck(cudaMemset(d_losses, 0, n * sizeof(float)));
            ce_loss_dlogits_cuda(d_e, d_losses, d_stats_all, d_targets, r * Vl, n, Vl, tp, r, dloss, 1);
            fails += compare_device_f32("ce losses", d_losses, losses, n, TOL_FP32);
            fails += compare_device("ce dlogits", d_e, e[r], nl, TOL_X);
            if (tp == 1) {
                report_time("ce_loss_dlogits", time_ms(20, [&] { ce_loss_dlogits_cuda(d_e, d_losses, d_stats_all, d_targets, 0, n, Vl, tp, r, dloss, 1); }),
                            2.0 * nl * sizeof(floatX), 0);
            }
            cudaCheck(cudaFree(d_e)); cudaCheck(cudaFree(d_losses));
            free(losses);
        }
        cudaCheck(cudaFree(d_stats_all)); cudaCheck(cudaFree(d_stats));
        for (int r = 0; r < tp; r++) { free(e[r]); }
        free(e); free(stats_all);
    }
    cudaCheck(cudaFree(d_targets));
    free(targets);
    return harness_finish(fails);
}
