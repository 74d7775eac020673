// The command line: the Args, the one table of flags (name, alias, field, type, range, help), the parser,
// the check that every rank was given the same flags, the run's checks beside the layout's (layout.h), and what the
// flags make: the model's options, its MoE options and the model itself (-e, or the checkpoint in -o). Flags are
// llm.c's letters for what llm.c has, GNU long options (Megatron's names as aliases) for the rest; unknown flags and
// bad values are errors, never ignored.
#ifndef LLMC_ARGS_H
#define LLMC_ARGS_H

#include <stddef.h>
#include <errno.h>
#include <ctype.h>
#include "utils.h"
#include "guard.h"
#include "comm.h"
#include "attention.h"
#include "pipeline.h"
#include "pipeline_split.h"
#include "moe.h"
#include "model_file.h"
#include "upcycle.h"          // (apply_moe_shape: a dense model upcycled)
#include "run_dir.h"          // (load_model: the newest checkpoint in -o)
#include "layout.h"
#include "cost_model.h"       // (MACHINE_KEYS: --machine's help)

#define MAX_FLAGS 80

typedef struct {
    const char *train_pattern, *val_pattern, *output_dir, *model;
    Layout layout;               // -b, -t, -d, --tp, --sp, --cp, --pp, ...: how the run is cut (layout.h)
    int max_steps, warmup, val_every, val_batches, sample_every, gen_tokens;
    int checkpoint_every, resume, memory_report, comm_report, shuffle;
    int experts, topk, moe_every, cap1000;   // MoE; the first three -1 when not given
    int expert_hidden, shared_experts;        // MoE: H, S (-1 when not given)
    float lr, final_frac, weight_decay, grad_clip, aux_coeff, z_coeff, timeout;   // z_coeff -1: not given
    const char *router_score;    // --router-score softmax|sigmoid (NULL: the model's; softmax for a new one)
    float moe_bias_rate;         // --moe-bias-rate: loss-free balancing's step (0: off)
    const char *optimizer;       // --optimizer adamw|muon (muon.h: the 2-D matrices inside the blocks)
    float muon_momentum;         // --muon-momentum: Muon's mu (0.95)
    int max_skips, help;
    float skip_loss_z, skip_norm_z;     // -sl, -sg: skip an update this many standard deviations above (0 off)
    int deterministic;           // --deterministic: every GEMM with the cuBLASLt heuristic's first algorithm
    int async_checkpoint, overlap;
    int comm_streams;            // --comm-streams 1: every group's NCCL calls on one stream (CUDA)
    int check_collectives;       // --check-collectives: each collective's group agrees on it first (comm.h)
    int plan;                    // --plan N: print the memory plan for N ranks and exit
    const char *plan_precision;  // --plan-precision bf16|fp32: plan the CUDA build's sizes (NULL: this build's)
    double memory_limit;         // --memory-limit: bytes per rank (0: none; CUDA: the free device memory)
    int plan_search;             // --plan-search N: rank the layouts of N ranks by the cost model, and exit
    int gpus_per_node;           // --gpus-per-node G: ranks per node for the cost model (0: the machine's)
    const char *machine;         // --machine FILE: the cost model's rates (key=value; NULL: the defaults)
    const char *calibrate;       // --calibrate FILE: measure this machine's rates into FILE, and exit
    const char *scheduler, *drop_policy, *trace_dir;
    const char *hellaswag;       // --hellaswag FILE: llm.c's HellaSwag eval file (NULL: none)
    unsigned int seed;
    int keep_newest, keep_every;   // -nk, -nm: checkpoint retention (0: keep them all)
    int overwrite;                 // --overwrite: a fresh run deletes an earlier run's checkpoints in -o
    const char *prompt_ids, *prompt;   // --prompt-ids 1,2,3; --prompt TEXT (byte models)
    float temperature;                  // --sample-temperature (0: the most likely token)
    int top_k;                          // --sample-top-k (0: not given, every token)
    const char *given[MAX_FLAGS];   // the value of each flag given (FLAGS order), NULL if not: compared across ranks
} Args;

static void default_args(Args *a) {
    memset(a, 0, sizeof(*a));
    a->layout = default_layout();
    a->model = "d4"; a->max_steps = -1; a->lr = 3e-4f; a->warmup = 0;
    a->final_frac = 1.0f; a->weight_decay = 0.0f; a->val_every = 20; a->val_batches = 20; a->sample_every = 20;
    a->gen_tokens = 64;
    a->checkpoint_every = 0;
    a->resume = 0;
    a->shuffle = -1; a->grad_clip = 1.0f; a->scheduler = "cosine";
    a->optimizer = "adamw"; a->muon_momentum = 0.95f;
    a->experts = a->topk = a->moe_every = -1;
    a->expert_hidden = a->shared_experts = -1;
    a->cap1000 = 1250;
    a->drop_policy = "probs";
    a->aux_coeff = 0.01f;
    a->z_coeff = -1.0f;   // (0.001, or 0 with sigmoid scores: moe_options)
    a->timeout = (float)DEFAULT_TIMEOUT; a->max_skips = 5; a->overlap = 1;
    a->seed = 1337;
    a->temperature = 1.0f;
}

// Flag errors are recorded, not fatal at once: every rank first takes part in agree_on_args (the first
// collective), so a rank given a bad flag never leaves the others waiting.
static char arg_error[512] = "";
static void arg_fail(const char *fmt, ...) {
    if (arg_error[0]) { return; }   // the first one counts
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(arg_error, sizeof(arg_error), fmt, ap);
    va_end(ap);
}

static int parse_int_arg(const char *flag, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno != 0) {
        arg_fail("%s expects an integer, got '%s'", flag, v);
        return (int)lo;
    }
    if (x < lo || x > hi) { arg_fail("%s must be in [%ld, %ld], got %ld", flag, lo, hi, x); return (int)lo; }
    return (int)x;
}

static float parse_float_arg(const char *flag, const char *v, double lo, double hi) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || errno != 0 || x != x) {
        arg_fail("%s expects a number, got '%s'", flag, v);
        return (float)lo;
    }
    if (x < lo || x > hi) { arg_fail("%s must be in [%g, %g], got %g", flag, lo, hi, x); return (float)lo; }
    return (float)x;
}

// A size in bytes: a number with an optional K, M, G or T (powers of 2^10), e.g. 80G.
static double parse_size_arg(const char *flag, const char *v) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    const char *units = "KMGT", *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    if (*v == '\0' || errno != 0 || x != x || x <= 0 || (*end && (u == NULL || end[1] != '\0'))) {
        arg_fail("%s expects a size such as 80G (K, M, G, T: powers of 1024), got '%s'", flag, v);
        return 0;
    }
    return x * (u ? pow(1024.0, (double)(u - units + 1)) : 1.0);
}

// --capacity-factor: a number with at most 3 decimals -> F x 1000 (moe.h computes the capacity in integers)
static int parse_capacity_factor(const char *v) {
    double F = parse_float_arg("--capacity-factor", v, 0.0, 1e6);
    double F1000 = round(1000.0 * F);
    if (fabs(1000.0 * F - F1000) > 1e-6 * (1.0 + F1000)) {
        arg_fail("--capacity-factor %s has more than 3 decimals", v);
    }
    return (int)F1000;
}

// The flags: one row each, the only list of them. parse_args, print_usage and agree_on_args read it.
// An alias is the same flag (giving both is giving it twice). kind says how the value is read and
// checked: an integer or a number in [lo, hi], one of the choices "a|b|c", a directory (not empty), a
// size (80G), the capacity factor (3 decimals), or a switch (no value: the field is set to 1).
typedef enum { F_INT, F_UINT, F_FLOAT, F_STRING, F_DIR, F_CHOICE, F_SIZE, F_CAPACITY, F_SWITCH } FlagKind;
typedef struct {
    const char *name, *alias;
    FlagKind kind;
    size_t field;            // offsetof(Args, the field)
    double lo, hi;           // F_INT, F_UINT, F_FLOAT: the range accepted
    const char *choices;     // F_CHOICE: "a|b|c"
    const char *value, *help;   // for the usage: the value's name, what the flag does (and its default)
} Flag;

#define ARG(f) offsetof(Args, f)
static const Flag FLAGS[] = {
    {"-i", 0, F_STRING, ARG(train_pattern), 0, 0, 0, "GLOB",
        "train data shards (llm.c format; default: the built-in corpus)"},
    {"-j", 0, F_STRING, ARG(val_pattern), 0, 0, 0, "GLOB",
        "validation data shards (default: none, or the built-in corpus)"},
    {"-o", 0, F_DIR, ARG(output_dir), 0, 0, 0, "DIR", "output dir: main.log and checkpoints (default: none)"},
    {"-e", 0, F_STRING, ARG(model), 0, 0, 0, "MODEL",
        "llm.c model file, dN (L=N, C=64N, NH=N), or L=..,C=..,NH=..,V=..,maxT=..[,Vp=..][,E=..,k=..,every=..] (d4)"},
    {"-b", 0, F_INT, ARG(layout.B), 1, 1 << 20, 0, "B", "micro-batch size per rank (4)"},
    {"-t", 0, F_INT, ARG(layout.T), 1, 1 << 20, 0, "T", "sequence length (64)"},
    {"-d", 0, F_INT, ARG(layout.total_batch), -1, 1 << 30, 0, "TOKENS",
        "tokens per step; B*T*dp must divide it, the rest is accumulation (B*T*dp)"},
    {"-x", 0, F_INT, ARG(max_steps), -1, 1 << 30, 0, "N",
        "steps (-1: one epoch; 0: no step, only the end's work: validation, a sample) (-1)"},
    {"-l", 0, F_FLOAT, ARG(lr), 0.0, 10.0, 0, "LR", "learning rate (3e-4)"},
    {"-u", 0, F_INT, ARG(warmup), 0, 1 << 30, 0, "N", "warm-up steps (0)"},
    {"-q", 0, F_FLOAT, ARG(final_frac), 0.0, 1.0, 0, "F", "final learning rate fraction (1.0)"},
    {"-c", 0, F_FLOAT, ARG(weight_decay), 0.0, 10.0, 0, "WD", "weight decay, 2-D matrices only (0)"},
    {"-k", 0, F_CHOICE, ARG(scheduler), 0, 0, "cosine|linear|constant|wsd", "SCHED", "learning rate schedule (cosine)"},
    {"-v", 0, F_INT, ARG(val_every), 0, 1 << 30, 0, "N", "validate every N steps, 0 off (20)"},
    {"-m", 0, F_INT, ARG(val_batches), -1, 1 << 30, 0, "N", "validation batches, -1 the whole val set (20)"},
    {"-s", 0, F_INT, ARG(sample_every), 0, 1 << 30, 0, "N", "sample every N steps, 0 off (20)"},
    {"-g", 0, F_INT, ARG(gen_tokens), 1, 1 << 20, 0, "N", "tokens to generate; past -t the window slides (64)"},
    {"-n", 0, F_INT, ARG(checkpoint_every), 0, 1 << 30, 0, "N", "checkpoint every N steps, 0 off; needs -o (0)"},
    {"-nk", 0, F_INT, ARG(keep_newest), 0, 1 << 30, 0, "N", "keep the newest N checkpoints, 0 all (0)"},
    {"-nm", 0, F_INT, ARG(keep_every), 0, 1 << 30, 0, "M", "also keep every checkpoint whose step is a multiple of M (0)"},
    {"-y", 0, F_INT, ARG(resume), 0, 2, 0, "0|1|2",
        "resume: 1 from the newest checkpoint in -o (error if none), 2 if there is one (0)"},
    {"--overwrite", 0, F_SWITCH, ARG(overwrite), 0, 0, 0, NULL,
        "a new run (-y 0) in an -o that holds an earlier run's checkpoints deletes them (without it: refused)"},
    {"--zero", "-z", F_INT, ARG(layout.zero), 0, 3, 0, "0-3", "ZeRO stage over the dp group (0)"},
    {"--tp", "--tensor-model-parallel-size", F_INT, ARG(layout.tp), 1, 1 << 16, 0, "N", "tensor parallel (1)"},
    {"--cp", "--context-parallel-size", F_INT, ARG(layout.cp), 1, 1 << 16, 0, "N",
        "context parallel: each sequence over N ranks (attention: --cp-kind); T a multiple of 2N (1)"},
    {"--cp-kind", 0, F_CHOICE, ARG(layout.cp_kind), 0, 0, "ring|ulysses|hybrid", "KIND",
        "cp's attention: ring (k, v around the cp ring), ulysses (all-to-alls to a head shard of the whole sequence; "
        "the heads per tp rank divisible by cp), hybrid (all-to-all in groups of --cp-ulysses U, the ring across "
        "them) (ring)"},
    {"--cp-ulysses", 0, F_INT, ARG(layout.cp_ulysses), 1, 1 << 16, 0, "U",
        "--cp-kind hybrid: the all-to-all groups' size, 1 < U < cp dividing cp (no default)"},
    {"--pp", 0, F_INT, ARG(layout.pp), 1, 1 << 16, 0, "N", "pipeline stages (1)"},
    {"--vpp", "--virtual-pipeline-model-parallel-size", F_INT, ARG(layout.vpp), 1, 1024, 0, "V",
        "model chunks per stage; V > 1 is the interleaved schedule (1)"},
    {"--dp", 0, F_INT, ARG(layout.dp), 1, 1 << 16, 0, "N", "data parallel; checked against world / (tp cp pp) (that)"},
    {"--ep", "--expert-model-parallel-size", F_INT, ARG(layout.ep), 1, 1 << 16, 0, "N", "expert parallel, within dp (1)"},
    {"--ce-chunk", 0, F_INT, ARG(layout.ce_chunk), 0, 1 << 30, 0, "N",
        "tokens per cross-entropy chunk, 0 = the full logits (256)"},
    {"--seed", 0, F_UINT, ARG(seed), 0, 2147483647, 0, "N",
        "init seed, and the built-in corpus's and the shuffle's (1337)"},
    {"--shuffle", 0, F_INT, ARG(shuffle), 0, 1, 0, "0|1",
        "shuffle shards and samples in llm.c's order (on for several shards)"},
    {"--optimizer", 0, F_CHOICE, ARG(optimizer), 0, 0, "adamw|muon", "OPT",
        "muon: the 2-D matrices inside the blocks (q, k, v, attention output, MLP, experts) by Muon, each matrix "
        "orthogonalised on one rank; everything else AdamW; the same -l and -c (adamw)"},
    {"--muon-momentum", 0, F_FLOAT, ARG(muon_momentum), 0.0, 0.999, 0, "MU", "Muon's momentum (0.95)"},
    {"--grad-clip", 0, F_FLOAT, ARG(grad_clip), 0.0, 1e9, 0, "F", "clip the global gradient norm, 0 off (1.0)"},
    {"--pp-layers", 0, F_STRING, ARG(layout.pp_layers), 0, 0, 0, "N,N|auto|auto:FILE",
        "layers of each pipeline stage (with --vpp: of each model chunk, in virtual-stage order), or auto: the "
        "split whose costliest stage costs least in FLOPs, the LM head counted, or auto:FILE: in the costs a "
        "--comm-report run measured (its -o/pipeline_costs.txt) (default: even)"},
    {"--pp-schedule", 0, F_CHOICE, ARG(layout.pp_schedule), 0, 0, "1f1b|gpipe|interleaved|zb", "SCHED",
        "pipeline schedule; zb: ZB-H1, each backward split into B and a W that fills the waits (1f1b)"},
    {"--experts", "--num-experts", F_INT, ARG(experts), 1, MOE_MAX_EXPERTS, 0, "E",
        "MoE experts per MoE layer; a dense model file is upcycled (each expert its layer's MLP)"},
    {"--topk", "--moe-router-topk", F_INT, ARG(topk), 1, MOE_MAX_EXPERTS, 0, "K", "experts per token (1)"},
    {"--moe-every", 0, F_INT, ARG(moe_every), 1, 1024, 0, "N", "every Nth layer is MoE (1)"},
    {"--expert-hidden", "--moe-ffn-hidden-size", F_INT, ARG(expert_hidden), 1, 65536, 0, "H",
        "hidden width of each expert, routed and shared (fine-grained experts: H < 4C) (4C)"},
    {"--shared-experts", 0, F_INT, ARG(shared_experts), 0, MOE_MAX_SHARED, 0, "S",
        "always-on experts per MoE layer beside the routed ones, one MLP of width S*H, tensor-parallel (0)"},
    {"--capacity-factor", 0, F_CAPACITY, ARG(cap1000), 0, 0, 0, "F",
        "expert capacity factor, at most 3 decimals; 0 = dropless (1.25)"},
    {"--drop-policy", 0, F_CHOICE, ARG(drop_policy), 0, 0, "probs|position", "POLICY",
        "which assignments over capacity are dropped (probs)"},
    {"--aux-coeff", 0, F_FLOAT, ARG(aux_coeff), 0.0, 1e6, 0, "A", "load-balancing loss coefficient (0.01)"},
    {"--z-coeff", 0, F_FLOAT, ARG(z_coeff), 0.0, 1e6, 0, "Z",
        "router z-loss coefficient (0.001; with sigmoid scores 0, the only value allowed)"},
    {"--router-score", 0, F_CHOICE, ARG(router_score), 0, 0, "softmax|sigmoid", "S",
        "router scores of a new MoE model: softmax over the experts, or a sigmoid each (DeepSeek-V3; needs "
        "--topk >= 2); a MoE model file keeps its own (softmax)"},
    {"--moe-bias-rate", 0, F_FLOAT, ARG(moe_bias_rate), 0.0, 1.0, 0, "U",
        "loss-free load balancing: each step an overloaded expert's routing bias -U, an underloaded one's +U "
        "(DeepSeek-V3; try 0.001), 0 off (0)"},
    {"--trace", 0, F_DIR, ARG(trace_dir), 0, 0, 0, "DIR", "a Chrome trace per rank (dev/trace.py merges them)"},
    {"--hellaswag", 0, F_STRING, ARG(hellaswag), 0, 0, 0, "FILE",
        "HellaSwag's accuracy (llm.c's acc_norm) on this eval file (dev/data/hellaswag.py) at every -v step after 0 and "
        "at the end (none)"},
    {"--comm-streams", 0, F_INT, ARG(comm_streams), 0, 1, 0, "0|1",
        "CUDA: 1 runs every group's NCCL calls on one stream, in program order (a fallback: no overlap between "
        "groups, no order between communicators to get wrong); 0 a stream per group (0; the CPU build: no effect)"},
    {"--timeout", 0, F_FLOAT, ARG(timeout), 0.0, 1e7, 0, "S",
        "stop when a collective makes no progress for S seconds, 0 off (600)"},
    {"-sl", 0, F_FLOAT, ARG(skip_loss_z), 0.0, 1e9, 0, "Z",
        "skip an update whose loss is Z standard deviations above the last 128 (0 off; always: above 2 ln V) (0)"},
    {"-sg", 0, F_FLOAT, ARG(skip_norm_z), 0.0, 1e9, 0, "Z",
        "skip an update whose gradient norm is Z standard deviations above the last 128, 0 off (0)"},
    {"--max-skips", 0, F_INT, ARG(max_skips), 1, 1 << 30, 0, "N",
        "stop after N updates in a row skipped (a non-finite or diverging loss or norm) (5)"},
    {"--recompute", 0, F_CHOICE, ARG(layout.recompute), 0, 0, "none|mlp|full", "WHAT",
        "recompute the MLP's fc/GELU outputs, or whole layers, in the backward (none)"},
    {"--overlap", 0, F_INT, ARG(overlap), 0, 1, 0, "0|1",
        "ZeRO-3: gather the next layer while one computes; pipeline: post receives early (1)"},
    {"--attention", 0, F_CHOICE, ARG(layout.attention), 0, 0, "cublas|flash|cudnn", "PATH",
        "CUDA attention: cuBLAS through an (NH, T, T) workspace, the flash kernels (bf16, head size 64 or 128: else cuBLAS), or cuDNN's (make USE_CUDNN=1) (flash)"},
    {"--deterministic", 0, F_SWITCH, ARG(deterministic), 0, 0, 0, 0,
        "CUDA: each GEMM with cuBLASLt's first-ranked algorithm, untimed (else a one-rank run times the candidates once, kept in -o)"},
    {"--plan", 0, F_INT, ARG(plan), 1, 1 << 20, 0, "N",
        "print every rank's planned peak memory for a world of N ranks, and exit"},
    {"--plan-precision", 0, F_CHOICE, ARG(plan_precision), 0, 0, "bf16|fp32", "P",
        "plan the CUDA build's sizes (from any build)"},
    {"--memory-limit", 0, F_SIZE, ARG(memory_limit), 0, 0, 0, "SIZE",
        "bytes per rank, e.g. 80G: a run over it stops before allocating, with advice"},
    {"--plan-search", 0, F_INT, ARG(plan_search), 1, 1 << 20, 0, "N",
        "every valid layout for N ranks (tp, cp, pp, schedule, dp, ep, ZeRO, SP, recompute, -b, CE chunk; -d fixed), "
        "planned exactly, ranked by the cost model's time; the 10 fastest that fit --memory-limit, and exit"},
    {"--gpus-per-node", 0, F_INT, ARG(gpus_per_node), 1, 1 << 16, 0, "G",
        "ranks per node for the cost model: a group spanning nodes gets the network's bandwidth (8)"},
    {"--calibrate", 0, F_STRING, ARG(calibrate), 0, 0, 0, "FILE",
        "measure this machine's rates (GEMM per rows, attention, memory, per-layer cost, optimizer, each collective "
        "per group size, how much of one compute hides, cores) "
        "with this build's kernels at the model's shapes into FILE for --machine, and exit"},
    {"--machine", 0, F_STRING, ARG(machine), 0, 0, 0, "FILE",
        "the cost model's rates, key=value lines (" MACHINE_KEYS "; dev/notes/layout_search.md) (an 8 x H200 node)"},
    {"--prompt-ids", 0, F_STRING, ARG(prompt_ids), 0, 0, 0, "IDS",
        "sample after these token ids (1,2,3): at the end of the run, and with -s (dev/sample.py encodes text)"},
    {"--prompt", 0, F_STRING, ARG(prompt), 0, 0, 0, "TEXT", "sample after this text (byte models, V 257)"},
    {"--sample-temperature", 0, F_FLOAT, ARG(temperature), 0.0, 100.0, 0, "F", "sampling temperature, 0 the most likely (1.0)"},
    {"--sample-top-k", 0, F_INT, ARG(top_k), 1, 1 << 20, 0, "K", "sample from the K most likely tokens (all)"},
    {"--sp", 0, F_SWITCH, ARG(layout.sp), 0, 0, 0, 0, "sequence parallel (with --tp)"},
    {"--memory-report", 0, F_SWITCH, ARG(memory_report), 0, 0, 0, 0,
        "bytes per rank and category, after the first step"},
    {"--comm-report", 0, F_SWITCH, ARG(comm_report), 0, 0, 0, 0, "bytes per step and group; the pipeline bubble"},
    {"--async-checkpoint", 0, F_SWITCH, ARG(async_checkpoint), 0, 0, 0, 0,
        "rank 0 writes the checkpoint files on a thread while training goes on"},
    {"--check-collectives", 0, F_SWITCH, ARG(check_collectives), 0, 0, 0, 0,
        "before each collective its group agrees on the call (operation, count, type, number: one small all-reduce); "
        "a disagreement stops the job at once, naming both sides (off)"}};
#undef ARG
#define NUM_FLAGS ((int)(sizeof(FLAGS) / sizeof(FLAGS[0])))
static_assert(sizeof(FLAGS) / sizeof(FLAGS[0]) <= MAX_FLAGS, "MAX_FLAGS: Args.given holds one value per flag");

static void print_usage(void) {
    printf("usage: mpirun -np N ./train_gpt [flags]   (llm.c's letters; Megatron's long names as aliases)\n");
    for (int k = 0; k < NUM_FLAGS; k++) {
        const Flag *f = &FLAGS[k];
        char name[96];
        snprintf(name, sizeof(name), "%s%s%s%s%s", f->name, f->alias ? ", " : "", f->alias ? f->alias : "",
                 f->value ? " " : "", f->value ? f->value : "");
        printf("  %-30s %s\n", name, f->help);
    }
}

// Whether v is one of choices "a|b|c"; and the choices written "a, b or c".
static int choice_valid(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *c = choices; c != NULL; c = strchr(c, '|'), c = c ? c + 1 : NULL) {
        if (n > 0 && !strncmp(c, v, n) && (c[n] == '|' || c[n] == '\0')) { return 1; }
    }
    return 0;
}

static void choice_list(const char *choices, char *out, size_t size) {
    size_t o = 0, n = strlen(choices), bars = 0;
    for (size_t i = 0; i < n; i++) { bars += choices[i] == '|'; }
    for (size_t i = 0, seen = 0; i < n && o + 4 < size; i++) {
        if (choices[i] != '|') { out[o++] = choices[i]; continue; }
        const char *sep = ++seen == bars ? " or " : ", ";
        for (const char *c = sep; *c && o + 1 < size; c++) { out[o++] = *c; }
    }
    out[o] = '\0';
}

// Reads one flag's value v into its field of a (a bad value: arg_fail).
static void parse_flag(const Flag *f, const char *v, Args *a) {
    void *p = (char *)a + f->field;
    switch (f->kind) {
    case F_INT: *(int *)p = parse_int_arg(f->name, v, (long)f->lo, (long)f->hi); break;
    case F_UINT: *(unsigned *)p = (unsigned)parse_int_arg(f->name, v, (long)f->lo, (long)f->hi); break;
    case F_FLOAT: *(float *)p = parse_float_arg(f->name, v, f->lo, f->hi); break;
    case F_SIZE: *(double *)p = parse_size_arg(f->name, v); break;
    case F_CAPACITY: *(int *)p = parse_capacity_factor(v); break;
    case F_DIR:
        if (!*v) { arg_fail("%s expects a directory, got '' (an unset variable?)", f->name); }
        *(const char **)p = v;
        break;
    case F_CHOICE:
        if (!choice_valid(f->choices, v)) {
            char list[128];
            choice_list(f->choices, list, sizeof(list));
            arg_fail("%s expects %s, got '%s'", f->name, list, v);
        }
        *(const char **)p = v;
        break;
    default: *(const char **)p = v; break;
    }
}

// Whether the flag `name` (its name, not an alias) was given.
static int flag_given(const Args *a, const char *name) {
    for (int k = 0; k < NUM_FLAGS; k++) { if (!strcmp(FLAGS[k].name, name)) { return a->given[k] != NULL; } }
    return 0;
}

// Parses argv into a, recording the first bad flag in arg_error (every rank does the same).
static void parse_args(int argc, char **argv, Args *a) {
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") && i + 1 < argc && (!strcmp(argv[i + 1], "0") || !strcmp(argv[i + 1], "1"))) {
            arg_fail("-h %s is llm.c's HellaSwag switch; here -h is the help: give the eval file with --hellaswag FILE "
                     "(dev/data/hellaswag.py writes it)", argv[++i]);
            continue;
        }
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { a->help = 1; continue; }
        int known = -1;
        for (int k = 0; k < NUM_FLAGS; k++) {
            if (!strcmp(f, FLAGS[k].name) || (FLAGS[k].alias && !strcmp(f, FLAGS[k].alias))) { known = k; }
        }
        if (known < 0) { arg_fail("unknown flag '%s' (see -h)", f); continue; }
        const Flag *flag = &FLAGS[known];
        if (a->given[known]) {   // a flag given twice is a mistake, not an override
            arg_fail("flag %s is given twice%s", flag->name, flag->alias ? " (or under its alias)" : "");
            continue;
        }
        if (flag->kind == F_SWITCH) { a->given[known] = "1"; *(int *)((char *)a + flag->field) = 1; continue; }
        if (i + 1 >= argc) { arg_fail("flag %s is missing its value", flag->name); continue; }
        a->given[known] = argv[++i];
        parse_flag(flag, argv[i], a);
    }
    // --vpp V > 1 is the interleaved schedule; --pp-schedule interleaved needs it
    int vpp_given = a->layout.vpp > 1, interleaved = !strcmp(a->layout.pp_schedule, "interleaved");
    int schedule_given = flag_given(a, "--pp-schedule");
    if (vpp_given && schedule_given && !interleaved) {
        arg_fail("--vpp %d is the interleaved schedule, not --pp-schedule %s", a->layout.vpp, a->layout.pp_schedule);
    }
    if (interleaved && !vpp_given) {
        arg_fail("--pp-schedule interleaved needs --vpp V >= 2 (model chunks per stage)");
    }
    if (vpp_given) { a->layout.pp_schedule = "interleaved"; }
    if (a->model[0] == '\0') { arg_fail("-e '': expected a model file, dN, or L=..,C=..,NH=..,V=..,maxT=.."); }
    if (a->val_batches == 0) { arg_fail("-m must be -1 (the whole val set) or at least 1, got 0"); }
    if (a->prompt_ids && a->prompt) { arg_fail("--prompt-ids and --prompt: give one of them"); }
    if ((a->plan > 0) + (a->plan_search > 0) + (a->calibrate != NULL) > 1) {
        arg_fail("--plan, --plan-search and --calibrate: give one of them");
    }
    if (a->overwrite && (a->resume || a->output_dir == NULL)) {
        arg_fail("--overwrite starts a new run in -o, deleting an earlier run's checkpoints: it needs -o and -y 0");
    }
    if (a->output_dir && strlen(a->output_dir) > PATH_LEN - 64) {
        arg_fail("-o is %zu bytes long, at most %d (the file names inside must fit)", strlen(a->output_dir),
                 PATH_LEN - 64);
    }
}

// FNV-1a of a string (NULL: not given)
static uint64_t hash_string(const char *s) {
    if (s == NULL) { return 0; }
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) { h = (h ^ (unsigned char)*s) * 1099511628211ull; }
    return h ^ 1;
}

// The first collective: every rank must have been given the same flags (an MPMD launch or a wrapper
// that differs per rank would hang or silently diverge). Bad flags stop every rank, each with one line;
// -h prints the usage. Then rank 0's flags are compared with every rank's, flag by flag.
static void agree_on_args(Args *a, int rank, int world) {
    int bad = arg_error[0] != 0, any_bad = bad, all_bad = bad, help = a->help, all_help = a->help;
    // the first collective (a rank that never gets here stops the others)
    comm_host_all_reduce(comm_world(), &any_bad, 1, DT_INT, HOST_MAX, "the first collective (the flags)");
    comm_host_all_reduce(comm_world(), &all_bad, 1, DT_INT, HOST_MIN, "the first collective (the flags)");
    comm_host_all_reduce(comm_world(), &help, 1, DT_INT, HOST_MAX, "the first collective (the flags)");
    comm_host_all_reduce(comm_world(), &all_help, 1, DT_INT, HOST_MIN, "the first collective (the flags)");
    if (help && !all_help) {
        if (a->help) { fprintf(stderr, "error: rank %d: -h is given here, not on every rank (every rank must be given the same flags)\n", rank); }
        stop_all(1);
    }
    if (any_bad) {   // the same error everywhere: rank 0 says it; otherwise each rank says its own
        if (all_bad && rank == 0) { fprintf(stderr, "error: %s\n", arg_error); }
        else if (!all_bad && bad) { fprintf(stderr, "error: rank %d: %s\n", rank, arg_error); }
        else if (!all_bad && rank == 0) {
            fprintf(stderr,
                    "error: the flags were rejected on another rank (every rank must be given the same flags)\n");
        }
        stop_all(1);
    }
    if (help) { if (rank == 0) { print_usage(); } stop_all(0); }
    uint64_t mine[MAX_FLAGS], ref[MAX_FLAGS];
    for (int k = 0; k < NUM_FLAGS; k++) { mine[k] = ref[k] = hash_string(a->given[k]); }
    comm_host_bcast(comm_world(), ref, NUM_FLAGS * 8, DT_BYTE, 0, "broadcast of the flags");
    int first = world * NUM_FLAGS;   // (flag * world + rank) of the first difference
    for (int k = 0; k < NUM_FLAGS
         && first == world * NUM_FLAGS; k++) { if (mine[k] != ref[k]) { first = k * world + rank; } }
    comm_host_all_reduce(comm_world(), &first, 1, DT_INT, HOST_MIN, "all-reduce of the flags");
    if (first < world * NUM_FLAGS) {
        int k = first / world, r = first % world;
        if (r == rank) {
            fprintf(stderr,
                    "error: rank %d: flag %s is %s%s%s here, not as on rank 0 (every rank must be given the same "
                    "flags)\n", rank,
                    FLAGS[k].name, a->given[k] ? "'" : "", a->given[k] ? a->given[k] : "not given",
                        a->given[k] ? "'" : "");
        } else {
            fprintf(stderr,
                    "error: rank %d: flag %s differs between the ranks (rank %d has another value than rank 0)\n",
                    rank, FLAGS[k].name, r);
        }
        stop_all(1);
    }
}

// The identity of a fresh run (run_dir.h records it in main.log and its state files; a resume keeps its
// checkpoint's): a hash of the flags that define what is trained and on what, and of the training data's
// fingerprint. Not of -x (a resume may stretch the schedule), of where and when files are written, of the
// layout and the kernels, or of what is evaluated and printed: the same run, in any layout, with any lever,
// writes the same bytes.
static uint64_t args_run_id(const Args *a, uint32_t data_fp) {
    static const char *defining[] = {"-i", "-e", "-t", "-d", "-l", "-u", "-q", "-c", "-k", "--seed", "--shuffle",
                                     "--grad-clip", "-sl", "-sg", "--experts", "--topk", "--moe-every",
                                     "--expert-hidden", "--shared-experts", "--capacity-factor", "--drop-policy",
                                     "--aux-coeff", "--z-coeff", "--router-score", "--moe-bias-rate"};
    uint64_t h = hash_string("run") ^ data_fp;
    for (int k = 0; k < NUM_FLAGS; k++) {
        for (size_t j = 0; j < sizeof(defining) / sizeof(defining[0]); j++) {
            if (strcmp(FLAGS[k].name, defining[j])) { continue; }
            h = (h ^ hash_string(FLAGS[k].name)) * 1099511628211ull;
            h = (h ^ hash_string(a->given[k])) * 1099511628211ull;
        }
    }
    if (!strcmp(a->optimizer, "muon")) {   // (only then: an AdamW run's identity is what it was before Muon)
        char mu[64];
        snprintf(mu, sizeof(mu), "muon %.9g", a->muon_momentum);
        h = (h ^ hash_string(mu)) * 1099511628211ull;
    }
    return h ? h : 1;
}


// Identical on every rank, so every rank exits with the same message before any collective could hang.
static void validate_layout(Args *a, const ModelConfig *c, int world, int rank) {
    char err[512];
    if (layout_error(&a->layout, c, world, err, sizeof(err))) { fail_all(rank, "%s", err); }
    if ((a->checkpoint_every > 0 || a->resume) && a->output_dir == NULL) {
        fail_all(rank, "-n and -y need an output dir (-o)");
    }
    if (a->val_pattern && !a->train_pattern && a->max_steps != 0) {
        fail_all(rank, "-j needs -i to train (without -i both come from the built-in corpus; -x 0 evaluates on -j alone)");
    }
}

// Whether the run samples (every -s steps, or after a prompt at the end): the logits row is allocated, and
// the MoE buffers are sized for dropless routing.
static int args_samples(const Args *a) { return a->sample_every > 0 || a->prompt_ids != NULL || a->prompt != NULL; }

// --attention's name -> attention.h's path
static int attention_path_of(const char *name) {
    return !strcmp(name, "flash") ? ATT_FLASH : !strcmp(name, "cudnn") ? ATT_CUDNN : ATT_CUBLAS;
}

// What a model is made with besides its weights and its grid: the layout's options and the step's shape (the
// flags' meaning for the model).
typedef struct {
    int vpp, zero, sp;        // model chunks per stage, the ZeRO stage, sequence parallelism
    const char *pp_layers;    // the layers of each (virtual) stage: NULL even, "auto", or "5,7" (layer_split)
    MoEOptions moe;
    Recompute recompute;
    int overlap;              // ZeRO-3 prefetch, pipeline sends that complete while the stage computes
    int B, T;                 // a micro-batch: sequences, and the tokens of each this rank holds (T/cp)
    int ce_chunk, accum;      // tokens per cross-entropy chunk; micro-batches per step
    PipeSchedule schedule;
    int moe_dropless;         // the MoE buffers sized for dropless routing (the run samples, or scores HellaSwag)
    int cp_u;                 // cp's all-to-all group size (cp_ulysses_degree: 1 the ring)
    int muon;                 // --optimizer muon
    float muon_momentum;
} ModelOptions;

// The options of a model of layout lay (the command line's, or one the plan tries) and the run's other flags a.
static ModelOptions model_options(const Layout *lay, const Args *a, MoEOptions moe, int dp) {
    const char *schedule = test_hook_pp_schedule() ? test_hook_pp_schedule() : lay->pp_schedule;   // (a test hook's)
    ModelOptions o = {lay->vpp, lay->zero, lay->sp, lay->pp_layers, moe, recompute_mode(lay->recompute), a->overlap,
                      lay->B, lay->T / lay->cp, lay->ce_chunk, lay->total_batch / (lay->B * lay->T * dp),
                      pipe_schedule(schedule), args_samples(a) || a->hellaswag, cp_ulysses_degree(lay),
                      !strcmp(a->optimizer, "muon"), a->muon_momentum};
    return o;
}

// ----------------------------------------------------------------------------
// the MoE flags against the model

// A MoE descriptor's keys it leaves out (named: parse_descriptor's) take the flags' values: --topk, --moe-every,
// --expert-hidden, --shared-experts; a key it names keeps its own (apply_moe_shape refuses a flag that disagrees).
static void moe_descriptor_defaults(const Args *a, int rank, ModelConfig *c, unsigned named) {
    if (c->num_experts == 0) { return; }
    int key[4] = {DK_K, DK_EVERY, DK_H, DK_S}, flag[4] = {a->topk, a->moe_every, a->expert_hidden, a->shared_experts};
    int *field[4] = {&c->topk, &c->moe_every, &c->expert_hidden, &c->shared_experts};
    for (int i = 0; i < 4; i++) { if (!(named >> key[i] & 1) && flag[i] >= 0) { *field[i] = flag[i]; } }
    if (!config_valid(c)) {
        fail_all(rank, "-e '%s' with --topk %d --moe-every %d --expert-hidden %d --shared-experts %d: need 1 <= k <= E = "
                 "%d <= %d, 1 <= every <= L = %d, 1 <= H <= 65536, 0 <= S <= %d", a->model, c->topk, c->moe_every,
                 c->expert_hidden, c->shared_experts, c->num_experts, MOE_MAX_EXPERTS, c->num_layers, MOE_MAX_SHARED);
    }
}

// The MoE training options for model c (the z-loss's default depends on its router's scores).
static MoEOptions moe_options(const Args *a, const ModelConfig *c) {
    float z = a->z_coeff >= 0.0f ? a->z_coeff : c->router_score == ROUTER_SIGMOID ? 0.0f : 0.001f;
    MoEOptions o = {a->cap1000, strcmp(a->drop_policy, "position") ? DROP_PROBS : DROP_POSITION, a->aux_coeff, z,
                    a->moe_bias_rate};
    return o;
}

// The MoE shape given by the flags (--experts, --topk, --moe-every) against the model's: a MoE model
// (file, checkpoint, descriptor with E=) must agree with every flag given; a dense descriptor or file
// becomes a MoE model of that shape (a file: upcycled, each expert a copy of its layer's MLP), except
// when resuming (a checkpoint keeps its shape). Returns the weights (params, or a new array).
static float *apply_moe_shape(const Args *a, int rank, ModelConfig *c, float *params, const char *what, int resuming) {
    if (a->experts < 0 && a->topk < 0 && a->moe_every < 0 && a->expert_hidden < 0 && a->shared_experts < 0) {
        return params;
    }

    if (c->num_experts > 0 || resuming) {
        int given[5] = {a->experts, a->topk, a->moe_every, a->expert_hidden, a->shared_experts},
            has[5] = {c->num_experts, c->topk, c->moe_every, c->expert_hidden, c->shared_experts};
        static const char *flag[5] = {"--experts", "--topk", "--moe-every", "--expert-hidden", "--shared-experts"},
            *name[5] = {"E", "k", "every", "H", "S"};
        for (int i = 0; i < 5; i++) {
            if (given[i] >= 0 && given[i] != has[i]) {
                fail_all(rank, "%s %d, but %s has %s = %d%s", flag[i], given[i], what, name[i], has[i],
                         resuming ? " (a checkpoint resumes with its own shape)" : "");
            }
        }
        return params;
    }
    if (a->experts < 0) {
        fail_all(rank, "--topk, --moe-every, --expert-hidden and --shared-experts need --experts E (or a MoE model)");
    }
    ModelConfig moe = *c;
    moe.num_experts = a->experts;
    moe.topk = a->topk > 0 ? a->topk : 1;
    moe.moe_every = a->moe_every > 0 ? a->moe_every : 1;
    moe.expert_hidden = a->expert_hidden > 0 ? a->expert_hidden : c->ffn_hidden;   // (GPT-2: 4C; Llama: F)
    moe.shared_experts = a->shared_experts > 0 ? a->shared_experts : 0;
    if (!config_valid(&moe)) {
        fail_all(rank, "--experts %d --topk %d --moe-every %d: need 1 <= k <= E <= %d and 1 <= every <= L = %d",
                 moe.num_experts, moe.topk, moe.moe_every, MOE_MAX_EXPERTS, c->num_layers);
    }
    if (params && (moe.expert_hidden != c->ffn_hidden || moe.shared_experts > 0)) {
        // (upcycling copies the dense MLP into each expert: only experts of its width, and no shared ones)
        fail_all(rank, "%s is dense: upcycling makes each expert a copy of its layer's MLP, so --expert-hidden must be "
                 "%s = %d and --shared-experts 0 (got %d, %d); train such a model from a descriptor", what,
                 c->arch == ARCH_LLAMA ? "F" : "4C", c->ffn_hidden, moe.expert_hidden, moe.shared_experts);
    }
    float *out = params ? upcycle_dense(c, params, &moe, a->seed, 0) : NULL;
    if (params && rank == 0) {
        printf("%s: dense model upcycled to %d experts (each a copy of its layer's MLP), top-%d, every %d layers\n",
               what, moe.num_experts, moe.topk, moe.moe_every);
    }
    free(params);
    *c = moe;
    return out;
}

// The MoE flags against the model: the shape (apply_moe_shape), then the router's scores: a MoE model file or
// checkpoint keeps its own (--router-score must agree), a descriptor or an upcycled dense file takes the flag's;
// then what the final model refuses. file: the model comes from a file (or a checkpoint: resuming).
static float *apply_moe_flags(const Args *a, int rank, ModelConfig *c, float *params, const char *what, int resuming,
                              int file) {
    int keeps_score = (file || resuming) && c->num_experts > 0;
    params = apply_moe_shape(a, rank, c, params, what, resuming);
    if (a->router_score) {
        int want = strcmp(a->router_score, "sigmoid") ? ROUTER_SOFTMAX : ROUTER_SIGMOID;
        if (c->num_experts == 0) {
            fail_all(rank, "--router-score %s needs MoE layers (--experts E or a MoE model)", a->router_score);
        }
        if (keeps_score && want != c->router_score) {
            fail_all(rank, "--router-score %s, but %s has %s router scores (a MoE model keeps its own)", a->router_score,
                     what, c->router_score == ROUTER_SIGMOID ? "sigmoid" : "softmax");
        }
        c->router_score = want;
    }
    if (a->moe_bias_rate > 0.0f && c->num_experts == 0) {
        fail_all(rank, "--moe-bias-rate %g needs MoE layers (--experts E or a MoE model)", a->moe_bias_rate);
    }
    if (c->router_score == ROUTER_SIGMOID && c->topk == 1) {
        fail_all(rank, "sigmoid router scores with top-1 (%s): the one gate would be the constant 1 and the router "
                 "would get no gradient; use --topk 2 or more, or softmax scores", what);
    }
    if (c->router_score == ROUTER_SIGMOID && a->z_coeff > 0.0f) {
        fail_all(rank, "--z-coeff %g with sigmoid router scores: the z-loss is a softmax router's regulariser "
                 "(leave it out: 0 with sigmoid)", a->z_coeff);
    }
    return params;
}

// ----------------------------------------------------------------------------
// the model of the command line: -e (a descriptor or a model file) or -o's checkpoint, with the MoE flags

// -e as a descriptor: 1 (config set), or 0 (not a descriptor: a model file); a malformed one stops every rank.
static int model_descriptor(const Args *a, int rank, ModelConfig *config) {
    unsigned named;
    char why[320];
    int desc = parse_descriptor(a->model, config, &named, why, sizeof(why));
    if (desc < 0) { fail_all(rank, "-e '%s' is a malformed model descriptor (%s)", a->model, why); }
    if (desc == 1) { moe_descriptor_defaults(a, rank, config, named); }
    return desc;
}

// The model's shape without its weights (a plan, or the memory check before the weights are made):
// the descriptor, or the file's header; the same errors as load_model.
static void plan_config(Args *a, int rank, ModelConfig *config) {
    int desc = model_descriptor(a, rank, config);
    if (desc == 0) {
        int h[256];
        size_t es;
        fclose(open_model_file(a->model, config, h, &es));
    }
    apply_moe_flags(a, rank, config, NULL, desc == 1 ? "the descriptor" : a->model, 0, desc != 1);
}

// A resume continues its checkpoint's model: an -e given with it (the default d4 is not) must be of that shape.
static void check_resume_model(Args *a, int rank, const ModelConfig *ckpt, const char *path) {
    if (!flag_given(a, "-e")) { return; }
    ModelConfig want;
    plan_config(a, rank, &want);
    if (memcmp(&want, ckpt, sizeof(want)) != 0) {
        fail_all(rank, "-e '%s' (L %d C %d NH %d V %d maxT %d, E %d) is not the model of the checkpoint '%s' (L %d C %d NH "
                 "%d V %d maxT %d, E %d): a resume continues its checkpoint's model; drop -e, or use another -o",
                 a->model, want.num_layers, want.channels, want.num_heads, want.vocab_size, want.max_seq_len,
                 want.num_experts, path, ckpt->num_layers, ckpt->channels, ckpt->num_heads, ckpt->vocab_size,
                 ckpt->max_seq_len, ckpt->num_experts);
    }
}

// The model's weights (host fp32, file order) and shape: from the newest checkpoint in -o when
// resuming (*resume_step >= 0), else from a model file, else a descriptor with random init.
static float *load_model(Args *a, int rank, ModelConfig *config, int *resume_step) {
    *resume_step = -1;
    if (a->resume) {
        *resume_step = latest_checkpoint(a->output_dir);
        if (*resume_step < 0 && a->resume == 1) {
            fail_all(rank,
                     "-y 1: nothing to resume in '%s' (no intact checkpoint with a DONE_ marker); use -y 2 to start fresh when there is none",
                     a->output_dir);
        }
        if (*resume_step < 0 && rank == 0) { printf("-y 2: no checkpoint in %s, starting fresh\n", a->output_dir); }
    }
    int desc = model_descriptor(a, rank, config);
    if (*resume_step >= 0) {
        char path[PATH_LEN];
        path_join(path, a->output_dir, "model_%08d.bin", *resume_step);
        float *params = apply_moe_flags(a, rank, config, read_model_file(path, config), "the checkpoint", 1, 1);
        check_resume_model(a, rank, config, path);
        return params;
    }
    if (desc == 1) {
        apply_moe_flags(a, rank, config, NULL, "the descriptor", 0, 0);
        return random_init(config, a->seed);
    }
    return apply_moe_flags(a, rank, config, read_model_file(a->model, config), a->model, 0, 1);
}

#endif // LLMC_ARGS_H
