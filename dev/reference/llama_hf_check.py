#!/usr/bin/env python3
"""
gpt2_ref.py --arch llama against transformers (the oracle): for each case below, the reference's initial
weights go into transformers' LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, or (MoE on the Llama
body, moe_llama_spec.md) MixtralForCausalLM, OlmoeForCausalLM, Qwen2MoeForCausalLM (fp32, CPU, eager
attention, no sliding window), the same batch (step 0's R rows of T tokens) runs through both, and the loss
and every parameter gradient are compared. Also: transformers' inv_freq and cos/sin tables against the
reference's (bitwise), and the padded rows' gradients (zero).

Usage:  .venv/bin/python dev/reference/llama_hf_check.py [--threads N] [--only dense|moe]
        (exits 0 when every case passes)

The weight mapping (pieces()): every transformers parameter is one slice of one reference tensor (q_proj:
qkvw[l][:NH hs], gate_proj: fcw[i][:F], an expert's w1 / gate_proj: efcw[i][e][:H], ...); the check asserts
that every parameter is loaded and that the slices cover every element of every reference tensor exactly once
(wte and head: the V real rows). Gradients are compared through the same slices.

MoE cases: dropless (--cap 0), aux 0, z 0 (transformers' load-balancing loss is another definition: only CE
enters its loss), scores softmax. The batch's data seed is advanced (from the seed) until every routing
decision of the step has a top-k margin of at least 1e-6 in p (gpt2_ref.py's min_margin, the smallest gap
between consecutive sorted probabilities among the first k+1), and transformers' top-k (torch.topk of its own
router's softmax) must then choose the same experts in the same order: checked per MoE layer and token. The
aux cases (one MoE layer, one sequence: the only shape where the two definitions coincide) check
transformers' aux_loss = k * ours (ours: E sum_i f_i P_i with f_i = assignments / (k T); transformers': f_i =
assignments / T), and run the reference with --aux_coeff c against transformers' CE + (c / k) aux_loss, so
the aux's gradient is compared too.

Tolerance (fp32 summation order): both sides are fp32 evaluations of the same function that differ only in
the order of their sums (one fused qkv / gate-up GEMM against separate ones, addmm against matmul + bias, the
library's blocking), so each is within its own rounding error of the exact value. The reference's rounding
error is measured: the same reference run in float64 (its rope tables stay fp32, as transformers'), per
tensor f = max |g32 - g64|. transformers' error is of the same size, so |g_hf - g_ref| <= f + f_hf ~ 2f;
the bound is 4 f + 8 u max|g| (u = 2^-24, a few ulps of the tensor's scale where f is 0), the same for the loss
and the aux. The float64 run must route as the fp32 one does (asserted; the margins make it so).
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
MIN_MARGIN = 1e-6
BASE = ["--config", "tiny", "--arch", "llama", "--L", "2", "--R", "4", "--T", "32"]
MOE = "--cap 0 --aux_coeff 0 --z_coeff 0 "
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
    # MoE on the Llama body (dropless, aux 0, z 0)
    ("mixtral", MOE + "--KV 2 --E 4 --k 2 --H 64 --theta 1000000"),   # softmax, norm_topk 1, every layer
    ("mixtral", MOE + "--KV 1 --E 8 --k 2 --tied 1"),                  # H = F (256), MQA, tied
    ("olmoe", MOE + "--KV 2 --E 8 --k 2 --norm_topk 0 --qk_norm 1 --H 32 --theta 10000"),   # QK-norm, raw p gates
    ("qwen2_moe", MOE + "--L 4 --KV 2 --E 4 --k 2 --norm_topk 0 --every 2 --H 32 --S 2 --shared_gate 1 "
                  "--qkvbias 1 --F 96 --theta 1000000"),              # shared expert (2H) with its gate, dense layers F
    ("qwen2_moe", MOE + "--L 4 --KV 1 --E 4 --k 2 --norm_topk 1 --every 2 --H 48 --S 1 --shared_gate 1 "
                  "--qkvbias 1 --F 128 --tied 1"),                    # norm_topk 1, S 1, tied
    # QK-norm without MoE: OLMoE with one expert (p = 1, the gate 1: its expert is the dense SwiGLU MLP)
    ("olmoe_dense", "--KV 2 --qk_norm 1 --F 96"),
    # the aux losses coincide: one MoE layer, one sequence; the reference's aux_coeff 0.5, transformers' 0.5 / k
    ("mixtral", "--cap 0 --z_coeff 0 --aux_coeff 0.5 --L 1 --R 1 --KV 2 --E 4 --k 2 --H 64"),
    ("qwen2_moe", "--cap 0 --z_coeff 0 --aux_coeff 0.5 --R 1 --KV 2 --E 8 --k 2 --norm_topk 0 --every 2 --H 32 --S 1 "
                  "--shared_gate 1 --qkvbias 1 --F 96"),
    ("olmoe", "--cap 0 --z_coeff 0 --aux_coeff 0.5 --L 1 --R 1 --KV 1 --E 8 --k 2 --norm_topk 0 --qk_norm 1 --H 32"),
]
# initialised as transformers initialises (initializer_range 0.05, the padding row zero, random norm weights and
# biases), 3 batches each, the padding token (where the family has one) in every batch
HF_INIT_CASES = [
    ("olmoe", MOE + "--KV 2 --E 4 --k 2 --norm_topk 0 --qk_norm 1 --H 32 --theta 10000 --pad 1"),   # OLMoE's pad 1
    ("olmoe", MOE + "--KV 1 --E 8 --k 2 --norm_topk 1 --qk_norm 1 --H 32 --tied 1 --pad 1"),   # tied: the head's
    ("llama", "--KV 2 --rope_scaling llama3 --rope_orig 64 --pad 0"),
    ("qwen2", "--KV 2 --qkvbias 1 --tied 1 --theta 1000000"),
    ("mixtral", MOE + "--KV 2 --E 4 --k 2 --H 64 --theta 1000000"),
    ("qwen2_moe", MOE + "--L 4 --KV 2 --E 4 --k 2 --norm_topk 0 --every 2 --H 32 --S 2 --shared_gate 1 --qkvbias 1 "
                  "--F 96 --theta 1000000"),
]
MOE_FAMILIES = ("mixtral", "olmoe", "qwen2_moe")


def hf_model(family, cfg, init_range=0.02):
    kw = dict(initializer_range=init_range, pad_token_id=cfg["pad"] if cfg["pad"] >= 0 else None, vocab_size=cfg["V"], hidden_size=cfg["C"], intermediate_size=cfg["F"], num_hidden_layers=cfg["L"],
              num_attention_heads=cfg["NH"], num_key_value_heads=cfg["KV"], head_dim=cfg["C"] // cfg["NH"],
              max_position_embeddings=cfg["maxT"], rms_norm_eps=cfg["norm_eps"], rope_theta=cfg["theta"],
              tie_word_embeddings=bool(cfg["tied"]), hidden_act="silu", attention_dropout=0.0,
              attn_implementation="eager", torch_dtype=torch.float32)
    if cfg["rope_kind"] == 1:
        kw["rope_scaling"] = dict(rope_type="llama3", factor=cfg["rope_factor"], low_freq_factor=cfg["rope_low"],
                                  high_freq_factor=cfg["rope_high"],
                                  original_max_position_embeddings=cfg["rope_orig"])
    E, S = cfg["E"], cfg["S"]
    assert (family in ("qwen2", "qwen2_moe")) == bool(cfg["qkvbias"]), "qkv biases: Qwen2, Qwen2-MoE (none on o_proj)"
    assert (family in ("olmoe", "olmoe_dense")) == bool(cfg["qk_norm"]), "QK-norm: OLMoE"
    assert (family in MOE_FAMILIES) == (E > 0), "MoE: Mixtral, OLMoE, Qwen2-MoE"
    if E:
        assert cfg["score"] == "softmax" and cfg["bias_rate"] == 0 and cfg["F1000"] == 0 and cfg["z_coeff"] == 0
        assert (family == "qwen2_moe") == (S > 0 and cfg["shared_gate"] == 1), "shared experts with a gate: Qwen2-MoE"
        assert family == "qwen2_moe" or cfg["every"] == 1, "Mixtral, OLMoE: every layer MoE"
        assert family != "mixtral" or cfg["norm_topk"] == 1, "Mixtral renormalises the top k"
        moe = dict(num_experts_per_tok=cfg["k"], output_router_logits=True)
    if family == "llama":
        conf = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **kw)
        cls = transformers.LlamaForCausalLM
    elif family == "mistral":
        conf = transformers.MistralConfig(sliding_window=None, **kw)
        cls = transformers.MistralForCausalLM
    elif family == "qwen2":
        conf = transformers.Qwen2Config(use_sliding_window=False, sliding_window=None, max_window_layers=cfg["L"], **kw)
        cls = transformers.Qwen2ForCausalLM
    elif family == "mixtral":
        kw["intermediate_size"] = cfg["H"]
        conf = transformers.MixtralConfig(num_local_experts=E, router_jitter_noise=0.0, sliding_window=None, **moe, **kw)
        cls = transformers.MixtralForCausalLM
    elif family == "olmoe":
        kw["intermediate_size"] = cfg["H"]
        conf = transformers.OlmoeConfig(num_experts=E, norm_topk_prob=bool(cfg["norm_topk"]), clip_qkv=None,
                                        attention_bias=False, **moe, **kw)
        cls = transformers.OlmoeForCausalLM
    elif family == "olmoe_dense":   # one expert of width F: p = 1 and the gate 1 (either norm_topk)
        conf = transformers.OlmoeConfig(num_experts=1, num_experts_per_tok=1, norm_topk_prob=False, clip_qkv=None,
                                        attention_bias=False, **kw)
        cls = transformers.OlmoeForCausalLM
    else:
        conf = transformers.Qwen2MoeConfig(num_experts=E, moe_intermediate_size=cfg["H"],
                                           shared_expert_intermediate_size=S * cfg["H"], decoder_sparse_step=cfg["every"],
                                           norm_topk_prob=bool(cfg["norm_topk"]), mlp_only_layers=[],
                                           use_sliding_window=False, sliding_window=None, max_window_layers=cfg["L"],
                                           **moe, **kw)
        cls = transformers.Qwen2MoeForCausalLM
    return cls(conf).float().eval()   # eval: no dropout (all 0 anyway), no router jitter


def pieces(family, cfg):
    """[(transformers parameter name, reference tensor name or None, index into it)]: where each transformers
    parameter lives in the reference's tensors (None: no reference tensor, loaded with zeros: olmoe_dense's router)"""
    NH, KV, F, H, E, V = cfg["NH"], cfg["KV"], cfg["F"], cfg["H"], cfg["E"], cfg["V"]
    hs = cfg["C"] // NH
    SH = cfg["S"] * H
    out = [("model.embed_tokens.weight", "wte", slice(0, V)), ("model.norm.weight", "lnfw", ())]
    if not cfg["tied"]:
        out.append(("lm_head.weight", "head", slice(0, V)))
    qkv = {"q": slice(0, NH * hs), "k": slice(NH * hs, (NH + KV) * hs), "v": slice((NH + KV) * hs, (NH + 2 * KV) * hs)}
    for l, (kind, i) in enumerate(ref.layer_slots(cfg)):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", "ln1w", l), (p + "post_attention_layernorm.weight", "ln2w", l),
                (p + "self_attn.o_proj.weight", "attprojw", l)]
        for x, sl in qkv.items():
            out.append((p + f"self_attn.{x}_proj.weight", "qkvw", (l, sl)))
            if cfg["qkvbias"]:
                out.append((p + f"self_attn.{x}_proj.bias", "qkvb", (l, sl)))
        if cfg["qk_norm"]:
            out += [(p + "self_attn.q_norm.weight", "qnormw", l), (p + "self_attn.k_norm.weight", "knormw", l)]
        if kind == "dense" and family == "olmoe_dense":
            m = p + "mlp.experts.0."
            out += [(p + "mlp.gate.weight", None, None), (m + "gate_proj.weight", "fcw", (i, slice(0, F))),
                    (m + "up_proj.weight", "fcw", (i, slice(F, 2 * F))), (m + "down_proj.weight", "fcprojw", i)]
        elif kind == "dense":
            out += [(p + "mlp.gate_proj.weight", "fcw", (i, slice(0, F))),
                    (p + "mlp.up_proj.weight", "fcw", (i, slice(F, 2 * F))), (p + "mlp.down_proj.weight", "fcprojw", i)]
        else:
            m = p + ("block_sparse_moe." if family == "mixtral" else "mlp.")
            out.append((m + "gate.weight", "routerw", i))
            g, u, d = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
            for e in range(E):
                out += [(m + f"experts.{e}.{g}.weight", "efcw", (i, e, slice(0, H))),
                        (m + f"experts.{e}.{u}.weight", "efcw", (i, e, slice(H, 2 * H))),
                        (m + f"experts.{e}.{d}.weight", "efcprojw", (i, e))]
            if cfg["S"]:
                out += [(m + "shared_expert.gate_proj.weight", "sfcw", (i, slice(0, SH))),
                        (m + "shared_expert.up_proj.weight", "sfcw", (i, slice(SH, 2 * SH))),
                        (m + "shared_expert.down_proj.weight", "sfcprojw", i)]
            if cfg["shared_gate"]:
                out.append((m + "shared_expert_gate.weight", "sgatew", i))
    return out


def load_into(model, family, cfg, init):
    """the reference's weights into the model through pieces(); asserts that every parameter is loaded and that
    the pieces cover every element of every reference tensor once (wte, head: the V real rows)"""
    params = dict(model.named_parameters())   # shared (tied) parameters listed once
    cover = {k: torch.zeros(v.shape, dtype=torch.int32) for k, v in init.items()}
    loaded = set()
    with torch.no_grad():
        for name, rname, idx in pieces(family, cfg):
            t = torch.zeros_like(params[name]) if rname is None else init[rname][idx]
            assert params[name].shape == t.shape, (name, params[name].shape, t.shape)
            params[name].copy_(t)
            loaded.add(name)
            if rname is not None:
                cover[rname][idx] += 1
    assert loaded == set(params), f"not loaded: {sorted(set(params) - loaded)}"
    for k, c in cover.items():
        if k in ("wte", "head"):
            c = c[:cfg["V"]]
        assert bool((c == 1).all()), f"{k}: elements loaded {c.min().item()}..{c.max().item()} times"


def transformers_init(model, family, cfg, seed):
    """the reference's initial weights as transformers initialises the model (hf_model's initializer_range: normal
    weights, the padding row zero), then every norm weight 1 + 0.1 N(0, 1) and every bias 0.05 N(0, 1), seeded;
    copied into the reference's tensors through pieces() (rows V..Vp-1 stay zero)"""
    torch.manual_seed(seed)
    model._init_weights = model._init_weights   # (post_init ran in the constructor: the weights are its)
    params = dict(model.named_parameters())
    init = {k: torch.zeros_like(v) for k, v in ref.init_params(cfg, seed).items()}
    with torch.no_grad():
        for name, p in params.items():
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
        for name, rname, idx in pieces(family, cfg):
            if rname is not None:
                init[rname][idx] = params[name].detach()
    return init


def case_tokens(cfg, ds, nbatch):
    """nbatch batches of the reference's Markov chain (data seed ds); with a padding token, it at every 16th
    position from the 6th (never first in a row: a zero embedding there reaches the router as a zero vector, every
    expert tied)"""
    tokens = ref.markov_tokens(cfg["V"], nbatch * cfg["R"] * cfg["T"] + 1, ds)
    if cfg["pad"] >= 0:
        tokens[5::16] = cfg["pad"]
    return tokens


def routing_seed(cfg, init, seed, nbatch):
    """the first data seed from seed whose nbatch batches route with margins >= MIN_MARGIN (MoE; else seed)"""
    for ds in range(seed, seed + 50):
        tokens = case_tokens(cfg, ds, nbatch)
        if cfg["E"] == 0:
            return ds, tokens, float("inf")
        m = float("inf")
        for b in range(nbatch):
            x, y = ref.batch(tokens, b, cfg)
            log = []
            with torch.no_grad():
                ref.forward(init, x, y, cfg, log)
            m = min(m, ref.min_margin(log, cfg))
        if m >= MIN_MARGIN:
            return ds, tokens, m
    raise SystemExit("no data seed in 50 routes with margins >= 1e-6")


def run_case(family, opts, seed=1337, hf_init=False, nbatch=1):
    """the case's model (the reference's init, or hf_init: transformers' own) on nbatch batches: each batch's loss
    and every gradient compared (check_batch)"""
    _, cfg, _ = ref.parse(BASE + opts.split())
    model = hf_model(family, cfg, 0.05 if hf_init else 0.02)
    if hf_init:
        init = transformers_init(model, family, cfg, seed)
    else:
        init = {k_: v.detach() for k_, v in ref.init_params(cfg, seed).items()}
    ds, tokens, margin = routing_seed(cfg, init, seed, nbatch)
    load_into(model, family, cfg, init)
    rot = model.model.rotary_emb
    inv_ok = torch.equal(rot.inv_freq.float(), ref.rope_inv_freq(cfg))
    cos_hf, sin_hf = rot(torch.zeros(1, dtype=torch.float32), torch.arange(cfg["T"])[None])
    cos_ref, sin_ref = ref.rope_tables(cfg, cfg["T"])
    tab_ok = torch.equal(cos_hf[0], cos_ref) and torch.equal(sin_hf[0], sin_ref)
    print(f"== {family} {opts}{' (transformers init, range 0.05)' if hf_init else ''}  (C {cfg['C']} NH {cfg['NH']} "
          f"KV {cfg['KV']} hs {cfg['C'] // cfg['NH']} F {cfg['F']} theta {cfg['theta']:g}"
          f"{', pad ' + str(cfg['pad']) if cfg['pad'] >= 0 else ''})")
    print(f"   inv_freq bitwise {inv_ok}, cos/sin bitwise {tab_ok}")
    ok = inv_ok and tab_ok
    for b in range(nbatch):
        x, y = ref.batch(tokens, b, cfg)
        if nbatch > 1:
            print(f"   -- batch {b} (pad tokens: {int((x == cfg['pad']).sum()) if cfg['pad'] >= 0 else 0})")
        ok &= check_batch(model, family, cfg, init, x, y, ds, margin)
        model.zero_grad(set_to_none=True)
    return ok


def check_batch(model, family, cfg, init, x, y, ds, margin):
    V, E, k = cfg["V"], cfg["E"], cfg["k"]

    def ref_grads(dtype):
        p = {k_: v.to(dtype).clone().requires_grad_(True) for k_, v in init.items()}
        log = []
        ce, aux, _, loss = ref.forward(p, x, y, cfg, log)
        loss.backward()
        grads = {k_: (v.grad if v.grad is not None else torch.zeros_like(v)) for k_, v in p.items()}
        return loss.item(), aux.item(), log, grads

    loss32, aux32, log32, g32 = ref_grads(torch.float32)
    loss64, aux64, log64, g64 = ref_grads(torch.float64)
    assert all(torch.equal(a["choice"], b["choice"]) for a, b in zip(log32, log64)), "float64 routes otherwise"
    out = model(input_ids=x)
    logits = out.logits                                       # (R, T, V)
    loss_hf = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
    ok = True
    desc = ""
    if E:
        # transformers' routing: torch.topk of the softmax of its router's logits, per MoE layer (all tokens)
        same = len(out.router_logits) == len(log32)
        for rl, r in zip(out.router_logits, log32):
            hf_choice = torch.topk(torch.softmax(rl.float(), dim=-1), k, dim=-1).indices
            same &= torch.equal(hf_choice, r["choice"].reshape(-1, k))
        dropped = sum(float((~r["keep"]).sum()) for r in log32)
        ok &= same and dropped == 0
        desc += (f"   E {E} k {k} H {cfg['H']} S {cfg['S']} every {cfg['every']} norm_topk {cfg['norm_topk']} "
                 f"shared_gate {cfg['shared_gate']} qk_norm {cfg['qk_norm']}; {len(log32)} MoE layers; data seed {ds}, "
                 f"smallest routing margin {margin:.2e} (>= {MIN_MARGIN:.0e}); transformers routes the same: {same}; "
                 f"dropped {dropped:.0f}\n")
        if cfg["aux_coeff"]:
            # one MoE layer, one sequence: transformers' load-balancing loss = k * ours
            assert len(log32) == 1 and cfg["R"] == 1, "the aux definitions coincide only for one layer, one sequence"
            aux_hf = out.aux_loss.float()
            da = abs(aux_hf.item() - k * aux32)
            ta = 4 * k * abs(aux32 - aux64) + 8 * U * abs(k * aux64)
            ok &= da <= ta
            desc += (f"   aux: transformers {aux_hf.item():.7f}, k * ours {k * aux32:.7f} (ours {aux32:.7f}, k {k}) "
                     f"|diff| {da:.1e} (tol {ta:.1e}); loss = CE + {cfg['aux_coeff']} aux (transformers: + "
                     f"{cfg['aux_coeff']}/{k} aux_loss)\n")
            loss_hf = loss_hf + (cfg["aux_coeff"] / k) * aux_hf
    loss_hf.backward()
    hf = {n: p.grad for n, p in model.named_parameters()}
    tol = 4 * abs(loss32 - loss64) + 8 * U * abs(loss64)
    dl = abs(loss_hf.item() - loss32)
    ok &= dl <= tol
    print(desc + f"   loss ref {loss32:.7f} hf {loss_hf.item():.7f} |diff| {dl:.1e} (fp32 floor {abs(loss32 - loss64):.1e}, "
          f"tol {tol:.1e})")
    worst = 0.0
    by_name = {}
    for name, rname, idx in pieces(family, cfg):
        if rname is None:   # olmoe_dense's router: softmax over one expert is constant, its gradient 0
            z = bool((hf[name] == 0).all())
            ok &= z
            print(f"   ({name}: no reference tensor; gradient all zero: {z})")
            continue
        a, b = g32[rname][idx], hf[name]
        d, s = by_name.get(rname, (0.0, 0.0))
        by_name[rname] = (max(d, (a - b).abs().max().item()), max(s, b.abs().max().item()))
    for rname in ref.names(cfg):
        if rname not in by_name:
            continue
        d, scale = by_name[rname]
        f = (g32[rname] - g64[rname]).abs().max().item()
        t = 4 * f + 8 * U * scale
        ok &= d <= t
        worst = max(worst, d / scale)
        print(f"   {rname:8s} max|g| {scale:.2e}  max|ref-hf| {d:.2e} ({d / scale:.1e} of max|g|)  fp32 floor {f:.2e}  "
              f"tol {t:.2e}  ratio {d / max(f, 1e-45):5.2f}  {'ok' if d <= t else 'FAIL'}")
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
    ap.add_argument("--only", choices=("dense", "moe"), default=None, help="the dense cases or the MoE ones")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    moe = lambda f: f in MOE_FAMILIES or f == "olmoe_dense"
    cases = [(f, o) for f, o in CASES if a.only is None or moe(f) == (a.only == "moe")]
    results = [run_case(fam, opts) for fam, opts in cases]
    hf_cases = [(f, o) for f, o in HF_INIT_CASES if a.only is None or moe(f) == (a.only == "moe")]
    results += [run_case(fam, opts, seed=1337 + i, hf_init=True, nbatch=3) for i, (fam, opts) in enumerate(hf_cases)]
    print(f"{sum(results)} of {len(results)} cases passed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
