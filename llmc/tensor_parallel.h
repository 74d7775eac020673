// Tensor parallelism (Megatron-style) with optional sequence parallelism, in one place.
//
//   column-parallel linear (qkv, fc):  each tp rank holds a slice of the OUTPUT rows of W
//                                      (qkv: its heads of each of q, k, v; fc: 4C/tp rows)
//   row-parallel linear (attproj, fcproj): each rank holds a slice of the INPUT columns of W,
//                                      produces a partial sum; the bias is added once after the sum.
//   vocab-parallel wte: each rank holds Vp/tp rows, used by the embedding and the LM head.
//
// Communication, for activations of BT = B*T tokens, is two operations:
//   tp_all_tokens(x):     the (BT, C) tensor from the local one. SP: all-gather along the tokens;
//                         without SP every rank already holds all tokens: nothing to do.
//   tp_sum_partials(p):   the sum over tp of partial (BT, C) results. SP: reduce-scatter along the
//                         tokens, each rank keeps its BT/tp; without SP: all-reduce.
// They are each other's backward, and Megatron's f and g are made of them:
//                                    forward              backward
//   entering a column-parallel layer tp_all_tokens        tp_sum_partials     (Megatron f; SP: gather)
//   leaving a row-parallel layer     tp_sum_partials      tp_all_tokens       (Megatron g; SP: scatter)
// With --sp, LayerNorm, residual adds and biases after the row-parallel layers run on the local
// BT/tp tokens (the flattened (B, T) token range [tp_rank * BT/tp, (tp_rank + 1) * BT/tp), so every
// gather and scatter is one contiguous collective); their parameter gradients are then partial
// and are all-reduced over tp before the data-parallel reduction (zero.h).
#ifndef LLMC_TENSOR_PARALLEL_H
#define LLMC_TENSOR_PARALLEL_H

#include "comm.h"
#include "model_config.h"   // SplitKind


// A full (llm.c) tensor viewed as nblk blocks of (rows, cols); SPLIT_ROWS gives rank r the rows
// [r*rows/tp, (r+1)*rows/tp) of every block, SPLIT_COLS the columns [r*cols/tp, (r+1)*cols/tp).
// Copies full -> local (to_local = 1) or local -> full (to_local = 0). Host memory.
static void tp_slice_copy(float *full, float *local, int nblk, size_t rows, size_t cols, SplitKind split,
                          int tp, int r, int to_local) {
    if (split == SPLIT_NONE || tp == 1) {
        size_t n = (size_t)nblk * rows * cols;
        if (to_local) { memcpy(local, full, n * sizeof(float)); } else { memcpy(full, local, n * sizeof(float)); }
        return;
    }
    if (split == SPLIT_ROWS) {
        size_t lr = rows / tp;
        for (int b = 0; b < nblk; b++) {
            float *f = full + ((size_t)b * rows + r * lr) * cols;
            float *l = local + (size_t)b * lr * cols;
            if (to_local) { memcpy(l, f, lr * cols * sizeof(float)); } else { memcpy(f, l, lr * cols * sizeof(float)); }
        }
    } else {
        size_t lc = cols / tp;
        for (size_t i = 0; i < (size_t)nblk * rows; i++) {
            float *f = full + i * cols + r * lc;
            float *l = local + i * lc;
            if (to_local) { memcpy(l, f, lc * sizeof(float)); } else { memcpy(f, l, lc * sizeof(float)); }
        }
    }
}

// Grouped-query attention's q, k, v rows (rows = qrows + 2 kv rows, each (rows, cols)): rank r's heads of each,
// [q rows r qrows/tp .. | k rows r kv/tp .. | v rows ..], as three SPLIT_ROWS cuts.
static void tp_slice_copy_qkv(float *full, float *local, size_t rows, size_t qrows, size_t cols, int tp, int r,
                              int to_local) {
    size_t kv = (rows - qrows) / 2, part[3] = {qrows, kv, kv}, f = 0, l = 0;
    for (int i = 0; i < 3; i++) {
        tp_slice_copy(full + f * cols, local + l * cols, 1, part[i], cols, SPLIT_ROWS, tp, r, to_local);
        f += part[i];
        l += part[i] / tp;
    }
}

// ----------------------------------------------------------------------------
// the two operations. x_local is (BTs, C), BTs = BT/tp with SP, else BT.

// x_local (BTs, C) -> (BT, C): SP gathers into full_buf; otherwise x_local already is that.
static floatX *tp_all_tokens(Group *tp, int sp, floatX *x_local, floatX *full_buf, size_t BTs, int C) {
    if (!sp || tp->size == 1) { return x_local; }
    comm_all_gather(tp, x_local, full_buf, BTs * C, DT_FLOATX, NULL);
    return full_buf;
}

// partial (BT, C), summed over tp -> (BTs, C): SP reduce-scatters into out_local; otherwise the
// all-reduced partial itself.
static floatX *tp_sum_partials(Group *tp, int sp, floatX *partial, floatX *out_local, size_t BTs, int C) {
    if (tp->size == 1) { return partial; }
    if (!sp) { comm_all_reduce(tp, partial, BTs * C, DT_FLOATX, NULL); return partial; }
    comm_reduce_scatter(tp, partial, out_local, BTs * C, DT_FLOATX, NULL);
    return out_local;
}

#endif
