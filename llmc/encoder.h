// Token and position embeddings, vocab-parallel.
// Each tensor-parallel rank owns the rows [v0, v1) of wte. A token outside that range contributes
// zero; the caller sums the partial results over the tp group (all-reduce, or reduce-scatter
// along the tokens with sequence parallelism). wpe is added after that reduction, once.
#ifndef LLMC_ENCODER_H
#define LLMC_ENCODER_H

#include "backend.h"
#include "seq_layout.h"        // the sequence layout: SeqPos, seq_pos

// out (N, C) = wte[tok - v0] for tokens in [v0, v1), else 0.   wte_local (v1 - v0, C)
static void embedding_forward_cpu(float *out, const int *tokens, const float *wte, int v0, int v1, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        int tok = tokens[n];
        float *o = out + (size_t)n * C;
        if (tok >= v0 && tok < v1) {
            const float *w = wte + (size_t)(tok - v0) * C;
            for (int c = 0; c < C; c++) { o[c] = w[c]; }
        } else {
            for (int c = 0; c < C; c++) { o[c] = 0.0f; }
        }
    }
}

// dwte_local += dout[n] for every token n in [v0, v1) but the padding id `pad` (nn.Embedding's padding_idx: its row
// gets no gradient here; -1: none). Deterministic: tokens are visited in order (threads split the channels, never
// the tokens).
static void embedding_backward_cpu(float *dwte, const float *dout, const int *tokens, int v0, int v1, int pad, int N,
                                   int C) {
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int n = 0; n < N; n++) {
            int tok = tokens[n];
            if (tok >= v0 && tok < v1 && tok != pad) { dwte[(size_t)(tok - v0) * C + c] += dout[(size_t)n * C + c]; }
        }
    }
}

// out (N, C) += wpe[seq_pos((n0 + n) % T)]: the N local tokens start at flat token index n0 of the (B, T) batch.
static void position_forward_cpu(float *out, const float *wpe, SeqPos sp, int n0, int N, int T, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *w = wpe + (size_t)seq_pos(sp, (n0 + n) % T) * C;
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) { o[c] += w[c]; }
    }
}

// dwpe[t] += dout[n] over the local tokens at position t.
static void position_backward_cpu(float *dwpe, const float *dout, SeqPos sp, int n0, int N, int T, int C) {
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int n = 0; n < N; n++) { dwpe[(size_t)seq_pos(sp, (n0 + n) % T) * C + c] += dout[(size_t)n * C + c]; }
    }
}

#ifdef USE_CUDA
// out (N, C) = wte[tok - v0] or 0; one thread per element.
__global__ void embedding_forward_kernel(floatX *out, const int *tokens, const floatX *wte, int v0, int v1, int N,
                                         int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) { return; }
    int n = (int)(i / C), c = (int)(i % C);
    int tok = tokens[n];
    out[i] = (tok >= v0 && tok < v1) ? wte[(size_t)(tok - v0) * C + c] : (floatX)0.0f;
}

// dwte_local += dout[n] for tokens in [v0, v1), deterministic without atomics or a sort:
// block (blockIdx.x = n, blockIdx.y = a 256-channel slice) works only if n is the FIRST token
// position holding its id; it then walks all positions in ascending order (a warp ballot per 32
// tokens finds the matches) and sums their rows in fp32, so every wte row is written by exactly
// one block and summed in token order. grid (N, ceil_div(C, 256)), block 256.
__global__ void embedding_backward_kernel(floatX *dwte, const floatX *dout, const int *tokens, int v0, int v1, int pad,
                                          int N, int C) {
    int n = blockIdx.x;
    int tok = tokens[n];
    if (tok < v0 || tok >= v1 || tok == pad) { return; }
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    int lane = threadIdx.x % 32;
    float sum = 0.0f;
    for (int base = 0; base < N; base += 32) {
        int m = base + lane;
        unsigned int match = __ballot_sync(0xffffffffu, m < N && tokens[m] == tok);
        while (match != 0) {
            int k = base + __ffs(match) - 1;    // ascending positions
            match &= match - 1;
            // not the first occurrence: another block owns this row (uniform in the block)
            if (k < n) {
                return;
            }
            if (c < C) { sum += (float)dout[(size_t)k * C + c]; }
        }
    }
    if (c < C) {
        floatX *w = dwte + (size_t)(tok - v0) * C + c;
        *w = (floatX)((float)*w + sum);
    }
}

// out (N, C) += wpe[(n0 + n) % T]
__global__ void position_forward_kernel(floatX *out, const floatX *wpe, SeqPos sp, int n0, int N, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) { return; }
    int n = (int)(i / C), c = (int)(i % C);
    out[i] = (floatX)((float)out[i] + (float)wpe[(size_t)seq_pos(sp, (n0 + n) % T) * C + c]);
}

// dwpe[seq_pos(t)] += sum of dout[n] over the local n with (n0 + n) % T == t, n ascending. One thread per
// local (t, c) (distinct t: distinct rows of dwpe).
__global__ void position_backward_kernel(floatX *dwpe, const floatX *dout, SeqPos sp, int n0, int N, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) { return; }
    int t = (int)(i / C), c = (int)(i % C);
    int first = ((t - n0) % T + T) % T;      // smallest n >= 0 with (n0 + n) % T == t
    if (first >= N) { return; }
    float sum = 0.0f;
    for (int n = first; n < N; n += T) { sum += (float)dout[(size_t)n * C + c]; }
    size_t w = (size_t)seq_pos(sp, t) * C + c;
    dwpe[w] = (floatX)((float)dwpe[w] + sum);
}

static void embedding_forward_cuda(floatX *out, const int *tokens, const floatX *wte, int v0, int v1, int N, int C) {
    size_t total = (size_t)N * C;
    if (total == 0) { return; }
    LAUNCH(embedding_forward_kernel, (unsigned int)ceil_div(total, 256), 256, 0, main_stream)(out, tokens, wte, v0, v1, N,
            C);
    cudaCheckLaunch();
}

static void embedding_backward_cuda(floatX *dwte, const floatX *dout, const int *tokens, int v0, int v1, int pad, int N,
                                    int C) {
    if (N <= 0 || C <= 0) { return; }
    LAUNCH(embedding_backward_kernel, dim3(N, ceil_div(C, 256)), 256, 0, main_stream)(dwte, dout, tokens, v0, v1, pad, N, C);
    cudaCheckLaunch();
}

static void position_forward_cuda(floatX *out, const floatX *wpe, SeqPos sp, int n0, int N, int T, int C) {
    size_t total = (size_t)N * C;
    if (total == 0) { return; }
    LAUNCH(position_forward_kernel, (unsigned int)ceil_div(total, 256), 256, 0, main_stream)(out, wpe, sp, n0, N, T, C);
    cudaCheckLaunch();
}

static void position_backward_cuda(floatX *dwpe, const floatX *dout, SeqPos sp, int n0, int N, int T, int C) {
    size_t total = (size_t)T * C;
    if (total == 0 || N <= 0) { return; }
    LAUNCH(position_backward_kernel, (unsigned int)ceil_div(total, 256), 256, 0, main_stream)(dwpe, dout, sp, n0, N, T, C);
    cudaCheckLaunch();
}
#endif

// ----------------------------------------------------------------------------
// launchers

static void embedding_forward(floatX *out, const int *tokens, const floatX *wte, int v0, int v1, int N, int C) {
#ifdef USE_CUDA
    embedding_forward_cuda(out, tokens, wte, v0, v1, N, C);
#else
    embedding_forward_cpu(out, tokens, wte, v0, v1, N, C);
#endif
}

static void embedding_backward(floatX *dwte, const floatX *dout, const int *tokens, int v0, int v1, int pad, int N,
                               int C) {
#ifdef USE_CUDA
    embedding_backward_cuda(dwte, dout, tokens, v0, v1, pad, N, C);
#else
    embedding_backward_cpu(dwte, dout, tokens, v0, v1, pad, N, C);
#endif
}

static void position_forward(floatX *out, const floatX *wpe, SeqPos sp, int n0, int N, int T, int C) {
#ifdef USE_CUDA
    position_forward_cuda(out, wpe, sp, n0, N, T, C);
#else
    position_forward_cpu(out, wpe, sp, n0, N, T, C);
#endif
}

static void position_backward(floatX *dwpe, const floatX *dout, SeqPos sp, int n0, int N, int T, int C) {
#ifdef USE_CUDA
    position_backward_cuda(dwpe, dout, sp, n0, N, T, C);
#else
    position_backward_cpu(dwpe, dout, sp, n0, N, T, C);
#endif
}

#endif
