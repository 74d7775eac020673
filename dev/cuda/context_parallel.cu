// Ring attention's blocks (llmc/context_parallel.h): the CUDA kernels against the CPU loops, and the
// decomposition itself: a rank's two chunks attending over themselves block by block (chunk 0 to
// itself causally; chunk 1 to chunk 0 in full, then to itself causally, merged by log-sum-exp) must
// give the one-device causal attention of the 2c tokens, forward and backward (CPU loops against CPU
// loops). The inputs are rounded to floatX first, so the CPU loops see what the kernels see; the
// backward's bound for the floatX partials between blocks is below.
// Shapes: B 2, T 512 local tokens (c 256), NH 12 query heads of hs 64 (C 768), with KV 12 kv heads, then 4
// (grouped-query attention: query head h reads kv head h / 3).
#include "../../llmc/attention.h"
#include "../../llmc/context_parallel.h"
#include "common.h"

// a partial sum stored in floatX between blocks is rounded with relative error at most u
#if defined(ENABLE_FP32)
static const float ATT_U = 0x1p-24f;
#else
static const float ATT_U = 0x1p-8f;
#endif

// the shapes (the kv heads KV per case: set_heads), and the three blocks of a rank's two chunks
static const int B = 2, T = 512, NH = 12, hs = 64, C = NH * hs, c = T / 2;
static int KV, W, W2;                  // kv heads; the row widths of qkv ((NH + 2KV) hs) and of kv (2 KV hs)
static size_t nqkv, nkv, nout, nlse;
static const int blocks[3][3] = {{0, 0, 1}, {c, 0, 0}, {c, c, 1}};   // (q0, k0, causal)

static void set_heads(int kv) {
    KV = kv; W = (NH + 2 * KV) * hs; W2 = 2 * KV * hs;
    nqkv = (size_t)B * T * W; nkv = (size_t)B * T * W2; nout = (size_t)B * T * C; nlse = (size_t)B * NH * T;
}

// the CPU loops' buffers and the kernels' (d_); out1, lse1, dqkv1: the one-device attention's
typedef struct {
    float *qkv, *kv, *dout, *out, *lse, *out1, *lse1, *out_x, *dqkv, *dkv, *dqkv1, *kappa_q, *kappa_kv;
    floatX *d_qkv, *d_kv, *d_dout, *d_out, *d_dqkv, *d_dkv;
    float *d_lse;
} CPBuffers;

// the inputs qkv and dout (make_random's: values floatX holds exactly), and kv, on both sides
static void make_inputs(CPBuffers *p) {
    p->qkv = make_random(nqkv, -1.0f, 1.0f);
    p->dout = make_random(nout, -1.0f, 1.0f);
    p->kv = (float *)malloc_check(nkv * sizeof(float));   // the k and v parts of qkv
    for (size_t r = 0; r < (size_t)B * T; r++) {
        memcpy(p->kv + r * W2, p->qkv + r * W + C, W2 * sizeof(float));
    }
    p->d_qkv = to_device(p->qkv, nqkv); p->d_kv = to_device(p->kv, nkv); p->d_dout = to_device(p->dout, nout);
}

// The flash path's precision contract (bf16 at head size 64/128, as attention.cu states it): P and dS are
// rounded to floatX before their products, each term a_j b_j changed by at most u |a_j b_j|: over the blocks,
//   out: u sum_j p_j |v_j|;  dq: u sum_j |ds_j| |k_j|;  dk: u sum_t |ds_t| |q_t|;  dv: u sum_t p_t |dy_t|
// with p = exp(s scale - lse) against the final lse (the merged weights) and ds = p (dp - D) scale. A bound,
// not a fit; the warp kernels (fp32 P) get it too, where it only loosens the check by u of the terms.
static void blocks_kappa(const CPBuffers *p, const float *out, float *kappa_out, float *kappa_q, float *kappa_kv) {
    float scale = 1.0f / sqrtf((float)hs);
    for (int k = 0; k < 3; k++) {
        int q0 = blocks[k][0], k0 = blocks[k][1], causal = blocks[k][2];
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int t = 0; t < c; t++) {
                    size_t row = (size_t)b * T + q0 + t;
                    const float *q = p->qkv + row * W + h * hs, *dy = p->dout + row * C + h * hs,
                                *y = out + row * C + h * hs;
                    float l = p->lse[((size_t)b * NH + h) * T + q0 + t], D = 0.0f;
                    for (int i = 0; i < hs; i++) { D += dy[i] * y[i]; }
                    for (int j = 0; j < (causal ? t + 1 : c); j++) {
                        size_t krow = (size_t)b * T + k0 + j, kcol = (size_t)(h / (NH / KV)) * hs;   // its kv head
                        const float *kk = p->kv + krow * W2 + kcol, *v = kk + KV * hs;
                        float sc = 0.0f, dp = 0.0f;
                        for (int i = 0; i < hs; i++) { sc += q[i] * kk[i]; dp += dy[i] * v[i]; }
                        float pr = expf(sc * scale - l), ds = fabsf(pr * (dp - D) * scale);
                        for (int i = 0; i < hs; i++) {
                            kappa_out[row * C + h * hs + i] += ATT_U * pr * fabsf(v[i]);
                            kappa_q[row * W + h * hs + i] += ATT_U * ds * fabsf(kk[i]);
                            kappa_kv[krow * W2 + kcol + i] += ATT_U * ds * fabsf(q[i]);
                            kappa_kv[krow * W2 + KV * hs + kcol + i] += ATT_U * pr * fabsf(dy[i]);
                        }
                    }
                }
            }
        }
    }
}

// forward: the three blocks, merged, on both sides
static int check_forward(CPBuffers *p) {
    int fails = 0;
    p->out = (float *)malloc_check(nout * sizeof(float));
    p->lse = (float *)malloc_check(nlse * sizeof(float));
    cudaCheck(cudaMalloc(&p->d_out, nout * sizeof(floatX)));
    cudaCheck(cudaMalloc(&p->d_lse, nlse * sizeof(float)));
    for (size_t i = 0; i < nout; i++) { p->out[i] = 0.0f; }
    for (size_t i = 0; i < nlse; i++) { p->lse[i] = -INFINITY; }
    attention_block_init(p->d_out, p->d_lse, nout, nlse);
    for (int k = 0; k < 3; k++) {
        attention_block_forward_cpu(p->out, p->lse, p->qkv, p->kv, B, T, NH, KV, hs, blocks[k][0], blocks[k][1], c,
                                    blocks[k][2]);
        attention_block_forward(p->d_out, p->d_lse, p->d_qkv, p->d_kv, B, T, NH, KV, hs, blocks[k][0], blocks[k][1], c,
                                blocks[k][2]);
    }
    float *kappa_out = (float *)calloc(nout, sizeof(float)), *kq = (float *)calloc(nqkv, sizeof(float)),
          *kkv = (float *)calloc(nkv, sizeof(float));
    blocks_kappa(p, p->out, kappa_out, kq, kkv);
    fails += compare_device_bounded("block forward out (3 blocks merged)", p->d_out, p->out, kappa_out, nout, TOL_X);
    free(kappa_out); free(kq); free(kkv);
    fails += compare_device_f32("block forward lse", p->d_lse, p->lse, nlse, TOL_FP32);
    return fails;
}

// the decomposition = one causal attention over the 2c tokens (CPU loops, both fp32)
static int check_forward_decomposition(CPBuffers *p) {
    int fails = 0;
    p->out1 = (float *)malloc_check(nout * sizeof(float));
    p->lse1 = (float *)malloc_check(nlse * sizeof(float));
    attention_forward_cpu(p->out1, p->lse1, p->qkv, B, T, NH, KV, hs);
    fails += compare("blocks = causal attention: out", p->out, p->out1, nout, TOL_FP32);
    fails += compare("blocks = causal attention: lse", p->lse, p->lse1, nlse, TOL_FP32);
    return fails;
}

// backward: the same blocks against the final out and lse. The kernels get the CPU forward's out,
// rounded to floatX as it is stored, and its lse, so both sides see the same inputs. The blocks add
// into dq (chunk 1's rows: two blocks) and dk, dv (chunk 0's keys: two blocks) in floatX, so a partial
// sum that a later block adds to is rounded once more: kappa = u |partial| for each such partial.
static int check_backward(CPBuffers *p) {
    int fails = 0;
    p->out_x = copy_floats(p->out, nout);
    for (size_t i = 0; i < nout; i++) { p->out_x[i] = floatX_to_float(float_to_floatX(p->out_x[i])); }
    upload_floats(p->d_out, p->out_x, nout);
    copy_to_device(p->d_lse, p->lse, nlse * sizeof(float));
    p->dqkv = (float *)calloc(nqkv, sizeof(float));
    p->dkv = (float *)calloc(nkv, sizeof(float));
    float *part_q[2], *part_kv[2];   // the partials after blocks 0 and 1
    cudaCheck(cudaMalloc(&p->d_dqkv, nqkv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&p->d_dkv, nkv * sizeof(floatX)));
    cudaCheck(cudaMemsetAsync(p->d_dqkv, 0, nqkv * sizeof(floatX), main_stream));
    cudaCheck(cudaMemsetAsync(p->d_dkv, 0, nkv * sizeof(floatX), main_stream));
    for (int k = 0; k < 3; k++) {
        attention_block_backward_cpu(p->dqkv, p->dkv, p->dout, p->qkv, p->out_x, p->lse, p->kv, B, T, NH, KV, hs,
                                     blocks[k][0], blocks[k][1], c, blocks[k][2]);
        attention_block_backward(p->d_dqkv, p->d_dkv, p->d_dout, p->d_qkv, p->d_out, p->d_lse, p->d_kv, B, T, NH, KV, hs,
                                 blocks[k][0], blocks[k][1], c, blocks[k][2]);
        if (k < 2) { part_q[k] = copy_floats(p->dqkv, nqkv); part_kv[k] = copy_floats(p->dkv, nkv); }
    }
    p->kappa_q = (float *)calloc(nqkv, sizeof(float));
    p->kappa_kv = (float *)calloc(nkv, sizeof(float));
    float *kappa_out = (float *)calloc(nout, sizeof(float));
    blocks_kappa(p, p->out_x, kappa_out, p->kappa_q, p->kappa_kv);   // (the flash path's P and dS roundings)
    free(kappa_out);
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < nqkv; i++) {
            if (part_q[k][i] != p->dqkv[i]) { p->kappa_q[i] += ATT_U * fabsf(part_q[k][i]); }
        }
        for (size_t i = 0; i < nkv; i++) {
            if (part_kv[k][i] != p->dkv[i]) { p->kappa_kv[i] += ATT_U * fabsf(part_kv[k][i]); }
        }
        free(part_q[k]); free(part_kv[k]);
    }
    fails += compare_device_bounded("block backward dq (in dqkv)", p->d_dqkv, p->dqkv, p->kappa_q, nqkv, TOL_X);
    fails += compare_device_bounded("block backward dk, dv", p->d_dkv, p->dkv, p->kappa_kv, nkv, TOL_X);
    return fails;
}

// the decomposition's gradients = the one-device backward's (CPU loops, fp32 out)
static int check_backward_decomposition(CPBuffers *p) {
    memset(p->dqkv, 0, nqkv * sizeof(float));
    memset(p->dkv, 0, nkv * sizeof(float));
    for (int k = 0; k < 3; k++) {
        attention_block_backward_cpu(p->dqkv, p->dkv, p->dout, p->qkv, p->out, p->lse, p->kv, B, T, NH, KV, hs,
                                     blocks[k][0], blocks[k][1], c, blocks[k][2]);
    }
    p->dqkv1 = (float *)malloc_check(nqkv * sizeof(float));
    attention_backward_cpu(p->dqkv1, p->dout, p->qkv, p->out1, p->lse1, B, T, NH, KV, hs);
    for (size_t r = 0; r < (size_t)B * T; r++) {
        memcpy(p->dqkv + r * W + C, p->dkv + r * W2, W2 * sizeof(float));
    }
    return compare("blocks = causal attention: dqkv", p->dqkv, p->dqkv1, nqkv, TOL_FP32);
}

// one full c x c block, forward and backward, timed
static void time_blocks(const CPBuffers *p) {
    report_time("block forward (c x c, full)", time_ms(5, [&] {
                    attention_block_forward(p->d_out, p->d_lse, p->d_qkv, p->d_kv, B, T, NH, KV, hs, c, 0, c, 0); }),
                0, 4.0 * B * NH * c * c * hs);
    report_time("block backward (c x c, full)", time_ms(5, [&] {
                    attention_block_backward(p->d_dqkv, p->d_dkv, p->d_dout, p->d_qkv, p->d_out, p->d_lse, p->d_kv,
                                             B, T, NH, KV, hs, c, 0, c, 0); }),
                0, 10.0 * B * NH * c * c * hs);
}

// every buffer, device and host
static void free_buffers(CPBuffers *p) {
    cudaCheck(cudaFree(p->d_qkv)); cudaCheck(cudaFree(p->d_kv)); cudaCheck(cudaFree(p->d_dout));
    cudaCheck(cudaFree(p->d_out)); cudaCheck(cudaFree(p->d_lse)); cudaCheck(cudaFree(p->d_dqkv));
    cudaCheck(cudaFree(p->d_dkv));
    free(p->qkv); free(p->kv); free(p->dout); free(p->out); free(p->lse); free(p->out1); free(p->lse1); free(p->dqkv);
    free(p->dkv); free(p->dqkv1); free(p->out_x); free(p->kappa_q); free(p->kappa_kv);
}

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "context_parallel");
    int fails = 0;
    rng_seed(7);
    int kvs[2] = {NH, 4};   // multi-head attention, then grouped-query (3 query heads per kv head)
    for (int i = 0; i < 2; i++) {
        set_heads(kvs[i]);
        printf("-- B=%d T=%d NH=%d KV=%d (head size %d)\n", B, T, NH, KV, hs);
        CPBuffers p;
        memset(&p, 0, sizeof(p));
        make_inputs(&p);
        fails += check_forward(&p);
        fails += check_forward_decomposition(&p);
        fails += check_backward(&p);
        fails += check_backward_decomposition(&p);
        time_blocks(&p);
        free_buffers(&p);
    }
    return harness_finish(fails);
}
