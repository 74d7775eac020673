"""The Llama family (Llama, Mistral, Qwen2, and the MoE models on its body): config.json and the tensors, each way."""
import math

import numpy as np

from cli import fail
from .ourfile import f32, number, llama_shapes, DENSE_MOE, bias_shape, short
from .fields import refuse_value, refuse, int_field, VOCAB, float_field
from .weights import getter, check_rest
from .moe import hf_config_moe, MOE_TYPES, moe_config


ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM",
                 "olmoe": "OlmoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}   # model_type -> class


def hf_config_llama(cfg, mt):
    """config.json of model_type mt (export_type): LlamaForCausalLM, Qwen2ForCausalLM (Llama with q/k/v biases),
    or a MoE class; rope_scaling's low/high factors as the exact values of their float32 (the importer wants
    them exact)"""
    V, L, C, NH = cfg["V"], cfg["L"], cfg["C"], cfg["NH"]
    eot = V - 1 if V in (50257, 257) else None   # our tokenizers' <|endoftext|>; else unknown
    rope = None
    if cfg["rope"]:
        factor, low, high, orig = cfg["rope"]
        rope = {"rope_type": "llama3", "factor": short(factor), "low_freq_factor": low, "high_freq_factor": high,
                "original_max_position_embeddings": orig}
    hc = {"architectures": [ARCHITECTURES[mt]], "model_type": mt,
          "vocab_size": V, "hidden_size": C, "intermediate_size": cfg["F"], "num_hidden_layers": L,
          "num_attention_heads": NH, "num_key_value_heads": cfg["KV"], "head_dim": C // NH, "hidden_act": "silu",
          "max_position_embeddings": cfg["maxT"], "rms_norm_eps": short(cfg["eps"]), "rope_theta": short(cfg["theta"]),
          "rope_scaling": rope, "tie_word_embeddings": bool(cfg["tied"]), "attention_dropout": 0.0,
          "initializer_range": 0.02, "bos_token_id": eot, "eos_token_id": eot,
          "pad_token_id": cfg["pad"] if cfg["pad"] >= 0 else None, "use_cache": True, "torch_dtype": "float32"}
    if mt == "qwen2":   # no sliding window (Qwen2 would apply one even with use_sliding_window false)
        hc.update(use_sliding_window=False, sliding_window=None, max_window_layers=L)
    elif mt == "llama":
        hc.update(attention_bias=False, mlp_bias=False)
    else:
        hc.update(hf_config_moe(cfg, mt))
    return hc


def qkv_rows(cfg):
    """the row counts of q, k and v in a layer's qkvw"""
    hs = cfg["C"] // cfg["NH"]
    return cfg["NH"] * hs, cfg["KV"] * hs, cfg["KV"] * hs


def llama_pieces(cfg, mt):
    """[(transformers' weight name, our tensor, index into it)] of a model of model_type mt: each weight is one
    slice of one of our tensors (q_proj: qkvw[l][:NH hs], gate_proj: fcw[i][:F], an expert's gate: efcw[j][e][:H],
    ...; i counts the dense layers, j the MoE ones), and together they cover our tensors but the padded rows"""
    V, F, H, E, SH, every = cfg["V"], cfg["F"], cfg["H"], cfg["E"], cfg["S"] * cfg["H"], cfg["every"]
    q, k, v = qkv_rows(cfg)
    out = [("model.embed_tokens.weight", "wte", slice(0, V)), ("model.norm.weight", "lnfw", ())]
    if not cfg["tied"]:
        out.append(("lm_head.weight", "head", slice(0, V)))
    qkv = list(zip("qkv", (slice(0, q), slice(q, q + k), slice(q + k, q + k + v))))
    moe = "block_sparse_moe." if mt == "mixtral" else "mlp."
    g, u, dn = ("w1", "w3", "w2") if mt == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    i = j = 0
    for l in range(cfg["L"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", "ln1w", l), (p + "post_attention_layernorm.weight", "ln2w", l),
                (p + "self_attn.o_proj.weight", "attprojw", l)]
        out += [(p + f"self_attn.{x}_proj.weight", "qkvw", (l, sl)) for x, sl in qkv]
        out += [(p + f"self_attn.{x}_proj.bias", "qkvb", (l, sl)) for x, sl in qkv if cfg["qkvbias"]]
        if cfg["qknorm"]:
            out += [(p + "self_attn.q_norm.weight", "qnormw", l), (p + "self_attn.k_norm.weight", "knormw", l)]
        if E and l % every == every - 1:
            m = p + moe
            out.append((m + "gate.weight", "routerw", j))
            for e in range(E):
                out += [(m + f"experts.{e}.{g}.weight", "efcw", (j, e, slice(0, H))),
                        (m + f"experts.{e}.{u}.weight", "efcw", (j, e, slice(H, 2 * H))),
                        (m + f"experts.{e}.{dn}.weight", "efcprojw", (j, e))]
            if SH:
                out += [(m + "shared_expert.gate_proj.weight", "sfcw", (j, slice(0, SH))),
                        (m + "shared_expert.up_proj.weight", "sfcw", (j, slice(SH, 2 * SH))),
                        (m + "shared_expert.down_proj.weight", "sfcprojw", j)]
            if cfg["sgate"]:
                out.append((m + "shared_expert_gate.weight", "sgatew", j))
            j += 1
        else:
            out += [(p + "mlp.gate_proj.weight", "fcw", (i, slice(0, F))),
                    (p + "mlp.up_proj.weight", "fcw", (i, slice(F, 2 * F))), (p + "mlp.down_proj.weight", "fcprojw", i)]
            i += 1
    return out


def to_hf_llama(cfg, t, mt):
    """our Llama tensors -> the state dict of model_type mt (fp32, contiguous; lm_head only when untied; a
    Qwen2-MoE export of a model without q/k/v biases gets zero ones)"""
    sd = {name: t[ours][idx] for name, ours, idx in llama_pieces(cfg, mt)}
    if mt == "qwen2_moe" and not cfg["qkvbias"]:
        for name in [n for n in sd if n.endswith("_proj.weight") and ".self_attn." in n and "o_proj" not in n]:
            sd[name[:-len("weight")] + "bias"] = np.zeros(sd[name].shape[0], np.float32)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


# transformers 4.49's defaults of the fields a config.json may leave out (LlamaConfig, MistralConfig, Qwen2Config);
# num_key_value_heads None: num_attention_heads; sliding_window None: none
FAMILY_DEFAULTS = {
    "llama": dict(vocab_size=32000, intermediate_size=11008, num_key_value_heads=None, max_position_embeddings=2048,
                  sliding_window=None),
    "mistral": dict(vocab_size=32000, intermediate_size=14336, num_key_value_heads=8, max_position_embeddings=131072,
                    sliding_window=4096),
    "qwen2": dict(vocab_size=151936, intermediate_size=22016, num_key_value_heads=32, max_position_embeddings=32768,
                  sliding_window=4096),
    "mixtral": dict(vocab_size=32000, intermediate_size=14336, num_key_value_heads=8, max_position_embeddings=131072,
                    sliding_window=None, rms_norm_eps=1e-5, rope_theta=1e6, num_local_experts=8,
                    num_experts_per_tok=2),
    "olmoe": dict(vocab_size=50304, hidden_size=2048, intermediate_size=2048, num_hidden_layers=16,
                  num_attention_heads=16, num_key_value_heads=None, max_position_embeddings=4096, rms_norm_eps=1e-5,
                  num_experts=64, num_experts_per_tok=8, norm_topk_prob=False, pad_token_id=1),
    "qwen2_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=32768,
                      sliding_window=4096, num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
                      moe_intermediate_size=1408,
                      shared_expert_intermediate_size=5632, decoder_sparse_step=1),
}
FAMILY_COMMON = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, hidden_act="silu",
                     rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)


def rope_scaling(hc, path):
    """None, or (factor, low, high, orig) of a 'llama3' rope_scaling (transformers' _compute_llama3_parameters
    rescales the inverse frequencies by it; model_file.h's RopeScaling holds them as float32)"""
    rs = hc.get("rope_scaling")
    kind = rs.get("rope_type", rs.get("type")) if isinstance(rs, dict) else None
    if rs is None or kind == "default":
        return None
    if kind != "llama3":
        refuse(hc, path, "rope_scaling", "expected null or rope_type 'llama3' (our RoPE has no other scaling)")
    name = lambda k: f"rope_scaling.{k}"
    vals = []
    for k in ("factor", "low_freq_factor", "high_freq_factor"):
        v = number(rs.get(k))
        if v is None or not (v > 0 and math.isfinite(f32(v)) and f32(v) > 0):
            refuse_value(path, name(k), rs.get(k), "expected a finite positive number (float32)")
        if k != "factor" and f32(v) != v:   # transformers divides and subtracts these in float64
            refuse_value(path, name(k), v, f"expected a value float32 holds exactly (our header stores {f32(v)!r})")
        vals.append(f32(v))
    if not vals[1] < vals[2]:
        refuse_value(path, name("high_freq_factor"), rs.get("high_freq_factor"), "expected more than low_freq_factor")
    orig = rs.get("original_max_position_embeddings")
    if type(orig) is not int or not 1 <= orig <= 2**24:   # (a float32 holds it exactly)
        refuse_value(path, name("original_max_position_embeddings"), orig, "expected an integer in 1..16777216")
    return tuple(vals) + (orig,)


def attention_checks(hc, path, mt, d, cfg):
    """Refuses, naming the field, attention that is not ours: biases (Llama's attention_bias / mlp_bias, OLMoE's
    attention_bias, clip_qkv), a sliding window shorter than the positions"""
    if mt in ("llama", "olmoe"):
        if hc.get("attention_bias", False) is not False:
            refuse(hc, path, "attention_bias", "expected false: our attention has no biases on q, k, v and o "
                   "(Qwen2's q/k/v biases are model_type qwen2)")
    if mt == "llama" and hc.get("mlp_bias", False) is not False:
        refuse(hc, path, "mlp_bias", "expected false: our MLP has no biases")
    if mt == "olmoe" and hc.get("clip_qkv") is not None:
        refuse(hc, path, "clip_qkv", "expected null: our attention does not clamp q, k and v")
    # Mistral's and Mixtral's masks and Qwen2's (whatever use_sliding_window says) use the window; Qwen2-MoE's only
    # under use_sliding_window (flash attention)
    if mt in ("mistral", "qwen2", "mixtral") or (mt == "qwen2_moe" and hc.get("use_sliding_window", False)):
        w = hc.get("sliding_window", d["sliding_window"])
        if w is not None and (type(w) is not int or w < cfg["maxT"]):
            left = "" if "sliding_window" in hc else f", left out: {mt}'s default"
            refuse_value(path, "sliding_window", w, f"expected null or at least max_position_embeddings {cfg['maxT']} "
                         f"(our attention sees every earlier position{left})")


def llama_config(hc, path):
    """Our shape from a config of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v biases, our
    qkvbias=1) or a MoE class (moe_config), refusing by name what our model cannot be"""
    mt = hc["model_type"]
    d = {**FAMILY_COMMON, **FAMILY_DEFAULTS[mt]}
    C = int_field(hc, path, "hidden_size", d["hidden_size"], hi=16384)
    NH = int_field(hc, path, "num_attention_heads", d["num_attention_heads"])
    KV = hc.get("num_key_value_heads", d["num_key_value_heads"])
    KV = NH if KV is None else int_field(hc, path, "num_key_value_heads", KV)
    cfg = dict(maxT=int_field(hc, path, "max_position_embeddings", d["max_position_embeddings"], hi=2**20),
               V=int_field(hc, path, "vocab_size", d["vocab_size"], hi=2**20, why=VOCAB),
               L=int_field(hc, path, "num_hidden_layers", d["num_hidden_layers"], hi=1024), NH=NH, C=C, arch="llama",
               KV=KV, F=int_field(hc, path, "intermediate_size", d["intermediate_size"], hi=2**20),
               qkvbias=int(mt in ("qwen2", "qwen2_moe")), theta=float_field(hc, path, "rope_theta", d["rope_theta"]),
               eps=float_field(hc, path, "rms_norm_eps", d["rms_norm_eps"]), rope=rope_scaling(hc, path), **DENSE_MOE)
    cfg["pad"] = pad_token(hc, path, d, cfg["V"])
    if C % NH:
        refuse(hc, path, "num_attention_heads", f"hidden_size {C} is not a multiple of it")
    if NH % KV:
        refuse(hc, path, "num_key_value_heads", f"num_attention_heads {NH} is not a multiple of it")
    if hc.get("head_dim") not in (None, C // NH):
        refuse(hc, path, "head_dim", f"our head size is hidden_size / num_attention_heads = {C // NH}")
    if (C // NH) % 2:
        refuse(hc, path, "num_attention_heads", f"RoPE needs an even head size, hidden_size / it = {C // NH}")
    if hc.get("hidden_act", d["hidden_act"]) not in ("silu", "swish"):
        refuse(hc, path, "hidden_act", "our MLP is SwiGLU: silu")
    tied = hc.get("tie_word_embeddings", d["tie_word_embeddings"])
    if type(tied) is not bool:
        refuse(hc, path, "tie_word_embeddings", "expected true or false")
    cfg["tied"] = int(tied)
    attention_checks(hc, path, mt, d, cfg)
    if mt in MOE_TYPES:
        cfg.update(moe_config(hc, path, mt, d, cfg))
    return cfg


def pad_token(hc, path, d, V):
    """pad_token_id as our padding token (-1: none): transformers' nn.Embedding(V, C, padding_idx) gives that row no
    gradient; a negative id is V + id there"""
    pad = hc.get("pad_token_id", d.get("pad_token_id"))
    if pad is None:
        return -1
    if type(pad) is not int or not -V <= pad < V:
        refuse_value(path, "pad_token_id", pad, f"expected null or a whole number in [-{V}, {V}) (vocab_size {V})")
    return pad % V


def from_hf_llama(cfg, sd, d, mt):
    """HF state dict of model_type mt (Llama, Mistral, Qwen2, Mixtral, OLMoE, Qwen2-MoE) -> our tensors through
    llama_pieces, every weight's shape checked before anything of config.json's size is allocated (the weights
    then show it is real); the routing bias zero (none of the classes has one)"""
    used = set()
    get = getter(sd, d, used)
    shapes = dict(llama_shapes(cfg))
    view = lambda name, idx: np.broadcast_to(np.float32(0), shapes[name])[idx]   # (no memory)
    pieces = [(ours, idx, get(name, view(ours, idx).shape)) for name, ours, idx in llama_pieces(cfg, mt)]
    t = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    for ours, idx, x in pieces:
        t[ours][idx] = x
    if cfg["tied"] and "lm_head.weight" in sd:   # a file that stores the tied head: it must be the embedding
        emb = sd["model.embed_tokens.weight"]
        if not np.array_equal(get("lm_head.weight", emb.shape), emb):
            fail(f"{d}: lm_head.weight differs from model.embed_tokens.weight, but tie_word_embeddings is true")
    check_rest(sd, used, [k for k in sd if k.endswith("rotary_emb.inv_freq")], d)   # (older files keep RoPE's buffer)
    t["bias"] = np.zeros(bias_shape(cfg), np.float32)
    return t
