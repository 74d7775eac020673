// The cross-entropy checks shared by the fused_ce harness (GPU) and its CPU replay: dlogits compared row
// by row as probabilities, and losses, against the CPU loops of llmc/fused_ce.h.
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

// stats (n, 3) [m, s, target logit]: m and the target logit are elements of the row (exact), s within
// 1e-5 relative; a rank of padding only has m = -inf, s = 0 on both sides
static int ce_check_stats(const char *what, const float *got, const float *want, int n) {
    int bad = 0;
    for (int i = 0; i < 3 * n; i++) {
        double g = got[i], w = want[i];
        if (!(g == w || (i % 3 == 1 && fabs(g - w) <= 1e-5 * fabs(w)))) { bad++; }
    }
    printf("  %-32s %d of %d rows off (max and target logit exact, sum within 1e-5): %s\n", what, bad, n, bad ? "FAIL" : "ok");
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
