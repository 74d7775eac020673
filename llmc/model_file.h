// The model file format, model descriptors and the initialisation, over the shape and the tensor table of
// model_config.h: everything that reads or writes the file order. A rank's part of the model is cut out of the
// file-order tensors unit by unit (model_units.h); sparse upcycling makes a MoE model of a dense one (upcycle.h).
#ifndef LLMC_MODEL_FILE_H
#define LLMC_MODEL_FILE_H

#include "utils.h"
#include "rand.h"
#include "guard.h"
#include "model_config.h"

// ----------------------------------------------------------------------------
// model files (llm.c format): int32 header[256] then the tensors, fp32 (version 3) or bf16 (5).
// MoE models (ours): version 13 (fp32) or 15 (bf16), header[8..10] = E, k, moe_every, and after
// the 16 dense tensors (whose MLP tensors hold only the dense layers) routerw (Lm, E, C), efcw
// (Lm, E, 4C, C), efcb (Lm, E, 4C), efcprojw (Lm, E, C, 4C), efcprojb (Lm, E, C) for the Lm MoE layers.
// MoE version 23 (fp32) or 25 (bf16): the same, header[11] = the router's scores (0 softmax, 1 sigmoid),
// [12] S shared experts, [13] H an expert's width, and after the tensors the routing bias (Lm, E) in fp32 in both
// (its steps of --moe-bias-rate would round away in bf16). Written when any of the four needs it: sigmoid scores,
// S > 0, H != 4C, or a bias not all zero (model_file_has_bias); else 13/15, so files of models that use none stay
// readable by older readers; 13/15 load with softmax scores, no shared experts, H = 4C and a zero bias.
// header[255]: the CRC-32 of the body (guard.h; 0 = none, as in llm.c's files, which ignore slots 8..255).

#define MODEL_MAGIC 20240326

static float bf16_to_float(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t float_to_bf16(float f) {   // round to nearest even
    uint32_t u; memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

// Pointers to the tensors inside one array in file order.
static void split_tensors(const ModelConfig *c, float *all, float *ptr[NUM_TENSORS]) {
    for (int i = 0; i < NUM_TENSORS; i++) { ptr[i] = all; all += tensor_full_size(c, i); }
}

// Fails naming the tensor and the index of the first value of a file-order array that is not a finite
// number (what: the file or the state it came from).
static void check_finite(const ModelConfig *c, const float *all, const char *what) {
    size_t P = num_parameters(c);
    for (size_t i = 0; i < P; i++) {
        if (isfinite(all[i])) { continue; }
        size_t off = i;
        int id = 0;
        while (off >= tensor_full_size(c, id)) { off -= tensor_full_size(c, id); id++; }
        fail("%s: %s[%zu] is %g, not a finite number", what, tensor_names[id], off, all[i]);
    }
}

// Whether a MoE model needs versions 23/25: sigmoid scores, shared or fine-grained experts, or a routing bias (Lm, E;
// NULL: zero) not all zero.
static int model_file_has_bias(const ModelConfig *c, const float *bias) {
    if (c->num_experts == 0) { return 0; }
    if (c->arch == ARCH_LLAMA) { return 1; }   // (a family file with experts always holds the bias)
    int nonzero = 0;
    for (size_t i = 0; bias && i < num_router_bias(c); i++) { nonzero |= bias[i] != 0.0f; }
    return c->router_score != ROUTER_SOFTMAX || c->shared_experts > 0 || c->expert_hidden != 4 * c->channels || nonzero;
}
// The header of a model file of shape c, its parameters stored in bf16 or fp32 (slot 255, the CRC, is the writer's).
static void model_header_write(int h[256], const ModelConfig *c, int bf16, int with_bias) {
    memset(h, 0, 256 * sizeof(int));
    int llama = c->arch == ARCH_LLAMA;
    h[0] = MODEL_MAGIC; h[1] = (bf16 ? 5 : 3) + (llama ? 30 : c->num_experts > 0 ? (with_bias ? 20 : 10) : 0);
    h[2] = c->max_seq_len; h[3] = c->vocab_size; h[4] = c->num_layers; h[5] = c->num_heads; h[6] = c->channels;
    h[7] = c->padded_vocab_size; h[8] = c->num_experts; h[9] = c->topk; h[10] = c->moe_every;
    if (with_bias || llama) { h[11] = c->router_score; h[12] = c->shared_experts; h[13] = c->expert_hidden; }
    if (llama) {   // (floats as their bits)
        h[14] = c->arch; h[15] = c->kv_heads; h[16] = c->ffn_hidden; h[17] = c->tied; h[18] = c->qkv_bias;
        memcpy(&h[19], &c->rope_theta, 4); memcpy(&h[20], &c->norm_eps, 4);
        h[21] = c->rope.kind; memcpy(&h[22], &c->rope.factor, 4); memcpy(&h[23], &c->rope.low_freq_factor, 4);
        memcpy(&h[24], &c->rope.high_freq_factor, 4); h[25] = c->rope.original_max_position;
        h[26] = c->num_experts > 0 ? c->norm_topk : 0; h[27] = c->shared_gate; h[28] = c->qk_norm;   // ([26]: MoE)
        h[29] = c->pad_token + 1;   // (0: none, as every file written before the slot)
    }
}

// A family file's (version 33/35) header slots 14-29 into c.
static void model_header_read_family(const int h[256], ModelConfig *c) {
    c->arch = h[14]; c->kv_heads = h[15]; c->ffn_hidden = h[16]; c->tied = h[17]; c->qkv_bias = h[18];
    memcpy(&c->rope_theta, &h[19], 4); memcpy(&c->norm_eps, &h[20], 4);
    c->rope.kind = h[21]; memcpy(&c->rope.factor, &h[22], 4); memcpy(&c->rope.low_freq_factor, &h[23], 4);
    memcpy(&c->rope.high_freq_factor, &h[24], 4); c->rope.original_max_position = h[25];
    c->norm_topk = h[8] > 0 ? h[26] : 1; c->shared_gate = h[27]; c->qk_norm = h[28];   // (dense: 0 in [26])
    c->pad_token = h[29] - 1;
}

// The shape in a model file's header (path: for the errors); returns the bytes per stored parameter (4 or 2).
static size_t model_header_read(const int h[256], ModelConfig *c, const char *path) {
    if (h[0] != MODEL_MAGIC) { fail("model file '%s' has bad magic %d, expected %d", path, h[0], MODEL_MAGIC); }
    int family = h[1] == 33 || h[1] == 35, moe = h[1] == 13 || h[1] == 15 || h[1] == 23 || h[1] == 25 || family;
    if (h[1] != 3 && h[1] != 5 && !moe) {
        fail("model file '%s' has version %d, expected 3 (fp32), 5 (bf16), 13 or 23 (MoE fp32), 15 or 25 (MoE bf16), 33 "
             "or 35 (the Llama family, fp32 or bf16)", path, h[1]);
    }
    memset(c, 0, sizeof(*c));
    c->max_seq_len = h[2]; c->vocab_size = h[3]; c->num_layers = h[4]; c->num_heads = h[5]; c->channels = h[6];
    c->padded_vocab_size = h[7];
    config_gpt2(c);
    if (family) { model_header_read_family(h, c); }
    if (moe && h[8] > 0) { c->num_experts = h[8]; c->topk = h[9]; c->moe_every = h[10]; c->expert_hidden = 4 * h[6]; }
    if (h[1] > 20 && (!family || c->num_experts > 0)) {
        if (h[11] != ROUTER_SOFTMAX && h[11] != ROUTER_SIGMOID) {
            fail("model file '%s' has router scores %d in header slot 11, expected 0 (softmax) or 1 (sigmoid)", path,
                 h[11]);
        }
        c->router_score = h[11]; c->shared_experts = h[12]; c->expert_hidden = h[13];
    }
    if (moe && !family && c->num_experts < 1) {
        fail("model file '%s' is a MoE file (version %d) with %d experts", path, h[1], h[8]);
    }
    if (family && c->arch != ARCH_LLAMA) {
        fail("model file '%s' is a family file (version %d) of architecture %d in header slot 14, expected 1 (Llama)", path,
             h[1], h[14]);
    }
    const char *why = config_problem(c);
    if (why) {
        fail("model file '%s' has inconsistent header values (maxT %d V %d L %d NH %d C %d Vp %d; E %d k %d every %d "
             "S %d H %d; KV %d F %d): %s", path, h[2], h[3], h[4], h[5], h[6], h[7], c->num_experts, c->topk,
             c->moe_every, c->shared_experts, c->expert_hidden, c->kv_heads, c->ffn_hidden, why);
    }
    return h[1] % 10 == 3 ? 4 : 2;
}

// Bytes of a model file's body after its header: the parameters (es bytes each), then (version 23/25)
// the routing bias in fp32.
static size_t model_body_bytes(const ModelConfig *c, const int h[256], size_t es) {
    return num_parameters(c) * es + (h[1] > 20 ? num_router_bias(c) * sizeof(float) : 0);
}

// Opens a model file and checks its header and size; returns it positioned after the header, with the
// config and the bytes per stored parameter (4 or 2).
static FILE *open_model_file(const char *path, ModelConfig *c, int h[256], size_t *es_out) {
    FILE *f = fopen_check(path, "rb");
    if (fread(h, sizeof(int), 256, f) != 256) {
        fail("model file '%s' is truncated: expected a 1024-byte header", path);
    }
    size_t es = model_header_read(h, c, path), P = num_parameters(c), body = model_body_bytes(c, h, es);
    long size = file_size(f);
    if ((size_t)size != 1024 + body) {
        fail("model file '%s' is %ld bytes, expected %zu for its header (%zu parameters%s, version %d)", path, size,
             1024 + body, P, h[1] > 20 ? " and the routing bias" : "", h[1]);
    }
    *es_out = es;
    return f;
}

// Reads and checks a model file; returns all parameters as one host fp32 array in file order (then the routing bias).
static float *read_model_file(const char *path, ModelConfig *c) {
    int h[256];
    size_t es, P;
    FILE *f = open_model_file(path, c, h, &es);
    P = num_parameters(c);
    check_file_crc(f, h, path);
    float *params = (float *)calloc_check(model_floats(c), sizeof(float));   // (13/15: a zero routing bias)
    if (es == 4) {
        fread_check(params, 4, P, f, path);
    } else {
        uint16_t *tmp = (uint16_t *)malloc_check(P * 2);
        fread_check(tmp, 2, P, f, path);
        for (size_t i = 0; i < P; i++) { params[i] = bf16_to_float(tmp[i]); }
        free(tmp);
    }
    if (h[1] > 20) { fread_check(params + P, sizeof(float), num_router_bias(c), f, path); }
    fclose(f);
    check_finite(c, params, path);
    for (size_t i = 0; i < num_router_bias(c); i++) {
        if (!isfinite(params[P + i])) {
            fail("%s: the routing bias [%zu] (MoE layer %zu, expert %zu) is %g, not a finite number", path, i,
                 i / c->num_experts, i % c->num_experts, params[P + i]);
        }
    }
    return params;
}

// "d12" (llm.c: depth L, C = 64 L, NH = L) or "L=4,C=64,NH=4,V=250,maxT=64[,Vp=256][,E=8,k=2[,every=2][,H=64][,S=1]]"
// (H: an expert's hidden width, default 4C; S: shared experts, default 0), or a Llama model: "arch=llama,L=..,C=..,
// NH=..,V=..,maxT=..[,KV=..][,F=..][,theta=..][,eps=..][,tied=0|1][,qkvbias=0|1][,pad=ID]" (defaults: KV = NH, F = LLaMA-2's
// rule, theta 500000, eps 1e-5, untied, no biases). Each key once. *named: the keys given, a bit each in DK_ order (a
// MoE key left out takes a flag's value: expert_parallel.h). Returns 0 if the string is not a descriptor, -1 if it
// is a malformed one (why: what is wrong).
enum { DK_L, DK_C, DK_NH, DK_V, DK_VP, DK_MAXT, DK_E, DK_K, DK_EVERY, DK_H, DK_S, DK_ARCH, DK_KV, DK_F, DK_THETA, DK_EPS,
       DK_TIED, DK_QKVBIAS, DK_TOPKNORM, DK_SGATE, DK_QKNORM, DK_PAD, DESCRIPTOR_KEYS };
// The key=value list of a descriptor (buf, cut in place) into c's fields, *named, *llama, *theta, *eps. Returns -1
// (why) on an unknown or repeated key or a value out of range, else 0.
static int descriptor_keys(char *buf, const char *const *keys, ModelConfig *c, unsigned *named, int *llama,
                           double *theta, double *eps, char *why, size_t n) {
    int *fields[DESCRIPTOR_KEYS] = {&c->num_layers, &c->channels, &c->num_heads, &c->vocab_size, &c->padded_vocab_size,
                                    &c->max_seq_len, &c->num_experts, &c->topk, &c->moe_every, &c->expert_hidden,
                                    &c->shared_experts, NULL, &c->kv_heads, &c->ffn_hidden, NULL, NULL, &c->tied,
                                    &c->qkv_bias, &c->norm_topk, &c->shared_gate, &c->qk_norm, &c->pad_token};
    char *end;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (!eq) { return -1; }
        *eq = '\0';
        int key = -1;
        for (int i = 0; i < DESCRIPTOR_KEYS; i++) { if (!strcmp(tok, keys[i])) { key = i; } }
        if (key < 0 || (*named >> key & 1)) { return -1; }   // unknown or repeated
        *named |= 1u << key;
        if (key == DK_ARCH) {
            if (strcmp(eq + 1, "llama") && strcmp(eq + 1, "gpt2")) {
                snprintf(why, n, "arch=%s: expected llama or gpt2", eq + 1);
                return -1;
            }
            *llama = !strcmp(eq + 1, "llama");
            continue;
        }
        double v = strtod(eq + 1, &end);
        int zero_ok = key == DK_S || key >= DK_TIED;
        if (*end != '\0' || !(v >= (zero_ok ? 0 : 1e-30)) || v > (fields[key] ? 1 << 20 : 1e12) ||
            (fields[key] && v != (int)v)) {
            if (fields[key]) {
                snprintf(why, n, "%s=%s: expected a whole number from %d to %d", keys[key], eq + 1, zero_ok ? 0 : 1, 1 << 20);
            } else {
                snprintf(why, n, "%s=%s: expected a positive number from 1e-30 to 1e12", keys[key], eq + 1);
            }
            return -1;
        }
        if (fields[key]) { *fields[key] = (int)v; } else if (key == DK_THETA) { *theta = v; } else { *eps = v; }
    }
    return 0;
}

static int parse_descriptor(const char *s, ModelConfig *c, unsigned *named, char *why, size_t n) {
    static const char *keys[DESCRIPTOR_KEYS] = {"L", "C", "NH", "V", "Vp", "maxT", "E", "k", "every", "H", "S", "arch",
                                                "KV", "F", "theta", "eps", "tied", "qkvbias", "topknorm", "sgate",
                                                "qknorm", "pad"};
    memset(c, 0, sizeof(*c));
    *named = 0;
    snprintf(why, n, "expected dN or L=..,C=..,NH=..,V=..,maxT=..[,Vp=..][,E=..,k=..,every=..,H=..,S=..], or "
             "arch=llama with [,KV=..,F=..,theta=..,eps=..,tied=0|1,qkvbias=0|1,topknorm=0|1,sgate=0|1,qknorm=0|1,pad=ID]; "
             "each key once, 1 <= k <= E");
    c->vocab_size = 50257; c->max_seq_len = 1024;
    int llama = 0;
    double theta = 500000, eps = 1e-5;
    char *end;
    if (s[0] == 'd' && s[1] >= '0' && s[1] <= '9') {
        long d = strtol(s + 1, &end, 10);
        if (*end != '\0' || d <= 0 || d > 128) { return -1; }
        c->num_layers = (int)d; c->channels = 64 * (int)d; c->num_heads = (int)d;
    } else if (strchr(s, '=') != NULL) {
        char buf[256];
        if (strlen(s) >= sizeof(buf)) { return -1; }
        snprintf(buf, sizeof(buf), "%s", s);
        if (descriptor_keys(buf, keys, c, named, &llama, &theta, &eps, why, n) < 0) { return -1; }
        unsigned family = ~((1u << DK_ARCH) - 1) & ~(1u << DK_ARCH);   // (the keys after arch)
        if (!llama && (*named & family)) {
            snprintf(why, n, "KV, F, theta, eps, tied, qkvbias, topknorm, sgate, qknorm and pad need arch=llama");
            return -1;
        }
        if (c->num_layers == 0 || c->channels == 0 || c->num_heads == 0) { return -1; }
        if (c->num_experts > 0) {
            if (c->topk == 0) { c->topk = 1; }
            if (c->moe_every == 0) { c->moe_every = 1; }
            if (c->expert_hidden == 0) { c->expert_hidden = 4 * c->channels; }
        } else if (c->topk || c->moe_every || c->expert_hidden || c->shared_experts) {
            return -1;   // k, every, H or S without E
        }
    } else {
        return 0;
    }
    if (c->padded_vocab_size == 0) { c->padded_vocab_size = (int)ceil_div(c->vocab_size, 128) * 128; }
    int kv = c->kv_heads, F = c->ffn_hidden, tied = c->tied, bias = c->qkv_bias, ntk = c->norm_topk, sgate = c->shared_gate,
        qkn = c->qk_norm, pad = c->pad_token;
    config_gpt2(c);
    if (llama) {
        c->arch = ARCH_LLAMA;
        c->kv_heads = *named >> DK_KV & 1 ? kv : c->num_heads;
        c->ffn_hidden = *named >> DK_F & 1 ? F : llama_default_ffn(c->channels);
        c->tied = tied; c->qkv_bias = bias; c->shared_gate = sgate; c->qk_norm = qkn;
        c->norm_topk = *named >> DK_TOPKNORM & 1 ? ntk : 1;
        c->pad_token = *named >> DK_PAD & 1 ? pad : -1;
        if (c->num_experts > 0 && !(*named >> DK_H & 1)) { c->expert_hidden = c->ffn_hidden; }   // (an expert: F wide)
        c->rope_theta = (float)theta; c->norm_eps = (float)eps;
    }
    const char *problem = config_problem(c);
    if (problem) { snprintf(why, n, "%s", problem); return -1; }
    return 1;
}

// GPT-2 initialisation (as llm.c): N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), LayerNorm
// weights 1, biases 0, padded vocab rows 0; the router N(0, 0.02), the experts as the dense MLP; Llama the same
// (its norms' weights 1, an untied head N(0, 0.02)).
// Same numbers on every rank, whatever the layout.
static float *random_init(const ModelConfig *c, uint64_t seed) {
    float *all = (float *)calloc_check(model_floats(c), sizeof(float));   // (the routing bias: zero)
    float *t[NUM_TENSORS];
    split_tensors(c, all, t);
    Rng rng;
    rng_init(&rng, seed);
    float proj_std = 0.02f / sqrtf(2.0f * c->num_layers);
    for (int i = 0; i < NUM_TENSORS; i++) {
        size_t n = tensor_full_size(c, i);
        if (i == T_LN1W || i == T_LN2W || i == T_LNFW || i == T_QNORMW || i == T_KNORMW) {
            for (size_t j = 0; j < n; j++) { t[i][j] = 1.0f; }
        }
        if ((i == T_WTE || i == T_HEAD) && n > 0) { n = (size_t)c->vocab_size * c->channels; }   // padding rows stay 0
        if (i == T_WTE || i == T_WPE || i == T_QKVW || i == T_FCW || i == T_ROUTERW || i == T_EFCW || i == T_SFCW ||
            i == T_HEAD || i == T_SGATEW) {
            for (size_t j = 0; j < n; j++) { t[i][j] = rng_normal(&rng, 0, 0.02f); }
        }
        if (i == T_ATTPROJW || i == T_FCPROJW || i == T_EFCPROJW
            || i == T_SFCPROJW) { for (size_t j = 0; j < n; j++) { t[i][j] = rng_normal(&rng, 0, proj_std); } }
    }
    return all;
}

#endif // LLMC_MODEL_FILE_H
