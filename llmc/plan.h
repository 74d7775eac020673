// The memory plan (--plan N, --memory-limit): any rank's peak bytes per category for any world size and flags,
// from the code that allocates: the model's own set-up runs with the allocator only counting (alloc.h) on a grid
// without communicators (grid_plan): no weights, no device, one process. The model gives that plan (plan_model,
// which train_gpt.cu sets); this file plans every stage and says what dominates a category. The
// cost model (cost_model.h) times a planned layout; layout_search.h reports plans, levers and searches.
#ifndef LLMC_PLAN_H
#define LLMC_PLAN_H

#include "utils.h"
#include "alloc.h"
#include "comm.h"
#include "attention.h"
#include "model_file.h"
#include "layout.h"
#include "moe.h"
#include "pipeline_split.h"
#include "expert_parallel.h"
#include "cost_model.h"

typedef struct { size_t floatx; int cuda; const char *name; } PlanBuild;   // the build planned for

// precision: --plan-precision bf16|fp32 (NULL: this build)
static PlanBuild plan_build(const char *precision) {
#ifdef USE_CUDA
    PlanBuild b = {sizeof(floatX), 1,
                   sizeof(floatX) == 2 ? "CUDA build, bf16 (AdamW state and master weights fp32)" : "CUDA build, fp32"};
#else
    PlanBuild b = {sizeof(floatX), 0, "CPU build, fp32"};
#endif
    if (precision && !strcmp(precision, "bf16")) {
        b = (PlanBuild){2, 1, "CUDA build, bf16 (AdamW state and master weights fp32)"};
    }
    if (precision && !strcmp(precision, "fp32")) { b = (PlanBuild){4, 1, "CUDA build, fp32"}; }
    return b;
}

// The plan of rank `rank` of a world of `world` ranks, made by the model (set by the program before any plan is
// made); shape (if not NULL): the rank's shapes its step's bytes follow from (cost_model.h).
typedef MemPlan (*ModelPlan)(const Layout *lay, const ModelConfig *c, MoEOptions moe, int world, int rank, PlanBuild b,
                             CommShape *shape);
static ModelPlan plan_model = NULL;

static MemPlan plan_rank(const Layout *lay, const ModelConfig *c, MoEOptions moe, int world, int rank, PlanBuild b,
                         CommShape *shape) {
    if (!plan_model) { fail("plan_rank: the model has not set plan_model: a bug"); }
    return plan_model(lay, c, moe, world, rank, b, shape);
}

// What the CUDA context and NCCL take beside the allocator's buffers (an assumption, stated with the plan).
static double plan_reserve(PlanBuild b) { return b.cuda ? 1024.0 * 1048576.0 : 0.0; }

// The plan of every pipeline stage (tp, cp, dp rank 0 of each: the other positions hold as much), and its
// shapes for the cost model (shapes: NULL, or pp of them); returns the stage with the largest peak total.
static int plan_stages(const Layout *lay, const ModelConfig *c, MoEOptions moe, int world, PlanBuild b, MemPlan *plans,
                       CommShape *shapes) {
    int worst = 0;
    for (int s = 0; s < lay->pp; s++) {
        plans[s] = plan_rank(lay, c, moe, world, s * lay->tp * lay->cp, b, shapes ? &shapes[s] : NULL);
    }
    for (int s = 1; s < lay->pp; s++) { if (plans[s].peak_total > plans[worst].peak_total) { worst = s; } }
    return worst;
}

static double gib(double bytes) { return bytes / 1073741824.0; }

// What dominates a category of the plan, in words (for the advice).
static void plan_explain(const Layout *lay, const ModelConfig *c, int world, int stage, int cat, PlanBuild b, int slots,
                         char *out, size_t n) {
    int dp = world / (lay->tp * lay->cp * lay->pp), accum = lay->total_batch / (lay->B * lay->T * dp), layers = 0;
    int first[PIPE_MAX_LAYERS + 1];
    char err[256];
    if (layer_split(first, lay->pp_layers, c, lay->T, lay->pp, lay->vpp, err, sizeof(err))) { fail("%s", err); }
    for (int v = 0; v < lay->vpp; v++) { layers += first[v * lay->pp + stage + 1] - first[v * lay->pp + stage]; }
    double X = (double)b.floatx, BT = (double)lay->B * lay->T / lay->cp, P = (double)num_parameters(c) / lay->pp / lay->tp;
    switch (cat) {
    case MEM_PARAMS: snprintf(out, n, "parameters: about P/(pp tp) = %.0fM x %.0f B%s", P / 1e6, X,
                              lay->zero == 3 ? " / dp (ZeRO 3)" : ", a full copy on every dp rank"); break;
    case MEM_GRADS: snprintf(out, n, "gradients: about P/(pp tp) = %.0fM x %.0f B%s", P / 1e6, X,
                             lay->zero >= 2 ? " / dp (ZeRO 2-3)" : ", a full copy on every dp rank"); break;
    case MEM_OPTIMIZER: snprintf(out, n, "AdamW m, v%s: %d B per parameter%s",
                                 b.floatx == 2 ? " and fp32 master weights" : "", b.floatx == 2 ? 12 : 8,
                                 lay->zero >= 1 ? " / dp (ZeRO 1-3)"
                                         : " for every parameter of the stage (ZeRO 0)"); break;
    case MEM_ACTIVATIONS: snprintf(out, n,
                                   "activations: %d micro-batch(es)%s of B %d x T/cp %.0f tokens in flight on stage %d (%s, %d micro-batches), %d layers each%s%s",
                                   slots, lay->vpp > 1 ? " x model chunks" : "", lay->B, BT / lay->B, stage, lay->pp_schedule,
                                       accum, layers,
                                   lay->tp > 1 && !lay->sp ? ", the LayerNorm/residual part replicated over tp (no --sp)"
                                           : "", strcmp(lay->recompute, "none") ? "" : ", nothing recomputed"); break;
    case MEM_LOGITS: snprintf(out, n, "logits: %s x Vp/tp = %d x %d x %.0f B",
                              lay->ce_chunk == 0 ? "all B*T/cp tokens (--ce-chunk 0)" : "one CE chunk",
                              lay->ce_chunk == 0 || lay->ce_chunk > BT ? (int)BT : lay->ce_chunk,
                                  c->padded_vocab_size / lay->tp, X); break;
    case MEM_COMM: snprintf(out, n,
                            "comm buffers: MoE dispatch rows, the cp ring's k, v, cp's all-to-all blocks (Ulysses), "
                            "or pipeline gradient copies"); break;
    default: snprintf(out, n, "workspace: %s",
                      b.cuda && (lay->cp == 1 || cp_ulysses_degree(lay) == lay->cp)
                      ? "cuBLAS attention scores (NH/tp, T, T) in fp32 and floatX (Ulysses: NH/(tp cp) heads of the "
                        "whole T), and the layers' scratch"
                                                                    : "one layer's scratch (B*T, 4C/tp)"); break;
    }
}

// The plan's table: a row per stage (and one for a stage's last tp, cp, dp position where it differs), then
// the machine-readable lines "plan STAGE CATEGORY PEAK" that tests read.
static void plan_print_stages(const Layout *lay, const ModelConfig *c, MoEOptions moe, int world, PlanBuild b,
                              const MemPlan *plans) {
    printf("%-5s", "stage");
    for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11s", mem_category_names[k]); }
    printf(" | %10s  (peak MiB per rank)\n", "peak total");
    for (int s = 0; s < lay->pp; s++) {
        printf("%-5d", s);
        for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11.1f", plans[s].peak[k] / 1048576.0); }
        printf(" | %10.1f\n", plans[s].peak_total / 1048576.0);
        // the stage's last (tp, cp, dp) position: the same, or a row of its own
        int tcp = lay->tp * lay->cp, last = s * tcp + (lay->tp - 1) + lay->tp * (lay->cp - 1) + tcp * lay->pp * (lay->dp - 1);
        MemPlan other = plan_rank(lay, c, moe, world, last, b, NULL);
        int same = other.peak_total == plans[s].peak_total;
        for (int k = 0; k < MEM_NCAT; k++) { same &= other.peak[k] == plans[s].peak[k]; }
        if (!same) {
            printf("r%-4d", last);
            for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11.1f", other.peak[k] / 1048576.0); }
            printf(" | %10.1f  (rank %d: the stage's last tp, cp, dp position)\n", other.peak_total / 1048576.0, last);
        }
    }
    for (int s = 0; s < lay->pp; s++) {   // machine-readable, for tests: "plan stage category peak"
        for (int k = 0; k < MEM_NCAT; k++) { printf("plan %d %s %zu\n", s, mem_category_names[k], plans[s].peak[k]); }
        printf("plan %d total %zu\n", s, plans[s].peak_total);
    }
}

#endif // LLMC_PLAN_H
