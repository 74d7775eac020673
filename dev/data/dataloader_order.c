// Prints the batches llmc/dataloader.h serves one data-parallel rank, one line per batch, in the
// format of dev/data/shuffle_ref.py: "FILE_INDEX OFFSET FIRST_INPUT LAST_TARGET SUM_INPUTS", so
// scripts/test_data.sh can compare the two. FILE_INDEX and OFFSET are found from the tokens (the
// batch's B*T+1 tokens are searched for in the shards), not read from the loader's own state.
// Then it checks resume: from every 5th position of the run, a fresh loader seeks there
// (dataloader_seek, as a checkpoint does) and must serve the same remaining batches; it prints
// "seek ok N" (N positions checked) or "seek FAIL ...".
//
//   g++ -x c++ -O2 -DNO_MPI -I. dev/data/dataloader_order.c -o dataloader_order
//   ./dataloader_order 'shard_*.bin' B T DP RANK SHUFFLE SEED NBATCHES
#include <stdio.h>
#include <stdlib.h>
#include "llmc/dataloader.h"

#define VOCAB (1 << 20)   // the largest V a model file may have: uint32 shards' tokens up to 2^20 - 1 pass

typedef struct { int epoch, shard_pos, round; } Pos;

// sum of inputs, first input and last target identify a batch well enough with random tokens;
// the file and offset come from a search of the shards for the batch's tokens
static void locate(const DataLoader *d, int **shards, size_t *ntok, int nshards, int *file, long *offset) {
    int BT = d->B * d->T;
    *file = -1; *offset = -1;
    for (int f = 0; f < nshards; f++) {
        for (size_t o = 0; o + BT < ntok[f]; o++) {
            if (shards[f][o] != d->inputs[0] || shards[f][o + BT] != d->targets[BT - 1]) { continue; }
            int same = 1;
            for (int i = 0; i < BT && same; i++) { same = shards[f][o + i] == d->inputs[i] && shards[f][o + i + 1] == d->targets[i]; }
            if (same) { *file = f; *offset = (long)o; return; }
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 9) { fprintf(stderr, "usage: %s PATTERN B T DP RANK SHUFFLE SEED NBATCHES\n", argv[0]); return 2; }
    const char *pattern = argv[1];
    int B = atoi(argv[2]), T = atoi(argv[3]), dp = atoi(argv[4]), rank = atoi(argv[5]), shuffle = atoi(argv[6]);
    uint64_t seed = (uint64_t)strtoull(argv[7], NULL, 10);
    int n = atoi(argv[8]);
    DataLoader d;
    dataloader_init(&d, pattern, B, T, VOCAB, dp, rank, shuffle, seed);
    int nshards = d.nshards;
    int **shards = (int **)malloc_check(sizeof(int *) * nshards);   // every shard's tokens, widened
    size_t *ntok = (size_t *)malloc_check(sizeof(size_t) * nshards);
    for (int f = 0; f < nshards; f++) {
        int width;
        uint8_t *raw = data_shard_read(d.files.gl_pathv[f], &ntok[f], &width);
        shards[f] = (int *)malloc_check(ntok[f] * sizeof(int));
        for (size_t i = 0; i < ntok[f]; i++) { shards[f][i] = (int)shard_token(raw, width, i); }
        free(raw);
    }
    int BT = B * T;
    long *sums = (long *)malloc_check(sizeof(long) * n);
    Pos *pos = (Pos *)malloc_check(sizeof(Pos) * n);
    for (int k = 0; k < n; k++) {
        pos[k].epoch = d.epoch; pos[k].shard_pos = d.shard_pos; pos[k].round = d.round;   // before batch k
        dataloader_next_batch(&d);
        long sum = 0;
        for (int i = 0; i < BT; i++) { sum += d.inputs[i]; }
        sums[k] = sum + 1000003L * d.targets[BT - 1];
        int file; long offset;
        locate(&d, shards, ntok, nshards, &file, &offset);
        printf("%d %ld %d %d %ld\n", file, offset, d.inputs[0], d.targets[BT - 1], sum);
    }
    int checked = 0, bad = 0;
    for (int k = 0; k < n && !bad; k += 5) {
        DataLoader e;
        dataloader_init(&e, pattern, B, T, VOCAB, dp, rank, shuffle, seed);
        dataloader_seek(&e, pos[k].epoch, pos[k].shard_pos, pos[k].round);
        for (int j = k; j < n && !bad; j++) {
            dataloader_next_batch(&e);
            long sum = 0;
            for (int i = 0; i < BT; i++) { sum += e.inputs[i]; }
            if (sum + 1000003L * e.targets[BT - 1] != sums[j]) {
                printf("seek FAIL: after seeking to batch %d (epoch %d shard %d round %d), batch %d differs\n",
                       k, pos[k].epoch, pos[k].shard_pos, pos[k].round, j);
                bad = 1;
            }
        }
        dataloader_free(&e);
        checked++;
    }
    if (!bad) { printf("seek ok %d\n", checked); }
    dataloader_free(&d);
    for (int f = 0; f < nshards; f++) { free(shards[f]); }
    free(shards); free(ntok); free(sums); free(pos);
    return bad;
}
