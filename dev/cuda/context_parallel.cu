// Ring attention's blocks (llmc/context_parallel.h): the CUDA kernels against the CPU loops, and the
// decomposition itself: a rank's two chunks attending over themselves block by block (chunk 0 to
// itself causally; chunk 1 to chunk 0 in full, then to itself causally, merged by log-sum-exp) must
// give the one-device causal attention of the 2c tokens, forward and backward (CPU loops against CPU
// loops). The inputs are rounded to floatX first, so the CPU loops see what the kernels see; the
// backward's bound for the floatX partials between blocks is below.
// Shapes: B 2, T 512 local tokens (c 256), C 768, NH 12 (hs 64).
#include "../../llmc/attention.h"
#include "../../llmc/context_parallel.h"
#include "common.h"

// a partial sum stored in floatX between blocks is rounded with relative error at most u
#if defined(ENABLE_FP32)
static const float ATT_U = 0x1p-24f;
#else
static const float ATT_U = 0x1p-8f;
#endif

static float *rounded(size_t n, float lo, float hi) {   // random values that floatX holds exactly
    float *h = make_random(n, lo, hi);
    floatX *d = to_device(h, n);
    float *r = from_device(d, n);
    cudaCheck(cudaFree(d));
    free(h);
    return r;
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "context_parallel");
    const int B = 2, T = 512, C = 768, NH = 12, c = T / 2;
    const size_t nqkv = (size_t)B * T * 3 * C, nkv = (size_t)B * T * 2 * C, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    int fails = 0;
    rng_seed(7);
    float *qkv = rounded(nqkv, -1.0f, 1.0f), *dout = rounded(nout, -1.0f, 1.0f);
    float *kv = (float *)malloc_check(nkv * sizeof(float));   // the k and v parts of qkv
    for (size_t r = 0; r < (size_t)B * T; r++) { memcpy(kv + r * 2 * C, qkv + r * 3 * C + C, 2 * C * sizeof(float)); }
    floatX *d_qkv = to_device(qkv, nqkv), *d_kv = to_device(kv, nkv), *d_dout = to_device(dout, nout);

    // forward: the three blocks, merged, on both sides
    float *out = (float *)malloc_check(nout * sizeof(float)), *lse = (float *)malloc_check(nlse * sizeof(float));
    floatX *d_out;
    float *d_lse;
    cudaCheck(cudaMalloc(&d_out, nout * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_lse, nlse * sizeof(float)));
    for (size_t i = 0; i < nout; i++) { out[i] = 0.0f; }
    for (size_t i = 0; i < nlse; i++) { lse[i] = -INFINITY; }
    attention_block_init(d_out, d_lse, nout, nlse);
    const int blocks[3][3] = {{0, 0, 1}, {c, 0, 0}, {c, c, 1}};   // (q0, k0, causal)
    for (int k = 0; k < 3; k++) {
        attention_block_forward_cpu(out, lse, qkv, kv, B, T, C, NH, blocks[k][0], blocks[k][1], c, blocks[k][2]);
        attention_block_forward(d_out, d_lse, d_qkv, d_kv, B, T, C, NH, blocks[k][0], blocks[k][1], c, blocks[k][2]);
    }
    fails += compare_device("block forward out (3 blocks merged)", d_out, out, nout, TOL_X);
    fails += compare_device_f32("block forward lse", d_lse, lse, nlse, TOL_FP32);
    // the decomposition = one causal attention over the 2c tokens (CPU loops, both fp32)
    float *out1 = (float *)malloc_check(nout * sizeof(float)), *lse1 = (float *)malloc_check(nlse * sizeof(float));
    attention_forward_cpu(out1, lse1, qkv, B, T, C, NH);
    fails += compare("blocks = causal attention: out", out, out1, nout, TOL_FP32);
    fails += compare("blocks = causal attention: lse", lse, lse1, nlse, TOL_FP32);

    // backward: the same blocks against the final out and lse. The kernels get the CPU forward's out,
    // rounded to floatX as it is stored, and its lse, so both sides see the same inputs. The blocks add
    // into dq (chunk 1's rows: two blocks) and dk, dv (chunk 0's keys: two blocks) in floatX, so a partial
    // sum that a later block adds to is rounded once more: kappa = u |partial| for each such partial.
    float *out_x = copy_floats(out, nout);
    for (size_t i = 0; i < nout; i++) { out_x[i] = floatX_to_float(float_to_floatX(out_x[i])); }
    upload_floats(d_out, out_x, nout);
    copy_to_device(d_lse, lse, nlse * sizeof(float));
    float *dqkv = (float *)calloc(nqkv, sizeof(float)), *dkv = (float *)calloc(nkv, sizeof(float));
    float *part_q[2], *part_kv[2];   // the partials after blocks 0 and 1
    floatX *d_dqkv, *d_dkv;
    cudaCheck(cudaMalloc(&d_dqkv, nqkv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_dkv, nkv * sizeof(floatX)));
    cudaCheck(cudaMemset(d_dqkv, 0, nqkv * sizeof(floatX)));
    cudaCheck(cudaMemset(d_dkv, 0, nkv * sizeof(floatX)));
    for (int k = 0; k < 3; k++) {
        attention_block_backward_cpu(dqkv, dkv, dout, qkv, out_x, lse, kv, B, T, C, NH, blocks[k][0], blocks[k][1], c, blocks[k][2]);
        attention_block_backward(d_dqkv, d_dkv, d_dout, d_qkv, d_out, d_lse, d_kv, B, T, C, NH, blocks[k][0], blocks[k][1], c, blocks[k][2]);
        if (k < 2) { part_q[k] = copy_floats(dqkv, nqkv); part_kv[k] = copy_floats(dkv, nkv); }
    }
    float *kappa_q = (float *)calloc(nqkv, sizeof(float)), *kappa_kv = (float *)calloc(nkv, sizeof(float));
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < nqkv; i++) { if (part_q[k][i] != dqkv[i]) { kappa_q[i] += ATT_U * fabsf(part_q[k][i]); } }
        for (size_t i = 0; i < nkv; i++) { if (part_kv[k][i] != dkv[i]) { kappa_kv[i] += ATT_U * fabsf(part_kv[k][i]); } }
        free(part_q[k]); free(part_kv[k]);
    }
    fails += compare_device_bounded("block backward dq (in dqkv)", d_dqkv, dqkv, kappa_q, nqkv, TOL_X);
    fails += compare_device_bounded("block backward dk, dv", d_dkv, dkv, kappa_kv, nkv, TOL_X);
    // the decomposition's gradients = the one-device backward's (CPU loops, fp32 out)
    memset(dqkv, 0, nqkv * sizeof(float));
    memset(dkv, 0, nkv * sizeof(float));
    for (int k = 0; k < 3; k++) {
        attention_block_backward_cpu(dqkv, dkv, dout, qkv, out, lse, kv, B, T, C, NH, blocks[k][0], blocks[k][1], c, blocks[k][2]);
    }
    float *dqkv1 = (float *)malloc_check(nqkv * sizeof(float));
    attention_backward_cpu(dqkv1, dout, qkv, out1, lse1, B, T, C, NH);
    for (size_t r = 0; r < (size_t)B * T; r++) { memcpy(dqkv + r * 3 * C + C, dkv + r * 2 * C, 2 * C * sizeof(float)); }
    fails += compare("blocks = causal attention: dqkv", dqkv, dqkv1, nqkv, TOL_FP32);

    report_time("block forward (c x c, full)", time_ms(5, [&] { attention_block_forward(d_out, d_lse, d_qkv, d_kv, B, T, C, NH, c, 0, c, 0); }),
                0, 4.0 * B * NH * c * c * (C / NH));
    report_time("block backward (c x c, full)", time_ms(5, [&] {
                    attention_block_backward(d_dqkv, d_dkv, d_dout, d_qkv, d_out, d_lse, d_kv, B, T, C, NH, c, 0, c, 0); }),
                0, 10.0 * B * NH * c * c * (C / NH));
    cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_kv)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_lse)); cudaCheck(cudaFree(d_dqkv)); cudaCheck(cudaFree(d_dkv));
    free(qkv); free(kv); free(dout); free(out); free(lse); free(out1); free(lse1); free(dqkv); free(dkv); free(dqkv1); free(out_x); free(kappa_q); free(kappa_kv);
    return harness_finish(fails);
}
