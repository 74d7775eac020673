"""GPT-2 (GPT2LMHeadModel): config.json and the tensors, each way."""
import numpy as np

from cli import fail
from .ourfile import EPS, number
from .fields import refuse, int_field, VOCAB
from .weights import getter, check_rest, padded


def hf_config(cfg):
    """config.json of GPT2LMHeadModel for our shape; <|endoftext|> is the last id (50256 in GPT-2's BPE,
    256 in the byte tokenizer)"""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg["V"], "n_positions": cfg["maxT"], "n_ctx": cfg["maxT"], "n_embd": cfg["C"],
        "n_layer": cfg["L"], "n_head": cfg["NH"], "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": EPS, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
        "bos_token_id": cfg["V"] - 1, "eos_token_id": cfg["V"] - 1, "use_cache": True, "torch_dtype": "float32",
    }


def to_hf(cfg, t):
    """our GPT-2 tensors -> HF state dict (fp32, contiguous)"""
    V, L = cfg["V"], cfg["L"]
    sd = {"transformer.wte.weight": t["wte"][:V], "transformer.wpe.weight": t["wpe"],
          "transformer.ln_f.weight": t["lnfw"], "transformer.ln_f.bias": t["lnfb"]}
    for l in range(L):
        p = f"transformer.h.{l}."
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = t["ln1w"][l], t["ln1b"][l]
        sd[p + "attn.c_attn.weight"], sd[p + "attn.c_attn.bias"] = t["qkvw"][l].T, t["qkvb"][l]
        sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"] = t["attprojw"][l].T, t["attprojb"][l]
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = t["ln2w"][l], t["ln2b"][l]
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = t["fcw"][l].T, t["fcb"][l]
        sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = t["fcprojw"][l].T, t["fcprojb"][l]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def gpt2_config(hc, path):
    """Our shape from a GPT2LMHeadModel config, refusing by name what our model cannot be"""
    C = int_field(hc, path, "n_embd", 768)
    NH = int_field(hc, path, "n_head", 12)
    cfg = dict(maxT=int_field(hc, path, "n_positions" if "n_positions" in hc else "n_ctx", 1024),
               V=int_field(hc, path, "vocab_size", 50257, hi=2**20, why=VOCAB),
               L=int_field(hc, path, "n_layer", 12), NH=NH, C=C)
    if C % NH:
        refuse(hc, path, "n_head", f"n_embd {C} is not a multiple of it")
    if hc.get("n_inner") not in (None, 4 * C):
        refuse(hc, path, "n_inner", f"our MLP is 4 * n_embd = {4 * C} wide")
    if hc.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        refuse(hc, path, "activation_function", "our MLP uses the tanh GELU (gelu_new)")
    if hc.get("scale_attn_by_inverse_layer_idx", False):
        refuse(hc, path, "scale_attn_by_inverse_layer_idx", "our attention scales by 1/sqrt(head size) in every layer")
    if not hc.get("scale_attn_weights", True):
        refuse(hc, path, "scale_attn_weights", "our attention scales by 1/sqrt(head size)")
    if not hc.get("tie_word_embeddings", True):
        refuse(hc, path, "tie_word_embeddings", "our LM head is the token embedding (tied)")
    if hc.get("add_cross_attention", False):
        refuse(hc, path, "add_cross_attention", "our blocks have no cross-attention")
    eps = number(hc.get("layer_norm_epsilon", EPS))
    if eps is None or not abs(eps - EPS) <= 1e-12:
        refuse(hc, path, "layer_norm_epsilon", f"our LayerNorm uses {EPS}")
    return cfg


def from_hf(cfg, sd, d):
    """HF GPT-2 state dict -> our tensors, every shape checked"""
    used = set()
    get = getter(sd, d, used)
    V, Vp, L, C, maxT = cfg["V"], cfg["Vp"], cfg["L"], cfg["C"], cfg["maxT"]
    wte = get("wte.weight", (V, C))   # before anything of config.json's size is allocated
    t = {"wte": padded(wte, Vp), "wpe": get("wpe.weight", (maxT, C)),
         "lnfw": get("ln_f.weight", (C,)), "lnfb": get("ln_f.bias", (C,))}
    per_layer = [("ln1w", "ln_1.weight", (C,), False), ("ln1b", "ln_1.bias", (C,), False),
                 ("qkvw", "attn.c_attn.weight", (C, 3 * C), True), ("qkvb", "attn.c_attn.bias", (3 * C,), False),
                 ("attprojw", "attn.c_proj.weight", (C, C), True), ("attprojb", "attn.c_proj.bias", (C,), False),
                 ("ln2w", "ln_2.weight", (C,), False), ("ln2b", "ln_2.bias", (C,), False),
                 ("fcw", "mlp.c_fc.weight", (C, 4 * C), True), ("fcb", "mlp.c_fc.bias", (4 * C,), False),
                 ("fcprojw", "mlp.c_proj.weight", (4 * C, C), True), ("fcprojb", "mlp.c_proj.bias", (C,), False)]
    for ours, hf, shape, conv1d in per_layer:
        t[ours] = np.stack([get(f"h.{l}.{hf}", shape).T if conv1d else get(f"h.{l}.{hf}", shape) for l in range(L)])
    if "lm_head.weight" in sd:   # a file that stores the tied head: it must be wte
        if not np.array_equal(get("lm_head.weight", (V, C)), sd["wte.weight"]):
            fail(f"{d}: lm_head.weight differs from wte.weight: our LM head is the token embedding (tied)")
    check_rest(sd, used, [k for k in sd if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias")], d)   # the mask
    return t
