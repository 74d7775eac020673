// The MoE kernels (llmc/moe.h) against their CPU loops: router, top-k, capacity, per-sequence
// statistics, dispatch rows, permute, combine and their backwards, the router's weight and input
// gradients, the load count and the routing bias update (loss-free balancing); softmax and sigmoid scores;
// determinism; timing. Shape: 16 sequences of 1024 tokens, C 768, E 8, top-2, F 1.25. And the dropless experts'
// grouped GEMMs (matmul.h's matmul_forward_grouped / matmul_backward_grouped: one cublasGemmGroupedBatchedEx per
// product) against the CPU loop and against the CUDA per-expert loop, zero-row experts and a misaligned fallback
// among them, and their times beside the loop's.
// The integer decisions (choices, keep masks, rows) must be identical: each kernel gets the CPU's
// inputs (the probabilities included), so there is no near-tie to flip.
#include "../../llmc/moe.h"
#include "../../llmc/moe_dispatch.h"
#include "common.h"

static int compare_ints(const char *what, const int *d, const int *ref, size_t n) {
    int *h = (int *)malloc_check((n > 0 ? n : 1) * sizeof(int));
    copy_to_host(h, d, n * sizeof(int));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) { if (h[i] != ref[i]) { if (bad++ == 0) { first = i; } } }
    printf("  %-28s n=%-10zu %s", what, n, bad == 0 ? "identical: ok\n" : "");
    if (bad) { printf("%zu differ, first at %zu (gpu %d cpu %d): FAIL\n", bad, first, h[first], ref[first]); }
    free(h);
    return bad ? 1 : 0;
}

// a device buffer bitwise equal to the CPU loop's result (integer-decided updates: the same fp32 operations)
static int compare_bitwise_host(const char *what, const void *d, const void *ref, size_t bytes) {
    unsigned char *h = (unsigned char *)malloc_check(bytes);
    copy_to_host(h, d, bytes);
    int same = memcmp(h, ref, bytes) == 0;
    printf("  %-28s %s\n", what, same ? "bitwise equal to the CPU's: ok" : "differs from the CPU's: FAIL");
    free(h);
    return same ? 0 : 1;
}

// one case: its shape, the CPU loops' buffers and the kernels' (d_); each check below fills in its part
typedef struct {
    int B, T, C, E, k, cap1000, cap, N, R;   // R: the kept assignments (rows), from check_rows
    DropPolicy policy;
    int sigmoid;                              // the router's scores
    float *bias, *d_bias;                     // (E) the routing bias (zero, or random with `biased`)
    size_t NC, NE, Nk;
    float *x, *wr, *probs, *lse, *gate, *cprob, *f, *pmean, *zsum;
    float *xs, *ys, *out, *dout, *dys, *dgate, *dx, *dlogits, *dwr;
    int *choice, *keep, *row;
    floatX *d_x, *d_wr, *d_xs, *d_ys, *d_out, *d_dout, *d_dys, *d_dx, *d_dx2, *d_dwr, *d_dwr2;
    float *d_probs, *d_lse, *d_gate, *d_cprob, *d_f, *d_pmean, *d_zsum, *d_dgate, *d_dlogits;
    int *d_choice, *d_keep, *d_row, *d_counts, *d_offsets;
} MoECase;

// the shape, the header line, the input x and the router weights wr on both sides
static void moe_case_setup(MoECase *m, int B, int T, int C, int E, int k, int cap1000, DropPolicy policy, int sigmoid,
                           int biased) {
    memset(m, 0, sizeof(*m));
    m->B = B; m->T = T; m->C = C; m->E = E; m->k = k; m->cap1000 = cap1000; m->policy = policy; m->sigmoid = sigmoid;
    int N = B * T, cap = moe_capacity(k, T, E, cap1000);
    m->N = N; m->cap = cap;
    printf("-- B=%d T=%d C=%d E=%d k=%d cap=%d (F %.3f, %s), %s scores%s\n", B, T, C, E, k, cap, cap1000 / 1000.0,
           policy == DROP_PROBS ? "probs" : "position", sigmoid ? "sigmoid" : "softmax", biased ? ", routing bias" : "");
    m->bias = biased ? make_random(E, -0.05f, 0.05f) : (float *)calloc_check(E, sizeof(float));
    m->d_bias = to_device_f32(m->bias, E);
    m->NC = (size_t)N * C; m->NE = (size_t)N * E; m->Nk = (size_t)N * k;
    m->x = make_random(m->NC, -1.0f, 1.0f);
    m->wr = make_random((size_t)E * C, -0.1f, 0.1f);
    m->d_x = to_device(m->x, m->NC);
    m->d_wr = to_device(m->wr, (size_t)E * C);
}

// router forward
static int check_router_forward(MoECase *m) {
    const int N = m->N, C = m->C, E = m->E;
    const size_t NE = m->NE;
    int fails = 0;
    m->probs = (float *)malloc_check(NE * sizeof(float));
    m->lse = (float *)malloc_check(N * sizeof(float));
    cudaCheck(cudaMalloc(&m->d_probs, NE * sizeof(float))); cudaCheck(cudaMalloc(&m->d_lse, N * sizeof(float)));
    moe_router_forward_cpu(m->probs, m->lse, m->x, m->wr, N, C, E, m->sigmoid);
    moe_router_forward(m->d_probs, m->d_lse, m->d_x, m->d_wr, N, C, E, m->sigmoid);
    fails += compare_device_f32("router probs", m->d_probs, m->probs, NE, TOL_FP32);
    fails += compare_device_f32("router lse", m->d_lse, m->lse, N, TOL_FP32);
    return fails;
}

// top-k, capacity, statistics, rows: from the CPU's probabilities
// (here: top-k, with the buffers of the keep mask, the rows and the counts and offsets made beside its own)
static int check_topk(MoECase *m) {
    const int N = m->N, E = m->E, k = m->k;
    const size_t NE = m->NE, Nk = m->Nk;
    int fails = 0;
    copy_to_device(m->d_probs, m->probs, NE * sizeof(float));
    copy_to_device(m->d_lse, m->lse, N * sizeof(float));
    m->choice = (int *)malloc_check(Nk * sizeof(int));
    m->keep = (int *)malloc_check(Nk * sizeof(int));
    m->row = (int *)malloc_check(Nk * sizeof(int));
    m->gate = (float *)malloc_check(Nk * sizeof(float));
    m->cprob = (float *)malloc_check(Nk * sizeof(float));
    cudaCheck(cudaMalloc(&m->d_cprob, Nk * sizeof(float)));
    cudaCheck(cudaMalloc(&m->d_choice, Nk * sizeof(int))); cudaCheck(cudaMalloc(&m->d_keep, Nk * sizeof(int)));
    cudaCheck(cudaMalloc(&m->d_row, Nk * sizeof(int))); cudaCheck(cudaMalloc(&m->d_gate, Nk * sizeof(float)));
    cudaCheck(cudaMalloc(&m->d_counts, E * sizeof(int))); cudaCheck(cudaMalloc(&m->d_offsets, E * sizeof(int)));
    moe_topk_cpu(m->choice, m->cprob, m->gate, m->probs, m->bias, N, E, k, 1);
    moe_topk(m->d_choice, m->d_cprob, m->d_gate, m->d_probs, m->d_bias, N, E, k, 1);
    fails += compare_ints("top-k choices", m->d_choice, m->choice, Nk);
    // the load (assignments per expert before drops, integers) and the bias update from it, twice (the
    // second time from the doubled load), and a skipped step (scale 0) that leaves the bias as it is
    int *load = (int *)calloc_check(E, sizeof(int)), *d_load;
    float *bias = (float *)malloc_check(E * sizeof(float)), *d_bias2, scale[2] = {1.0f, 0.0f}, *d_scale;
    cudaCheck(cudaMalloc(&d_load, E * sizeof(int)));
    cudaCheck(cudaMemsetAsync(d_load, 0, E * sizeof(int), main_stream));
    memcpy(bias, m->bias, E * sizeof(float));
    d_bias2 = to_device_f32(bias, E);
    d_scale = to_device_f32(scale, 2);
    for (int i = 0; i < 2; i++) {
        moe_load_count_cpu(load, m->choice, N, k);
        moe_load_count(d_load, m->d_choice, N, k);
        moe_bias_update_cpu(bias, load, 1, E, 0.001f, &scale[0]);
        moe_bias_update(d_bias2, d_load, 1, E, 0.001f, d_scale);
    }
    moe_bias_update_cpu(bias, load, 1, E, 0.001f, &scale[1]);
    moe_bias_update(d_bias2, d_load, 1, E, 0.001f, d_scale + 1);
    fails += compare_ints("load per expert", d_load, load, E);
    fails += compare_bitwise_host("routing bias update", d_bias2, bias, E * sizeof(float));
    cudaCheck(cudaFree(d_load)); cudaCheck(cudaFree(d_bias2)); cudaCheck(cudaFree(d_scale));
    free(load); free(bias);
    fails += compare_device_f32("top-k probabilities", m->d_cprob, m->cprob, Nk, TOL_FP32);
    fails += compare_device_f32("gates", m->d_gate, m->gate, Nk, TOL_FP32);
    copy_to_device(m->d_gate, m->gate, Nk * sizeof(float));
    copy_to_device(m->d_cprob, m->cprob, Nk * sizeof(float));
    return fails;
}

// the capacity keep mask: per context-parallel part (B even), then over the whole sequences
static int check_capacity_keep(MoECase *m) {
    const int B = m->B, T = m->T, E = m->E, k = m->k, cap = m->cap;
    const DropPolicy policy = m->policy;
    int fails = 0;
    // context parallelism: the same assignments read as 2 parts (cp ranks) of B/2 sequences of 2T tokens,
    // part s at positions seq_pos_of_rank(2, s, T); each part's keep mask against the whole sequences
    if (B % 2 == 0) {
        int cap2 = moe_capacity(k, 2 * T, E, m->cap1000);
        for (int me = 0; me < 2; me++) {
            moe_capacity_keep_cpu(m->keep, m->choice, m->cprob, 2, me, B / 2, T, k, cap2, policy);
            moe_capacity_keep(m->d_keep, m->d_choice, m->d_cprob, 2, me, B / 2, T, k, E, cap2, policy);
            char what[64];
            snprintf(what, sizeof(what), "capacity keep, cp part %d/2", me);
            fails += compare_ints(what, m->d_keep, m->keep, m->Nk / 2);
        }
    }
    moe_capacity_keep_cpu(m->keep, m->choice, m->cprob, 1, 0, B, T, k, cap, policy);
    moe_capacity_keep(m->d_keep, m->d_choice, m->d_cprob, 1, 0, B, T, k, E, cap, policy);
    fails += compare_ints("capacity keep mask", m->d_keep, m->keep, m->Nk);
    return fails;
}

// the per-sequence statistics: assignments f, mean probabilities P, sum of lse^2
static int check_sequence_stats(MoECase *m) {
    const int B = m->B, T = m->T, E = m->E, k = m->k;
    int fails = 0;
    m->f = (float *)malloc_check((size_t)B * E * sizeof(float));
    m->pmean = (float *)malloc_check((size_t)B * E * sizeof(float));
    m->zsum = (float *)malloc_check(B * sizeof(float));
    cudaCheck(cudaMalloc(&m->d_f, (size_t)B * E * sizeof(float)));
    cudaCheck(cudaMalloc(&m->d_pmean, (size_t)B * E * sizeof(float)));
    cudaCheck(cudaMalloc(&m->d_zsum, B * sizeof(float)));
    moe_sequence_stats_cpu(m->f, m->pmean, m->zsum, m->choice, m->probs, m->lse, B, T, E, k, T, m->sigmoid);
    moe_sequence_stats(m->d_f, m->d_pmean, m->d_zsum, m->d_choice, m->d_probs, m->d_lse, B, T, E, k, T, m->sigmoid);
    fails += compare_device_f32("aux f (assignments)", m->d_f, m->f, (size_t)B * E, TOL_FP32);
    fails += compare_device_f32("aux P (mean probs)", m->d_pmean, m->pmean, (size_t)B * E, TOL_FP32);
    fails += compare_device_f32("z (sum lse^2)", m->d_zsum, m->zsum, B, TOL_FP32);
    return fails;
}

// the step's aux and z sums (two layers' worth, on the CPU's statistics): one GPU thread, the CPU loop: bitwise
static int check_loss_sums(MoECase *m) {
    const int B = m->B, E = m->E;
    double sums[2] = {0.0, 0.0}, got[2], *d_sums;
    cudaCheck(cudaMalloc(&d_sums, sizeof(sums)));
    cudaCheck(cudaMemsetAsync(d_sums, 0, sizeof(sums), main_stream));
    copy_to_device(m->d_f, m->f, (size_t)B * E * sizeof(float));
    copy_to_device(m->d_pmean, m->pmean, (size_t)B * E * sizeof(float));
    copy_to_device(m->d_zsum, m->zsum, B * sizeof(float));
    for (int layer = 0; layer < 2; layer++) {
        moe_loss_sums_body(sums, m->f, m->pmean, m->zsum, B, E);
        moe_loss_sums(d_sums, m->d_f, m->d_pmean, m->d_zsum, B, E);
    }
    copy_to_host(got, d_sums, sizeof(got));
    int same = !memcmp(got, sums, sizeof(sums));
    printf("  %-28s aux %.9g z %.9g (CPU %.9g %.9g): %s\n", "aux, z sums (2 layers)", got[0], got[1], sums[0], sums[1],
           same ? "ok" : "FAIL");
    cudaCheck(cudaFree(d_sums));
    return !same;
}

// the kept rows per expert, their offsets (R in all), and each assignment's row in the send layout
static int check_rows(MoECase *m) {
    const int N = m->N, E = m->E, k = m->k;
    int fails = 0;
    int counts[MOE_MAX_EXPERTS], offsets[MOE_MAX_EXPERTS], R = 0;
    moe_count_cpu(counts, m->choice, m->keep, N, E, k);
    moe_count(m->d_counts, m->d_choice, m->d_keep, N, E, k);
    fails += compare_ints("kept rows per expert", m->d_counts, counts, E);
    for (int e = 0; e < E; e++) { offsets[e] = R; R += counts[e]; }
    printf("  kept %d of %zu assignments (%.1f%% dropped)\n", R, m->Nk, 100.0 * (1.0 - (double)R / m->Nk));
    m->R = R;
    copy_to_device(m->d_offsets, offsets, E * sizeof(int));
    moe_rows_cpu(m->row, m->choice, m->keep, offsets, N, E, k, N * k);
    moe_rows(m->d_row, m->d_choice, m->d_keep, m->d_offsets, N, E, k, N * k);
    fails += compare_ints("rows in the send layout", m->d_row, m->row, m->Nk);
    return fails;
}

// permute, combine (expert outputs ys: random), and the backwards
static int check_permute_combine(MoECase *m) {
    const int N = m->N, C = m->C, k = m->k, R = m->R;
    const size_t NC = m->NC, Nk = m->Nk;
    int fails = 0;
    m->xs = (float *)calloc((size_t)R * C + 1, sizeof(float));
    m->ys = make_random((size_t)R * C, -1.0f, 1.0f);
    m->d_ys = to_device(m->ys, (size_t)R * C);
    cudaCheck(cudaMalloc(&m->d_xs, ((size_t)R * C + 1) * sizeof(floatX)));
    moe_permute_cpu(m->xs, m->x, m->row, N, k, C);
    moe_permute(m->d_xs, m->d_x, m->d_row, N, k, C);
    fails += compare_device("permute (row copies)", m->d_xs, m->xs, (size_t)R * C, (Tol){0.0f, 0.0f});
    m->out = (float *)malloc_check(NC * sizeof(float));
    m->dout = make_random(NC, -1.0f, 1.0f);
    cudaCheck(cudaMalloc(&m->d_out, NC * sizeof(floatX)));
    moe_combine_cpu(m->out, m->ys, m->gate, m->row, N, k, C);
    moe_combine(m->d_out, m->d_ys, m->d_gate, m->d_row, N, k, C);
    fails += compare_device("combine", m->d_out, m->out, NC, TOL_X);
    m->d_dout = to_device(m->dout, NC);
    m->dys = (float *)calloc((size_t)R * C + 1, sizeof(float));
    m->dgate = (float *)malloc_check(Nk * sizeof(float));
    cudaCheck(cudaMalloc(&m->d_dys, ((size_t)R * C + 1) * sizeof(floatX)));
    cudaCheck(cudaMalloc(&m->d_dgate, Nk * sizeof(float)));
    moe_combine_backward_cpu(m->dys, m->dgate, m->dout, m->ys, m->gate, m->row, N, k, C);
    moe_combine_backward(m->d_dys, m->d_dgate, m->d_dout, m->d_ys, m->d_gate, m->d_row, N, k, C);
    fails += compare_device("combine backward rows", m->d_dys, m->dys, (size_t)R * C, TOL_X);
    fails += compare_device_f32("combine backward gates", m->d_dgate, m->dgate, Nk, TOL_FP32);
    m->dx = (float *)malloc_check(NC * sizeof(float));
    cudaCheck(cudaMalloc(&m->d_dx, NC * sizeof(floatX))); cudaCheck(cudaMalloc(&m->d_dx2, NC * sizeof(floatX)));
    moe_unpermute_cpu(m->dx, m->ys, m->row, N, k, C);
    moe_unpermute(m->d_dx, m->d_ys, m->d_row, N, k, C);
    fails += compare_device("unpermute", m->d_dx, m->dx, NC, TOL_X);
    return fails;
}

// the router's backward: logits, weight, input
static int check_router_backward(MoECase *m) {
    const int B = m->B, T = m->T, C = m->C, E = m->E, k = m->k, N = m->N;
    const size_t NC = m->NC, NE = m->NE;
    int fails = 0;
    m->dlogits = (float *)malloc_check(NE * sizeof(float));
    cudaCheck(cudaMalloc(&m->d_dlogits, NE * sizeof(float)));
    copy_to_device(m->d_dgate, m->dgate, m->Nk * sizeof(float));
    float aux_scale = 0.01f * E / (T * (float)B), z_scale = m->sigmoid ? 0.0f : 0.001f / N;
    moe_router_backward_cpu(m->dlogits, m->dgate, m->gate, m->choice, m->probs, m->lse, m->f, T, N, E, k, aux_scale,
                            z_scale, m->sigmoid, 1);
    moe_router_backward(m->d_dlogits, m->d_dgate, m->d_gate, m->d_choice, m->d_probs, m->d_lse, m->d_f, T, N, E, k,
                        aux_scale, z_scale, m->sigmoid, 1);
    fails += compare_device_f32("router backward dlogits", m->d_dlogits, m->dlogits, NE, TOL_FP32);
    copy_to_device(m->d_dlogits, m->dlogits, NE * sizeof(float));
    m->dwr = make_random((size_t)E * C, -0.1f, 0.1f);
    m->d_dwr = to_device(m->dwr, (size_t)E * C);
    m->d_dwr2 = to_device(m->dwr, (size_t)E * C);
    moe_router_dweight_cpu(m->dwr, m->dlogits, m->x, N, C, E);
    moe_router_dweight(m->d_dwr, m->d_dlogits, m->d_x, N, C, E);
    moe_router_dweight(m->d_dwr2, m->d_dlogits, m->d_x, N, C, E);
    fails += compare_device("router dweight (+=)", m->d_dwr, m->dwr, (size_t)E * C, TOL_X);
    fails += compare_bitwise("router dweight rerun", m->d_dwr, m->d_dwr2, (size_t)E * C * sizeof(floatX));
    copy_on_device(m->d_dx2, m->d_dx, NC * sizeof(floatX));
    moe_router_dinput_cpu(m->dx, m->dlogits, m->wr, N, C, E);
    moe_router_dinput(m->d_dx, m->d_dlogits, m->d_wr, N, C, E);
    fails += compare_device("router dinput (+=)", m->d_dx, m->dx, NC, TOL_X);
    return fails;
}

// the kernels' times (on the buffers the checks left)
static void time_kernels(const MoECase *m) {
    const int B = m->B, T = m->T, C = m->C, E = m->E, k = m->k, N = m->N, R = m->R, cap = m->cap;
    const DropPolicy policy = m->policy;
    const size_t NC = m->NC, NE = m->NE;
    report_time("router forward", time_ms(10, [&] {
                    moe_router_forward(m->d_probs, m->d_lse, m->d_x, m->d_wr, N, C, E, m->sigmoid); }),
                (double)NC * sizeof(floatX), 2.0 * NC * E);
    report_time("top-k", time_ms(10, [&] { moe_topk(m->d_choice, m->d_cprob, m->d_gate, m->d_probs, m->d_bias, N, E, k, 1); }),
                (double)NE * 4, 0);
    report_time("capacity keep", time_ms(10, [&] {
                    moe_capacity_keep(m->d_keep, m->d_choice, m->d_cprob, 1, 0, B, T, k, E, cap, policy); }), 0, 0);
    report_time("rows", time_ms(10, [&] { moe_rows(m->d_row, m->d_choice, m->d_keep, m->d_offsets, N, E, k, N * k); }), 0, 0);
    report_time("permute", time_ms(10, [&] { moe_permute(m->d_xs, m->d_x, m->d_row, N, k, C); }),
                2.0 * R * C * sizeof(floatX), 0);
    report_time("combine", time_ms(10, [&] { moe_combine(m->d_out, m->d_ys, m->d_gate, m->d_row, N, k, C); }),
                (double)(R + N) * C * sizeof(floatX), 0);
    report_time("combine backward", time_ms(10, [&] {
                    moe_combine_backward(m->d_dys, m->d_dgate, m->d_dout, m->d_ys, m->d_gate, m->d_row, N, k, C); }),
                (double)(2 * R + N) * C * sizeof(floatX), 0);
    report_time("router dweight", time_ms(10, [&] { moe_router_dweight(m->d_dwr, m->d_dlogits, m->d_x, N, C, E); }),
                (double)NC * sizeof(floatX), 2.0 * NC * E);
    report_time("router dinput", time_ms(10, [&] { moe_router_dinput(m->d_dx, m->d_dlogits, m->d_wr, N, C, E); }),
                2.0 * NC * sizeof(floatX), 2.0 * NC * E);
}

// every buffer of the case, device and host
static void moe_case_free(MoECase *m) {
    void *dev[] = {m->d_x, m->d_wr, m->d_probs, m->d_lse, m->d_choice, m->d_keep, m->d_row, m->d_gate, m->d_cprob,
                   m->d_counts, m->d_offsets, m->d_f, m->d_pmean, m->d_zsum, m->d_xs, m->d_ys, m->d_out, m->d_dout,
                   m->d_dys, m->d_dgate, m->d_dx, m->d_dx2, m->d_dlogits, m->d_dwr, m->d_dwr2, m->d_bias};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) { cudaCheck(cudaFree(dev[i])); }
    void *host[] = {m->x, m->wr, m->probs, m->lse, m->choice, m->keep, m->row, m->gate, m->cprob, m->f, m->pmean,
                    m->zsum, m->xs, m->ys, m->out, m->dout, m->dys, m->dgate, m->dx, m->dlogits, m->dwr, m->bias};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++) { free(host[i]); }
}

// ---- the grouped GEMMs of the dropless experts: count layers (experts) of rows[i] rows each (zeros among them):
// forward (written), dinp (written) and dweight (accumulated into random values), by the grouped launcher (cuBLAS's
// grouped GEMM where this cuBLAS has it) and by the per-expert CUDA loop (matmul_grouped_enabled 0), each against the
// CPU loop; the grouped run twice: bitwise the same
static void grouped_run(int grouped, floatX *out, floatX *dinp, floatX *dw, const floatX *inp, const floatX *w,
                        const floatX *dout, const int *rows, int IC, int OC, int count) {
#ifdef MATMUL_GROUPED
    matmul_grouped_enabled = grouped;
#else
    (void)grouped;   // (no grouped GEMM in this cuBLAS: both runs are the loop)
#endif
    matmul_forward_grouped(out, inp, w, rows, IC, OC, count);
    matmul_backward_grouped(dinp, dw, dout, inp, w, rows, IC, OC, count);
#ifdef MATMUL_GROUPED
    matmul_grouped_enabled = 1;
#endif
}

// the CPU loop (the specification): out, dinp written, dw += for each layer with rows
static void grouped_cpu(float *out, float *dinp, float *dw, const float *inp, const float *w, const float *dout,
                        const int *rows, int IC, int OC, int count) {
    size_t off = 0;
    for (int i = 0; i < count; off += (size_t)rows[i], i++) {
        if (rows[i] == 0) { continue; }
        const float *wi = w + (size_t)i * OC * IC;
        matmul_forward_cpu(out + off * OC, inp + off * IC, wi, NULL, rows[i], IC, OC);
        matmul_backward_cpu(dinp + off * IC, dw + (size_t)i * OC * IC, NULL, dout + off * OC, inp + off * IC, wi,
                            rows[i], IC, OC);
    }
}

static int check_grouped(const char *name, const int *rows, int count, int IC, int OC, int timed) {
    size_t R = 0;
    for (int i = 0; i < count; i++) { R += (size_t)rows[i]; }
    printf("-- grouped experts (%s): %d experts, R=%zu rows, IC=%d OC=%d\n", name, count, R, IC, OC);
    size_t nin = R * IC, nw = (size_t)count * OC * IC, nout = R * OC;
    float *inp = make_random(nin, -1.0f, 1.0f), *w = make_random(nw, -0.1f, 0.1f), *dout = make_random(nout, -1.0f, 1.0f);
    float *dw = make_random(nw, -1.0f, 1.0f), *out = (float *)calloc_check(nout, sizeof(float));
    float *dinp = (float *)calloc_check(nin, sizeof(float));
    floatX *d_inp = to_device(inp, nin), *d_w = to_device(w, nw), *d_dout = to_device(dout, nout);
    floatX *d_out[3], *d_dinp[3], *d_dw[3];   // the loop, grouped, grouped again
    for (int g = 0; g < 3; g++) {
        d_out[g] = to_device(out, nout); d_dinp[g] = to_device(dinp, nin); d_dw[g] = to_device(dw, nw);
        grouped_run(g > 0, d_out[g], d_dinp[g], d_dw[g], d_inp, d_w, d_dout, rows, IC, OC, count);
    }
    grouped_cpu(out, dinp, dw, inp, w, dout, rows, IC, OC, count);
    int fails = 0;
    const char *what[2] = {"loop", "grouped"};
    for (int g = 0; g < 2; g++) {
        char label[64];
        snprintf(label, sizeof(label), "%s forward", what[g]);
        fails += compare_device(label, d_out[g], out, nout, TOL_X);
        snprintf(label, sizeof(label), "%s dinp", what[g]);
        fails += compare_device(label, d_dinp[g], dinp, nin, TOL_X);
        snprintf(label, sizeof(label), "%s dweight (+=)", what[g]);
        fails += compare_device(label, d_dw[g], dw, nw, TOL_X);
    }
    fails += compare_bitwise("grouped forward twice", d_out[1], d_out[2], nout * sizeof(floatX));
    fails += compare_bitwise("grouped dinp twice", d_dinp[1], d_dinp[2], nin * sizeof(floatX));
    if (timed) {
        double flops = 2.0 * R * IC * OC;
        for (int g = 0; g < 2; g++) {
            char label[64];
            snprintf(label, sizeof(label), "%s forward + backward", what[g]);
            report_time(label, time_ms(10, [&] { grouped_run(g, d_out[1], d_dinp[1], d_dw[1], d_inp, d_w, d_dout, rows,
                                                             IC, OC, count); }), 0, 3 * flops);
        }
    }
    for (int g = 0; g < 3; g++) { cudaCheck(cudaFree(d_out[g])); cudaCheck(cudaFree(d_dinp[g])); cudaCheck(cudaFree(d_dw[g])); }
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_dout));
    free(inp); free(w); free(dout); free(dw); free(out); free(dinp);
    return fails;
}

// the grouped GEMMs' cases: OLMoE-1B-7B's experts under ep 8 (8 local experts of H 1024, SwiGLU: fc C 2048 -> 2H,
// fcproj H -> C; B8 T1024 top-8 of 64: ~8192 rows over 8 experts, uneven, one empty), a small shape with several
// empty experts, and rows of 36 elements (bf16: 72 bytes, not a 16-byte multiple: the loop's fallback; fp32: grouped)
static int check_grouped_cases(void) {
    int fails = 0;
    int olmoe[8] = {1500, 0, 977, 1203, 640, 1811, 1024, 1037};
    fails += check_grouped("OLMoE fc, ep 8", olmoe, 8, 2048, 2048, 1);
    fails += check_grouped("OLMoE fcproj, ep 8", olmoe, 8, 1024, 2048, 1);
    int small[6] = {0, 5, 0, 17, 1, 0};
    fails += check_grouped("small, empty experts", small, 6, 64, 128, 0);
    int odd[3] = {3, 7, 2};
    fails += check_grouped("rows of 36 elements", odd, 3, 36, 20, 0);
    return fails;
}

// one case: every check in order (each on the CPU's results of the one before), then the times if asked
static int run_case(int B, int T, int C, int E, int k, int cap1000, DropPolicy policy, int timed, int sigmoid,
                    int biased) {
    MoECase m;
    int fails = 0;
    moe_case_setup(&m, B, T, C, E, k, cap1000, policy, sigmoid, biased);
    fails += check_router_forward(&m);
    fails += check_topk(&m);
    fails += check_capacity_keep(&m);
    fails += check_sequence_stats(&m);
    fails += check_loss_sums(&m);
    fails += check_rows(&m);
    fails += check_permute_combine(&m);
    fails += check_router_backward(&m);
    if (timed) { time_kernels(&m); }
    moe_case_free(&m);
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "moe");
    rng_seed(9);
    int fails = 0;
    fails += run_case(16, 1024, 768, 8, 2, 1250, DROP_PROBS, 1, 0, 0);   // GPT-2 124M width, 8 experts, top-2
    fails += run_case(4, 37, 64, 4, 1, 1000, DROP_POSITION, 0, 0, 1);    // odd T, Switch top-1, a routing bias
    fails += run_case(2, 64, 96, 8, 8, 0, DROP_PROBS, 0, 0, 0);          // k = E, dropless
    fails += run_case(3, 50, 128, 6, 3, 500, DROP_PROBS, 0, 0, 0);       // heavy drops
    fails += run_case(4, 256, 128, 64, 8, 1000, DROP_PROBS, 0, 1, 1);    // fine-grained: E 64 top-8, sigmoid, bias
    fails += check_grouped_cases();
    return harness_finish(fails);
}
