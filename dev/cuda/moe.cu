// The MoE kernels (llmc/moe.h) against their CPU loops: router, top-k, capacity, per-sequence
// statistics, dispatch rows, permute, combine and their backwards, the router's weight and input
// gradients; determinism; timing. Shape: 16 sequences of 1024 tokens, C 768, E 8, top-2, F 1.25.
// The integer decisions (choices, keep masks, rows) must be identical: each kernel gets the CPU's
// inputs (the probabilities included), so there is no near-tie to flip.
#include "../../llmc/moe.h"
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

static int run_case(int B, int T, int C, int E, int k, int cap1000, DropPolicy policy, int timed) {
    int fails = 0, N = B * T, cap = moe_capacity(k, T, E, cap1000);
    printf("-- B=%d T=%d C=%d E=%d k=%d cap=%d (F %.3f, %s)\n", B, T, C, E, k, cap, cap1000 / 1000.0, policy == DROP_PROBS ? "probs" : "position");
    size_t NC = (size_t)N * C, NE = (size_t)N * E, Nk = (size_t)N * k;
    float *x = make_random(NC, -1.0f, 1.0f), *wr = make_random((size_t)E * C, -0.1f, 0.1f);
    floatX *d_x = to_device(x, NC), *d_wr = to_device(wr, (size_t)E * C);

    // router forward
    float *probs = (float *)malloc_check(NE * sizeof(float)), *lse = (float *)malloc_check(N * sizeof(float));
    float *d_probs, *d_lse;
    cudaCheck(cudaMalloc(&d_probs, NE * sizeof(float))); cudaCheck(cudaMalloc(&d_lse, N * sizeof(float)));
    moe_router_forward_cpu(probs, lse, x, wr, N, C, E);
    moe_router_forward(d_probs, d_lse, d_x, d_wr, N, C, E);
    fails += compare_device_f32("router probs", d_probs, probs, NE, TOL_FP32);
    fails += compare_device_f32("router lse", d_lse, lse, N, TOL_FP32);

    // top-k, capacity, statistics, rows: from the CPU's probabilities
    copy_to_device(d_probs, probs, NE * sizeof(float));
    copy_to_device(d_lse, lse, N * sizeof(float));
    int *choice = (int *)malloc_check(Nk * sizeof(int)), *keep = (int *)malloc_check(Nk * sizeof(int)), *row = (int *)malloc_check(Nk * sizeof(int));
    float *gate = (float *)malloc_check(Nk * sizeof(float)), *cprob = (float *)malloc_check(Nk * sizeof(float));
    int *d_choice, *d_keep, *d_row, *d_counts, *d_offsets;
    float *d_gate, *d_cprob;
    cudaCheck(cudaMalloc(&d_cprob, Nk * sizeof(float)));
    cudaCheck(cudaMalloc(&d_choice, Nk * sizeof(int))); cudaCheck(cudaMalloc(&d_keep, Nk * sizeof(int)));
    cudaCheck(cudaMalloc(&d_row, Nk * sizeof(int))); cudaCheck(cudaMalloc(&d_gate, Nk * sizeof(float)));
    cudaCheck(cudaMalloc(&d_counts, E * sizeof(int))); cudaCheck(cudaMalloc(&d_offsets, E * sizeof(int)));
    moe_topk_cpu(choice, cprob, gate, probs, N, E, k);
    moe_topk(d_choice, d_cprob, d_gate, d_probs, N, E, k);
    fails += compare_ints("top-k choices", d_choice, choice, Nk);
    fails += compare_device_f32("top-k probabilities", d_cprob, cprob, Nk, TOL_FP32);
    fails += compare_device_f32("gates", d_gate, gate, Nk, TOL_FP32);
    copy_to_device(d_gate, gate, Nk * sizeof(float));
    copy_to_device(d_cprob, cprob, Nk * sizeof(float));
    // context parallelism: the same assignments read as 2 parts (cp ranks) of B/2 sequences of 2T tokens,
    // part s at positions seq_pos_of_rank(2, s, T); each part's keep mask against the whole sequences
    if (B % 2 == 0) {
        int cap2 = moe_capacity(k, 2 * T, E, cap1000);
        for (int me = 0; me < 2; me++) {
            moe_capacity_keep_cpu(keep, choice, cprob, 2, me, B / 2, T, k, cap2, policy);
            moe_capacity_keep(d_keep, d_choice, d_cprob, 2, me, B / 2, T, k, cap2, policy);
            char what[64];
            snprintf(what, sizeof(what), "capacity keep, cp part %d/2", me);
            fails += compare_ints(what, d_keep, keep, Nk / 2);
        }
    }
    moe_capacity_keep_cpu(keep, choice, cprob, 1, 0, B, T, k, cap, policy);
    moe_capacity_keep(d_keep, d_choice, d_cprob, 1, 0, B, T, k, cap, policy);
    fails += compare_ints("capacity keep mask", d_keep, keep, Nk);
    float *f = (float *)malloc_check((size_t)B * E * sizeof(float)), *pmean = (float *)malloc_check((size_t)B * E * sizeof(float));
    float *zsum = (float *)malloc_check(B * sizeof(float)), *d_f, *d_pmean, *d_zsum;
    cudaCheck(cudaMalloc(&d_f, (size_t)B * E * sizeof(float))); cudaCheck(cudaMalloc(&d_pmean, (size_t)B * E * sizeof(float)));
    cudaCheck(cudaMalloc(&d_zsum, B * sizeof(float)));
    moe_sequence_stats_cpu(f, pmean, zsum, choice, probs, lse, B, T, E, k, T);
    moe_sequence_stats(d_f, d_pmean, d_zsum, d_choice, d_probs, d_lse, B, T, E, k, T);
    fails += compare_device_f32("aux f (assignments)", d_f, f, (size_t)B * E, TOL_FP32);
    fails += compare_device_f32("aux P (mean probs)", d_pmean, pmean, (size_t)B * E, TOL_FP32);
    fails += compare_device_f32("z (sum lse^2)", d_zsum, zsum, B, TOL_FP32);
    {   // the step's aux and z sums (two layers' worth, on the CPU's statistics): one GPU thread, the CPU loop: bitwise
        double sums[2] = {0.0, 0.0}, got[2], *d_sums;
        cudaCheck(cudaMalloc(&d_sums, sizeof(sums)));
        cudaCheck(cudaMemset(d_sums, 0, sizeof(sums)));
        copy_to_device(d_f, f, (size_t)B * E * sizeof(float)); copy_to_device(d_pmean, pmean, (size_t)B * E * sizeof(float));
        copy_to_device(d_zsum, zsum, B * sizeof(float));
        for (int layer = 0; layer < 2; layer++) {
            moe_loss_sums_body(sums, f, pmean, zsum, B, E);
            moe_loss_sums(d_sums, d_f, d_pmean, d_zsum, B, E);
        }
        copy_to_host(got, d_sums, sizeof(got));
        int same = !memcmp(got, sums, sizeof(sums));
        printf("  %-28s aux %.9g z %.9g (CPU %.9g %.9g): %s\n", "aux, z sums (2 layers)", got[0], got[1], sums[0], sums[1], same ? "ok" : "FAIL");
        fails += !same;
        cudaCheck(cudaFree(d_sums));
    }
    int counts[MOE_MAX_EXPERTS], offsets[MOE_MAX_EXPERTS], R = 0;
    moe_count_cpu(counts, choice, keep, N, E, k);
    moe_count(d_counts, d_choice, d_keep, N, E, k);
    fails += compare_ints("kept rows per expert", d_counts, counts, E);
    for (int e = 0; e < E; e++) { offsets[e] = R; R += counts[e]; }
    printf("  kept %d of %zu assignments (%.1f%% dropped)\n", R, Nk, 100.0 * (1.0 - (double)R / Nk));
    copy_to_device(d_offsets, offsets, E * sizeof(int));
    moe_rows_cpu(row, choice, keep, offsets, N, E, k);
    moe_rows(d_row, d_choice, d_keep, d_offsets, N, E, k);
    fails += compare_ints("rows in the send layout", d_row, row, Nk);

    // permute, combine (expert outputs ys: random), and the backwards
    float *xs = (float *)calloc((size_t)R * C + 1, sizeof(float)), *ys = make_random((size_t)R * C, -1.0f, 1.0f);
    floatX *d_xs, *d_ys = to_device(ys, (size_t)R * C), *d_out, *d_dys, *d_dx, *d_dx2;
    cudaCheck(cudaMalloc(&d_xs, ((size_t)R * C + 1) * sizeof(floatX)));
    moe_permute_cpu(xs, x, row, N, k, C);
    moe_permute(d_xs, d_x, d_row, N, k, C);
    fails += compare_device("permute (row copies)", d_xs, xs, (size_t)R * C, (Tol){0.0f, 0.0f});
    float *out = (float *)malloc_check(NC * sizeof(float)), *dout = make_random(NC, -1.0f, 1.0f);
    cudaCheck(cudaMalloc(&d_out, NC * sizeof(floatX)));
    moe_combine_cpu(out, ys, gate, row, N, k, C);
    moe_combine(d_out, d_ys, d_gate, d_row, N, k, C);
    fails += compare_device("combine", d_out, out, NC, TOL_X);
    floatX *d_dout = to_device(dout, NC);
    float *dys = (float *)calloc((size_t)R * C + 1, sizeof(float)), *dgate = (float *)malloc_check(Nk * sizeof(float)), *d_dgate;
    cudaCheck(cudaMalloc(&d_dys, ((size_t)R * C + 1) * sizeof(floatX))); cudaCheck(cudaMalloc(&d_dgate, Nk * sizeof(float)));
    moe_combine_backward_cpu(dys, dgate, dout, ys, gate, row, N, k, C);
    moe_combine_backward(d_dys, d_dgate, d_dout, d_ys, d_gate, d_row, N, k, C);
    fails += compare_device("combine backward rows", d_dys, dys, (size_t)R * C, TOL_X);
    fails += compare_device_f32("combine backward gates", d_dgate, dgate, Nk, TOL_FP32);
    float *dx = (float *)malloc_check(NC * sizeof(float));
    cudaCheck(cudaMalloc(&d_dx, NC * sizeof(floatX))); cudaCheck(cudaMalloc(&d_dx2, NC * sizeof(floatX)));
    moe_unpermute_cpu(dx, ys, row, N, k, C);
    moe_unpermute(d_dx, d_ys, d_row, N, k, C);
    fails += compare_device("unpermute", d_dx, dx, NC, TOL_X);

    // the router's backward: logits, weight, input
    float *dlogits = (float *)malloc_check(NE * sizeof(float)), *d_dlogits;
    cudaCheck(cudaMalloc(&d_dlogits, NE * sizeof(float)));
    copy_to_device(d_dgate, dgate, Nk * sizeof(float));
    float aux_scale = 0.01f * E / (T * (float)B), z_scale = 0.001f / N;
    moe_router_backward_cpu(dlogits, dgate, gate, choice, probs, lse, f, T, N, E, k, aux_scale, z_scale);
    moe_router_backward(d_dlogits, d_dgate, d_gate, d_choice, d_probs, d_lse, d_f, T, N, E, k, aux_scale, z_scale);
    fails += compare_device_f32("router backward dlogits", d_dlogits, dlogits, NE, TOL_FP32);
    copy_to_device(d_dlogits, dlogits, NE * sizeof(float));
    float *dwr = make_random((size_t)E * C, -0.1f, 0.1f);
    floatX *d_dwr = to_device(dwr, (size_t)E * C), *d_dwr2 = to_device(dwr, (size_t)E * C);
    moe_router_dweight_cpu(dwr, dlogits, x, N, C, E);
    moe_router_dweight(d_dwr, d_dlogits, d_x, N, C, E);
    moe_router_dweight(d_dwr2, d_dlogits, d_x, N, C, E);
    fails += compare_device("router dweight (+=)", d_dwr, dwr, (size_t)E * C, TOL_X);
    fails += compare_bitwise("router dweight rerun", d_dwr, d_dwr2, (size_t)E * C * sizeof(floatX));
    copy_on_device(d_dx2, d_dx, NC * sizeof(floatX));
    moe_router_dinput_cpu(dx, dlogits, wr, N, C, E);
    moe_router_dinput(d_dx, d_dlogits, d_wr, N, C, E);
    fails += compare_device("router dinput (+=)", d_dx, dx, NC, TOL_X);

    if (timed) {
        report_time("router forward", time_ms(10, [&] { moe_router_forward(d_probs, d_lse, d_x, d_wr, N, C, E); }), (double)NC * sizeof(floatX), 2.0 * NC * E);
        report_time("top-k", time_ms(10, [&] { moe_topk(d_choice, d_cprob, d_gate, d_probs, N, E, k); }), (double)NE * 4, 0);
        report_time("capacity keep", time_ms(10, [&] { moe_capacity_keep(d_keep, d_choice, d_cprob, 1, 0, B, T, k, cap, policy); }), 0, 0);
        report_time("rows", time_ms(10, [&] { moe_rows(d_row, d_choice, d_keep, d_offsets, N, E, k); }), 0, 0);
        report_time("permute", time_ms(10, [&] { moe_permute(d_xs, d_x, d_row, N, k, C); }), 2.0 * R * C * sizeof(floatX), 0);
        report_time("combine", time_ms(10, [&] { moe_combine(d_out, d_ys, d_gate, d_row, N, k, C); }), (double)(R + N) * C * sizeof(floatX), 0);
        report_time("combine backward", time_ms(10, [&] { moe_combine_backward(d_dys, d_dgate, d_dout, d_ys, d_gate, d_row, N, k, C); }),
                    (double)(2 * R + N) * C * sizeof(floatX), 0);
        report_time("router dweight", time_ms(10, [&] { moe_router_dweight(d_dwr, d_dlogits, d_x, N, C, E); }), (double)NC * sizeof(floatX), 2.0 * NC * E);
        report_time("router dinput", time_ms(10, [&] { moe_router_dinput(d_dx, d_dlogits, d_wr, N, C, E); }), 2.0 * NC * sizeof(floatX), 2.0 * NC * E);
    }
    void *dev[] = {d_x, d_wr, d_probs, d_lse, d_choice, d_keep, d_row, d_gate, d_cprob, d_counts, d_offsets, d_f, d_pmean, d_zsum, d_xs, d_ys,
                   d_out, d_dout, d_dys, d_dgate, d_dx, d_dx2, d_dlogits, d_dwr, d_dwr2};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) { cudaCheck(cudaFree(dev[i])); }
    void *host[] = {x, wr, probs, lse, choice, keep, row, gate, cprob, f, pmean, zsum, xs, ys, out, dout, dys, dgate, dx, dlogits, dwr};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++) { free(host[i]); }
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "moe");
    rng_seed(9);
    int fails = 0;
    fails += run_case(16, 1024, 768, 8, 2, 1250, DROP_PROBS, 1);   // GPT-2 124M width, 8 experts, top-2
    fails += run_case(4, 37, 64, 4, 1, 1000, DROP_POSITION, 0);    // odd T, Switch top-1
    fails += run_case(2, 64, 96, 8, 8, 0, DROP_PROBS, 0);          // k = E, dropless
    fails += run_case(3, 50, 128, 6, 3, 500, DROP_PROBS, 0);       // heavy drops
    return harness_finish(fails);
}
