// What a run measures of its pipeline stages (--comm-report with a pipeline): each layer's, the embedding's and the
// head's seconds per micro-batch (the spans of train_gpt.cu add them), put on one pace over the ranks, reported with
// the split that balances them, and written to -o/pipeline_costs.txt for --pp-layers auto:FILE (pipeline_split.h
// reads that file and cuts the layers by it).
#ifndef LLMC_STAGE_COSTS_H
#define LLMC_STAGE_COSTS_H

#include <math.h>
#include "utils.h"
#include "grid.h"
#include "comm.h"
#include "model_config.h"
#include "pipeline_split.h"

// What a run measures of its stage (--comm-report with a pipeline, the device synchronised around each pass): the
// seconds of each of the stage's layers, of the head (final LayerNorm, LM head and loss), of the embedding, forward
// and backward, over micro_batches training micro-batches; in_step: a training step is running (not an evaluation).
typedef struct { double *layer, head, embed; int micro_batches, in_step; } StageCosts;

// A stage's measured seconds per micro-batch for pipeline_costs_report: (L + 2) each of its Ls layers' at its model
// index (layer_id), the embedding's (first stage), the head's (last stage); the stage's first rank's, 0 elsewhere.
static double *stage_costs_per_layer(const StageCosts *s, int L, const int *layer_id, int Ls, int first, int last,
                                     const Grid *grid) {
    int n = s->micro_batches;
    double *cost = (double *)calloc_check(L + 2, sizeof(double));
    if (grid->tp_rank == 0 && grid->cp_rank == 0 && grid->dp_rank == 0 && n > 0) {   // (one rank per stage adds its own)
        for (int l = 0; l < Ls; l++) { cost[layer_id[l]] = s->layer[l] / n; }
        cost[L] = first ? s->embed / n : 0;
        cost[L + 1] = last ? s->head / n : 0;
    }
    return cost;
}

// The seconds measured per micro-batch (cost: the model's L layers, 0 where this rank holds none, then the
// embedding and the head + loss), each rank's in units of its own dense layers, scaled back to seconds by their mean
// over the ranks: the split balances work, so a rank that ran slower (another core's load, a hotter GPU) does not make
// its layers look costlier than the same layers elsewhere. Returns the ratio of the ranks' paces (1: equal).
static double costs_at_one_pace(double *cost, const ModelConfig *c, const int *run_first, int pp, int n) {
    int L = c->num_layers;
    double *dsum = (double *)calloc_check(2 * pp, sizeof(double)), *dn = dsum + pp, all = 0, alln = 0, spread = 1;
    for (int vs = 0; vs < n; vs++) {
        for (int l = run_first[vs]; l < run_first[vs + 1]; l++) {
            if (!is_moe_layer(c, l)) { dsum[vs % pp] += cost[l]; dn[vs % pp]++; all += cost[l]; alln++; }
        }
    }
    double lo_r = INFINITY, hi_r = 0;
    for (int r = 0; r < pp && alln > 0; r++) {
        double scale = dn[r] > 0 ? (all / alln) / (dsum[r] / dn[r]) : 1.0;
        if (dn[r] > 0) { lo_r = fmin(lo_r, scale); hi_r = fmax(hi_r, scale); }
        for (int vs = r; vs < n; vs += pp) {
            for (int l = run_first[vs]; l < run_first[vs + 1]; l++) { cost[l] *= scale; }
        }
        if (r == 0) { cost[L] *= scale; }
        if (r == pp - 1) { cost[L + 1] *= scale; }
    }
    if (hi_r > 0) { spread = hi_r / lo_r; }
    free(dsum);
    return spread;
}

// -o/pipeline_costs.txt, for --pp-layers auto:FILE (read_pipeline_costs), written whole or not at all.
static void pipeline_costs_write(const double *cost, const ModelConfig *c, const Grid *g, int B, int T, const char *dir) {
    int L = c->num_layers;
    char path[PATH_LEN], tmp[PATH_LEN + 8];
    snprintf(path, sizeof(path), "%s/pipeline_costs.txt", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "# seconds per micro-batch, forward and backward (train_gpt --comm-report, tp %d cp %d pp %d, "
                "B %d T %d): --pp-layers auto:%s balances them\n", g->tp, g->cp, g->pp, B, T, path);
        fprintf(f, "model %d %d %d %d %d\nembedding %.9g\nhead %.9g\n", L, c->channels, c->num_heads,
                c->padded_vocab_size, c->num_experts, cost[L], cost[L + 1]);
        for (int l = 0; l < L; l++) { fprintf(f, "layer %d %.9g\n", l, cost[l]); }
    }
    if (!f || fclose(f) != 0 || rename(tmp, path) != 0) { printf("warning: could not write %s\n", path); }
    else { printf("  (written to %s: --pp-layers auto:%s splits by them)\n", path, path); }
}

// --comm-report with a pipeline: what each layer, the head (final LayerNorm, LM head and loss) and the embedding
// took per micro-batch, forward and backward (this machine, these shapes: measured, where --pp-layers auto counts
// FLOPs), and the split that balances these measured costs (pipe_split_balanced, as auto): a --pp-layers to run
// next time (checkpoints resume into any split). cost (L + 2): this rank's part (costs_at_one_pace), summed here
// over the ranks; the run's split was spec at sequence length T; its file goes to dir (NULL: none).
static void pipeline_costs_report(double *cost, const ModelConfig *c, Grid *g, int vpp, const char *spec, int B, int T,
                                  const char *dir) {
    int L = c->num_layers, n = g->pp * vpp, first[PIPE_MAX_LAYERS + 1], run_first[PIPE_MAX_LAYERS + 1];
    char err[256];
    comm_host_all_reduce(&g->world, cost, L + 2, DT_DOUBLE, HOST_SUM, "all-reduce of the measured costs");
    if (g->rank != 0) { return; }
    if (layer_split(run_first, spec, c, T, g->pp, vpp, err, sizeof(err))) { fail("%s", err); }
    double spread = costs_at_one_pace(cost, c, run_first, g->pp, n);
    pipe_split_balanced(first, cost, cost[L], cost[L + 1], L, n);
    double lo = INFINITY, hi = 0, sum = 0;
    for (int l = 0; l < L; l++) { lo = fmin(lo, cost[l]); hi = fmax(hi, cost[l]); sum += cost[l]; }
    printf("pipeline costs measured per micro-batch (forward and backward, the device synchronised around each; each "
           "rank's in its own dense layers, the ranks' paces %.0f%% apart): layers %.2f-%.2f ms, head + loss %.2f ms "
           "(%.2f mean layers), embedding %.2f ms\n", 100.0 * (spread - 1), lo * 1e3, hi * 1e3, cost[L + 1] * 1e3,
           cost[L + 1] / (sum / L), cost[L] * 1e3);
    printf("  the split balancing them: --pp-layers ");
    for (int s = 0; s < n; s++) { printf("%d%s", first[s + 1] - first[s], s < n - 1 ? "," : ""); }
    printf(" (stage costs");
    for (int s = 0; s < n; s++) {
        double w = (s == 0 ? cost[L] : 0) + (s == n - 1 ? cost[L + 1] : 0);
        for (int l = first[s]; l < first[s + 1]; l++) { w += cost[l]; }
        printf(" %.1f", w * 1e3);
    }
    printf(" ms)\n");
    if (dir) { pipeline_costs_write(cost, c, g, B, T, dir); }
}

#endif
