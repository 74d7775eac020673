// MT19937, the 32-bit Mersenne Twister (Matsumoto and Nishimura, 1998), for data shuffling only.
// It is the generator llm.c's data loader shuffles with (the one PyTorch's CPU generator uses), so
// `--shuffle 1` visits shards and samples in llm.c's order. Init, dropout-free training and sampling
// keep the small generator of rand.h.
//
//   state:   624 words; seeding: x[0] = seed, x[i] = 1812433253 * (x[i-1] ^ (x[i-1] >> 30)) + i
//   twist:   every 624 draws, x[i] = x[i+397] ^ (y >> 1) ^ (y odd ? 0x9908B0DF : 0), y = the top bit
//            of x[i] with the low 31 bits of x[i+1] (indices mod 624, updated in place)
//   draw:    the next word, tempered (shifts 11, 7, 15, 18 with masks 9D2C5680, EFC60000)
//   shuffle: for i = n-1 down to 1, swap a[i] and a[draw % (i+1)]: n-1 draws (llm.c's random_permutation)
//
// The first draws after seeding with 5489 are 3499211612, 581869302, 3890346734 (the reference values).
#ifndef LLMC_MT19937_H
#define LLMC_MT19937_H

#include <stdint.h>

#define MT19937_N 624
#define MT19937_M 397

typedef struct {
    uint32_t x[MT19937_N];
    int next;   // index of the next word to temper; MT19937_N: twist first
} Mt19937;

static void mt19937_seed(Mt19937 *g, uint32_t seed) {
    g->x[0] = seed;
    for (uint32_t i = 1; i < MT19937_N; i++) { g->x[i] = 1812433253u * (g->x[i - 1] ^ (g->x[i - 1] >> 30)) + i; }
    g->next = MT19937_N;
}

static void mt19937_twist(Mt19937 *g) {
    for (int i = 0; i < MT19937_N; i++) {
        uint32_t y = (g->x[i] & 0x80000000u) | (g->x[(i + 1) % MT19937_N] & 0x7FFFFFFFu);
        g->x[i] = g->x[(i + MT19937_M) % MT19937_N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908B0DFu : 0u);
    }
    g->next = 0;
}

static uint32_t mt19937_u32(Mt19937 *g) {
    if (g->next >= MT19937_N) { mt19937_twist(g); }
    uint32_t y = g->x[g->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9D2C5680u;
    y ^= (y << 15) & 0xEFC60000u;
    y ^= y >> 18;
    return y;
}

// Shuffles a[0..n) in place with n-1 draws (Fisher-Yates from the top, as llm.c).
static void mt19937_shuffle(int *a, int n, Mt19937 *g) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(mt19937_u32(g) % (uint32_t)(i + 1));
        int t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

// Advances the generator as a shuffle of n elements would, without the array.
static void mt19937_skip_shuffle(Mt19937 *g, int n) {
    for (int i = n - 1; i > 0; i--) { (void)mt19937_u32(g); }
}

#endif
