// Token shards in llm.c's format: int32 header[256] (magic 20240520, version 1, [2] = ntok), then
// ntok uint16 tokens. A batch is B*T+1 consecutive tokens: inputs are the first B*T, targets the
// last B*T. Order (without shuffling): sample j of a shard starts at token j*B*T, and data-parallel
// rank r takes sample k*dp + r at its k-th read, exactly as llm.c. With shuffling, the shard order
// and the sample order inside each shard are permuted per epoch by a seeded generator; every rank
// computes the same permutation and takes its interleaved samples from it.
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <glob.h>
#include "utils.h"
#include "rand.h"

#define DATA_MAGIC 20240520

typedef struct {
    int dp, dp_rank;
    int B, T, vocab_size;
    int shuffle;
    uint64_t seed;
    glob_t files;
    int nshards;
    // position
    int epoch, shard_pos, round;    // shard_pos indexes shard_order
    int *shard_order;               // (nshards)
    int loaded_shard;               // file index currently in memory, -1 none
    uint16_t *tokens;
    size_t ntok, nsamples, nrounds;   // of the loaded shard; a round = one batch for every dp rank
    size_t rounds_per_epoch;          // over all shards
    int *sample_order;              // (nsamples)
    int *inputs, *targets;          // host (B*T)
    int in_memory;                  // one shard given as an array (the built-in synthetic corpus)
} DataLoader;

// Reads a shard header; checks magic, version, and that the file holds exactly ntok tokens.
static size_t data_shard_ntok(const char *path) {
    FILE *f = fopen_check(path, "rb");
    int header[256];
    if (fread(header, sizeof(int), 256, f) != 256) { fail("data shard '%s' is truncated: expected a 1024-byte header", path); }
    if (header[0] != DATA_MAGIC) { fail("data shard '%s' has bad magic %d, expected %d", path, header[0], DATA_MAGIC); }
    if (header[1] != 1) { fail("data shard '%s' has version %d, expected 1", path, header[1]); }
    long expected = 1024 + 2L * (long)(unsigned)header[2];
    long size = file_size(f);
    fclose(f);
    if (size != expected) {
        fail("data shard '%s' is %ld bytes, expected %ld for %d tokens (truncated or corrupt)", path, size, expected, header[2]);
    }
    return (size_t)(unsigned)header[2];
}

static void dataloader_permute(DataLoader *d, int *order, int n, uint64_t salt) {
    for (int i = 0; i < n; i++) { order[i] = i; }
    if (!d->shuffle) { return; }
    Rng rng;
    rng_init(&rng, d->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(d->epoch + 1)) ^ salt);
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_u32(&rng) % (uint32_t)(i + 1));
        int t = order[i]; order[i] = order[j]; order[j] = t;
    }
}

// Loads the shard at shard_order[shard_pos] (validating every token id) and its sample order.
static void dataloader_load_shard(DataLoader *d) {
    int file = d->shard_order[d->shard_pos];
    if (file != d->loaded_shard) {
        const char *path = d->files.gl_pathv[file];
        d->ntok = data_shard_ntok(path);
        free(d->tokens);
        d->tokens = (uint16_t *)malloc_check(d->ntok * sizeof(uint16_t));
        FILE *f = fopen_check(path, "rb");
        fseek(f, 1024, SEEK_SET);
        fread_check(d->tokens, sizeof(uint16_t), d->ntok, f, path);
        fclose(f);
        for (size_t i = 0; i < d->ntok; i++) {
            if (d->tokens[i] >= d->vocab_size) {
                fail("data shard '%s': token %d at position %zu is not below the model's vocab size %d", path, d->tokens[i], i, d->vocab_size);
            }
        }
        d->loaded_shard = file;
        d->nsamples = (d->ntok - 1) / ((size_t)d->B * d->T);
        d->nrounds = d->nsamples / d->dp;
        free(d->sample_order);
        d->sample_order = (int *)malloc_check(sizeof(int) * (d->nsamples + 1));
    }
    dataloader_permute(d, d->sample_order, (int)d->nsamples, 0x51ED27ull * (uint64_t)(file + 1));
}

static void dataloader_init(DataLoader *d, const char *pattern, int B, int T, int vocab_size, int dp, int dp_rank,
                            int shuffle, uint64_t seed) {
    memset(d, 0, sizeof(*d));
    d->B = B; d->T = T; d->vocab_size = vocab_size; d->dp = dp; d->dp_rank = dp_rank; d->seed = seed;
    if (glob(pattern, 0, NULL, &d->files) != 0 || d->files.gl_pathc == 0) {
        fail("no files match the data pattern '%s'", pattern);
    }
    d->nshards = (int)d->files.gl_pathc;
    d->shuffle = shuffle < 0 ? (d->nshards > 1) : shuffle;   // default: shuffle only with several shards
    size_t need = (size_t)dp * B * T + 1;
    for (int i = 0; i < d->nshards; i++) {
        size_t ntok = data_shard_ntok(d->files.gl_pathv[i]);
        if (ntok < need) {
            fail("data shard '%s' has %zu tokens, fewer than one batch for every data-parallel rank (dp*B*T+1 = %zu)",
                 d->files.gl_pathv[i], ntok, need);
        }
        d->rounds_per_epoch += (ntok - 1) / ((size_t)B * T) / dp;
    }
    d->shard_order = (int *)malloc_check(sizeof(int) * d->nshards);
    d->inputs = (int *)malloc_check(sizeof(int) * B * T);
    d->targets = (int *)malloc_check(sizeof(int) * B * T);
    d->loaded_shard = -1;
    d->epoch = 0; d->shard_pos = 0; d->round = 0;
    dataloader_permute(d, d->shard_order, d->nshards, 0);
    dataloader_load_shard(d);
}

// One in-memory shard (the tokens are copied and checked like a file's).
static void dataloader_init_memory(DataLoader *d, const uint16_t *tokens, size_t ntok, int B, int T, int vocab_size,
                                   int dp, int dp_rank, uint64_t seed) {
    memset(d, 0, sizeof(*d));
    d->B = B; d->T = T; d->vocab_size = vocab_size; d->dp = dp; d->dp_rank = dp_rank; d->seed = seed;
    d->in_memory = 1;
    d->nshards = 1;
    if (ntok < (size_t)dp * B * T + 1) { fail("built-in corpus has %zu tokens, fewer than dp*B*T+1 = %zu", ntok, (size_t)dp * B * T + 1); }
    d->shard_order = (int *)malloc_check(sizeof(int));
    d->shard_order[0] = 0;
    d->inputs = (int *)malloc_check(sizeof(int) * B * T);
    d->targets = (int *)malloc_check(sizeof(int) * B * T);
    d->tokens = (uint16_t *)malloc_check(ntok * sizeof(uint16_t));
    memcpy(d->tokens, tokens, ntok * sizeof(uint16_t));
    d->ntok = ntok;
    d->nsamples = (ntok - 1) / ((size_t)B * T);
    d->nrounds = d->nsamples / dp;
    d->rounds_per_epoch = d->nrounds;
    d->sample_order = (int *)malloc_check(sizeof(int) * (d->nsamples + 1));
    d->loaded_shard = 0;
    dataloader_load_shard(d);
}

// Moves to a given position (used by reset and by resume).
static void dataloader_seek(DataLoader *d, int epoch, int shard_pos, int round) {
    d->epoch = epoch; d->shard_pos = shard_pos; d->round = round;
    dataloader_permute(d, d->shard_order, d->nshards, 0);
    dataloader_load_shard(d);
}

static void dataloader_reset(DataLoader *d) { dataloader_seek(d, 0, 0, 0); }

// Fills inputs/targets (B*T each) with this rank's next batch.
static void dataloader_next_batch(DataLoader *d) {
    if ((size_t)d->round >= d->nrounds) {
        d->round = 0;
        d->shard_pos++;
        if (d->shard_pos == d->nshards) { d->shard_pos = 0; d->epoch++; dataloader_permute(d, d->shard_order, d->nshards, 0); }
        dataloader_load_shard(d);
    }
    size_t sample = (size_t)d->sample_order[(size_t)d->round * d->dp + d->dp_rank];
    const uint16_t *p = d->tokens + sample * d->B * d->T;
    for (int i = 0; i < d->B * d->T; i++) { d->inputs[i] = p[i]; d->targets[i] = p[i + 1]; }
    d->round++;
}

static void dataloader_free(DataLoader *d) {
    if (!d->in_memory) { globfree(&d->files); }
    free(d->shard_order); free(d->tokens); free(d->sample_order); free(d->inputs); free(d->targets);
}

#endif
