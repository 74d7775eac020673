// How the L layers are cut over the pipeline's stages (--pp-layers), in one place: an even split, the counts given,
// "auto" (balanced under a model of each layer's FLOPs), or "auto:FILE" (balanced under the seconds a run measured,
// the file that --comm-report writes with a pipeline: stage_costs.h's pipeline_costs_report writes it,
// read_pipeline_costs reads it). pipeline.h runs the schedules over the stages this file cuts.
#ifndef LLMC_PIPELINE_SPLIT_H
#define LLMC_PIPELINE_SPLIT_H

#include "utils.h"
#include "model_config.h"

// How the L layers are cut: first[s] is the first layer of virtual stage s (s = v*pp + rank, 0 .. n-1 for
// n = pp*vpp; without --vpp the stages themselves) and first[n] = L. Each virtual stage holds at least
// one layer. Three ways to choose it (--pp-layers): an even split, the first L % n stages one more (the
// default); the counts given, "5,7" (in virtual-stage order); or "auto" (pipe_split_balanced).
#define PIPE_MAX_LAYERS 1024   // (the model file's limit on L)
static void pipe_split_even(int *first, int L, int n) {
    for (int s = 0; s <= n; s++) { first[s] = s * (L / n) + (s < L % n ? s : L % n); }
}

// "a,b,..." -> first (n counts, each >= 1, summing to L). Returns 1 with the reason in err otherwise.
static int pipe_split_parse(int *first, const char *spec, int L, int n, char *err, size_t errlen) {
    const char *p = spec;
    first[0] = 0;
    for (int s = 0; s < n; s++) {
        char *end;
        long k = strtol(p, &end, 10);
        if (end == p || k < 1 || k > L || (*end != ',' && *end != '\0') || (*end == ',' && s == n - 1)
            || (*end == '\0' && s < n - 1)) {
            snprintf(err, errlen,
                     "--pp-layers '%s': expected %d layer counts (pp x vpp), each >= 1, separated by commas, "
                     "summing to the %d layers", spec, n, L);
            return 1;
        }
        first[s + 1] = first[s] + (int)k;
        p = end + 1;
    }
    if (first[n] != L) {
        snprintf(err, errlen, "--pp-layers '%s': the counts sum to %d, the model has %d layers", spec, first[n], L);
        return 1;
    }
    return 0;
}

// The split whose costliest virtual stage costs least: cost[l] the work of layer l, plus `head` on the last
// stage (final LayerNorm, LM head, loss) and `embed` on the first, all in one unit (FLOPs per token).
// Exact, by dynamic programming over (stages, layers); among equal splits the one with the earliest cuts.
static void pipe_split_balanced(int *first, const double *cost, double embed, double head, int L, int n) {
    double *prefix = (double *)malloc_check((L + 1) * sizeof(double));
    // best[s][j]: the least costliest stage of layers [0, j) in s stages; cut[s][j]: where its last stage starts
    double *best = (double *)malloc_check((size_t)(n + 1) * (L + 1) * sizeof(double));
    int *cut = (int *)malloc_check((size_t)(n + 1) * (L + 1) * sizeof(int));
    prefix[0] = 0.0;
    for (int l = 0; l < L; l++) { prefix[l + 1] = prefix[l] + cost[l]; }
    for (int s = 1; s <= n; s++) {
        for (int j = s; j <= L - (n - s); j++) {   // leave at least one layer for each later stage
            double b = INFINITY;
            int at = s - 1;
            for (int i = s - 1; i < j; i++) {   // stage s-1 holds layers [i, j)
                double w = prefix[j] - prefix[i] + (s == 1 ? embed : 0.0) + (s == n ? head : 0.0);
                double prev = s == 1 ? (i == 0 ? 0.0 : INFINITY) : best[(size_t)(s - 1) * (L + 1) + i];
                double m = prev > w ? prev : w;
                if (m < b) { b = m; at = i; }
            }
            best[(size_t)s * (L + 1) + j] = b;
            cut[(size_t)s * (L + 1) + j] = at;
        }
    }
    first[n] = L;
    for (int s = n; s >= 1; s--) { first[s - 1] = cut[(size_t)s * (L + 1) + first[s]]; }
    free(prefix); free(best); free(cut);
}

// The layers [l0, l1) of rank `rank`'s model chunk v (of vpp per rank): virtual stage v*pp + rank.
static void chunk_layers(const int *first, int pp, int rank, int v, int *l0, int *l1) {
    *l0 = first[v * pp + rank];
    *l1 = first[v * pp + rank + 1];
}

// A line's whitespace-separated words (at most n; the rest: one more, so a caller sees there were more).
static int line_words(char *line, char **w, int n) {
    int k = 0;
    for (char *t = strtok(line, " \t\r\n"); t && k <= n; t = strtok(NULL, " \t\r\n")) { w[k++] = t; }
    return k;
}

// A word that is a whole number (nothing after it), or a finite number in [lo, hi].
static int word_int(const char *s, long *v) {
    char *end;
    errno = 0;
    *v = strtol(s, &end, 10);
    return end != s && *end == '\0' && errno == 0;
}
static int word_number(const char *s, double lo, double hi, double *v) {
    char *end;
    *v = strtod(s, &end);
    return end != s && *end == '\0' && isfinite(*v) && *v >= lo && *v <= hi;
}

// Measured costs for --pp-layers auto:FILE: what train_gpt --comm-report wrote to -o/pipeline_costs.txt, seconds per
// micro-batch (forward and backward) of each layer, the embedding and the head, measured on some layout of this
// model. Lines "model L C NH Vp E", "embedding S", "head S", "layer I S" (S: seconds, finite, at most 1e6; a layer's
// and the head's above 0), each once. Returns 1 with the reason in err if the file cannot be read, a line is anything
// else, or it was measured for another model. costs: (L) the layers', then the embedding's and the head's.
static int read_pipeline_costs(const char *path, const ModelConfig *c, double *costs, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) { snprintf(err, errlen, "--pp-layers auto:%s: cannot read the file (%s)", path, strerror(errno)); return 1; }
    int L = c->num_layers, seen_m = 0, nl = 0, bad = 0, n = 0;
    long m[5], want[5] = {L, c->channels, c->num_heads, c->padded_vocab_size, c->num_experts}, i;
    char line[256], copy[256], *w[8];
    for (int l = 0; l < L + 2; l++) { costs[l] = -1; }
    while (!bad && fgets(line, sizeof(line), f)) {
        n++;
        snprintf(copy, sizeof(copy), "%s", line);
        copy[strcspn(copy, "\r\n")] = '\0';
        int k = line_words(line, w, 7);
        double v;
        if (k == 0 || w[0][0] == '#') { continue; }
        if (k == 6 && !strcmp(w[0], "model") && !seen_m) {
            for (int j = 0; j < 5; j++) { bad |= !word_int(w[j + 1], &m[j]); }
            if (!bad && memcmp(m, want, sizeof(m))) {
                snprintf(err, errlen, "--pp-layers auto:%s: measured for L %ld C %ld NH %ld Vp %ld E %ld, this model is L %d "
                         "C %d NH %d Vp %d E %d", path, m[0], m[1], m[2], m[3], m[4], L, c->channels, c->num_heads,
                         c->padded_vocab_size, c->num_experts);
                fclose(f);
                return 1;
            }
            seen_m = 1;
        } else if (k == 2 && !strcmp(w[0], "embedding") && costs[L] < 0 && word_number(w[1], 0, 1e6, &v)) {
            costs[L] = v;
        } else if (k == 2 && !strcmp(w[0], "head") && costs[L + 1] < 0 && word_number(w[1], 1e-30, 1e6, &v)) {
            costs[L + 1] = v;
        } else if (k == 3 && !strcmp(w[0], "layer") && word_int(w[1], &i) && i >= 0 && i < L && costs[i] < 0
                   && word_number(w[2], 1e-30, 1e6, &v)) {
            costs[i] = v;
            nl++;
        } else {
            bad = 1;
        }
    }
    fclose(f);
    if (bad || costs[L] < 0 || costs[L + 1] < 0 || nl != L || !seen_m) {
        char where[300] = "";
        if (bad) { snprintf(where, sizeof(where), " (line %d: '%.60s')", n, copy); }
        snprintf(err, errlen, "--pp-layers auto:%s: expected the lines 'model L C NH Vp E', 'embedding S', 'head S' and "
                 "'layer I S' for each of the %d layers, each once, S finite seconds (train_gpt --comm-report writes them to "
                 "-o/pipeline_costs.txt)%s", path, L, where);
        return 1;
    }
    return 0;
}

// The first layer of each of the pp x vpp (virtual) stages and L at the end (pipeline.h), as --pp-layers
// says: NULL an even split, "auto" the balanced one under layer_flops_per_token at sequence length T
// (the embedding counted as nothing, the head as head_flops_per_token), "auto:FILE" the balanced one under
// the costs measured in FILE (read_pipeline_costs), else the counts given. Returns 1 with the reason in err.
static int layer_split(int *first, const char *spec, const ModelConfig *c, int T, int pp, int vpp, char *err,
                       size_t errlen) {
    int L = c->num_layers, n = pp * vpp;
    if (n > L) {
        snprintf(err, errlen, "--pp %d x --vpp %d = %d stages, more than the %d layers", pp, vpp, n, L);
        return 1;
    }
    if (spec == NULL) { pipe_split_even(first, L, n); return 0; }
    double cost[PIPE_MAX_LAYERS + 2];
    if (!strncmp(spec, "auto:", 5)) {
        if (read_pipeline_costs(spec + 5, c, cost, err, errlen)) { return 1; }
        pipe_split_balanced(first, cost, cost[L], cost[L + 1], L, n);
        return 0;
    }
    if (strcmp(spec, "auto")) { return pipe_split_parse(first, spec, L, n, err, errlen); }
    for (int l = 0; l < L; l++) { cost[l] = layer_flops_per_token(c, l, T); }
    pipe_split_balanced(first, cost, 0.0, head_flops_per_token(c), L, n);
    return 0;
}

// The layers of each (virtual) stage of the split spec (pp x vpp stages, sequence length T) and what each costs:
// under --pp-layers auto's model, in units of a dense layer (the last stage's includes the LM head), or as measured
// (auto:FILE).
static void print_layer_split(const ModelConfig *c, const char *spec, int T, int pp, int vpp) {
    int first[PIPE_MAX_LAYERS + 1], n = pp * vpp;
    char err[256];
    if (layer_split(first, spec, c, T, pp, vpp, err, sizeof(err))) { fail("%s", err); }
    ModelConfig dense = *c;
    dense.num_experts = 0;
    double unit = layer_flops_per_token(&dense, 0, T);
    printf("pipeline stages%s (%s): layers", vpp > 1 ? " (virtual, v*pp + rank)" : "", spec ? spec : "even");
    for (int s = 0; s < n; s++) { printf("%s%d", s ? "," : " ", first[s + 1] - first[s]); }
    double measured[PIPE_MAX_LAYERS + 2];
    if (spec && !strncmp(spec, "auto:", 5)) {   // (layer_split read it: it reads)
        read_pipeline_costs(spec + 5, c, measured, err, sizeof(err));
        printf("; measured cost per micro-batch (ms)");
        for (int s = 0; s < n; s++) {
            double w = (s == 0 ? measured[c->num_layers] : 0.0) + (s == n - 1 ? measured[c->num_layers + 1] : 0.0);
            for (int l = first[s]; l < first[s + 1]; l++) { w += measured[l]; }
            printf("%s%.1f", s ? "," : " ", w * 1e3);
        }
        printf("\n");
        return;
    }
    printf("; cost in dense layers");
    for (int s = 0; s < n; s++) {
        double w = s == n - 1 ? head_flops_per_token(c) : 0.0;
        for (int l = first[s]; l < first[s + 1]; l++) { w += layer_flops_per_token(c, l, T); }
        printf("%s%.2f", s ? "," : " ", w / unit);
    }
    printf(" (6 FLOPs per parameter and token, 6 C T attention; the head 6 C Vp)\n");
}

#endif // LLMC_PIPELINE_SPLIT_H
