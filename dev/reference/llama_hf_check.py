#!/usr/bin/env python3
"""
gpt2_ref.py --arch llama against transformers (the oracle): for each case below, the reference's initial
weights go into transformers' LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM (fp32, CPU, eager
attention, no sliding window), the same batch (step 0's R rows of T tokens) runs through both, and the loss
and every parameter gradient are compared. Also: transformers' inv_freq and cos/sin tables against the
reference's (bitwise), and the padded rows' gradients (zero).

Usage:  .venv/bin/python dev/reference/llama_hf_check.py [--threads N]      (exits 0 when every case passes)

Tolerance (fp32 summation order): both sides are fp32 evaluations of the same function that differ only in
the order of their sums (one fused qkv / gate-up GEMM against separate ones, addmm against matmul + bias, the
library's blocking), so each is within its own rounding error of the exact value. The reference's rounding
error is measured: the same reference run in float64 (its rope tables stay fp32, as transformers'), per
tensor f = max |g32 - g64|. transformers' error is of the same size, so |g_hf - g_ref| <= f + f_hf ~ 2f;
the bound is 4 f + 8 u max|g| (u = 2^-24, a few ulps of the tensor's scale where f is 0), the same for the loss.
"""
import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref as ref  # noqa: E402

transformers.logging.set_verbosity_error()
U = 2.0 ** -24
BASE = ["--config", "tiny", "--arch", "llama", "--L", "2", "--R", "4", "--T", "32"]
CASES = [   # (family, gpt2_ref.py options)
    ("llama", "--KV 1"),                                               # MQA, untied, theta 500000
    ("llama", "--KV 2 --tied 1"),                                      # GQA 2 groups, tied
    ("llama", "--KV 4 --theta 10000"),                                 # KV = NH (MHA)
    ("llama", "--C 256 --NH 2 --KV 1 --rope_scaling llama3"),          # head size 128, Llama 3.1 scaling
    ("llama", "--C 256 --NH 2 --KV 2 --rope_scaling llama3 --rope_factor 8 --rope_low 1 --rope_high 4 "
              "--rope_orig 64 --tied 1"),                              # scaling with every band in use
    ("llama", "--KV 2 --tied 1 --theta 100000 --F 96"),                # a SmolLM2-like shape (tied, GQA)
    ("mistral", "--KV 2 --theta 1000000 --F 224"),
    ("qwen2", "--KV 2 --qkvbias 1 --tied 1 --theta 1000000"),          # Qwen2-0.5B-like: biases, tied
    ("qwen2", "--C 256 --NH 2 --KV 1 --qkvbias 1 --theta 10000"),       # biases, head size 128, untied
]


def hf_model(family, cfg):
    kw = dict(vocab_size=cfg["V"], hidden_size=cfg["C"], intermediate_size=cfg["F"], num_hidden_layers=cfg["L"],
              num_attention_heads=cfg["NH"], num_key_value_heads=cfg["KV"], head_dim=cfg["C"] // cfg["NH"],
              max_position_embeddings=cfg["maxT"], rms_norm_eps=cfg["norm_eps"], rope_theta=cfg["theta"],
              tie_word_embeddings=bool(cfg["tied"]), hidden_act="silu", attention_dropout=0.0,
              attn_implementation="eager", torch_dtype=torch.float32)
    if cfg["rope_kind"] == 1:
        kw["rope_scaling"] = dict(rope_type="llama3", factor=cfg["rope_factor"], low_freq_factor=cfg["rope_low"],
                                  high_freq_factor=cfg["rope_high"],
                                  original_max_position_embeddings=cfg["rope_orig"])
    assert (family == "qwen2") == bool(cfg["qkvbias"]), "qkv biases: Qwen2 (q/k/v biases, none on o_proj)"
    if family == "llama":
        conf = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **kw)
        cls = transformers.LlamaForCausalLM
    elif family == "mistral":
        conf = transformers.MistralConfig(sliding_window=None, **kw)
        cls = transformers.MistralForCausalLM
    else:
        conf = transformers.Qwen2Config(use_sliding_window=False, sliding_window=None, max_window_layers=cfg["L"], **kw)
        cls = transformers.Qwen2ForCausalLM
    return cls(conf).float().eval()   # eval: no dropout (all 0 anyway)


def hf_map(cfg):
    """reference tensor name -> a function (hf named parameters) -> that tensor in the reference's layout
    (wte and head: the V real rows)"""
    lay = lambda fn: (lambda d: torch.stack([fn(d, f"model.layers.{l}.") for l in range(cfg["L"])]))
    qkv = lambda suffix: lay(lambda d, p: torch.cat([d[p + f"self_attn.{x}_proj.{suffix}"] for x in "qkv"]))
    m = {"wte": lambda d: d["model.embed_tokens.weight"],
         "ln1w": lay(lambda d, p: d[p + "input_layernorm.weight"]),
         "qkvw": qkv("weight"),
         "attprojw": lay(lambda d, p: d[p + "self_attn.o_proj.weight"]),
         "ln2w": lay(lambda d, p: d[p + "post_attention_layernorm.weight"]),
         "fcw": lay(lambda d, p: torch.cat([d[p + "mlp.gate_proj.weight"], d[p + "mlp.up_proj.weight"]])),
         "fcprojw": lay(lambda d, p: d[p + "mlp.down_proj.weight"]),
         "lnfw": lambda d: d["model.norm.weight"]}
    if cfg["qkvbias"]:
        m["qkvb"] = qkv("bias")
    if not cfg["tied"]:
        m["head"] = lambda d: d["lm_head.weight"]
    return m


def load_into(model, cfg, init):
    """the reference's weights into the model, through the inverse of hf_map (views of the hf parameters)"""
    params = dict(model.named_parameters())
    NH, KV, F, hs, V = cfg["NH"], cfg["KV"], cfg["F"], cfg["C"] // cfg["NH"], cfg["V"]
    n = 0
    with torch.no_grad():
        def put(name, t):
            nonlocal n
            assert params[name].shape == t.shape, (name, params[name].shape, t.shape)
            params[name].copy_(t)
            n += t.numel()
        put("model.embed_tokens.weight", init["wte"][:V])
        if not cfg["tied"]:
            put("lm_head.weight", init["head"][:V])
        put("model.norm.weight", init["lnfw"])
        for l in range(cfg["L"]):
            p = f"model.layers.{l}."
            q, k, v = init["qkvw"][l].split([NH * hs, KV * hs, KV * hs])
            put(p + "self_attn.q_proj.weight", q); put(p + "self_attn.k_proj.weight", k); put(p + "self_attn.v_proj.weight", v)
            if cfg["qkvbias"]:
                q, k, v = init["qkvb"][l].split([NH * hs, KV * hs, KV * hs])
                put(p + "self_attn.q_proj.bias", q); put(p + "self_attn.k_proj.bias", k); put(p + "self_attn.v_proj.bias", v)
            put(p + "self_attn.o_proj.weight", init["attprojw"][l])
            g, u = init["fcw"][l].split([F, F])
            put(p + "mlp.gate_proj.weight", g); put(p + "mlp.up_proj.weight", u)
            put(p + "mlp.down_proj.weight", init["fcprojw"][l])
            put(p + "input_layernorm.weight", init["ln1w"][l]); put(p + "post_attention_layernorm.weight", init["ln2w"][l])
    total = sum(t.numel() for t in model.parameters())   # shared (tied) parameters counted once
    assert n == total, f"{n} elements loaded, the model has {total}"


def run_case(family, opts, seed=1337):
    _, cfg, _ = ref.parse(BASE + opts.split())
    V, T = cfg["V"], cfg["T"]
    init = {k: v.detach() for k, v in ref.init_params(cfg, seed).items()}
    tokens = ref.markov_tokens(V, cfg["R"] * T + 1, seed)
    x, y = ref.batch(tokens, 0, cfg)

    def ref_grads(dtype):
        p = {k: v.to(dtype).clone().requires_grad_(True) for k, v in init.items()}
        loss = ref.forward(p, x, y, cfg)[3]
        loss.backward()
        return loss.item(), {k: (v.grad if v.grad is not None else torch.zeros_like(v)) for k, v in p.items()}

    loss32, g32 = ref_grads(torch.float32)
    loss64, g64 = ref_grads(torch.float64)

    model = hf_model(family, cfg)
    load_into(model, cfg, init)
    rot = model.model.rotary_emb
    inv_ok = torch.equal(rot.inv_freq.float(), ref.rope_inv_freq(cfg))
    cos_hf, sin_hf = rot(torch.zeros(1, dtype=torch.float32), torch.arange(T)[None])
    cos_ref, sin_ref = ref.rope_tables(cfg, T)
    tab_ok = torch.equal(cos_hf[0], cos_ref) and torch.equal(sin_hf[0], sin_ref)
    logits = model(input_ids=x).logits                        # (R, T, V)
    loss_hf = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
    loss_hf.backward()
    hf = {n: p.grad for n, p in model.named_parameters()}
    ok = inv_ok and tab_ok
    tol = 4 * abs(loss32 - loss64) + 8 * U * abs(loss64)
    dl = abs(loss_hf.item() - loss32)
    ok &= dl <= tol
    print(f"== {family} {opts}  (C {cfg['C']} NH {cfg['NH']} KV {cfg['KV']} hs {cfg['C'] // cfg['NH']} F {cfg['F']} "
          f"theta {cfg['theta']:g})")
    print(f"   inv_freq bitwise {inv_ok}, cos/sin bitwise {tab_ok}; loss ref {loss32:.7f} hf {loss_hf.item():.7f} "
          f"|diff| {dl:.1e} (fp32 floor {abs(loss32 - loss64):.1e}, tol {tol:.1e})")
    worst = 0.0
    for name, fn in hf_map(cfg).items():
        a = g32[name][:V] if name in ("wte", "head") else g32[name]
        b = fn(hf)
        scale = b.abs().max().item()
        d = (a - b).abs().max().item()
        f = (g32[name] - g64[name]).abs().max().item()
        t = 4 * f + 8 * U * scale
        ok &= d <= t
        worst = max(worst, d / scale)
        print(f"   {name:8s} max|g| {scale:.2e}  max|ref-hf| {d:.2e} ({d / scale:.1e} of max|g|)  fp32 floor {f:.2e}  "
              f"ratio {d / max(f, 1e-45):5.2f}  {'ok' if d <= t else 'FAIL'}")
    for name in ("wte", "head"):
        if g32[name].numel():
            z = bool((g32[name][V:] == 0).all())
            ok &= z
            if not z:
                print(f"   {name} padded rows: nonzero gradient  FAIL")
    print(f"   {'PASS' if ok else 'FAIL'}  (largest difference {worst:.1e} of a tensor's max|g|)")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    results = [run_case(fam, opts) for fam, opts in CASES]
    print(f"{sum(results)} of {len(results)} cases passed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
