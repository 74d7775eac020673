// The cross-entropy checks shared by the fused_ce harness (GPU) and its CPU replay: dlogits compared row
// by row as probabilities, and losses, against the CPU loops of llmc/fused_ce.h; a rank's row stats (max, sum of
// exp, target logit) against the loop's max and target logit and the exact sum (ce_check_stats).
//
// dlogits_j = (p_j - onehot_j) dloss with p_j = exp(z_j - M) / S. An element passes when
//     |got - want| <= U |want| + E p_j |dloss|
// U: the rounding of the stored result (bf16: u = 2^-8; fp32: 2^-22, the CPU loop's own two roundings);
// E = 1e-4: the fp32 arithmetic of p_j (exp of an argument up to ~20 in magnitude, 1/S, and S summed over
// up to ~50k terms in another order: each ~1e-6 relative, so E is a 20x margin). The bound is relative
// to each probability, so the small ones (~1/V) are checked as strictly as the large ones: a softmax part
// off by 2x, or one column's probability off by 2x, fails. Padding columns (j >= valid) must be exactly 0.
// Also reported: the worst row's L1 error of p in probability units (sum_j |p_got - p_want|, p sums to 1).
#ifndef DEV_CUDA_CE_CHECK_H
#define DEV_CUDA_CE_CHECK_H

#include <math.h>
#include <stdio.h>

#if defined(ENABLE_FP32)
static const double CE_U = 0x1p-22;
#else
static const double CE_U = 0x1p-8;
#endif
static const double CE_E = 1e-4;

// got, want (n, Vl) dlogits of a rank holding columns [v0, v0 + Vl), of which `valid` are real tokens:
// the elements outside the bound (and the worst err/bound, the worst row's L1 error of p)
static size_t ce_dlogits_errors(const float *got, const float *want, const int *targets, int v0, int valid, int n, int Vl,
                                float dloss, double *worst_out, double *worst_l1_out) {
    size_t bad = 0;
    double worst = 0.0, worst_l1 = 0.0;
    for (int i = 0; i < n; i++) {
        double l1 = 0.0;
        int t = targets[i] - v0;
        for (int j = 0; j < Vl; j++) {
            size_t k = (size_t)i * Vl + j;
            double g = got[k], w = want[k], err = fabs(g - w);
            if (j >= valid) { bad += g != 0.0; continue; }
            double p = w / dloss + (j == t ? 1.0 : 0.0);
            double bound = CE_U * fabs(w) + CE_E * fabs(p * dloss) + 1e-37;
            if (!(err <= bound)) { bad++; }
            if (err / bound > worst) { worst = err / bound; }
            l1 += err / fabs(dloss);
        }
        if (l1 > worst_l1) { worst_l1 = l1; }
    }
    *worst_out = worst;
    *worst_l1_out = worst_l1;
    return bad;
}

static int ce_check_dlogits(const char *what, const float *got, const float *want, const int *targets, int v0,
                            int valid, int n, int Vl, float dloss) {
    double worst, worst_l1;
    size_t bad = ce_dlogits_errors(got, want, targets, v0, valid, n, Vl, dloss, &worst, &worst_l1);
    printf("  %-32s %zu of %zu elements outside U|want| + E p|dloss| (worst err/bound %.3f; worst row L1 error of p %.2e): %s\n",
           what, bad, (size_t)n * Vl, worst, worst_l1, bad ? "FAIL" : "ok");
    return bad != 0;
}

// stats (n, 3) [m, s, target logit] of a rank's rows z (n, Vl) with `valid` real columns, from ce_thread_stats
// (vectors of W, nt threads) and ce_block_stats. m and the target logit are elements of the row: equal to the CPU
// loop's. The sum s = sum_j exp(x_j), x_j = z_j - m <= 0, is checked against that sum taken in double, not against
// the CPU loop's fp32 sum: the loop's own rounding (exp_poly, another order over up to ~50k terms; 1.3e-5 relative
// on GPT-2's rows at tp 2, which failed the 1e-5 this check had) is larger than the kernel's, so a fixed tolerance
// between the two either fails correct kernels or passes a dropped column. The kernel's bound, to first order in
// u = 2^-24, a relative error per term weighted by exp(x_j):
//   exp(a): expf is within 2 ulp, __expf (--use_fast_math) within 2 + 1.173 |a| ulp (CUDA C Programming Guide);
//     an ulp is <= 2u relative, so (c0 + c1 |a|) u with c0 = 4, c1 = 2.346 covers both
//   a term: its argument z_j - m' rounded (m' the thread's max so far, in [z_j, m]: |a| <= |x_j|, error |x_j| u)
//     and its exp: c0 + (1 + c1) |x_j|
//   the rescales of the partial sum holding it, at most R = V_t (the thread's vectors after its first that raise
//     its max, and the block's exp(m_t - m)), each an exp, its argument and a product; their arguments add up to
//     m - m' <= |x_j|: R (c0 + 1) + (1 + c1) |x_j|
//   the additions: the thread's n_t - 1 (n_t = W V_t columns, V_t = ceil(valid / (W nt)) vectors), then the
//     block's two xor-butterflies of 5 levels: n_t + 9
// so |s - sum| <= sum_j exp(x_j) K_j u / (1 - K_j u) + valid 2^-125 (terms fast math flushes to 0), with
//   K_j = (R + 1) c0 + R + n_t + 9 + 2 (1 + c1) |x_j|
// GPT-2 at tp 2 (25,152 columns, 1,024 threads; W 4: R 7, n_t 28; W 8: R 4, n_t 32): K = 65 to 76 + 6.7 |x_j|,
// ~5e-6 of the sum, where one average column of a row of logits in [-4, 4] is ~4e-5 of it and a vector ~2e-4
// (a kernel that drops the row's last column fails on about half of the rows). A rank of padding only: m = -inf,
// s = 0 exactly.
static int ce_check_stats(const char *what, const float *got, const float *want, const float *z, int valid, int n,
                          int Vl, int W, int nt) {
    const double u = 0x1p-24, c0 = 4.0, c1 = 2.346;
    int vt = valid > 0 ? (valid + W * nt - 1) / (W * nt) : 0, nth = W * vt;
    double K0 = (vt + 1) * c0 + vt + nth + 9, worst = 0.0, worst_cpu = 0.0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const float *g = got + 3 * i, *w = want + 3 * i, *zi = z + (size_t)i * Vl;
        int ok = g[0] == w[0] && g[2] == w[2];
        if (valid <= 0) { ok = ok && g[1] == 0.0f && w[1] == 0.0f; }
        else {
            double sum = 0.0, bound = valid * 0x1p-125;
            for (int j = 0; j < valid; j++) {
                double x = (double)zi[j] - w[0], t = exp(x), K = K0 + 2.0 * (1.0 + c1) * fabs(x);
                sum += t;
                bound += t * K * u / (1.0 - K * u);
            }
            double err = fabs(g[1] - sum);
            ok = ok && err <= bound;
            if (err / bound > worst || err != err) { worst = err / bound; }
            if (fabs(w[1] - sum) / sum > worst_cpu) { worst_cpu = fabs(w[1] - sum) / sum; }
        }
        bad += !ok;
    }
    printf("  %-32s %d of %d rows off (m, target logit exact; s within the kernel's bound of the exact sum: "
           "worst err/bound %.3f; the CPU loop's s off by %.1e relative): %s\n", what, bad, n, worst, worst_cpu,
           bad ? "FAIL" : "ok");
    return bad != 0;
}

// losses: |got - want| <= 1e-5 (1 + |want|) (fp32: log S + M - target logit; S to ~1e-6 relative)
static int ce_check_losses(const char *what, const float *got, const float *want, int n) {
    int bad = 0;
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]), bound = 1e-5 * (1.0 + fabs(want[i]));
        if (!(err <= bound)) { bad++; }
        if (err / bound > worst) { worst = err / bound; }
    }
    printf("  %-32s %d of %d losses outside 1e-5 (1 + |want|) (worst err/bound %.3f): %s\n", what, bad, n, worst, bad ? "FAIL" : "ok");
    return bad != 0;
}

// The check must tell a wrong softmax: dlogits with p doubled, and with one probability per row doubled,
// each fail on every row. Returns 1 if the check lets either pass (the tolerance would be useless).
static int ce_check_rejects_wrong_softmax(const float *want, const int *targets, int v0, int valid, int n, int Vl, float dloss) {
    if (valid <= 0) { return 0; }   // a rank of padding only: no softmax to get wrong
    size_t nl = (size_t)n * Vl;
    float *wrong = (float *)malloc(nl * sizeof(float));
    size_t flagged[2];
    for (int mode = 0; mode < 2; mode++) {
        for (int i = 0; i < n; i++) {
            int t = targets[i] - v0, one = (i * 7919) % valid;
            if (one == t) { one = (one + 1) % valid; }
            for (int j = 0; j < Vl; j++) {
                size_t k = (size_t)i * Vl + j;
                double p = want[k] / dloss + (j == t ? 1.0 : 0.0);
                int doubled = j < valid && (mode == 0 || j == one);
                wrong[k] = doubled ? (float)((2.0 * p - (j == t ? 1.0 : 0.0)) * dloss) : want[k];
            }
        }
        double worst, worst_l1;
        flagged[mode] = ce_dlogits_errors(wrong, want, targets, v0, valid, n, Vl, dloss, &worst, &worst_l1);
    }
    int missed = flagged[0] == 0 || flagged[1] < (size_t)n;   // every row's doubled probability flagged
    printf("  %-32s every p doubled: %zu elements flagged; one p_j per row doubled: %zu of %d rows flagged: %s\n",
           "the check on a wrong softmax", flagged[0], flagged[1], n, missed ? "NOT REJECTED: FAIL" : "rejected: ok");
    free(wrong);
    return missed != 0;
}

#endif
