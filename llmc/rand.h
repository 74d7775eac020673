// A small seeded generator (xorshift64*), the same on every platform: data shuffling, random
// init, sampling. Its whole state is one integer, so checkpoints store it as is.
#ifndef LLMC_RAND_H
#define LLMC_RAND_H

#include <stdint.h>
#include <math.h>

typedef struct { uint64_t s; } Rng;

static void rng_init(Rng *r, uint64_t seed) {
    // splitmix64 of the seed, never zero
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    r->s = z ? z : 1;
}

static uint32_t rng_u32(Rng *r) {
    r->s ^= r->s >> 12; r->s ^= r->s << 25; r->s ^= r->s >> 27;
    return (uint32_t)((r->s * 0x2545F4914F6CDD1Dull) >> 32);
}

// uniform in [0, 1)
static float rng_f32(Rng *r) { return (rng_u32(r) >> 8) / 16777216.0f; }

// normal(mean, std), Box-Muller
static float rng_normal(Rng *r, float mean, float std) {
    float u1 = rng_f32(r), u2 = rng_f32(r);
    if (u1 < 1e-12f) { u1 = 1e-12f; }
    return mean + std * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

#endif
