// A layout: how a run is cut over its ranks and its micro-batches, as plain data. The command line makes one
// (args.h); the memory plan (plan.h), the cost model (cost_model.h) and the layout search (layout_search.h) read
// it and try others; layout_error says whether one can run a model on a world of ranks. Its fields are the flags'
// values (strings where a flag names a choice), so a layout prints back as the flags that give it.
#ifndef LLMC_LAYOUT_H
#define LLMC_LAYOUT_H

#include <stdio.h>
#include <string.h>
#include "model_config.h"
#include "pipeline_split.h"   // (layer_split: the layers of each stage)

#define MAX_ACCUM 65536   // micro-batches per step (-d over B*T*dp) at most

typedef struct {
    int B, T;                 // -b, -t: a micro-batch's sequences per rank, and their length (a cp rank holds T/cp)
    int total_batch;          // -d: tokens per step (-1 until layout_error: one micro-batch of every dp rank)
    int tp, sp;               // --tp, --sp: tensor parallelism, and sequence parallelism inside it
    int cp;                   // --cp: context parallelism
    const char *cp_kind;      // --cp-kind ring|ulysses|hybrid: how the cp group computes attention
    int cp_ulysses;           // --cp-ulysses U: the hybrid's all-to-all group size (0: not given; no default)
    int pp, vpp;              // --pp, --vpp: pipeline stages, model chunks per stage (interleaved: vpp > 1)
    const char *pp_schedule;  // --pp-schedule 1f1b|gpipe|interleaved|zb
    const char *pp_layers;    // --pp-layers: NULL (even), "auto" or "5,7" (layer_split)
    int dp;                   // --dp: data parallelism (-1 until layout_error: world / (tp cp pp))
    int zero;                 // --zero 0-3: what the dp ranks shard (zero.h)
    int ep;                   // --ep: expert parallelism, inside dp
    const char *recompute;    // --recompute none|mlp|full
    int ce_chunk;             // --ce-chunk: tokens per cross-entropy chunk (0: the whole logits)
    const char *attention;    // --attention cublas|flash|cudnn: the CUDA build's attention path
} Layout;

// The command line's defaults: one rank, B 4, T 64, one micro-batch a step.
static Layout default_layout(void) {
    Layout lay = {};
    lay.B = 4; lay.T = 64; lay.total_batch = -1;
    lay.tp = 1; lay.cp = 1; lay.cp_kind = "ring"; lay.pp = 1; lay.vpp = 1; lay.pp_schedule = "1f1b";
    lay.dp = -1; lay.ep = 1; lay.recompute = "none"; lay.ce_chunk = 256;
#ifdef USE_CUDA
    lay.attention = "flash";   // (where it applies: bf16, head size 64 or 128; cuBLAS otherwise: attention.h)
#else
    lay.attention = "cublas";  // (the CPU build has one attention: the flag is the CUDA build's)
#endif
    return lay;
}

// The micro-batches of a step: -d over the tokens of one micro-batch of every dp rank (a checked layout).
static int layout_accum(const Layout *lay) { return lay->total_batch / (lay->B * lay->T * lay->dp); }

// Activation recompute (--recompute): none stores every layer's activations for the backward; mlp drops
// the MLP's fc and GELU outputs (the experts' too), the largest, and recomputes them in the backward from
// the stored ln2 output; full keeps only each layer's input and recomputes the whole layer (its
// tensor-parallel collectives and expert all-to-alls included) before its backward. The results are
// bit-identical: the recomputation runs the same kernels on the same inputs.
typedef enum { RECOMPUTE_NONE, RECOMPUTE_MLP, RECOMPUTE_FULL } Recompute;

static Recompute recompute_mode(const char *name) {
    return !strcmp(name, "mlp") ? RECOMPUTE_MLP : !strcmp(name, "full") ? RECOMPUTE_FULL : RECOMPUTE_NONE;
}

#define LAYOUT_FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return 1; } while (0)
// The Ulysses degree U of the layout (context_parallel.h): the size of the all-to-all groups, 1 with the ring alone
// (and without cp), cp with Ulysses, --cp-ulysses with the hybrid.
static int cp_ulysses_degree(const Layout *lay) {
    if (lay->cp <= 1 || !strcmp(lay->cp_kind, "ring")) { return 1; }
    return !strcmp(lay->cp_kind, "ulysses") ? lay->cp : lay->cp_ulysses;
}

// --cp-kind and --cp-ulysses against --cp and the heads: a head shard is whole heads of the tp rank's, its query
// heads' kv heads whole too (U divides the tp rank's kv heads, or they divide U: each then replicated on U/KV
// members).
static int layout_cp_kind_error(const Layout *lay, const ModelConfig *c, char *err, size_t errlen) {
    int hybrid = !strcmp(lay->cp_kind, "hybrid");
    if (lay->cp_ulysses && !hybrid) {
        LAYOUT_FAIL("--cp-ulysses %d is the hybrid's all-to-all group size: it needs --cp-kind hybrid (not %s)",
                    lay->cp_ulysses, lay->cp_kind);
    }
    if (hybrid && !lay->cp_ulysses) {
        LAYOUT_FAIL("--cp-kind hybrid needs --cp-ulysses U (the all-to-all groups' size, 1 < U < cp dividing --cp %d; "
                    "no default)", lay->cp);
    }
    if (strcmp(lay->cp_kind, "ring") && lay->cp == 1) {
        LAYOUT_FAIL("--cp-kind %s: context parallelism needs --cp N >= 2", lay->cp_kind);
    }
    if (hybrid && (lay->cp_ulysses <= 1 || lay->cp_ulysses >= lay->cp || lay->cp % lay->cp_ulysses)) {
        LAYOUT_FAIL("--cp-ulysses %d must be strictly between 1 and --cp %d and divide it (the ring runs across cp/U "
                    "groups of U)", lay->cp_ulysses, lay->cp);
    }
    int U = cp_ulysses_degree(lay), NHl = c->num_heads / lay->tp, KVl = c->kv_heads / lay->tp;
    const char *flag = hybrid ? "--cp-ulysses" : "--cp";
    if (U > 1 && NHl % U) {
        LAYOUT_FAIL("--cp-kind %s: %s %d does not divide the %d query heads per tp rank (NH %d / --tp %d): a rank's "
                    "head shard is whole heads", lay->cp_kind, flag, U, NHl, c->num_heads, lay->tp);
    }
    if (U > 1 && KVl % U && U % KVl) {
        LAYOUT_FAIL("--cp-kind %s: %s %d and the %d kv heads per tp rank (KV %d / --tp %d) do not divide one another: "
                    "a head shard's kv heads are whole (U | KV) or one replicated (KV | U)", lay->cp_kind, flag, U, KVl,
                    c->kv_heads, lay->tp);
    }
    return 0;
}

// The grid against the world size and the model: every group divides what it cuts.
static int layout_grid_error(Layout *lay, const ModelConfig *c, int world, char *err, size_t errlen) {
    if (world % (lay->tp * lay->cp * lay->pp) != 0) {
        LAYOUT_FAIL("world size %d is not divisible by tp*cp*pp = %d*%d*%d (world = tp*cp*pp*dp)", world, lay->tp, lay->cp,
                    lay->pp);
    }
    int dp = world / (lay->tp * lay->cp * lay->pp);
    if (lay->dp != -1 && lay->dp != dp) {
        LAYOUT_FAIL("--dp %d does not match world size %d = tp %d * cp %d * pp %d * dp %d", lay->dp, world, lay->tp, lay->cp,
                    lay->pp, dp);
    }
    if (lay->cp > 1 && lay->T % (2 * lay->cp)) {   // the sequence in 2cp chunks
        LAYOUT_FAIL("--cp %d: T = %d is not a multiple of 2*cp = %d (each rank holds 2 chunks of T/(2cp))", lay->cp,
                    lay->T, 2 * lay->cp);
    }
    lay->dp = dp;
    if (lay->pp > c->num_layers) { LAYOUT_FAIL("--pp %d is larger than the number of layers %d", lay->pp, c->num_layers); }
    if (dp % lay->ep != 0) { LAYOUT_FAIL("--ep %d does not divide dp %d (world = tp*pp*dp, ep within dp)", lay->ep, dp); }
    if (lay->ep > 1 && c->num_experts == 0) {
        LAYOUT_FAIL("--ep %d: expert parallelism needs MoE layers (--experts E or a MoE model)", lay->ep);
    }
    if (c->num_experts % lay->ep) {
        LAYOUT_FAIL("--ep %d does not divide the number of experts %d", lay->ep, c->num_experts);
    }
    if (c->num_heads % lay->tp) { LAYOUT_FAIL("--tp %d does not divide the number of heads %d", lay->tp, c->num_heads); }
    if (c->kv_heads % lay->tp) {   // (a tp rank holds whole kv heads, and the query heads that read them)
        LAYOUT_FAIL("--tp %d does not divide the number of key/value heads KV = %d", lay->tp, c->kv_heads);
    }
    if (c->ffn_hidden % lay->tp) {
        LAYOUT_FAIL("--tp %d does not divide the MLP's hidden width %s = %d", lay->tp, c->arch == ARCH_LLAMA ? "F" : "4C",
                    c->ffn_hidden);
    }
    if (layout_cp_kind_error(lay, c, err, errlen)) { return 1; }
    if (c->num_experts > 0 && c->expert_hidden % lay->tp) {
        LAYOUT_FAIL("--tp %d does not divide the experts' hidden width H = %d", lay->tp, c->expert_hidden);
    }
    if (c->padded_vocab_size % lay->tp) {
        LAYOUT_FAIL("--tp %d does not divide the padded vocab size %d", lay->tp, c->padded_vocab_size);
    }
    if (lay->sp && (lay->T / lay->cp) % lay->tp) {
        LAYOUT_FAIL("--sp: --tp %d does not divide T/cp = %d", lay->tp, lay->T / lay->cp);
    }
    return 0;
}

// The batch against the grid: -t within the model, -d a multiple of the micro-batch's tokens (its default: one
// micro-batch), the interleaved schedule's micro-batches in groups of pp.
static int layout_batch_error(Layout *lay, const ModelConfig *c, char *err, size_t errlen) {
    int dp = lay->dp;
    if (lay->T > c->max_seq_len) {
        LAYOUT_FAIL("-t %d is larger than the model's maximum sequence length %d", lay->T, c->max_seq_len);
    }
    long tokens_per_micro = (long)lay->B * lay->T * dp;
    if (tokens_per_micro > (1L << 30)) {
        LAYOUT_FAIL("B*T*dp = %d*%d*%d = %ld tokens per micro-batch is too large (at most 2^30)", lay->B, lay->T, dp,
                    tokens_per_micro);
    }
    if (lay->total_batch == -1) { lay->total_batch = (int)tokens_per_micro; }
    if (lay->total_batch <= 0 || lay->total_batch % tokens_per_micro != 0) {
        LAYOUT_FAIL("-d %d is not a multiple of B*T*dp = %d*%d*%d = %ld", lay->total_batch, lay->B, lay->T, dp,
                    tokens_per_micro);
    }
    if (lay->total_batch / tokens_per_micro > MAX_ACCUM) {   // (the schedule keeps a few ints per micro-batch)
        LAYOUT_FAIL("-d %d is %ld micro-batches of B*T*dp = %ld tokens per step, more than %d: raise -b or lower -d",
                    lay->total_batch, lay->total_batch / tokens_per_micro, tokens_per_micro, MAX_ACCUM);
    }
    if (lay->vpp > 1) {   // interleaved: micro-batches go through the chunks in groups of pp
        int accum = (int)(lay->total_batch / tokens_per_micro);
        if (lay->pp < 2) { LAYOUT_FAIL("--vpp %d: the interleaved schedule needs a pipeline (--pp >= 2)", lay->vpp); }
        if (accum % lay->pp) {
            LAYOUT_FAIL("--vpp %d: the interleaved schedule needs the micro-batches per step (-d / (B*T*dp) = %d) to be a multiple of --pp %d",
                     lay->vpp, accum, lay->pp);
        }
        if (lay->pp * lay->vpp > c->num_layers) {
            LAYOUT_FAIL("--pp %d x --vpp %d = %d model chunks, more than the %d layers", lay->pp, lay->vpp, lay->pp * lay->vpp,
                        c->num_layers);
        }
    }
    return 0;
}

// Whether layout a can run the model c on world ranks (and the defaults that follow: dp, -d). Returns 1 with the
// reason in err if not, naming the flag (the memory plan and the layout search try layouts with it).
static int layout_error(Layout *lay, const ModelConfig *c, int world, char *err, size_t errlen) {
    if (layout_grid_error(lay, c, world, err, errlen) || layout_batch_error(lay, c, err, errlen)) { return 1; }
    int first[PIPE_MAX_LAYERS + 1];
    if (lay->pp_layers && lay->pp == 1) { LAYOUT_FAIL("--pp-layers '%s' needs a pipeline (--pp >= 2)", lay->pp_layers); }
    if (layer_split(first, lay->pp_layers, c, lay->T, lay->pp, lay->vpp, err, errlen)) { return 1; }
#ifdef USE_CUDA
    int hs = c->channels / c->num_heads;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128) {
        LAYOUT_FAIL("head size C/NH = %d: the CUDA attention supports 16, 32, 64, 128", hs);
    }
#ifndef USE_CUDNN
    if (!strcmp(lay->attention, "cudnn")) { LAYOUT_FAIL("--attention cudnn: this build has no cuDNN (make USE_CUDNN=1)"); }
#endif
#endif
    return 0;
}
#undef LAYOUT_FAIL

#endif
