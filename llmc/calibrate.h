// --calibrate FILE: this machine's rates for the cost model (cost_model.h's Machine), measured with this build's
// own kernels and collectives at the model's layer shapes (-e, -b, -t: tp 1), on every rank at once (ranks
// that share cores or a link measure it shared), written as the key=value lines --machine reads:
//   flops       the MLP's fc forward and backward: 3 GEMMs of 2 (B T) C (4C) FLOPs; flops_R the same at R rows
//               (R = 32, 64, ... up to B T: a small micro-batch's GEMMs run at a lower rate)
//   attn_flops  causal attention forward and backward, counted as the cost model counts it (6 C T / 2 a token)
//   flash_slower CUDA bf16, head size 64 or 128: the flash kernels' attention time over cuBLAS's (--attention flash)
//   mem_bw      a bandwidth-bound kernel (residual + bias: reads 2, writes 1 of (B T, C))
//   adamw       parameters per second of the optimizer: the gradient's sum of squares (the clip norm) and
//               AdamW over 4M elements (the fp32 master too under bf16)
//   layer_cost  what a layer's ~20 kernels cost beyond their work: 20 GEMMs of one row
//   node_bw     an all-reduce over groups of p consecutive ranks (all the groups at once, as a layout's run),
//               in bytes per rank per second as cost_model.h counts them; node_bw_P at each p = 2, 4, ... up
//               to the world, node_bw at the largest
//   a2a_bw      the same of an all-to-all (what leaves the rank); a2a_bw_P
//   p2p_bw      the same of a send/receive exchange with the ring's neighbours (cp's and pp's); p2p_bw_P
//               (each at a message of 8M elements)
//   node_lat    each kind's seconds per call: its time at 1K elements less those elements at its bandwidth;
//   a2a_lat     node_lat_P, a2a_lat_P, p2p_lat_P at each p, the size-less keys at the largest
//   p2p_lat
//   cores       CPU build: the cores over the threads of a rank (more ranks than that share them)
//   overlap     how much of an asynchronous all-reduce over the world the fc GEMMs posted after it hide:
//               (t_gemm + t_comm - t_both) / min(t_gemm, t_comm), between 0 and 1, at a message that takes about
//               as long as the GEMMs (CUDA: NCCL's stream beside the compute; CPU: MPI progresses only inside
//               MPI calls, on the rank's own core)
// What it cannot measure here stays out of the file (the defaults apply, named in --plan-search's output):
// net_bw and net_lat (one machine has no network), gpus_per_node, and flash_slower where the flash kernels do not
// apply (the CPU build, fp32, head sizes other than 64 and 128).
#ifndef LLMC_CALIBRATE_H
#define LLMC_CALIBRATE_H

#include <unistd.h>
#include "backend.h"
#include "alloc.h"
#include "grid.h"
#include "comm.h"
#include "layout.h"
#include "model_file.h"
#include "matmul.h"
#include "residual.h"
#include "attention.h"
#include "global_norm.h"
#include "adamw.h"
#include "cost_model.h"

// Seconds per call of the code between CALIBRATE_TIME and CALIBRATE_END: repeated until 0.3 s have passed
// (at least 3 calls, one untimed first), the device synchronised, then the mean over the ranks. The ranks
// agree on when to stop (outside the timing), so that a collective measured is called as often on every rank.
#define CALIBRATE_TIME(g, out) do { \
    Grid *g_ = (g); double *out_ = (out), t0_ = 0; int n_ = -1; \
    for (;;) { \
        if (n_ == 0) { device_synchronize(); t0_ = monotonic_seconds(); }
#define CALIBRATE_END \
        n_++; \
        if (n_ >= 3) { \
            device_synchronize(); \
            double ta_ = monotonic_seconds(); \
            int stop_ = ta_ - t0_ > 0.3; \
            comm_host_all_reduce(&g_->world, &stop_, 1, DT_INT, HOST_MAX, "all-reduce (calibration)"); \
            t0_ += monotonic_seconds() - ta_; \
            if (stop_) { break; } \
        } \
    } \
    double s_ = (monotonic_seconds() - t0_) / n_; \
    comm_host_all_reduce(&g_->world, &s_, 1, DT_DOUBLE, HOST_SUM, "all-reduce (calibration)"); \
    *out_ = s_ / g_->world_size; \
} while (0)

// Each kind of collective (COMM_RING: all-reduce; COMM_A2A: all-to-all; COMM_P2P: an exchange with the ring's
// neighbours) over groups of p consecutive ranks, all the groups at once: bw[kind][i] at p = 2^i (bytes per rank
// per second, of a message of n / 2 elements) and lat[kind][i] (seconds per call: the time of 1K elements less
// their bytes at that bandwidth, at least 1% of the time). buf: n.
#define CALIBRATE_SIZES 8
static void calibrate_collectives(Grid *g, floatX *buf, size_t n, double bw[3][CALIBRATE_SIZES],
                                  double lat[3][CALIBRATE_SIZES]) {
    size_t half = n / 2;
    double X = sizeof(floatX);
    for (int i = 1, p = 2; i < CALIBRATE_SIZES && p <= g->world_size; i++, p *= 2) {
        if (g->world_size % p) { continue; }
        Group grp;
        group_init(&grp, "calibration", g->rank / p, g->rank);
        int r = grp.rank;
        for (int big = 1; big >= 0; big--) {
            size_t m = big ? half / p * p : 1024, counts[1 << (CALIBRATE_SIZES - 1)], offs[1 << (CALIBRATE_SIZES - 1)];
            for (int j = 0; j < p; j++) { counts[j] = m / p; offs[j] = j * (m / p); }
            P2POp ops[2] = {{1, buf, m, (r + 1) % p, 0}, {0, buf + half, m, (r + p - 1) % p, 0}};
            double t[3];
            CALIBRATE_TIME(g, &t[COMM_RING])
                comm_all_reduce(&grp, buf, m, DT_FLOATX, NULL);
            CALIBRATE_END;
            CALIBRATE_TIME(g, &t[COMM_A2A])
                comm_all_to_allv(&grp, buf, counts, offs, buf + half, counts, offs, DT_FLOATX);
            CALIBRATE_END;
            CALIBRATE_TIME(g, &t[COMM_P2P])
                comm_p2p(&grp, ops, 2, DT_FLOATX, NULL, NULL);
            CALIBRATE_END;
            // the bytes one rank sends per call (comm.h's count)
            double bytes[3] = {2.0 * (p - 1) / p * m * X, (p - 1.0) * (m / p) * X, m * X};
            for (int k = 0; k < 3; k++) {
                if (big) { bw[k][i] = bytes[k] / t[k]; }
                else { lat[k][i] = fmax(t[k] - bytes[k] / bw[k][i], 0.01 * t[k]); }
            }
        }
        group_free(&grp);
    }
}

// How much of an asynchronous all-reduce over the world compute hides: the all-reduce alone (t_c), the fc's
// GEMMs alone (t_gemm), and the all-reduce posted, the GEMMs run, then its wait (t_both), at a message the
// ring bandwidth bw moves in about t_gemm. (t_gemm + t_c - t_both) / min(t_gemm, t_c), between 0 and 1.
static double calibrate_overlap(Grid *g, floatX *buf, size_t n, double bw, double t_gemm, floatX *x, floatX *y,
                                floatX *dx, floatX *w, floatX *dw, int BT, int C) {
    Group grp;
    group_init(&grp, "calibration", 0, g->rank);
    double p = g->world_size, per = 2.0 * (p - 1) / p * sizeof(floatX);   // bytes a rank moves per element
    size_t m = (size_t)(t_gemm * bw / per);
    m = m < 1024 ? 1024 : m > n ? n : m;
    double t_c, t_both;
    CommRequest req = {};
    CALIBRATE_TIME(g, &t_c)
        comm_all_reduce(&grp, buf, m, DT_FLOATX, &req);
        comm_wait(&req);
    CALIBRATE_END;
    CALIBRATE_TIME(g, &t_both)
        comm_all_reduce(&grp, buf, m, DT_FLOATX, &req);
        matmul_forward(y, x, w, NULL, BT, C, 4 * C);
        matmul_backward(dx, dw, NULL, y, x, w, BT, C, 4 * C);
        comm_wait(&req);
    CALIBRATE_END;
    group_free(&grp);
    double o = (t_gemm + t_c - t_both) / fmin(t_gemm, t_c);
    return o < 0 ? 0 : o > 1 ? 1 : o;
}

// What --calibrate measured: seconds per call of each kernel (the GEMMs also at R = 2^i rows), the optimizer's over
// n_opt elements, the collectives' bandwidth and latency per kind and group size 2^i (top: the largest measured, 0:
// one rank), the overlap (-1: not measured).
typedef struct {
    double t_gemm, t_att, t_flash, t_mem, t_tiny, t_opt, t_rows[MACHINE_ROWS];   // (t_flash 0: not measured)
    size_t n_opt;
    double bw[3][CALIBRATE_SIZES], lat[3][CALIBRATE_SIZES], overlap;
    int top;
} Calibration;

// The optimizer over n elements: the norm's sum of squares, then AdamW; seconds per call.
static double calibrate_optimizer(Grid *g, size_t n) {
    floatX *p_opt = (floatX *)mem_alloc(n * sizeof(floatX), MEM_WORKSPACE);
    floatX *g_opt = (floatX *)mem_alloc(n * sizeof(floatX), MEM_WORKSPACE);
    float *m_opt = (float *)mem_alloc(n * sizeof(float), MEM_WORKSPACE);
    float *v_opt = (float *)mem_alloc(n * sizeof(float), MEM_WORKSPACE);
    float *master = sizeof(floatX) == 4 ? NULL : (float *)mem_alloc(n * sizeof(float), MEM_WORKSPACE);
    float *scalars = (float *)mem_alloc(2 * sizeof(float), MEM_WORKSPACE), one = 1.0f;   // the norm, the scale
    float *zeros = (float *)calloc_check(n, sizeof(float));
    upload_floats(p_opt, zeros, n); upload_floats(g_opt, zeros, n);
    copy_to_device(m_opt, zeros, n * sizeof(float));
    copy_to_device(v_opt, zeros, n * sizeof(float));
    if (master) { copy_to_device(master, zeros, n * sizeof(float)); }
    copy_to_device(scalars + 1, &one, sizeof(float));
    free(zeros);
    double t_opt;
    CALIBRATE_TIME(g, &t_opt)
        sum_of_squares(scalars, g_opt, n);
        adamw_update(p_opt, master, g_opt, m_opt, v_opt, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, scalars + 1, 1, 0);
    CALIBRATE_END;
    return t_opt;
}

// The machine file (rank 0): the rates from k, at the model's layer shapes (C, B T), and this rank's cores (CPU).
static void calibrate_write(const char *path, const Calibration *k, const Layout *lay, const ModelConfig *c, int world) {
    double C = c->channels, BT = (double)lay->B * lay->T, X = sizeof(floatX);
    double flops = 3 * 2.0 * BT * C * 4.0 * C / k->t_gemm, attn = BT * 6.0 * C * lay->T / 2 / k->t_att;
    FILE *f = fopen(path, "w");
    if (!f) { fail("--calibrate %s: cannot write it", path); }
    fprintf(f, "# --calibrate: %d rank(s) at once, this build's kernels at L %d C %d NH %d, B %d T %d (tp 1)\n",
            world, c->num_layers, c->channels, c->num_heads, lay->B, lay->T);
    fprintf(f, "flops=%.4g\nattn_flops=%.4g\nmem_bw=%.4g\nlayer_cost=%.4g\nadamw=%.4g\n", flops, attn,
            3.0 * 4 * BT * C * X / k->t_mem, k->t_tiny, k->n_opt / k->t_opt);
    fprintf(f, "# the GEMMs at R rows\n");
    for (int i = 0; i < MACHINE_ROWS; i++) {
        if (k->t_rows[i] > 0) { fprintf(f, "flops_%d=%.4g\n", 1 << i, 3 * 2.0 * (1 << i) * C * 4.0 * C / k->t_rows[i]); }
    }
    if (k->overlap >= 0) { fprintf(f, "overlap=%.3g\n", k->overlap); }
    if (k->t_flash > 0) { fprintf(f, "flash_slower=%.3g\n", k->t_flash / k->t_att); }
    static const char *keys[3] = {"node_bw", "a2a_bw", "p2p_bw"}, *lkeys[3] = {"node_lat", "a2a_lat", "p2p_lat"};
    for (int i = 1; i <= k->top; i++) {
        if (k->bw[COMM_RING][i] == 0) { continue; }
        fprintf(f, "# groups of %d: all-reduce, all-to-all, exchange\n", 1 << i);
        for (int j = 0; j < 3; j++) {
            fprintf(f, "%s_%d=%.4g\n%s_%d=%.4g\n", keys[j], 1 << i, k->bw[j][i], lkeys[j], 1 << i, k->lat[j][i]);
        }
    }
    int t = k->top;
    if (t) { for (int j = 0; j < 3; j++) { fprintf(f, "%s=%.4g\n%s=%.4g\n", keys[j], k->bw[j][t], lkeys[j], k->lat[j][t]); } }
    else { fprintf(f, "# the collectives: not measured (one rank); net_bw, net_lat, gpus_per_node: the defaults\n"); }
#ifndef USE_CUDA
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double cores = (double)ncpu / att_threads();
    fprintf(f, "cores=%.4g\n", cores);
#endif
    if (fclose(f) != 0) { fail("--calibrate %s: cannot write it", path); }
}

// The line that says what was measured (rank 0).
static void calibrate_print(const char *path, const Calibration *k, const Layout *lay, const ModelConfig *c, int world) {
    double C = c->channels, BT = (double)lay->B * lay->T, X = sizeof(floatX);
    double flops = 3 * 2.0 * BT * C * 4.0 * C / k->t_gemm, attn = BT * 6.0 * C * lay->T / 2 / k->t_att;
    double mem = 3.0 * 4 * BT * C * X / k->t_mem;
    int t = k->top;
    char comm[256] = "no collectives (one rank)", ov[64] = "";
    if (t) {
        snprintf(comm, sizeof(comm), "groups of %d: all-reduce %.3g, all-to-all %.3g, exchange %.3g GB/s per rank "
                 "(%.1f, %.1f, %.1f us a call)", 1 << t, k->bw[COMM_RING][t] / 1e9, k->bw[COMM_A2A][t] / 1e9,
                 k->bw[COMM_P2P][t] / 1e9, k->lat[COMM_RING][t] * 1e6, k->lat[COMM_A2A][t] * 1e6,
                 k->lat[COMM_P2P][t] * 1e6);
    }
    if (k->overlap >= 0) { snprintf(ov, sizeof(ov), ", overlap %.2f", k->overlap); }
    printf("calibrated (%d ranks at once): GEMM %.3g TFLOP/s, attention %.3g TFLOP/s, memory %.3g GB/s, "
           "%.1f us per layer, %s%s -> %s\n", world, flops / 1e12, attn / 1e12, mem / 1e9, k->t_tiny * 1e6, comm, ov, path);
    fflush(stdout);
}

// qkv: x as (B, T, (NH + 2KV) hs) -> out: y (B, T, NH hs); back: dout y -> dqkv dx. t_att: cuBLAS's attention;
// t_flash: the flash kernels', where they apply (CUDA, bf16, head size 64 or 128: flash_slower = t_flash / t_att)
static void calibrate_attention(Grid *g, Calibration *k, floatX *x, floatX *y, floatX *dx, float *lse, int B, int T,
                                int NH, int KV, int hs) {
    int path_of_run = attention_path;
#ifdef USE_CUDA
    attention_path = ATT_CUBLAS;
#endif
    attention_setup(B, T, NH, KV, hs);
    CALIBRATE_TIME(g, &k->t_att)
        attention_forward(y, lse, x, B, T, NH, KV, hs);
        attention_backward(dx, y, x, y, lse, B, T, NH, KV, hs);
    CALIBRATE_END;
#ifdef USE_CUDA
    if (attention_flash_applies(hs, sizeof(floatX))) {
        attention_path = ATT_FLASH;
        attention_setup(B, T, NH, KV, hs);
        CALIBRATE_TIME(g, &k->t_flash)
            attention_forward(y, lse, x, B, T, NH, KV, hs);
            attention_backward(dx, y, x, y, lse, B, T, NH, KV, hs);
        CALIBRATE_END;
    }
#endif
    attention_path = path_of_run;
}

// --calibrate FILE: the kernels at the model's shapes (a layer's MLP GEMMs, its attention, a bandwidth-bound
// kernel, a layer's launches), the optimizer, the collectives and their overlap, every rank at once.
static void calibrate(const Layout *lay, const ModelConfig *c, Grid *g, const char *path) {
    int B = lay->B, T = lay->T, C = c->channels, NH = c->num_heads, KV = c->kv_heads, BT = B * T, world = g->world_size;
    size_t big = (size_t)BT * 4 * C, comm_n = (size_t)16 << 20;
    floatX *x = (floatX *)mem_alloc(big * sizeof(floatX), MEM_WORKSPACE);
    floatX *y = (floatX *)mem_alloc(big * sizeof(floatX), MEM_WORKSPACE);
    floatX *dx = (floatX *)mem_alloc(big * sizeof(floatX), MEM_WORKSPACE);
    floatX *w = (floatX *)mem_alloc((size_t)4 * C * C * sizeof(floatX), MEM_WORKSPACE);
    floatX *dw = (floatX *)mem_alloc((size_t)4 * C * C * sizeof(floatX), MEM_WORKSPACE);
    floatX *bias = (floatX *)mem_alloc((size_t)4 * C * sizeof(floatX), MEM_WORKSPACE);
    floatX *comm_buf = world > 1 ? (floatX *)mem_alloc(comm_n * sizeof(floatX), MEM_COMM) : NULL;
    float *lse = (float *)mem_alloc((size_t)B * NH * T * sizeof(float), MEM_WORKSPACE);
    float *h = (float *)malloc_check(big * sizeof(float));
    Rng rng;
    rng_init(&rng, 1337 + g->rank);
    for (size_t i = 0; i < big; i++) { h[i] = 0.02f * (2.0f * rng_f32(&rng) - 1.0f); }
    upload_floats(x, h, big); upload_floats(y, h, big); upload_floats(dx, h, big);
    upload_floats(w, h, (size_t)4 * C * C); upload_floats(dw, h, (size_t)4 * C * C); upload_floats(bias, h, 4 * (size_t)C);
    free(h);
#ifdef USE_CUDA
    matmul_setup();
#endif
    Calibration k;
    memset(&k, 0, sizeof(k));
    // x (BT, C) -> y (BT, 4C); back: dx (BT, C), dw (4C, C); then at R rows of them
    CALIBRATE_TIME(g, &k.t_gemm)
        matmul_forward(y, x, w, NULL, BT, C, 4 * C);
        matmul_backward(dx, dw, NULL, y, x, w, BT, C, 4 * C);
    CALIBRATE_END;
    for (int i = 5; i < MACHINE_ROWS && (1 << i) <= BT; i++) {
        int R = 1 << i;
        CALIBRATE_TIME(g, &k.t_rows[i])
            matmul_forward(y, x, w, NULL, R, C, 4 * C);
            matmul_backward(dx, dw, NULL, y, x, w, R, C, 4 * C);
        CALIBRATE_END;
    }
    calibrate_attention(g, &k, x, y, dx, lse, B, T, NH, KV, C / NH);
    CALIBRATE_TIME(g, &k.t_mem)
        residual_bias_forward(dx, x, y, bias, 4 * BT, C);
    CALIBRATE_END;
    k.n_opt = (size_t)4 << 20;
    k.t_opt = calibrate_optimizer(g, k.n_opt);
    CALIBRATE_TIME(g, &k.t_tiny)
        for (int i = 0; i < 20; i++) { matmul_forward(y, x, w, NULL, 1, C, C); }
    CALIBRATE_END;
    if (world > 1) { calibrate_collectives(g, comm_buf, comm_n, k.bw, k.lat); }
    for (int i = 1; i < CALIBRATE_SIZES; i++) { if (k.bw[COMM_RING][i] > 0) { k.top = i; } }   // the largest group
    k.overlap = world > 1 ? calibrate_overlap(g, comm_buf, comm_n, k.bw[COMM_RING][k.top], k.t_gemm, x, y, dx, w, dw, BT, C)
                          : -1;
    if (g->rank == 0) {
        calibrate_write(path, &k, lay, c, world);
        calibrate_print(path, &k, lay, c, world);
    }
}

#endif // LLMC_CALIBRATE_H
