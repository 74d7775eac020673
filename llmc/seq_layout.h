// The sequence layout under context parallelism (--cp N, context_parallel.h): the sequence is cut into 2N chunks
// and cp rank i holds chunks i and 2N-1-i. Plain data and index arithmetic, read by the encoder's positions, RoPE,
// the ring's causal blocks, MoE's whole-sequence capacity, the data loader and sampling.
#ifndef LLMC_SEQ_LAYOUT_H
#define LLMC_SEQ_LAYOUT_H

#include "backend.h"

// The sequence layout, the one definition (the encoder's positions, the ring's causal blocks, the MoE
// capacity's whole sequences, the tokens each rank reads, sampling): the sequence chunk of local rows
// [half*c, half*c + c) of cp rank i (of N) is i, or 2N-1-i.
#ifdef USE_CUDA
__host__ __device__
#endif
static inline int cp_chunk(int i, int N, int half) { return half ? 2 * N - 1 - i : i; }

// Where in the sequence the local position t is (0 <= t < T, the tokens of a sequence this rank
// holds): two chunks of `half` tokens starting at sequence positions off0 and off1; without context
// parallelism, half = T and off0 = 0: t itself.
typedef struct { int half, off0, off1; } SeqPos;
#ifdef USE_CUDA
__host__ __device__
#endif
static inline int seq_pos(SeqPos p, int t) { return t < p.half ? p.off0 + t : p.off1 + t - p.half; }

// Cp rank r of N holds T tokens of each sequence: its chunks cp_chunk(r, N, 0) and cp_chunk(r, N, 1) of
// T/2 tokens each (N = 1: all).
#ifdef USE_CUDA
__host__ __device__
#endif
static inline SeqPos seq_pos_of_rank(int N, int r, int T) {
    if (N == 1) { SeqPos p = {T, 0, 0}; return p; }
    SeqPos p = {T / 2, cp_chunk(r, N, 0) * T / 2, cp_chunk(r, N, 1) * T / 2};
    return p;
}

// The inverse: the cp rank (of N, each holding T tokens of a sequence) that holds sequence position pos,
// and its local row there.
static void seq_pos_owner(int N, int T, int pos, int *rank, int *row) {
    if (N == 1) { *rank = 0; *row = pos; return; }
    int c = T / 2, chunk = pos / c, half = chunk >= N;
    *rank = cp_chunk(chunk, N, half);   // (cp_chunk is its own inverse: chunk i <-> rank i, chunk 2N-1-i <-> rank i)
    *row = half * c + pos % c;
}

#endif
