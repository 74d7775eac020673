// RoPE forward/backward in place on the q and k heads of the qkv rows (llmc/rope.h): CPU loops vs CUDA
// kernel, v untouched, backward(forward(x)) = x, timing. The cos/sin table is built on the host
// (rope_inv_freq, rope_table) and uploaded once, as train_gpt does.
// Shapes: Llama 3 8B attention (NH 32, KV 8, hs 128, llama3 scaling) at B*T = 4*1024 under context
// parallelism (cp rank 1 of 2: positions T/2.. and T..); GQA at hs 64; an odd one (hs 16, T 37).
#include "../../llmc/rope.h"
#include "common.h"

static int run_case(int B, int T, int NH, int KV, int hs, float theta, const RopeScaling *rs, SeqPos sp, int maxT,
                    int timed) {
    int fails = 0;
    printf("-- B=%d T=%d NH=%d KV=%d hs=%d theta=%g scaling %d, SeqPos {%d, %d, %d}\n", B, T, NH, KV, hs, theta,
           rs != NULL ? rs->kind : 0, sp.half, sp.off0, sp.off1);
    const int W = (NH + 2 * KV) * hs, qk = (NH + KV) * hs;
    size_t N = (size_t)B * T, NW = N * W;
    float *inv_freq = (float *)malloc_check(hs / 2 * sizeof(float)), *cs = (float *)malloc_check((size_t)maxT * hs * sizeof(float));
    rope_inv_freq(inv_freq, hs, theta, rs);
    rope_table(cs, inv_freq, maxT, hs);
    float *d_cs = to_device_f32(cs, (size_t)maxT * hs);

    float *qkv = make_random(NW, -2.0f, 2.0f), *out = copy_floats(qkv, NW);
    floatX *d_qkv = to_device(qkv, NW);
    rope_rotate_cpu(out, cs, sp, B, T, NH, KV, hs, 0);
    rope_rotate_cuda(d_qkv, d_cs, sp, B, T, NH, KV, hs, 0);
    fails += compare_device("rope_forward qkv", d_qkv, out, NW, TOL_X);
    // v untouched: exactly the input (already a floatX value)
    float *h = from_device(d_qkv, NW);
    size_t v_changed = 0;
    for (size_t n = 0; n < N; n++) {
        for (int j = qk; j < W; j++) { v_changed += h[n * W + j] != qkv[n * W + j]; }
    }
    printf("  %-28s %s\n", "rope_forward v", v_changed == 0 ? "untouched: ok" : "CHANGED: FAIL");
    fails += v_changed != 0;

    // backward: the transposed rotation; applied to the forward's output it gives the input back
    float *dqkv = make_random(NW, -1.0f, 1.0f), *dref = copy_floats(dqkv, NW);
    floatX *d_dqkv = to_device(dqkv, NW);
    rope_rotate_cpu(dref, cs, sp, B, T, NH, KV, hs, 1);
    rope_rotate_cuda(d_dqkv, d_cs, sp, B, T, NH, KV, hs, 1);
    fails += compare_device("rope_backward dqkv", d_dqkv, dref, NW, TOL_X);
    rope_rotate_cuda(d_qkv, d_cs, sp, B, T, NH, KV, hs, 1);
    fails += compare_device("rope_backward(rope_forward)", d_qkv, qkv, NW, TOL_X);

    if (timed) {
        // reads and writes the q and k heads
        report_time("rope_forward", time_ms(20, [&] { rope_rotate_cuda(d_qkv, d_cs, sp, B, T, NH, KV, hs, 0); }),
                    2.0 * N * qk * sizeof(floatX), 0);
        report_time("rope_backward", time_ms(20, [&] { rope_rotate_cuda(d_dqkv, d_cs, sp, B, T, NH, KV, hs, 1); }),
                    2.0 * N * qk * sizeof(floatX), 0);
    }
    cudaCheck(cudaFree(d_cs)); cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_dqkv));
    free(inv_freq); free(cs); free(qkv); free(out); free(h); free(dqkv); free(dref);
    return fails;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "rope");
    rng_seed(22);
    int fails = 0;
    RopeScaling llama3 = {1, 8.0f, 1.0f, 4.0f, 8192};
    SeqPos cp = seq_pos_of_rank(2, 1, 1024);              // cp rank 1 of 2: positions 512..1023, 1024..1535
    fails += run_case(4, 1024, 32, 8, 128, 500000.0f, &llama3, cp, 2048, 1);
    fails += run_case(2, 256, 12, 4, 64, 10000.0f, NULL, seq_pos_of_rank(1, 0, 256), 256, 0);
    fails += run_case(3, 37, 3, 1, 16, 10000.0f, NULL, seq_pos_of_rank(1, 0, 37), 37, 0);
    fails += run_case(1, 4096, 8, 8, 64, 500000.0f, &llama3, seq_pos_of_rank(2, 0, 4096), 8192, 0);   // positions to 8191
    return harness_finish(fails);
}
