// The memory plan (--plan N, --memory-limit): any rank's peak bytes per category for any world size and
// flags, from the code that allocates: gpt2_init runs with the allocator only
// counting (alloc.h) on a grid without communicators (grid_plan): no weights, no device, one process.
// The plan itself is gpt2_plan (train_gpt.cu: it runs the model's own set-up); this file has what is
// built on it: the report per stage, what dominates a category, a cost model of a step's time, and the
// levers (one change of the layout at a time, or pairs) ranked by fit and time.
#ifndef LLMC_PLAN_H
#define LLMC_PLAN_H

#include "utils.h"
#include "alloc.h"
#include "comm.h"
#include "attention.h"
#include "pipeline.h"
#include "model_file.h"
#include "args.h"

typedef struct { size_t floatx; int cuda; const char *name; } PlanBuild;   // the build planned for

static PlanBuild plan_build(const Args *a) {
#ifdef USE_CUDA
    PlanBuild b = {sizeof(floatX), 1,
                   sizeof(floatX) == 2 ? "CUDA build, bf16 (AdamW state and master weights fp32)" : "CUDA build, fp32"};
#else
    PlanBuild b = {sizeof(floatX), 0, "CPU build, fp32"};
#endif
    if (a->plan_precision
        && !strcmp(a->plan_precision,
                   "bf16")) { b = (PlanBuild){2, 1, "CUDA build, bf16 (AdamW state and master weights fp32)"}; }
    if (a->plan_precision && !strcmp(a->plan_precision, "fp32")) { b = (PlanBuild){4, 1, "CUDA build, fp32"}; }
    return b;
}

// The plan of rank `rank` of a world of `world` ranks (train_gpt.cu).
static MemPlan gpt2_plan(const Args *a, const GPT2Config *c, MoEOptions moe, int world, int rank, PlanBuild b);

// What the CUDA context and NCCL take beside the allocator's buffers (an assumption, stated with the plan).
static double plan_reserve(PlanBuild b) { return b.cuda ? 1024.0 * 1048576.0 : 0.0; }

// The plan of every pipeline stage (tp, cp, dp rank 0 of each: the other positions hold as much);
// returns the stage with the largest peak total.
static int plan_stages(const Args *a, const GPT2Config *c, int world, PlanBuild b, MemPlan *plans) {
    int worst = 0;
    for (int s = 0; s < a->pp; s++) { plans[s] = gpt2_plan(a, c, moe_options(a, c), world, s * a->tp * a->cp, b); }
    for (int s = 1; s < a->pp; s++) { if (plans[s].peak_total > plans[worst].peak_total) { worst = s; } }
    return worst;
}

static double gib(double bytes) { return bytes / 1073741824.0; }

// What dominates a category of the plan, in words (for the advice).
static void plan_explain(const Args *a, const GPT2Config *c, int world, int stage, int cat, PlanBuild b, int slots,
                         char *out, size_t n) {
    int dp = world / (a->tp * a->cp * a->pp), accum = a->total_batch / (a->B * a->T * dp), layers = 0;
    int first[PIPE_MAX_LAYERS + 1];
    char err[256];
    if (layer_split(first, a->pp_layers, c, a->T, a->pp, a->vpp, err, sizeof(err))) { fail("%s", err); }
    for (int v = 0; v < a->vpp; v++) { layers += first[v * a->pp + stage + 1] - first[v * a->pp + stage]; }
    double X = (double)b.floatx, BT = (double)a->B * a->T / a->cp, P = (double)num_parameters(c) / a->pp / a->tp;
    switch (cat) {
    case MEM_PARAMS: snprintf(out, n, "parameters: about P/(pp tp) = %.0fM x %.0f B%s", P / 1e6, X,
                              a->zero == 3 ? " / dp (ZeRO 3)" : ", a full copy on every dp rank"); break;
    case MEM_GRADS: snprintf(out, n, "gradients: about P/(pp tp) = %.0fM x %.0f B%s", P / 1e6, X,
                             a->zero >= 2 ? " / dp (ZeRO 2-3)" : ", a full copy on every dp rank"); break;
    case MEM_OPTIMIZER: snprintf(out, n, "AdamW m, v%s: %d B per parameter%s",
                                 b.floatx == 2 ? " and fp32 master weights" : "", b.floatx == 2 ? 12 : 8,
                                 a->zero >= 1 ? " / dp (ZeRO 1-3)"
                                         : " for every parameter of the stage (ZeRO 0)"); break;
    case MEM_ACTIVATIONS: snprintf(out, n,
                                   "activations: %d micro-batch(es)%s of B %d x T/cp %.0f tokens in flight on stage %d (%s, %d micro-batches), %d layers each%s%s",
                                   slots, a->vpp > 1 ? " x model chunks" : "", a->B, BT / a->B, stage, a->pp_schedule,
                                       accum, layers,
                                   a->tp > 1 && !a->sp ? ", the LayerNorm/residual part replicated over tp (no --sp)"
                                           : "", strcmp(a->recompute, "none") ? "" : ", nothing recomputed"); break;
    case MEM_LOGITS: snprintf(out, n, "logits: %s x Vp/tp = %d x %d x %.0f B",
                              a->ce_chunk == 0 ? "all B*T/cp tokens (--ce-chunk 0)" : "one CE chunk",
                              a->ce_chunk == 0 || a->ce_chunk > BT ? (int)BT : a->ce_chunk,
                                  c->padded_vocab_size / a->tp, X); break;
    case MEM_COMM: snprintf(out, n,
                            "comm buffers: MoE dispatch rows, the cp ring's k, v, or pipeline gradient copies"); break;
    default: snprintf(out, n, "workspace: %s",
                      b.cuda && a->cp == 1
                      ? "cuBLAS attention scores (NH/tp, T, T) in fp32 and floatX, and the layers' scratch"
                                                                    : "one layer's scratch (B*T, 4C/tp)"); break;
    }
}

// Seconds per step of a layout, from stated assumptions: FLOP rate per rank, the link bandwidth of each
// group (tp, cp, ep inside a node; pp, dp across nodes), the slowest pipeline stage, the bubble, and a fixed cost per layer
// and micro-batch (launches, latencies: smaller micro-batches are slower). A ranking, not a forecast.
#define PLAN_FLOPS 200e12     // achieved per rank (about 20% of an H200's dense bf16 peak: what the GPU check measured)
#define PLAN_NODE_BW 300e9    // bytes/s per rank inside a node (NVLink)
#define PLAN_NET_BW 40e9      // bytes/s per rank across nodes
#define PLAN_LAYER_COST 50e-6 // seconds per layer and micro-batch, forward and backward
#define PLAN_FLASH_SLOWER 3.0 // --attention flash: its attention FLOPs at a third of the rate (the flash kernels took 3.5x
                              // the cuBLAS path's time at T 4096 on an H200)
// The costliest pipeline stage over the mean stage, under --pp-layers auto's cost model (a stage's layers,
// the LM head on the last): the pipeline runs at the pace of its slowest stage (1 without a pipeline).
static double plan_stage_imbalance(const Args *a, const GPT2Config *c) {
    int first[PIPE_MAX_LAYERS + 1], n = a->pp * a->vpp;
    char err[256];
    if (a->pp == 1 || layer_split(first, a->pp_layers, c, a->T, a->pp, a->vpp, err, sizeof(err))) { return 1.0; }
    double *stage = (double *)calloc_check(a->pp, sizeof(double)), total = 0.0, most = 0.0;
    for (int s = 0; s < n; s++) {   // virtual stage s runs on rank s % pp
        double w = s == n - 1 ? head_flops_per_token(c) : 0.0;
        for (int l = first[s]; l < first[s + 1]; l++) { w += layer_flops_per_token(c, l, a->T); }
        stage[s % a->pp] += w;
        total += w;
    }
    for (int r = 0; r < a->pp; r++) { if (stage[r] > most) { most = stage[r]; } }
    free(stage);
    return most / (total / a->pp);
}

static double plan_seconds(const Args *a, const GPT2Config *c, int world, PlanBuild b) {
    int dp = world / (a->tp * a->cp * a->pp), accum = a->total_batch / (a->B * a->T * dp);
    double L = c->num_layers, C = c->channels, T = a->T, tokens = (double)a->total_batch, X = (double)b.floatx;
    double P = (double)num_parameters(c),
        recompute = !strcmp(a->recompute, "full") ? 4.0 / 3 : !strcmp(a->recompute, "mlp") ? 1.1 : 1.0;
    double flash = !strcmp(a->attention, "flash") && attention_flash_applies(c->channels / c->num_heads, b.floatx)
            ? PLAN_FLASH_SLOWER : 1.0;
    // per token: each layer's weights a token meets (a MoE layer: its router, k experts and the shared ones: the
    // cost model of --pp-layers auto) and causal attention (6 C T), and the LM head
    double per_token = head_flops_per_token(c);
    for (int l = 0; l < c->num_layers; l++) { per_token += layer_flops_per_token(c, l, a->T) + 6.0 * C * T * (flash - 1); }
    double flops = per_token * tokens * recompute;
    double compute = flops / (world * PLAN_FLOPS) * plan_stage_imbalance(a, c);   // (the slowest stage's pace)
    double bubble = a->pp > 1 ? (a->pp - 1.0) / (a->vpp * accum + a->pp - 1.0) : 0.0;
    if (a->pp > 1 && !strcmp(a->pp_schedule, "zb")) {   // ZB: from its step lists (pipeline.h), F = B = W
        double idle[PIPE_MAX_LAYERS];
        double end = pipe_simulate(SCHEDULE_ZB, a->pp, 1, accum, 1.0, 1.0, 1.0, idle);
        bubble = 0;
        for (int r = 0; r < a->pp; r++) { if (idle[r] / end > bubble) { bubble = idle[r] / end; } }
    }
    double BTl = (double)a->B * a->T / a->cp, Pl = P / (a->tp * a->pp);
    double tp_bytes = a->tp > 1 ? accum * (L / a->pp) * 8.0 * (a->tp - 1.0) / a->tp * BTl * C * X : 0;
    double cp_bytes = a->cp > 1 ? accum * (L / a->pp) * (3.0 * a->cp - 2) * BTl * 2 * C / a->tp * X : 0;
    double pp_bytes = a->pp > 1 ? accum * 2.0 * a->vpp * BTl * C / a->tp * X : 0;
    double dp_bytes = dp > 1
            ? (a->zero >= 2 ? (accum + 1.0) : 2.0) * (dp - 1.0) / dp * Pl * X * (a->zero == 3 ? 2.0 : 1.0) : 0;
    double comm = (tp_bytes + cp_bytes) / PLAN_NODE_BW + (pp_bytes + dp_bytes) / PLAN_NET_BW;
    double fixed = accum * (L / a->pp) * PLAN_LAYER_COST;
    return (compute + fixed) / (1.0 - bubble) + comm;
}

// A change of the layout: what (the flags), its kind (one flag: a pair changes two different ones), its
// layout, worst stage's peak, time per step, and whether it fits.
typedef struct { char what[96]; int kind; Args args; double peak; double seconds; int fits; } Lever;
enum { LV_ZERO, LV_SP, LV_TP, LV_PP, LV_SCHEDULE, LV_SPLIT, LV_CP, LV_CE, LV_ATTENTION, LV_RECOMPUTE, LV_BATCH, LV_EP };

// One lever's layout, if it runs: its worst stage's peak and its time.
static int try_lever(Lever *lv, const Args *base, const GPT2Config *c, int world, PlanBuild b, double limit,
                     const char *what) {
    char err[512];
    lv->args.dp = -1;   // (world and -d fixed: dp follows)
    if (layout_error(&lv->args, c, world, err, sizeof(err))) { return 0; }
    (void)base;
    MemPlan *plans = (MemPlan *)malloc_check(sizeof(MemPlan) * lv->args.pp);
    int w = plan_stages(&lv->args, c, world, b, plans);
    lv->peak = (double)plans[w].peak_total + plan_reserve(b);
    lv->fits = lv->peak <= limit;
    lv->seconds = plan_seconds(&lv->args, c, world, b);
    snprintf(lv->what, sizeof(lv->what), "%s", what);
    free(plans);
    return 1;
}

static int lever_order(const void *x, const void *y) {
    const Lever *a = (const Lever *)x, *b = (const Lever *)y;
    if (a->fits != b->fits) { return b->fits - a->fits; }
    return a->seconds < b->seconds ? -1 : a->seconds > b->seconds;
}

// The single levers that apply to layout a (world and -d fixed), planned; without one that fits, pairs.
static int plan_levers(const Args *a, const GPT2Config *c, int world, PlanBuild b, double limit, Lever *out,
                       int pairs_of) {
    int n = 0;
    #define LEVER(cond, k, what, change) do { \
        if (cond) { \
            Lever lv; lv.args = *a; lv.kind = k; \
            { Args *x = &lv.args; change; } \
            if (try_lever(&lv, a, c, world, b, limit, what)) { out[n++] = lv; } \
        } } while (0)
    char w[96];
    if (a->zero < 3 && a->dp > 1) {   // (ZeRO shards over dp: nothing to shard at dp 1)
        snprintf(w, sizeof(w), "--zero %d", a->zero + 1);
        LEVER(1, LV_ZERO, w, x->zero = a->zero + 1);
    }
    LEVER(a->tp > 1 && !a->sp, LV_SP, "--sp", x->sp = 1);
    snprintf(w, sizeof(w), "--tp %d --sp", 2 * a->tp); LEVER(1, LV_TP, w, { x->tp = 2 * a->tp; x->sp = 1; });
    // (a split given as counts is for this pp: twice the stages start even)
    int counts = a->pp_layers && strncmp(a->pp_layers, "auto", 4);
    snprintf(w, sizeof(w), "--pp %d%s", 2 * a->pp, counts ? " (even stages)" : "");
    LEVER(1, LV_PP, w, { x->pp = 2 * a->pp; if (counts) { x->pp_layers = NULL; } });
    LEVER(a->pp > 1 && !strcmp(a->pp_schedule, "gpipe"), LV_SCHEDULE, "--pp-schedule 1f1b", x->pp_schedule = "1f1b");
    // ZB-H1: a smaller bubble for the pending W passes' memory (a lever for time: it never lowers the peak)
    LEVER(a->pp > 1 && !strcmp(a->pp_schedule, "1f1b"), LV_SCHEDULE, "--pp-schedule zb", x->pp_schedule = "zb");
    // stages cut by cost: less on the costliest stage (the head's), and the first stage's activations move too
    LEVER(a->pp > 1 && !(a->pp_layers && !strncmp(a->pp_layers, "auto", 4)), LV_SPLIT, "--pp-layers auto",
          x->pp_layers = "auto");
    snprintf(w, sizeof(w), "--cp %d", 2 * a->cp); LEVER(1, LV_CP, w, x->cp = 2 * a->cp);
    LEVER(a->ce_chunk == 0, LV_CE, "--ce-chunk 256", x->ce_chunk = 256);
    if (a->ce_chunk > 64) {
        snprintf(w, sizeof(w), "--ce-chunk %d", a->ce_chunk / 2);
        LEVER(1, LV_CE, w, x->ce_chunk = a->ce_chunk / 2);
    }
    LEVER(b.cuda && a->cp == 1 && strcmp(a->attention, "flash")
          && attention_flash_applies(c->channels / c->num_heads, b.floatx),
          LV_ATTENTION, "--attention flash", x->attention = "flash");
    LEVER(!strcmp(a->recompute, "none"), LV_RECOMPUTE, "--recompute mlp", x->recompute = "mlp");
    LEVER(strcmp(a->recompute, "full"), LV_RECOMPUTE, "--recompute full", x->recompute = "full");
    if (a->B % 2 == 0) {
        snprintf(w, sizeof(w), "-b %d (twice the accumulation)", a->B / 2);
        LEVER(1, LV_BATCH, w, x->B = a->B / 2);
    }
    if (c->num_experts > 0) { snprintf(w, sizeof(w), "--ep %d", 2 * a->ep); LEVER(1, LV_EP, w, x->ep = 2 * a->ep); }
    #undef LEVER
    if (pairs_of) {   // no single lever fits: each pair of two kinds (the second applied on top of the first), once
        int singles = n;
        for (int i = 0; i < singles; i++) {
            Lever more[16];
            int k = plan_levers(&out[i].args, c, world, b, limit, more, 0);
            for (int j = 0; j < k && n < 256; j++) {
                if (more[j].kind <= out[i].kind) { continue; }   // (the same flag twice, or this pair the other way round)
                char both[96];
                snprintf(both, sizeof(both), "%.40s + %.40s", out[i].what, more[j].what);
                memcpy(more[j].what, both, sizeof(both));
                out[n++] = more[j];
            }
        }
        memmove(out, out + singles, (n - singles) * sizeof(Lever));
        n -= singles;
    }
    return n;
}

// The plan's table: a row per stage (and one for a stage's last tp, cp, dp position where it differs), then
// the machine-readable lines "plan STAGE CATEGORY PEAK" that tests read.
static void plan_print_stages(const Args *a, const GPT2Config *c, int world, PlanBuild b, const MemPlan *plans) {
    printf("%-5s", "stage");
    for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11s", mem_category_names[k]); }
    printf(" | %10s  (peak MiB per rank)\n", "peak total");
    for (int s = 0; s < a->pp; s++) {
        printf("%-5d", s);
        for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11.1f", plans[s].peak[k] / 1048576.0); }
        printf(" | %10.1f\n", plans[s].peak_total / 1048576.0);
        // the stage's last (tp, cp, dp) position: the same, or a row of its own
        int last = s * a->tp * a->cp + (a->tp - 1) + a->tp * (a->cp - 1) + a->tp * a->cp * a->pp * (a->dp - 1);
        MemPlan other = gpt2_plan(a, c, moe_options(a, c), world, last, b);
        int same = other.peak_total == plans[s].peak_total;
        for (int k = 0; k < MEM_NCAT; k++) { same &= other.peak[k] == plans[s].peak[k]; }
        if (!same) {
            printf("r%-4d", last);
            for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11.1f", other.peak[k] / 1048576.0); }
            printf(" | %10.1f  (rank %d: the stage's last tp, cp, dp position)\n", other.peak_total / 1048576.0, last);
        }
    }
    for (int s = 0; s < a->pp; s++) {   // machine-readable, for tests: "plan stage category peak"
        for (int k = 0; k < MEM_NCAT; k++) { printf("plan %d %s %zu\n", s, mem_category_names[k], plans[s].peak[k]); }
        printf("plan %d total %zu\n", s, plans[s].peak_total);
    }
}

// Over the limit: the largest category of the worst stage, what dominates it, and the levers (single ones,
// or pairs when none fits) ranked by fit and time, with the machine-readable "lever ..." lines.
static void plan_print_advice(const Args *a, const GPT2Config *c, int world, PlanBuild b, double limit, const MemPlan *plans,
                              int worst) {
    int big = 0;
    for (int k = 1; k < MEM_NCAT; k++) { if (plans[worst].peak[k] > plans[worst].peak[big]) { big = k; } }
    char why[256];
    plan_explain(a, c, world, worst, big, b, plans[worst].slots, why, sizeof(why));
    printf("largest on stage %d: %s = %.2f GiB\n", worst, mem_category_names[big], gib(plans[worst].peak[big]));
    printf("  %s\n", why);
    Lever *levers = (Lever *)malloc_check(sizeof(Lever) * 256);
    Args base = *a;
    int n = plan_levers(&base, c, world, b, limit, levers, 0), any = 0;
    for (int i = 0; i < n; i++) { any |= levers[i].fits; }
    if (!any) { n = plan_levers(&base, c, world, b, limit, levers, 1); }
    qsort(levers, n, sizeof(Lever), lever_order);
    printf("levers (%s; world %d and -d %d fixed, so tp, cp or pp x2 halves dp), fits first, then fastest; the time "
           "per step is a model of GPU ranks (%.0f TFLOP/s each, %.0f GB/s inside a node for tp and cp, %.0f GB/s across "
           "for pp and dp, %.0f us per layer and micro-batch, the bubble, flash attention %.0fx slower): it ranks the "
           "levers, it is not this machine's step%s:\n", any ? "one at a time" : "no single lever fits: pairs of two",
           world, a->total_batch, PLAN_FLOPS / 1e12, PLAN_NODE_BW / 1e9, PLAN_NET_BW / 1e9, PLAN_LAYER_COST * 1e6,
           PLAN_FLASH_SLOWER, b.cuda ? "" : " (a CPU rank runs far slower)");
    for (int i = 0; i < n && i < 12; i++) {
        printf("  %-8s %9.3f GiB  %10.2f ms/step  %s\n", levers[i].fits ? "fits" : "too big", gib(levers[i].peak),
               levers[i].seconds * 1e3, levers[i].what);
    }
    for (int i = 0; i < n; i++) {   // machine-readable, for tests: "lever rank fits peak_bytes seconds what"
        printf("lever %d %d %.0f %.6f %s\n", i, levers[i].fits, levers[i].peak, levers[i].seconds, levers[i].what);
    }
    if (n == 0) { printf("  (no lever applies to this layout)\n"); }
    printf("  (this layout: %.2f ms/step)\n", plan_seconds(a, c, world, b) * 1e3);
    free(levers);
}

// Prints the plan of every stage and, with a limit, whether each fits; over the limit, what dominates
// and the levers. Returns 1 if every rank fits (or there is no limit).
static int plan_report(const Args *a, const GPT2Config *c, int world, double limit) {
    PlanBuild b = plan_build(a);
    MemPlan *plans = (MemPlan *)malloc_check(sizeof(MemPlan) * a->pp);
    int worst = plan_stages(a, c, world, b, plans), accum = a->total_batch / (a->B * a->T * a->dp);
    double reserve = plan_reserve(b);
    printf("memory plan: L %d C %d NH %d Vp %d%s, world %d = tp %d x cp %d x pp %d x dp %d, B %d T %d x %d "
           "micro-batches, zero %d%s, %s%s, recompute %s, ce chunk %d; %s\n",
           c->num_layers, c->channels, c->num_heads, c->padded_vocab_size, c->num_experts ? " (MoE)" : "", world, a->tp,
           a->cp, a->pp, a->dp, a->B, a->T, accum, a->zero, a->sp ? ", sp" : "", a->pp_schedule,
           a->vpp > 1 ? " (vpp)" : "", a->recompute, a->ce_chunk, b.name);
    plan_print_stages(a, c, world, b, plans);
    int fits = 1;
    if (limit > 0) {
        double need = (double)plans[worst].peak_total + reserve;
        fits = need <= limit;
        printf("limit %.2f GiB per rank%s: stage %d needs %.2f GiB: %s\n", gib(limit),
               reserve > 0 ? " (1.00 GiB of it assumed for the CUDA context and NCCL)" : "", worst, gib(need),
                   fits ? "fits" : "does NOT fit");
    }
    if (!fits) { plan_print_advice(a, c, world, b, limit, plans, worst); }
    fflush(stdout);
    free(plans);
    return fits;
}



// Before allocating: this rank's planned peak against --memory-limit (on CUDA, without one: the free device
// memory, less the reserve the plan assumes for the CUDA context and NCCL). If any rank does not fit, every
// rank stops; rank 0 prints the plan and the levers first.
static void check_memory_fits(const Args *a, const GPT2Config *c, Grid *g) {
    PlanBuild b = plan_build(a);
    double limit = a->memory_limit > 0 ? a->memory_limit : device_free_bytes();
    if (limit <= 0) { return; }
    MemPlan mine = gpt2_plan(a, c, moe_options(a, c), g->world_size, g->rank, b);
    double need = (double)mine.peak_total + (a->memory_limit > 0 ? plan_reserve(b) : 0.0);
    int over = need > limit ? 1 : 0;
    comm_host_all_reduce(&g->world, &over, 1, DT_INT, HOST_MAX, "all-reduce (memory plan)");
    if (!over) { return; }
    Args shown = *a;
    if (g->rank == 0) { plan_report(&shown, c, g->world_size, limit); }
    fail_all(g->rank,
             "the planned peak of a rank exceeds %s %.2f GiB: see the plan and the levers above (or --plan %d to "
             "explore)",
             a->memory_limit > 0 ? "--memory-limit" : "the free device memory", gib(limit), g->world_size);
}

#endif // LLMC_PLAN_H
