// The instruments: what a run prints and logs about itself beside the model's numbers. The step line (screen and
// main.log's "s:N trl:" lines), the MoE layers' load lines, the first step's memory and communication reports, and
// at the end the average step, the pipeline bubble and each group's exposed communication. The numbers are the
// model's parts' (gathered there: expert_parallel.h's MoE numbers, pipeline.h's waits, comm.h's counters); this
// file says them.
#ifndef LLMC_REPORT_H
#define LLMC_REPORT_H

#include "utils.h"
#include "alloc.h"
#include "comm.h"
#include "layout.h"
#include "moe.h"
#include "run_dir.h"
#include "global_norm.h"
#include "expert_parallel.h"
#include "pipeline_split.h"
#include "stage_costs.h"

// ----------------------------------------------------------------------------
// the start

// The start-up lines (rank 0): the model, the MoE layers (mo: their options; moe_cap: assignments per expert and
// sequence; moe_El: experts per ep rank), the batch and the layout a.
static void print_setup(const Layout *lay, const ModelConfig *c, MoEOptions mo, Grid *g, size_t num_parameters,
                        int moe_cap, int moe_El, int accum) {
    printf("model: L %d C %d NH %d V %d (padded %d) maxT %d, %zu parameters, %s\n", c->num_layers, c->channels,
           c->num_heads, c->vocab_size, c->padded_vocab_size, c->max_seq_len, num_parameters, PRECISION_NAME);
    if (c->arch == ARCH_LLAMA) {
        printf("llama: RMSNorm (eps %g), RoPE (theta %g%s), SwiGLU of F %d, %d kv heads, %s head%s%s", c->norm_eps,
               c->rope_theta, c->rope.kind == 1 ? ", llama3 scaling" : "", c->ffn_hidden, c->kv_heads,
               c->tied ? "tied" : "untied", c->qkv_bias ? ", q/k/v biases" : "", c->qk_norm ? ", QK-norm" : "");
        if (c->pad_token >= 0) { printf(", padding token %d (no embedding gradient)", c->pad_token); }
        printf("\n");
    }
    if (c->num_experts > 0) {
        printf("moe: %d of %d layers (every %d), %d experts of width %d + %d shared%s, top-%d of %s scores%s, capacity "
               "factor %.3f (%d per expert and sequence%s), drop %s, aux %g, z %g, bias rate %g; ep %d (%d experts per "
               "rank), edp %d\n", num_moe_layers(c), c->num_layers, c->moe_every, c->num_experts, c->expert_hidden,
               c->shared_experts, c->shared_gate ? " (gated)" : "", c->topk,
               c->router_score == ROUTER_SIGMOID ? "sigmoid" : "softmax", c->norm_topk ? "" : " (not renormalised)",
               mo.cap1000 / 1000.0, moe_cap,
               mo.cap1000 == 0 ? ", dropless" : "", mo.policy == DROP_POSITION ? "position" : "probs", mo.aux_coeff,
               mo.z_coeff, mo.bias_rate, g->ep, moe_El,
               g->edp_group.size);
    }
    char kind[48] = "";
    int U = cp_ulysses_degree(lay);
    if (U > 1) { snprintf(kind, sizeof(kind), " (%s, all-to-all in %d)", lay->cp_kind, U); }
    printf("batch: B %d T %d, dp %d, grad accumulation %d -> %d tokens per step; zero %d, tp %d%s, cp %d%s, pp %d (%s), "
           "ce chunk %d, recompute %s\n", lay->B, lay->T, g->dp, accum, lay->total_batch, lay->zero, lay->tp,
           lay->sp ? " + sp" : "",
           lay->cp, kind, lay->pp, lay->pp_schedule, lay->ce_chunk, lay->recompute);
    if (lay->pp > 1) { print_layer_split(c, lay->pp_layers, lay->T, lay->pp, lay->vpp); }
}

// ----------------------------------------------------------------------------
// the step line

typedef struct { double elapsed, eta, ms; } StepClock;   // seconds since the first step, seconds left, this step's ms

// What one step's line says: the step (0-based) of max_steps, the mean loss of the global batch, its gradient norm
// before clipping, the learning rate, whether the update was skipped (SKIP_NONE or why: global_norm.h) and the
// limits it was held to, the tokens of a step and the model FLOPs utilisation (CUDA), the clock.
typedef struct {
    int step, max_steps;
    float loss, norm, lr;
    int why, skips_in_a_row;
    float loss_limit, norm_limit;
    double tokens, mfu;
    StepClock clock;
} StepLine;

// The model FLOPs of one step over the world's peak: the CUDA build's bf16 tensor-core rate (790 TFLOP/s a GPU,
// an H200's dense bf16 as measured reachable; the data sheet says 989).
#define PEAK_FLOPS_PER_GPU 790e12
static double step_mfu(double flops, double ms, int world) {
    return flops / (ms / 1e3) / (world * PEAK_FLOPS_PER_GPU);
}

static void print_duration(const char *label, double seconds) {
    long s = (long)(seconds + 0.5);
    printf(" | %s %ld:%02ld:%02ld", label, s / 3600, s / 60 % 60, s % 60);
}

// One MoE layer's load (E) in numbers: the most and the least loaded expert over the mean, the dropped fraction,
// the experts with no assignment.
typedef struct { double max_mean, min_mean, dropped; int dead; } MoELoad;
static MoELoad moe_load_summary(const double *load, double kept, int E) {
    double total = 0, mx = 0, mn = INFINITY;
    int dead = 0;
    for (int e = 0; e < E; e++) {
        total += load[e];
        if (load[e] > mx) { mx = load[e]; }
        if (load[e] < mn) { mn = load[e]; }
        dead += load[e] == 0;
    }
    double mean = total / E;
    MoELoad r = {mean > 0 ? mx / mean : 0, mean > 0 ? mn / mean : 0, total > 0 ? 1.0 - kept / total : 0, dead};
    return r;
}

// The MoE lines of main.log: aux, z and the dropped fraction, then per MoE layer (numbered among the MoE layers)
// max/mean and min/mean of the assignments per expert before drops, the fraction dropped, the experts with none,
// then the E counts.
static void log_moe_lines(int logf, int step, const MoEStepLoad *moe) {
    int E = moe->E;
    log_printf(logf, "s:%d aux:%.6f\ns:%d z:%.6f\ns:%d drop:%.6f\n", step, moe->aux, step, moe->z, step, moe->dropped);
    for (int l = 0; l < moe->layers; l++) {
        const double *ld = moe->load + (size_t)l * E;
        MoELoad r = moe_load_summary(ld, moe->kept[l], E);
        char counts[3200];
        int n = 0;
        for (int e = 0; e < E; e++) { n += snprintf(counts + n, sizeof(counts) - n, "%s%.0f", e ? "," : "", ld[e]); }
        log_printf(logf, "s:%d moe%d:max/mean %.4f min/mean %.4f drop %.6f dead %d load %s\n", step, l, r.max_mean,
                   r.min_mean, r.dropped, r.dead, counts);
    }
}

// One step's line on the screen and in main.log (rank 0): the CE loss (trl), and for MoE models (moe->layers > 0)
// aux, z, the dropped fraction and the worst layer's load; a skipped update says so.
static void log_step(int logf, const StepLine *s, const MoEStepLoad *moe) {
    double worst = 0, ms = s->clock.ms;
    for (int l = 0; l < moe->layers; l++) {
        MoELoad r = moe_load_summary(moe->load + (size_t)l * moe->E, moe->kept[l], moe->E);
        if (r.max_mean > worst) { worst = r.max_mean; }
    }
    printf("step %4d/%d | loss %.6f | norm %.6f | lr %.2e | %.1f ms | %.0f tok/s", s->step + 1, s->max_steps, s->loss,
           s->norm, s->lr, ms, s->tokens / (ms / 1e3));
#ifdef USE_CUDA
    printf(" | MFU %.1f%%", 100.0 * s->mfu);
#endif
    print_duration("elapsed", s->clock.elapsed);
    print_duration("eta", s->clock.eta);
    if (moe->layers > 0) {
        printf(" | aux %.4f z %.4f dropped %.4f load max/mean %.2f", moe->aux, moe->z, moe->dropped, worst);
    }
    char why[96] = "";
    if (s->why == SKIP_NOT_FINITE) { snprintf(why, sizeof(why), "non-finite"); }
    if (s->why == SKIP_LOSS) { snprintf(why, sizeof(why), "loss above its limit %.6g", s->loss_limit); }
    if (s->why == SKIP_NORM) { snprintf(why, sizeof(why), "norm above its limit %.6g", s->norm_limit); }
    if (why[0]) { printf(" | %s: update skipped (%d in a row)", why, s->skips_in_a_row); }
    printf("\n");
    log_printf(logf, "s:%d trl:%.6f\n", s->step, s->loss);
    if (moe->layers > 0) { log_moe_lines(logf, s->step, moe); }
    if (why[0]) { log_printf(logf, "s:%d skip:loss %g norm %g (%s)\n", s->step, s->loss, s->norm, why); }
    fflush(stdout);
}

// ----------------------------------------------------------------------------
// the first step's reports

// After the first step: bytes per group (comm_reported: --comm-report), memory per category and the activation
// slots per pipeline stage (memory_reported: --memory-report; nslots: this rank's, of vpp model chunks).
static void report_first_step(const Layout *lay, int comm_reported, int memory_reported, Grid *g, int nslots, int vpp,
                              int accum) {
    if (comm_reported) {
        comm_report(g, 1, "first step");
        if (g->rank == 0 && lay->zero >= 2 && accum > 1) {
            printf("note: zero %d reduce-scatters the gradients after every micro-batch (%d per step) so that no full\n"
                   "      gradient outlives its unit's backward: dp traffic grows with accumulation, unlike stages "
                   "0-1\n", lay->zero, accum);
        }
    }
    if (memory_reported) {
        mem_report(g->rank, g->world_size, "after the first step");
        if (g->pp > 1) {   // 1F1B: pp - stage, GPipe: all of them; interleaved: (micro-batch, chunk) pairs
            int *alive = (int *)malloc_check(sizeof(int) * g->world_size);
            comm_host_gather(&g->world, &nslots, 1, alive, DT_INT, 0, "gather of the activation slots");
            if (g->rank == 0) {
                printf("pipeline (%s, %d micro-batches): %s of activations alive per stage:", lay->pp_schedule, accum,
                       vpp > 1 ? "(micro-batch, model chunk) pairs" : "micro-batches");
                for (int s = 0; s < g->pp; s++) { printf(" %d", alive[s * g->tp * g->cp]); }
                printf("\n");
            }
            free(alive);
        }
    }
}

// ----------------------------------------------------------------------------
// the run's times

// The timed steps (all but the first of the run): their time, and the shares of it spent waiting on
// the pipeline neighbours (the bubble) and in the MoE all-to-alls; each group's exposed communication (CPU).
typedef struct { double total_ms, bubble, a2a, exposed[9]; int steps; } StepTimes;

// A timed step of ms, of which wait_seconds waiting on the pipeline neighbours and a2a_seconds in the all-to-alls.
static void step_times_add(StepTimes *t, Grid *g, double ms, double wait_seconds, double a2a_seconds) {
    t->total_ms += ms;
    t->steps++;
    t->bubble += wait_seconds / (ms / 1e3);
    t->a2a += a2a_seconds / (ms / 1e3);
    Group *groups[9];
    int n = grid_groups(g, groups, 1);
    for (int i = 0; i < n; i++) { t->exposed[i] += groups[i]->exposed; }
}

// The pipeline bubble of each stage: time waiting on the neighbour stages / step time, averaged
// over the timed steps, next to the ideal (pp-1)/(V*m+pp-1) (vpp = 1 but interleaved).
static void report_bubble(const Layout *lay, Grid *g, double bubble_sum, int steps, int accum) {
    double mine = bubble_sum / steps, *all = (double *)malloc_check(sizeof(double) * g->world_size);
    comm_host_gather(&g->world, &mine, 1, all, DT_DOUBLE, 0, "gather of the bubbles");
    if (g->rank == 0) {
        int vpp = lay->vpp;
        printf("pipeline bubble (%s, %d micro-batches): measured time waiting on the neighbour stages / step time, "
               "ideal (pp-1)/(%sm+pp-1) = %.3f\n",
               lay->pp_schedule, accum, vpp > 1 ? "V*" : "", (double)(g->pp - 1) / (vpp * accum + g->pp - 1));
        // (tp 0, dp 0) rank of each stage
        for (int s = 0; s < g->pp; s++) {
            printf("  stage %d: %.3f\n", s, all[s * g->tp]);
        }
    }
    free(all);
}

// --comm-report, CPU build: each group's exposed communication per step (the time a rank spends inside the
// group's MPI calls and waiting for its asynchronous ones: computing, it would not be waiting), a row per rank,
// and the lines "exposed RANK GROUP MS" for tools. (CUDA: the calls only enqueue; not measured this way.)
static void report_exposed(Grid *g, const StepTimes *t) {
#ifndef USE_NCCL
    Group *groups[9];
    int NG = grid_groups(g, groups, 1);   // (the world: the step's loss and norm)
    double mine[9], *all = (double *)malloc_check(sizeof(double) * 9 * g->world_size);
    for (int i = 0; i < NG; i++) { mine[i] = 1e3 * t->exposed[i] / t->steps; }
    comm_host_gather(&g->world, mine, NG, all, DT_DOUBLE, 0, "gather of the exposed communication");
    if (g->rank == 0) {
        printf("exposed communication (ms per step, mean over %d timed steps; the time inside each group's MPI calls "
               "and waits), step %.1f ms:\n%4s", t->steps, t->total_ms / t->steps, "rank");
        for (int i = 0; i < NG; i++) { printf(" | %8s", groups[i]->name); }
        printf("\n");
        for (int r = 0; r < g->world_size; r++) {
            printf("%4d", r);
            for (int i = 0; i < NG; i++) { printf(" | %8.2f", all[r * NG + i]); }
            printf("\n");
        }
        for (int r = 0; r < g->world_size; r++) {
            for (int i = 0; i < NG; i++) { printf("exposed %d %s %.4f\n", r, groups[i]->name, all[r * NG + i]); }
        }
    }
    free(all);
#else
    (void)g; (void)t;
#endif
}

// The MoE all-to-alls' share of the step (--comm-report, the device synchronised around each).
static void report_all_to_all(Grid *g, const StepTimes *t) {
    double mean = t->a2a / t->steps, most = mean;
    comm_host_all_reduce(&g->world, &mean, 1, DT_DOUBLE, HOST_SUM, "all-reduce of the all-to-all times");
    comm_host_all_reduce(&g->world, &most, 1, DT_DOUBLE, HOST_MAX, "all-reduce of the all-to-all times");
    if (g->rank == 0) {
        printf("MoE all-to-all (ep %d, the device synchronised around each): %.1f%% of the step time on average "
               "over the ranks, %.1f%% at most\n",
               g->ep, 100.0 * mean / g->world_size, 100.0 * most);
    }
}

// At the end of a run that timed steps: the average step; with --comm-report the pipeline's bubble and measured
// costs (stage_costs: this rank's part, pipeline_costs_report), each group's exposed communication; the
// all-to-alls' share when timed.
// comm_reported: --comm-report; output_dir: -o (pipeline_costs.txt; NULL: none).
static void report_times(const Layout *lay, int comm_reported, const char *output_dir, Grid *g, const StepTimes *t,
                         int accum, int vpp, double *stage_costs, const ModelConfig *c, int time_a2a) {
    if (t->steps == 0) { return; }
    if (g->rank == 0) {
        printf("average step: %.1f ms, %.0f tok/s\n", t->total_ms / t->steps,
               lay->total_batch / (t->total_ms / t->steps / 1e3));
    }
    if (comm_reported && g->pp > 1) {
        report_bubble(lay, g, t->bubble, t->steps, accum);
        pipeline_costs_report(stage_costs, c, g, vpp, lay->pp_layers, lay->B, lay->T, output_dir);
    }
    if (comm_reported) { report_exposed(g, t); }
    if (time_a2a) { report_all_to_all(g, t); }
}

#endif // LLMC_REPORT_H
