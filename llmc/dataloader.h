// Token shards in llm.c's two formats: int32 header[256] ([0] magic, [1] version, [2] = ntok), then ntok
// tokens, uint16 (magic 20240520, version 1: GPT-2's vocabulary) or uint32 (magic 20240801, version 7:
// vocabularies past 65,536, Llama 3's 128,256). Each shard's header says its format, so the shards of one
// run may mix the two: the tokens are the same ints once read, and each is checked against the model's V.
// A batch is B*T+1 consecutive tokens: inputs are the first B*T, targets the last B*T. The data order is
// llm.c's, with and without shuffling:
//  - a shard holds nrounds = (ntok-1) / (dp*B*T) rounds (llm.c's "samples"): round k covers the
//    tokens from k*dp*B*T on, and data-parallel rank r reads its B*T (+1) slice at offset r*B*T
//    (the B*T-token sample k*dp + r);
//  - without shuffling the shards go in glob order and the rounds in order;
//  - with shuffling each dp rank runs its own MT19937 (mt19937.h) seeded with 42 + dp_rank +
//    (seed - 1337): llm.c's 42 + rank at the default --seed 1337 (tp and pp ranks of one dp position
//    draw the same). The draws, in llm.c's order: at the start of every epoch a shuffle of the shard
//    order (of the previous epoch's order, not of the identity); then, as each shard is entered, a
//    shuffle of the identity over its rounds. Shuffling n items takes n-1 draws.
// A position is (epoch, shard_pos, round); dataloader_seek replays the generator from its seed through
// the earlier epochs and shards (a few draws per round), so a resumed run reads exactly the batches an
// uninterrupted one would. A checkpoint stores only the step: dataloader_seek_rounds finds the position.
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <glob.h>
#include "utils.h"
#include "guard.h"
#include "mt19937.h"
#include "rand.h"
#include "comm.h"
#include "grid.h"
#include "tokenizer.h"

// The two shard formats: the header's magic and version, and the bytes of a token.
typedef struct { int magic, version, width; } ShardFormat;
static const ShardFormat SHARD_FORMATS[2] = {{20240520, 1, 2}, {20240801, 7, 4}};
#define SHARD_FORMATS_TEXT "20240520 version 1 (uint16 tokens) or 20240801 version 7 (uint32 tokens)"

typedef struct {
    int dp, dp_rank;
    int B, T, vocab_size;
    int shuffle;
    uint64_t seed;
    glob_t files;
    int nshards;
    int *shard_rounds;              // (nshards) rounds of each file, in glob order
    // position
    int epoch, shard_pos, round;    // shard_pos indexes shard_order
    int *shard_order;               // (nshards) this epoch's file order
    int loaded_shard;               // file index currently in memory, -1 none
    uint8_t *tokens;                // (ntok * width) the loaded shard's tokens as in its file
    int width;                      // of the loaded shard: bytes per token, 2 (uint16) or 4 (uint32)
    size_t ntok, nrounds;           // of the loaded shard; a round = one batch for every dp rank
    size_t rounds_per_epoch;        // over all shards
    int *sample_order;              // (nrounds) the shard's round order
    Mt19937 rng;                    // the shuffle generator, in step with the position
    int *inputs, *targets;          // host (B*T)
    int in_memory;                  // one shard given as an array (the built-in synthetic corpus)
    uint32_t fingerprint;           // what the data is (dataloader_fingerprint)
} DataLoader;

// Token i of tokens stored `width` bytes each (2 or 4), widened.
static inline uint32_t shard_token(const uint8_t *tokens, int width, size_t i) {
    return width == 2 ? ((const uint16_t *)tokens)[i] : ((const uint32_t *)tokens)[i];
}

// Bytes per token of the format a shard's header names; any other header is refused.
static int data_shard_width(const char *path, const int *header) {
    int magic_known = 0;
    for (int i = 0; i < 2; i++) {
        if (header[0] != SHARD_FORMATS[i].magic) { continue; }
        if (header[1] == SHARD_FORMATS[i].version) { return SHARD_FORMATS[i].width; }
        magic_known = 1;
    }
    if (magic_known) {
        fail("data shard '%s' (magic %d) has version %d, expected " SHARD_FORMATS_TEXT, path, header[0], header[1]);
    }
    fail("data shard '%s' has bad magic %d, expected " SHARD_FORMATS_TEXT, path, header[0]);
    return 0;
}

// Reads a shard header: checks its format, and that the file holds exactly ntok tokens of its width.
// Returns ntok; *width = bytes per token.
static size_t data_shard_ntok(const char *path, int *width) {
    FILE *f = fopen_check(path, "rb");
    int header[256];
    if (fread(header, sizeof(int), 256, f) != 256) {
        fail("data shard '%s' is truncated: expected a 1024-byte header", path);
    }
    *width = data_shard_width(path, header);
    long expected = 1024 + (long)*width * (long)(unsigned)header[2];
    long size = file_size(f);
    fclose(f);
    if (size != expected) {
        fail("data shard '%s' is %ld bytes, expected %ld for %u %s tokens (truncated or corrupt)", path, size,
             expected, (unsigned)header[2], *width == 2 ? "uint16" : "uint32");
    }
    return (size_t)(unsigned)header[2];
}

// A shard's tokens as in its file ((ntok * width) bytes, malloc'd); *ntok, *width as data_shard_ntok's.
static uint8_t *data_shard_read(const char *path, size_t *ntok, int *width) {
    *ntok = data_shard_ntok(path, width);
    uint8_t *tokens = (uint8_t *)malloc_check(*ntok * *width);
    FILE *f = fopen_check(path, "rb");
    fseek(f, 1024, SEEK_SET);
    fread_check(tokens, *width, *ntok, f, path);
    fclose(f);
    return tokens;
}

// llm.c seeds rank r with 42 + r; --seed moves every rank's seed by the same amount.
static uint32_t dataloader_shuffle_seed(const DataLoader *d) {
    return (uint32_t)(42u + (uint32_t)d->dp_rank + ((uint32_t)d->seed - 1337u));
}

// Loads file `file` (validating every token id) unless it is the one in memory.
static void dataloader_load_shard(DataLoader *d, int file) {
    if (file == d->loaded_shard) { return; }
    const char *path = d->files.gl_pathv[file];
    free(d->tokens);
    d->tokens = data_shard_read(path, &d->ntok, &d->width);
    for (size_t i = 0; i < d->ntok; i++) {
        uint32_t t = shard_token(d->tokens, d->width, i);
        if (t >= (uint32_t)d->vocab_size) {
            fail("data shard '%s': token %u at position %zu is not below the model's vocab size %d", path, t, i,
                 d->vocab_size);
        }
    }
    d->loaded_shard = file;
}

// Enters shard position shard_pos: loads its file and draws its round order (llm.c: the shard is
// loaded, then its rounds shuffled).
static void dataloader_enter_shard(DataLoader *d) {
    int file = d->shard_order[d->shard_pos];
    dataloader_load_shard(d, file);
    d->nrounds = (size_t)d->shard_rounds[file];
    free(d->sample_order);
    d->sample_order = (int *)malloc_check(sizeof(int) * d->nrounds);
    for (size_t i = 0; i < d->nrounds; i++) { d->sample_order[i] = (int)i; }
    if (d->shuffle) { mt19937_shuffle(d->sample_order, (int)d->nrounds, &d->rng); }
}

// Start of an epoch: llm.c shuffles the shard order it already has.
static void dataloader_start_epoch(DataLoader *d) {
    if (d->shuffle) { mt19937_shuffle(d->shard_order, d->nshards, &d->rng); }
}

// Moves to a given position (used by reset and by resume): replays the draws of every epoch and
// shard before it from the seed, then enters the shard.
static void dataloader_seek(DataLoader *d, int epoch, int shard_pos, int round) {
    if (epoch < 0 || shard_pos < 0 || shard_pos >= d->nshards || round < 0) {
        fail("data position epoch %d shard %d round %d is out of range (%d shards)", epoch, shard_pos, round,
             d->nshards);
    }
    mt19937_seed(&d->rng, dataloader_shuffle_seed(d));
    for (int i = 0; i < d->nshards; i++) { d->shard_order[i] = i; }
    for (int e = 0; e <= epoch && d->shuffle; e++) {
        dataloader_start_epoch(d);
        int passed = e < epoch ? d->nshards : shard_pos;   // shards read before the position
        for (int p = 0; p < passed; p++) { mt19937_skip_shuffle(&d->rng, d->shard_rounds[d->shard_order[p]]); }
    }
    d->epoch = epoch; d->shard_pos = shard_pos; d->round = round;
    dataloader_enter_shard(d);
    if ((size_t)round > d->nrounds) {
        fail("data position round %d is past the %zu rounds of shard %d (a checkpoint of other data?)", round,
             d->nrounds, shard_pos);
    }
}

static void dataloader_reset(DataLoader *d) { dataloader_seek(d, 0, 0, 0); }

// The position after n rounds read from the start (a checkpoint's: step x accumulation rounds per
// step). Derived from the count alone, it is the position an uninterrupted run of THIS layout (B, dp)
// would have, so a checkpoint resumes in another layout as if that layout had run from the start;
// with shuffling each dp rank walks its own shard order, as llm.c's ranks do.
static void dataloader_seek_rounds(DataLoader *d, uint64_t n) {
    uint64_t per_epoch = d->rounds_per_epoch;
    if (per_epoch == 0) { fail("the data has no complete batch"); }
    if (n / per_epoch > 1000000) {
        fail("data position: %llu rounds is over a million epochs of this data", (unsigned long long)n);
    }
    int epoch = (int)(n / per_epoch), pos = 0;
    uint64_t rem = n % per_epoch;
    dataloader_seek(d, epoch, 0, 0);   // this epoch's shard order
    while (rem >= (uint64_t)d->shard_rounds[d->shard_order[pos]]) {
        rem -= d->shard_rounds[d->shard_order[pos]];
        pos++;
    }
    dataloader_seek(d, epoch, pos, (int)rem);
}

static void dataloader_alloc(DataLoader *d) {
    d->shard_order = (int *)malloc_check(sizeof(int) * d->nshards);
    d->shard_rounds = (int *)malloc_check(sizeof(int) * d->nshards);
    d->inputs = (int *)malloc_check(sizeof(int) * d->B * d->T);
    d->targets = (int *)malloc_check(sizeof(int) * d->B * d->T);
    d->loaded_shard = -1;
}

// What the data is, to compare the ranks' and a resume's with its checkpoint's: the CRC-32 of every shard's
// file name (without its directory: the data may move), token count and first 4096 tokens (their bytes in the
// file, 2 or 4 a token: a shard rewritten in the other format is other data to a resume), in glob order; of the
// built-in corpus, its first 4096 tokens. Independent of the layout.
#define FINGERPRINT_TOKENS 4096
static uint32_t dataloader_fingerprint(const DataLoader *d) {
    uint8_t first[4 * FINGERPRINT_TOKENS];
    if (d->in_memory) {
        size_t n = d->ntok < FINGERPRINT_TOKENS ? d->ntok : FINGERPRINT_TOKENS;
        return crc_end(crc32_update(0, d->tokens, d->width * n));
    }
    uint32_t crc = 0;
    for (int i = 0; i < d->nshards; i++) {
        const char *path = d->files.gl_pathv[i], *name = strrchr(path, '/');
        name = name ? name + 1 : path;
        FILE *f = fopen_check(path, "rb");
        int header[256];
        fread_check(header, sizeof(int), 256, f, path);
        int width = data_shard_width(path, header);
        size_t n = fread(first, width, FINGERPRINT_TOKENS, f);
        fclose(f);
        crc = crc32_update(crc32_update(crc32_update(crc, name, strlen(name)), &header[2], sizeof(int)), first, width * n);
    }
    return crc_end(crc);
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
    dataloader_alloc(d);
    size_t need = (size_t)dp * B * T + 1;
    for (int i = 0; i < d->nshards; i++) {
        int width;
        size_t ntok = data_shard_ntok(d->files.gl_pathv[i], &width);
        if (ntok < need) {
            fail("data shard '%s' has %zu tokens, fewer than one batch for every data-parallel rank (dp*B*T+1 = %zu)",
                 d->files.gl_pathv[i], ntok, need);
        }
        size_t rounds = (ntok - 1) / ((size_t)dp * B * T);
        if (rounds > 0x7FFFFFFF) { fail("data shard '%s' has too many batches (%zu)", d->files.gl_pathv[i], rounds); }
        d->shard_rounds[i] = (int)rounds;
        d->rounds_per_epoch += rounds;
    }
    d->fingerprint = dataloader_fingerprint(d);
    dataloader_reset(d);
}

// One in-memory shard (the tokens are copied and checked like a file's), never shuffled.
static void dataloader_init_memory(DataLoader *d, const uint16_t *tokens, size_t ntok, int B, int T, int vocab_size,
                                   int dp, int dp_rank, uint64_t seed) {
    memset(d, 0, sizeof(*d));
    d->B = B; d->T = T; d->vocab_size = vocab_size; d->dp = dp; d->dp_rank = dp_rank; d->seed = seed;
    d->in_memory = 1;
    d->nshards = 1;
    if (ntok < (size_t)dp * B * T + 1) {
        fail("built-in corpus has %zu tokens, fewer than dp*B*T+1 = %zu", ntok, (size_t)dp * B * T + 1);
    }
    dataloader_alloc(d);
    d->tokens = (uint8_t *)malloc_check(ntok * sizeof(uint16_t));
    d->width = 2;
    memcpy(d->tokens, tokens, ntok * sizeof(uint16_t));
    for (size_t i = 0; i < ntok; i++) {
        if (tokens[i] >= vocab_size) {
            fail("built-in corpus: token %d at position %zu is not below the vocab size %d", tokens[i], i, vocab_size);
        }
    }
    d->ntok = ntok;
    d->loaded_shard = 0;
    d->shard_rounds[0] = (int)((ntok - 1) / ((size_t)dp * B * T));
    d->rounds_per_epoch = (size_t)d->shard_rounds[0];
    d->fingerprint = dataloader_fingerprint(d);
    dataloader_reset(d);
}

// Fills inputs/targets (B*T each) with this rank's next batch.
static void dataloader_next_batch(DataLoader *d) {
    if ((size_t)d->round >= d->nrounds) {
        d->round = 0;
        d->shard_pos++;
        if (d->shard_pos == d->nshards) { d->shard_pos = 0; d->epoch++; dataloader_start_epoch(d); }
        dataloader_enter_shard(d);
    }
    size_t sample = (size_t)d->sample_order[d->round] * d->dp + d->dp_rank;
    size_t start = sample * d->B * d->T;
    for (int i = 0; i < d->B * d->T; i++) {
        d->inputs[i] = (int)shard_token(d->tokens, d->width, start + i);   // (each below V: checked at load)
        d->targets[i] = (int)shard_token(d->tokens, d->width, start + i + 1);
    }
    d->round++;
}

static void dataloader_free(DataLoader *d) {
    if (!d->in_memory) { globfree(&d->files); }
    free(d->shard_order);
    free(d->shard_rounds);
    free(d->tokens);
    free(d->sample_order);
    free(d->inputs);
    free(d->targets);
}

// ----------------------------------------------------------------------------
// the built-in corpus: a seeded Markov chain, so that ./train_gpt works with no data files

// From each of S symbols, 4 successors with probabilities 1/2, 1/4, 1/8, 1/8. Returns the entropy
// rate in nats per token: the lowest loss a model can reach on it.
static double synthetic_corpus(uint16_t *tokens, size_t n, int vocab_size, uint64_t seed) {
    int S = vocab_size < 256 ? vocab_size : 256;
    static const double prob[4] = {0.5, 0.25, 0.125, 0.125};
    int *succ = (int *)malloc_check(sizeof(int) * 4 * S);
    Rng rng;
    rng_init(&rng, 12345);                       // the chain itself is fixed
    for (int i = 0; i < 4 * S; i++) { succ[i] = (int)(rng_u32(&rng) % S); }
    rng_init(&rng, seed);
    int cur = 0;
    for (size_t i = 0; i < n; i++) {
        tokens[i] = (uint16_t)cur;
        float u = rng_f32(&rng);
        int k = u < 0.5f ? 0 : (u < 0.75f ? 1 : (u < 0.875f ? 2 : 3));
        cur = succ[4 * cur + k];
    }
    free(succ);
    double h = 0.0;
    for (int k = 0; k < 4; k++) { h -= prob[k] * log(prob[k]); }
    return h;
}

// The built-in corpus as a run's train and val loaders (B, T, vocab, the dp position, seed): enough tokens for
// four steps of every dp rank, or 32768 (train) and 8192 (val). say: rank 0 prints what it is.
static void dataloader_init_builtin(DataLoader *train, DataLoader *val, int B, int T, int vocab, int dp, int dp_rank,
                                    unsigned seed, int say) {
    size_t need = (size_t)dp * B * T + 1;
    size_t n_train = need * 4 > 32768 ? need * 4 : 32768, n_val = need > 8192 ? need : 8192;
    uint16_t *corpus = (uint16_t *)malloc_check((n_train + n_val) * sizeof(uint16_t));
    double h = synthetic_corpus(corpus, n_train + n_val, vocab, seed);
    if (say) {
        printf("data: no -i, built-in synthetic corpus (Markov chain, %zu train + %zu val tokens), entropy rate %.4f "
               "nats/token = the loss floor\n",
               n_train, n_val, h);
    }
    dataloader_init_memory(train, corpus, n_train, B, T, vocab, dp, dp_rank, seed);
    dataloader_init_memory(val, corpus + n_train, n_val, B, T, vocab, dp, dp_rank, seed);
    free(corpus);
}

// ----------------------------------------------------------------------------
// the run's data from its flags

// The run's data (micro-batches of B x T tokens of a model of vocabulary V, on this grid): the train and validation
// loaders: the -i / -j shards (and tokenizer.bin beside the train shards, for decoding samples), or the built-in
// corpus; -x 0 with -j alone evaluates on -j (its shards stand in for the train data, never read). shuffle, seed:
// --shuffle, --seed. Returns whether there is validation data.
static int data_setup(const char *train_glob, const char *val_glob, int shuffle, unsigned seed, int B, int T, int V,
                      Grid *grid, DataLoader *train, DataLoader *val, Tokenizer *tok) {
    memset(tok, 0, sizeof(*tok));
    if (train_glob == NULL && val_glob == NULL) {
        dataloader_init_builtin(train, val, B, T, V, grid->dp, grid->dp_rank, seed, grid->rank == 0);
        return 1;
    }
    const char *train_pattern = train_glob ? train_glob : val_glob;
    dataloader_init(train, train_pattern, B, T, V, grid->dp, grid->dp_rank, shuffle, seed);
    if (val_glob) { dataloader_init(val, val_glob, B, T, V, grid->dp, grid->dp_rank, 0, seed); }
    tokenizer_init_beside(tok, train->files.gl_pathv[0], V, grid->rank == 0);
    return val_glob != NULL;
}

#endif
