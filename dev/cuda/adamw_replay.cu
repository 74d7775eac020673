// The multi-tensor AdamW launch (llmc/adamw.h: adamw_update_segments) replayed on the CPU: the blocks
// adamw_deal_blocks deals out, each block's segment from adamw_block_segment, and the elements each of
// its threads visits, as adamw_kernel loops over them. Every element of every segment must be visited
// exactly once, with its index within the segment (the rounding seed's index), and no gap element.
// No GPU needed: make -C dev/cuda replay
#include "../../llmc/adamw.h"

static int run(const char *name, AdamWSegments sg, size_t total) {
    device_sm_count = 132;   // an H200's SMs: elementwise_grid caps the blocks per segment at 16 per SM
    unsigned int blocks = adamw_deal_blocks(&sg);
    unsigned char *seen = (unsigned char *)calloc(total, 1);
    size_t bad_index = 0;
    for (unsigned int blk = 0; blk < blocks; blk++) {
        unsigned int b, nb;
        const AdamWSegment *seg = &sg.s[adamw_block_segment(&sg, blk, &b, &nb)];
        for (int tid = 0; tid < ADAMW_THREADS; tid++) {
            for (size_t i = (size_t)b * ADAMW_THREADS + tid; i < seg->len; i += (size_t)nb * ADAMW_THREADS) {
                size_t j = seg->start + i;
                if (j >= total || i != j - seg->start) { bad_index++; continue; }
                seen[j]++;
            }
        }
    }
    size_t missed = 0, twice = 0, gap = 0;
    for (size_t j = 0; j < total; j++) {
        int in_seg = 0;
        for (int k = 0; k < sg.n; k++) { in_seg |= j >= sg.s[k].start && j < sg.s[k].start + sg.s[k].len; }
        if (in_seg) { missed += seen[j] == 0; twice += seen[j] > 1; }
        else { gap += seen[j] != 0; }
    }
    int ok = missed == 0 && twice == 0 && gap == 0 && bad_index == 0;
    printf("%s AdamW segments replayed, %s: %d segments, %u blocks: %zu missed, %zu visited twice, %zu gap elements touched\n",
           ok ? "ok  " : "FAIL", name, sg.n, blocks, missed, twice, gap);
    free(seen);
    return !ok;
}

int main(void) {
    int fails = 0;
    // a GPT-2 124M layer unit's tensors, back to back (ln1 w b, qkv w b, attproj w b, ln2 w b, fc w b, fcproj w b)
    size_t C = 768, sizes[12] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    AdamWSegments layer = {12, {}, {0}};
    size_t o = 0;
    for (int k = 0; k < 12; k++) { layer.s[k] = (AdamWSegment){o, sizes[k], 0.1f, (unsigned)k, o}; o += sizes[k]; }
    fails += run("a 124M layer (12 tensors)", layer, o);
    AdamWSegments gaps = {3, {{5, 1000003, 0.1f, 1u, 5}, {1000010, 77, 0.0f, 2u, 1000010}, {1000100, 3000, 0.1f, 3u, 1000100}}, {0}};
    fails += run("gaps between segments", gaps, 1000100 + 3000 + 100);
    AdamWSegments empty = {3, {{0, 10, 0.1f, 1u, 0}, {10, 0, 0.0f, 2u, 10}, {10, 1, 0.1f, 3u, 10}}, {0}};
    fails += run("an empty segment, a segment of one", empty, 11);
    AdamWSegments one = {1, {{0, 1, 0.1f, 1u, 0}}, {0}};
    fails += run("one element", one, 1);
    return fails != 0;
}
