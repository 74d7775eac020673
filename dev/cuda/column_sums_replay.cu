// The all-SM column sums (llmc/residual.h: column_partials, column_finish) replayed on the CPU: every
// (block, thread) of both passes is run in turn through the kernels' own bodies, with the grid and the
// slices column_sums_accumulate would launch, and the result compared with the exact sums of the CPU loops'
// math (bias_backward_cpu; layernorm_backward_cpu's dweight, dbias; rmsnorm_backward_cpu's dweight: mean and dbias
// NULL). Checks the indexing and the slicing: the partials start as NaN, so a slot never written, or a row of a
// slice summed twice or never, shows.
// fp32 (floatX = float, so the sums compare tightly); build and run without a GPU: make -C dev/cuda replay
#include "../../llmc/layernorm.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int fails = 0;

static float rnd(unsigned int *s) { *s = *s * 1664525u + 1013904223u; return ((*s >> 8) / 16777216.0f) * 2.0f - 1.0f; }

// random values, as floats and as floatX
static void make(float *f, floatX *x, size_t n, unsigned int *s) {
    for (size_t i = 0; i < n; i++) { x[i] = (floatX)rnd(s); f[i] = (float)x[i]; }
}

// mode 0: bias (dbias); 1: LayerNorm (dbias, dweight); 2: RMSNorm (dweight only: mean NULL, dbias NULL)
static void run(int N, int C, int mode, size_t workspace_floats) {
    const int layernorm = mode != 0, rms = mode == 2;
    unsigned int seed = 1234u + N * 7u + C;
    size_t NC = (size_t)N * C;
    float *dy = (float *)malloc(NC * sizeof(float)), *x = (float *)malloc(NC * sizeof(float));
    floatX *dyx = (floatX *)malloc(NC * sizeof(floatX)), *xx = (floatX *)malloc(NC * sizeof(floatX));
    float *mean = (float *)malloc(N * sizeof(float)), *rstd = (float *)malloc(N * sizeof(float));
    make(dy, dyx, NC, &seed);
    make(x, xx, NC, &seed);
    for (int n = 0; n < N; n++) { mean[n] = 0.1f * rnd(&seed); rstd[n] = 1.0f + 0.5f * rnd(&seed); }
    // the replay: column_sums_accumulate's launch, block by block, thread by thread
    int sums = layernorm ? 2 : 1, rows = column_slice_rows(N, C, sums, workspace_floats * sizeof(float));
    int R = ceil_div(N, rows), gx = ceil_div(C, COLSUM_THREADS);
    float *part = (float *)malloc((size_t)sums * R * C * sizeof(float));
    for (size_t i = 0; i < (size_t)sums * R * C; i++) { part[i] = NAN; }
    for (int r = 0; r < R; r++) {
        for (int cx = 0; cx < gx; cx++) {
            for (int t = 0; t < COLSUM_THREADS; t++) {
                column_partials(part, dyx, layernorm ? xx : NULL, rms ? NULL : mean, rstd, N, C, rows, R, cx, r, t);
            }
        }
    }
    floatX *gb = (floatX *)malloc(C * sizeof(floatX)), *gw = (floatX *)malloc(C * sizeof(floatX));
    for (int c = 0; c < C; c++) { gb[c] = (floatX)0.0f; gw[c] = (floatX)0.0f; }
    for (int b = 0; b < gx; b++) {
        for (int t = 0; t < COLSUM_THREADS; t++) {
            column_finish(rms ? NULL : gb, layernorm ? gw : NULL, part, C, R, b * COLSUM_THREADS + t);
        }
    }
    // compare with the exact sums (double; the CPU loops' math: sum dy, sum xhat dy). floatX = float here,
    // and fp32 sums of the slices (rows terms) and of the partials (R terms) are within (rows + R) u sum |term|
    // of exact (u = 2^-24): a bound, where a row missed or summed twice changes a sum by a whole term.
    double worst = 0.0;
    int bad = 0;
    for (int c = 0; c < C; c++) {
        double want[2] = {0.0, 0.0}, mag[2] = {0.0, 0.0};
        for (int n = 0; n < N; n++) {
            double d = dy[(size_t)n * C + c], xd = ((double)x[(size_t)n * C + c] - (rms ? 0.0 : mean[n])) * rstd[n] * d;
            want[0] += d; mag[0] += fabs(d); want[1] += xd; mag[1] += fabs(xd);
        }
        for (int k = rms; k < sums; k++) {   // (RMSNorm: no bias sums; gb must stay 0)
            double got = (double)(float)(k ? gw[c] : gb[c]), err = fabs(got - want[k]);
            double allowed = (rows + R + 2) * 0x1p-24 * mag[k] + 1e-30;
            if (!(err <= allowed)) { bad++; }
            if (err / allowed > worst) { worst = err / allowed; }
        }
    }
    for (int c = 0; c < C && rms; c++) { bad += (float)gb[c] != 0.0f; }
    printf("%-4s column sums replayed, %-9s N %5d C %4d: %d slices of %d rows, grid (%d, %d): %d of %d sums off the exact ones "
           "by more than the fp32 bound (worst err/bound %.3f)\n", bad ? "FAIL" : "ok", rms ? "rmsnorm" : layernorm ? "layernorm" : "bias", N, C,
           R, rows, gx, R, bad, (sums - rms) * C, worst);
    fails += bad > 0;
    free(dy); free(x); free(dyx); free(xx); free(mean); free(rstd); free(part); free(gb); free(gw);
}

int main(void) {
    size_t ws = cublaslt_workspace_size / sizeof(float);
    run(16384, 768, 1, ws);     // GPT-2 124M LayerNorm, B16 T1024
    run(16384, 768, 0, ws);     // attproj / fcproj bias
    run(16384, 3072, 0, ws);    // fc bias
    run(333, 100, 1, ws);       // odd: a partial last slice, a partial block of columns
    run(1, 7, 0, ws);           // one row
    run(5000, 300, 1, 4096);    // a small workspace: the slices grow until the partials fit
    run(8192, 4096, 2, ws);     // Llama 3 8B RMSNorm (no mean, no bias), B8 T1024
    run(333, 100, 2, ws);       // odd RMSNorm
    run(5000, 300, 2, 4096);    // RMSNorm, small workspace
    return fails != 0;
}
