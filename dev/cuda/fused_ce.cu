// Fused CE pieces (llmc/fused_ce.h) against the CPU loops: at tp 1 the one-kernel path (ce_fused: stats,
// loss, dlogits of a row in one pass), at tp 2 the split path (ce_stats per rank, the all-gather simulated
// on the host, ce_loss_dlogits); the loss-only (evaluation) launches leave the logits untouched. dlogits
// are compared as probabilities, element by element relative to each one (ce_check.h), so a softmax off by
// 2x fails; the check proves it on a doubled softmax first. Then timed.
// GPT-2 124M: a chunk of n=256 tokens x Vp=50304 columns (V=50257: 47 padding columns), the two halves
// of a tp=2 split (the second half holds all the padding); a row length that is not a multiple of the
// 16-byte vector (the scalar path) and a misaligned logits pointer; tp 4 with two ranks of padding only and tp 8
// (ce_global_stats' loop over 4 and more ranks: nvcc 13.0 miscompiled it unrolled, llmc/fused_ce.h).
#include "../../llmc/fused_ce.h"
#include "common.h"
#include "ce_check.h"

// rank r of tp holding Vl = Vp / tp columns: its logits (rounded to floatX: the CPU loop sees what the device holds)
static float *make_logits(int n, int Vl) {
    float *z = make_random((size_t)n * Vl, -4.0f, 4.0f);
    for (int i = 0; i < n; i++) { if (rng_u32() % 4 == 0) { z[(size_t)i * Vl + (i % Vl)] = 12.0f; } }   // some peaked rows
    return z;
}

// the device copy of z at `skew` elements past an aligned allocation (*base: what to free)
static floatX *logits_to_device(floatX **base, const float *z, size_t nl, int skew) {
    cudaCheck(cudaMalloc(base, (nl + skew) * sizeof(floatX)));
    upload_floats(*base + skew, z, nl);
    return *base + skew;
}

static int run(const char *name, int n, int V, int Vp, int tp, int skew, int timed) {
    int fails = 0, Vl = Vp / tp;
    size_t nl = (size_t)n * Vl;
    const float dloss = 1.0f / (8 * 1024);
    int *targets = make_tokens(n, V), *d_targets = to_device_int(targets, n);
    printf("-- %s: tp=%d, %d tokens x %d local columns (V %d), logits pointer skew %d\n", name, tp, n, Vl, V, skew);
    float **z = (float **)malloc_check(tp * sizeof(float *));
    float *stats_all = (float *)malloc_check((size_t)tp * n * 3 * sizeof(float));
    float *losses = (float *)malloc_check(n * sizeof(float)), *d_stats, *d_losses;
    cudaCheck(cudaMalloc(&d_stats, 3 * n * sizeof(float)));
    cudaCheck(cudaMalloc(&d_losses, n * sizeof(float)));
    for (int r = 0; r < tp; r++) { z[r] = make_logits(n, Vl); }
    for (int r = 0; r < tp; r++) { ce_stats_cpu(stats_all + (size_t)r * n * 3, z[r], targets, r * Vl, V, n, Vl); }
    for (int r = 0; r < tp; r++) {
        int v0 = r * Vl, valid = V - v0 < Vl ? V - v0 : Vl;
        floatX *base, *d_z = logits_to_device(&base, z[r], nl, skew);
        printf("  rank %d of %d: %d valid columns, vector width %d\n", r, tp, valid, ce_vector_width(d_z, Vl));
        float *want = copy_floats(z[r], nl);
        ce_loss_dlogits_cpu(want, losses, stats_all, targets, v0, V, n, Vl, tp, dloss, 1);
        fails += ce_check_rejects_wrong_softmax(want, targets, v0, valid, n, Vl, dloss);
        // loss only: the logits stay as they were
        if (tp == 1) { ce_fused_cuda(d_z, d_losses, d_targets, V, n, Vl, dloss, 0); }
        else {
            ce_stats_cuda(d_stats, d_z, d_targets, v0, V, n, Vl);
            float *st = from_device_f32(d_stats, 3 * n);
            int W = ce_vector_width(d_z, Vl);
            fails += ce_check_stats("ce_stats (m, s, target logit)", st, stats_all + (size_t)r * n * 3, z[r], valid,
                                    n, Vl, W, ce_threads(Vl, W));
            free(st);
            float *d_stats_all = to_device_f32(stats_all, (size_t)tp * n * 3);
            ce_loss_dlogits_cuda(d_z, d_losses, d_stats_all, d_targets, v0, V, n, Vl, tp, dloss, 0);
            cudaCheck(cudaFree(d_stats_all));
        }
        float *got = from_device(d_z, nl);
        int same = memcmp(got, z[r], nl * sizeof(float)) == 0;
        printf("  %-32s %s\n", "logits after a loss-only launch", same ? "untouched: ok" : "CHANGED: FAIL");
        fails += !same;
        free(got);
        got = from_device_f32(d_losses, n);
        fails += ce_check_losses("losses (loss only)", got, losses, n);
        free(got);
        // loss and dlogits
        cudaCheck(cudaMemsetAsync(d_losses, 0, n * sizeof(float), main_stream));
        float *d_stats_all = to_device_f32(stats_all, (size_t)tp * n * 3);
        if (tp == 1) { ce_fused_cuda(d_z, d_losses, d_targets, V, n, Vl, dloss, 1); }
        else { ce_loss_dlogits_cuda(d_z, d_losses, d_stats_all, d_targets, v0, V, n, Vl, tp, dloss, 1); }
        got = from_device_f32(d_losses, n);
        fails += ce_check_losses("losses", got, losses, n);
        free(got);
        got = from_device(d_z, nl);
        fails += ce_check_dlogits("dlogits", got, want, targets, v0, valid, n, Vl, dloss);
        free(got);
        if (timed) {   // at tp 1: the one-pass kernel, and the split path's two kernels on the same row
            upload_floats(d_z, z[r], nl);
            report_time("ce_fused", time_ms(20, [&] { ce_fused_cuda(d_z, d_losses, d_targets, V, n, Vl, dloss, 1); }), 2.0 * nl * sizeof(floatX), 0);
            upload_floats(d_z, z[r], nl);
            report_time("ce_stats", time_ms(20, [&] { ce_stats_cuda(d_stats, d_z, d_targets, 0, V, n, Vl); }), 1.0 * nl * sizeof(floatX), 0);
            report_time("ce_loss_dlogits", time_ms(20, [&] { ce_loss_dlogits_cuda(d_z, d_losses, d_stats_all, d_targets, 0, V, n, Vl, 1, dloss, 1); }),
                        2.0 * nl * sizeof(floatX), 0);
        }
        cudaCheck(cudaFree(d_stats_all));
        cudaCheck(cudaFree(base));
        free(want);
    }
    for (int r = 0; r < tp; r++) { free(z[r]); }
    cudaCheck(cudaFree(d_stats)); cudaCheck(cudaFree(d_losses)); cudaCheck(cudaFree(d_targets));
    free(z); free(stats_all); free(losses); free(targets);
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "fused_ce");
    rng_seed(7);
    int fails = 0;
    fails += run("GPT-2 124M chunk", 256, 50257, 50304, 1, 0, 1);
    fails += run("GPT-2 124M chunk, vocab-parallel", 256, 50257, 50304, 2, 0, 0);
    fails += run("row length not a multiple of the vector", 33, 1000, 1001, 1, 0, 0);
    fails += run("misaligned logits pointer", 33, 1000, 1024, 1, 3, 0);
    fails += run("a rank of padding only", 9, 100, 256, 4, 0, 0);
    fails += run("GPT-2 124M rows, vocab-parallel over 8 ranks", 32, 50257, 50304, 8, 0, 0);
    return harness_finish(fails);
}
