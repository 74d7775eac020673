/*
GPT-2 training, single source, CPU or CUDA, any mix of data / ZeRO / tensor+sequence / context /
pipeline / expert parallelism. Read top to bottom: the model's tensors and how they are cut into units
-> the model (forward, fused chunked head, backward) -> one training step (the pipeline schedule) ->
checkpoints -> flags -> the memory plan -> main. The other parallel strategies each live in one file:
llmc/zero.h (data parallel + ZeRO 0-3), llmc/tensor_parallel.h (Megatron TP + SP), llmc/context_parallel.h
(ring attention), llmc/pipeline.h (schedules), llmc/moe.h (experts), llmc/fused_ce.h (vocab-parallel
chunked cross-entropy), llmc/comm.h (the process grid and the collectives).
*/
#include <ctype.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/file.h>
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
#include "llmc/context_parallel.h"
#include "llmc/gelu.h"
#include "llmc/residual.h"
#include "llmc/fused_ce.h"
#include "llmc/adamw.h"
#include "llmc/global_norm.h"
#include "llmc/tensor_parallel.h"
#include "llmc/zero.h"
#include "llmc/pipeline.h"
#include "llmc/moe.h"
#include "llmc/dataloader.h"
#include "llmc/tokenizer.h"
#include "llmc/schedulers.h"

// ----------------------------------------------------------------------------
// the model's tensors, in llm.c's file order (then the MoE tensors)

typedef struct {
    int max_seq_len;        // maxT
    int vocab_size;         // V
    int padded_vocab_size;  // Vp >= V, rows V..Vp-1 of wte are padding
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
    int num_experts;        // E: 0 = dense
    int topk;               // k
    int moe_every;          // layer l is MoE when l % moe_every == moe_every - 1 (moe.h)
} GPT2Config;

enum { T_WTE, T_WPE, T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_ATTPROJW, T_ATTPROJB,
       T_LN2W, T_LN2B, T_FCW, T_FCB, T_FCPROJW, T_FCPROJB, T_LNFW, T_LNFB,
       T_ROUTERW, T_EFCW, T_EFCB, T_EFCPROJW, T_EFCPROJB, NUM_TENSORS };
__attribute__((unused)) static const char *tensor_names[NUM_TENSORS] = {"wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                                "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
                                                "routerw", "efcw", "efcb", "efcprojw", "efcprojb"};

static int is_moe_layer(const GPT2Config *c, int l) { return c->num_experts > 0 && l % c->moe_every == c->moe_every - 1; }

static int num_moe_layers(const GPT2Config *c) {
    int n = 0;
    for (int l = 0; l < c->num_layers; l++) { n += is_moe_layer(c, l); }
    return n;
}

// How tensor id is stored: `layers` stacked slices (-1: not per layer) of nblk blocks of (rows, cols),
// cut by tensor parallelism as `split`. The dense MLP tensors hold only the dense layers, the MoE
// tensors only the MoE layers, as nblk = E blocks (one per expert, cut over the ep ranks). Weight decay
// on the 2-D matrices. full_grad: replicated over tp but with a complete gradient on every tp rank
// (computed from all tokens even under SP): never summed over tp.
typedef struct { int layers, nblk; size_t rows, cols; SplitKind split; int decay, experts, full_grad; } TensorSpec;

static TensorSpec tensor_spec(const GPT2Config *c, int id) {
    size_t C = c->channels;
    int L = c->num_layers, Lm = num_moe_layers(c), Ld = L - Lm, E = c->num_experts;
    switch (id) {
        case T_WTE:      return (TensorSpec){-1, 1, (size_t)c->padded_vocab_size, C, SPLIT_ROWS, 1, 0, 0};  // vocab-parallel
        case T_WPE:      return (TensorSpec){-1, 1, (size_t)c->max_seq_len, C, SPLIT_NONE, 1, 0, 0};
        case T_QKVW:     return (TensorSpec){L, 3, C, C, SPLIT_ROWS, 1, 0, 0};       // column-parallel: heads of q, k, v
        case T_QKVB:     return (TensorSpec){L, 3, C, 1, SPLIT_ROWS, 0, 0, 0};
        case T_ATTPROJW: return (TensorSpec){L, 1, C, C, SPLIT_COLS, 1, 0, 0};       // row-parallel
        case T_FCW:      return (TensorSpec){Ld, 1, 4 * C, C, SPLIT_ROWS, 1, 0, 0};  // column-parallel
        case T_FCB:      return (TensorSpec){Ld, 1, 4 * C, 1, SPLIT_ROWS, 0, 0, 0};
        case T_FCPROJW:  return (TensorSpec){Ld, 1, C, 4 * C, SPLIT_COLS, 1, 0, 0};  // row-parallel
        case T_FCPROJB:  return (TensorSpec){Ld, 1, 1, C, SPLIT_NONE, 0, 0, 0};
        case T_LNFW: case T_LNFB: return (TensorSpec){-1, 1, 1, C, SPLIT_NONE, 0, 0, 0};
        case T_ROUTERW:  return (TensorSpec){Lm, 1, (size_t)E, C, SPLIT_NONE, 1, 0, 1};   // replicated everywhere
        case T_EFCW:     return (TensorSpec){Lm, E, 4 * C, C, SPLIT_ROWS, 1, 1, 0};      // per expert, as fcw
        case T_EFCB:     return (TensorSpec){Lm, E, 4 * C, 1, SPLIT_ROWS, 0, 1, 0};
        case T_EFCPROJW: return (TensorSpec){Lm, E, C, 4 * C, SPLIT_COLS, 1, 1, 0};
        case T_EFCPROJB: return (TensorSpec){Lm, E, 1, C, SPLIT_NONE, 0, 1, 1};          // added once, on tp rank 0
        default:         return (TensorSpec){L, 1, 1, C, SPLIT_NONE, 0, 0, 0};           // ln1, ln2, attprojb
    }
}

static size_t tensor_full_size(const GPT2Config *c, int id) {   // all layers
    TensorSpec s = tensor_spec(c, id);
    return (size_t)s.nblk * s.rows * s.cols * (s.layers < 0 ? 1 : (size_t)s.layers);
}

static size_t num_parameters(const GPT2Config *c) {
    size_t n = 0;
    for (int i = 0; i < NUM_TENSORS; i++) { n += tensor_full_size(c, i); }
    return n;
}

// Which slice of a per-layer tensor belongs to layer l: the dense MLP tensors count only the dense
// layers, the MoE tensors only the MoE layers.
static int tensor_layer_slice(const GPT2Config *c, int id, int l) {
    if (id == T_FCW || id == T_FCB || id == T_FCPROJW || id == T_FCPROJB || id >= T_ROUTERW) {
        int moe = id >= T_ROUTERW, n = 0;
        for (int i = 0; i < l; i++) { n += is_moe_layer(c, i) == moe; }
        return n;
    }
    return l;
}

// One unit of zero.h: the embedding (wpe, wte), a layer, the experts of a MoE layer held by this ep
// rank, or the final LayerNorm, reduced over data-parallel group dpg. Inside a unit the tensors whose
// gradients are partial over tp under SP come first (one block to all-reduce under SP).
static void build_unit(const GPT2Config *c, int tp, int ep, int ep_rank, Group *dpg, Unit *U, const int *ids, int n, int layer) {
    memset(U, 0, sizeof(Unit));
    U->dpg = dpg;
    for (int k = 0; k < n; k++) {
        TensorSpec s = tensor_spec(c, ids[k]);
        UnitTensor *t = &U->t[U->ntensors++];
        t->id = ids[k];
        t->layer = layer;
        t->nblk = s.experts ? s.nblk / ep : s.nblk;   // the local experts [blk0, blk0 + nblk)
        t->blk0 = s.experts ? ep_rank * t->nblk : 0;
        t->offset = U->size;
        t->size = (size_t)t->nblk * s.rows * s.cols / (s.split == SPLIT_NONE ? 1 : tp);
        t->decay = s.decay;
        t->replicated = s.split == SPLIT_NONE;
        U->size += t->size;
        if (t->replicated && !s.full_grad) { U->nrep = U->size; }
        if (ids[k] == T_WTE) { U->embedding = 1; }
    }
}

// The units of a pipeline stage, in the order they run: the embedding (first stage), its layers
// (a MoE layer: the layer, then its experts; interleaved: chunk 0's, then chunk 1's, ...), the final
// LayerNorm (last stage). With a pipeline the
// first stage's wte and wpe are two units, and the last stage holds a copy of the wte unit for the
// tied LM head: same layout, so the two copies' gradients sum shard by shard. Returns the number of
// units; sets the index of each kind (-1: none; without a pipeline u_pos == u_embed, one unit [wpe,
// wte]) and, per layer of the stage, its unit and its experts' unit (-1 for a dense layer).
static int build_units(const GPT2Config *c, Grid *g, int V, Unit *units, int *u_embed, int *u_pos, int *u_layer, int *u_experts, int *u_final) {
    static const int embedding[] = {T_WPE, T_WTE}, token[] = {T_WTE}, position[] = {T_WPE};
    static const int layer[] = {T_LN1W, T_LN1B, T_ATTPROJB, T_LN2W, T_LN2B, T_FCPROJB,
                                T_QKVW, T_QKVB, T_ATTPROJW, T_FCW, T_FCB, T_FCPROJW};
    static const int moe_layer[] = {T_LN1W, T_LN1B, T_ATTPROJB, T_LN2W, T_LN2B, T_ROUTERW, T_QKVW, T_QKVB, T_ATTPROJW};
    static const int experts[] = {T_EFCPROJB, T_EFCW, T_EFCB, T_EFCPROJW};
    static const int final_ln[] = {T_LNFW, T_LNFB};
    int tp = g->tp, pp = g->pp, stage = g->pp_rank, ep = g->ep, er = g->ep_rank, n = 0, ll = 0;
    Group *dp = g->grad_group;   // (the dp group; with cp, the cp x dp ranks)
    *u_embed = *u_pos = *u_final = -1;
    if (stage == 0 && pp == 1) { *u_embed = *u_pos = n; build_unit(c, tp, ep, er, dp, &units[n++], embedding, 2, -1); }
    if (stage == 0 && pp > 1) {
        *u_embed = n; build_unit(c, tp, ep, er, dp, &units[n++], token, 1, -1);
        *u_pos = n; build_unit(c, tp, ep, er, dp, &units[n++], position, 1, -1);
    }
    for (int v = 0; v < V; v++) {   // the stage's model chunks (one without interleaving), in order
        int l0, l1;
        chunk_layers(c->num_layers, pp, V, stage, v, &l0, &l1);
        for (int l = l0; l < l1; l++, ll++) {
            u_layer[ll] = n;
            u_experts[ll] = -1;
            if (!is_moe_layer(c, l)) { build_unit(c, tp, ep, er, dp, &units[n++], layer, 12, l); continue; }
            build_unit(c, tp, ep, er, dp, &units[n++], moe_layer, 9, l);
            u_experts[ll] = n;
            build_unit(c, tp, ep, er, &g->edp_group, &units[n++], experts, 4, l);
        }
    }
    if (stage == pp - 1) {
        *u_final = n;
        build_unit(c, tp, ep, er, dp, &units[n++], final_ln, 2, -1);
        if (pp > 1) { *u_embed = n; build_unit(c, tp, ep, er, dp, &units[n++], token, 1, -1); units[n - 1].norm_skip = 1; }
    }
    if (pp > 1 && *u_embed >= 0) { units[*u_embed].tied = 1; }
    return n;
}

// Pointers to each tensor of a unit, given the unit's base (parameters or gradients: same layout).
static void unit_view(const Unit *U, floatX *base, floatX *ptr[NUM_TENSORS]) {
    for (int k = 0; k < U->ntensors; k++) { ptr[U->t[k].id] = base + U->t[k].offset; }
}

// Host, fp32: cut this tp rank's unit (its local experts) out of the full tensors (to_unit = 1), or
// put it back.
static void unit_copy_full(const GPT2Config *c, const Unit *U, float *full[NUM_TENSORS], float *unit,
                           int tp, int tp_rank, int to_unit) {
    for (int k = 0; k < U->ntensors; k++) {
        const UnitTensor *t = &U->t[k];
        TensorSpec s = tensor_spec(c, t->id);
        size_t blk = s.rows * s.cols, per_layer = (size_t)s.nblk * blk;
        float *f = full[t->id] + (t->layer >= 0 ? (size_t)tensor_layer_slice(c, t->id, t->layer) * per_layer : 0) + (size_t)t->blk0 * blk;
        tp_slice_copy(f, unit + t->offset, t->nblk, s.rows, s.cols, s.split, tp, tp_rank, to_unit);
    }
}

// ----------------------------------------------------------------------------
// model files (llm.c format): int32 header[256] then the tensors, fp32 (version 3) or bf16 (5).
// MoE models (ours): version 13 (fp32) or 15 (bf16), header[8..10] = E, k, moe_every, and after
// the 16 dense tensors (whose MLP tensors hold only the dense layers) routerw (Lm, E, C), efcw
// (Lm, E, 4C, C), efcb (Lm, E, 4C), efcprojw (Lm, E, C, 4C), efcprojb (Lm, E, C) for the Lm MoE layers.
// header[255]: the CRC-32 of the body (guard.h; 0 = none, as in llm.c's files, which ignore slots 8..255).

#define MODEL_MAGIC 20240326

// The shapes this program accepts, from a file or a descriptor: positive, C divisible by NH,
// V <= Vp, token ids that fit the uint16 data shards, sizes whose element counts fit in memory, and
// (MoE) 1 <= k <= E <= MOE_MAX_EXPERTS, 1 <= moe_every <= L.
static int config_valid(const GPT2Config *c) {
    int dense_ok = c->max_seq_len > 0 && c->vocab_size > 0 && c->num_layers > 0 && c->num_heads > 0 && c->channels > 0 &&
                   c->padded_vocab_size >= c->vocab_size && c->channels % c->num_heads == 0 && c->vocab_size <= 65536 &&
                   c->padded_vocab_size <= 1 << 20 && c->channels <= 16384 && c->max_seq_len <= 1 << 20 && c->num_layers <= 1024;
    int moe_ok = c->num_experts == 0 ? c->topk == 0 && c->moe_every == 0
                                     : c->num_experts > 0 && c->num_experts <= MOE_MAX_EXPERTS && c->topk >= 1 &&
                                       c->topk <= c->num_experts && c->moe_every >= 1 && c->moe_every <= c->num_layers;
    return dense_ok && moe_ok;
}

static float bf16_to_float(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t float_to_bf16(float f) {   // round to nearest even
    uint32_t u; memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

// Pointers to the tensors inside one array in file order.
static void split_tensors(const GPT2Config *c, float *all, float *ptr[NUM_TENSORS]) {
    for (int i = 0; i < NUM_TENSORS; i++) { ptr[i] = all; all += tensor_full_size(c, i); }
}

// Fails naming the tensor and the index of the first value of a file-order array that is not a finite
// number (what: the file or the state it came from).
static void check_finite(const GPT2Config *c, const float *all, const char *what) {
    size_t P = num_parameters(c);
    for (size_t i = 0; i < P; i++) {
        if (isfinite(all[i])) { continue; }
        size_t off = i;
        int id = 0;
        while (off >= tensor_full_size(c, id)) { off -= tensor_full_size(c, id); id++; }
        fail("%s: %s[%zu] is %g, not a finite number", what, tensor_names[id], off, all[i]);
    }
}

// Reads and checks a model file; returns all parameters as one host fp32 array in file order.
// Opens a model file and checks its header and size; returns it positioned after the header, with the
// config and the bytes per stored parameter (4 or 2).
static FILE *open_model_file(const char *path, GPT2Config *c, int h[256], size_t *es_out) {
    FILE *f = fopen_check(path, "rb");
    if (fread(h, sizeof(int), 256, f) != 256) { fail("model file '%s' is truncated: expected a 1024-byte header", path); }
    if (h[0] != MODEL_MAGIC) { fail("model file '%s' has bad magic %d, expected %d", path, h[0], MODEL_MAGIC); }
    int moe = h[1] == 13 || h[1] == 15;
    if (h[1] != 3 && h[1] != 5 && !moe) {
        fail("model file '%s' has version %d, expected 3 (fp32), 5 (bf16), 13 (MoE fp32) or 15 (MoE bf16)", path, h[1]);
    }
    memset(c, 0, sizeof(*c));
    c->max_seq_len = h[2]; c->vocab_size = h[3]; c->num_layers = h[4]; c->num_heads = h[5]; c->channels = h[6];
    c->padded_vocab_size = h[7];
    if (moe) { c->num_experts = h[8]; c->topk = h[9]; c->moe_every = h[10]; }
    if (moe && c->num_experts < 1) { fail("model file '%s' is a MoE file (version %d) with %d experts", path, h[1], h[8]); }
    if (!config_valid(c)) {
        fail("model file '%s' has inconsistent header values (maxT %d V %d L %d NH %d C %d Vp %d; E %d k %d every %d)", path,
             h[2], h[3], h[4], h[5], h[6], h[7], c->num_experts, c->topk, c->moe_every);
    }
    size_t P = num_parameters(c), es = h[1] % 10 == 3 ? 4 : 2;
    long size = file_size(f);
    if ((size_t)size != 1024 + P * es) {
        fail("model file '%s' is %ld bytes, expected %zu for its header (%zu parameters, version %d)", path, size, 1024 + P * es, P, h[1]);
    }
    *es_out = es;
    return f;
}

static float *read_model_file(const char *path, GPT2Config *c) {
    int h[256];
    size_t es, P;
    FILE *f = open_model_file(path, c, h, &es);
    P = num_parameters(c);
    check_file_crc(f, h, path);
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
    check_finite(c, params, path);
    return params;
}

// "d12" (llm.c: depth L, C = 64 L, NH = L) or "L=4,C=64,NH=4,V=250,maxT=64[,Vp=256][,E=8,k=2[,every=2]]".
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
        if (strlen(s) >= sizeof(buf)) { return -1; }
        snprintf(buf, sizeof(buf), "%s", s);
        static const char *keys[] = {"L", "C", "NH", "V", "Vp", "maxT", "E", "k", "every"};
        int *fields[] = {&c->num_layers, &c->channels, &c->num_heads, &c->vocab_size, &c->padded_vocab_size, &c->max_seq_len,
                         &c->num_experts, &c->topk, &c->moe_every};
        int seen[9] = {0};
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            char *eq = strchr(tok, '=');
            if (!eq) { return -1; }
            *eq = '\0';
            long v = strtol(eq + 1, &end, 10);
            if (*end != '\0' || v <= 0 || v > (1 << 20)) { return -1; }
            int key = -1;
            for (int i = 0; i < 9; i++) { if (!strcmp(tok, keys[i])) { key = i; } }
            if (key < 0 || seen[key]++) { return -1; }   // unknown or repeated
            *fields[key] = (int)v;
        }
        if (c->num_layers == 0 || c->channels == 0 || c->num_heads == 0) { return -1; }
        if (c->num_experts > 0) {
            if (c->topk == 0) { c->topk = 1; }
            if (c->moe_every == 0) { c->moe_every = 1; }
        } else if (c->topk || c->moe_every) {
            return -1;   // k or every without E
        }
    } else {
        return 0;
    }
    if (c->padded_vocab_size == 0) { c->padded_vocab_size = (int)ceil_div(c->vocab_size, 128) * 128; }
    return config_valid(c) ? 1 : -1;
}

// GPT-2 initialisation (as llm.c): N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), LayerNorm
// weights 1, biases 0, padded vocab rows 0; the router N(0, 0.02), the experts as the dense MLP.
// Same numbers on every rank, whatever the layout.
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
        if (i == T_WTE || i == T_WPE || i == T_QKVW || i == T_FCW || i == T_ROUTERW || i == T_EFCW) {
            for (size_t j = 0; j < n; j++) { t[i][j] = rng_normal(&rng, 0, 0.02f); }
        }
        if (i == T_ATTPROJW || i == T_FCPROJW || i == T_EFCPROJW) { for (size_t j = 0; j < n; j++) { t[i][j] = rng_normal(&rng, 0, proj_std); } }
    }
    return all;
}

// Sparse upcycling: the MoE model `moe` from a dense model of the same shape, every expert of a MoE
// layer a copy of that layer's dense MLP; the router N(0, 0.02) from seed (or zeros: router_zero).
// (Also how test_gpt lays out a dense reference's gradients for an E = 1 model.)
static float *upcycle_dense(const GPT2Config *dense, float *dense_all, const GPT2Config *moe, uint64_t seed, int router_zero) {
    float *all = (float *)malloc_check(num_parameters(moe) * sizeof(float));
    float *d[NUM_TENSORS], *t[NUM_TENSORS];
    split_tensors(dense, dense_all, d);
    split_tensors(moe, all, t);
    for (int i = 0; i < NUM_TENSORS; i++) {
        if (i == T_FCW || i == T_FCB || i == T_FCPROJW || i == T_FCPROJB || i >= T_ROUTERW) { continue; }
        memcpy(t[i], d[i], tensor_full_size(moe, i) * sizeof(float));
    }
    static const int mlp[4] = {T_FCW, T_FCB, T_FCPROJW, T_FCPROJB}, experts[4] = {T_EFCW, T_EFCB, T_EFCPROJW, T_EFCPROJB};
    for (int l = 0; l < moe->num_layers; l++) {
        for (int i = 0; i < 4; i++) {
            TensorSpec s = tensor_spec(dense, mlp[i]);
            size_t n = s.rows * s.cols;
            const float *src = d[mlp[i]] + (size_t)l * n;   // the dense model: every layer dense
            float *dst = is_moe_layer(moe, l) ? t[experts[i]] + (size_t)tensor_layer_slice(moe, experts[i], l) * moe->num_experts * n
                                              : t[mlp[i]] + (size_t)tensor_layer_slice(moe, mlp[i], l) * n;
            for (int e = 0; e < (is_moe_layer(moe, l) ? moe->num_experts : 1); e++) { memcpy(dst + (size_t)e * n, src, n * sizeof(float)); }
        }
    }
    Rng rng;
    rng_init(&rng, seed);
    for (size_t j = 0; j < tensor_full_size(moe, T_ROUTERW); j++) { t[T_ROUTERW][j] = router_zero ? 0.0f : rng_normal(&rng, 0, 0.02f); }
    return all;
}

// ----------------------------------------------------------------------------
// the model

// Activation recompute (--recompute): none stores every layer's activations for the backward; mlp drops
// the MLP's fc and GELU outputs (the experts' too), the largest, and recomputes them in the backward from
// the stored ln2 output; full keeps only each layer's input and recomputes the whole layer (its
// tensor-parallel collectives and expert all-to-alls included) before its backward. The results are
// bit-identical: the recomputation runs the same kernels on the same inputs.
typedef enum { RECOMPUTE_NONE, RECOMPUTE_MLP, RECOMPUTE_FULL } Recompute;

typedef struct {        // one MoE layer of one micro-batch, stored for the backward (moe.h names them)
    float *probs;       // (BT, E) router probabilities
    float *lse;         // (BT) router log-sum-exp (the z-loss)
    int *choice;        // (BT, k) the top-k experts
    float *gate;        // (BT, k)
    int *keep, *row;    // (BT, k) kept after capacity; the row in the send layout (-1: dropped)
    float *f;           // (B, E) top-k assignment fractions per sequence (the aux loss)
    floatX *xe;         // (Rr, C) the rows this rank's experts received, grouped by local expert
    floatX *h, *hg;     // (Rr, 4Cl) their fc output, after GELU
    floatX *ys;         // (Rs, C) the expert outputs back, in the send layout
    int *counts;        // host (ep, E): rows each rank of the ep group keeps for each expert
} MoEActs;

typedef struct {
    // stored for the backward, one set per micro-batch in flight through one model chunk of this
    // pipeline stage (the stage's layers without interleaving). Per layer l of the chunk's Lc layers
    // (layer_acts cuts one layer's slice); BTs = tokens of the LayerNorm/residual region (BT/tp with SP,
    // else BT), Cl = C/tp, NHl = NH/tp. "Ls" below: the chunk's layers.
    floatX *resid;      // (Ls+1, BTs, C) the residual stream entering each layer, and the chunk's output
    floatX *ln1;        // (Ls, BTs, C)
    float *ln1_mean, *ln1_rstd;   // (Ls, BTs)
    floatX *qkv;        // (Ls, BT, 3Cl)
    floatX *atty;       // (Ls, BT, Cl)
    float *lse;         // (Ls, B, NHl, T) attention log-sum-exp
    floatX *mid;        // (Ls, BTs, C) residual after attention
    floatX *ln2;        // (Ls, BTs, C)
    float *ln2_mean, *ln2_rstd;
    floatX *fch, *fchg; // (dense layers of the chunk, BT, 4Cl) fc output, after GELU
    MoEActs *moe;       // (Ls) the MoE layers' routing and expert activations (unused for dense layers)
    floatX *lnf;        // (BTs, C) the last stage's last chunk
    float *lnf_mean, *lnf_rstd;
    floatX *dlnf;       // (BTs, C) last stage: the gradient of lnf, written by the fused head
    int *inputs, *targets;   // (BT) on the device: the tokens (first chunk), the targets (last chunk)
} Activations;

// One layer's slice of a micro-batch's activations.
typedef struct {
    floatX *res, *ln1, *mid, *ln2, *out;                 // (BTs, C): input, ln1, after attention, ln2, output
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;   // (BTs)
    floatX *qkv, *atty, *fch, *fchg;                     // (BT, 3Cl), (BT, Cl), (BT, 4Cl), (BT, 4Cl): fch only dense
    float *lse;                                          // (B, NHl, T)
    MoEActs *moe;                                        // MoE layers
} LayerActs;

typedef struct {        // shared by all layers and micro-batches
    floatX *xfull;      // (BT, C) gathered input of a column-parallel layer (SP only)
    floatX *pfull;      // (BT, C) partial sums before a tp reduction, and full-token gradients
    floatX *tokbuf;     // (BTs, C) result of a reduce-scatter (SP)
    floatX *dresid;     // (BTs, C) gradient of the residual stream (pipeline: received from the next stage)
    floatX *dwide;      // (BT, 4Cl) gradient of fc / gelu, then of qkv
    floatX *datty;      // (BT, Cl)
    float *losses;      // (BT)
    double *loss_sum;   // (1) the losses of the step's micro-batches (or the evaluation's batches), summed
    // MoE layers
    floatX *msend;      // (Rs, C) rows in the send layout: x, then the gradients
    floatX *mrecv;      // (Rr, C) rows as the all-to-all delivers them, grouped by source rank
    floatX *mexp;       // (Rr, C) rows grouped by local expert: the outputs, the gradients
    floatX *mdh;        // (Rr, 4Cl) the gradient of the experts' fc output
    float *dgate;       // (BT, k)
    float *dlogits;     // (BT, E)
    float *cprob;       // (BT, k) the probability of each assignment (top-k's values)
    int *choice_all;    // cp > 1: (cp, BT, k) the assignments of every part of the sequences (all-gathered)
    float *cprob_all;   // cp > 1: (cp, BT, k) their probabilities
    float *pmean, *zsum;   // (B, E), (B): aux and z statistics per sequence
    double *moe_sums;      // (2) the step's aux and z sums over this rank's MoE layers and micro-batches (moe_loss_sums)
    int *counts, *offsets; // (E) kept rows per expert; their first rows in the send layout
} Workspace;

typedef struct {        // the MoE layers' dispatch numbers of one step, for the log (sums over this rank's
    double kept, assigned;   // layers): assignments after capacity / made (aux and z: ws.moe_sums, on the device)
} MoEStats;

typedef struct {
    GPT2Config config;
    Grid *grid;
    int sp;
    int B, T, BT, BTs, tok0;     // T: the tokens of a sequence this rank holds (with cp: T/cp); tok0: first local
                                 // token of the LayerNorm/residual region
    SeqPos seqpos;               // where the local tokens are in the sequence (context_parallel.h)
    CPRing cpring;               // cp > 1: ring attention's buffers
    int Cl, NHl, Vl, v0;         // this tp rank's channels, heads, vocab rows [v0, v0 + Vl)
    int first, last, Ls, V;      // pipeline: is this the first / last stage; its layers; its model chunks
    int *layer_id;               // (Ls) the model layer of each of the stage's layers (chunk by chunk)
    int *chunk_l0;               // (V+1) chunk v's layers are the stage's [chunk_l0[v], chunk_l0[v+1])
    int nunits, u_embed, u_pos, u_final;   // this stage's units (zero.h), -1 where it has none
    int *u_layer, *u_experts;    // (Ls) each layer's unit; its experts' unit (-1: a dense layer)
    Unit *units;
    Zero zero;
    Pipeline pipe;               // the schedule, the activation slots, the exchanges (pipeline.h)
    Activations *acts;           // (pipe.nslots) one per (micro-batch, model chunk) alive at once (pipeline.h's slots)
    Workspace ws;
    CEBuffers ce;
    size_t num_parameters;
    // MoE
    MoEOptions moe;              // capacity factor, drop policy, auxiliary loss coefficients
    int El;                      // experts per ep rank
    int moe_cap;                 // assignments an expert keeps per sequence, now (sampling: T, dropless)
    size_t moe_rows_send, moe_rows_recv;   // Rs, Rr: rows of the dispatch buffers (their worst case)
    float moe_aux_scale, moe_z_scale;      // the auxiliary losses' seeds for this step (see moe.h)
    int moe_count_stats;         // add the forward's numbers to moe_stats (training, not validation)
    Recompute recompute;         // what the backward recomputes instead of storing (see layer_acts)
    int recomputing;             // the forward running now is a recomputation (its MoE numbers are not counted again)
    Activations scratch;         // one layer's worth of what is recomputed, shared by the layers and micro-batches
    MoEStats moe_stats;
    int *route_log, route_log_micro;       // test_gpt: (choice, keep, probs) of each (micro-batch < route_log_micro, MoE layer of the stage), when set
    int moe_index;                         // the MoE layer running: its index among the stage's MoE layers
    int micro;                   // the micro-batch running (for --trace)
    int *step_tokens;            // (2, accum, BT) page-locked: a step's inputs and targets, uploaded without a wait
    int updates, skips, skips_in_a_row;   // AdamW updates applied; skipped (a non-finite loss or norm): in all, in a row
    int moe_time_a2a;            // --comm-report: time the all-to-alls (the device synchronised around them)
    double moe_a2a_seconds;      // this step's time in them
} GPT2;

// The model chunk holding the stage's layer l.
static int layer_chunk(const GPT2 *m, int l) {
    int v = 0;
    while (l >= m->chunk_l0[v + 1]) { v++; }
    return v;
}

// The stage's layer l's slice of micro-batch a's activations (a: a slot of l's chunk). What the
// backward recomputes lives in m->scratch (one layer): under mlp the fc and GELU outputs, under full
// everything but the layer's input and output (the residual stream, always stored).
static LayerActs layer_acts(const GPT2 *m, const Activations *a, int l) {
    int full = m->recompute == RECOMPUTE_FULL, mlp = m->recompute != RECOMPUTE_NONE, l0 = m->chunk_l0[layer_chunk(m, l)];
    const Activations *h = full ? &m->scratch : a;   // where the per-layer tensors are
    size_t C = m->config.channels, Cl = m->Cl, lc = l - l0, li = full ? 0 : lc, s = li * m->BTs, f = li * m->BT;
    size_t dense = 0;   // dense layers of the chunk before l (the fc outputs are stored for those only)
    for (int i = l0; i < l && !mlp; i++) { dense += !is_moe_layer(&m->config, m->layer_id[i]); }
    const Activations *fc = mlp ? &m->scratch : a;
    LayerActs x;
    x.res = a->resid + lc * m->BTs * C; x.out = a->resid + (lc + 1) * m->BTs * C;
    x.ln1 = h->ln1 + s * C; x.mid = h->mid + s * C; x.ln2 = h->ln2 + s * C;
    x.ln1_mean = h->ln1_mean + s; x.ln1_rstd = h->ln1_rstd + s; x.ln2_mean = h->ln2_mean + s; x.ln2_rstd = h->ln2_rstd + s;
    x.qkv = h->qkv + f * 3 * Cl; x.atty = h->atty + f * Cl;
    x.fch = fc->fch + dense * m->BT * 4 * Cl; x.fchg = fc->fchg + dense * m->BT * 4 * Cl;
    x.lse = h->lse + f * m->NHl;
    x.moe = &h->moe[li];
    return x;
}

// Builds this rank's part of the model (its pipeline stage, its tp slice, its experts, its ZeRO shard)
// from the full host tensors (file order). Every rank passes the same.
static void gpt2_build(GPT2 *m, const GPT2Config *c, float *all_params, Grid *grid, int V, int zero_stage, int sp, MoEOptions moe) {
    memset(m, 0, sizeof(*m));
    m->config = *c;
    m->grid = grid;
    m->sp = sp;
    m->moe = moe;
    m->El = c->num_experts / grid->ep;
    m->num_parameters = num_parameters(c);
    int tp = grid->tp;
    m->Cl = c->channels / tp; m->NHl = c->num_heads / tp;
    m->Vl = c->padded_vocab_size / tp; m->v0 = grid->tp_rank * m->Vl;
    m->first = grid->pp_rank == 0;
    m->last = grid->pp_rank == grid->pp - 1;
    m->V = V;
    m->chunk_l0 = (int *)malloc_check((V + 1) * sizeof(int));
    m->layer_id = (int *)malloc_check((c->num_layers + 1) * sizeof(int));
    m->Ls = 0;
    for (int v = 0; v < V; v++) {
        int l0, l1;
        chunk_layers(c->num_layers, grid->pp, V, grid->pp_rank, v, &l0, &l1);
        m->chunk_l0[v] = m->Ls;
        for (int l = l0; l < l1; l++) { m->layer_id[m->Ls++] = l; }
    }
    m->chunk_l0[V] = m->Ls;
    m->units = (Unit *)malloc_check((2 * m->Ls + 4) * sizeof(Unit));
    m->u_layer = (int *)malloc_check((m->Ls + 1) * sizeof(int));
    m->u_experts = (int *)malloc_check((m->Ls + 1) * sizeof(int));
    m->nunits = build_units(c, grid, V, m->units, &m->u_embed, &m->u_pos, m->u_layer, m->u_experts, &m->u_final);
    zero_init(&m->zero, grid, zero_stage, sp, m->units, m->nunits);
    if (all_params == NULL) { return; }   // (a plan: the sizes only)
    float *full[NUM_TENSORS];
    split_tensors(c, all_params, full);
    for (int u = 0; u < m->nunits; u++) {
        float *host = (float *)malloc_check(m->units[u].size * sizeof(float));
        unit_copy_full(c, &m->units[u], full, host, tp, grid->tp_rank, 1);
        zero_set_unit_params(&m->zero, u, host);
        free(host);
    }
}

// Rows a MoE layer's dispatch buffers need at most, for micro-batches of B sequences: this rank
// sends each token to at most k experts and at most cap tokens of a sequence to one expert; it
// receives from each of the ep ranks at most min(k, El) rows per token and cap per local expert.
static void moe_buffer_rows(const GPT2 *m, int cap, size_t *Rs, size_t *Rr) {
    size_t B = m->B, T = m->T, k = m->config.topk, E = m->config.num_experts, El = m->El;
    size_t kl = k < El ? k : El;
    *Rs = B * (T * k < E * cap ? T * k : E * cap);
    *Rr = (size_t)m->grid->ep * B * (T * kl < El * cap ? T * kl : El * cap);
}

// Allocates the activations for micro-batches of (B, T), `accum` of them per step, with the pipeline
// schedule's number of (micro-batch, model chunk) pairs alive at once, and a CE chunk of `chunk` tokens
// (0: all). MoE dispatch buffers are sized for the capacity factor, or dropless when the run samples
// (moe_dropless).
static void gpt2_alloc_activations(GPT2 *m, int B, int T, int chunk, int accum, PipeSchedule schedule, int moe_dropless) {
    const GPT2Config *c = &m->config;
    int tp = m->grid->tp, pp = m->grid->pp, Ls = m->Ls, V = m->V;
    size_t C = c->channels, Cl = m->Cl;
    m->B = B; m->T = T; m->BT = B * T;
    m->BTs = m->sp ? m->BT / tp : m->BT;
    m->tok0 = m->sp ? m->grid->tp_rank * m->BTs : 0;
    int cp = m->grid->cp;
    m->seqpos = seq_pos_of_rank(cp, m->grid->cp_rank, T);
    Pipeline *p = &m->pipe;
    p->pp = &m->grid->pp_group; p->tp = &m->grid->tp_group;
    int nslots = pipeline_plan(p, pp == 1 ? SCHEDULE_1F1B : schedule, pp, V, m->grid->pp_rank, accum);   // (without a pipeline GPipe is 1F1B)
    size_t BT = m->BT, BTs = m->BTs, X = floatx_bytes(), F = sizeof(float), I = sizeof(int);
    size_t E = c->num_experts, k = c->topk, Ld = 0, Lm = 0;
    for (int l = 0; l < Ls; l++) { if (is_moe_layer(c, m->layer_id[l])) { Lm++; } else { Ld++; } }
    m->moe_cap = E > 0 ? moe_capacity(c->topk, T * cp, c->num_experts, m->moe.cap1000) : 0;   // per whole sequence
    size_t Rs = 0, Rr = 0;
    if (Lm > 0) { moe_buffer_rows(m, moe_dropless ? T : m->moe_cap, &Rs, &Rr); }
    m->moe_rows_send = Rs; m->moe_rows_recv = Rr;
    // per slot: the residual stream and, unless recomputed, every layer's tensors, for any of the stage's
    // chunks (the slots are shared: each holds the largest chunk, a MoE layer's tensors at each position
    // where some chunk has one); the recomputed ones in m->scratch, one layer (of each kind the stage
    // has) for all layers and slots
    int full = m->recompute == RECOMPUTE_FULL, mlp = m->recompute != RECOMPUTE_NONE, Lmax = 0, Ldmax = 0;
    int *moe_at = (int *)calloc(Ls + 1, sizeof(int));   // some chunk has a MoE layer at this position
    for (int v = 0; v < V; v++) {
        int l0 = m->chunk_l0[v], Lc = m->chunk_l0[v + 1] - l0, Ldc = 0;
        for (int l = 0; l < Lc; l++) { if (is_moe_layer(c, m->layer_id[l0 + l])) { moe_at[l] = 1; } else { Ldc++; } }
        if (Lc > Lmax) { Lmax = Lc; }
        if (Ldc > Ldmax) { Ldmax = Ldc; }
    }
    m->acts = (Activations *)malloc_check(nslots * sizeof(Activations));
    memset(&m->scratch, 0, sizeof(m->scratch));
    for (int i = 0; i <= nslots; i++) {
        Activations *a = i < nslots ? &m->acts[i] : &m->scratch;
        int scratch = i == nslots, Lc = scratch ? Ls : Lmax, Ldc = Ldmax;
        memset(a, 0, sizeof(*a));
        size_t n = scratch ? (full ? 1 : 0) : (full ? 0 : Lc);                 // layers of the per-layer tensors here
        size_t nfc = scratch ? (mlp && Ld > 0 ? 1 : 0) : (mlp ? 0 : Ldc);      // ... of fc and GELU outputs
        if (!scratch) { a->resid = (floatX *)mem_alloc((Lc + 1) * BTs * C * X, MEM_ACTIVATIONS); }
        a->ln1 = (floatX *)mem_alloc(n * BTs * C * X, MEM_ACTIVATIONS);
        a->ln1_mean = (float *)mem_alloc(n * BTs * F, MEM_ACTIVATIONS);
        a->ln1_rstd = (float *)mem_alloc(n * BTs * F, MEM_ACTIVATIONS);
        a->qkv = (floatX *)mem_alloc(n * BT * 3 * Cl * X, MEM_ACTIVATIONS);
        a->atty = (floatX *)mem_alloc(n * BT * Cl * X, MEM_ACTIVATIONS);
        a->lse = (float *)mem_alloc(n * BT * m->NHl * F, MEM_ACTIVATIONS);
        a->mid = (floatX *)mem_alloc(n * BTs * C * X, MEM_ACTIVATIONS);
        a->ln2 = (floatX *)mem_alloc(n * BTs * C * X, MEM_ACTIVATIONS);
        a->ln2_mean = (float *)mem_alloc(n * BTs * F, MEM_ACTIVATIONS);
        a->ln2_rstd = (float *)mem_alloc(n * BTs * F, MEM_ACTIVATIONS);
        a->fch = (floatX *)mem_alloc(nfc * BT * 4 * Cl * X, MEM_ACTIVATIONS);
        a->fchg = (floatX *)mem_alloc(nfc * BT * 4 * Cl * X, MEM_ACTIVATIONS);
        a->moe = (MoEActs *)calloc(Lc + 1, sizeof(MoEActs));
        for (int l = 0; l < Lc; l++) {
            // the MoE layers' routing and expert rows: stored per layer, or (full) one set in the scratch;
            // the experts' fc and GELU outputs: stored, or (mlp, full) one set in the scratch
            if (!(scratch ? is_moe_layer(c, m->layer_id[l]) : moe_at[l]) || (scratch && !mlp)) { continue; }
            int routing = scratch ? full : !full, hidden = scratch ? mlp : !mlp;
            if (scratch && full && a->moe[0].probs) { continue; }   // one set
            if (scratch && !full && a->moe[0].h) { continue; }
            MoEActs *ma = &a->moe[scratch ? 0 : l];
            if (routing) {
                ma->probs = (float *)mem_alloc(BT * E * F, MEM_ACTIVATIONS);
                ma->lse = (float *)mem_alloc(BT * F, MEM_ACTIVATIONS);
                ma->choice = (int *)mem_alloc(BT * k * I, MEM_ACTIVATIONS);
                ma->gate = (float *)mem_alloc(BT * k * F, MEM_ACTIVATIONS);
                ma->keep = (int *)mem_alloc(BT * k * I, MEM_ACTIVATIONS);
                ma->row = (int *)mem_alloc(BT * k * I, MEM_ACTIVATIONS);
                ma->f = (float *)mem_alloc((size_t)B * E * F, MEM_ACTIVATIONS);
                ma->xe = (floatX *)mem_alloc(Rr * C * X, MEM_ACTIVATIONS);
                ma->ys = (floatX *)mem_alloc(Rs * C * X, MEM_ACTIVATIONS);
                ma->counts = (int *)malloc_check((size_t)m->grid->ep * E * I);
            }
            if (hidden) {
                ma->h = (floatX *)mem_alloc(Rr * 4 * Cl * X, MEM_ACTIVATIONS);
                ma->hg = (floatX *)mem_alloc(Rr * 4 * Cl * X, MEM_ACTIVATIONS);
            }
        }
        if (!scratch && m->last) {   // (the last chunk's)
            a->lnf = (floatX *)mem_alloc(BTs * C * X, MEM_ACTIVATIONS);
            a->lnf_mean = (float *)mem_alloc(BTs * F, MEM_ACTIVATIONS);
            a->lnf_rstd = (float *)mem_alloc(BTs * F, MEM_ACTIVATIONS);
            a->dlnf = (floatX *)mem_alloc(BTs * C * X, MEM_ACTIVATIONS);
        }
        if (!scratch && m->first) { a->inputs = (int *)mem_alloc(BT * sizeof(int), MEM_ACTIVATIONS); }   // (chunk 0's)
        if (!scratch && m->last) { a->targets = (int *)mem_alloc(BT * sizeof(int), MEM_ACTIVATIONS); }   // (the last chunk's)
    }
    free(moe_at);
    if (mlp && !full) {   // mlp: the stored MoE layers compute their experts' hidden rows in the scratch's
        for (int i = 0; i < nslots; i++) {
            for (int l = 0; l < Lmax; l++) { m->acts[i].moe[l].h = m->scratch.moe[0].h; m->acts[i].moe[l].hg = m->scratch.moe[0].hg; }
        }
    }
    Workspace *w = &m->ws;
    m->cpring.cp = &m->grid->cp_group;
    for (int i = 0; i < 2 && cp > 1; i++) {   // ring attention: the keys and values held and arriving, their gradients
        m->cpring.kv[i] = (floatX *)mem_alloc(BT * 2 * Cl * X, MEM_COMM);
        m->cpring.dkv[i] = (floatX *)mem_alloc(BT * 2 * Cl * X, MEM_COMM);
    }
    w->xfull = m->sp && tp > 1 ? (floatX *)mem_alloc(BT * C * X, MEM_WORKSPACE) : NULL;
    w->pfull = (floatX *)mem_alloc(BT * C * X, MEM_WORKSPACE);
    w->tokbuf = (floatX *)mem_alloc(BTs * C * X, MEM_WORKSPACE);
    w->dresid = (floatX *)mem_alloc(BTs * C * X, MEM_WORKSPACE);
    w->dwide = (floatX *)mem_alloc(BT * 4 * Cl * X, MEM_WORKSPACE);
    w->datty = (floatX *)mem_alloc(BT * Cl * X, MEM_WORKSPACE);
    if (Lm > 0) {
        w->msend = (floatX *)mem_alloc(Rs * C * X, MEM_COMM);
        w->mrecv = (floatX *)mem_alloc(Rr * C * X, MEM_COMM);
        w->mexp = (floatX *)mem_alloc(Rr * C * X, MEM_WORKSPACE);
        w->mdh = (floatX *)mem_alloc(Rr * 4 * Cl * X, MEM_WORKSPACE);
        w->dgate = (float *)mem_alloc(BT * k * F, MEM_WORKSPACE);
        w->dlogits = (float *)mem_alloc(BT * E * F, MEM_WORKSPACE);
        w->cprob = (float *)mem_alloc(BT * k * F, MEM_WORKSPACE);
        if (cp > 1) {
            w->choice_all = (int *)mem_alloc(cp * BT * k * I, MEM_WORKSPACE);
            w->cprob_all = (float *)mem_alloc(cp * BT * k * F, MEM_WORKSPACE);
        }
        w->pmean = (float *)mem_alloc((size_t)B * E * F, MEM_WORKSPACE);
        w->zsum = (float *)mem_alloc((size_t)B * F, MEM_WORKSPACE);
        w->moe_sums = (double *)mem_alloc(2 * sizeof(double), MEM_WORKSPACE);
        w->counts = (int *)mem_alloc(E * I, MEM_WORKSPACE);
        w->offsets = (int *)mem_alloc(E * I, MEM_WORKSPACE);
    }
    if (m->last) {
        w->losses = (float *)mem_alloc(BT * F, MEM_LOGITS);
        w->loss_sum = (double *)mem_alloc(sizeof(double), MEM_LOGITS);
        m->ce.chunk = chunk > 0 && chunk < m->BT ? chunk : m->BT;
        m->ce.logits = (floatX *)mem_alloc((size_t)m->ce.chunk * m->Vl * X, MEM_LOGITS);
        m->ce.stats = (float *)mem_alloc((size_t)m->ce.chunk * 3 * F, MEM_LOGITS);
        m->ce.stats_all = (float *)mem_alloc((size_t)tp * m->ce.chunk * 3 * F, MEM_LOGITS);
    }
    // the pipeline's view of the slots: each one's input (resid[0]) and output (resid[Lc])
    p->first = m->first; p->last = m->last;
    p->split = !m->sp && tp > 1;
    p->n = BTs * C;
    p->resid = (floatX **)malloc_check(nslots * sizeof(floatX *));
    p->chunk_len = (int *)malloc_check(V * sizeof(int));
    for (int i = 0; i < nslots; i++) { p->resid[i] = m->acts[i].resid; }
    for (int v = 0; v < V; v++) { p->chunk_len[v] = m->chunk_l0[v + 1] - m->chunk_l0[v]; }
    p->grad = w->dresid;
    // interleaved: a gradient can arrive while another chunk's backward (the head's) still uses dresid
    p->grad_recv = V > 1 ? (floatX *)mem_alloc(BTs * C * X, MEM_COMM) : w->dresid;
    p->grad_held = -1;
    p->overlap = m->zero.prefetch && pp > 1;   // (--overlap: set before this call)
    p->grad_send = p->overlap && (!m->first || V > 1) ? (floatX *)mem_alloc(BTs * C * X, MEM_COMM) : NULL;
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

// ----------------------------------------------------------------------------
// a MoE layer's MLP (moe.h has the semantics and the steps)

// Checks the (ep, E) table of kept rows (identical on every rank of the ep group, so every rank
// decides alike): each rank's counts must fit the buffers (a bad count would overrun them).
static void moe_check_counts(const GPT2 *m, const int *counts) {
    int ep = m->grid->ep, E = m->config.num_experts, El = m->El;
    for (int s = 0; s < ep; s++) {
        size_t sent = 0;
        for (int e = 0; e < E; e++) {
            int n = counts[s * E + e];
            if (n < 0 || n > m->B * m->moe_cap) { fail("MoE dispatch: ep rank %d reports %d rows for expert %d (at most %d)", s, n, e, m->B * m->moe_cap); }
            sent += n;
        }
        if (sent > m->moe_rows_send) { fail("MoE dispatch: ep rank %d sends %zu rows, its buffer holds %zu", s, sent, m->moe_rows_send); }
    }
    for (int r = 0; r < ep; r++) {
        size_t got = 0;
        for (int s = 0; s < ep; s++) { for (int le = 0; le < El; le++) { got += counts[s * E + r * El + le]; } }
        if (got > m->moe_rows_recv) { fail("MoE dispatch: ep rank %d receives %zu rows, its buffer holds %zu", r, got, m->moe_rows_recv); }
    }
}

// All-to-all(v) over the ep group, in rows of C: to_experts = 1 sends the rows of the send layout to
// the ranks owning their experts, where they arrive grouped by source rank; 0 sends them back.
static void moe_all_to_all(GPT2 *m, const int *counts, const floatX *send, floatX *recv, int to_experts) {
    Group *g = &m->grid->ep_group;
    int ep = g->size, me = g->rank, E = m->config.num_experts, El = m->El;
    size_t C = m->config.channels;
    size_t *buf = (size_t *)malloc_check(sizeof(size_t) * 4 * ep), *to = buf, *to_off = buf + ep, *from = buf + 2 * ep, *from_off = buf + 3 * ep;
    size_t a = 0, b = 0;
    for (int r = 0; r < ep; r++) {
        to[r] = from[r] = 0;
        for (int le = 0; le < El; le++) { to[r] += counts[me * E + r * El + le]; from[r] += counts[r * E + me * El + le]; }
        to[r] *= C; from[r] *= C;
        to_off[r] = a; from_off[r] = b;
        a += to[r]; b += from[r];
    }
    double t0 = 0.0;
    if (m->moe_time_a2a) { device_synchronize(); t0 = wall_seconds(); }
    if (to_experts) { comm_all_to_allv(g, send, to, to_off, recv, from, from_off, DT_FLOATX); }
    else { comm_all_to_allv(g, send, from, from_off, recv, to, to_off, DT_FLOATX); }
    if (m->moe_time_a2a) { device_synchronize(); m->moe_a2a_seconds += wall_seconds() - t0; }
    free(buf);
}

// The rows received from the ep ranks (grouped by source, then local expert) regrouped by local
// expert (then source), so each expert's rows are contiguous (to_experts = 1), or back (0).
static void moe_regroup(GPT2 *m, const int *counts, const floatX *src, floatX *dst, int to_experts) {
    int ep = m->grid->ep, me = m->grid->ep_rank, E = m->config.num_experts, El = m->El;
    size_t C = m->config.channels, by_source = 0;
    for (int s = 0; s < ep; s++) {
        for (int le = 0; le < El; le++) {
            size_t n = counts[s * E + me * El + le], by_expert = 0;
            for (int l2 = 0; l2 < le; l2++) { for (int s2 = 0; s2 < ep; s2++) { by_expert += counts[s2 * E + me * El + l2]; } }
            for (int s2 = 0; s2 < s; s2++) { by_expert += counts[s2 * E + me * El + le]; }
            size_t from = to_experts ? by_source : by_expert, to = to_experts ? by_expert : by_source;
            if (n) { copy_on_device(dst + to * C, src + from * C, n * C * sizeof(floatX)); }
            by_source += n;
        }
    }
}

// Rows each local expert runs, and where its rows start (grouped by local expert).
static size_t moe_expert_rows(const GPT2 *m, const int *counts, int le, size_t *start) {
    int ep = m->grid->ep, me = m->grid->ep_rank, E = m->config.num_experts, El = m->El;
    size_t n = 0;
    *start = 0;
    for (int l2 = 0; l2 <= le; l2++) {
        for (int s = 0; s < ep; s++) { size_t c = counts[s * E + me * El + l2]; if (l2 < le) { *start += c; } else { n += c; } }
    }
    return n;
}

// x (BT, C): the ln2 output of all tokens (the same on every tp rank) -> out (BT, C), a partial sum
// over tp. pe: the layer's experts (local, tp-sliced), wr the router.
static void moe_forward(GPT2 *m, MoEActs *ma, floatX *pe[NUM_TENSORS], const floatX *wr, const floatX *x, floatX *out) {
    const GPT2Config *c = &m->config;
    int B = m->B, T = m->T, BT = m->BT, C = c->channels, Cl = m->Cl, E = c->num_experts, k = c->topk, El = m->El;
    Workspace *w = &m->ws;
    // route: probabilities, top-k, capacity per sequence, the statistics of the auxiliary losses
    moe_router_forward(ma->probs, ma->lse, x, wr, BT, C, E);
    moe_topk(ma->choice, w->cprob, ma->gate, ma->probs, BT, E, k);
    // capacity and f count per whole sequence: with cp its other parts are on the other cp ranks (a
    // capacity needs their assignments: all-gathered; f is a sum: all-reduced; P and z stay partial sums)
    Group *cpg = &m->grid->cp_group;
    int cp = cpg->size, Tg = T * cp;
    if (cp > 1 && m->moe_cap < Tg) {
        comm_all_gather(cpg, ma->choice, w->choice_all, (size_t)BT * k, DT_INT, NULL);
        comm_all_gather(cpg, w->cprob, w->cprob_all, (size_t)BT * k, DT_FLOAT, NULL);
        moe_capacity_keep(ma->keep, w->choice_all, w->cprob_all, cp, cpg->rank, B, T, k, m->moe_cap, m->moe.policy);
    } else {   // (dropless: every assignment kept, whatever the positions)
        moe_capacity_keep(ma->keep, ma->choice, w->cprob, 1, 0, B, T, k, m->moe_cap, m->moe.policy);
    }
    moe_sequence_stats(ma->f, w->pmean, w->zsum, ma->choice, ma->probs, ma->lse, B, T, E, k, Tg);
    comm_all_reduce(cpg, ma->f, (size_t)B * E, DT_FLOAT, NULL);
    // the dispatch plan: rows per expert, exchanged over the ep group and checked; each row's place
    int mine[MOE_MAX_EXPERTS], offsets[MOE_MAX_EXPERTS];
    moe_count(w->counts, ma->choice, ma->keep, BT, E, k);
    copy_to_host(mine, w->counts, E * sizeof(int));
    comm_all_gather_host_ints(&m->grid->ep_group, mine, E, ma->counts);
    moe_check_counts(m, ma->counts);
    for (int e = 0, o = 0; e < E; e++) { offsets[e] = o; o += mine[e]; }
    copy_to_device(w->offsets, offsets, E * sizeof(int));
    moe_rows(ma->row, ma->choice, ma->keep, w->offsets, BT, E, k);
    // dispatch, the local experts, back, combine
    moe_permute(w->msend, x, ma->row, BT, k, C);
    moe_all_to_all(m, ma->counts, w->msend, w->mrecv, 1);
    moe_regroup(m, ma->counts, w->mrecv, ma->xe, 1);
    for (int le = 0; le < El; le++) {
        size_t r0, n = moe_expert_rows(m, ma->counts, le, &r0);
        if (n == 0) { continue; }
        const floatX *b2 = m->grid->tp_rank == 0 ? pe[T_EFCPROJB] + (size_t)le * C : NULL;   // added once over tp
        matmul_forward_gelu(ma->hg + r0 * 4 * Cl, ma->h + r0 * 4 * Cl, ma->xe + r0 * C, pe[T_EFCW] + (size_t)le * 4 * Cl * C,
                            pe[T_EFCB] + (size_t)le * 4 * Cl, (int)n, C, 4 * Cl);
        matmul_forward(w->mexp + r0 * C, ma->hg + r0 * 4 * Cl, pe[T_EFCPROJW] + (size_t)le * C * 4 * Cl, b2, (int)n, 4 * Cl, C);
    }
    moe_regroup(m, ma->counts, w->mexp, w->mrecv, 0);
    moe_all_to_all(m, ma->counts, w->mrecv, ma->ys, 0);
    moe_combine(out, ma->ys, ma->gate, ma->row, BT, k, C);
    if (m->route_log && m->micro < m->route_log_micro && !m->recomputing) {   // test_gpt: this layer's routing
        int nmoe = 0;
        for (int l = 0; l < m->Ls; l++) { nmoe += is_moe_layer(&m->config, m->layer_id[l]); }
        int *log = m->route_log + ((size_t)m->micro * nmoe + m->moe_index) * BT * (2 * k + E);
        copy_to_host(log, ma->choice, (size_t)BT * k * sizeof(int));
        copy_to_host(log + (size_t)BT * k, ma->keep, (size_t)BT * k * sizeof(int));
        copy_to_host(log + (size_t)BT * 2 * k, ma->probs, (size_t)BT * E * sizeof(float));   // (bits of floats)
    }
    if (m->moe_count_stats && !m->recomputing) {   // aux and z of this micro-batch's sequences (on the device), the kept fraction
        moe_loss_sums(w->moe_sums, ma->f, w->pmean, w->zsum, B, E);
        for (int e = 0; e < E; e++) { m->moe_stats.kept += mine[e]; }
        m->moe_stats.assigned += (double)BT * k;
    }
}

// The backward of moe_forward. dy (BT, C): the gradient of out on every tp rank (all tokens) -> dx (BT, C),
// the gradient of x, a partial sum over tp (written); ge: the experts' gradients, dwr the router's (+=).
static void moe_backward(GPT2 *m, MoEActs *ma, floatX *pe[NUM_TENSORS], floatX *ge[NUM_TENSORS], const floatX *wr, floatX *dwr,
                         const floatX *x, const floatX *dy, floatX *dx) {
    const GPT2Config *c = &m->config;
    int T = m->T, BT = m->BT, C = c->channels, Cl = m->Cl, E = c->num_experts, k = c->topk, El = m->El;
    Workspace *w = &m->ws;
    // combine: the gradient of each kept row (send layout), and of the gates (all-reduced over tp: the
    // expert outputs are partial sums over tp)
    moe_combine_backward(w->msend, w->dgate, dy, ma->ys, ma->gate, ma->row, BT, k, C);
    comm_all_reduce(&m->grid->tp_group, w->dgate, (size_t)BT * k, DT_FLOAT, NULL);
    // to the experts, their backward, back
    moe_all_to_all(m, ma->counts, w->msend, w->mrecv, 1);
    moe_regroup(m, ma->counts, w->mrecv, w->mexp, 1);
    for (int le = 0; le < El; le++) {
        size_t r0, n = moe_expert_rows(m, ma->counts, le, &r0);
        if (n == 0) { continue; }
        floatX *dye = w->mexp + r0 * C, *dh = w->mdh + r0 * 4 * Cl;
        if (m->recompute == RECOMPUTE_MLP) {   // the rows' fc and GELU outputs again, from their stored input
            matmul_forward_gelu(ma->hg + r0 * 4 * Cl, ma->h + r0 * 4 * Cl, ma->xe + r0 * C, pe[T_EFCW] + (size_t)le * 4 * Cl * C,
                                pe[T_EFCB] + (size_t)le * 4 * Cl, (int)n, C, 4 * Cl);
        }
        matmul_backward_dgelu(dh, ge[T_EFCPROJW] + (size_t)le * C * 4 * Cl, dye, ma->hg + r0 * 4 * Cl,
                              pe[T_EFCPROJW] + (size_t)le * C * 4 * Cl, ma->h + r0 * 4 * Cl, (int)n, 4 * Cl, C);
        bias_backward(ge[T_EFCPROJB] + (size_t)le * C, dye, (int)n, C);   // complete on every tp rank
        matmul_backward(dye, ge[T_EFCW] + (size_t)le * 4 * Cl * C, ge[T_EFCB] + (size_t)le * 4 * Cl, dh, ma->xe + r0 * C,
                        pe[T_EFCW] + (size_t)le * 4 * Cl * C, (int)n, C, 4 * Cl);   // dye := the rows' dx
    }
    moe_regroup(m, ma->counts, w->mexp, w->mrecv, 0);
    moe_all_to_all(m, ma->counts, w->mrecv, w->msend, 0);
    moe_unpermute(dx, w->msend, ma->row, BT, k, C);
    // the router: identical on every tp rank (complete gates' gradient); its input gradient added once
    moe_router_backward(w->dlogits, w->dgate, ma->gate, ma->choice, ma->probs, ma->lse, ma->f, T, BT, E, k,
                        m->moe_aux_scale, m->moe_z_scale);
    moe_router_dweight(dwr, w->dlogits, x, BT, C, E);
    if (m->grid->tp_rank == 0) { moe_router_dinput(dx, w->dlogits, wr, BT, C, E); }
}

// One layer: y.res (BTs, C) -> y.out, its activations into y. Tensor-parallel communication by the two
// operations of tensor_parallel.h; ZeRO-3 gathers the layer's parameters (and its experts') as they come.
static void layer_forward(GPT2 *m, LayerActs y, int l) {
    int C = m->config.channels, B = m->B, T = m->T, BT = m->BT, BTs = m->BTs;
    int Cl = m->Cl, NHl = m->NHl, sp = m->sp, ue = m->u_experts[l];
    Group *tp = &m->grid->tp_group;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS], *x;
    int v = layer_chunk(m, l), u = m->u_layer[l];   // what runs next: the chunk's next layer, or the final LayerNorm
    int next = l + 1 < m->chunk_l0[v + 1] ? m->u_layer[l + 1] : (m->last && v == m->V - 1 ? m->u_final : -1);
    unit_view(&m->units[u], zero_unit_params(&m->zero, u), p);
    if (!m->recomputing) { zero_prefetch_params(&m->zero, ue >= 0 ? ue : next, u); }   // ZeRO-3: the next unit, while this one computes
    // attention block: ln1 -> all tokens -> qkv (column-parallel, local heads) -> attention
    //                  -> attproj (row-parallel) -> sum partials
    layernorm_forward(y.ln1, y.ln1_mean, y.ln1_rstd, y.res, p[T_LN1W], p[T_LN1B], BTs, C);
    x = tp_all_tokens(tp, sp, y.ln1, w->xfull, BTs, C);
    matmul_forward(y.qkv, x, p[T_QKVW], p[T_QKVB], BT, C, 3 * Cl);
    if (m->grid->cp > 1) { cp_attention_forward(&m->cpring, y.atty, y.lse, y.qkv, B, T, Cl, NHl); }   // ring attention
    else { attention_forward(y.atty, y.lse, y.qkv, B, T, Cl, NHl); }
    matmul_forward(w->pfull, y.atty, p[T_ATTPROJW], NULL, BT, Cl, C);
    x = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
    // MLP block: (+ bias + residual, fused with) ln2 -> all tokens -> fc (column-parallel, fused
    // with gelu) -> fcproj (row-parallel) -> sum partials; a MoE layer: the experts instead
    residual_layernorm_forward(y.mid, y.ln2, y.ln2_mean, y.ln2_rstd, y.res, x, p[T_ATTPROJB], p[T_LN2W], p[T_LN2B], BTs, C);
    x = tp_all_tokens(tp, sp, y.ln2, w->xfull, BTs, C);
    if (ue >= 0) {
        floatX *pe[NUM_TENSORS];
        unit_view(&m->units[ue], zero_unit_params(&m->zero, ue), pe);
        m->moe_index = 0;
        for (int i = 0; i < l; i++) { m->moe_index += m->u_experts[i] >= 0; }
        moe_forward(m, y.moe, pe, p[T_ROUTERW], x, w->pfull);
        if (!m->recomputing) { zero_prefetch_params(&m->zero, next, ue); }   // (over the layer's own unit: done with it)
    } else {
        matmul_forward_gelu(y.fchg, y.fch, x, p[T_FCW], p[T_FCB], BT, C, 4 * Cl);
        matmul_forward(w->pfull, y.fchg, p[T_FCPROJW], NULL, BT, 4 * Cl, C);
    }
    x = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
    residual_bias_forward(y.out, y.mid, x, ue >= 0 ? NULL : p[T_FCPROJB], BTs, C);
}

// Model chunk v of the stage (the stage's layers without interleaving), a: a slot of that chunk.
// The input (B, T) tokens on the first stage's chunk 0, a->resid[0] received from the previous stage
// otherwise -> the chunk's output a->resid[Lc] (the last stage's last chunk: the final LayerNorm a->lnf).
static void gpt2_forward(GPT2 *m, int v, Activations *a) {
    int C = m->config.channels, T = m->T, BT = m->BT, BTs = m->BTs, sp = m->sp;
    int l0 = m->chunk_l0[v], l1 = m->chunk_l0[v + 1];
    Group *tp = &m->grid->tp_group;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS], *x;

    if (m->first && v == 0) {
        // embedding: vocab-parallel token lookup of all BT tokens, summed over tp (SP: reduce-scattered
        // along the tokens), then the position embedding of the local tokens
        trace_begin();
        unit_view(&m->units[m->u_embed], zero_unit_params(&m->zero, m->u_embed), p);
        unit_view(&m->units[m->u_pos], zero_unit_params(&m->zero, m->u_pos), p);   // (the same unit without a pipeline)
        embedding_forward(w->pfull, a->inputs, p[T_WTE], m->v0, m->v0 + m->Vl, BT, C);
        x = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
        copy_on_device(a->resid, x, (size_t)BTs * C * sizeof(floatX));
        position_forward(a->resid, p[T_WPE], m->seqpos, m->tok0, BTs, T, C);
        trace_end("embedding", "forward", "\"micro\":%d", m->micro);
    }
    for (int l = l0; l < l1; l++) {
        trace_begin();
        layer_forward(m, layer_acts(m, a, l), l);
        trace_end(m->u_experts[l] >= 0 ? "MoE layer" : "layer", "forward", "\"layer\":%d,\"micro\":%d", m->layer_id[l], m->micro);
    }
    if (m->last && v == m->V - 1) {
        unit_view(&m->units[m->u_final], zero_unit_params(&m->zero, m->u_final), p);
        layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, a->resid + (size_t)(l1 - l0) * BTs * C, p[T_LNFW], p[T_LNFB], BTs, C);
    }
}

// Last stage: the tied LM head and the loss, fused and chunked (fused_ce.h). The sum of the losses of
// this rank's B*T tokens is added to ws.loss_sum on the device (read once, by gpt2_read_loss). With
// backward: also dwte and the gradient of lnf (a->dlnf).
static void gpt2_head(GPT2 *m, Activations *a, float dloss, int backward, int last_micro) {
    const GPT2Config *c = &m->config;
    int C = c->channels, BT = m->BT;
    Group *tp = &m->grid->tp_group;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS], *g[NUM_TENSORS];
    trace_begin();
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
    loss_accumulate(w->loss_sum, w->losses, BT);
    trace_end("head + loss", backward ? "forward+backward" : "forward", "\"micro\":%d", m->micro);
}

// The loss sum starts at 0 (a step's or an evaluation's first batch).
static void gpt2_clear_loss(GPT2 *m) {
    if (m->last) { zero_on_device(m->ws.loss_sum, sizeof(double)); }
}

// The mean loss of `batches` batches of this rank's B*T tokens whose sums gpt2_head accumulated on the
// last stage since gpt2_clear_loss (a wait on the device), on every rank: broadcast from the last stage,
// summed over the ranks sharing the step's tokens. (A training step reads its loss with its norm, in
// gpt2_update; this is for evaluations and tests.)
static float gpt2_read_loss(GPT2 *m, int batches) {
    double sum = 0.0;
    if (m->last) { copy_to_host(&sum, m->ws.loss_sum, sizeof(double)); }
    double loss = sum / ((double)m->BT * batches);
    if (m->grid->pp > 1) { WATCHED("broadcast of the loss", "pp", MPI_Bcast(&loss, 1, MPI_DOUBLE, m->grid->pp - 1, m->grid->pp_group.mpi)); }
    comm_sum_host(m->grid->grad_group, &loss, 1);
    return (float)(loss / (m->grid->dp * m->grid->cp));
}

// One layer's backward: w->dresid, the gradient of y.out, becomes the gradient of y.res; the layer's
// parameter gradients (and its experts') go to zero.h as the layer is done.
static void layer_backward(GPT2 *m, LayerActs y, int l, int last_micro) {
    int C = m->config.channels, B = m->B, T = m->T, BT = m->BT, BTs = m->BTs;
    int Cl = m->Cl, NHl = m->NHl, sp = m->sp, u = m->u_layer[l], ue = m->u_experts[l];
    Group *tp = &m->grid->tp_group;
    Zero *z = &m->zero;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS], *g[NUM_TENSORS], *dy, *x;
    int prev = l > m->chunk_l0[layer_chunk(m, l)] ? m->u_layer[l - 1] : -1;   // the chunk's layer below
    unit_view(&m->units[u], zero_unit_params(z, u), p);
    if (ue < 0) { zero_prefetch_params(z, prev, u); }   // ZeRO-3: the layer below, while this one computes
    unit_view(&m->units[u], zero_begin_unit_backward(z, u), g);
    // MLP block (w->dresid is the gradient of the layer's output)
    x = tp_all_tokens(tp, sp, y.ln2, w->xfull, BTs, C);   // SP: gathered again, not stored
    if (ue >= 0) {   // the experts, then the router
        floatX *pe[NUM_TENSORS], *ge[NUM_TENSORS];
        unit_view(&m->units[ue], zero_unit_params(z, ue), pe);
        unit_view(&m->units[ue], zero_begin_unit_backward(z, ue), ge);
        dy = tp_all_tokens(tp, sp, w->dresid, w->pfull, BTs, C);
        moe_backward(m, y.moe, pe, ge, p[T_ROUTERW], g[T_ROUTERW], x, dy, w->pfull);
        zero_end_unit_backward(z, ue, last_micro);
        zero_prefetch_params(z, prev, u);   // (over the experts: done with them)
    } else {
        if (m->recompute == RECOMPUTE_MLP) { matmul_forward_gelu(y.fchg, y.fch, x, p[T_FCW], p[T_FCB], BT, C, 4 * Cl); }
        bias_backward(g[T_FCPROJB], w->dresid, BTs, C);
        dy = tp_all_tokens(tp, sp, w->dresid, w->pfull, BTs, C);
        matmul_backward_dgelu(w->dwide, g[T_FCPROJW], dy, y.fchg, p[T_FCPROJW], y.fch, BT, 4 * Cl, C);   // d(fc output)
        matmul_backward(w->pfull, g[T_FCW], g[T_FCB], w->dwide, x, p[T_FCW], BT, C, 4 * Cl);
    }
    floatX *dln = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
    layernorm_backward(w->dresid, g[T_LN2W], g[T_LN2B], dln, y.mid, p[T_LN2W], y.ln2_mean, y.ln2_rstd, BTs, C);
    // attention block (w->dresid is now the gradient of mid)
    bias_backward(g[T_ATTPROJB], w->dresid, BTs, C);
    dy = tp_all_tokens(tp, sp, w->dresid, w->pfull, BTs, C);
    matmul_backward(w->datty, g[T_ATTPROJW], NULL, dy, y.atty, p[T_ATTPROJW], BT, Cl, C);
    if (m->grid->cp > 1) { cp_attention_backward(&m->cpring, w->dwide, w->datty, y.qkv, y.atty, y.lse, B, T, Cl, NHl); }
    else { attention_backward(w->dwide, w->datty, y.qkv, y.atty, y.lse, B, T, Cl, NHl); }
    x = tp_all_tokens(tp, sp, y.ln1, w->xfull, BTs, C);
    matmul_backward(w->pfull, g[T_QKVW], g[T_QKVB], w->dwide, x, p[T_QKVW], BT, C, 3 * Cl);
    dln = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
    layernorm_backward(w->dresid, g[T_LN1W], g[T_LN1B], dln, y.res, p[T_LN1W], y.ln1_mean, y.ln1_rstd, BTs, C);
    zero_end_unit_backward(z, u, last_micro);
}

// The backward of one micro-batch through model chunk v: from a->dlnf on the last stage's last chunk,
// from the gradient of the chunk's output (in ws.dresid) otherwise; leaves the gradient of the chunk's
// input in ws.dresid. Each unit's gradient goes to zero.h as soon as the unit is done, so its
// data-parallel reduction overlaps the backward of the layers below.
static void gpt2_backward(GPT2 *m, int v, Activations *a, int last_micro) {
    int C = m->config.channels, T = m->T, BT = m->BT, BTs = m->BTs, sp = m->sp;
    int l0 = m->chunk_l0[v], l1 = m->chunk_l0[v + 1];
    Group *tp = &m->grid->tp_group;
    Zero *z = &m->zero;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS], *g[NUM_TENSORS];

    if (m->last && v == m->V - 1) {
        unit_view(&m->units[m->u_final], zero_unit_params(z, m->u_final), p);
        if (l1 > l0) { zero_prefetch_params(z, m->u_layer[l1 - 1], m->u_final); }
        unit_view(&m->units[m->u_final], zero_begin_unit_backward(z, m->u_final), g);
        zero_on_device(w->dresid, (size_t)BTs * C * sizeof(floatX));
        layernorm_backward(w->dresid, g[T_LNFW], g[T_LNFB], a->dlnf, a->resid + (size_t)(l1 - l0) * BTs * C, p[T_LNFW],
                           a->lnf_mean, a->lnf_rstd, BTs, C);
        zero_end_unit_backward(z, m->u_final, last_micro);
    }
    for (int l = l1 - 1; l >= l0; l--) {
        LayerActs y = layer_acts(m, a, l);
        if (m->recompute == RECOMPUTE_FULL) {   // the layer's activations again, from its stored input
            trace_begin();
            m->recomputing = 1;
            layer_forward(m, y, l);
            m->recomputing = 0;
            trace_end("recompute", "forward", "\"layer\":%d,\"micro\":%d", m->layer_id[l], m->micro);
        }
        trace_begin();
        layer_backward(m, y, l, last_micro);
        trace_end(m->u_experts[l] >= 0 ? "MoE layer" : "layer", "backward", "\"layer\":%d,\"micro\":%d", m->layer_id[l], m->micro);
    }
    if (m->first && v == 0) {
        trace_begin();
        // the embedding: the position embedding of the local tokens, the token embedding of all of them
        int pipeline = m->u_pos != m->u_embed;
        unit_view(&m->units[m->u_embed], wte_grad_open(m, WTE_EMBEDDING), g);
        if (pipeline) { unit_view(&m->units[m->u_pos], zero_begin_unit_backward(z, m->u_pos), g); }
        position_backward(g[T_WPE], w->dresid, m->seqpos, m->tok0, BTs, T, C);
        floatX *dy = tp_all_tokens(tp, sp, w->dresid, w->pfull, BTs, C);
        embedding_backward(g[T_WTE], dy, a->inputs, m->v0, m->v0 + m->Vl, BT, C);
        if (pipeline) { zero_end_unit_backward(z, m->u_pos, last_micro); }
        wte_grad_close(m, WTE_EMBEDDING, last_micro);
        trace_end("embedding", "backward", "\"micro\":%d", m->micro);
    }
}

// ----------------------------------------------------------------------------
// one training step: the micro-batches through the pipeline stages (pipeline.h), then AdamW

typedef struct { float beta1, beta2, eps, weight_decay, grad_clip; unsigned int seed; } OptConfig;

// This rank's tokens of a (B, T*cp) batch: each sequence's tokens at the local positions (seq_pos).
static void local_tokens(const GPT2 *m, int *local, const int *batch) {
    int T = m->T, Tg = T * m->grid->cp;
    for (int b = 0; b < m->B; b++) {
        for (int t = 0; t < T; t++) { local[b * T + t] = batch[(size_t)b * Tg + seq_pos(m->seqpos, t)]; }
    }
}

// Micro-batch i's activations in model chunk v.
static Activations *chunk_acts(GPT2 *m, int v, int i) { return &m->acts[m->pipe.slot_of[v * m->pipe.m + i]]; }

// Micro-batch i's tokens go to chunk 0 (the embedding), its targets to the last chunk (the loss), each
// when that chunk's forward starts (a slot of the last chunk may still hold an earlier micro-batch
// whose forward is yet to come). NULL: not now.
// The copies are queued (copy_to_device_async): the host arrays must hold until the device has run them.
static void gpt2_upload_batch(GPT2 *m, int i, const int *inputs, const int *targets) {
    if (inputs && m->first) { copy_to_device_async(chunk_acts(m, 0, i)->inputs, inputs, sizeof(int) * m->BT); }
    if (targets && m->last) { copy_to_device_async(chunk_acts(m, m->V - 1, i)->targets, targets, sizeof(int) * m->BT); }
}

// What the schedule runs for one training step on this stage.
typedef struct {
    GPT2 *m;
    int accum;
    int *inputs, *targets;   // (accum, BT) the step's batches, read by every stage in the same order
    float dloss;       // d(loss)/d(each token's loss): 1 / (tokens in the global batch)
} TrainStep;

// Forward of micro-batch i through chunk v (its input received); the last chunk of the last stage
// runs the fused head too, forward and backward at once.
static void train_forward(void *ctx, int v, int i) {
    TrainStep *s = (TrainStep *)ctx;
    GPT2 *m = s->m;
    Activations *a = chunk_acts(m, v, i);
    m->micro = i;
    gpt2_upload_batch(m, i, v == 0 ? s->inputs + (size_t)i * m->BT : NULL, v == m->V - 1 ? s->targets + (size_t)i * m->BT : NULL);
    gpt2_forward(m, v, a);
    if (m->last && v == m->V - 1) { gpt2_head(m, a, s->dloss, 1, i == s->accum - 1); }
}

static void train_backward(void *ctx, int v, int i) {
    TrainStep *s = (TrainStep *)ctx;
    s->m->micro = i;
    gpt2_backward(s->m, v, chunk_acts(s->m, v, i), i == s->accum - 1);
}

// Forward and backward of `accum` micro-batches (the number the activations were allocated for); the
// gradients end up reduced as the ZeRO stage wants them, the losses summed on the device. Nothing waits
// for the device here: gpt2_update reads the loss with the norm (or gpt2_read_loss, for a test).
static void gpt2_forward_backward(GPT2 *m, DataLoader *dl, int accum) {
    zero_clear_grads(&m->zero);
    gpt2_clear_loss(m);
    // the MoE auxiliary losses' seeds (moe.h): aux is a mean over the global batch's sequences, z over its tokens
    double sequences = (double)m->B * accum * m->grid->dp;
    double Tg = (double)m->T * m->grid->cp;   // a whole sequence's tokens
    m->moe_aux_scale = (float)(m->moe.aux_coeff * m->config.num_experts / (Tg * sequences));
    m->moe_z_scale = (float)(m->moe.z_coeff / (Tg * sequences));
    memset(&m->moe_stats, 0, sizeof(m->moe_stats));
    if (m->ws.moe_sums) { zero_on_device(m->ws.moe_sums, 2 * sizeof(double)); }
    m->moe_count_stats = 1;
    int ranks = m->grid->dp * m->grid->cp;   // the ranks that share a step's tokens (cp: each sequence too)
    if (accum != m->pipe.steps.n_total / m->V) { fprintf(stderr, "error: %d micro-batches, the schedule was made for %d\n", accum, m->pipe.steps.n_total / m->V); exit(1); }
    if (m->step_tokens == NULL) { m->step_tokens = (int *)host_alloc_pinned(sizeof(int) * 2 * accum * m->BT); }   // once: accum is the schedule's
    device_synchronize();   // the previous step's uploads have read the buffer (the step ended with a wait: free here)
    TrainStep s = {m, accum, m->step_tokens, m->step_tokens + (size_t)accum * m->BT, 1.0f / ((float)m->BT * accum * ranks)};
    for (int i = 0; i < accum; i++) {
        dataloader_next_batch(dl);
        local_tokens(m, s.inputs + (size_t)i * m->BT, dl->inputs);
        local_tokens(m, s.targets + (size_t)i * m->BT, dl->targets);
    }
    pipeline_run(&m->pipe, (StageWork){&s, train_forward, train_backward});
    m->moe_count_stats = 0;
    zero_finish_grads(&m->zero);
}

// The MoE numbers of the last step, on every rank: aux and z as the loss defines them (means over the
// global batch of the sums over the MoE layers of every stage; tp ranks hold copies: tp rank 0 counts)
// and the fraction of the top-k assignments dropped by the capacity.
static void gpt2_moe_stats(GPT2 *m, int accum, double *aux, double *z, double *dropped) {
    MoEStats *st = &m->moe_stats;
    double v[4] = {0.0, 0.0, 0.0, 0.0};
    if (m->grid->tp_rank == 0) {
        if (m->ws.moe_sums) { copy_to_host(v, m->ws.moe_sums, 2 * sizeof(double)); }
        v[2] = st->kept; v[3] = st->assigned;
    }
    comm_sum_host(&m->grid->world, v, 4);
    double sequences = (double)m->B * accum * m->grid->dp;
    *aux = v[0] / sequences;
    *z = v[1] / (sequences * m->T * m->grid->cp);
    *dropped = v[3] > 0 ? 1.0 - v[2] / v[3] : 0.0;
}

typedef struct { float loss, norm; } StepResult;   // the step's mean loss (global batch), its gradient norm before clipping

// Clips by the global gradient norm and runs AdamW (step is 0-based), all on the device: the norm's
// partial sums and this rank's loss sum (the last stage's tp rank 0: the other tp ranks hold copies)
// all-reduced over the world in one call, the clip scale made from them, AdamW scaled by it. A
// non-finite loss or gradient norm (the same on every rank: both are global) makes the scale 0 and
// skips the update: the parameters and the AdamW state stay as they were, and AdamW's step count t
// counts only the updates applied. Then the step's one wait: the host reads the loss and the norm
// (m->skips_in_a_row says whether this update was skipped).
static StepResult gpt2_update(GPT2 *m, const OptConfig *o, float lr, int step) {
    Zero *z = &m->zero;
    Grid *g = m->grid;
    trace_begin();
    int nparts = zero_grad_norm_parts(z);
    step_stats_gather(z->stats, z->norm_parts, nparts, m->last && g->tp_rank == 0 ? m->ws.loss_sum : NULL);
    comm_all_reduce(&g->world, z->stats, 2, DT_DOUBLE, NULL);   // loss_sum, norm_sq
    double tokens = (double)m->BT * (m->pipe.steps.n_total / m->V) * g->dp * g->cp;   // the global batch's
    step_stats_clip(z->stats, tokens, o->grad_clip);
    zero_optimizer_step(z, lr, o->beta1, o->beta2, o->eps, o->weight_decay, &z->stats->scale, m->updates + 1, o->seed + 7919u * step);
    StepStats st;
    copy_to_host(&st, z->stats, sizeof(st));
    if (st.scale == 0.0f) {
        m->skips++;
        m->skips_in_a_row++;
    } else {
        m->updates++;
        m->skips_in_a_row = 0;
    }
    trace_end("norm + AdamW", "optimizer", "\"step\":%d", step);
    return (StepResult){st.loss, st.norm};
}

typedef struct { GPT2 *m; const int *inputs, *targets; } ForwardOnly;   // this rank's tokens and targets

static void forward_only(void *ctx, int v, int i) {
    ForwardOnly *f = (ForwardOnly *)ctx;
    gpt2_upload_batch(f->m, i, v == 0 ? f->inputs : NULL, v == f->m->V - 1 ? f->targets : NULL);
    gpt2_forward(f->m, v, chunk_acts(f->m, v, i));
}

// Forward only, through every stage: tokens (B, T*cp) in; the last stage's lnf of this rank's tokens
// out (in the last chunk's acts of micro-batch 0).
static void gpt2_forward_pipeline(GPT2 *m, const int *inputs, const int *targets) {
    int *in = (int *)malloc_check(sizeof(int) * 2 * m->BT), *tg = in + m->BT;
    local_tokens(m, in, inputs);
    local_tokens(m, tg, targets);
    ForwardOnly f = {m, in, tg};
    pipeline_forward_only(&m->pipe, (StageWork){&f, forward_only, NULL});
    free(in);
}

// Mean loss over up to max_batches batches of the loader (from its start), over all dp ranks.
static float gpt2_validate(GPT2 *m, DataLoader *dl, int max_batches) {
    dataloader_reset(dl);
    gpt2_clear_loss(m);
    int n = max_batches < (int)dl->nrounds ? max_batches : (int)dl->nrounds;
    if (n < 1) { n = 1; }
    for (int i = 0; i < n; i++) {
        dataloader_next_batch(dl);
        gpt2_forward_pipeline(m, dl->inputs, dl->targets);
        if (m->last) { gpt2_head(m, chunk_acts(m, m->V - 1, 0), 0.0f, 0, 0); }
    }
    return gpt2_read_loss(m, n);
}

// Generates gen_tokens tokens after an EOT (sampled at temperature 1). Every rank runs it with the
// same generator (the forward needs the tp, cp, pp and, at ZeRO 3, dp collectives); the last stage's
// cp rank holding the position draws the token and sends it to the others; rank 0 prints. MoE layers run dropless: with a capacity, the
// padding after the current token would take capacity from it.
static void gpt2_sample(GPT2 *m, Tokenizer *tok, Rng *rng, int gen_tokens, int eot) {
    const GPT2Config *c = &m->config;
    int C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size, cap = m->moe_cap;
    int Tg = m->T * m->grid->cp, cp = m->grid->cp;   // the whole sequence (cp: over the cp ranks)
    m->moe_cap = Tg;   // (dropless)
    int *gen = (int *)malloc_check(sizeof(int) * m->B * Tg);
    for (int i = 0; i < m->B * Tg; i++) { gen[i] = eot; }
    floatX *row = m->last ? (floatX *)mem_alloc((size_t)Vp * floatx_bytes(), MEM_LOGITS) : NULL;   // (as planned: gpt2_plan)
    float *probs = (float *)malloc_check(sizeof(float) * Vp);
    if (m->grid->rank == 0) { printf("generating:\n---\n"); }
    int n = gen_tokens < Tg - 1 ? gen_tokens : Tg - 1;
    for (int t = 1; t <= n; t++) {
        gpt2_forward_pipeline(m, gen, gen);
        float coin01 = rng_f32(rng);   // every rank draws, so the generators stay equal
        int next = 0, chunk = (t - 1) / (Tg / (2 * cp)), owner = chunk < cp ? chunk : 2 * cp - 1 - chunk;   // position t-1's cp rank
        int row_t = cp == 1 ? t - 1 : (chunk < cp ? 0 : m->T / 2) + (t - 1) % (Tg / (2 * cp));                // and its local row
        floatX *p[NUM_TENSORS];
        if (m->last) { unit_view(&m->units[m->u_embed], zero_unit_params(&m->zero, m->u_embed), p); }   // (ZeRO 3: a dp, cp collective)
        if (m->last && m->grid->cp_rank == owner) {
            floatX *h = tp_all_tokens(&m->grid->tp_group, m->sp, chunk_acts(m, m->V - 1, 0)->lnf, m->ws.xfull, m->BTs, C);
            // this rank's vocabulary slice of the logits of position t-1, then all slices (Vp)
            matmul_forward(row + m->v0, h + (size_t)row_t * C, p[T_WTE], NULL, 1, C, m->Vl);
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
        if (cp > 1 && m->last) { WATCHED("broadcast of the sampled token", "cp", MPI_Bcast(&next, 1, MPI_INT, owner, m->grid->cp_group.mpi)); }
        if (m->grid->pp > 1) { WATCHED("broadcast of the sampled token", "pp", MPI_Bcast(&next, 1, MPI_INT, m->grid->pp - 1, m->grid->pp_group.mpi)); }
        gen[t] = next;
        if (m->grid->rank == 0) {
            const char *piece = tokenizer_decode(tok, next);
            if (piece) { safe_printf(piece); } else { printf("%d ", next); }
            fflush(stdout);
        }
    }
    if (m->grid->rank == 0) { printf("\n---\n"); }
    m->moe_cap = cap;
    mem_free(row);
    free(probs);
    free(gen);
}

// ----------------------------------------------------------------------------
// checkpoints, layout-independent: a checkpoint written by any layout (tp, sp, pp, dp, ep, ZeRO stage)
// resumes in any other of the same model and global batch, each rank cutting its part out of the
// files as it does from a model file.
//   DIR/model_STEP.bin  the model file (llm.c's format; MoE: ours), rank 0
//   DIR/state_STEP.bin  rank 0: int32 header[256] (below), then the AdamW state of every parameter in
//                       the model file's order: fp32 m, v and (CUDA bf16) the fp32 master weights
//   DIR/DONE_STEP       written once both are complete
// Each file is written under a temporary name, fsync'd and renamed, and carries the CRC-32 of its body
// in header slot 255. Resume (-y) takes the newest DONE_. The data position is not stored as such: after
// `step` steps every rank has read step x (accumulation) rounds, and dataloader_seek_rounds finds where
// that leaves it in the resuming layout: exactly where an uninterrupted run of that layout would be (the
// same sequences in the same order without shuffling; with --shuffle 1 the order of rounds depends on
// B and dp, as llm.c's, so another layout continues from the same number of rounds in its own order).

#define STATE_MAGIC 20240527
#define STATE_VERSION 2
enum { SH_STEP = 2, SH_UPDATES, SH_SKIPS, SH_T, SH_BATCH, SH_EPOCH, SH_SHARD, SH_SHUFFLE, SH_MASTER, SH_PARAMS_LO, SH_PARAMS_HI,
       SH_RNG_LO = 15, SH_RNG_HI, SH_NSHARDS, SH_SKIPS_IN_A_ROW,
       SH_TP = 20, SH_PP, SH_DP, SH_EP, SH_ZERO, SH_CRC = 255 };

// Writes a file under a temporary name: header (1024 bytes; slot 255 set to the body's CRC), body
// parts, fsync, rename: never a torn file. Returns 0, or 1 with the reason in err (no fail(): the
// asynchronous writer runs this on its own thread).
static int write_file_atomic(const char *path, int *header, const void **parts, const size_t *bytes, int nparts, char *err, size_t errlen) {
    uint32_t crc = 0;
    for (int i = 0; i < nparts; i++) { crc = crc32_update(crc, parts[i], bytes[i]); }
    header[SH_CRC] = (int)(crc ? crc : 1);
    char tmp[PATH_LEN + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) { snprintf(err, errlen, "cannot open '%s' for writing", tmp); return 1; }
    int ok = fwrite(header, sizeof(int), 256, f) == 256;
    for (int i = 0; i < nparts && ok; i++) { ok = fwrite(parts[i], 1, bytes[i], f) == bytes[i]; }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok) { snprintf(err, errlen, "cannot write '%s' (disk full?)", tmp); return 1; }
    if (rename(tmp, path) != 0) { snprintf(err, errlen, "cannot rename '%s' to '%s'", tmp, path); return 1; }
    return 0;
}

// One full host array (file order) on rank 0 from every rank's units: get(z, u, which, host) gives
// unit u's full contents on every rank of its data-parallel group (a collective over it). The tp-0
// rank of each unit's group rank 0 assembles the unit (the dense units on dp rank 0 of each stage, the
// experts on edp rank 0 of each ep rank); each element is assembled by exactly one rank, so a sum over
// those ranks is the array. Other ranks get NULL.
typedef void (*UnitGetter)(Zero *z, int u, int which, float *host);
static void unit_params_getter(Zero *z, int u, int which, float *host) { (void)which; zero_get_unit_params(z, u, host); }

static float *gpt2_assemble(GPT2 *m, UnitGetter get, int which) {
    const GPT2Config *c = &m->config;
    Grid *g = m->grid;
    int assemble = g->tp_rank == 0 && g->cp_rank == 0 && g->dp_rank < g->ep, root = g->rank == 0;   // (edp rank 0 <=> dp rank < ep)
    float *all = assemble ? (float *)calloc(m->num_parameters, sizeof(float)) : NULL, *full[NUM_TENSORS];
    if (assemble && all == NULL) { fail("out of host memory assembling %zu parameters", m->num_parameters); }
    if (assemble) { split_tensors(c, all, full); }
    for (int u = 0; u < m->nunits; u++) {
        const Unit *U = &m->units[u];
        float *host = (float *)malloc_check(U->size * sizeof(float));
        get(&m->zero, u, which, host);
        if (U->dpg->rank == 0 && !U->norm_skip) {   // (the last stage's embedding copy: the first's counts)
            float *slices = g->tp_rank == 0 ? (float *)malloc_check(U->size * sizeof(float) * g->tp) : NULL;
            WATCHED("gather over tp (checkpoint)", "tp", MPI_Gather(host, (int)U->size, MPI_FLOAT, slices, (int)U->size, MPI_FLOAT, 0, g->tp_group.mpi));
            if (g->tp_rank == 0) {
                for (int r = 0; r < g->tp; r++) { unit_copy_full(c, U, full, slices + (size_t)r * U->size, g->tp, r, 0); }
            }
            free(slices);
        }
        free(host);
    }
    MPI_Comm assemblers;   // rank 0 first (key: world rank)
    MPI_Comm_split(MPI_COMM_WORLD, assemble ? 0 : MPI_UNDEFINED, g->rank, &assemblers);
    if (assemble) {
        int n;
        MPI_Comm_size(assemblers, &n);
        if (n > 1) {
            WATCHED("sum of the assembled parts (checkpoint)", "assemblers",
                    MPI_Reduce(root ? MPI_IN_PLACE : all, all, (int)m->num_parameters, MPI_FLOAT, MPI_SUM, 0, assemblers));
        }
        MPI_Comm_free(&assemblers);
    }
    if (!root) { free(all); return NULL; }
    return all;
}

// A checkpoint's files, assembled on rank 0 (the header and body of each), written by write_checkpoint:
// at once, or (--async-checkpoint) on a thread of rank 0 while training goes on. DONE_STEP is written
// by the main thread once the files are complete (checkpoint_done): at the next step boundary after.
typedef struct {
    char dir[PATH_LEN];
    int step;
    int model_header[256], state_header[256];
    void *model_body;              // the parameters in floatX's file precision
    size_t model_bytes, state_bytes;
    float *states[3];              // m, v, master
    int nstates;
    pthread_t thread;
    int running;                   // a write is in flight (or finished and not yet marked DONE)
    volatile int finished;         // the writer is done (set by it)
    char error[2 * PATH_LEN + 64]; // its failure, if any
} Checkpoint;

static Checkpoint ckpt_writer;   // rank 0's (one write in flight at most)

// Every rank: the full parameters and AdamW state assembled on rank 0 into c (stage 3 and the
// experts gather; each rank contributes its part). Checks that no value is non-finite.
static void checkpoint_assemble(GPT2 *m, Checkpoint *ck, const char *dir, int step, const DataLoader *dl, const Rng *rng, int total_batch) {
    const GPT2Config *c = &m->config;
    Grid *g = m->grid;
    Zero *z = &m->zero;
    float *all = gpt2_assemble(m, unit_params_getter, 0);
    zero_release_params(z);
    int nstates = z->master ? 3 : 2;
    float *states[3] = {NULL, NULL, NULL};
    for (int i = 0; i < nstates; i++) { states[i] = gpt2_assemble(m, zero_get_unit_state, i); }
    if (g->rank != 0) { return; }
    check_finite(c, all, "the model");   // never a checkpoint of NaN (the update that would make one is skipped)
    for (int i = 0; i < nstates; i++) { check_finite(c, states[i], "the optimizer state"); }
    memset(ck, 0, sizeof(*ck));
    snprintf(ck->dir, sizeof(ck->dir), "%s", dir);
    ck->step = step;
    size_t P = m->num_parameters;
    int *h = ck->model_header;
    h[0] = MODEL_MAGIC; h[1] = (sizeof(floatX) == 4 ? 3 : 5) + (c->num_experts > 0 ? 10 : 0);
    h[2] = c->max_seq_len; h[3] = c->vocab_size; h[4] = c->num_layers; h[5] = c->num_heads; h[6] = c->channels;
    h[7] = c->padded_vocab_size; h[8] = c->num_experts; h[9] = c->topk; h[10] = c->moe_every;
    if (sizeof(floatX) == 4) {
        ck->model_body = all; ck->model_bytes = P * sizeof(float);
    } else {
        uint16_t *b = (uint16_t *)malloc_check(P * 2);
        for (size_t i = 0; i < P; i++) { b[i] = float_to_bf16(all[i]); }
        free(all);
        ck->model_body = b; ck->model_bytes = P * 2;
    }
    h = ck->state_header;
    h[0] = STATE_MAGIC; h[1] = STATE_VERSION; h[SH_STEP] = step; h[SH_UPDATES] = m->updates; h[SH_SKIPS] = m->skips;
    h[SH_SKIPS_IN_A_ROW] = m->skips_in_a_row; h[SH_T] = m->T * m->grid->cp; h[SH_BATCH] = total_batch;
    h[SH_EPOCH] = dl->epoch; h[SH_SHARD] = dl->shard_pos; h[SH_SHUFFLE] = dl->shuffle; h[SH_NSHARDS] = dl->nshards;   // (rank 0's, for the reader)
    h[SH_MASTER] = nstates == 3;
    h[SH_PARAMS_LO] = (int)(P & 0xFFFFFFFFu); h[SH_PARAMS_HI] = (int)((uint64_t)P >> 32);
    h[SH_RNG_LO] = (int)(rng->s & 0xFFFFFFFFu); h[SH_RNG_HI] = (int)(rng->s >> 32);
    h[SH_TP] = g->tp; h[SH_PP] = g->pp; h[SH_DP] = g->dp; h[SH_EP] = g->ep; h[SH_ZERO] = z->stage;   // (for the reader)
    for (int i = 0; i < nstates; i++) { ck->states[i] = states[i]; }
    ck->nstates = nstates;
    ck->state_bytes = P * sizeof(float);
}

// Writes the model and state files of ck (rank 0; the thread's body with --async-checkpoint) and
// frees its buffers. Test hook: TRAIN_GPT_SLOW_CHECKPOINT=SECONDS waits before the state file's rename.
static void *checkpoint_write(void *arg) {
    Checkpoint *ck = (Checkpoint *)arg;
    char path[PATH_LEN];
    path_join(path, ck->dir, "model_%08d.bin", ck->step);
    const void *body = ck->model_body;
    int bad = write_file_atomic(path, ck->model_header, &body, &ck->model_bytes, 1, ck->error, sizeof(ck->error));
    const char *slow = getenv("TRAIN_GPT_SLOW_CHECKPOINT");
    if (slow) { usleep((useconds_t)(atof(slow) * 1e6)); }
    if (!bad) {
        path_join(path, ck->dir, "state_%08d.bin", ck->step);
        const void *parts[3] = {ck->states[0], ck->states[1], ck->states[2]};
        size_t bytes[3] = {ck->state_bytes, ck->state_bytes, ck->state_bytes};
        write_file_atomic(path, ck->state_header, parts, bytes, ck->nstates, ck->error, sizeof(ck->error));
    }
    free(ck->model_body);
    for (int i = 0; i < ck->nstates; i++) { free(ck->states[i]); }
    ck->finished = 1;
    return NULL;
}

// Rank 0: marks a written checkpoint complete (DONE_STEP); a failed write stops the run.
static void checkpoint_mark_done(Checkpoint *ck) {
    if (ck->error[0]) { fail("checkpoint of step %d: %s", ck->step, ck->error); }
    char path[PATH_LEN];
    path_join(path, ck->dir, "DONE_%08d", ck->step);
    FILE *d = fopen_check(path, "wb");
    if (fsync(fileno(d)) != 0) { fail("cannot write '%s'", path); }
    fclose_check(d, path);
    printf("wrote checkpoint at step %d to %s\n", ck->step, ck->dir);
}

// Rank 0, at a step boundary: once the asynchronous write in flight is complete (wait: block until it
// is), marks it DONE. Returns whether nothing is in flight any more.
static int checkpoint_done(int wait) {
    Checkpoint *ck = &ckpt_writer;
    if (!ck->running) { return 1; }
    if (!wait && !ck->finished) { return 0; }
    pthread_join(ck->thread, NULL);
    ck->running = 0;
    checkpoint_mark_done(ck);
    return 1;
}

// Every rank: a checkpoint of this step. The assembly is collective and synchronous; rank 0 then
// writes the files, on a thread with async (a checkpoint still in flight is finished first).
static void save_checkpoint(GPT2 *m, const char *dir, int step, DataLoader *dl, Rng *rng, int total_batch, int async) {
    trace_begin();
    Checkpoint *ck = &ckpt_writer;
    if (m->grid->rank == 0) { checkpoint_done(1); }
    checkpoint_assemble(m, ck, dir, step, dl, rng, total_batch);
    if (m->grid->rank == 0 && async) {
        ck->running = 1;
        if (pthread_create(&ck->thread, NULL, checkpoint_write, ck) != 0) { fail("cannot start the checkpoint writer thread"); }
    } else if (m->grid->rank == 0) {
        checkpoint_write(ck);
        checkpoint_mark_done(ck);
    }
    trace_end("checkpoint", "io", "\"step\":%d,\"async\":%d", step, async);
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
                if (sscanf(e->d_name, "DONE_%d%c", &s, &extra) == 1 && s > best && s >= 0) { best = s; }
            }
            closedir(d);
        }
    }
    WATCHED("broadcast (checkpoint)", "world", MPI_Bcast(&best, 1, MPI_INT, 0, MPI_COMM_WORLD));
    return best;
}

// Restores the optimizer state of this rank's part, the step counters, the data position and the
// generator from DIR/state_STEP.bin (the parameters come from the model file). Every field is checked
// before it is used.
static void load_state(GPT2 *m, const char *dir, int step, DataLoader *dl, Rng *rng, int total_batch) {
    Grid *g = m->grid;
    Zero *z = &m->zero;
    char path[PATH_LEN];
    path_join(path, dir, "state_%08d.bin", step);
    FILE *f = fopen_check(path, "rb");
    int h[256];
    if (fread(h, sizeof(int), 256, f) != 256) { fail("state file '%s' is truncated: expected a 1024-byte header", path); }
    if (h[0] != STATE_MAGIC) { fail("state file '%s' has bad magic %d, expected %d", path, h[0], STATE_MAGIC); }
    if (h[1] != STATE_VERSION) { fail("state file '%s' has version %d, expected %d (checkpoints of older versions cannot be resumed)", path, h[1], STATE_VERSION); }
    uint64_t P = (uint32_t)h[SH_PARAMS_LO] | (uint64_t)(uint32_t)h[SH_PARAMS_HI] << 32;
    int nstates = h[SH_MASTER] ? 3 : 2;
    if (h[SH_STEP] != step || P != m->num_parameters || (h[SH_MASTER] != 0 && h[SH_MASTER] != 1)) {
        fail("state file '%s' does not belong to this checkpoint (step %d, %llu parameters; expected step %d, %zu)", path,
             h[SH_STEP], (unsigned long long)P, step, m->num_parameters);
    }
    if (h[SH_T] != m->T * g->cp || h[SH_BATCH] != total_batch) {
        fail("state file '%s' was written with -t %d -d %d; this run has -t %d -d %d: a checkpoint resumes with the same sequence "
             "length and global batch (the layout may change)", path, h[SH_T], h[SH_BATCH], m->T * g->cp, total_batch);
    }
    if (h[SH_UPDATES] < 0 || h[SH_SKIPS] < 0 || h[SH_UPDATES] + h[SH_SKIPS] != step || h[SH_SKIPS_IN_A_ROW] < 0 || h[SH_SKIPS_IN_A_ROW] > h[SH_SKIPS]) {
        fail("state file '%s' has inconsistent step counters (step %d, %d updates, %d skipped, %d in a row)", path, step,
             h[SH_UPDATES], h[SH_SKIPS], h[SH_SKIPS_IN_A_ROW]);
    }
    if (h[SH_NSHARDS] != dl->nshards || h[SH_SHUFFLE] != dl->shuffle) {
        fail("state file '%s' was written reading %d data shards with --shuffle %d; this run reads %d with --shuffle %d", path,
             h[SH_NSHARDS], h[SH_SHUFFLE], dl->nshards, dl->shuffle);
    }
    long size = file_size(f);
    if ((uint64_t)size != 1024 + (uint64_t)nstates * P * sizeof(float)) {
        fail("state file '%s' is %ld bytes, expected %llu", path, size, (unsigned long long)(1024 + (uint64_t)nstates * P * sizeof(float)));
    }
    check_file_crc(f, h, path);
    // every rank reads the whole state and keeps its part, unit by unit
    float *all = (float *)malloc_check(P * sizeof(float)), *full[NUM_TENSORS];
    split_tensors(&m->config, all, full);
    for (int i = 0; i < nstates; i++) {
        fread_check(all, sizeof(float), P, f, path);
        check_finite(&m->config, all, path);
        if (i == 2 && z->master == NULL) { continue; }   // fp32 parameters: no master weights to restore
        for (int u = 0; u < m->nunits; u++) {
            float *host = (float *)malloc_check(m->units[u].size * sizeof(float));
            unit_copy_full(&m->config, &m->units[u], full, host, g->tp, g->tp_rank, 1);
            zero_set_unit_state(z, u, i, host);
            free(host);
        }
    }
    free(all);
    fclose(f);
    m->updates = h[SH_UPDATES]; m->skips = h[SH_SKIPS]; m->skips_in_a_row = h[SH_SKIPS_IN_A_ROW];
    rng->s = (uint32_t)h[SH_RNG_LO] | (uint64_t)(uint32_t)h[SH_RNG_HI] << 32;
    if (rng->s == 0) { fail("state file '%s' holds the generator state 0, which no run can reach", path); }
    dataloader_seek_rounds(dl, (uint64_t)step * (total_batch / (m->B * m->T * g->cp * g->dp)));   // accumulation rounds per step
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
    int checkpoint_every, resume, zero, tp, cp, pp, vpp, dp, ep, sp, ce_chunk, memory_report, comm_report, shuffle;
    int experts, topk, moe_every, cap1000;   // MoE; the first three -1 when not given
    float lr, final_frac, weight_decay, grad_clip, aux_coeff, z_coeff, timeout;
    int max_skips, help;
    const char *recompute;
    const char *attention;       // the CUDA build's attention path: cublas or flash
    int async_checkpoint, overlap;
    int plan;                    // --plan N: print the memory plan for N ranks and exit
    const char *plan_precision;  // --plan-precision bf16|fp32: plan the CUDA build's sizes (NULL: this build's)
    double memory_limit;         // --memory-limit: bytes per rank (0: none; CUDA: the free device memory)
    const char *scheduler, *pp_schedule, *drop_policy, *trace_dir;
    unsigned int seed;
    const char *given[64];   // the value of each flag given (FLAGS order), NULL if not: compared across ranks
} Args;

static void default_args(Args *a) {
    memset(a, 0, sizeof(*a));
    a->model = "d4"; a->B = 4; a->T = 64; a->total_batch = -1; a->max_steps = -1; a->lr = 3e-4f; a->warmup = 0;
    a->final_frac = 1.0f; a->weight_decay = 0.0f; a->val_every = 20; a->val_batches = 20; a->sample_every = 20;
    a->gen_tokens = 64; a->checkpoint_every = 0; a->resume = 0; a->zero = 0; a->tp = 1; a->cp = 1; a->pp = 1; a->vpp = 1; a->dp = -1;
    a->ep = 1; a->sp = 0; a->ce_chunk = 256; a->shuffle = -1; a->grad_clip = 1.0f; a->scheduler = "cosine";
    a->pp_schedule = "1f1b";
    a->experts = a->topk = a->moe_every = -1; a->cap1000 = 1250; a->drop_policy = "probs"; a->aux_coeff = 0.01f; a->z_coeff = 0.001f;
    a->timeout = 600.0f; a->max_skips = 5; a->recompute = "none"; a->overlap = 1; a->attention = "cublas";
    a->seed = 1337;
}

static void print_usage(void) {
    printf("usage: mpirun -np N ./train_gpt [options]\n"
           "  -i <glob>  train data shards (default: built-in synthetic corpus)\n"
           "  -j <glob>  validation data shards (default: none, or the built-in corpus)\n"
           "  -o <dir>   output dir for main.log and checkpoints (default: none)\n"
           "  -e <str>   model file (llm.c .bin), or dN (depth N), or L=..,C=..,NH=..,V=..,maxT=..[,Vp=..][,E=..,k=..,every=..] (default d4)\n"
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
           "  --tp N (alias --tensor-model-parallel-size)  --pp N  --pp-schedule 1f1b|gpipe|interleaved  --dp N  --sp  --zero N  --ep N\n"
           "  --cp N (alias --context-parallel-size: each sequence over N ranks, ring attention; T a multiple of 2N)\n"
           "  --vpp V (alias --virtual-pipeline-model-parallel-size: model chunks per pipeline stage; V > 1 is the interleaved schedule)\n"
           "  --ce-chunk N (tokens per cross-entropy chunk, 0 = full logits)  --memory-report  --comm-report\n"
           "  --seed N  --shuffle 0|1  --grad-clip F (0 = off)  --trace DIR (a Chrome trace per rank: dev/trace.py)\n"
           "  --timeout S (stop when a collective makes no progress for S seconds; default 600, 0 off)\n"
           "  --max-skips N (stop after N updates in a row skipped for a non-finite loss or norm; default 5)\n"
           "  --attention cublas|flash (CUDA build: cuBLAS GEMMs through an (NH, T, T) workspace, or the flash kernels: no workspace,\n"
           "               bf16 and head size 64 or 128; default cublas)\n"
           "  --recompute none|mlp|full (recompute the MLP's fc/GELU outputs, or whole layers, in the backward; default none)\n"
           "  --async-checkpoint (rank 0 writes the checkpoint files on a thread while training goes on)\n"
           "  --plan N (print every rank's planned peak memory for a world of N ranks, and exit; no weights, no device)\n"
           "  --plan-precision bf16|fp32 (plan the CUDA build's sizes from any build)  --memory-limit SIZE (e.g. 80G:\n"
           "       a rank over it is named with the tensor that dominates and the levers that fit; a run stops before allocating)\n"
           "  --overlap 0|1 (ZeRO-3: gather the next layer while one computes; pipeline: post receives early; default 1)\n"
           "  MoE: --experts E (alias --num-experts)  --topk k (--moe-router-topk; default 1)  --moe-every N (default 1)\n"
           "       --capacity-factor F (default 1.25, 0 = dropless)  --drop-policy probs|position  --aux-coeff A (0.01)\n"
           "       --z-coeff Z (0.001)  --ep N (alias --expert-model-parallel-size). A dense model file with --experts:\n"
           "       every expert starts as a copy of its layer's MLP (sparse upcycling)\n");
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
    if (*v == '\0' || *end != '\0' || errno != 0) { arg_fail("%s expects an integer, got '%s'", flag, v); return (int)lo; }
    if (x < lo || x > hi) { arg_fail("%s must be in [%ld, %ld], got %ld", flag, lo, hi, x); return (int)lo; }
    return (int)x;
}

static float parse_float_arg(const char *flag, const char *v, double lo, double hi) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || errno != 0 || x != x) { arg_fail("%s expects a number, got '%s'", flag, v); return (float)lo; }
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
    if (fabs(1000.0 * F - F1000) > 1e-6 * (1.0 + F1000)) { arg_fail("--capacity-factor %s has more than 3 decimals", v); }
    return (int)F1000;
}

// The flags with a value (an alias is the same flag: giving both is giving it twice), then the switches.
static const char *FLAGS[][2] = {
    {"-i", 0}, {"-j", 0}, {"-o", 0}, {"-e", 0}, {"-b", 0}, {"-t", 0}, {"-d", 0}, {"-x", 0}, {"-l", 0}, {"-u", 0}, {"-q", 0},
    {"-c", 0}, {"-k", 0}, {"-v", 0}, {"-m", 0}, {"-s", 0}, {"-g", 0}, {"-n", 0}, {"-y", 0}, {"--zero", "-z"},
    {"--tp", "--tensor-model-parallel-size"}, {"--cp", "--context-parallel-size"}, {"--pp", 0}, {"--vpp", "--virtual-pipeline-model-parallel-size"}, {"--dp", 0}, {"--ep", "--expert-model-parallel-size"},
    {"--ce-chunk", 0}, {"--seed", 0}, {"--shuffle", 0}, {"--grad-clip", 0}, {"--pp-schedule", 0},
    {"--experts", "--num-experts"}, {"--topk", "--moe-router-topk"}, {"--moe-every", 0}, {"--capacity-factor", 0},
    {"--drop-policy", 0}, {"--aux-coeff", 0}, {"--z-coeff", 0}, {"--trace", 0}, {"--timeout", 0}, {"--max-skips", 0}, {"--recompute", 0}, {"--overlap", 0}, {"--attention", 0},
    {"--plan", 0}, {"--plan-precision", 0}, {"--memory-limit", 0},
    {"--sp", 0}, {"--memory-report", 0}, {"--comm-report", 0}, {"--async-checkpoint", 0}};
#define NUM_SWITCHES 4
#define NUM_FLAGS ((int)(sizeof(FLAGS) / sizeof(FLAGS[0])))

// Parses argv into a, recording the first bad flag in arg_error (every rank does the same).
static void parse_args(int argc, char **argv, Args *a) {
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { a->help = 1; continue; }
        int known = -1;
        for (int k = 0; k < NUM_FLAGS; k++) {
            if (!strcmp(f, FLAGS[k][0]) || (FLAGS[k][1] && !strcmp(f, FLAGS[k][1]))) { known = k; }
        }
        if (known < 0) { arg_fail("unknown flag '%s' (see -h)", f); continue; }
        if (a->given[known]) {   // a flag given twice is a mistake, not an override
            arg_fail("flag %s is given twice%s", FLAGS[known][0], FLAGS[known][1] ? " (or under its alias)" : "");
            continue;
        }
        f = FLAGS[known][0];   // the canonical name from here on
        if (known >= NUM_FLAGS - NUM_SWITCHES) {   // switches
            a->given[known] = "1";
            if (!strcmp(f, "--sp")) { a->sp = 1; }
            else if (!strcmp(f, "--memory-report")) { a->memory_report = 1; }
            else if (!strcmp(f, "--comm-report")) { a->comm_report = 1; }
            else { a->async_checkpoint = 1; }
            continue;
        }
        if (i + 1 >= argc) { arg_fail("flag %s is missing its value", f); continue; }
        const char *v = argv[++i];
        a->given[known] = v;
        if (!strcmp(f, "-i")) { a->train_pattern = v; }
        else if (!strcmp(f, "-j")) { a->val_pattern = v; }
        else if (!strcmp(f, "-o")) { a->output_dir = v; }
        else if (!strcmp(f, "-e")) { a->model = v; }
        else if (!strcmp(f, "-b")) { a->B = parse_int_arg(f, v, 1, 1 << 20); }
        else if (!strcmp(f, "-t")) { a->T = parse_int_arg(f, v, 1, 1 << 20); }
        else if (!strcmp(f, "-d")) { a->total_batch = parse_int_arg(f, v, -1, 1 << 30); }
        else if (!strcmp(f, "-x")) { a->max_steps = parse_int_arg(f, v, -1, 1 << 30); }
        else if (!strcmp(f, "-l")) { a->lr = parse_float_arg(f, v, 0.0, 10.0); }
        else if (!strcmp(f, "-u")) { a->warmup = parse_int_arg(f, v, 0, 1 << 30); }
        else if (!strcmp(f, "-q")) { a->final_frac = parse_float_arg(f, v, 0.0, 1.0); }
        else if (!strcmp(f, "-c")) { a->weight_decay = parse_float_arg(f, v, 0.0, 10.0); }
        else if (!strcmp(f, "-k")) { if (!lr_scheduler_valid(v)) { arg_fail("-k expects cosine|linear|constant|wsd, got '%s'", v); } a->scheduler = v; }
        else if (!strcmp(f, "-v")) { a->val_every = parse_int_arg(f, v, 0, 1 << 30); }
        else if (!strcmp(f, "-m")) { a->val_batches = parse_int_arg(f, v, 1, 1 << 30); }
        else if (!strcmp(f, "-s")) { a->sample_every = parse_int_arg(f, v, 0, 1 << 30); }
        else if (!strcmp(f, "-g")) { a->gen_tokens = parse_int_arg(f, v, 1, 1 << 20); }
        else if (!strcmp(f, "-n")) { a->checkpoint_every = parse_int_arg(f, v, 0, 1 << 30); }
        else if (!strcmp(f, "-y")) { a->resume = parse_int_arg(f, v, 0, 2); }
        else if (!strcmp(f, "--zero")) { a->zero = parse_int_arg(f, v, 0, 3); }
        else if (!strcmp(f, "--tp")) { a->tp = parse_int_arg(f, v, 1, 1 << 16); }
        else if (!strcmp(f, "--cp")) { a->cp = parse_int_arg(f, v, 1, 1 << 16); }
        else if (!strcmp(f, "--pp")) { a->pp = parse_int_arg(f, v, 1, 1 << 16); }
        else if (!strcmp(f, "--vpp")) { a->vpp = parse_int_arg(f, v, 1, 1024); }
        else if (!strcmp(f, "--dp")) { a->dp = parse_int_arg(f, v, 1, 1 << 16); }
        else if (!strcmp(f, "--ep")) { a->ep = parse_int_arg(f, v, 1, 1 << 16); }
        else if (!strcmp(f, "--ce-chunk")) { a->ce_chunk = parse_int_arg(f, v, 0, 1 << 30); }
        else if (!strcmp(f, "--seed")) { a->seed = (unsigned)parse_int_arg(f, v, 0, 2147483647); }
        else if (!strcmp(f, "--shuffle")) { a->shuffle = parse_int_arg(f, v, 0, 1); }
        else if (!strcmp(f, "--grad-clip")) { a->grad_clip = parse_float_arg(f, v, 0.0, 1e9); }
        else if (!strcmp(f, "--pp-schedule")) {
            if (strcmp(v, "1f1b") && strcmp(v, "gpipe") && strcmp(v, "interleaved")) {
                arg_fail("--pp-schedule expects 1f1b, gpipe or interleaved, got '%s'", v);
            }
            a->pp_schedule = v;
        }
        else if (!strcmp(f, "--experts")) { a->experts = parse_int_arg(f, v, 1, MOE_MAX_EXPERTS); }
        else if (!strcmp(f, "--topk")) { a->topk = parse_int_arg(f, v, 1, MOE_MAX_EXPERTS); }
        else if (!strcmp(f, "--moe-every")) { a->moe_every = parse_int_arg(f, v, 1, 1024); }
        else if (!strcmp(f, "--capacity-factor")) { a->cap1000 = parse_capacity_factor(v); }
        else if (!strcmp(f, "--drop-policy")) {
            if (strcmp(v, "probs") && strcmp(v, "position")) { arg_fail("--drop-policy expects probs or position, got '%s'", v); }
            a->drop_policy = v;
        }
        else if (!strcmp(f, "--aux-coeff")) { a->aux_coeff = parse_float_arg(f, v, 0.0, 1e6); }
        else if (!strcmp(f, "--z-coeff")) { a->z_coeff = parse_float_arg(f, v, 0.0, 1e6); }
        else if (!strcmp(f, "--trace")) { if (!*v) { arg_fail("--trace expects a directory, got ''"); } a->trace_dir = v; }
        else if (!strcmp(f, "--timeout")) { a->timeout = parse_float_arg(f, v, 0.0, 1e7); }
        else if (!strcmp(f, "--max-skips")) { a->max_skips = parse_int_arg(f, v, 1, 1 << 30); }
        else if (!strcmp(f, "--overlap")) { a->overlap = parse_int_arg(f, v, 0, 1); }
        else if (!strcmp(f, "--plan")) { a->plan = parse_int_arg(f, v, 1, 1 << 20); }
        else if (!strcmp(f, "--plan-precision")) {
            if (strcmp(v, "bf16") && strcmp(v, "fp32")) { arg_fail("--plan-precision expects bf16 or fp32, got '%s'", v); }
            a->plan_precision = v;
        }
        else if (!strcmp(f, "--memory-limit")) { a->memory_limit = parse_size_arg(f, v); }
        else if (!strcmp(f, "--attention")) {
            if (strcmp(v, "cublas") && strcmp(v, "flash")) { arg_fail("--attention expects cublas or flash, got '%s'", v); }
            a->attention = v;
        }
        else if (!strcmp(f, "--recompute")) {
            if (strcmp(v, "none") && strcmp(v, "mlp") && strcmp(v, "full")) { arg_fail("--recompute expects none, mlp or full, got '%s'", v); }
            a->recompute = v;
        }
    }
    // --vpp V > 1 is the interleaved schedule; --pp-schedule interleaved needs it
    int vpp_given = a->vpp > 1, interleaved = !strcmp(a->pp_schedule, "interleaved"), schedule_given = 0;
    for (int k = 0; k < NUM_FLAGS; k++) { if (!strcmp(FLAGS[k][0], "--pp-schedule")) { schedule_given = a->given[k] != NULL; } }
    if (vpp_given && schedule_given && !interleaved) { arg_fail("--vpp %d is the interleaved schedule, not --pp-schedule %s", a->vpp, a->pp_schedule); }
    if (interleaved && !vpp_given) { arg_fail("--pp-schedule interleaved needs --vpp V >= 2 (model chunks per stage)"); }
    if (vpp_given) { a->pp_schedule = "interleaved"; }
    if (a->output_dir && !a->output_dir[0]) { arg_fail("-o expects a directory, got '' (an unset variable?)"); }
    if (a->output_dir && strlen(a->output_dir) > PATH_LEN - 64) {
        arg_fail("-o is %zu bytes long, at most %d (the file names inside must fit)", strlen(a->output_dir), PATH_LEN - 64);
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
    int bad = arg_error[0] != 0, any_bad = bad, all_bad = bad, help = a->help;
    watch_enter("the first collective (the flags)", "world");   // (a rank that never gets here stops the others)
    MPI_Allreduce(MPI_IN_PLACE, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &all_bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &help, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    watch_leave();
    if (any_bad) {   // the same error everywhere: rank 0 says it; otherwise each rank says its own
        if (all_bad && rank == 0) { fprintf(stderr, "error: %s\n", arg_error); }
        else if (!all_bad && bad) { fprintf(stderr, "error: rank %d: %s\n", rank, arg_error); }
        else if (!all_bad && rank == 0) { fprintf(stderr, "error: the flags were rejected on another rank (every rank must be given the same flags)\n"); }
        MPI_Finalize();
        exit(1);
    }
    if (help) { if (rank == 0) { print_usage(); } MPI_Finalize(); exit(0); }
    uint64_t mine[64], ref[64];
    for (int k = 0; k < NUM_FLAGS; k++) { mine[k] = ref[k] = hash_string(a->given[k]); }
    WATCHED("broadcast of the flags", "world", MPI_Bcast(ref, NUM_FLAGS * 8, MPI_BYTE, 0, MPI_COMM_WORLD));
    int first = world * NUM_FLAGS;   // (flag * world + rank) of the first difference
    for (int k = 0; k < NUM_FLAGS && first == world * NUM_FLAGS; k++) { if (mine[k] != ref[k]) { first = k * world + rank; } }
    WATCHED("all-reduce of the flags", "world", MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (first < world * NUM_FLAGS) {
        int k = first / world, r = first % world;
        if (r == rank) {
            fprintf(stderr, "error: rank %d: flag %s is %s%s%s here, not as on rank 0 (every rank must be given the same flags)\n", rank,
                    FLAGS[k][0], a->given[k] ? "'" : "", a->given[k] ? a->given[k] : "not given", a->given[k] ? "'" : "");
        } else {
            fprintf(stderr, "error: rank %d: flag %s differs between the ranks (rank %d has another value than rank 0)\n", rank, FLAGS[k][0], r);
        }
        MPI_Finalize();
        exit(1);
    }
}

static Recompute recompute_mode(const char *name) {
    return !strcmp(name, "mlp") ? RECOMPUTE_MLP : !strcmp(name, "full") ? RECOMPUTE_FULL : RECOMPUTE_NONE;
}

static MoEOptions moe_options(const Args *a) {
    MoEOptions o = {a->cap1000, strcmp(a->drop_policy, "position") ? DROP_PROBS : DROP_POSITION, a->aux_coeff, a->z_coeff};
    return o;
}

// The checks that need the world size and the model shape (and the defaults that follow from them: dp,
// -d). Returns 1 with the reason in err if the layout cannot run (the memory plan tries layouts with it).
#define LAYOUT_FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return 1; } while (0)
static int layout_error(Args *a, const GPT2Config *c, int world, char *err, size_t errlen) {
    if (world % (a->tp * a->cp * a->pp) != 0) {
        LAYOUT_FAIL("world size %d is not divisible by tp*cp*pp = %d*%d*%d (world = tp*cp*pp*dp)", world, a->tp, a->cp, a->pp);
    }
    int dp = world / (a->tp * a->cp * a->pp);
    if (a->dp != -1 && a->dp != dp) {
        LAYOUT_FAIL("--dp %d does not match world size %d = tp %d * cp %d * pp %d * dp %d", a->dp, world, a->tp, a->cp, a->pp, dp);
    }
    if (a->cp > 1 && a->T % (2 * a->cp)) {   // the sequence in 2cp chunks
        LAYOUT_FAIL("--cp %d: T = %d is not a multiple of 2*cp = %d (each rank holds 2 chunks of T/(2cp))", a->cp, a->T, 2 * a->cp);
    }
    a->dp = dp;
    if (a->pp > c->num_layers) { LAYOUT_FAIL("--pp %d is larger than the number of layers %d", a->pp, c->num_layers); }
    if (dp % a->ep != 0) { LAYOUT_FAIL("--ep %d does not divide dp %d (world = tp*pp*dp, ep within dp)", a->ep, dp); }
    if (a->ep > 1 && c->num_experts == 0) { LAYOUT_FAIL("--ep %d: expert parallelism needs MoE layers (--experts E or a MoE model)", a->ep); }
    if (c->num_experts % a->ep) { LAYOUT_FAIL("--ep %d does not divide the number of experts %d", a->ep, c->num_experts); }
    if (c->num_heads % a->tp) { LAYOUT_FAIL("--tp %d does not divide the number of heads %d", a->tp, c->num_heads); }
    if ((4 * c->channels) % a->tp) { LAYOUT_FAIL("--tp %d does not divide 4C = %d", a->tp, 4 * c->channels); }
    if (c->padded_vocab_size % a->tp) { LAYOUT_FAIL("--tp %d does not divide the padded vocab size %d", a->tp, c->padded_vocab_size); }
    if (a->sp && (a->T / a->cp) % a->tp) { LAYOUT_FAIL("--sp: --tp %d does not divide T/cp = %d", a->tp, a->T / a->cp); }
    if (a->T > c->max_seq_len) { LAYOUT_FAIL("-t %d is larger than the model's maximum sequence length %d", a->T, c->max_seq_len); }
    long tokens_per_micro = (long)a->B * a->T * dp;
    if (tokens_per_micro > (1L << 30)) {
        LAYOUT_FAIL("B*T*dp = %d*%d*%d = %ld tokens per micro-batch is too large (at most 2^30)", a->B, a->T, dp, tokens_per_micro);
    }
    if (a->total_batch == -1) { a->total_batch = (int)tokens_per_micro; }
    if (a->total_batch <= 0 || a->total_batch % tokens_per_micro != 0) {
        LAYOUT_FAIL("-d %d is not a multiple of B*T*dp = %d*%d*%d = %ld", a->total_batch, a->B, a->T, dp, tokens_per_micro);
    }
    if (a->vpp > 1) {   // interleaved: micro-batches go through the chunks in groups of pp
        int accum = (int)(a->total_batch / tokens_per_micro);
        if (a->pp < 2) { LAYOUT_FAIL("--vpp %d: the interleaved schedule needs a pipeline (--pp >= 2)", a->vpp); }
        if (accum % a->pp) {
            LAYOUT_FAIL("--vpp %d: the interleaved schedule needs the micro-batches per step (-d / (B*T*dp) = %d) to be a multiple of --pp %d",
                     a->vpp, accum, a->pp);
        }
        if (a->pp * a->vpp > c->num_layers) { LAYOUT_FAIL("--pp %d x --vpp %d = %d model chunks, more than the %d layers", a->pp, a->vpp, a->pp * a->vpp, c->num_layers); }
    }
    if ((a->checkpoint_every > 0 || a->resume) && a->output_dir == NULL) { LAYOUT_FAIL("-n and -y need an output dir (-o)"); }
    if (a->val_pattern && !a->train_pattern) { LAYOUT_FAIL("-j needs -i (without -i both come from the built-in corpus)"); }
#ifdef USE_CUDA
    int hs = c->channels / c->num_heads;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128) {
        LAYOUT_FAIL("head size C/NH = %d: the CUDA attention supports 16, 32, 64, 128", hs);
    }
#endif
    return 0;
}
#undef LAYOUT_FAIL

// Identical on every rank, so every rank exits with the same message before any collective could hang.
static void validate_layout(Args *a, const GPT2Config *c, int world, int rank) {
    char err[512];
    if (layout_error(a, c, world, err, sizeof(err))) { fail_all(rank, "%s", err); }
}

// mkdir -p
static void make_dirs(const char *dir) {
    char buf[PATH_LEN];
    snprintf(buf, sizeof(buf), "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') { *p = '\0'; mkdir(buf, 0755); *p = '/'; }
    }
    mkdir(buf, 0755);
}

static PipeSchedule pipe_schedule(const char *name) {
    return !strcmp(name, "gpipe") ? SCHEDULE_GPIPE : !strcmp(name, "interleaved") ? SCHEDULE_INTERLEAVED : SCHEDULE_1F1B;
}

// Creates the output dir (and its parents) if needed and checks that a file can be written there.
static void check_output_dir(const char *dir, int rank) {
    if (rank == 0) { make_dirs(dir); }
    WATCHED("barrier (output dir)", "world", MPI_Barrier(MPI_COMM_WORLD));
    char path[PATH_LEN];
    path_join(path, dir, ".write_test_%d", rank);
    FILE *f = fopen(path, "wb");
    int ok = f != NULL;
    if (f) { fclose(f); remove(path); }
    int all_ok = 0;
    WATCHED("all-reduce (output dir)", "world", MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!all_ok) { fail_all(rank, "-o '%s' is not a writable directory", dir); }
}

// ----------------------------------------------------------------------------
// the memory plan (--plan N, --memory-limit): any rank's peak bytes per category for any world size and
// flags, from the code that allocates: gpt2_build and gpt2_alloc_activations run with the allocator only
// counting (alloc.h) on a grid without communicators (grid_plan): no weights, no device, one process.

typedef struct { size_t floatx; int cuda; const char *name; } PlanBuild;   // the build planned for

static PlanBuild plan_build(const Args *a) {
#ifdef USE_CUDA
    PlanBuild b = {sizeof(floatX), 1, sizeof(floatX) == 2 ? "CUDA build, bf16 (AdamW state and master weights fp32)" : "CUDA build, fp32"};
#else
    PlanBuild b = {sizeof(floatX), 0, "CPU build, fp32"};
#endif
    if (a->plan_precision && !strcmp(a->plan_precision, "bf16")) { b = (PlanBuild){2, 1, "CUDA build, bf16 (AdamW state and master weights fp32)"}; }
    if (a->plan_precision && !strcmp(a->plan_precision, "fp32")) { b = (PlanBuild){4, 1, "CUDA build, fp32"}; }
    return b;
}

static int attention_path_of(const Args *a) { return !strcmp(a->attention, "flash") ? ATT_FLASH : ATT_CUBLAS; }

// What the CUDA context and NCCL take beside the allocator's buffers (an assumption, stated with the plan).
static double plan_reserve(PlanBuild b) { return b.cuda ? 1024.0 * 1048576.0 : 0.0; }

// Rank `rank` of a world of `world` ranks: what gpt2_build and gpt2_alloc_activations allocate, then what
// the run allocates later: gpt2_sample's logits row (the last stage, when sampling) and, on CUDA, the
// cuBLAS workspaces of the first GEMM and of the first attention (the cuBLAS path's; flash has none; without cp).
static MemPlan gpt2_plan(const Args *a, const GPT2Config *c, MoEOptions moe, int world, int rank, PlanBuild b) {
    mem_plan_begin(b.floatx);
    Grid g;
    grid_plan(&g, world, rank, a->tp, a->cp, a->pp, a->ep);
    GPT2 m;
    gpt2_build(&m, c, NULL, &g, a->vpp, a->zero, a->sp, moe);
    m.recompute = recompute_mode(a->recompute);
    m.zero.prefetch = a->overlap;
    int accum = a->total_batch / (a->B * a->T * g.dp);
    gpt2_alloc_activations(&m, a->B, a->T / a->cp, a->ce_chunk, accum, pipe_schedule(a->pp_schedule), a->sample_every > 0);
    if (a->sample_every > 0 && m.last) { mem_alloc((size_t)c->padded_vocab_size * floatx_bytes(), MEM_LOGITS); }
    if (b.cuda) {
        mem_alloc(CUBLASLT_WORKSPACE_BYTES, MEM_WORKSPACE);
        if (a->cp == 1 && m.Ls > 0) { mem_alloc(attention_workspace_bytes(attention_path_of(a), m.T, m.NHl, c->channels / c->num_heads, b.floatx), MEM_WORKSPACE); }
    }
    MemPlan p = mem_plan_end();
    p.slots = m.pipe.nslots;
    free(m.units); free(m.u_layer); free(m.u_experts); free(m.layer_id); free(m.chunk_l0); free(m.acts);
    free(m.pipe.steps.s); free(m.pipe.slot_of); free(m.pipe.busy); free(m.pipe.resid); free(m.pipe.chunk_len); free(m.zero.pending);
    return p;
}

// The plan of every pipeline stage (tp, cp, dp rank 0 of each: the other positions hold as much);
// returns the stage with the largest peak total.
static int plan_stages(const Args *a, const GPT2Config *c, int world, PlanBuild b, MemPlan *plans) {
    int worst = 0;
    for (int s = 0; s < a->pp; s++) { plans[s] = gpt2_plan(a, c, moe_options(a), world, s * a->tp * a->cp, b); }
    for (int s = 1; s < a->pp; s++) { if (plans[s].peak_total > plans[worst].peak_total) { worst = s; } }
    return worst;
}

static double gib(double bytes) { return bytes / 1073741824.0; }

// What dominates a category of the plan, in words (for the advice).
static void plan_explain(const Args *a, const GPT2Config *c, int world, int stage, int cat, PlanBuild b, int slots, char *out, size_t n) {
    int dp = world / (a->tp * a->cp * a->pp), accum = a->total_batch / (a->B * a->T * dp), L0, L1;
    stage_layers(c->num_layers, a->pp, stage, &L0, &L1);
    double X = (double)b.floatx, BT = (double)a->B * a->T / a->cp, P = (double)num_parameters(c) / a->pp / a->tp;
    switch (cat) {
    case MEM_PARAMS: snprintf(out, n, "parameters: about P/(pp tp) = %.0fM x %.0f B%s", P / 1e6, X, a->zero == 3 ? " / dp (ZeRO 3)" : ", a full copy on every dp rank"); break;
    case MEM_GRADS: snprintf(out, n, "gradients: about P/(pp tp) = %.0fM x %.0f B%s", P / 1e6, X, a->zero >= 2 ? " / dp (ZeRO 2-3)" : ", a full copy on every dp rank"); break;
    case MEM_OPTIMIZER: snprintf(out, n, "AdamW m, v%s: %d B per parameter%s", b.floatx == 2 ? " and fp32 master weights" : "", b.floatx == 2 ? 12 : 8,
                                 a->zero >= 1 ? " / dp (ZeRO 1-3)" : " for every parameter of the stage (ZeRO 0)"); break;
    case MEM_ACTIVATIONS: snprintf(out, n, "activations: %d micro-batch(es)%s of B %d x T/cp %.0f tokens in flight on stage %d (%s, %d micro-batches), %d layers each%s%s",
                                   slots, a->vpp > 1 ? " x model chunks" : "", a->B, BT / a->B, stage, a->pp_schedule, accum, L1 - L0,
                                   a->tp > 1 && !a->sp ? ", the LayerNorm/residual part replicated over tp (no --sp)" : "", strcmp(a->recompute, "none") ? "" : ", nothing recomputed"); break;
    case MEM_LOGITS: snprintf(out, n, "logits: %s x Vp/tp = %d x %d x %.0f B", a->ce_chunk == 0 ? "all B*T/cp tokens (--ce-chunk 0)" : "one CE chunk",
                              a->ce_chunk == 0 || a->ce_chunk > BT ? (int)BT : a->ce_chunk, c->padded_vocab_size / a->tp, X); break;
    case MEM_COMM: snprintf(out, n, "comm buffers: MoE dispatch rows, the cp ring's k, v, or pipeline gradient copies"); break;
    default: snprintf(out, n, "workspace: %s", b.cuda && a->cp == 1 ? "cuBLAS attention scores (NH/tp, T, T) in fp32 and floatX, and the layers' scratch"
                                                                    : "one layer's scratch (B*T, 4C/tp)"); break;
    }
}

// Seconds per step of a layout, from stated assumptions: FLOP rate per rank, the link bandwidth of each
// group (tp, cp, ep inside a node; pp, dp across nodes), the pipeline bubble, and a fixed cost per layer
// and micro-batch (launches, latencies: smaller micro-batches are slower). A ranking, not a forecast.
#define PLAN_FLOPS 200e12     // achieved per rank (about 20% of an H200's dense bf16 peak: what the GPU check measured)
#define PLAN_NODE_BW 300e9    // bytes/s per rank inside a node (NVLink)
#define PLAN_NET_BW 40e9      // bytes/s per rank across nodes
#define PLAN_LAYER_COST 50e-6 // seconds per layer and micro-batch, forward and backward
#define PLAN_FLASH_SLOWER 3.0 // --attention flash: its attention FLOPs at a third of the rate (H200, T 4096: 3.5x the cuBLAS path's
                              // time, measured for the WMMA kernels; the mma ones are yet to be timed)
static double plan_seconds(const Args *a, const GPT2Config *c, int world, PlanBuild b) {
    int dp = world / (a->tp * a->cp * a->pp), accum = a->total_batch / (a->B * a->T * dp);
    double L = c->num_layers, C = c->channels, T = a->T, tokens = (double)a->total_batch, X = (double)b.floatx;
    double P = (double)num_parameters(c), recompute = !strcmp(a->recompute, "full") ? 4.0 / 3 : !strcmp(a->recompute, "mlp") ? 1.1 : 1.0;
    double flash = !strcmp(a->attention, "flash") && attention_flash_applies(c->channels / c->num_heads, b.floatx) ? PLAN_FLASH_SLOWER : 1.0;
    double flops = (6.0 * P + 6.0 * L * C * T * flash) * tokens * recompute;   // weights, plus causal attention (12 L C T / 2 per token)
    double compute = flops / (world * PLAN_FLOPS);
    double bubble = a->pp > 1 ? (a->pp - 1.0) / (a->vpp * accum + a->pp - 1.0) : 0.0;
    double BTl = (double)a->B * a->T / a->cp, Pl = P / (a->tp * a->pp);
    double tp_bytes = a->tp > 1 ? accum * (L / a->pp) * 8.0 * (a->tp - 1.0) / a->tp * BTl * C * X : 0;
    double cp_bytes = a->cp > 1 ? accum * (L / a->pp) * (3.0 * a->cp - 2) * BTl * 2 * C / a->tp * X : 0;
    double pp_bytes = a->pp > 1 ? accum * 2.0 * a->vpp * BTl * C / a->tp * X : 0;
    double dp_bytes = dp > 1 ? (a->zero >= 2 ? (accum + 1.0) : 2.0) * (dp - 1.0) / dp * Pl * X * (a->zero == 3 ? 2.0 : 1.0) : 0;
    double comm = (tp_bytes + cp_bytes) / PLAN_NODE_BW + (pp_bytes + dp_bytes) / PLAN_NET_BW;
    double fixed = accum * (L / a->pp) * PLAN_LAYER_COST;
    return (compute + fixed) / (1.0 - bubble) + comm;
}

typedef struct { char what[96]; Args args; double peak; double seconds; int fits; } Lever;

// One lever's layout, if it runs: its worst stage's peak and its time.
static int try_lever(Lever *lv, const Args *base, const GPT2Config *c, int world, PlanBuild b, double limit, const char *what) {
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
static int plan_levers(const Args *a, const GPT2Config *c, int world, PlanBuild b, double limit, Lever *out, int pairs_of) {
    int n = 0;
    #define LEVER(cond, what, change) do { if (cond) { Lever lv; lv.args = *a; { Args *x = &lv.args; change; } if (try_lever(&lv, a, c, world, b, limit, what)) { out[n++] = lv; } } } while (0)
    char w[96];
    if (a->zero < 3) { snprintf(w, sizeof(w), "--zero %d", a->zero + 1); LEVER(1, w, x->zero = a->zero + 1); }
    LEVER(a->tp > 1 && !a->sp, "--sp", x->sp = 1);
    snprintf(w, sizeof(w), "--tp %d --sp", 2 * a->tp); LEVER(1, w, { x->tp = 2 * a->tp; x->sp = 1; });
    snprintf(w, sizeof(w), "--pp %d", 2 * a->pp); LEVER(1, w, x->pp = 2 * a->pp);
    LEVER(!strcmp(a->pp_schedule, "gpipe"), "--pp-schedule 1f1b", x->pp_schedule = "1f1b");
    snprintf(w, sizeof(w), "--cp %d", 2 * a->cp); LEVER(1, w, x->cp = 2 * a->cp);
    LEVER(a->ce_chunk == 0, "--ce-chunk 256", x->ce_chunk = 256);
    if (a->ce_chunk > 64) { snprintf(w, sizeof(w), "--ce-chunk %d", a->ce_chunk / 2); LEVER(1, w, x->ce_chunk = a->ce_chunk / 2); }
    LEVER(b.cuda && a->cp == 1 && strcmp(a->attention, "flash") && attention_flash_applies(c->channels / c->num_heads, b.floatx),
          "--attention flash", x->attention = "flash");
    LEVER(!strcmp(a->recompute, "none"), "--recompute mlp", x->recompute = "mlp");
    LEVER(strcmp(a->recompute, "full"), "--recompute full", x->recompute = "full");
    if (a->B % 2 == 0) { snprintf(w, sizeof(w), "-b %d (twice the accumulation)", a->B / 2); LEVER(1, w, x->B = a->B / 2); }
    if (c->num_experts > 0) { snprintf(w, sizeof(w), "--ep %d", 2 * a->ep); LEVER(1, w, x->ep = 2 * a->ep); }
    #undef LEVER
    if (pairs_of) {   // no single lever fits: each pair of them (the second applied on top of the first)
        int singles = n;
        for (int i = 0; i < singles; i++) {
            Lever more[16];
            int k = plan_levers(&out[i].args, c, world, b, limit, more, 0);
            for (int j = 0; j < k && n < 256; j++) {
                if (!strcmp(more[j].what, out[i].what)) { continue; }
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

// Prints the plan of every stage and, with a limit, whether each fits; over the limit, what dominates
// and the levers. Returns 1 if every rank fits (or there is no limit).
static int plan_report(const Args *a, const GPT2Config *c, int world, double limit) {
    PlanBuild b = plan_build(a);
    MemPlan *plans = (MemPlan *)malloc_check(sizeof(MemPlan) * a->pp);
    int worst = plan_stages(a, c, world, b, plans), accum = a->total_batch / (a->B * a->T * a->dp);
    double reserve = plan_reserve(b);
    printf("memory plan: L %d C %d NH %d Vp %d%s, world %d = tp %d x cp %d x pp %d x dp %d, B %d T %d x %d micro-batches, zero %d%s, "
           "%s%s, recompute %s, ce chunk %d; %s\n", c->num_layers, c->channels, c->num_heads, c->padded_vocab_size,
           c->num_experts ? " (MoE)" : "", world, a->tp, a->cp, a->pp, a->dp, a->B, a->T, accum, a->zero, a->sp ? ", sp" : "",
           a->pp_schedule, a->vpp > 1 ? " (vpp)" : "", a->recompute, a->ce_chunk, b.name);
    printf("%-5s", "stage");
    for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11s", mem_category_names[k]); }
    printf(" | %10s  (peak MiB per rank)\n", "peak total");
    for (int s = 0; s < a->pp; s++) {
        printf("%-5d", s);
        for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11.1f", plans[s].peak[k] / 1048576.0); }
        printf(" | %10.1f\n", plans[s].peak_total / 1048576.0);
        // the stage's last (tp, cp, dp) position: the same, or a row of its own
        int last = s * a->tp * a->cp + (a->tp - 1) + a->tp * (a->cp - 1) + a->tp * a->cp * a->pp * (a->dp - 1);
        MemPlan other = gpt2_plan(a, c, moe_options(a), world, last, b);
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
    int fits = 1;
    if (limit > 0) {
        double need = (double)plans[worst].peak_total + reserve;
        fits = need <= limit;
        printf("limit %.2f GiB per rank%s: stage %d needs %.2f GiB: %s\n", gib(limit),
               reserve > 0 ? " (1.00 GiB of it assumed for the CUDA context and NCCL)" : "", worst, gib(need), fits ? "fits" : "does NOT fit");
    }
    if (!fits) {
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
        printf("levers (%s; world %d and -d %d fixed, so tp, cp or pp x2 halves dp; time per step from %.0f TFLOP/s per rank, %.0f GB/s "
               "inside a node (tp, cp), %.0f GB/s across (pp, dp), %.0f us per layer and micro-batch, the bubble, flash attention %.0fx slower), "
               "fits first, then fastest:\n", any ? "one at a time" : "no single lever fits: pairs", world, a->total_batch, PLAN_FLOPS / 1e12,
               PLAN_NODE_BW / 1e9, PLAN_NET_BW / 1e9, PLAN_LAYER_COST * 1e6, PLAN_FLASH_SLOWER);
        for (int i = 0; i < n && i < 12; i++) {
            printf("  %-8s %9.3f GiB  %10.2f ms/step  %s\n", levers[i].fits ? "fits" : "too big", gib(levers[i].peak), levers[i].seconds * 1e3, levers[i].what);
        }
        for (int i = 0; i < n; i++) {   // machine-readable, for tests: "lever rank fits peak_bytes seconds what"
            printf("lever %d %d %.0f %.6f %s\n", i, levers[i].fits, levers[i].peak, levers[i].seconds, levers[i].what);
        }
        if (n == 0) { printf("  (no lever applies to this layout)\n"); }
        printf("  (this layout: %.2f ms/step)\n", plan_seconds(a, c, world, b) * 1e3);
        free(levers);
    }
    fflush(stdout);
    free(plans);
    return fits;
}


// ----------------------------------------------------------------------------
// main: set-up (model, data), the training loop, the reports

// The MoE shape given by the flags (--experts, --topk, --moe-every) against the model's: a MoE model
// (file, checkpoint, descriptor with E=) must agree with every flag given; a dense descriptor or file
// becomes a MoE model of that shape (a file: upcycled, each expert a copy of its layer's MLP), except
// when resuming (a checkpoint keeps its shape). Returns the weights (params, or a new array).
static float *apply_moe_flags(const Args *a, int rank, GPT2Config *c, float *params, const char *what, int resuming) {
    if (a->experts < 0 && a->topk < 0 && a->moe_every < 0) { return params; }
    if (c->num_experts > 0 || resuming) {
        int given[3] = {a->experts, a->topk, a->moe_every}, has[3] = {c->num_experts, c->topk, c->moe_every};
        static const char *flag[3] = {"--experts", "--topk", "--moe-every"}, *name[3] = {"E", "k", "every"};
        for (int i = 0; i < 3; i++) {
            if (given[i] >= 0 && given[i] != has[i]) {
                fail_all(rank, "%s %d, but %s has %s = %d%s", flag[i], given[i], what, name[i], has[i],
                         resuming ? " (a checkpoint resumes with its own shape)" : "");
            }
        }
        return params;
    }
    if (a->experts < 0) { fail_all(rank, "--topk and --moe-every need --experts E (or a MoE model)"); }
    GPT2Config moe = *c;
    moe.num_experts = a->experts; moe.topk = a->topk > 0 ? a->topk : 1; moe.moe_every = a->moe_every > 0 ? a->moe_every : 1;
    if (!config_valid(&moe)) {
        fail_all(rank, "--experts %d --topk %d --moe-every %d: need 1 <= k <= E <= %d and 1 <= every <= L = %d",
                 moe.num_experts, moe.topk, moe.moe_every, MOE_MAX_EXPERTS, c->num_layers);
    }
    float *out = params ? upcycle_dense(c, params, &moe, a->seed, 0) : NULL;
    if (params && rank == 0) { printf("%s: dense model upcycled to %d experts (each a copy of its layer's MLP), top-%d, every %d layers\n", what, moe.num_experts, moe.topk, moe.moe_every); }
    free(params);
    *c = moe;
    return out;
}

// The model's weights (host fp32, file order) and shape: from the newest checkpoint in -o when
// resuming (*resume_step >= 0), else from a model file, else a descriptor with random init.
// Before allocating: this rank's planned peak against --memory-limit (on CUDA, without one: the free device
// memory, less the reserve the plan assumes for the CUDA context and NCCL). If any rank does not fit, every
// rank stops; rank 0 prints the plan and the levers first.
static void check_memory_fits(const Args *a, const GPT2Config *c, Grid *g) {
    PlanBuild b = plan_build(a);
    double limit = a->memory_limit > 0 ? a->memory_limit : device_free_bytes();
    if (limit <= 0) { return; }
    MemPlan mine = gpt2_plan(a, c, moe_options(a), g->world_size, g->rank, b);
    double need = (double)mine.peak_total + (a->memory_limit > 0 ? plan_reserve(b) : 0.0);
    int over = need > limit ? 1 : 0;
    WATCHED("all-reduce (memory plan)", "world", MPI_Allreduce(MPI_IN_PLACE, &over, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (!over) { return; }
    Args shown = *a;
    if (g->rank == 0) { plan_report(&shown, c, g->world_size, limit); }
    fail_all(g->rank, "the planned peak of a rank exceeds %s %.2f GiB: see the plan and the levers above (or --plan %d to explore)",
             a->memory_limit > 0 ? "--memory-limit" : "the free device memory", gib(limit), g->world_size);
}

// The layout checked against the model, the grid, and the memory plan (before any allocation: the plan,
// and the advice if it does not fit).
static void setup_grid(Args *a, const GPT2Config *c, Grid *g, int world, int rank) {
    validate_layout(a, c, world, rank);
    grid_init(g, a->tp, a->cp, a->pp, a->ep);
    grid_print(g);
    check_memory_fits(a, c, g);
}

// The model's shape without its weights (a plan, or the memory check before the weights are made):
// the descriptor, or the file's header; the same errors as load_model.
static void plan_config(Args *a, int rank, GPT2Config *config) {
    int desc = parse_descriptor(a->model, config);
    if (desc < 0) {
        fail_all(rank, "-e '%s' is a malformed model descriptor (expected dN or L=..,C=..,NH=..,V=..,maxT=..[,Vp=..][,E=..,k=..,every=..], "
                 "each key once, 1 <= k <= E)", a->model);
    }
    if (desc == 0) {
        int h[256];
        size_t es;
        fclose(open_model_file(a->model, config, h, &es));
    }
    apply_moe_flags(a, rank, config, NULL, desc == 1 ? "the descriptor" : a->model, 0);
}

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
    if (desc < 0) {
        fail_all(rank, "-e '%s' is a malformed model descriptor (expected dN or L=..,C=..,NH=..,V=..,maxT=..[,Vp=..][,E=..,k=..,every=..], "
                 "each key once, 1 <= k <= E)", a->model);
    }
    if (*resume_step >= 0) {
        char path[PATH_LEN];
        path_join(path, a->output_dir, "model_%08d.bin", *resume_step);
        return apply_moe_flags(a, rank, config, read_model_file(path, config), "the checkpoint", 1);
    }
    if (desc == 1) {
        apply_moe_flags(a, rank, config, NULL, "the descriptor", 0);
        return random_init(config, a->seed);
    }
    return apply_moe_flags(a, rank, config, read_model_file(a->model, config), a->model, 0);
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
        char tok_path[PATH_LEN];
        if (snprintf(tok_path, sizeof(tok_path), "%s", train->files.gl_pathv[0]) >= (int)sizeof(tok_path)) { tok_path[0] = '\0'; }
        char *slash = strrchr(tok_path, '/');
        snprintf(slash ? slash + 1 : tok_path, sizeof(tok_path) - (slash ? slash + 1 - tok_path : 0), "tokenizer.bin");
        if (access(tok_path, R_OK) == 0) { tokenizer_init(tok, tok_path); }
        if (tok->init_ok && (int)tok->vocab_size != config->vocab_size) {   // its table would print other tokens
            if (grid->rank == 0) {
                printf("warning: %s has %u tokens, the model %d: samples are printed as token ids\n", tok_path, tok->vocab_size, config->vocab_size);
            }
            tokenizer_free(tok);
            memset(tok, 0, sizeof(*tok));
        }
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
        if (g->pp > 1) {   // 1F1B: pp - stage, GPipe: all of them; interleaved: (micro-batch, chunk) pairs
            int *alive = (int *)malloc_check(sizeof(int) * g->world_size);
            MPI_Gather(&m->pipe.nslots, 1, MPI_INT, alive, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (g->rank == 0) {
                printf("pipeline (%s, %d micro-batches): %s of activations alive per stage:", a->pp_schedule, accum,
                       m->V > 1 ? "(micro-batch, model chunk) pairs" : "micro-batches");
                for (int s = 0; s < g->pp; s++) { printf(" %d", alive[s * g->tp * g->cp]); }
                printf("\n");
            }
            free(alive);
        }
    }
}

// The pipeline bubble of each stage: time waiting on the neighbour stages / step time, averaged
// over the timed steps, next to the ideal (pp-1)/(V*m+pp-1) (V = 1 but interleaved).
static void report_bubble(const Args *a, Grid *g, double bubble_sum, int steps, int accum) {
    double mine = bubble_sum / steps, *all = (double *)malloc_check(sizeof(double) * g->world_size);
    MPI_Gather(&mine, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (g->rank == 0) {
        int V = a->vpp;
        printf("pipeline bubble (%s, %d micro-batches): measured time waiting on the neighbour stages / step time, ideal (pp-1)/(%sm+pp-1) = %.3f\n",
               a->pp_schedule, accum, V > 1 ? "V*" : "", (double)(g->pp - 1) / (V * accum + g->pp - 1));
        for (int s = 0; s < g->pp; s++) { printf("  stage %d: %.3f\n", s, all[s * g->tp]); }   // (tp 0, dp 0) rank of each stage
    }
    free(all);
}

// main.log lines: every write and flush checked (a full disk stops the run, never a torn log)
static void log_printf(FILE *f, const char *fmt, ...) {
    if (f == NULL) { return; }
    va_list ap;
    va_start(ap, fmt);
    int n = vfprintf(f, fmt, ap);
    va_end(ap);
    if (n < 0 || fflush(f) != 0) { fail("cannot write to main.log (disk full?): the run stops rather than leave a torn log"); }
}

// The start-up lines: the model, the MoE layers, the batch and the layout.
static void print_setup(const Args *a, const GPT2 *m, int accum) {
    const GPT2Config *c = &m->config;
    if (m->grid->rank != 0) { return; }
    printf("model: L %d C %d NH %d V %d (padded %d) maxT %d, %zu parameters, %s\n", c->num_layers, c->channels,
           c->num_heads, c->vocab_size, c->padded_vocab_size, c->max_seq_len, m->num_parameters, PRECISION_NAME);
    if (c->num_experts > 0) {
        printf("moe: %d of %d layers (every %d), %d experts, top-%d, capacity factor %.3f (%d per expert and sequence%s), drop %s, "
               "aux %g, z %g; ep %d (%d experts per rank), edp %d\n", num_moe_layers(c), c->num_layers, c->moe_every,
               c->num_experts, c->topk, a->cap1000 / 1000.0, m->moe_cap, a->cap1000 == 0 ? ", dropless" : "",
               a->drop_policy, a->aux_coeff, a->z_coeff, m->grid->ep, m->El, m->grid->edp_group.size);
    }
    printf("batch: B %d T %d, dp %d, grad accumulation %d -> %d tokens per step; zero %d, tp %d%s, cp %d, pp %d (%s), ce chunk %d, recompute %s\n",
           a->B, a->T, m->grid->dp, accum, a->total_batch, a->zero, a->tp, a->sp ? " + sp" : "", a->cp, a->pp, a->pp_schedule, a->ce_chunk, a->recompute);
}

// One step's line on the screen and in main.log: the CE loss (trl), and for MoE models aux, z and the
// dropped fraction; a skipped update says so.
static void log_step(const Args *a, GPT2 *m, FILE *logf, int step, int max_steps, int accum, float loss, float norm, float lr, double ms) {
    int moe = m->config.num_experts > 0, skipped = m->skips_in_a_row > 0;
    double aux = 0, z = 0, dropped = 0;
    if (moe) { gpt2_moe_stats(m, accum, &aux, &z, &dropped); }
    if (m->grid->rank != 0) { return; }
    printf("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s", step + 1, max_steps, loss, norm, lr, ms,
           a->total_batch / (ms / 1e3));
    if (moe) { printf(" | aux %.4f z %.4f dropped %.4f", aux, z, dropped); }
    if (skipped) { printf(" | non-finite: update skipped (%d in a row)", m->skips_in_a_row); }
    printf("\n");
    log_printf(logf, "s:%d trl:%.6f\n", step, loss);
    if (moe) { log_printf(logf, "s:%d aux:%.6f\ns:%d z:%.6f\ns:%d drop:%.6f\n", step, aux, step, z, step, dropped); }
    if (skipped) { log_printf(logf, "s:%d skip:loss %g norm %g\n", step, loss, norm); }
    fflush(stdout);
}

// The timed steps (all but the first of the run): their time, and the shares of it spent waiting on
// the pipeline neighbours (the bubble) and in the MoE all-to-alls.
typedef struct { double total_ms, bubble, a2a; int steps; } StepTimes;

static void step_times_add(StepTimes *t, const GPT2 *m, double ms) {
    t->total_ms += ms;
    t->steps++;
    t->bubble += m->pipe.wait_seconds / (ms / 1e3);
    t->a2a += m->moe_a2a_seconds / (ms / 1e3);
}

static void report_times(const Args *a, GPT2 *m, const StepTimes *t, int accum) {
    Grid *g = m->grid;
    if (t->steps == 0) { return; }
    if (g->rank == 0) { printf("average step: %.1f ms, %.0f tok/s\n", t->total_ms / t->steps, a->total_batch / (t->total_ms / t->steps / 1e3)); }
    if (a->comm_report && g->pp > 1) { report_bubble(a, g, t->bubble, t->steps, accum); }
    if (m->moe_time_a2a) {
        double mean = t->a2a / t->steps, most = mean;
        comm_sum_host(&g->world, &mean, 1);
        MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (g->rank == 0) {
            printf("MoE all-to-all (ep %d, the device synchronised around each): %.1f%% of the step time on average over the ranks, %.1f%% at most\n",
                   g->ep, 100.0 * mean / g->world_size, 100.0 * most);
        }
    }
}

// Every rank must hold the same model and read the same data: a hash of the model's shape and
// weights, and of the data files (names, sizes, first tokens), compared with rank 0's.
static void agree_on_inputs(const GPT2Config *c, const float *params, const DataLoader *train, int rank, int world) {
    uint64_t mine[2] = {0, 0}, ref[2];
    mine[0] = crc32_update(crc32_update(0, c, sizeof(*c)), params, num_parameters(c) * sizeof(float));
    if (train && !train->in_memory) {
        uint32_t h = 0;
        for (int i = 0; i < train->nshards; i++) {
            h = crc32_update(h, train->files.gl_pathv[i], strlen(train->files.gl_pathv[i]));
            h = crc32_update(h, &train->shard_rounds[i], sizeof(int));
        }
        mine[1] = h;
    }
    memcpy(ref, mine, sizeof(ref));
    WATCHED("broadcast of the inputs' hashes", "world", MPI_Bcast(ref, 2 * 8, MPI_BYTE, 0, MPI_COMM_WORLD));
    int differ[2] = {mine[0] != ref[0] ? rank : world, mine[1] != ref[1] ? rank : world};
    WATCHED("all-reduce (inputs agree)", "world", MPI_Allreduce(MPI_IN_PLACE, differ, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (differ[0] < world || differ[1] < world) {
        fprintf(stderr, "error: rank %d: the %s on rank %d differs from rank 0's (every rank must read the same files)\n", rank,
                differ[0] < world ? "model (-e or the checkpoint)" : "training data (-i: file names or sizes)", differ[0] < world ? differ[0] : differ[1]);
        MPI_Finalize();
        exit(1);
    }
}

// -o DIR is this run's alone: rank 0 holds an flock() on DIR/.lock for the run's lifetime (the kernel
// releases it when the process dies, so a resume after kill -9 is never refused), and a second run on
// the same DIR stops, naming the holder.
static void lock_output_dir(const char *dir, int rank) {
    char msg[PATH_LEN + 512] = "";
    if (rank == 0) {
        char path[PATH_LEN];
        path_join(path, dir, ".lock");
        int fd = open(path, O_RDWR | O_CREAT, 0644);
        if (fd < 0) { snprintf(msg, sizeof(msg), "cannot open '%s'", path); }
        else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            char holder[256] = "";
            ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
            holder[n > 0 ? n : 0] = '\0';
            holder[strcspn(holder, "\n")] = '\0';
            snprintf(msg, sizeof(msg), "-o '%s' is in use by another run (%s); wait for it, or use another directory", dir, holder[0] ? holder : "unknown");
        } else {   // ours until this process ends: the descriptor stays open
            char host[128] = "?", line[256];
            gethostname(host, sizeof(host) - 1);
            int len = snprintf(line, sizeof(line), "pid %d on %s since %ld\n", (int)getpid(), host, (long)time(NULL));
            if (ftruncate(fd, 0) != 0 || pwrite(fd, line, len, 0) != len) { snprintf(msg, sizeof(msg), "cannot write '%s'", path); }
        }
    }
    WATCHED("broadcast (lock)", "world", MPI_Bcast(msg, sizeof(msg), MPI_CHAR, 0, MPI_COMM_WORLD));
    if (msg[0]) { fail_all(rank, "%s", msg); }
}

// main.log, rank 0. A resumed run first drops the lines of the steps at and after the resumed one (a
// run killed after the checkpoint logged them), so the log equals an uninterrupted run's; every write
// and flush is checked (a full disk stops the run, never a torn log).
static FILE *open_log(const char *dir, int resume_step) {
    char path[PATH_LEN], tmp[PATH_LEN + 8];
    path_join(path, dir, "main.log");
    if (resume_step > 0 && access(path, R_OK) == 0) {
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *in = fopen_check(path, "r"), *out = fopen_check(tmp, "w");
        char line[1024];
        while (fgets(line, sizeof(line), in)) {
            int s;
            if (sscanf(line, "s:%d ", &s) == 1 && s >= resume_step) { continue; }
            if (fputs(line, out) < 0) { fail("cannot write '%s' (disk full?)", tmp); }
        }
        fclose(in);
        if (fflush(out) != 0 || fsync(fileno(out)) != 0) { fail("cannot write '%s' (disk full?)", tmp); }
        fclose_check(out, tmp);
        if (rename(tmp, path) != 0) { fail("cannot rename '%s' to '%s'", tmp, path); }
    }
    return fopen_check(path, resume_step > 0 ? "a" : "w");
}

// Test hook: TRAIN_GPT_INJECT_NAN=STEP:COUNT poisons one gradient element at steps STEP .. STEP+COUNT-1
// (the update must then be skipped, and COUNT > --max-skips must stop the run).
static void inject_nan_for_test(GPT2 *m, int step) {
    static int first = -2, count = 0;
    if (first == -2) {
        const char *e = getenv("TRAIN_GPT_INJECT_NAN");
        first = -1;
        if (e && sscanf(e, "%d:%d", &first, &count) != 2) { first = -1; }
    }
    if (first < 0 || step < first || step >= first + count || m->grid->rank != 0) { return; }
    Zero *z = &m->zero;
    float nan = NAN;
    upload_floats(z->stage < 2 ? z->grads : z->grads_shard, &nan, 1);
}

#ifndef TESTING
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    Args args;
    default_args(&args);
    parse_args(argc, argv, &args);
    watchdog_start(args.timeout, rank);   // from here a stalled peer stops this rank
    signals_install();
    agree_on_args(&args, rank, world);
    attention_path = attention_path_of(&args);
    if (args.plan) {   // the memory plan for --plan N ranks, on one process: no weights, no device, no data
        GPT2Config config;
        plan_config(&args, rank, &config);
        validate_layout(&args, &config, args.plan, rank);
        if (rank == 0) { plan_report(&args, &config, args.plan, args.memory_limit); }
        MPI_Finalize();
        return 0;
    }
    if (args.resume && args.output_dir == NULL) { fail_all(rank, "-y needs an output dir (-o)"); }

    // the model, the grid, this rank's part of the model. A fresh run's shape alone says whether it fits:
    // it is checked before the weights are made (a resumed one's shape is in its checkpoint).
    GPT2Config config;
    Grid grid;
    if (!args.resume) { plan_config(&args, rank, &config); setup_grid(&args, &config, &grid, world, rank); }
    int resume_step;
    float *params = load_model(&args, rank, &config, &resume_step);
    if (args.resume) { setup_grid(&args, &config, &grid, world, rank); }
    DataLoader train_loader, val_loader;   // (checked before anything is written)
    Tokenizer tokenizer;
    int have_val = setup_data(&args, &config, &grid, &train_loader, &val_loader, &tokenizer);
    agree_on_inputs(&config, params, &train_loader, rank, world);
    if (args.output_dir) { check_output_dir(args.output_dir, rank); lock_output_dir(args.output_dir, rank); }
    if (args.trace_dir) { check_output_dir(args.trace_dir, rank); }
    trace_open(args.trace_dir, rank);
    GPT2 model;
    gpt2_build(&model, &config, params, &grid, args.vpp, args.zero, args.sp, moe_options(&args));
    free(params);
    model.recompute = recompute_mode(args.recompute);
    model.zero.prefetch = args.overlap;
    int accum = args.total_batch / (args.B * args.T * grid.dp);
    gpt2_alloc_activations(&model, args.B, args.T / args.cp, args.ce_chunk, accum, pipe_schedule(args.pp_schedule), args.sample_every > 0);
    print_setup(&args, &model, accum);

    // schedule, optimizer, and the state of a resumed run
    int steps_per_epoch = (int)(train_loader.rounds_per_epoch / accum);
    int max_steps = args.max_steps >= 0 ? args.max_steps : (steps_per_epoch > 0 ? steps_per_epoch : 1);
    LRScheduler sched = {args.scheduler, args.lr, args.final_frac, args.warmup, max_steps};
    OptConfig opt = {0.9f, 0.95f, 1e-8f, args.weight_decay, args.grad_clip, args.seed};
    Rng sample_rng;
    rng_init(&sample_rng, args.seed + 1);
    int start_step = resume_step >= 0 ? resume_step : 0;
    if (resume_step >= 0) {
        load_state(&model, args.output_dir, resume_step, &train_loader, &sample_rng, args.total_batch);
        if (rank == 0) { printf("resumed from step %d of %s\n", resume_step, args.output_dir); }
    }
    FILE *logf = args.output_dir && rank == 0 ? open_log(args.output_dir, start_step) : NULL;
    int eot = tokenizer.init_ok ? tokenizer.eot_token : config.vocab_size - 1;

    // the training loop
    StepTimes times;
    memset(&times, 0, sizeof(times));
    model.moe_time_a2a = args.comm_report && config.num_experts > 0;
    model.pipe.time_waits = args.comm_report || args.trace_dir != NULL;
    int step = start_step, saved = -1;
    for (; step < max_steps; step++) {
        if (have_val && args.val_every > 0 && step % args.val_every == 0) {
            float vl = gpt2_validate(&model, &val_loader, args.val_batches);
            if (rank == 0) { printf("val loss %.6f\n", vl); log_printf(logf, "s:%d tel:%.6f\n", step, vl); }
        }
        if (args.sample_every > 0 && step > 0 && step % args.sample_every == 0) {
            gpt2_sample(&model, &tokenizer, &sample_rng, args.gen_tokens, eot);
        }
        comm_reset_counters(&grid);
        model.pipe.wait_seconds = model.moe_a2a_seconds = 0.0;
        trace_begin();
        double t0 = wall_seconds();
        gpt2_forward_backward(&model, &train_loader, accum);
        inject_nan_for_test(&model, step);
        float lr = lr_at(&sched, step);
        StepResult r = gpt2_update(&model, &opt, lr, step);
        device_synchronize();
        double ms = (wall_seconds() - t0) * 1e3;
        trace_end("step", "step", "\"step\":%d,\"pipeline_wait_ms\":%.3f", step, model.pipe.wait_seconds * 1e3);
        if (step > start_step) { step_times_add(&times, &model, ms); }
        log_step(&args, &model, logf, step, max_steps, accum, r.loss, r.norm, lr, ms);
        if (model.skips_in_a_row >= args.max_skips) {
            fail_all(rank, "step %d: %d updates in a row skipped for a non-finite loss or gradient norm (--max-skips %d); the parameters "
                     "are those before step %d, and no checkpoint holds a non-finite value", step + 1, model.skips_in_a_row, args.max_skips,
                     step + 2 - model.skips_in_a_row);
        }
        if (step == start_step) { report_first_step(&args, &model, accum); }
        if (args.checkpoint_every > 0 && (step + 1) % args.checkpoint_every == 0) {
            save_checkpoint(&model, args.output_dir, step + 1, &train_loader, &sample_rng, args.total_batch, args.async_checkpoint);
            saved = step + 1;
        } else if (rank == 0) {
            checkpoint_done(0);   // an asynchronous write finished since: mark it DONE now
        }
        // a stop asked for by a signal, on any rank: all ranks agree here, write a checkpoint and exit 0
        int stop = stop_signal;
        WATCHED("all-reduce (stop request)", "world", MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
        if (stop && step + 1 < max_steps) {
            if (args.output_dir && saved != step + 1) { save_checkpoint(&model, args.output_dir, step + 1, &train_loader, &sample_rng, args.total_batch, 0); }
            if (rank == 0) { checkpoint_done(1); }
            if (rank == 0) {
                printf("stopped by %s after step %d: %s\n", signal_name(stop), step + 1,
                       args.output_dir ? "checkpoint written, resume with -y 1" : "no -o, so no checkpoint");
            }
            step = max_steps + 1;   // (no final validation or sample)
        }
    }

    // the end: validation, a sample, the timings
    if (step == max_steps) {
        if (args.memory_report && max_steps == start_step) { mem_report(rank, world, "set up, no step run (-x 0)"); }
        if (have_val && args.val_every > 0 && max_steps > start_step) {
            float vl = gpt2_validate(&model, &val_loader, args.val_batches);
            if (rank == 0) { printf("val loss %.6f\n", vl); log_printf(logf, "s:%d tel:%.6f\n", max_steps, vl); }
        }
        if (args.sample_every > 0 && max_steps > start_step) { gpt2_sample(&model, &tokenizer, &sample_rng, args.gen_tokens, eot); }
    }
    if (rank == 0) { checkpoint_done(1); }
    if (args.memory_report && max_steps > start_step) { mem_report(rank, world, "at the end of the run"); }
    report_times(&args, &model, &times, accum);
    if (logf) { fclose_check(logf, "main.log"); }
    trace_close();
    tokenizer_free(&tokenizer);
    dataloader_free(&train_loader);
    if (have_val) { dataloader_free(&val_loader); }
    mem_free_all();
    grid_free(&grid);
    MPI_Finalize();
    return 0;
}
#endif
