// HellaSwag in the training loop (--hellaswag FILE): llm.c's eval file (dev/data/hellaswag.py writes it) and how
// its examples become rows of a batch. The evaluation itself, a forward over the rows in any layout, is
// train_gpt.cu's run_hellaswag.
//   the file: int32 header[256] = {20240522, version, examples, the longest example in bytes}, then per example
//   <DELIMITER> <EXAMPLE_BYTES> <INDEX> <LABEL> <4> <CONTEXT_LENGTH> context... then 4 x (<LENGTH> completion...);
//   version 1: uint16 fields, delimiter 65535; version 2 (ours, past 65,535 ids): uint32, delimiter 0xFFFFFFFF.
//   a row: the context, then completion c, as T + 1 tokens at most: when the context and the example's longest
//   completion exceed that, the context is cut from the left, alike in the 4 rows (each completion follows the same
//   context); the inputs are the row's first T tokens, the targets its last T; the mask marks the targets that are
//   completion tokens. The score
//   of a completion is the mean cross-entropy of its tokens; the prediction the lowest score, the first on an exact
//   tie (llm.c's acc_norm).
#ifndef LLMC_HELLASWAG_H
#define LLMC_HELLASWAG_H

#include "utils.h"

#define HS_MAGIC 20240522
#define HS_ENDINGS 4

typedef struct {
    int n;                 // examples
    int *label;            // (n)
    int *ctx, *ctx_len;    // (n) offsets into tok, lengths
    int *end, *end_len;    // (n, 4) offsets into tok, lengths
    int *tok;              // every token
} HellaSwag;

// The eval file's fields after its header (uint16 in version 1, uint32 in version 2, little-endian): *nv of them,
// *w bytes each; *n examples (the header's).
static uint32_t *hs_read_fields(const char *path, size_t *nv, int *w, int *n) {
    FILE *f = fopen_check(path, "rb");
    long size = file_size(f);
    int h[256];
    if (size < 1024 || fread(h, 4, 256, f) != 256) { fail("--hellaswag '%s': %ld bytes, shorter than its 1024-byte header", path, size); }
    if (h[0] != HS_MAGIC || (h[1] != 1 && h[1] != 2)) {
        fail("--hellaswag '%s': magic %d version %d, expected %d version 1 or 2 (dev/data/hellaswag.py's eval file)", path,
             h[0], h[1], HS_MAGIC);
    }
    *w = h[1] == 1 ? 2 : 4;
    *nv = (size_t)(size - 1024) / *w;
    *n = h[2];
    if ((size - 1024) % *w != 0 || h[2] < 1) { fail("--hellaswag '%s': %d examples in %ld bytes: expected whole fields and at least one example", path, h[2], size); }
    uint32_t *v = (uint32_t *)malloc_check(*nv * sizeof(uint32_t) + 1);
    unsigned char *raw = (unsigned char *)malloc_check((size_t)(size - 1024) + 1);
    if (fread(raw, 1, (size_t)(size - 1024), f) != (size_t)(size - 1024)) { fail("--hellaswag '%s': cannot read it", path); }
    fclose(f);
    for (size_t i = 0; i < *nv; i++) {
        v[i] = *w == 2 ? (uint32_t)(raw[2 * i] | raw[2 * i + 1] << 8)
                       : (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 | (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
    }
    free(raw);
    return v;
}

// Example e, whose fields start at v[i]: its label, and its context and completions appended to hs->tok at *nt, each
// field inside the example's own count of bytes. Returns where the next example starts.
static size_t hs_parse_example(HellaSwag *hs, const uint32_t *v, size_t i, size_t nv, int w, int e, int V,
                               const char *path, size_t *nt) {
    uint32_t delim = w == 2 ? 0xFFFFu : 0xFFFFFFFFu;
    if (i + 6 > nv || v[i] != delim) { fail("--hellaswag '%s': example %d does not start with the delimiter %u (truncated?)", path, e, delim); }
    size_t len = v[i + 1] / w, end = i + len;
    if (v[i + 1] % w || len < 6 || end > nv) { fail("--hellaswag '%s': example %d: its byte count %u does not fit the file", path, e, v[i + 1]); }
    if (v[i + 3] >= HS_ENDINGS || v[i + 4] != HS_ENDINGS) {
        fail("--hellaswag '%s': example %d: label %u of %u completions, expected a label below %d of %d", path, e, v[i + 3], v[i + 4],
             HS_ENDINGS, HS_ENDINGS);
    }
    hs->label[e] = (int)v[i + 3];
    size_t j = i + 5;
    for (int part = 0; part <= HS_ENDINGS; part++) {
        size_t n = j < end ? v[j] : 0;
        if (j >= end || n < (part > 0) || j + 1 + n > end) {
            fail("--hellaswag '%s': example %d: its %s's length does not fit its %zu fields", path, e,
                 part ? "completion" : "context", len);
        }
        for (size_t k = j + 1; k <= j + n; k++) {
            if (v[k] >= (uint32_t)V) { fail("--hellaswag '%s': example %d: token %u is not below the model's vocab size %d", path, e, v[k], V); }
            hs->tok[*nt + k - j - 1] = (int)v[k];
        }
        if (part == 0) { hs->ctx[e] = (int)*nt; hs->ctx_len[e] = (int)n; }
        else { hs->end[e * HS_ENDINGS + part - 1] = (int)*nt; hs->end_len[e * HS_ENDINGS + part - 1] = (int)n; }
        *nt += n;
        j += 1 + n;
    }
    if (j != end) { fail("--hellaswag '%s': example %d: %zu fields, its byte count says %zu", path, e, j - i, len); }
    return end;
}

// Reads and checks the file (every field inside its example, every token below V): one error line otherwise.
static void hellaswag_load(HellaSwag *hs, const char *path, int V) {
    size_t nv;
    int w;
    uint32_t *v = hs_read_fields(path, &nv, &w, &hs->n);
    hs->label = (int *)malloc_check(sizeof(int) * hs->n);
    hs->ctx = (int *)malloc_check(sizeof(int) * hs->n);
    hs->ctx_len = (int *)malloc_check(sizeof(int) * hs->n);
    hs->end = (int *)malloc_check(sizeof(int) * hs->n * HS_ENDINGS);
    hs->end_len = (int *)malloc_check(sizeof(int) * hs->n * HS_ENDINGS);
    hs->tok = (int *)malloc_check(sizeof(int) * (nv + 1));
    size_t i = 0, nt = 0;
    for (int e = 0; e < hs->n; e++) { i = hs_parse_example(hs, v, i, nv, w, e, V, path, &nt); }
    if (i != nv) { fail("--hellaswag '%s': %zu fields after its %d examples", path, nv - i, hs->n); }
    free(v);
}

// Row (example e, completion c) of T + 1 tokens at most: rows (T) inputs and targets, mask (T) 1 where the target
// is a completion token, padding 0 after the row (its targets masked). Returns 1 if the example's context is cut.
static int hellaswag_row(const HellaSwag *hs, int e, int c, int T, int *inputs, int *targets, int *mask) {
    int cl = hs->ctx_len[e], el = hs->end_len[e * HS_ENDINGS + c], longest = 0;
    for (int i = 0; i < HS_ENDINGS; i++) { if (hs->end_len[e * HS_ENDINGS + i] > longest) { longest = hs->end_len[e * HS_ENDINGS + i]; } }
    int cut = cl + longest > T + 1 ? cl + longest - T - 1 : 0;   // (the same for the example's 4 rows)
    if (cut > cl) { cut = cl; }   // (a completion longer than the row: no context, its first T + 1 tokens)
    int n = cl - cut + el < T + 1 ? cl - cut + el : T + 1;   // tokens in the row
    const int *ctx = hs->tok + hs->ctx[e] + cut, *end = hs->tok + hs->end[e * HS_ENDINGS + c];
    int keep = cl - cut;
    for (int t = 0; t < T; t++) {
        int a = t < keep ? ctx[t] : t - keep < el ? end[t - keep] : 0;
        int b = t + 1 < keep ? ctx[t + 1] : t + 1 - keep < el ? end[t + 1 - keep] : 0;
        inputs[t] = t < n ? a : 0;
        targets[t] = t + 1 < n ? b : 0;
        mask[t] = t + 1 < n && t + 1 >= keep;
    }
    return cut > 0;
}

#endif // LLMC_HELLASWAG_H
