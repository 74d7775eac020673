// The model's shape (ModelConfig, every family: GPT-2, Llama and their MoE forms) and its tensors in llm.c's file
// order (TensorSpec: shape, tensor-parallel split, weight decay of each), with what a shape must satisfy: plain
// data and arithmetic, the lowest floor. The file format that stores them is model_file.h's.
#ifndef LLMC_MODEL_CONFIG_H
#define LLMC_MODEL_CONFIG_H

#include <math.h>
#include "utils.h"

// MoE's limits and router scores (moe.h's semantics)
#define MOE_MAX_EXPERTS 256
#define MOE_MAX_SHARED 64
typedef enum { ROUTER_SOFTMAX = 0, ROUTER_SIGMOID = 1 } RouterScore;   // (the model file's numbers)

// RoPE's frequency scaling (rope.h): kind 0: none; kind 1: 'llama3' (transformers' _compute_llama3_parameters)
typedef struct { int kind; float factor, low_freq_factor, high_freq_factor; int original_max_position; } RopeScaling;

// How tensor parallelism cuts a tensor (tensor_parallel.h)
typedef enum { SPLIT_NONE, SPLIT_ROWS, SPLIT_COLS, SPLIT_QKV } SplitKind;

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
    int router_score;       // MoE: the router's scores, ROUTER_SOFTMAX or ROUTER_SIGMOID (moe.h)
    int expert_hidden;      // MoE: H, the hidden width of an expert (routed and shared; 4C unless fine-grained)
    int shared_experts;     // MoE: S always-on experts per MoE layer, run as one MLP of width S*H
    // the family: GPT-2 (LayerNorm, learned positions, GELU MLP, biases, tied head) or Llama (RMSNorm, rotary
    // positions, SwiGLU MLP, grouped-query attention, no biases but Qwen2's q/k/v ones, tied or untied head)
    int arch;               // ARCH_GPT2, ARCH_LLAMA
    int kv_heads;           // KV: the key/value heads (GPT-2: NH); query head h reads kv head h / (NH/KV)
    int ffn_hidden;         // F: the MLP's hidden width (GPT-2: 4C; Llama: SwiGLU's gate and up, each F wide)
    int tied;               // the LM head is wte (GPT-2: always), else a (Vp, C) tensor of its own
    int qkv_bias;           // biases on q, k, v (GPT-2: always, beside its other biases; Llama: Qwen2's)
    float norm_eps;         // the norms' eps (GPT-2's LayerNorm: 1e-5)
    float rope_theta;       // RoPE's base (Llama)
    RopeScaling rope;       // RoPE's rescaled frequencies (Llama 3.1's 'llama3'; kind 0: none)
    // MoE on the Llama body (SwiGLU experts): Mixtral, OLMoE, Qwen2-MoE
    int norm_topk;          // k > 1 gates renormalised to sum 1 (GPT-2's MoE, Mixtral), else the scores (OLMoE, Qwen2-MoE)
    int shared_gate;        // the shared experts' output scaled per token by sigmoid(x . w) (Qwen2-MoE)
    int qk_norm;            // RMSNorm over the whole q and the whole k projection, before RoPE (OLMoE)
    int pad_token;          // Llama family: the padding id (transformers' pad_token_id, nn.Embedding's padding_idx):
                            // its wte row gets no gradient from the embedding (the head's still reaches a tied
                            // one); -1: none. OLMoE's is 1, and its row starts at zero
} ModelConfig;

enum { ARCH_GPT2, ARCH_LLAMA };

// GPT-2's values of the family's fields: KV = NH, F = 4C, tied, biases, LayerNorm's eps.
static void config_gpt2(ModelConfig *c) {
    c->arch = ARCH_GPT2; c->kv_heads = c->num_heads; c->ffn_hidden = 4 * c->channels; c->tied = 1; c->qkv_bias = 1;
    c->norm_eps = 1e-5f; c->rope_theta = 0.0f; c->norm_topk = 1; c->shared_gate = 0; c->qk_norm = 0;
    c->pad_token = -1;
    memset(&c->rope, 0, sizeof(c->rope));
}

// Llama's default MLP width for C: LLaMA-2's rule 256 ceil(8C/3/256) (Llama 3's sizes are given explicitly).
static int llama_default_ffn(int C) { return 256 * (int)ceil_div(ceil_div(8 * C, 3), 256); }

enum { T_WTE, T_WPE, T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_ATTPROJW, T_ATTPROJB,
       T_LN2W, T_LN2B, T_FCW, T_FCB, T_FCPROJW, T_FCPROJB, T_LNFW, T_LNFB,
       T_ROUTERW, T_EFCW, T_EFCB, T_EFCPROJW, T_EFCPROJB,
       T_SFCW, T_SFCB, T_SFCPROJW, T_SFCPROJB, T_HEAD, T_SGATEW, T_QNORMW, T_KNORMW, NUM_TENSORS };
__attribute__((unused)) static const char *tensor_names[NUM_TENSORS] = {"wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb",
        "attprojw", "attprojb",
                                                "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
                                                "routerw", "efcw", "efcb", "efcprojw", "efcprojb",
                                                "sfcw", "sfcb", "sfcprojw", "sfcprojb", "head", "sgatew", "qnormw", "knormw"};

static int is_moe_layer(const ModelConfig *c, int l) {
    return c->num_experts > 0 && l % c->moe_every == c->moe_every - 1;
}

static int num_moe_layers(const ModelConfig *c) {
    int n = 0;
    for (int l = 0; l < c->num_layers; l++) { n += is_moe_layer(c, l); }
    return n;
}

// How tensor id is stored: `layers` stacked slices (-1: not per layer) of nblk blocks of (rows, cols),
// cut by tensor parallelism as `split`. The dense MLP tensors hold only the dense layers, the MoE
// tensors only the MoE layers, as nblk = E blocks (one per expert, cut over the ep ranks) of width H;
// the shared experts' (S > 0) one MLP of width S*H per MoE layer, cut over tp like the dense MLP. Weight decay
// on the 2-D matrices. full_grad: replicated over tp but with a complete gradient on every tp rank
// (computed from all tokens even under SP): never summed over tp. SPLIT_QKV (Llama's qkvw, qkvb): the rows
// [q (qrows = NH hs) | k (KV hs) | v (KV hs)], each cut like SPLIT_ROWS (a tp rank's heads of each).
// A tensor the model does not have has 0 rows (Llama: wpe, the biases, the untied head when tied).
typedef struct {
    int layers, nblk;
    size_t rows, cols;
    SplitKind split;
    int decay, experts, full_grad;
    size_t qrows;
} TensorSpec;

// Llama's tensors (the GPT-2 ones it does not have: 0 rows): fcw holds gate and up, 2 blocks of F rows each; a
// MoE layer's experts, SwiGLU without biases, 2E blocks of H rows (expert e: gate 2e, up 2e+1), the shared experts
// one SwiGLU of width S H, their gate (Qwen2-MoE) a (1, C) row; OLMoE's q and k norms over the whole projections.
static TensorSpec tensor_spec_llama(const ModelConfig *c, int id) {
    size_t C = c->channels, hs = C / c->num_heads, Q = c->num_heads * hs, KVw = c->kv_heads * hs, QKV = Q + 2 * KVw;
    size_t F = c->ffn_hidden, Vp = c->padded_vocab_size, bias = c->qkv_bias ? 1 : 0;
    size_t E = c->num_experts, H = c->expert_hidden, SH = (size_t)c->shared_experts * H;
    int L = c->num_layers, Lm = num_moe_layers(c), Ld = L - Lm, Lsh = c->shared_experts > 0 ? Lm : 0;
    int Lg = c->shared_gate ? Lsh : 0, Lq = c->qk_norm ? L : 0;
    switch (id) {
        case T_WTE:      return (TensorSpec){-1, 1, Vp, C, SPLIT_ROWS, 1, 0, 0, 0};          // vocab-parallel
        case T_QKVW:     return (TensorSpec){L, 1, QKV, C, SPLIT_QKV, 1, 0, 0, Q};           // column-parallel heads
        case T_QKVB:     return (TensorSpec){L, 1, QKV * bias, 1, SPLIT_QKV, 0, 0, 0, Q * bias};
        case T_ATTPROJW: return (TensorSpec){L, 1, C, Q, SPLIT_COLS, 1, 0, 0, 0};            // row-parallel
        case T_FCW:      return (TensorSpec){Ld, 2, F, C, SPLIT_ROWS, 1, 0, 0, 0};           // [gate; up], column-par.
        case T_FCPROJW:  return (TensorSpec){Ld, 1, C, F, SPLIT_COLS, 1, 0, 0, 0};           // row-parallel
        case T_ROUTERW:  return (TensorSpec){Lm, 1, E, C, SPLIT_NONE, 1, 0, 1, 0};           // replicated everywhere
        case T_EFCW:     return (TensorSpec){Lm, (int)(2 * E), H, C, SPLIT_ROWS, 1, 1, 0, 0};   // per expert [gate; up]
        case T_EFCPROJW: return (TensorSpec){Lm, (int)E, C, H, SPLIT_COLS, 1, 1, 0, 0};
        case T_SFCW:     return (TensorSpec){Lsh, 2, SH, C, SPLIT_ROWS, 1, 0, 0, 0};         // shared: as the dense MLP
        case T_SFCPROJW: return (TensorSpec){Lsh, 1, C, SH, SPLIT_COLS, 1, 0, 0, 0};
        case T_SGATEW:   return (TensorSpec){Lg, 1, 1, C, SPLIT_NONE, 1, 0, 1, 0};           // complete on every tp rank
        case T_QNORMW:   return (TensorSpec){Lq, 1, 1, Q, SPLIT_COLS, 0, 0, 0, 0};           // a tp rank's heads' part
        case T_KNORMW:   return (TensorSpec){Lq, 1, 1, KVw, SPLIT_COLS, 0, 0, 0, 0};
        case T_LN1W: case T_LN2W: return (TensorSpec){L, 1, 1, C, SPLIT_NONE, 0, 0, 0, 0};
        case T_LNFW:     return (TensorSpec){-1, 1, 1, C, SPLIT_NONE, 0, 0, 0, 0};
        case T_HEAD:     return (TensorSpec){-1, 1, c->tied ? 0 : Vp, C, SPLIT_ROWS, 1, 0, 0, 0};   // vocab-parallel
        default:         return (TensorSpec){-1, 1, 0, 0, SPLIT_NONE, 0, 0, 0, 0};          // (not in the model)
    }
}

static TensorSpec tensor_spec(const ModelConfig *c, int id) {
    if (c->arch == ARCH_LLAMA) { return tensor_spec_llama(c, id); }
    size_t C = c->channels;
    int L = c->num_layers, Lm = num_moe_layers(c), Ld = L - Lm, E = c->num_experts;
    size_t H = c->expert_hidden, SH = (size_t)c->shared_experts * H;
    int Lsh = c->shared_experts > 0 ? Lm : 0;   // (no shared experts: their tensors hold no layer)
    switch (id) {
        // vocab-parallel
        case T_WTE:      return (TensorSpec){-1, 1, (size_t)c->padded_vocab_size, C, SPLIT_ROWS, 1, 0, 0};
        case T_WPE:      return (TensorSpec){-1, 1, (size_t)c->max_seq_len, C, SPLIT_NONE, 1, 0, 0};
        // column-parallel: heads of q, k, v
        case T_QKVW:     return (TensorSpec){L, 3, C, C, SPLIT_ROWS, 1, 0, 0};
        case T_QKVB:     return (TensorSpec){L, 3, C, 1, SPLIT_ROWS, 0, 0, 0};
        case T_ATTPROJW: return (TensorSpec){L, 1, C, C, SPLIT_COLS, 1, 0, 0};       // row-parallel
        case T_FCW:      return (TensorSpec){Ld, 1, 4 * C, C, SPLIT_ROWS, 1, 0, 0};  // column-parallel
        case T_FCB:      return (TensorSpec){Ld, 1, 4 * C, 1, SPLIT_ROWS, 0, 0, 0};
        case T_FCPROJW:  return (TensorSpec){Ld, 1, C, 4 * C, SPLIT_COLS, 1, 0, 0};  // row-parallel
        case T_FCPROJB:  return (TensorSpec){Ld, 1, 1, C, SPLIT_NONE, 0, 0, 0};
        case T_LNFW: case T_LNFB: return (TensorSpec){-1, 1, 1, C, SPLIT_NONE, 0, 0, 0};
        case T_ROUTERW:  return (TensorSpec){Lm, 1, (size_t)E, C, SPLIT_NONE, 1, 0, 1};   // replicated everywhere
        case T_EFCW:     return (TensorSpec){Lm, E, H, C, SPLIT_ROWS, 1, 1, 0};          // per expert, as fcw
        case T_EFCB:     return (TensorSpec){Lm, E, H, 1, SPLIT_ROWS, 0, 1, 0};
        case T_EFCPROJW: return (TensorSpec){Lm, E, C, H, SPLIT_COLS, 1, 1, 0};
        case T_EFCPROJB: return (TensorSpec){Lm, E, 1, C, SPLIT_NONE, 0, 1, 1};          // added once, on tp rank 0
        case T_SFCW:     return (TensorSpec){Lsh, 1, SH, C, SPLIT_ROWS, 1, 0, 0};        // shared: as the dense MLP
        case T_SFCB:     return (TensorSpec){Lsh, 1, SH, 1, SPLIT_ROWS, 0, 0, 0};
        case T_SFCPROJW: return (TensorSpec){Lsh, 1, C, SH, SPLIT_COLS, 1, 0, 0};
        case T_SFCPROJB: return (TensorSpec){Lsh, 1, 1, C, SPLIT_NONE, 0, 0, 1};         // as efcprojb: tp rank 0
        case T_HEAD: case T_SGATEW: case T_QNORMW: case T_KNORMW:   // (Llama's: the untied head, Qwen2-MoE's, OLMoE's)
                         return (TensorSpec){-1, 1, 0, 0, SPLIT_NONE, 0, 0, 0};
        default:         return (TensorSpec){L, 1, 1, C, SPLIT_NONE, 0, 0, 0};           // ln1, ln2, attprojb
    }
}

static size_t tensor_full_size(const ModelConfig *c, int id) {   // all layers
    TensorSpec s = tensor_spec(c, id);
    return (size_t)s.nblk * s.rows * s.cols * (s.layers < 0 ? 1 : (size_t)s.layers);
}

static size_t num_parameters(const ModelConfig *c) {
    size_t n = 0;
    for (int i = 0; i < NUM_TENSORS; i++) { n += tensor_full_size(c, i); }
    return n;
}

// The routing bias of loss-free balancing (moe.h), (Lm, E) fp32: model state, not a parameter (no
// gradient, not in AdamW). A model's host array holds the parameters in file order, then this bias.
static size_t num_router_bias(const ModelConfig *c) { return (size_t)num_moe_layers(c) * c->num_experts; }
static size_t model_floats(const ModelConfig *c) { return num_parameters(c) + num_router_bias(c); }

// Training FLOPs per token (6 per parameter a token passes through, and causal attention's 6 C T) of
// layer l at sequence length T, and of the LM head (6 C Vp): the cost model of --pp-layers auto. A MoE
// layer counts its router and k experts, the experts a token is sent to.
static double layer_flops_per_token(const ModelConfig *c, int l, int T) {
    if (c->arch == ARCH_LLAMA) {   // (every tensor of the layer: tensor_spec's)
        double params = 0;
        for (int id = 0; id < NUM_TENSORS; id++) {
            TensorSpec s = tensor_spec(c, id);
            if (s.layers > 0) { params += (double)s.nblk * s.rows * s.cols; }
        }
        return 6.0 * params + 6.0 * c->channels * T;
    }
    double C = c->channels, mlp = 8.0 * C * C + 5.0 * C;   // fc (4C x C + 4C) and fcproj (C x 4C + C)
    double attention = 4.0 * C * C + 4.0 * C + 4.0 * C;   // qkv, attproj (weights and biases), ln1, ln2
    double H = c->expert_hidden, SH = (double)c->shared_experts * H;
    double expert = 2.0 * C * H + H + C, shared = SH > 0 ? 2.0 * C * SH + SH + C : 0.0;   // width H, S*H
    double params = attention + (is_moe_layer(c, l) ? c->topk * expert + shared + C * c->num_experts : mlp);
    return 6.0 * params + 6.0 * C * T;
}
static double head_flops_per_token(const ModelConfig *c) { return 6.0 * c->channels * c->padded_vocab_size; }

// Which slice of a per-layer tensor belongs to layer l: the dense MLP tensors count only the dense
// layers, the MoE tensors only the MoE layers.
static int is_moe_tensor(int id) { return (id >= T_ROUTERW && id <= T_SFCPROJB) || id == T_SGATEW; }   // (shared too)

static int tensor_layer_slice(const ModelConfig *c, int id, int l) {
    int moe = is_moe_tensor(id);
    if (id == T_FCW || id == T_FCB || id == T_FCPROJW || id == T_FCPROJB || moe) {
        int n = 0;
        for (int i = 0; i < l; i++) { n += is_moe_layer(c, i) == moe; }
        return n;
    }
    return l;
}

// The shapes this program accepts, from a file or a descriptor: positive, C divisible by NH,
// V <= Vp <= 2^20 (Llama 3's 128,256 and Gemma's 256,000 fit; the data shards hold uint16 or uint32 ids),
// sizes whose element counts fit in memory, and
// (MoE) 1 <= k <= E <= MOE_MAX_EXPERTS, 1 <= moe_every <= L, 1 <= H <= 65536, 0 <= S <= MOE_MAX_SHARED;
// (Llama) NH a multiple of KV, an even head size (RoPE's halves), theta and eps finite and positive, a known
// RoPE scaling, no MoE layers yet. Returns what is wrong in words, or NULL.
static const char *config_problem(const ModelConfig *c) {
    if (!(c->max_seq_len > 0 && c->vocab_size > 0 && c->num_layers > 0 && c->num_heads > 0 && c->channels > 0)) {
        return "every size must be positive";
    }
    if (!(c->padded_vocab_size >= c->vocab_size && c->channels % c->num_heads == 0 &&
          c->padded_vocab_size <= 1 << 20 && c->channels <= 16384 && c->max_seq_len <= 1 << 20 && c->num_layers <= 1024)) {
        return "need V <= Vp <= 2^20, NH dividing C <= 16384, maxT <= 2^20, L <= 1024";
    }
    int moe_ok = c->num_experts == 0 ? c->topk == 0 && c->moe_every == 0 && c->expert_hidden == 0 &&
                                           c->shared_experts == 0
                                     : c->num_experts > 0 && c->num_experts <= MOE_MAX_EXPERTS && c->topk >= 1 &&
                                       c->topk <= c->num_experts && c->moe_every >= 1 && c->moe_every <= c->num_layers
                                       && c->expert_hidden >= 1 && c->expert_hidden <= 65536 &&
                                       c->shared_experts >= 0 && c->shared_experts <= MOE_MAX_SHARED;
    if (!moe_ok) { return "need 1 <= k <= E <= 256, 1 <= every <= L, 1 <= H <= 65536, 0 <= S <= 64 (MoE)"; }
    if (c->arch == ARCH_GPT2) {
        int gpt2 = c->kv_heads == c->num_heads && c->ffn_hidden == 4 * c->channels && c->tied == 1 && c->qkv_bias == 1
                   && c->norm_topk == 1 && c->shared_gate == 0 && c->qk_norm == 0;
        gpt2 = gpt2 && c->pad_token == -1;
        return gpt2 ? NULL : "GPT-2 has KV = NH, F = 4C, a tied head, biases, renormalised top-k gates, no QK-norm, no "
                             "padding token";
    }
    if (c->arch != ARCH_LLAMA) { return "the architecture must be 0 (GPT-2) or 1 (Llama)"; }
    if (c->kv_heads < 1 || c->num_heads % c->kv_heads) { return "NH must be a multiple of KV >= 1"; }
    if ((c->channels / c->num_heads) % 2) { return "RoPE needs an even head size C/NH"; }
    if (c->ffn_hidden < 1 || c->ffn_hidden > 1 << 20) { return "need 1 <= F <= 2^20"; }
    if ((c->tied != 0 && c->tied != 1) || (c->qkv_bias != 0 && c->qkv_bias != 1)) { return "tied and qkvbias are 0 or 1"; }
    if (!(isfinite(c->rope_theta) && c->rope_theta > 0 && isfinite(c->norm_eps) && c->norm_eps > 0)) {
        return "theta and eps must be finite and positive";
    }
    const RopeScaling *r = &c->rope;
    if (r->kind != 0 && !(r->kind == 1 && isfinite(r->factor) && r->factor > 0 && isfinite(r->low_freq_factor) &&
                          r->low_freq_factor > 0 && isfinite(r->high_freq_factor) &&
                          r->high_freq_factor > r->low_freq_factor && r->original_max_position > 0)) {
        return "the RoPE scaling must be none (0) or llama3 (1) with factor > 0, 0 < low < high, orig > 0";
    }
    if ((c->norm_topk != 0 && c->norm_topk != 1) || (c->shared_gate != 0 && c->shared_gate != 1) ||
        (c->qk_norm != 0 && c->qk_norm != 1)) {
        return "topknorm, sgate and qknorm are 0 or 1";
    }
    if (c->shared_gate && c->shared_experts == 0) { return "a shared experts' gate (sgate=1) needs shared experts (S > 0)"; }
    if (c->pad_token < -1 || c->pad_token >= c->vocab_size) { return "the padding token must be -1 (none) or below V"; }
    return NULL;
}
static int config_valid(const ModelConfig *c) { return config_problem(c) == NULL; }

#endif
