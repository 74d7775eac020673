// Token + position embeddings: CPU loop vs CUDA kernel, vocab-parallel slice, determinism, timing.
// GPT-2 124M shapes: B=8, T=1024, C=768, Vp=50304 (tp=2 slice: rows [25152, 50304)).
#include "../../llmc/encoder.h"
#include "common.h"

int main(int argc, char **argv) {
    harness_init(&argc, &argv, "encoder");
    const int B = 8, T = 1024, C = 768, V = 50257, Vp = 50304;
    const int N = B * T;
    int fails = 0;
    rng_seed(1);
    // tokens with many repeats (half from 64 frequent ids), as in text
    int *tokens = make_tokens(N, V);
    for (int n = 0; n < N; n++) { if (rng_u32() % 2) { tokens[n] = (int)(rng_u32() % 64); } }
    int *d_tokens = to_device_int(tokens, N);

    const int slices[2][2] = {{0, Vp}, {Vp / 2, Vp}};   // tp = 1, and the second half of tp = 2
    for (int s = 0; s < 2; s++) {
        int v0 = slices[s][0], v1 = slices[s][1], Vl = v1 - v0;
        printf("-- vocab rows [%d, %d)\n", v0, v1);
        float *wte = make_random((size_t)Vl * C, -1.0f, 1.0f);
        floatX *d_wte = to_device(wte, (size_t)Vl * C);
        float *out = make_random((size_t)N * C, -1.0f, 1.0f);   // garbage: must be overwritten
        floatX *d_out = to_device(out, (size_t)N * C);
        embedding_forward_cpu(out, tokens, wte, v0, v1, N, C);
        embedding_forward_cuda(d_out, d_tokens, d_wte, v0, v1, N, C);
        fails += compare_device("embedding_forward out", d_out, out, (size_t)N * C, TOL_X);

        float *dwte = make_random((size_t)Vl * C, -1.0f, 1.0f);
        float *dout = make_random((size_t)N * C, -1.0f, 1.0f);
        floatX *d_dwte = to_device(dwte, (size_t)Vl * C), *d_dwte2 = to_device(dwte, (size_t)Vl * C);
        floatX *d_dout = to_device(dout, (size_t)N * C);
        int pad = v0 + 3;   // a padding id among the rows (transformers' padding_idx): its row gets nothing
        embedding_backward_cpu(dwte, dout, tokens, v0, v1, pad, N, C);
        embedding_backward_cuda(d_dwte, d_dout, d_tokens, v0, v1, pad, N, C);
        embedding_backward_cuda(d_dwte2, d_dout, d_tokens, v0, v1, pad, N, C);
        fails += compare_device("embedding_backward dwte", d_dwte, dwte, (size_t)Vl * C, TOL_X);
        fails += compare_bitwise("embedding_backward rerun", d_dwte, d_dwte2, (size_t)Vl * C * sizeof(floatX));

        if (s == 0) {
            report_time("embedding_forward", time_ms(20, [&] { embedding_forward_cuda(d_out, d_tokens, d_wte, v0, v1, N, C); }),
                        2.0 * N * C * sizeof(floatX), 0);
            report_time("embedding_backward", time_ms(5, [&] { embedding_backward_cuda(d_dwte, d_dout, d_tokens, v0, v1, -1, N, C); }),
                        2.0 * N * C * sizeof(floatX), 0);
        }
        cudaCheck(cudaFree(d_wte)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_dwte));
        cudaCheck(cudaFree(d_dwte2)); cudaCheck(cudaFree(d_dout));
        free(wte); free(out); free(dwte); free(dout);
    }

    // positions: the whole batch (n0 = 0), a sequence-parallel slice starting mid-sequence, and a
    // context-parallel rank's tokens (cp 2, rank 1: chunks 1 and 2 of 4, T/2 local tokens per sequence)
    const int cases[3][3] = {{0, N, T}, {2 * T + 37, 1000, T}, {0, N / 2, T / 2}};
    const SeqPos maps[3] = {{T, 0, 0}, {T, 0, 0}, {T / 4, T / 4, T / 2}};
    for (int s = 0; s < 3; s++) {
        int n0 = cases[s][0], Nl = cases[s][1], Tl = cases[s][2];
        SeqPos sp = maps[s];
        printf("-- positions: tokens [%d, %d) of the batch, %d local positions per sequence\n", n0, n0 + Nl, Tl);
        float *wpe = make_random((size_t)T * C, -1.0f, 1.0f);
        float *out = make_random((size_t)Nl * C, -1.0f, 1.0f);
        floatX *d_wpe = to_device(wpe, (size_t)T * C), *d_out = to_device(out, (size_t)Nl * C);
        position_forward_cpu(out, wpe, sp, n0, Nl, Tl, C);
        position_forward_cuda(d_out, d_wpe, sp, n0, Nl, Tl, C);
        fails += compare_device("position_forward out", d_out, out, (size_t)Nl * C, TOL_X);

        float *dwpe = make_random((size_t)T * C, -1.0f, 1.0f);
        float *dout = make_random((size_t)Nl * C, -1.0f, 1.0f);
        floatX *d_dwpe = to_device(dwpe, (size_t)T * C), *d_dout = to_device(dout, (size_t)Nl * C);
        position_backward_cpu(dwpe, dout, sp, n0, Nl, Tl, C);
        position_backward_cuda(d_dwpe, d_dout, sp, n0, Nl, Tl, C);
        fails += compare_device("position_backward dwpe", d_dwpe, dwpe, (size_t)T * C, TOL_X);
        if (s == 0) {
            report_time("position_forward", time_ms(20, [&] { position_forward_cuda(d_out, d_wpe, sp, n0, Nl, Tl, C); }),
                        3.0 * Nl * C * sizeof(floatX), 0);
            report_time("position_backward", time_ms(20, [&] { position_backward_cuda(d_dwpe, d_dout, sp, n0, Nl, Tl, C); }),
                        (Nl + 2.0 * T) * C * sizeof(floatX), 0);
        }
        cudaCheck(cudaFree(d_wpe)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_dwpe)); cudaCheck(cudaFree(d_dout));
        free(wpe); free(out); free(dwpe); free(dout);
    }
    cudaCheck(cudaFree(d_tokens));
    free(tokens);
    return harness_finish(fails);
}
