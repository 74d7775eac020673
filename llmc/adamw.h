// AdamW as in llm.c: decoupled weight decay, bias correction, gradients pre-scaled by the clip factor.
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr (mhat / (sqrt(vhat) + eps) + wd p)
// The scale is read from device memory (*grad_scale, made on the device: global_norm.h), so the host
// need not wait for the norm; a scale of 0 means a skipped step: nothing is written.
// With bf16 parameters (CUDA) the fp32 master copy is updated and rounded stochastically into
// the bf16 parameters; on the CPU (fp32 everywhere) master is NULL and the parameters are the master.
#ifndef LLMC_ADAMW_H
#define LLMC_ADAMW_H

#include "backend.h"

// one element: its moments m, v updated in place; returns the new weight
static inline float adamw_element(float p, float g, float *m, float *v, float lr, float beta1, float beta2, float b1c,
                                  float b2c, float eps, float weight_decay) {
    float mi = beta1 * *m + (1.0f - beta1) * g;
    float vi = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mi;
    *v = vi;
    return p - lr * ((mi / b1c) / (sqrtf(vi / b2c) + eps) + weight_decay * p);
}

static void adamw_update_cpu(float *params, float *master, const float *grads, float *m, float *v, size_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             const float *grad_scale, int t, unsigned int seed) {
    (void)seed;
    float scale = *grad_scale;
    if (scale == 0.0f) { return; }
    float b1c = 1.0f - powf(beta1, (float)t), b2c = 1.0f - powf(beta2, (float)t);
    if (master == NULL) {   // (two loops without a branch inside: each vectorizes; memory bound either way)
        #pragma omp parallel for
        for (size_t i = 0; i < n; i++) {
            params[i] = adamw_element(params[i], grads[i] * scale, m + i, v + i, lr, beta1, beta2, b1c, b2c, eps,
                                      weight_decay);
        }
        return;
    }
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float p = adamw_element(master[i], grads[i] * scale, m + i, v + i, lr, beta1, beta2, b1c, b2c, eps, weight_decay);
        master[i] = p;
        params[i] = p;
    }
}

// One update of several tensors that lie in the same arrays (a unit's owned range: params, master, grads,
// m and v indexed alike): segment k is elements [start, start + len) with its own weight decay and
// rounding seed, its element i rounded with random_bits(seed, i) as a launch of its own would be.
// Gaps between segments are left alone. On CUDA one launch for all of them (a multi-tensor update). v_start: where
// the segment's v is (v need not hold the gaps: with Muon, zero.h keeps no v for Muon's elements).
#define ADAMW_MAX_SEGMENTS 16
typedef struct { size_t start, len; float weight_decay; unsigned int seed; size_t v_start; } AdamWSegment;
typedef struct {
    int n;
    AdamWSegment s[ADAMW_MAX_SEGMENTS];
    unsigned int blk0[ADAMW_MAX_SEGMENTS + 1];   // CUDA: segment k's blocks are [blk0[k], blk0[k + 1])
} AdamWSegments;

#ifdef USE_CUDA
// The segment of block `block` (the blocks are dealt out segment by segment): k, and the block's
// index b within it and the segment's block count nb
__host__ __device__ inline int adamw_block_segment(const AdamWSegments *sg, unsigned int block, unsigned int *b,
                                                   unsigned int *nb) {
    int k = 0;
    while (k + 1 < sg->n && block >= sg->blk0[k + 1]) { k++; }
    *b = block - sg->blk0[k];
    *nb = sg->blk0[k + 1] - sg->blk0[k];
    return k;
}

// Each block updates its segment's elements b*256 + tid, stepping by nb*256. With master != NULL the
// fp32 master weight is updated and rounded stochastically into params (random bits: a hash of
// (seed, i)); without, params is the master (fp32 build; a bf16 params-only update is rounded
// stochastically too).
#define ADAMW_THREADS 256
__global__ void adamw_kernel(floatX *params, float *master, const floatX *grads, float *m, float *v, AdamWSegments sg,
                             float lr, float beta1, float beta2, float b1c, float b2c, float eps,
                             const float *grad_scale) {
    float scale = *grad_scale;
    if (scale == 0.0f) { return; }
    unsigned int b, nb;
    const AdamWSegment *seg = &sg.s[adamw_block_segment(&sg, blockIdx.x, &b, &nb)];
    for (size_t i = (size_t)b * ADAMW_THREADS + threadIdx.x; i < seg->len; i += (size_t)nb * ADAMW_THREADS) {
        size_t j = seg->start + i, jv = seg->v_start + i;
        float g = (float)grads[j] * scale;
        float mi = beta1 * m[j] + (1.0f - beta1) * g;
        float vi = beta2 * v[jv] + (1.0f - beta2) * g * g;
        m[j] = mi;
        v[jv] = vi;
        float p = master != NULL ? master[j] : (float)params[j];
        p -= lr * ((mi / b1c) / (sqrtf(vi / b2c) + eps) + seg->weight_decay * p);
        if (master != NULL) { master[j] = p; }
        params[j] = float_to_floatX_stochastic(p, random_bits(seg->seed, i));
    }
}

// blk0 for the segments: each gets the blocks a launch of its own would (elementwise_grid)
static unsigned int adamw_deal_blocks(AdamWSegments *sg) {
    sg->blk0[0] = 0;
    for (int k = 0; k < sg->n; k++) {
        sg->blk0[k + 1] = sg->blk0[k] + (sg->s[k].len > 0 ? elementwise_grid(sg->s[k].len, ADAMW_THREADS) : 0);
    }
    return sg->blk0[sg->n];
}

static void adamw_update_segments_cuda(floatX *params, float *master, const floatX *grads, float *m, float *v,
                                       AdamWSegments sg, float lr, float beta1, float beta2, float eps,
                                       const float *grad_scale, int t) {
    unsigned int blocks = adamw_deal_blocks(&sg);
    if (blocks == 0) { return; }
    float b1c = 1.0f - powf(beta1, (float)t), b2c = 1.0f - powf(beta2, (float)t);   // as the CPU loop
    LAUNCH(adamw_kernel, blocks, ADAMW_THREADS, 0, main_stream)(params, master, grads, m, v, sg, lr, beta1, beta2, b1c,
                                                            b2c, eps, grad_scale);
    cudaCheckLaunch();
}
#endif

static void adamw_update_segments(floatX *params, float *master, const floatX *grads, float *m, float *v,
                                  const AdamWSegments *sg, float lr, float beta1, float beta2, float eps,
                                  const float *grad_scale, int t) {
#ifdef USE_CUDA
    adamw_update_segments_cuda(params, master, grads, m, v, *sg, lr, beta1, beta2, eps, grad_scale, t);
#else
    for (int k = 0; k < sg->n; k++) {
        const AdamWSegment *s = &sg->s[k];
        adamw_update_cpu(params + s->start, master ? master + s->start : NULL, grads + s->start, m + s->start,
                         v + s->v_start, s->len,
                         lr, beta1, beta2, eps, s->weight_decay, grad_scale, t, s->seed);
    }
#endif
}

// One tensor: a single segment
static void adamw_update(floatX *params, float *master, const floatX *grads, float *m, float *v, size_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         const float *grad_scale, int t, unsigned int seed) {
    AdamWSegments sg = {1, {{0, n, weight_decay, seed, 0}}, {0}};
    adamw_update_segments(params, master, grads, m, v, &sg, lr, beta1, beta2, eps, grad_scale, t);
}

#endif
