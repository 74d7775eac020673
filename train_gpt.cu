/*
GPT-2 training, single source, CPU or CUDA, any mix of data / ZeRO / tensor+sequence / pipeline
parallelism. Read top to bottom: the model's tensors and how they are cut into units -> the model
(forward, fused chunked head, backward) -> one training step (the pipeline schedule) -> checkpoints
-> flags -> main. The other parallel strategies each live in one file: llmc/zero.h (data parallel +
ZeRO 0-3), llmc/tensor_parallel.h (Megatron TP + SP), llmc/fused_ce.h (vocab-parallel chunked
cross-entropy), llmc/comm.h (the process grid and the collectives).
*/
#include <unistd.h>
#include <sys/stat.h>
#include <dirent.h>
#include <time.h>
#include "llmc/utils.h"
#include "llmc/backend.h"
#include "llmc/alloc.h"
#include "llmc/comm.h"
#include "llmc/rand.h"
#include "llmc/encoder.h"
#include "llmc/layernorm.h"
#include "llmc/matmul.h"
#include "llmc/attention.h"
#include "llmc/gelu.h"
#include "llmc/residual.h"
#include "llmc/fused_ce.h"
#include "llmc/adamw.h"
#include "llmc/global_norm.h"
#include "llmc/tensor_parallel.h"
#include "llmc/zero.h"
#include "llmc/pipeline.h"
#include "llmc/dataloader.h"
#include "llmc/tokenizer.h"
#include "llmc/schedulers.h"

// ----------------------------------------------------------------------------
// the model's tensors, in llm.c's file order

typedef struct {
    int max_seq_len;        // maxT
    int vocab_size;         // V
    int padded_vocab_size;  // Vp >= V, rows V..Vp-1 of wte are padding
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
} GPT2Config;

enum { T_WTE, T_WPE, T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_ATTPROJW, T_ATTPROJB,
       T_LN2W, T_LN2B, T_FCW, T_FCB, T_FCPROJW, T_FCPROJB, T_LNFW, T_LNFB, NUM_TENSORS };
__attribute__((unused)) static const char *tensor_names[NUM_TENSORS] = {"wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                                "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

typedef struct { int nblk; size_t rows, cols; SplitKind split; int per_layer; int decay; } TensorSpec;

// Full shape of tensor id (of one layer, for the per-layer ones) and how tensor parallelism cuts it.
static TensorSpec tensor_spec(const GPT2Config *c, int id) {
    size_t C = c->channels;
    switch (id) {
        case T_WTE:      return (TensorSpec){1, (size_t)c->padded_vocab_size, C, SPLIT_ROWS, 0, 1};  // vocab-parallel
        case T_WPE:      return (TensorSpec){1, (size_t)c->max_seq_len, C, SPLIT_NONE, 0, 1};
        case T_QKVW:     return (TensorSpec){3, C, C, SPLIT_ROWS, 1, 1};       // column-parallel: heads of q, k, v
        case T_QKVB:     return (TensorSpec){3, C, 1, SPLIT_ROWS, 1, 0};
        case T_ATTPROJW: return (TensorSpec){1, C, C, SPLIT_COLS, 1, 1};       // row-parallel
        case T_FCW:      return (TensorSpec){1, 4 * C, C, SPLIT_ROWS, 1, 1};   // column-parallel
        case T_FCB:      return (TensorSpec){1, 4 * C, 1, SPLIT_ROWS, 1, 0};
        case T_FCPROJW:  return (TensorSpec){1, C, 4 * C, SPLIT_COLS, 1, 1};   // row-parallel
        case T_LNFW: case T_LNFB: return (TensorSpec){1, 1, C, SPLIT_NONE, 0, 0};
        default:         return (TensorSpec){1, 1, C, SPLIT_NONE, 1, 0};       // ln1, ln2, attprojb, fcprojb
    }
}

static size_t tensor_full_size(const GPT2Config *c, int id) {   // all layers
    TensorSpec s = tensor_spec(c, id);
    return (size_t)s.nblk * s.rows * s.cols * (s.per_layer ? c->num_layers : 1);
}

static size_t num_parameters(const GPT2Config *c) {
    size_t n = 0;
    for (int i = 0; i < NUM_TENSORS; i++) { n += tensor_full_size(c, i); }
    return n;
}

// One unit of zero.h: the embedding (wpe, wte), a layer, or the final LayerNorm. Inside a unit
// the tp-replicated tensors come first (one block to all-reduce under SP).
static void build_unit(const GPT2Config *c, int tp, Unit *U, const int *ids, int n, int layer) {
    memset(U, 0, sizeof(Unit));
    for (int k = 0; k < n; k++) {
        TensorSpec s = tensor_spec(c, ids[k]);
        UnitTensor *t = &U->t[U->ntensors++];
        t->id = ids[k];
        t->layer = layer;
        t->offset = U->size;
        t->size = (size_t)s.nblk * s.rows * s.cols / (s.split == SPLIT_NONE ? 1 : tp);
        t->decay = s.decay;
        t->replicated = s.split == SPLIT_NONE;
        U->size += t->size;
        if (t->replicated) { U->nrep = U->size; }
        if (ids[k] == T_WTE) { U->embedding = 1; }
    }
}

// The units of a pipeline stage, in the order they run: the embedding (first stage), its layers,
// the final LayerNorm (last stage). With a pipeline the first stage's wte and wpe are two units, and
// the last stage holds a copy of the wte unit for the tied LM head: same layout, so the two copies'
// gradients sum shard by shard. Returns the number of units; sets the index of each kind (-1: none;
// without a pipeline u_pos == u_embed, one unit [wpe, wte]).
static int build_units(const GPT2Config *c, int tp, int pp, int stage, Unit *units,
                       int *u_embed, int *u_pos, int *u_layer0, int *u_final) {
    static const int embedding[] = {T_WPE, T_WTE}, token[] = {T_WTE}, position[] = {T_WPE};
    static const int layer[] = {T_LN1W, T_LN1B, T_ATTPROJB, T_LN2W, T_LN2B, T_FCPROJB,
                                T_QKVW, T_QKVB, T_ATTPROJW, T_FCW, T_FCB, T_FCPROJW};
    static const int final_ln[] = {T_LNFW, T_LNFB};
    int l0, l1, n = 0;
    stage_layers(c->num_layers, pp, stage, &l0, &l1);
    *u_embed = *u_pos = *u_final = -1;
    if (stage == 0 && pp == 1) { *u_embed = *u_pos = n; build_unit(c, tp, &units[n++], embedding, 2, -1); }
    if (stage == 0 && pp > 1) {
        *u_embed = n; build_unit(c, tp, &units[n++], token, 1, -1);
        *u_pos = n; build_unit(c, tp, &units[n++], position, 1, -1);
    }
    *u_layer0 = n;
    for (int l = l0; l < l1; l++) { build_unit(c, tp, &units[n++], layer, 12, l); }
    if (stage == pp - 1) {
        *u_final = n;
        build_unit(c, tp, &units[n++], final_ln, 2, -1);
        if (pp > 1) { *u_embed = n; build_unit(c, tp, &units[n++], token, 1, -1); units[n - 1].norm_skip = 1; }
    }
    if (pp > 1 && *u_embed >= 0) { units[*u_embed].tied = 1; }
    return n;
}

// Pointers to each tensor of a unit, given the unit's base (parameters or gradients: same layout).
static void unit_view(const Unit *U, floatX *base, floatX *ptr[NUM_TENSORS]) {
    for (int k = 0; k < U->ntensors; k++) { ptr[U->t[k].id] = base + U->t[k].offset; }
}

// Host, fp32: cut this tp rank's unit out of the full tensors (to_unit = 1), or put it back.
static void unit_copy_full(const GPT2Config *c, const Unit *U, float *full[NUM_TENSORS], float *unit,
                           int tp, int tp_rank, int to_unit) {
    for (int k = 0; k < U->ntensors; k++) {
        const UnitTensor *t = &U->t[k];
        TensorSpec s = tensor_spec(c, t->id);
        size_t per_layer = (size_t)s.nblk * s.rows * s.cols;
        float *f = full[t->id] + (t->layer >= 0 ? (size_t)t->layer * per_layer : 0);
        tp_slice_copy(f, unit + t->offset, s.nblk, s.rows, s.cols, s.split, tp, tp_rank, to_unit);
    }
}

// ----------------------------------------------------------------------------
// model files (llm.c format): int32 header[256] then the 16 tensors, fp32 (version 3) or bf16 (5)

#define MODEL_MAGIC 20240326

// The shapes this program accepts, from a file or a descriptor: positive, C divisible by NH,
// V <= Vp, token ids that fit the uint16 data shards, and sizes whose element counts fit in memory.
static int config_valid(const GPT2Config *c) {
    return c->max_seq_len > 0 && c->vocab_size > 0 && c->num_layers > 0 && c->num_heads > 0 && c->channels > 0 &&
           c->padded_vocab_size >= c->vocab_size && c->channels % c->num_heads == 0 && c->vocab_size <= 65536 &&
           c->padded_vocab_size <= 1 << 20 && c->channels <= 16384 && c->max_seq_len <= 1 << 20 && c->num_layers <= 1024;
}

static float bf16_to_float(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t float_to_bf16(float f) {   // round to nearest even
    uint32_t u; memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

// Reads and checks a model file; returns all parameters as one host fp32 array in file order.
static float *read_model_file(const char *path, GPT2Config *c) {
    FILE *f = fopen_check(path, "rb");
    int h[256];
    if (fread(h, sizeof(int), 256, f) != 256) { fail("model file '%s' is truncated: expected a 1024-byte header", path); }
    if (h[0] != MODEL_MAGIC) { fail("model file '%s' has bad magic %d, expected %d", path, h[0], MODEL_MAGIC); }
    if (h[1] != 3 && h[1] != 5) { fail("model file '%s' has version %d, expected 3 (fp32) or 5 (bf16)", path, h[1]); }
    c->max_seq_len = h[2]; c->vocab_size = h[3]; c->num_layers = h[4]; c->num_heads = h[5]; c->channels = h[6];
    c->padded_vocab_size = h[7];
    if (!config_valid(c)) {
        fail("model file '%s' has inconsistent header values (maxT %d V %d L %d NH %d C %d Vp %d)", path,
             h[2], h[3], h[4], h[5], h[6], h[7]);
    }
    size_t P = num_parameters(c), es = h[1] == 3 ? 4 : 2;
    long size = file_size(f);
    if ((size_t)size != 1024 + P * es) {
        fail("model file '%s' is %ld bytes, expected %zu for its header (%zu parameters, version %d)", path, size, 1024 + P * es, P, h[1]);
    }
    float *params = (float *)malloc_check(P * sizeof(float));
    if (es == 4) {
        fread_check(params, 4, P, f, path);
    } else {
        uint16_t *tmp = (uint16_t *)malloc_check(P * 2);
        fread_check(tmp, 2, P, f, path);
        for (size_t i = 0; i < P; i++) { params[i] = bf16_to_float(tmp[i]); }
        free(tmp);
    }
    fclose(f);
    return params;
}

// Pointers to the 16 tensors inside one array in file order.
static void split_tensors(const GPT2Config *c, float *all, float *ptr[NUM_TENSORS]) {
    for (int i = 0; i < NUM_TENSORS; i++) { ptr[i] = all; all += tensor_full_size(c, i); }
}

// "d12" (llm.c: depth L, C = 64 L, NH = L) or "L=4,C=64,NH=4,V=250,maxT=64[,Vp=256]".
// Returns 0 if the string is not a descriptor, -1 if it is a malformed one.
static int parse_descriptor(const char *s, GPT2Config *c) {
    memset(c, 0, sizeof(*c));
    c->vocab_size = 50257; c->max_seq_len = 1024;
    char *end;
    if (s[0] == 'd' && s[1] >= '0' && s[1] <= '9') {
        long d = strtol(s + 1, &end, 10);
        if (*end != '\0' || d <= 0 || d > 128) { return -1; }
        c->num_layers = (int)d; c->channels = 64 * (int)d; c->num_heads = (int)d;
    } else if (strchr(s, '=') != NULL) {
        char buf[256];
        snprintf(buf, sizeof(buf), "%s", s);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            char *eq = strchr(tok, '=');
            if (!eq) { return -1; }
            *eq = '\0';
            long v = strtol(eq + 1, &end, 10);
            if (*end != '\0' || v <= 0 || v > (1 << 20)) { return -1; }
            if (!strcmp(tok, "L")) { c->num_layers = (int)v; }
            else if (!strcmp(tok, "C")) { c->channels = (int)v; }
            else if (!strcmp(tok, "NH")) { c->num_heads = (int)v; }
            else if (!strcmp(tok, "V")) { c->vocab_size = (int)v; }
            else if (!strcmp(tok, "Vp")) { c->padded_vocab_size = (int)v; }
            else if (!strcmp(tok, "maxT")) { c->max_seq_len = (int)v; }
            else { return -1; }
        }
        if (c->num_layers == 0 || c->channels == 0 || c->num_heads == 0) { return -1; }
    } else {
        return 0;
    }
    if (c->padded_vocab_size == 0) { c->padded_vocab_size = (int)ceil_div(c->vocab_size, 128) * 128; }
    return config_valid(c) ? 1 : -1;
}

// GPT-2 initialisation (as llm.c): N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), LayerNorm
// weights 1, biases 0, padded vocab rows 0. Same numbers on every rank, whatever the layout.
static float *random_init(const GPT2Config *c, uint64_t seed) {
    size_t P = num_parameters(c);
    float *all = (float *)malloc_check(P * sizeof(float));
    memset(all, 0, P * sizeof(float));
    float *t[NUM_TENSORS];
    split_tensors(c, all, t);
    Rng rng;
    rng_init(&rng, seed);
    float proj_std = 0.02f / sqrtf(2.0f * c->num_layers);
    for (int i = 0; i < NUM_TENSORS; i++) {
        size_t n = tensor_full_size(c, i);
        if (i == T_LN1W || i == T_LN2W || i == T_LNFW) { for (size_t j = 0; j < n; j++) { t[i][j] = 1.0f; } }
        if (i == T_WTE) { n = (size_t)c->vocab_size * c->channels; }   // padding rows stay 0
        if (i == T_WTE || i == T_WPE || i == T_QKVW || i == T_FCW) { for (size_t j = 0; j < n; j++) { t[i][j] = rng_normal(&rng, 0, 0.02f); } }
        if (i == T_ATTPROJW || i == T_FCPROJW) { for (size_t j = 0; j < n; j++) { t[i][j] = rng_normal(&rng, 0, proj_std); } }
    }
    return all;
}

// ----------------------------------------------------------------------------
// the model

typedef struct {
    // stored for the backward, one set per micro-batch in flight on this pipeline stage. Per layer l of
    // the stage's Ls layers (layer_acts cuts one layer's slice); BTs = tokens of the LayerNorm/residual
    // region (BT/tp with SP, else BT), Cl = C/tp, NHl = NH/tp
    floatX *resid;      // (Ls+1, BTs, C) the residual stream entering each layer, and the stage's output
    floatX *ln1;        // (Ls, BTs, C)
    float *ln1_mean, *ln1_rstd;   // (Ls, BTs)
    floatX *qkv;        // (Ls, BT, 3Cl)
    floatX *atty;       // (Ls, BT, Cl)
    float *lse;         // (Ls, B, NHl, T) attention log-sum-exp
    floatX *mid;        // (Ls, BTs, C) residual after attention
    floatX *ln2;        // (Ls, BTs, C)
    float *ln2_mean, *ln2_rstd;
    floatX *fch, *fchg; // (Ls, BT, 4Cl) fc output, after GELU
    floatX *lnf;        // (BTs, C) last stage
    float *lnf_mean, *lnf_rstd;
    floatX *dlnf;       // (BTs, C) last stage: the gradient of lnf, written by the fused head
    int *inputs, *targets;   // (BT) on the device
} Activations;

// One layer's slice of a micro-batch's activations.
typedef struct {
    floatX *res, *ln1, *mid, *ln2, *out;                 // (BTs, C): input, ln1, after attention, ln2, output
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;   // (BTs)
    floatX *qkv, *atty, *fch, *fchg;                     // (BT, 3Cl), (BT, Cl), (BT, 4Cl), (BT, 4Cl)
    float *lse;                                          // (B, NHl, T)
} LayerActs;

typedef struct {        // shared by all layers and micro-batches
    floatX *xfull;      // (BT, C) gathered input of a column-parallel layer (SP only)
    floatX *pfull;      // (BT, C) partial sums before a tp reduction, and full-token gradients
    floatX *tokbuf;     // (BTs, C) result of a reduce-scatter (SP)
    floatX *dresid;     // (BTs, C) gradient of the residual stream (pipeline: received from the next stage)
    floatX *dwide;      // (BT, 4Cl) gradient of fc / gelu, then of qkv
    floatX *datty;      // (BT, Cl)
    float *losses;      // (BT)
} Workspace;

typedef struct {
    GPT2Config config;
    Grid *grid;
    int sp;
    int B, T, BT, BTs, tok0;     // tok0: first local token of the LayerNorm/residual region
    int Cl, NHl, Vl, v0;         // this tp rank's channels, heads, vocab rows [v0, v0 + Vl)
    int first, last, l0, Ls;     // pipeline: is this the first / last stage; its layers [l0, l0 + Ls)
    int nunits, u_embed, u_pos, u_layer0, u_final;   // this stage's units (zero.h), -1 where it has none
    Unit *units;
    Zero zero;
    Pipeline pipe;               // the schedule, the activation slots, the exchanges (pipeline.h)
    Activations *acts;           // (pipe.nslots) one per micro-batch alive at once
    Workspace ws;
    CEBuffers ce;
    size_t num_parameters;
} GPT2;

static LayerActs layer_acts(const GPT2 *m, const Activations *a, int l) {
    size_t C = m->config.channels, Cl = m->Cl, s = (size_t)l * m->BTs, f = (size_t)l * m->BT;
    LayerActs x;
    x.res = a->resid + s * C; x.out = a->resid + (s + m->BTs) * C;
    x.ln1 = a->ln1 + s * C; x.mid = a->mid + s * C; x.ln2 = a->ln2 + s * C;
    x.ln1_mean = a->ln1_mean + s; x.ln1_rstd = a->ln1_rstd + s; x.ln2_mean = a->ln2_mean + s; x.ln2_rstd = a->ln2_rstd + s;
    x.qkv = a->qkv + f * 3 * Cl; x.atty = a->atty + f * Cl; x.fch = a->fch + f * 4 * Cl; x.fchg = a->fchg + f * 4 * Cl;
    x.lse = a->lse + f * m->NHl;
    return x;
}

// Builds this rank's part of the model (its pipeline stage, its tp slice, its ZeRO shard) from the
// full host tensors (file order). Every rank passes the same.
static void gpt2_build(GPT2 *m, const GPT2Config *c, float *all_params, Grid *grid, int zero_stage, int sp) {
    memset(m, 0, sizeof(*m));
    m->config = *c;
    m->grid = grid;
    m->sp = sp;
    m->num_parameters = num_parameters(c);
    int tp = grid->tp, l1;
    m->Cl = c->channels / tp; m->NHl = c->num_heads / tp;
    m->Vl = c->padded_vocab_size / tp; m->v0 = grid->tp_rank * m->Vl;
    m->first = grid->pp_rank == 0;
    m->last = grid->pp_rank == grid->pp - 1;
    stage_layers(c->num_layers, grid->pp, grid->pp_rank, &m->l0, &l1);
    m->Ls = l1 - m->l0;
    m->units = (Unit *)malloc_check((m->Ls + 4) * sizeof(Unit));
    m->nunits = build_units(c, tp, grid->pp, grid->pp_rank, m->units, &m->u_embed, &m->u_pos, &m->u_layer0, &m->u_final);
    zero_init(&m->zero, grid, zero_stage, sp, m->units, m->nunits);
    float *full[NUM_TENSORS];
    split_tensors(c, all_params, full);
    for (int u = 0; u < m->nunits; u++) {
        float *host = (float *)malloc_check(m->units[u].size * sizeof(float));
        unit_copy_full(c, &m->units[u], full, host, tp, grid->tp_rank, 1);
        zero_set_unit_params(&m->zero, u, host);
        free(host);
    }
}

// Allocates the activations for micro-batches of (B, T), `accum` of them per step, with the pipeline
// schedule's number of them alive at once, and a CE chunk of `chunk` tokens (0: all).
static void gpt2_alloc_activations(GPT2 *m, int B, int T, int chunk, int accum, PipeSchedule schedule) {
    int tp = m->grid->tp, pp = m->grid->pp, Ls = m->Ls;
    size_t C = m->config.channels, Cl = m->Cl;
    m->B = B; m->T = T; m->BT = B * T;
    m->BTs = m->sp ? m->BT / tp : m->BT;
    m->tok0 = m->sp ? m->grid->tp_rank * m->BTs : 0;
    int nslots = pipeline_slots(schedule, pp, m->grid->pp_rank, accum);
    size_t BT = m->BT, BTs = m->BTs, X = sizeof(floatX), F = sizeof(float);
    m->acts = (Activations *)malloc_check(nslots * sizeof(Activations));
    for (int i = 0; i < nslots; i++) {
        Activations *a = &m->acts[i];
        memset(a, 0, sizeof(*a));
        a->resid = (floatX *)mem_alloc((Ls + 1) * BTs * C * X, MEM_ACTIVATIONS);
        a->ln1 = (floatX *)mem_alloc(Ls * BTs * C * X, MEM_ACTIVATIONS);
        a->ln1_mean = (float *)mem_alloc(Ls * BTs * F, MEM_ACTIVATIONS);
        a->ln1_rstd = (float *)mem_alloc(Ls * BTs * F, MEM_ACTIVATIONS);
        a->qkv = (floatX *)mem_alloc(Ls * BT * 3 * Cl * X, MEM_ACTIVATIONS);
        a->atty = (floatX *)mem_alloc(Ls * BT * Cl * X, MEM_ACTIVATIONS);
        a->lse = (float *)mem_alloc(Ls * BT * m->NHl * F, MEM_ACTIVATIONS);
        a->mid = (floatX *)mem_alloc(Ls * BTs * C * X, MEM_ACTIVATIONS);
        a->ln2 = (floatX *)mem_alloc(Ls * BTs * C * X, MEM_ACTIVATIONS);
        a->ln2_mean = (float *)mem_alloc(Ls * BTs * F, MEM_ACTIVATIONS);
        a->ln2_rstd = (float *)mem_alloc(Ls * BTs * F, MEM_ACTIVATIONS);
        a->fch = (floatX *)mem_alloc(Ls * BT * 4 * Cl * X, MEM_ACTIVATIONS);
        a->fchg = (floatX *)mem_alloc(Ls * BT * 4 * Cl * X, MEM_ACTIVATIONS);
        if (m->last) {
            a->lnf = (floatX *)mem_alloc(BTs * C * X, MEM_ACTIVATIONS);
            a->lnf_mean = (float *)mem_alloc(BTs * F, MEM_ACTIVATIONS);
            a->lnf_rstd = (float *)mem_alloc(BTs * F, MEM_ACTIVATIONS);
            a->dlnf = (floatX *)mem_alloc(BTs * C * X, MEM_ACTIVATIONS);
        }
        a->inputs = (int *)mem_alloc(BT * sizeof(int), MEM_ACTIVATIONS);
        a->targets = (int *)mem_alloc(BT * sizeof(int), MEM_ACTIVATIONS);
    }
    Workspace *w = &m->ws;
    w->xfull = m->sp && tp > 1 ? (floatX *)mem_alloc(BT * C * X, MEM_WORKSPACE) : NULL;
    w->pfull = (floatX *)mem_alloc(BT * C * X, MEM_WORKSPACE);
    w->tokbuf = (floatX *)mem_alloc(BTs * C * X, MEM_WORKSPACE);
    w->dresid = (floatX *)mem_alloc(BTs * C * X, MEM_WORKSPACE);
    w->dwide = (floatX *)mem_alloc(BT * 4 * Cl * X, MEM_WORKSPACE);
    w->datty = (floatX *)mem_alloc(BT * Cl * X, MEM_WORKSPACE);
    if (m->last) {
        w->losses = (float *)mem_alloc(BT * F, MEM_LOGITS);
        m->ce.chunk = chunk > 0 && chunk < m->BT ? chunk : m->BT;
        m->ce.logits = (floatX *)mem_alloc((size_t)m->ce.chunk * m->Vl * X, MEM_LOGITS);
        m->ce.stats = (float *)mem_alloc((size_t)m->ce.chunk * 3 * F, MEM_LOGITS);
        m->ce.stats_all = (float *)mem_alloc((size_t)tp * m->ce.chunk * 3 * F, MEM_LOGITS);
    }
    // the pipeline's view of the slots: each one's input (resid[0]) and output (resid[Ls])
    Pipeline *p = &m->pipe;
    p->pp = &m->grid->pp_group; p->tp = &m->grid->tp_group;
    p->first = m->first; p->last = m->last;
    p->split = !m->sp && tp > 1;
    p->n = BTs * C;
    p->schedule = pp == 1 ? SCHEDULE_1F1B : schedule;   // (without a pipeline GPipe is 1F1B)
    p->nslots = nslots;
    p->input = (floatX **)malloc_check(nslots * sizeof(floatX *));
    p->output = (floatX **)malloc_check(nslots * sizeof(floatX *));
    for (int i = 0; i < nslots; i++) { p->input[i] = m->acts[i].resid; p->output[i] = m->acts[i].resid + (size_t)Ls * BTs * C; }
    p->grad = w->dresid;
}

// The tied embedding's gradient. wte is used twice: by the token embedding (first stage, the first op
// of the forward, so the last of the backward) and by the LM head (last stage, the first op of the
// backward). Both add to the gradient of the wte unit of their stage, so the unit is opened by the
// first user of a backward and closed by the last (zero.h reduces it once closed):
//   no pipeline: one unit [wpe, wte]; the head opens it, the token embedding adds its part and closes it.
//   pipeline:    each end stage holds its own copy of the wte unit: the head opens and closes the last
//                stage's, the token embedding the first stage's (and the separate wpe unit); after the
//                data-parallel reduction zero_finish_grads sums the two copies over the emb group.
typedef enum { WTE_HEAD, WTE_EMBEDDING } WteUser;

static floatX *wte_grad_open(GPT2 *m, WteUser user) {
    int shared = m->first && m->last;   // one stage holds both users: the head opened it
    if (user == WTE_EMBEDDING && shared) { return zero_unit_grads(&m->zero, m->u_embed); }
    return zero_begin_unit_backward(&m->zero, m->u_embed);
}

static void wte_grad_close(GPT2 *m, WteUser user, int last_micro) {
    int shared = m->first && m->last;
    if (user == WTE_HEAD && shared) { return; }   // the token embedding still adds to it
    zero_end_unit_backward(&m->zero, m->u_embed, last_micro);
}

// The stage's input (B, T) tokens on the first stage, a->resid[0] received from the previous stage
// otherwise -> the stage's output a->resid[Ls] (the last stage: the final LayerNorm a->lnf).
// Tensor-parallel communication by the two operations of tensor_parallel.h; ZeRO-3 gathers each
// unit's parameters as it comes.
static void gpt2_forward(GPT2 *m, Activations *a) {
    int C = m->config.channels, B = m->B, T = m->T, BT = m->BT, BTs = m->BTs;
    int Cl = m->Cl, NHl = m->NHl, sp = m->sp;
    Group *tp = &m->grid->tp_group;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS], *x;

    if (m->first) {
        // embedding: vocab-parallel token lookup of all BT tokens, summed over tp (SP: reduce-scattered
        // along the tokens), then the position embedding of the local tokens
        unit_view(&m->units[m->u_embed], zero_unit_params(&m->zero, m->u_embed), p);
        unit_view(&m->units[m->u_pos], zero_unit_params(&m->zero, m->u_pos), p);   // (the same unit without a pipeline)
        embedding_forward(w->pfull, a->inputs, p[T_WTE], m->v0, m->v0 + m->Vl, BT, C);
        x = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
        copy_on_device(a->resid, x, (size_t)BTs * C * sizeof(floatX));
        position_forward(a->resid, p[T_WPE], m->tok0, BTs, T, C);
    }
    for (int l = 0; l < m->Ls; l++) {
        int u = m->u_layer0 + l;
        unit_view(&m->units[u], zero_unit_params(&m->zero, u), p);
        LayerActs y = layer_acts(m, a, l);
        // attention block: ln1 -> all tokens -> qkv (column-parallel, local heads) -> attention
        //                  -> attproj (row-parallel) -> sum partials
        layernorm_forward(y.ln1, y.ln1_mean, y.ln1_rstd, y.res, p[T_LN1W], p[T_LN1B], BTs, C);
        x = tp_all_tokens(tp, sp, y.ln1, w->xfull, BTs, C);
        matmul_forward(y.qkv, x, p[T_QKVW], p[T_QKVB], BT, C, 3 * Cl);
        attention_forward(y.atty, y.lse, y.qkv, B, T, Cl, NHl);
        matmul_forward(w->pfull, y.atty, p[T_ATTPROJW], NULL, BT, Cl, C);
        x = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
        // MLP block: (+ bias + residual, fused with) ln2 -> all tokens -> fc (column-parallel, fused
        // with gelu) -> fcproj (row-parallel) -> sum partials
        residual_layernorm_forward(y.mid, y.ln2, y.ln2_mean, y.ln2_rstd, y.res, x, p[T_ATTPROJB], p[T_LN2W], p[T_LN2B], BTs, C);
        x = tp_all_tokens(tp, sp, y.ln2, w->xfull, BTs, C);
        matmul_forward_gelu(y.fchg, y.fch, x, p[T_FCW], p[T_FCB], BT, C, 4 * Cl);
        matmul_forward(w->pfull, y.fchg, p[T_FCPROJW], NULL, BT, 4 * Cl, C);
        x = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
        residual_bias_forward(y.out, y.mid, x, p[T_FCPROJB], BTs, C);
    }
    if (m->last) {
        unit_view(&m->units[m->u_final], zero_unit_params(&m->zero, m->u_final), p);
        layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, a->resid + (size_t)m->Ls * BTs * C, p[T_LNFW], p[T_LNFB], BTs, C);
    }
}

// Last stage: the tied LM head and the loss, fused and chunked (fused_ce.h). Returns the mean loss of
// this rank's B*T tokens. With backward: also dwte and the gradient of lnf (a->dlnf).
static float gpt2_head(GPT2 *m, Activations *a, float dloss, int backward, int last_micro) {
    const GPT2Config *c = &m->config;
    int C = c->channels, BT = m->BT;
    Group *tp = &m->grid->tp_group;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS], *g[NUM_TENSORS];
    // every tp rank needs the hidden states of all tokens: it holds Vp/tp of the vocabulary
    floatX *h = tp_all_tokens(tp, m->sp, a->lnf, w->xfull, m->BTs, C);
    unit_view(&m->units[m->u_embed], zero_unit_params(&m->zero, m->u_embed), p);
    floatX *dh = NULL, *dwte = NULL;
    if (backward) {
        unit_view(&m->units[m->u_embed], wte_grad_open(m, WTE_HEAD), g);
        dwte = g[T_WTE];
        dh = w->pfull;
    }
    fused_classifier(w->losses, dh, dwte, h, p[T_WTE], a->targets, &m->ce, tp, m->v0, c->vocab_size, m->Vl, BT, C, dloss);
    if (backward) {
        floatX *dlnf = tp_sum_partials(tp, m->sp, dh, w->tokbuf, m->BTs, C);
        copy_on_device(a->dlnf, dlnf, (size_t)m->BTs * C * sizeof(floatX));
        wte_grad_close(m, WTE_HEAD, last_micro);
    }
    float *losses = (float *)malloc_check(sizeof(float) * BT);
    copy_to_host(losses, w->losses, sizeof(float) * BT);
    double sum = 0.0;
    for (int i = 0; i < BT; i++) { sum += losses[i]; }
    free(losses);
    return (float)(sum / BT);
}

// The backward of one micro-batch: from a->dlnf on the last stage, from the gradient of the stage's
// output (received into ws.dresid) otherwise; leaves the gradient of the stage's input in ws.dresid.
// Each unit's gradient goes to zero.h as soon as the unit is done, so its data-parallel reduction
// overlaps the backward of the layers below.
static void gpt2_backward(GPT2 *m, Activations *a, int last_micro) {
    int C = m->config.channels, B = m->B, T = m->T, BT = m->BT, BTs = m->BTs;
    int Cl = m->Cl, NHl = m->NHl, sp = m->sp;
    Group *tp = &m->grid->tp_group;
    Zero *z = &m->zero;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS], *g[NUM_TENSORS];

    if (m->last) {
        unit_view(&m->units[m->u_final], zero_unit_params(z, m->u_final), p);
        unit_view(&m->units[m->u_final], zero_begin_unit_backward(z, m->u_final), g);
        zero_on_device(w->dresid, (size_t)BTs * C * sizeof(floatX));
        layernorm_backward(w->dresid, g[T_LNFW], g[T_LNFB], a->dlnf, a->resid + (size_t)m->Ls * BTs * C, p[T_LNFW],
                           a->lnf_mean, a->lnf_rstd, BTs, C);
        zero_end_unit_backward(z, m->u_final, last_micro);
    }
    for (int l = m->Ls - 1; l >= 0; l--) {
        int u = m->u_layer0 + l;
        unit_view(&m->units[u], zero_unit_params(z, u), p);
        unit_view(&m->units[u], zero_begin_unit_backward(z, u), g);
        LayerActs y = layer_acts(m, a, l);
        // MLP block (w->dresid is the gradient of the layer's output)
        bias_backward(g[T_FCPROJB], w->dresid, BTs, C);
        floatX *dy = tp_all_tokens(tp, sp, w->dresid, w->pfull, BTs, C);
        matmul_backward_dgelu(w->dwide, g[T_FCPROJW], dy, y.fchg, p[T_FCPROJW], y.fch, BT, 4 * Cl, C);   // d(fc output)
        floatX *x = tp_all_tokens(tp, sp, y.ln2, w->xfull, BTs, C);   // SP: gathered again, not stored
        matmul_backward(w->pfull, g[T_FCW], g[T_FCB], w->dwide, x, p[T_FCW], BT, C, 4 * Cl);
        floatX *dln = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
        layernorm_backward(w->dresid, g[T_LN2W], g[T_LN2B], dln, y.mid, p[T_LN2W], y.ln2_mean, y.ln2_rstd, BTs, C);
        // attention block (w->dresid is now the gradient of mid)
        bias_backward(g[T_ATTPROJB], w->dresid, BTs, C);
        dy = tp_all_tokens(tp, sp, w->dresid, w->pfull, BTs, C);
        matmul_backward(w->datty, g[T_ATTPROJW], NULL, dy, y.atty, p[T_ATTPROJW], BT, Cl, C);
        attention_backward(w->dwide, w->datty, y.qkv, y.atty, y.lse, B, T, Cl, NHl);
        x = tp_all_tokens(tp, sp, y.ln1, w->xfull, BTs, C);
        matmul_backward(w->pfull, g[T_QKVW], g[T_QKVB], w->dwide, x, p[T_QKVW], BT, C, 3 * Cl);
        dln = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
        layernorm_backward(w->dresid, g[T_LN1W], g[T_LN1B], dln, y.res, p[T_LN1W], y.ln1_mean, y.ln1_rstd, BTs, C);
        zero_end_unit_backward(z, u, last_micro);
    }
    if (m->first) {
        // the embedding: the position embedding of the local tokens, the token embedding of all of them
        int pipeline = m->u_pos != m->u_embed;
        unit_view(&m->units[m->u_embed], wte_grad_open(m, WTE_EMBEDDING), g);
        if (pipeline) { unit_view(&m->units[m->u_pos], zero_begin_unit_backward(z, m->u_pos), g); }
        position_backward(g[T_WPE], w->dresid, m->tok0, BTs, T, C);
        floatX *dy = tp_all_tokens(tp, sp, w->dresid, w->pfull, BTs, C);
        embedding_backward(g[T_WTE], dy, a->inputs, m->v0, m->v0 + m->Vl, BT, C);
        if (pipeline) { zero_end_unit_backward(z, m->u_pos, last_micro); }
        wte_grad_close(m, WTE_EMBEDDING, last_micro);
    }
}

// ----------------------------------------------------------------------------
// one training step: the micro-batches through the pipeline stages (pipeline.h), then AdamW

typedef struct { float beta1, beta2, eps, weight_decay, grad_clip; unsigned int seed; } OptConfig;

static void gpt2_upload_batch(GPT2 *m, Activations *a, const int *inputs, const int *targets) {
    copy_to_device(a->inputs, inputs, sizeof(int) * m->BT);
    copy_to_device(a->targets, targets, sizeof(int) * m->BT);
}

// What the schedule runs for one training step on this stage.
typedef struct {
    GPT2 *m;
    DataLoader *dl;
    int accum;
    float dloss;       // d(loss)/d(each token's loss): 1 / (tokens in the global batch)
    double loss;       // summed over the micro-batches (last stage)
} TrainStep;

// Forward of micro-batch i (its input received): every stage reads every batch, in the same order;
// the last stage runs the fused head too, forward and backward at once.
static void train_forward(void *ctx, int i) {
    TrainStep *s = (TrainStep *)ctx;
    GPT2 *m = s->m;
    Activations *a = &m->acts[i % m->pipe.nslots];
    dataloader_next_batch(s->dl);
    gpt2_upload_batch(m, a, s->dl->inputs, s->dl->targets);
    gpt2_forward(m, a);
    if (m->last) { s->loss += gpt2_head(m, a, s->dloss, 1, i == s->accum - 1); }
}

static void train_backward(void *ctx, int i) {
    TrainStep *s = (TrainStep *)ctx;
    gpt2_backward(s->m, &s->m->acts[i % s->m->pipe.nslots], i == s->accum - 1);
}

// Forward and backward of `accum` micro-batches; the gradients end up reduced as the ZeRO stage
// wants them. Returns the mean loss over the global batch (all micro-batches, all dp ranks), on
// every rank.
static float gpt2_forward_backward(GPT2 *m, DataLoader *dl, int accum) {
    zero_clear_grads(&m->zero);
    TrainStep s = {m, dl, accum, 1.0f / ((float)m->BT * accum * m->grid->dp), 0.0};
    pipeline_run(&m->pipe, accum, (StageWork){&s, train_forward, train_backward});
    zero_finish_grads(&m->zero);
    // the loss lives on the last stage; every rank gets it
    double loss = s.loss / accum;
    if (m->grid->pp > 1) { MPI_Bcast(&loss, 1, MPI_DOUBLE, m->grid->pp - 1, m->grid->pp_group.mpi); }
    comm_sum_host(&m->grid->dp_group, &loss, 1);
    return (float)(loss / m->grid->dp);
}

// Clips by the global gradient norm and runs AdamW (step is 0-based). Returns the norm before clipping.
static float gpt2_update(GPT2 *m, const OptConfig *o, float lr, int step) {
    float norm = zero_grad_norm(&m->zero);
    float scale = (o->grad_clip > 0.0f && norm > o->grad_clip) ? o->grad_clip / norm : 1.0f;
    zero_optimizer_step(&m->zero, lr, o->beta1, o->beta2, o->eps, o->weight_decay, scale, step + 1, o->seed + 7919u * step);
    return norm;
}

static void forward_only(void *ctx, int i) { (void)i; GPT2 *m = (GPT2 *)ctx; gpt2_forward(m, &m->acts[0]); }

// Forward only, through every stage: tokens (B, T) in; the last stage's lnf out (in acts[0]).
static void gpt2_forward_pipeline(GPT2 *m, const int *inputs, const int *targets) {
    gpt2_upload_batch(m, &m->acts[0], inputs, targets);
    pipeline_forward_only(&m->pipe, (StageWork){m, forward_only, NULL});
}

// Mean loss over up to max_batches batches of the loader (from its start), over all dp ranks.
static float gpt2_validate(GPT2 *m, DataLoader *dl, int max_batches) {
    dataloader_reset(dl);
    int n = max_batches < (int)dl->nrounds ? max_batches : (int)dl->nrounds;
    if (n < 1) { n = 1; }
    double loss = 0.0;
    for (int i = 0; i < n; i++) {
        dataloader_next_batch(dl);
        gpt2_forward_pipeline(m, dl->inputs, dl->targets);
        if (m->last) { loss += gpt2_head(m, &m->acts[0], 0.0f, 0, 0); }
    }
    loss /= n;
    if (m->grid->pp > 1) { MPI_Bcast(&loss, 1, MPI_DOUBLE, m->grid->pp - 1, m->grid->pp_group.mpi); }
    comm_sum_host(&m->grid->dp_group, &loss, 1);
    return (float)(loss / m->grid->dp);
}

// Generates gen_tokens tokens after an EOT (sampled at temperature 1). Every rank runs it with the
// same generator (the forward needs the tp, pp and, at ZeRO 3, dp collectives); the last stage draws
// the token and sends it to the others; rank 0 prints.
static void gpt2_sample(GPT2 *m, Tokenizer *tok, Rng *rng, int gen_tokens, int eot) {
    const GPT2Config *c = &m->config;
    int C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size;
    int *gen = (int *)malloc_check(sizeof(int) * m->BT);
    for (int i = 0; i < m->BT; i++) { gen[i] = eot; }
    floatX *row = m->last ? (floatX *)mem_alloc((size_t)Vp * sizeof(floatX), MEM_LOGITS) : NULL;
    float *probs = (float *)malloc_check(sizeof(float) * Vp);
    if (m->grid->rank == 0) { printf("generating:\n---\n"); }
    int n = gen_tokens < m->T - 1 ? gen_tokens : m->T - 1;
    for (int t = 1; t <= n; t++) {
        gpt2_forward_pipeline(m, gen, gen);
        float coin01 = rng_f32(rng);   // every rank draws, so the generators stay equal
        int next = 0;
        if (m->last) {
            floatX *h = tp_all_tokens(&m->grid->tp_group, m->sp, m->acts[0].lnf, m->ws.xfull, m->BTs, C);
            floatX *p[NUM_TENSORS];
            unit_view(&m->units[m->u_embed], zero_unit_params(&m->zero, m->u_embed), p);
            // this rank's vocabulary slice of the logits of position t-1, then all slices (Vp)
            matmul_forward(row + m->v0, h + (size_t)(t - 1) * C, p[T_WTE], NULL, 1, C, m->Vl);
            comm_all_gather(&m->grid->tp_group, row + m->v0, row, m->Vl, DT_FLOATX, NULL);
            download_floats(probs, row, Vp);
            float maxv = -INFINITY;
            for (int v = 0; v < V; v++) { if (probs[v] > maxv) { maxv = probs[v]; } }
            double sum = 0.0;
            for (int v = 0; v < V; v++) { sum += exp(probs[v] - maxv); }
            double coin = coin01 * sum, cdf = 0.0;
            next = V - 1;
            for (int v = 0; v < V; v++) { cdf += exp(probs[v] - maxv); if (coin < cdf) { next = v; break; } }
        }
        if (m->grid->pp > 1) { MPI_Bcast(&next, 1, MPI_INT, m->grid->pp - 1, m->grid->pp_group.mpi); }
        gen[t] = next;
        if (m->grid->rank == 0) {
            const char *piece = tokenizer_decode(tok, next);
            if (piece) { safe_printf(piece); } else { printf("%d ", next); }
            fflush(stdout);
        }
    }
    if (m->grid->rank == 0) { printf("\n---\n"); }
    mem_free(row);
    free(probs);
    free(gen);
}

// ----------------------------------------------------------------------------
// checkpoints: DIR/model_STEP.bin (llm.c format, written by rank 0), DIR/state_STEP_RANK.bin
// (each rank: its AdamW shard, data position, generator), each written under a temporary name and
// renamed; then DIR/DONE_STEP once every rank has finished. Resume takes the newest DONE_.

#define STATE_MAGIC 20240527

// Writes the full model (all pipeline stages, tp slices, ZeRO-3 shards) to path, in the precision
// of floatX: each stage's (tp 0, dp 0) rank assembles its tensors, rank 0 sums the stages' arrays.
static void gpt2_write_model(GPT2 *m, const char *path) {
    const GPT2Config *c = &m->config;
    Grid *g = m->grid;
    int assemble = g->dp_rank == 0 && g->tp_rank == 0, write = g->rank == 0;
    float *all = assemble ? (float *)malloc_check(m->num_parameters * sizeof(float)) : NULL;
    float *full[NUM_TENSORS];
    if (assemble) { memset(all, 0, m->num_parameters * sizeof(float)); split_tensors(c, all, full); }
    for (int u = 0; u < m->nunits; u++) {
        const Unit *U = &m->units[u];
        float *host = (float *)malloc_check(U->size * sizeof(float));
        zero_get_unit_params(&m->zero, u, host);            // stage 3: a dp all-gather
        if (g->dp_rank == 0 && !U->norm_skip) {            // (the last stage's embedding copy: the first's counts)
            float *slices = g->tp_rank == 0 ? (float *)malloc_check(U->size * sizeof(float) * g->tp) : NULL;
            MPI_Gather(host, (int)U->size, MPI_FLOAT, slices, (int)U->size, MPI_FLOAT, 0, g->tp_group.mpi);
            if (assemble) {
                for (int r = 0; r < g->tp; r++) { unit_copy_full(c, U, full, slices + (size_t)r * U->size, g->tp, r, 0); }
            }
            free(slices);
        }
        free(host);
    }
    if (assemble && g->pp > 1) {   // every tensor is written by exactly one stage: the sum is the model
        MPI_Reduce(write ? MPI_IN_PLACE : all, all, (int)m->num_parameters, MPI_FLOAT, MPI_SUM, 0, g->pp_group.mpi);
    }
    zero_release_params(&m->zero);
    if (!write) { free(all); return; }
    int h[256] = {0};
    h[0] = MODEL_MAGIC; h[1] = sizeof(floatX) == 4 ? 3 : 5;
    h[2] = c->max_seq_len; h[3] = c->vocab_size; h[4] = c->num_layers; h[5] = c->num_heads; h[6] = c->channels;
    h[7] = c->padded_vocab_size;
    char tmp[1100];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen_check(tmp, "wb");
    fwrite_check(h, sizeof(int), 256, f, tmp);
    if (h[1] == 3) {
        fwrite_check(all, sizeof(float), m->num_parameters, f, tmp);
    } else {
        uint16_t *b = (uint16_t *)malloc_check(m->num_parameters * 2);
        for (size_t i = 0; i < m->num_parameters; i++) { b[i] = float_to_bf16(all[i]); }
        fwrite_check(b, 2, m->num_parameters, f, tmp);
        free(b);
    }
    fclose_check(f, tmp);
    if (rename(tmp, path) != 0) { fail("cannot rename '%s' to '%s'", tmp, path); }
    free(all);
}

static void save_checkpoint(GPT2 *m, const char *dir, int step, DataLoader *dl, Rng *rng, int total_batch) {
    Grid *g = m->grid;
    Zero *z = &m->zero;
    char path[1024], tmp[1100];
    snprintf(path, sizeof(path), "%s/model_%08d.bin", dir, step);
    gpt2_write_model(m, path);
    snprintf(path, sizeof(path), "%s/state_%08d_%05d.bin", dir, step, g->rank);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int h[256] = {0};
    h[0] = STATE_MAGIC; h[1] = 1; h[2] = step; h[3] = g->world_size; h[4] = g->tp; h[5] = g->pp; h[6] = g->dp;
    h[7] = z->stage; h[8] = dl->epoch; h[9] = dl->shard_pos; h[10] = dl->round; h[11] = z->master != NULL;
    h[12] = m->B; h[13] = m->T; h[14] = total_batch;
    uint64_t u64[2] = {rng->s, (uint64_t)z->opt_size};
    float *buf = (float *)malloc_check(z->opt_size * sizeof(float));
    FILE *f = fopen_check(tmp, "wb");
    fwrite_check(h, sizeof(int), 256, f, tmp);
    fwrite_check(u64, sizeof(uint64_t), 2, f, tmp);
    float *states[3] = {z->m, z->v, z->master};
    for (int i = 0; i < 3; i++) {
        if (states[i] == NULL) { continue; }
        copy_to_host(buf, states[i], z->opt_size * sizeof(float));
        fwrite_check(buf, sizeof(float), z->opt_size, f, tmp);
    }
    fclose_check(f, tmp);
    free(buf);
    if (rename(tmp, path) != 0) { fail("cannot rename '%s' to '%s'", tmp, path); }
    MPI_Barrier(MPI_COMM_WORLD);     // every rank's files are complete
    if (g->rank == 0) {
        snprintf(path, sizeof(path), "%s/DONE_%08d", dir, step);
        FILE *d = fopen_check(path, "wb");
        fclose_check(d, path);
        printf("wrote checkpoint at step %d to %s\n", step, dir);
    }
}

// The step of the newest complete checkpoint in dir, or -1 (same answer on every rank).
static int latest_checkpoint(const char *dir) {
    int best = -1;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        DIR *d = opendir(dir);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d)) != NULL) {
                int s;
                char extra;
                if (sscanf(e->d_name, "DONE_%d%c", &s, &extra) == 1 && s > best) { best = s; }
            }
            closedir(d);
        }
    }
    MPI_Bcast(&best, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return best;
}

// Restores this rank's optimizer shard, data position and generator (the model file is loaded by main).
static void load_state(GPT2 *m, const char *dir, int step, DataLoader *dl, Rng *rng, int total_batch) {
    Grid *g = m->grid;
    Zero *z = &m->zero;
    char path[1024];
    snprintf(path, sizeof(path), "%s/state_%08d_%05d.bin", dir, step, g->rank);
    FILE *f = fopen_check(path, "rb");
    int h[256];
    uint64_t u64[2];
    fread_check(h, sizeof(int), 256, f, path);
    if (h[0] != STATE_MAGIC || h[1] != 1) { fail("state file '%s' has bad magic/version (%d %d), expected %d 1", path, h[0], h[1], STATE_MAGIC); }
    if (h[2] != step || h[3] != g->world_size || h[4] != g->tp || h[5] != g->pp || h[6] != g->dp || h[7] != z->stage) {
        fail("state file '%s' was written by world %d (tp %d pp %d dp %d zero %d); this run is world %d (tp %d pp %d dp %d zero %d): resume with the same layout",
             path, h[3], h[4], h[5], h[6], h[7], g->world_size, g->tp, g->pp, g->dp, z->stage);
    }
    if (h[12] != m->B || h[13] != m->T || h[14] != total_batch) {
        fail("state file '%s' was written with -b %d -t %d -d %d; this run has -b %d -t %d -d %d: the data position would not match",
             path, h[12], h[13], h[14], m->B, m->T, total_batch);
    }
    fread_check(u64, sizeof(uint64_t), 2, f, path);
    if (u64[1] != z->opt_size || h[11] != (z->master != NULL)) { fail("state file '%s' holds a different optimizer shard size", path); }
    rng->s = u64[0];
    float *buf = (float *)malloc_check(z->opt_size * sizeof(float));
    float *states[3] = {z->m, z->v, z->master};
    for (int i = 0; i < 3; i++) {
        if (states[i] == NULL) { continue; }
        fread_check(buf, sizeof(float), z->opt_size, f, path);
        copy_to_device(states[i], buf, z->opt_size * sizeof(float));
    }
    free(buf);
    fclose(f);
    dataloader_seek(dl, h[8], h[9], h[10]);
}

// ----------------------------------------------------------------------------
// the built-in corpus: a seeded Markov chain, so that ./train_gpt works with no data files

// From each of S symbols, 4 successors with probabilities 1/2, 1/4, 1/8, 1/8. Returns the entropy
// rate in nats per token: the lowest loss a model can reach on it.
static double synthetic_corpus(uint16_t *tokens, size_t n, int vocab_size, uint64_t seed) {
    int S = vocab_size < 256 ? vocab_size : 256;
    static const double prob[4] = {0.5, 0.25, 0.125, 0.125};
    int *succ = (int *)malloc_check(sizeof(int) * 4 * S);
    Rng rng;
    rng_init(&rng, 12345);                       // the chain itself is fixed
    for (int i = 0; i < 4 * S; i++) { succ[i] = (int)(rng_u32(&rng) % S); }
    rng_init(&rng, seed);
    int cur = 0;
    for (size_t i = 0; i < n; i++) {
        tokens[i] = (uint16_t)cur;
        float u = rng_f32(&rng);
        int k = u < 0.5f ? 0 : (u < 0.75f ? 1 : (u < 0.875f ? 2 : 3));
        cur = succ[4 * cur + k];
    }
    free(succ);
    double h = 0.0;
    for (int k = 0; k < 4; k++) { h -= prob[k] * log(prob[k]); }
    return h;
}

// ----------------------------------------------------------------------------
// command line

typedef struct {
    const char *train_pattern, *val_pattern, *output_dir, *model;
    int B, T, total_batch, max_steps, warmup, val_every, val_batches, sample_every, gen_tokens;
    int checkpoint_every, resume, zero, tp, pp, dp, ep, sp, ce_chunk, memory_report, comm_report, shuffle;
    float lr, final_frac, weight_decay, grad_clip;
    const char *scheduler, *pp_schedule;
    unsigned int seed;
} Args;

static void default_args(Args *a) {
    memset(a, 0, sizeof(*a));
    a->model = "d4"; a->B = 4; a->T = 64; a->total_batch = -1; a->max_steps = -1; a->lr = 3e-4f; a->warmup = 0;
    a->final_frac = 1.0f; a->weight_decay = 0.0f; a->val_every = 20; a->val_batches = 20; a->sample_every = 20;
    a->gen_tokens = 64; a->checkpoint_every = 0; a->resume = 0; a->zero = 0; a->tp = 1; a->pp = 1; a->dp = -1;
    a->ep = 1; a->sp = 0; a->ce_chunk = 256; a->shuffle = -1; a->grad_clip = 1.0f; a->scheduler = "cosine";
    a->pp_schedule = "1f1b";
    a->seed = 1337;
}

static void print_usage(void) {
    printf("usage: mpirun -np N ./train_gpt [options]\n"
           "  -i <glob>  train data shards (default: built-in synthetic corpus)\n"
           "  -j <glob>  validation data shards (default: none, or the built-in corpus)\n"
           "  -o <dir>   output dir for main.log and checkpoints (default: none)\n"
           "  -e <str>   model file (llm.c .bin), or dN (depth N), or L=..,C=..,NH=..,V=..,maxT=..[,Vp=..] (default d4)\n"
           "  -b <int>   micro-batch size B per rank (default 4)\n"
           "  -t <int>   sequence length T (default 64)\n"
           "  -d <int>   total batch size in tokens; B*T*dp must divide it (default B*T*dp)\n"
           "  -x <int>   max steps (default -1: one epoch; 0: set up and print the reports only)\n"
           "  -l <f>     learning rate (default 3e-4)\n"
           "  -u <int>   warm-up steps (default 0)\n"
           "  -q <f>     final learning rate fraction (default 1.0)\n"
           "  -c <f>     weight decay (default 0.0)\n"
           "  -k <str>   lr schedule: cosine|linear|constant|wsd (default cosine)\n"
           "  -v <int>   validate every N steps (default 20; 0 off)\n"
           "  -m <int>   validation batches (default 20)\n"
           "  -s <int>   sample every N steps (default 20; 0 off)\n"
           "  -g <int>   tokens to generate (default 64)\n"
           "  -n <int>   checkpoint every N steps (default 0 off; needs -o)\n"
           "  -y <int>   1: resume from the newest checkpoint in -o (error if none); 2: resume if one exists\n"
           "  -z <int>   ZeRO stage 0-3 (same as --zero)\n"
           "  --tp N (alias --tensor-model-parallel-size)  --pp N  --pp-schedule 1f1b|gpipe  --dp N  --sp  --zero N  --ep N\n"
           "  --ce-chunk N (tokens per cross-entropy chunk, 0 = full logits)  --memory-report  --comm-report\n"
           "  --seed N  --shuffle 0|1  --grad-clip F (0 = off)\n");
}

static int parse_int_arg(int rank, const char *flag, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno != 0) { fail_all(rank, "%s expects an integer, got '%s'", flag, v); }
    if (x < lo || x > hi) { fail_all(rank, "%s must be in [%ld, %ld], got %ld", flag, lo, hi, x); }
    return (int)x;
}

static float parse_float_arg(int rank, const char *flag, const char *v, double lo, double hi) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || errno != 0 || x != x) { fail_all(rank, "%s expects a number, got '%s'", flag, v); }
    if (x < lo || x > hi) { fail_all(rank, "%s must be in [%g, %g], got %g", flag, lo, hi, x); }
    return (float)x;
}

// Parses argv into a; every rank does the same, so every rank rejects the same bad flag.
static void parse_args(int argc, char **argv, Args *a, int rank) {
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { if (rank == 0) { print_usage(); } MPI_Finalize(); exit(0); }
        if (!strcmp(f, "--sp")) { a->sp = 1; continue; }
        if (!strcmp(f, "--memory-report")) { a->memory_report = 1; continue; }
        if (!strcmp(f, "--comm-report")) { a->comm_report = 1; continue; }
        static const char *with_value[] = {"-i", "-j", "-o", "-e", "-b", "-t", "-d", "-x", "-l", "-u", "-q", "-c", "-k",
                                           "-v", "-m", "-s", "-g", "-n", "-y", "-z", "--tp", "--tensor-model-parallel-size",
                                           "--pp", "--dp", "--zero", "--ep", "--ce-chunk", "--seed", "--shuffle", "--grad-clip",
                                           "--pp-schedule"};
        int known = 0;
        for (size_t k = 0; k < sizeof(with_value) / sizeof(with_value[0]); k++) { if (!strcmp(f, with_value[k])) { known = 1; } }
        if (!known) { fail_all(rank, "unknown flag '%s' (see -h)", f); }
        for (int j = 1; j < i; j++) {   // a flag given twice is a mistake, not an override
            if (!strcmp(argv[j], f)) { fail_all(rank, "flag %s is given twice", f); }
        }
        if (i + 1 >= argc) { fail_all(rank, "flag %s is missing its value", f); }
        const char *v = argv[++i];
        if (!strcmp(f, "-i")) { a->train_pattern = v; }
        else if (!strcmp(f, "-j")) { a->val_pattern = v; }
        else if (!strcmp(f, "-o")) { a->output_dir = v; }
        else if (!strcmp(f, "-e")) { a->model = v; }
        else if (!strcmp(f, "-b")) { a->B = parse_int_arg(rank, f, v, 1, 1 << 20); }
        else if (!strcmp(f, "-t")) { a->T = parse_int_arg(rank, f, v, 1, 1 << 20); }
        else if (!strcmp(f, "-d")) { a->total_batch = parse_int_arg(rank, f, v, -1, 1 << 30); }
        else if (!strcmp(f, "-x")) { a->max_steps = parse_int_arg(rank, f, v, -1, 1 << 30); }
        else if (!strcmp(f, "-l")) { a->lr = parse_float_arg(rank, f, v, 0.0, 10.0); }
        else if (!strcmp(f, "-u")) { a->warmup = parse_int_arg(rank, f, v, 0, 1 << 30); }
        else if (!strcmp(f, "-q")) { a->final_frac = parse_float_arg(rank, f, v, 0.0, 1.0); }
        else if (!strcmp(f, "-c")) { a->weight_decay = parse_float_arg(rank, f, v, 0.0, 10.0); }
        else if (!strcmp(f, "-k")) { if (!lr_scheduler_valid(v)) { fail_all(rank, "-k expects cosine|linear|constant|wsd, got '%s'", v); } a->scheduler = v; }
        else if (!strcmp(f, "-v")) { a->val_every = parse_int_arg(rank, f, v, 0, 1 << 30); }
        else if (!strcmp(f, "-m")) { a->val_batches = parse_int_arg(rank, f, v, 1, 1 << 30); }
        else if (!strcmp(f, "-s")) { a->sample_every = parse_int_arg(rank, f, v, 0, 1 << 30); }
        else if (!strcmp(f, "-g")) { a->gen_tokens = parse_int_arg(rank, f, v, 1, 1 << 20); }
        else if (!strcmp(f, "-n")) { a->checkpoint_every = parse_int_arg(rank, f, v, 0, 1 << 30); }
        else if (!strcmp(f, "-y")) { a->resume = parse_int_arg(rank, f, v, 0, 2); }
        else if (!strcmp(f, "-z") || !strcmp(f, "--zero")) { a->zero = parse_int_arg(rank, f, v, 0, 3); }
        else if (!strcmp(f, "--tp") || !strcmp(f, "--tensor-model-parallel-size")) { a->tp = parse_int_arg(rank, f, v, 1, 1 << 16); }
        else if (!strcmp(f, "--pp")) { a->pp = parse_int_arg(rank, f, v, 1, 1 << 16); }
        else if (!strcmp(f, "--dp")) { a->dp = parse_int_arg(rank, f, v, 1, 1 << 16); }
        else if (!strcmp(f, "--ep")) { a->ep = parse_int_arg(rank, f, v, 1, 1 << 16); }
        else if (!strcmp(f, "--ce-chunk")) { a->ce_chunk = parse_int_arg(rank, f, v, 0, 1 << 30); }
        else if (!strcmp(f, "--seed")) { a->seed = (unsigned)parse_int_arg(rank, f, v, 0, 2147483647); }
        else if (!strcmp(f, "--shuffle")) { a->shuffle = parse_int_arg(rank, f, v, 0, 1); }
        else if (!strcmp(f, "--grad-clip")) { a->grad_clip = parse_float_arg(rank, f, v, 0.0, 1e9); }
        else if (!strcmp(f, "--pp-schedule")) {
            if (strcmp(v, "1f1b") && strcmp(v, "gpipe")) { fail_all(rank, "--pp-schedule expects 1f1b or gpipe, got '%s'", v); }
            a->pp_schedule = v;
        }
    }
}

// The checks that need the world size and the model shape; identical on every rank, so every rank
// exits with the same message before any collective could hang.
static void validate_layout(Args *a, const GPT2Config *c, int world, int rank) {
    if (world % (a->tp * a->pp) != 0) {
        fail_all(rank, "world size %d is not divisible by tp*pp = %d*%d (world = tp*pp*dp)", world, a->tp, a->pp);
    }
    int dp = world / (a->tp * a->pp);
    if (a->dp != -1 && a->dp != dp) { fail_all(rank, "--dp %d does not match world size %d = tp %d * pp %d * dp %d", a->dp, world, a->tp, a->pp, dp); }
    a->dp = dp;
    if (a->pp > c->num_layers) { fail_all(rank, "--pp %d is larger than the number of layers %d", a->pp, c->num_layers); }
    if (dp % a->ep != 0) { fail_all(rank, "--ep %d does not divide dp %d", a->ep, dp); }
    if (a->ep != 1) { fail_all(rank, "--ep %d: expert parallelism needs MoE layers, which are not implemented yet; only --ep 1", a->ep); }
    if (c->num_heads % a->tp) { fail_all(rank, "--tp %d does not divide the number of heads %d", a->tp, c->num_heads); }
    if ((4 * c->channels) % a->tp) { fail_all(rank, "--tp %d does not divide 4C = %d", a->tp, 4 * c->channels); }
    if (c->padded_vocab_size % a->tp) { fail_all(rank, "--tp %d does not divide the padded vocab size %d", a->tp, c->padded_vocab_size); }
    if (a->sp && a->T % a->tp) { fail_all(rank, "--sp: --tp %d does not divide T = %d", a->tp, a->T); }
    if (a->T > c->max_seq_len) { fail_all(rank, "-t %d is larger than the model's maximum sequence length %d", a->T, c->max_seq_len); }
    long tokens_per_micro = (long)a->B * a->T * dp;
    if (tokens_per_micro > (1L << 30)) {
        fail_all(rank, "B*T*dp = %d*%d*%d = %ld tokens per micro-batch is too large (at most 2^30)", a->B, a->T, dp, tokens_per_micro);
    }
    if (a->total_batch == -1) { a->total_batch = (int)tokens_per_micro; }
    if (a->total_batch <= 0 || a->total_batch % tokens_per_micro != 0) {
        fail_all(rank, "-d %d is not a multiple of B*T*dp = %d*%d*%d = %ld", a->total_batch, a->B, a->T, dp, tokens_per_micro);
    }
    if ((a->checkpoint_every > 0 || a->resume) && a->output_dir == NULL) { fail_all(rank, "-n and -y need an output dir (-o)"); }
    if (a->val_pattern && !a->train_pattern) { fail_all(rank, "-j needs -i (without -i both come from the built-in corpus)"); }
#ifdef USE_CUDA
    int hs = c->channels / c->num_heads;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128) {
        fail_all(rank, "head size C/NH = %d: the CUDA attention supports 16, 32, 64, 128", hs);
    }
#endif
}

// mkdir -p
static void make_dirs(const char *dir) {
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') { *p = '\0'; mkdir(buf, 0755); *p = '/'; }
    }
    mkdir(buf, 0755);
}

static PipeSchedule pipe_schedule(const char *name) { return strcmp(name, "gpipe") ? SCHEDULE_1F1B : SCHEDULE_GPIPE; }

// Creates the output dir (and its parents) if needed and checks that a file can be written there.
static void check_output_dir(const char *dir, int rank) {
    if (rank == 0) { make_dirs(dir); }
    MPI_Barrier(MPI_COMM_WORLD);
    char path[1024];
    snprintf(path, sizeof(path), "%s/.write_test_%d", dir, rank);
    FILE *f = fopen(path, "wb");
    int ok = f != NULL;
    if (f) { fclose(f); remove(path); }
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) { fail_all(rank, "-o '%s' is not a writable directory", dir); }
}

// ----------------------------------------------------------------------------
// main: set-up (model, data), the training loop, the reports

// The model's weights (host fp32, file order) and shape: from the newest checkpoint in -o when
// resuming (*resume_step >= 0), else from a model file, else a descriptor with random init.
static float *load_model(Args *a, int rank, GPT2Config *config, int *resume_step) {
    *resume_step = -1;
    if (a->resume) {
        *resume_step = latest_checkpoint(a->output_dir);
        if (*resume_step < 0 && a->resume == 1) {
            fail_all(rank, "-y 1: nothing to resume in '%s' (no DONE_* marker); use -y 2 to start fresh when there is none", a->output_dir);
        }
        if (*resume_step < 0 && rank == 0) { printf("-y 2: no checkpoint in %s, starting fresh\n", a->output_dir); }
    }
    int desc = parse_descriptor(a->model, config);
    if (desc < 0) { fail_all(rank, "-e '%s' is a malformed model descriptor (expected dN or L=..,C=..,NH=..,V=..,maxT=..)", a->model); }
    if (*resume_step >= 0) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/model_%08d.bin", a->output_dir, *resume_step);
        return read_model_file(path, config);
    }
    return desc == 1 ? random_init(config, a->seed) : read_model_file(a->model, config);
}

// The train and validation loaders: the -i / -j shards (and tokenizer.bin beside the train shards,
// for decoding samples), or the built-in corpus. Returns whether there is validation data.
static int setup_data(const Args *a, const GPT2Config *config, Grid *grid, DataLoader *train, DataLoader *val, Tokenizer *tok) {
    memset(tok, 0, sizeof(*tok));
    if (a->train_pattern) {
        dataloader_init(train, a->train_pattern, a->B, a->T, config->vocab_size, grid->dp, grid->dp_rank, a->shuffle, a->seed);
        if (a->val_pattern) {
            dataloader_init(val, a->val_pattern, a->B, a->T, config->vocab_size, grid->dp, grid->dp_rank, 0, a->seed);
        }
        char tok_path[1024];
        snprintf(tok_path, sizeof(tok_path), "%s", train->files.gl_pathv[0]);
        char *slash = strrchr(tok_path, '/');
        snprintf(slash ? slash + 1 : tok_path, sizeof(tok_path) - (slash ? slash + 1 - tok_path : 0), "tokenizer.bin");
        if (access(tok_path, R_OK) == 0) { tokenizer_init(tok, tok_path); }
        return a->val_pattern != NULL;
    }
    size_t need = (size_t)grid->dp * a->B * a->T + 1;
    size_t n_train = need * 4 > 32768 ? need * 4 : 32768, n_val = need > 8192 ? need : 8192;
    uint16_t *corpus = (uint16_t *)malloc_check((n_train + n_val) * sizeof(uint16_t));
    double h = synthetic_corpus(corpus, n_train + n_val, config->vocab_size, a->seed);
    if (grid->rank == 0) {
        printf("data: no -i, built-in synthetic corpus (Markov chain, %zu train + %zu val tokens), entropy rate %.4f nats/token = the loss floor\n",
               n_train, n_val, h);
    }
    dataloader_init_memory(train, corpus, n_train, a->B, a->T, config->vocab_size, grid->dp, grid->dp_rank, a->seed);
    dataloader_init_memory(val, corpus + n_train, n_val, a->B, a->T, config->vocab_size, grid->dp, grid->dp_rank, a->seed);
    free(corpus);
    return 1;
}

// After the first step: bytes per group (--comm-report), memory per category and the activation
// slots per pipeline stage (--memory-report).
static void report_first_step(const Args *a, GPT2 *m, int accum) {
    Grid *g = m->grid;
    if (a->comm_report) {
        comm_report(g, 1, "first step");
        if (g->rank == 0 && a->zero >= 2 && accum > 1) {
            printf("note: zero %d reduce-scatters the gradients after every micro-batch (%d per step) so that no full\n"
                   "      gradient outlives its unit's backward: dp traffic grows with accumulation, unlike stages 0-1\n", a->zero, accum);
        }
    }
    if (a->memory_report) {
        mem_report(g->rank, g->world_size, "after the first step");
        if (g->pp > 1) {   // 1F1B: pp - stage, GPipe: all of them
            int *alive = (int *)malloc_check(sizeof(int) * g->world_size);
            MPI_Gather(&m->pipe.nslots, 1, MPI_INT, alive, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (g->rank == 0) {
                printf("pipeline (%s, %d micro-batches): micro-batches of activations alive per stage:", a->pp_schedule, accum);
                for (int s = 0; s < g->pp; s++) { printf(" %d", alive[s * g->tp]); }
                printf("\n");
            }
            free(alive);
        }
    }
}

// The pipeline bubble of each stage: time waiting on the neighbour stages / step time, averaged
// over the timed steps, next to the ideal (pp-1)/(m+pp-1).
static void report_bubble(const Args *a, Grid *g, double bubble_sum, int steps, int accum) {
    double mine = bubble_sum / steps, *all = (double *)malloc_check(sizeof(double) * g->world_size);
    MPI_Gather(&mine, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (g->rank == 0) {
        printf("pipeline bubble (%s, %d micro-batches): measured time waiting on the neighbour stages / step time, ideal (pp-1)/(m+pp-1) = %.3f\n",
               a->pp_schedule, accum, (double)(g->pp - 1) / (accum + g->pp - 1));
        for (int s = 0; s < g->pp; s++) { printf("  stage %d: %.3f\n", s, all[s * g->tp]); }   // (tp 0, dp 0) rank of each stage
    }
    free(all);
}

#ifndef TESTING
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    Args args;
    default_args(&args);
    parse_args(argc, argv, &args, rank);
    if (args.resume && args.output_dir == NULL) { fail_all(rank, "-y needs an output dir (-o)"); }

    // the model, the grid, this rank's part of the model
    GPT2Config config;
    int resume_step;
    float *params = load_model(&args, rank, &config, &resume_step);
    validate_layout(&args, &config, world, rank);
    if (args.output_dir) { check_output_dir(args.output_dir, rank); }
    Grid grid;
    grid_init(&grid, args.tp, args.pp, args.ep);
    grid_print(&grid);
    GPT2 model;
    gpt2_build(&model, &config, params, &grid, args.zero, args.sp);
    free(params);
    int accum = args.total_batch / (args.B * args.T * grid.dp);
    gpt2_alloc_activations(&model, args.B, args.T, args.ce_chunk, accum, pipe_schedule(args.pp_schedule));
    if (rank == 0) {
        printf("model: L %d C %d NH %d V %d (padded %d) maxT %d, %zu parameters, %s\n", config.num_layers, config.channels,
               config.num_heads, config.vocab_size, config.padded_vocab_size, config.max_seq_len, model.num_parameters, PRECISION_NAME);
        printf("batch: B %d T %d, dp %d, grad accumulation %d -> %d tokens per step; zero %d, tp %d%s, pp %d (%s), ce chunk %d\n",
               args.B, args.T, grid.dp, accum, args.total_batch, args.zero, args.tp, args.sp ? " + sp" : "", args.pp,
               args.pp_schedule, args.ce_chunk);
    }

    // data, schedule, optimizer, and the state of a resumed run
    DataLoader train_loader, val_loader;
    Tokenizer tokenizer;
    int have_val = setup_data(&args, &config, &grid, &train_loader, &val_loader, &tokenizer);
    int steps_per_epoch = (int)(train_loader.rounds_per_epoch / accum);
    int max_steps = args.max_steps >= 0 ? args.max_steps : (steps_per_epoch > 0 ? steps_per_epoch : 1);
    LRScheduler sched = {args.scheduler, args.lr, args.final_frac, args.warmup, max_steps};
    OptConfig opt = {0.9f, 0.95f, 1e-8f, args.weight_decay, args.grad_clip, args.seed};
    Rng sample_rng;
    rng_init(&sample_rng, args.seed + 1);
    int start_step = 0;
    if (resume_step >= 0) {
        load_state(&model, args.output_dir, resume_step, &train_loader, &sample_rng, args.total_batch);
        start_step = resume_step;
        if (rank == 0) { printf("resumed from step %d of %s\n", resume_step, args.output_dir); }
    }
    FILE *logf = NULL;
    if (args.output_dir && rank == 0) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/main.log", args.output_dir);
        logf = fopen_check(path, start_step > 0 ? "a" : "w");
    }
    int eot = tokenizer.init_ok ? tokenizer.eot_token : config.vocab_size - 1;

    // the training loop
    double total_ms = 0.0, bubble = 0.0;   // bubble: the fraction of a step spent waiting on other stages
    int timed_steps = 0;
    for (int step = start_step; step < max_steps; step++) {
        if (have_val && args.val_every > 0 && step % args.val_every == 0) {
            float vl = gpt2_validate(&model, &val_loader, args.val_batches);
            if (rank == 0) { printf("val loss %.6f\n", vl); if (logf) { fprintf(logf, "s:%d tel:%.6f\n", step, vl); fflush(logf); } }
        }
        if (args.sample_every > 0 && step > 0 && step % args.sample_every == 0) {
            gpt2_sample(&model, &tokenizer, &sample_rng, args.gen_tokens, eot);
        }
        comm_reset_counters(&grid);
        model.pipe.wait_seconds = 0.0;
        double t0 = wall_seconds();
        float loss = gpt2_forward_backward(&model, &train_loader, accum);
        float lr = lr_at(&sched, step);
        float norm = gpt2_update(&model, &opt, lr, step);
        device_synchronize();
        double ms = (wall_seconds() - t0) * 1e3;
        if (step > start_step) { total_ms += ms; timed_steps++; bubble += model.pipe.wait_seconds / (ms / 1e3); }
        if (rank == 0) {
            printf("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s\n", step + 1, max_steps, loss, norm, lr,
                   ms, args.total_batch / (ms / 1e3));
            if (logf) { fprintf(logf, "s:%d trl:%.6f\n", step, loss); fflush(logf); }
        }
        if (step == start_step) { report_first_step(&args, &model, accum); }
        if (args.checkpoint_every > 0 && (step + 1) % args.checkpoint_every == 0) {
            save_checkpoint(&model, args.output_dir, step + 1, &train_loader, &sample_rng, args.total_batch);
        }
    }

    // the end: validation, a sample, the timings
    if (args.memory_report && max_steps == start_step) { mem_report(rank, world, "set up, no step run (-x 0)"); }
    if (have_val && args.val_every > 0 && max_steps > start_step) {
        float vl = gpt2_validate(&model, &val_loader, args.val_batches);
        if (rank == 0) { printf("val loss %.6f\n", vl); if (logf) { fprintf(logf, "s:%d tel:%.6f\n", max_steps, vl); } }
    }
    if (args.sample_every > 0 && max_steps > start_step) { gpt2_sample(&model, &tokenizer, &sample_rng, args.gen_tokens, eot); }
    if (rank == 0 && timed_steps > 0) { printf("average step: %.1f ms, %.0f tok/s\n", total_ms / timed_steps, args.total_batch / (total_ms / timed_steps / 1e3)); }
    if (args.comm_report && grid.pp > 1 && timed_steps > 0) { report_bubble(&args, &grid, bubble, timed_steps, accum); }
    if (logf) { fclose(logf); }
    tokenizer_free(&tokenizer);
    dataloader_free(&train_loader);
    if (have_val) { dataloader_free(&val_loader); }
    mem_free_all();
    grid_free(&grid);
    MPI_Finalize();
    return 0;
}
#endif
