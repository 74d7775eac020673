// Rotary position embeddings (Llama; transformers' rotate-half convention), in place on q and k of the qkv rows:
//   out[i] = x[i] c - x[i + hs/2] s,  out[i + hs/2] = x[i + hs/2] c + x[i] s   (i < hs/2)
//   c, s = cos, sin of angle = pos * inv_freq[i] (fp32), inv_freq[i] = 1 / theta^(2i/hs) (llama3: rescaled)
// The frequencies and the (maxT, hs) cos/sin table are computed once on the host in fp32, as transformers does.
#ifndef LLMC_ROPE_H
#define LLMC_ROPE_H

#include "backend.h"
#include "seq_layout.h"        // the sequence layout: SeqPos, seq_pos
#include "model_config.h"      // RopeScaling


// x as an fp32 value in memory: torch rounds every operation, so no fused multiply-add may span this point
static float rope_f32(float x) { volatile float v = x; return v; }

// inv_freq (hs/2), fp32 as transformers 4.49 computes it (torch float32 ops, one rounding each):
//   default: 1 / pow(theta, (float)(2i) / hs), pow correctly rounded to fp32 (torch's scalar powf; its vectorised
//            Sleef powf is within 1 ulp of it, and differs in about 1% of the values)
//   llama3 (rs->kind 1): wavelen = 2 pi / f; wavelen > orig/low: f / factor; wavelen < orig/high: f;
//     otherwise smooth = (orig / wavelen - low) / (high - low), f = (1 - smooth) f / factor + smooth f.
// rs NULL: none.
static void rope_inv_freq(float *inv_freq, int hs, float theta, const RopeScaling *rs) {
    for (int i = 0; i < hs / 2; i++) {
        float e = (float)(2 * i) / (float)hs;
        inv_freq[i] = 1.0f / (float)pow((double)theta, (double)e);
    }
    if (rs == NULL || rs->kind == 0) { return; }
    if (rs->kind != 1) { fail("rope_inv_freq: unknown rope scaling kind %d", rs->kind); }
    // Python's scalars: the wavelength bounds and high - low in double, each then one fp32 operand
    const float factor = rs->factor, low = rs->low_freq_factor, high = rs->high_freq_factor;
    const float orig = (float)rs->original_max_position;
    const float low_wavelen = (float)((double)rs->original_max_position / (double)low);
    const float high_wavelen = (float)((double)rs->original_max_position / (double)high);
    const float high_minus_low = (float)((double)high - (double)low), two_pi = (float)6.283185307179586;   // 2 * math.pi
    for (int i = 0; i < hs / 2; i++) {
        float f = inv_freq[i];
        float wavelen = rope_f32(1.0f / f) * two_pi;              // torch: f.reciprocal() * 2pi
        float g = wavelen > low_wavelen ? f / factor : f;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            float smooth = (rope_f32(rope_f32(1.0f / wavelen) * orig) - low) / high_minus_low;
            g = rope_f32(rope_f32(1.0f - smooth) * g) / factor + rope_f32(smooth * g);
        }
        inv_freq[i] = g;
    }
}

// cos_sin (maxT, hs): row pos = [cos(angle_i) (hs/2) | sin(angle_i) (hs/2)], angle_i = (float)pos * inv_freq[i]
static void rope_table(float *cos_sin, const float *inv_freq, int maxT, int hs) {
    const int h2 = hs / 2;
    #pragma omp parallel for
    for (int pos = 0; pos < maxT; pos++) {
        float *row = cos_sin + (size_t)pos * hs;
        for (int i = 0; i < h2; i++) {
            float angle = (float)pos * inv_freq[i];
            row[i] = cosf(angle);
            row[h2 + i] = sinf(angle);
        }
    }
}

// The (maxT, hs) table computed on the host and copied into dev (device memory; the CPU build's is host memory).
static void rope_setup(float *dev, int maxT, int hs, float theta, const RopeScaling *rs) {
    float *inv_freq = (float *)malloc_check(hs / 2 * sizeof(float));
    float *table = (float *)malloc_check((size_t)maxT * hs * sizeof(float));
    rope_inv_freq(inv_freq, hs, theta, rs);
    rope_table(table, inv_freq, maxT, hs);
    copy_to_device(dev, table, (size_t)maxT * hs * sizeof(float));
    free(inv_freq);
    free(table);
}

// qkv (B*T, (NH + 2 KV) hs) rows [q heads (NH hs) | k heads (KV hs) | v heads (KV hs)]: every q and k head of
// row n rotated in place by the angles of pos = seq_pos(sp, n % T); v untouched. NH, KV: this rank's heads.
// backward: the gradients dq, dk rotated back (the transposed rotation: s -> -s).
static void rope_rotate_cpu(float *qkv, const float *cos_sin, SeqPos sp, int B, int T, int NH, int KV, int hs,
                            int backward) {
    const int h2 = hs / 2, W = (NH + 2 * KV) * hs;
    #pragma omp parallel for
    for (int n = 0; n < B * T; n++) {
        const float *cs = cos_sin + (size_t)seq_pos(sp, n % T) * hs;
        for (int h = 0; h < NH + KV; h++) {   // q and k heads are the first NH + KV heads of the row
            float *x = qkv + (size_t)n * W + (size_t)h * hs;
            for (int i = 0; i < h2; i++) {
                float x1 = x[i], x2 = x[h2 + i], c = cs[i], s = backward ? -cs[h2 + i] : cs[h2 + i];
                x[i] = x1 * c - x2 * s;
                x[h2 + i] = x2 * c + x1 * s;
            }
        }
    }
}

#ifdef USE_CUDA
// One block per row n, threads over its (NH + KV) * hs/2 rotation pairs (head h, index i); backward: s -> -s.
// cos_sin: the device copy of rope_table's (maxT, hs).
__global__ void rope_kernel(floatX *qkv, const float *cos_sin, SeqPos sp, int T, int NH, int KV, int hs, int backward) {
    const int n = blockIdx.x, h2 = hs / 2, pairs = (NH + KV) * h2;
    const float *cs = cos_sin + (size_t)seq_pos(sp, n % T) * hs;
    floatX *row = qkv + (size_t)n * (NH + 2 * KV) * hs;
    for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
        int h = j / h2, i = j % h2;
        floatX *x = row + (size_t)h * hs;
        float c = cs[i], s = backward ? -cs[h2 + i] : cs[h2 + i];
        float x1 = (float)x[i], x2 = (float)x[h2 + i];
        x[i] = (floatX)(x1 * c - x2 * s);
        x[h2 + i] = (floatX)(x2 * c + x1 * s);
    }
}

static void rope_rotate_cuda(floatX *qkv, const float *cos_sin, SeqPos sp, int B, int T, int NH, int KV, int hs,
                             int backward) {
    int pairs = (NH + KV) * (hs / 2);
    if (B * T <= 0 || pairs <= 0) { return; }
    LAUNCH(rope_kernel, B * T, pairs >= 256 ? 256 : ceil_div(pairs, 32) * 32, 0, main_stream)(qkv, cos_sin, sp, T, NH, KV,
            hs, backward);
    cudaCheckLaunch();
}
#endif

static void rope_rotate(floatX *qkv, const float *cos_sin, SeqPos sp, int B, int T, int NH, int KV, int hs,
                        int backward) {
#ifdef USE_CUDA
    rope_rotate_cuda(qkv, cos_sin, sp, B, T, NH, KV, hs, backward);
#else
    rope_rotate_cpu(qkv, cos_sin, sp, B, T, NH, KV, hs, backward);
#endif
}

// q and k of qkv rotated (the forward); the gradients dq and dk of dqkv rotated back (its backward).
static void rope_forward(floatX *qkv, const float *cos_sin, SeqPos sp, int B, int T, int NH, int KV, int hs) {
    rope_rotate(qkv, cos_sin, sp, B, T, NH, KV, hs, 0);
}
static void rope_backward(floatX *dqkv, const float *cos_sin, SeqPos sp, int B, int T, int NH, int KV, int hs) {
    rope_rotate(dqkv, cos_sin, sp, B, T, NH, KV, hs, 1);
}

#endif // LLMC_ROPE_H
