// Token and position embeddings, vocab-parallel.
// Each tensor-parallel rank owns the rows [v0, v1) of wte. A token outside that range contributes
// zero; the caller sums the partial results over the tp group (all-reduce, or reduce-scatter
// along the tokens with sequence parallelism). wpe is added after that reduction, once.
#ifndef LLMC_ENCODER_H
#define LLMC_ENCODER_H

#include "backend.h"

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

// dwte_local += dout[n] for every token n in [v0, v1). Deterministic: tokens are visited in order
// (threads split the channels, never the tokens).
static void embedding_backward_cpu(float *dwte, const float *dout, const int *tokens, int v0, int v1, int N, int C) {
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int n = 0; n < N; n++) {
            int tok = tokens[n];
            if (tok >= v0 && tok < v1) { dwte[(size_t)(tok - v0) * C + c] += dout[(size_t)n * C + c]; }
        }
    }
}

// out (N, C) += wpe[(n0 + n) % T]: the N local tokens start at flat token index n0 of the (B, T) batch.
static void position_forward_cpu(float *out, const float *wpe, int n0, int N, int T, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *w = wpe + (size_t)((n0 + n) % T) * C;
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) { o[c] += w[c]; }
    }
}

// dwpe[t] += dout[n] over the local tokens at position t.
static void position_backward_cpu(float *dwpe, const float *dout, int n0, int N, int T, int C) {
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int n = 0; n < N; n++) { dwpe[(size_t)((n0 + n) % T) * C + c] += dout[(size_t)n * C + c]; }
    }
}

#ifdef USE_CUDA
// CUDA kernels go here (see the cuda backend issue)
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

static void embedding_backward(floatX *dwte, const floatX *dout, const int *tokens, int v0, int v1, int N, int C) {
#ifdef USE_CUDA
    embedding_backward_cuda(dwte, dout, tokens, v0, v1, N, C);
#else
    embedding_backward_cpu(dwte, dout, tokens, v0, v1, N, C);
#endif
}

static void position_forward(floatX *out, const floatX *wpe, int n0, int N, int T, int C) {
#ifdef USE_CUDA
    position_forward_cuda(out, wpe, n0, N, T, C);
#else
    position_forward_cpu(out, wpe, n0, N, T, C);
#endif
}

static void position_backward(floatX *dwpe, const floatX *dout, int n0, int N, int T, int C) {
#ifdef USE_CUDA
    position_backward_cuda(dwpe, dout, n0, N, T, C);
#else
    position_backward_cpu(dwpe, dout, n0, N, T, C);
#endif
}

#endif
