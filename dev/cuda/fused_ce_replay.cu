// The cross-entropy kernels (llmc/fused_ce.h) replayed on the CPU: for each row (one block), every one of
// the block's ce_threads(Vl, W) threads runs the kernels' own thread bodies (ce_thread_stats, ce_thread_dlogits)
// in turn; the block's max and sum (ce_block_stats: block_reduce_max/sum, device-only) are done here in
// block_reduce_sum's order, and the loss kernel's global (M, S) is its own ce_global_stats. Checks the 16-byte
// vector slicing, the scalar fallback (a row length that is not a multiple of the vector, a misaligned pointer),
// the padding columns and the target column, against the CPU loops, with the harness's own checks (ce_check.h:
// dlogits as probabilities, relative to each one; the row sums against the exact sums within the kernel's bound).
// Outputs start as the logits themselves, so an element never written shows. Built twice: bf16 (vector
// of 8) and fp32 (vector of 4). No GPU needed: make -C dev/cuda replay. (It runs the kernels' code compiled
// by the host compiler: it cannot see what nvcc makes of it; the GPU harness dev/cuda/fused_ce.cu does.)
#include "../../llmc/fused_ce.h"
#include "ce_check.h"
#include <stdlib.h>

static int fails = 0;
static unsigned int seed = 12345u;
static float rnd(void) { seed = seed * 1664525u + 1013904223u; return ((seed >> 8) / 16777216.0f) * 2.0f - 1.0f; }

// warp_reduce_sum's order (llmc/backend.h): an xor-butterfly over the 32 lanes of v; lane 0's sum
static float replay_warp_sum(const float *v0) {
    float v[32], w[32];
    memcpy(v, v0, sizeof(v));
    for (int off = 16; off > 0; off >>= 1) {
        for (int l = 0; l < 32; l++) { w[l] = v[l] + v[l ^ off]; }
        memcpy(v, w, sizeof(v));
    }
    return v[0];
}

// block_reduce_sum's order: each warp's butterfly, then one over the warps' sums (lanes past the warps 0)
static float replay_block_sum(const float *v, int nt) {
    float buf[32] = {0.0f};
    for (int w = 0; w < nt / 32; w++) { buf[w] = replay_warp_sum(v + 32 * w); }
    return replay_warp_sum(buf);
}

// block i of ce_stats_kernel / ce_fused_kernel up to the reductions: the row's (M, S) over its valid columns, the
// block's max and sum (ce_block_stats) in block_reduce_max/sum's order
template <int W>
static void replay_row_stats(float *M, float *S, const floatX *z, int valid, int nt) {
    float m[CE_THREADS], s[CE_THREADS];
    for (int t = 0; t < nt; t++) { ce_thread_stats<W>(&m[t], &s[t], z, valid, t, nt); }
    *M = -INFINITY;
    for (int t = 0; t < nt; t++) { *M = fmaxf(*M, m[t]); }
    for (int t = 0; t < nt; t++) { s[t] = m[t] == -INFINITY ? 0.0f : s[t] * expf(m[t] - *M); }
    *S = replay_block_sum(s, nt);
}

// one case: tp ranks of Vl = Vp / tp columns; rank r's logits at `skew` elements past a 16-byte boundary.
// tp = 1 replays ce_fused_kernel, tp > 1 ce_stats_kernel then ce_loss_dlogits_kernel.
template <int W>
static void replay_rank(float *stats, float *losses, floatX *zx, const float *stats_all, const int *targets, int v0,
                        int V, int n, int Vl, int tp, float dloss, int pass) {
    int valid = V - v0 < Vl ? V - v0 : Vl, nt = ce_threads(Vl, W);
    for (int i = 0; i < n; i++) {
        floatX *z = zx + (size_t)i * Vl;
        int t = targets[i] - v0;
        if (tp == 1) {
            float M, S, zt = t >= 0 && t < valid ? (float)z[t] : 0.0f;
            replay_row_stats<W>(&M, &S, z, valid, nt);
            losses[i] = logf(S) + M - zt;
            for (int th = 0; th < nt; th++) { ce_thread_dlogits<W>(z, valid, Vl, t, M, 1.0f / S, dloss, th, nt); }
        } else if (pass == 0) {
            replay_row_stats<W>(&stats[3 * i], &stats[3 * i + 1], z, valid, nt);
            stats[3 * i + 2] = t >= 0 && t < valid ? (float)z[t] : 0.0f;
        } else {
            float M, S, zt;
            ce_global_stats(&M, &S, &zt, stats_all, i, n, tp);   // the kernel's own function
            losses[i] = logf(S) + M - zt;
            for (int th = 0; th < nt; th++) { ce_thread_dlogits<W>(z, valid, Vl, t, M, 1.0f / S, dloss, th, nt); }
        }
    }
}

static void run(const char *name, int n, int V, int Vp, int tp, int skew) {
    int Vl = Vp / tp, fails0 = fails;
    size_t nl = (size_t)n * Vl;
    const float dloss = 1.0f / (8 * 1024);
    printf("-- %s: tp %d, %d rows x %d local columns (V %d), pointer skew %d\n", name, tp, n, Vl, V, skew);
    int *targets = (int *)malloc(n * sizeof(int));
    for (int i = 0; i < n; i++) { targets[i] = (int)((rnd() * 0.5f + 0.5f) * (V - 1)); }
    float **z = (float **)malloc(tp * sizeof(float *));
    float *stats_all = (float *)malloc((size_t)tp * n * 3 * sizeof(float)), *stats = (float *)malloc((size_t)n * 3 * sizeof(float));
    float *losses = (float *)malloc(n * sizeof(float)), *got_losses = (float *)malloc(n * sizeof(float));
    floatX *base = (floatX *)aligned_alloc(16, ((nl + skew) * sizeof(floatX) + 15) / 16 * 16), *zx = base + skew;
    float *got = (float *)malloc(nl * sizeof(float));
    for (int r = 0; r < tp; r++) {
        z[r] = (float *)malloc(nl * sizeof(float));
        for (size_t k = 0; k < nl; k++) { z[r][k] = (float)(floatX)(4.0f * rnd()); }
        for (int i = 0; i < n; i += 3) { z[r][(size_t)i * Vl + (i * 31) % Vl] = 12.0f; }   // some peaked rows
        ce_stats_cpu(stats_all + (size_t)r * n * 3, z[r], targets, r * Vl, V, n, Vl);
    }
    for (int r = 0; r < tp; r++) {
        int v0 = r * Vl, valid = V - v0 < Vl ? V - v0 : Vl, vec = ce_vector_width(zx, Vl);
        if (tp > 1) {   // pass 1 (ce_stats_kernel) on the logits, against the CPU loop
            for (size_t k = 0; k < nl; k++) { zx[k] = (floatX)z[r][k]; }
            if (vec > 1) { replay_rank<CE_VEC>(stats, NULL, zx, NULL, targets, v0, V, n, Vl, tp, dloss, 0); }
            else { replay_rank<1>(stats, NULL, zx, NULL, targets, v0, V, n, Vl, tp, dloss, 0); }
            fails += ce_check_stats("stats", stats, stats_all + (size_t)r * n * 3, z[r], valid, n, Vl, vec,
                                    ce_threads(Vl, vec));
        }
        for (size_t k = 0; k < nl; k++) { zx[k] = (floatX)z[r][k]; }
        if (vec > 1) { replay_rank<CE_VEC>(NULL, got_losses, zx, stats_all, targets, v0, V, n, Vl, tp, dloss, 1); }
        else { replay_rank<1>(NULL, got_losses, zx, stats_all, targets, v0, V, n, Vl, tp, dloss, 1); }
        printf("  rank %d: %d valid columns, vector width %d\n", r, valid, vec);
        float *want = (float *)malloc(nl * sizeof(float));
        memcpy(want, z[r], nl * sizeof(float));
        ce_loss_dlogits_cpu(want, losses, stats_all, targets, v0, V, n, Vl, tp, dloss, 1);
        for (size_t k = 0; k < nl; k++) { got[k] = (float)zx[k]; }
        fails += ce_check_losses("losses", got_losses, losses, n);
        fails += ce_check_dlogits("dlogits", got, want, targets, v0, valid, n, Vl, dloss);
        fails += ce_check_rejects_wrong_softmax(want, targets, v0, valid, n, Vl, dloss);
        free(want);
    }
    for (int r = 0; r < tp; r++) { free(z[r]); }
    free(z); free(stats_all); free(stats); free(losses); free(got_losses); free(base); free(got); free(targets);
    printf("%s fused CE replayed (%s), %s: tp %d, %d x %d columns, V %d, skew %d\n", fails > fails0 ? "FAIL" : "ok",
           PRECISION_NAME, name, tp, n, Vl, V, skew);
}

int main(void) {
    printf("== fused CE kernels replayed on the CPU (floatX %s, vector of %d)\n", PRECISION_NAME, CE_VEC);
    run("GPT-2 124M rows", 6, 50257, 50304, 1, 0);
    run("GPT-2 124M rows, vocab-parallel", 4, 50257, 50304, 2, 0);
    run("row length not a multiple of the vector", 5, 1000, 1001, 1, 0);
    run("misaligned rows", 5, 1000, 1024, 1, 3);
    run("ranks of padding only", 3, 100, 256, 4, 0);
    run("vocab-parallel over 8 ranks", 3, 1000, 1024, 8, 0);
    run("fewer columns than threads x vector", 4, 300, 312, 1, 0);
    return fails != 0;
}
