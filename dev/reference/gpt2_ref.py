#!/usr/bin/python3
"""
PyTorch (fp32, CPU) reference of every model family the trainer trains: GPT-2 exactly as
llm.c defines it, the Llama family (--arch llama: Llama, Mistral, Qwen2: RMSNorm, RoPE,
SwiGLU, GQA) and both with Mixture-of-Experts layers (--E: GPT-2 MoE, Mixtral, OLMoE,
Qwen2-MoE). (The file keeps llm.c's name.)  Writes a *reference state* that the C/CUDA
test harness compares against.

Usage:  /usr/bin/python3 dev/reference/gpt2_ref.py --config tiny|d4 --out DIR
        [--L --C --NH --V --Vp --maxT --T --R --nsteps --lr --clip ... --seed --threads] [--arch llama ...]
        /usr/bin/python3 dev/reference/gpt2_ref.py --check   (finite-difference self-test)

Model: params (llm.c order; per-layer tensors stacked on dim 0; Linear weights are
(out, in), y = x @ W^T + b; qkvw rows = [Q; K; V], head h uses cols h*hs..(h+1)*hs):
  wte (Vp,C) wpe (maxT,C) ln1w ln1b (L,C) qkvw (L,3C,C) qkvb (L,3C) attprojw (L,C,C)
  attprojb (L,C) ln2w ln2b (L,C) fcw (L,4C,C) fcb (L,4C) fcprojw (L,C,4C) fcprojb (L,C)
  lnfw lnfb (C).  LayerNorm eps 1e-5, GELU tanh approximation, tied head
  logits = x @ wte[:V]^T (padded rows never enter the softmax), loss = mean CE.
Init (seed): weights N(0,.02), attprojw/fcprojw N(0,.02/sqrt(2L)), wpe N(0,.01),
  biases N(0,.02), LN weights 1+N(0,.05), LN biases N(0,.02); wte rows V..Vp-1 = 0.
Mixture of Experts (--E E --k K, as llmc/moe.h defines it): layer l is MoE when
  l % every == every-1; its MLP becomes E expert MLPs (same shape, with biases) behind a
  router: p = softmax(x @ routerw^T) over all E (x = the ln2 output, no bias), the top k
  of p with ties to the LOWER expert index (a stable sort: torch.topk leaves ties open),
  gates = p (k = 1) or the k probabilities renormalised to sum 1 (k > 1). Capacity per
  sequence and expert: cap = min(T, ceil(k*T*F1000/(1000*E))) in integers (F1000 =
  round(1000 F); 0 = dropless). Drop policy probs: an expert keeps the cap assignments of
  the sequence with the highest p_e, ties to the earlier position; position: first
  choices before second ones, then earlier position. Dropped assignments add nothing.
  aux (Switch) per sequence = E sum_i f_i P_i, f_i = top-k assignments to i before drops
  / (kT) (no gradient), P_i = mean p_i over the sequence; z per token = lse(logits)^2.
  loss = CE + aux_coeff * mean_seq(sum_layers aux) + z_coeff * mean_tok(sum_layers z).
  MoE tensors follow the 16 dense ones: routerw (Lm,E,C) efcw (Lm,E,4C,C) efcb (Lm,E,4C)
  efcprojw (Lm,E,C,4C) efcprojb (Lm,E,C); the dense fcw..fcprojb hold only the L-Lm
  dense layers. Init: routerw, efcw, efcb, efcprojb N(0,.02), efcprojw N(0,.02/sqrt(2L)).
  Near-ties flip with rounding: the data seed is advanced until every routing decision of
  every step has a margin of at least --min_margin (default 1e-6; moe.bin records it).
  --score sigmoid: p_e = sigmoid(logit_e) each (DeepSeek-V3), gates = the k selected p
  renormalised (k >= 2), aux's P_i = the mean of p_i / sum_e p_e; the z-loss needs z_coeff 0.
  --H H: an expert's hidden width (fine-grained experts; default 4C), efcw (Lm,E,H,C) etc.
  --S S: shared experts, one always-on MLP of width S*H per MoE layer (with biases) added to
  the routed output: sfcw (Lm,S*H,C) sfcb (Lm,S*H) sfcprojw (Lm,C,S*H) sfcprojb (Lm,C) after
  efcprojb (0 layers when S = 0), init as the dense MLP's.
  --bias_rate u (loss-free balancing, DeepSeek-V3): per MoE layer a bias b (E), zero at first,
  chooses the top k of p + b (gates, drops and aux use p; margins are of p + b); after each
  step b -= u * sign(E * load - sum(load)), load = the step's top-k assignments per expert
  before drops (fp32, no gradient).
Llama (--arch llama [--KV --F --theta --norm_eps --tied --qkvbias --rope_scaling llama3 --rope_factor
  --rope_low --rope_high --rope_orig]; dense only, as llama_spec.md) as transformers 4.49's
  LlamaForCausalLM in fp32 (dev/reference/llama_hf_check.py compares it to Llama/Mistral/Qwen2 there):
  KV kv heads (NH), F the MLP width (256 ceil(8C/3/256)), rope theta (500000), RMSNorm eps (1e-5; --eps stays
  AdamW's), head tied to wte (0), q/k/v biases (0), llama3 rope scaling (factor 8, low 1, high 4, orig 8192);
  theta, eps and the scaling factors are rounded to float32 (the model file's slots). 26 tensors, absent
  ones empty: wte (Vp,C) wpe - ln1w (L,C) ln1b - qkvw (L,(NH+2KV)hs,C) rows [q; k; v] qkvb (L,(NH+2KV)hs)
  or - attprojw (L,C,C) attprojb - ln2w (L,C) ln2b - fcw (L,2F,C) rows [gate; up] fcb - fcprojw (L,C,F)
  fcprojb - lnfw (C) lnfb -, the 9 MoE names -, head (Vp,C) (untied) or -. RMSNorm w x rsqrt(mean(x^2)+eps);
  rope rotate-half on q, k: inv_freq = 1/theta^(2i/hs) (and the llama3 rescaling) in fp32 as transformers
  computes it, angle = float(pos) inv_freq (fp32), out = x cos + (-x2, x1) sin; query head h reads kv head
  h // (NH/KV); h = silu(gate) up; logits = x @ (head or wte)[:V]^T. Init: ln*w 1+N(0,.05), qkvb,
  wte, qkvw, fcw, head N(0,.02), attprojw, fcprojw N(0,.02/sqrt(2L)), rows V..Vp-1 of wte and head 0.
  Weight decay on wte, qkvw, attprojw, fcw, fcprojw, head.
  --pad ID (-1: none): transformers' pad_token_id, nn.Embedding's padding_idx: the lookup of that token passes no
  gradient to its wte row (a tied head's gradient still reaches it); header slot 29 = ID + 1; the data holds ID at
  every 16th position from the 6th.
  --qk_norm 1 (OLMoE; dense or MoE): q = RMSNorm(q_proj x (+b)) over the whole NH hs projection (weight qnormw
  (L, NH hs)), k likewise over KV hs (knormw (L, KV hs)), eps = norm_eps, before rope; init 1+N(0,.05), no decay.
MoE on the Llama body (--arch llama --E E --k K, moe_llama_spec.md; Mixtral, OLMoE, Qwen2-MoE): routing, capacity
  per sequence (the capacity factor is --cap here, --F being the MLP's width; default 1.25, 0 dropless), drop
  policies, aux, z, sigmoid scores, routing bias, margins and the data-seed search exactly as GPT-2's above, except:
  experts are SwiGLU without biases, efcw (Lm,E,2H,C) rows [gate (H); up (H)], efcprojw (Lm,E,C,H), efcb and
  efcprojb empty; H defaults to F. --norm_topk 1 (default): the k gates renormalised to sum 1 (k > 1, GPT-2's
  rule, Mixtral), 0: the gates are the k p themselves (OLMoE, Qwen2-MoE norm_topk_prob False). Shared experts
  (--S): one SwiGLU MLP of width S*H, sfcw (Ls,2SH,C) rows [gate; up], sfcprojw (Ls,C,SH), no biases;
  --shared_gate 1 (Qwen2-MoE, needs --S): its output scaled per token by sigmoid(x . sgatew[i]), sgatew (Lm,1,C).
  Dense layers (l % every != every-1) keep fcw (Ld,2F,C), fcprojw (Ld,C,F). 29 tensors: the 16 dense names,
  the 9 MoE names, head, sgatew, qnormw, knormw (absent ones empty). Init: routerw, efcw, sfcw, sgatew N(0,.02),
  efcprojw, sfcprojw N(0,.02/sqrt(2L)). Weight decay on every matrix (router, experts, shared, sgatew).
  dev/reference/llama_hf_check.py compares it to transformers' Mixtral, OLMoE and Qwen2-MoE.
Training: step s uses R rows of T tokens: row i inputs = tok[s*D+i*T : +T], targets
  shifted by one (D = R*T).  Global-norm clip, then llm.c AdamW (hand written), weight
  decay only on wte, wpe, qkvw, attprojw, fcw, fcprojw; llm.c cosine lr with warmup.

Files in DIR (all little-endian):
  model.bin      int32 hdr[256] = {20240326, 3, maxT, V, L, NH, C, Vp, 0...}, then the 16
                 INITIAL tensors as fp32 (wte with all Vp rows). Llama: version 33, hdr[8..13] = 0 (dense;
                 MoE: E, k, every, scores (1 sigmoid), S, H), [14] 1 (arch), [15] KV, [16] F, [17] tied,
                 [18] qkvbias, [19] theta, [20] eps (float32 bits), [21] rope scaling (0 none, 1 llama3),
                 [22..24] factor, low, high (float32 bits), [25] orig ([22..25] 0 without scaling),
                 [26] norm_topk (0 when dense), [27] shared_gate, [28] qk_norm, [29] pad + 1 (0: none), [255] 0
                 (no CRC), then the 29
                 tensors, then (E > 0) the routing bias (Lm, E) fp32 (zero). GPT-2 MoE: version 13 and
                 hdr[8..10] = E, k, every, then the 25 tensors; with sigmoid scores, shared or
                 fine-grained experts version 23, hdr[11] = scores (1 sigmoid), [12] S, [13] H,
                 and after the tensors the routing bias (Lm, E) fp32 (zero)
  model_bf16.bin same with hdr[1] = 5 (MoE: 15, 25; Llama: 35) and tensors as bf16 (round-to-nearest-even;
                 the routing bias stays fp32)
  data.bin       int32 hdr[256] = {20240520, 1, ntok, 0...}, then ntok uint16 tokens,
                 ntok = (nsteps+1)*D + 1, seeded random first-order Markov chain
  state.bin      int32 hdr[256] = {20241129, 1, T, R, nsteps, warmup, 0...}
                 fp32 fhdr[256] = {lr, b1, b2, eps, weight_decay, clip, final_frac,
                                   loss0, gradnorm0, muon (1 or 0), its momentum, fp64_dist (Muon, MoE: the
                                   losses' and norms' worst relative distance from the fp64 run's, fp64_twin), 0...}
                 16 fp32 gradient tensors of step 0 (raw, before clipping; llm.c order)
                 fp32 step_losses[nsteps], fp32 step_norms[nsteps] (pre-clip norms)
                 16 fp32 parameter tensors after the last step (MoE: 25 tensors, Llama: the 29 of
                 model.bin, empty ones writing nothing, both times)
  moe.bin        (MoE only) int32 hdr[256] = {20241130, 3, E, k, every, F1000, policy (0 probs,
                 1 position), Lm, R, T, nsteps, 1 (loads and bias below), 0...}; fp32 fhdr[256] =
                 {aux_coeff, z_coeff, aux0, z0, dropped0, min_margin, bias_rate, 0...};
                 step 0: int32 choice[Lm][R][T][k] (the
                 experts in order of p), int32 keep[Lm][R][T][k], fp32 topk_margin[Lm][R][T]
                 (smallest gap between consecutive sorted p among the first min(k,E-1)+1),
                 fp32 cap_margin[Lm][R][E] (probs policy, more candidates than cap: p of the
                 last kept minus p of the first dropped; else inf); then fp32 aux[nsteps],
                 z[nsteps], dropped[nsteps] (fraction of assignments dropped); int32
                 load[nsteps][Lm][E] (each step's top-k assignments per expert, before drops);
                 fp32 bias[Lm][E] (the routing bias after the last step); fp32 drift[nsteps] (the
                 scores' largest distance from the fp64 run's so far, fp64_twin), int32 allow[nsteps][Lm]
                 (the top-k assignments per layer that another fp32 run may route otherwise, times 2)
  dterm.bin      int32 hdr[256] = {20241204, 1, nprobes, 0...}, then per parameter (the tensors of state.bin's
                 gradients, in order) fp32: the rms change of its step-0 gradient when every attention row's D =
                 rowsum(dY o Y) carries the error of one bf16 rounding of Y (d_term: over nprobes draws); test_gpt's
                 bf16 tolerance of each block adds its share
  README.txt     human-readable summary
"""
import argparse, math, os, sys, time
import contextlib
import io
import numpy as np
import torch

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
MOE_NAMES = ["routerw", "efcw", "efcb", "efcprojw", "efcprojb", "sfcw", "sfcb", "sfcprojw", "sfcprojb"]
LLAMA_TAIL = ["head", "sgatew", "qnormw", "knormw"]   # the family file's last four (after the 9 MoE names)
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw", "routerw", "efcw", "efcprojw", "sfcw", "sfcprojw", "head",
           "sgatew"}
CONFIGS = {
    "tiny": dict(L=4, C=64, NH=4, V=250, Vp=256, maxT=64, T=32, R=8, lr=3e-3, clip=0.6),
    "d4": dict(L=4, C=256, NH=4, V=50257, Vp=50304, maxT=1024, T=64, R=4, lr=1e-3, clip=1.0),
}
MOE_DEFAULTS = dict(E=0, k=1, every=1, F=1.25, policy="probs", aux_coeff=0.01, z_coeff=0.001, score="softmax",
                    bias_rate=0.0)

def is_moe_layer(cfg, l):
    return cfg["E"] > 0 and l % cfg["every"] == cfg["every"] - 1

def layer_slots(cfg):
    """layer l -> ("dense", index among the dense layers) or ("moe", index among the MoE layers)"""
    slots, nd, nm = [], 0, 0
    for l in range(cfg["L"]):
        if is_moe_layer(cfg, l):
            slots.append(("moe", nm)); nm += 1
        else:
            slots.append(("dense", nd)); nd += 1
    return slots

def layer_slots_moe(cfg):
    return [i for kind, i in layer_slots(cfg) if kind == "moe"]

def is_llama(cfg):
    return cfg.get("arch", "gpt2") == "llama"

def names(cfg):
    if is_llama(cfg):   # the family file's table: the 16 dense names, the 9 MoE names, head, sgatew, qnormw, knormw
        return NAMES + MOE_NAMES + LLAMA_TAIL
    return NAMES + (MOE_NAMES if cfg["E"] > 0 else [])

def llama_shapes(cfg):
    """the family file's 29 tensors; an absent one has shape (0,). Dense layers: fcw, fcprojw (Ld of them);
    MoE layers (Lm): SwiGLU experts and shared experts without biases (moe_llama_spec.md)"""
    L, C, Vp, NH, KV, F, E = (cfg[k] for k in ("L", "C", "Vp", "NH", "KV", "F", "E"))
    hs, z = C // NH, (0,)
    Q = (NH + 2 * KV) * hs
    Lm = len(layer_slots_moe(cfg))
    Ld = L - Lm
    if E > 0:
        H, SH = cfg["H"], cfg["S"] * cfg["H"]
        Ls = Lm if cfg["S"] > 0 else 0
        moe = [(Lm, E, C), (Lm, E, 2 * H, C), z, (Lm, E, C, H), z, (Ls, 2 * SH, C), z, (Ls, C, SH), z]
    else:
        moe = [z] * len(MOE_NAMES)
    return ([(Vp, C), z, (L, C), z, (L, Q, C), (L, Q) if cfg["qkvbias"] else z, (L, C, C), z,
             (L, C), z, (Ld, 2 * F, C), z, (Ld, C, F), z, (C,), z] + moe
            + [z if cfg["tied"] else (Vp, C), (Lm, 1, C) if cfg["shared_gate"] else z,
               (L, NH * hs) if cfg["qk_norm"] else z, (L, KV * hs) if cfg["qk_norm"] else z])

def param_shapes(cfg):
    if is_llama(cfg):
        return llama_shapes(cfg)
    L, C, V, Vp, maxT, E = cfg["L"], cfg["C"], cfg["V"], cfg["Vp"], cfg["maxT"], cfg["E"]
    Lm = sum(1 for l in range(L) if is_moe_layer(cfg, l))
    Ld = L - Lm
    shapes = [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
              (L, C), (L, C), (Ld, 4 * C, C), (Ld, 4 * C), (Ld, C, 4 * C), (Ld, C), (C,), (C,)]
    if E > 0:
        H, SH = cfg["H"], cfg["S"] * cfg["H"]
        Ls = Lm if cfg["S"] > 0 else 0   # the shared experts: one MLP of width S*H per MoE layer
        shapes += [(Lm, E, C), (Lm, E, H, C), (Lm, E, H), (Lm, E, C, H), (Lm, E, C),
                   (Ls, SH, C), (Ls, SH), (Ls, C, SH), (Ls, C)]
    return shapes

def init_params(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    proj_std = 0.02 / math.sqrt(2 * cfg["L"])
    params = {}
    for name, shape in zip(names(cfg), param_shapes(cfg)):
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if name in ("ln1w", "ln2w", "lnfw", "qnormw", "knormw"):
            t = 1.0 + 0.05 * r                      # LN (and QK-norm) weights 1 + N(0, 0.05)
        elif name in ("attprojw", "fcprojw", "efcprojw", "sfcprojw"):
            t = proj_std * r
        elif name == "wpe":
            t = 0.01 * r
        else:
            t = 0.02 * r                            # other weights, biases, LN biases
        if name in ("wte", "head"):
            t[cfg["V"]:] = 0.0                      # padded vocab rows are exactly zero
        params[name] = t
    if cfg.get("skew"):
        # every token to expert 0: the ln2 bias of each MoE layer is 5 u (u a random unit
        # vector) and router row 0 is u, so logit 0 = 5 + O(1) and the others O(0.2)
        for l, (kind, i) in enumerate(layer_slots(cfg)):
            if kind == "moe":
                u = torch.randn(cfg["C"], generator=g)
                u = u / u.norm()
                params["ln2b"][l] = 5.0 * u
                params["routerw"][i, 0] = u
    return {k: v.requires_grad_(True) for k, v in params.items()}

# ----------------------------------------------------------------------------- model
def layernorm(x, w, b, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)   # biased variance
    return (x - mean) / torch.sqrt(var + eps) * w + b

def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

# The attention backward's D: a kernel takes D = rowsum(dY o Y) from the stored Y (FlashAttention's recipe; ours in
# every path), and dS = P (dP - D) cancels, so D's bf16 error reaches dq and dk magnified. d_term measures by how much:
# ATTEND_D runs the backward that way, D_NOISE (a generator) adds to each row's D a draw of its error.
ATTEND_D, D_NOISE = False, None
D_SIGMA = 2.0 ** -8 / (2.0 * math.sqrt(3.0))   # one bf16 rounding of Y: each element's relative error's rms (u = 2^-8)

class AttendD(torch.autograd.Function):
    """y = P v, P = softmax(causal q k^T scale); backward with D = rowsum(dy o y) (+ D_NOISE's draw: D_SIGMA
    sqrt(rowsum((dy o y)^2)) N(0, 1), the error of D from a y rounded once, each element independently)"""
    @staticmethod
    def forward(ctx, q, k, v, scale):
        T = q.shape[-2]
        mask = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
        P = torch.softmax(((q @ k.transpose(-2, -1)) * scale).masked_fill(mask, float("-inf")), dim=-1)
        y = P @ v
        ctx.save_for_backward(q, k, v, P, y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, dy):
        q, k, v, P, y = ctx.saved_tensors
        prod = dy * y
        D = prod.sum(-1, keepdim=True)
        if D_NOISE is not None:
            D = D + D_SIGMA * prod.pow(2).sum(-1, keepdim=True).sqrt() * torch.randn(D.shape, generator=D_NOISE)
        dS = P * (dy @ v.transpose(-2, -1) - D)
        return dS @ k * ctx.scale, dS.transpose(-2, -1) @ q * ctx.scale, P.transpose(-2, -1) @ dy, None

def attend(q, k, v, hs):
    """causal attention of q over k, v (B, NH, T, hs) -> (B, NH, T, hs)"""
    if ATTEND_D:
        return AttendD.apply(q, k, v, 1.0 / math.sqrt(hs))
    T = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))   # (B, NH, T, T)
    mask = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)  # True above diagonal
    att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
    return att @ v

def attention(x, w, b, NH):
    B, T, C = x.shape
    hs = C // NH
    qkv = x @ w.t() + b                                         # (B, T, 3C)
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    q = q.reshape(B, T, NH, hs).transpose(1, 2)                 # (B, NH, T, hs)
    k = k.reshape(B, T, NH, hs).transpose(1, 2)
    v = v.reshape(B, T, NH, hs).transpose(1, 2)
    y = attend(q, k, v, hs)                                     # (B, NH, T, hs)
    return y.transpose(1, 2).reshape(B, T, C)

def capacity(cfg, T):
    """per sequence and expert, in integers: min(T, ceil(k*T*F1000 / (1000*E))); F = 0: dropless"""
    if cfg["F1000"] == 0:
        return T
    return min(T, -(-(cfg["k"] * T * cfg["F1000"]) // (1000 * cfg["E"])))

def route(probs, k):
    """top k of p per token, ties to the lower expert index: a stable sort of -p keeps equal
    values in index order. Also the smallest gap between consecutive sorted p among the
    first min(k, E-1) + 1 (the margin of the decision)."""
    sp, order = torch.sort(-probs, dim=-1, stable=True)
    E = probs.shape[-1]
    J = min(k, E - 1)
    margin = torch.full(probs.shape[:-1], float("inf"))
    if J > 0:
        margin = (sp[..., 1:J + 1] - sp[..., :J]).min(dim=-1).values
    return order[..., :k], margin

def keep_assignments(choice, probs, cap, policy):
    """(B, T, k) keep mask: per sequence and expert the cap best assignments (probs: highest
    p_e, then earlier position; position: first choices first, then earlier position), and
    the capacity margin (B, E) of the probs policy."""
    B, T, k = choice.shape
    E = probs.shape[-1]
    keep = torch.zeros(B, T, k, dtype=torch.bool)
    margin = torch.full((B, E), float("inf"))
    ch, pr = choice.tolist(), probs.tolist()
    for b in range(B):
        cand = [[] for _ in range(E)]
        for t in range(T):
            for j in range(k):
                cand[ch[b][t][j]].append((t, j))
        for e in range(E):
            if policy == "probs":
                order = sorted(cand[e], key=lambda tj: (-pr[b][tj[0]][e], tj[0]))
                if len(order) > cap:
                    margin[b, e] = pr[b][order[cap - 1][0]][e] - pr[b][order[cap][0]][e]
            else:
                order = sorted(cand[e], key=lambda tj: (tj[1], tj[0]))
            for t, j in order[:cap]:
                keep[b, t, j] = True
    return keep, margin

def swiglu(h):
    """h (..., 2n) = [gate | up] -> silu(gate) * up (..., n)"""
    n = h.shape[-1] // 2
    return torch.nn.functional.silu(h[..., :n]) * h[..., n:]

def moe_mlp(x, p, i, cfg, log):
    """x (B, T, C) the ln2 output -> MLP output (B, T, C), aux per sequence (B), z per token (B, T);
    GPT-2: GELU experts with biases; Llama: SwiGLU experts without (moe_llama_spec.md)"""
    B, T, C = x.shape
    E, k, llama = cfg["E"], cfg["k"], is_llama(cfg)
    logits = x @ p["routerw"][i].t()                          # (B, T, E)
    sigmoid = cfg["score"] == "sigmoid"
    probs = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    bias = cfg["bias"][i] if "bias" in cfg else torch.zeros(E)
    choice, topk_margin = route(probs.detach() + bias, k)     # (B, T, k), chosen by p + b
    sel = probs.gather(-1, choice)
    renorm = cfg.get("norm_topk", 1) and not (k == 1 and not sigmoid)   # GPT-2: always 1
    gates = sel / sel.sum(dim=-1, keepdim=True) if renorm else sel
    keep, cap_margin = keep_assignments(choice, probs.detach(), capacity(cfg, T), cfg["policy"])
    out = torch.zeros_like(x)
    for e in range(E):
        b_idx, t_idx, j_idx = ((choice == e) & keep).nonzero(as_tuple=True)
        if len(b_idx) == 0:
            continue
        if llama:   # SwiGLU, no biases, efcw rows [gate (H); up (H)]
            y = swiglu(x[b_idx, t_idx] @ p["efcw"][i, e].t()) @ p["efcprojw"][i, e].t()
        else:
            h = gelu_tanh(x[b_idx, t_idx] @ p["efcw"][i, e].t() + p["efcb"][i, e])
            y = h @ p["efcprojw"][i, e].t() + p["efcprojb"][i, e]
        out = out.index_put((b_idx, t_idx), gates[b_idx, t_idx, j_idx].unsqueeze(-1) * y, accumulate=True)
    if cfg["S"] > 0 and llama:   # one SwiGLU MLP of width S*H, scaled per token by sigmoid(x . sgatew) (Qwen2-MoE)
        s = swiglu(x @ p["sfcw"][i].t()) @ p["sfcprojw"][i].t()
        out = out + (torch.sigmoid(x @ p["sgatew"][i].t()) * s if cfg["shared_gate"] else s)
    elif cfg["S"] > 0:   # the shared experts: every token, one MLP of width S*H
        out = out + gelu_tanh(x @ p["sfcw"][i].t() + p["sfcb"][i]) @ p["sfcprojw"][i].t() + p["sfcprojb"][i]
    counts = torch.nn.functional.one_hot(choice, E).sum(dim=(1, 2))                 # (B, E)
    f = counts.to(x.dtype) / (k * T)                                                # no gradient
    P = (probs / probs.sum(dim=-1, keepdim=True) if sigmoid else probs).mean(dim=1)
    aux = E * (f * P).sum(dim=-1)                              # (B)
    log.append(dict(choice=choice, keep=keep, topk_margin=topk_margin, cap_margin=cap_margin, score=probs.detach() + bias,
                    dropped=float((~keep).sum()) / keep.numel(), load=counts.sum(dim=0)))
    return out, aux, lse ** 2

def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

def rope_inv_freq(cfg):
    """(hs/2) fp32, as transformers 4.49 computes it (_compute_default_rope_parameters, then
    _compute_llama3_parameters with llama3 scaling)"""
    hs = cfg["C"] // cfg["NH"]
    inv_freq = 1.0 / (cfg["theta"] ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    if cfg["rope_kind"] == 1:
        factor, low, high, old = cfg["rope_factor"], cfg["rope_low"], cfg["rope_high"], cfg["rope_orig"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
        is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv_freq = torch.where(is_medium, smoothed, inv_freq_llama)
    return inv_freq

def rope_tables(cfg, T):
    """cos, sin (T, hs) fp32: angle = float(pos) * inv_freq (one fp32 product), halves repeated"""
    freqs = torch.arange(T).float()[:, None] * rope_inv_freq(cfg)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()

def rope(x, cos, sin):
    """rotate-half: out = x cos + (-x2, x1) sin, x (B, heads, T, hs)"""
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

def attention_llama(x, w, b, cfg, cos, sin, qn=None, kn=None):
    """qn, kn: the QK-norm weights (OLMoE: RMSNorm over the whole q / k projection, before rope) or None"""
    B, T, C = x.shape
    NH, KV = cfg["NH"], cfg["KV"]
    hs = C // NH
    qkv = x @ w.t()                                             # (B, T, (NH + 2 KV) hs)
    if b.numel():
        qkv = qkv + b
    q, k, v = qkv[..., :NH * hs], qkv[..., NH * hs:(NH + KV) * hs], qkv[..., (NH + KV) * hs:]
    if qn is not None:
        q, k = rmsnorm(q, qn, cfg["norm_eps"]), rmsnorm(k, kn, cfg["norm_eps"])
    q = q.reshape(B, T, NH, hs).transpose(1, 2)
    k = k.reshape(B, T, KV, hs).transpose(1, 2)
    v = v.reshape(B, T, KV, hs).transpose(1, 2)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    k = k.repeat_interleave(NH // KV, dim=1)                    # query head h reads kv head h // (NH/KV)
    v = v.repeat_interleave(NH // KV, dim=1)
    return attend(q, k, v, hs).transpose(1, 2).reshape(B, T, C)

def forward_llama(p, idx, cfg, log):
    """-> the logits (B, T, V) of LlamaForCausalLM (transformers 4.49; with MoE layers Mixtral, OLMoE,
    Qwen2-MoE), aux per sequence (B) and z per token (B, T) summed over the MoE layers"""
    B, T = idx.shape
    F, eps = cfg["F"], cfg["norm_eps"]
    cos, sin = (t.to(p["wte"].dtype) for t in rope_tables(cfg, T))   # fp32 tables, as transformers
    x = p["wte"][idx]
    if cfg["pad"] >= 0:   # nn.Embedding's padding_idx: the padding token's row gets no gradient from the lookup
        x = torch.where((idx == cfg["pad"]).unsqueeze(-1), p["wte"].detach()[idx], x)
    aux, z = x.new_zeros(B), x.new_zeros(B, T)
    for l, (kind, i) in enumerate(layer_slots(cfg)):
        h = rmsnorm(x, p["ln1w"][l], eps)
        b = p["qkvb"][l] if cfg["qkvbias"] else p["qkvb"]
        qn, kn = (p["qnormw"][l], p["knormw"][l]) if cfg["qk_norm"] else (None, None)
        x = x + attention_llama(h, p["qkvw"][l], b, cfg, cos, sin, qn, kn) @ p["attprojw"][l].t()
        h = rmsnorm(x, p["ln2w"][l], eps)
        if kind == "moe":
            y, a, zz = moe_mlp(h, p, i, cfg, log)
            x, aux, z = x + y, aux + a, z + zz
        else:
            fc = h @ p["fcw"][i].t()                            # (B, T, 2F) = [gate | up]
            h = torch.nn.functional.silu(fc[..., :F]) * fc[..., F:]
            x = x + h @ p["fcprojw"][i].t()
    x = rmsnorm(x, p["lnfw"], eps)
    return x @ (p["wte"] if cfg["tied"] else p["head"])[:cfg["V"]].t(), aux, z

def forward(p, idx, targets, cfg, log=None):
    """-> (CE, aux, z, the optimised loss CE + aux_coeff aux + z_coeff z); log collects the
    routing of each MoE layer"""
    B, T = idx.shape
    log = [] if log is None else log
    if is_llama(cfg):
        logits, aux, z = forward_llama(p, idx, cfg, log)
        logprobs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        ce = -logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).mean()
        if cfg["E"] == 0:
            zero = ce.new_zeros(())
            return ce, zero, zero, ce
        aux, z = aux.mean(), z.mean()
        return ce, aux, z, ce + cfg["aux_coeff"] * aux + cfg["z_coeff"] * z
    x = p["wte"][idx] + p["wpe"][:T]
    aux, z = x.new_zeros(B), x.new_zeros(B, T)
    for l, (kind, i) in enumerate(layer_slots(cfg)):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        h = attention(h, p["qkvw"][l], p["qkvb"][l], cfg["NH"])
        x = x + h @ p["attprojw"][l].t() + p["attprojb"][l]
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        if kind == "moe":
            y, a, zz = moe_mlp(h, p, i, cfg, log)
            x, aux, z = x + y, aux + a, z + zz
        else:
            h = gelu_tanh(h @ p["fcw"][i].t() + p["fcb"][i])
            x = x + h @ p["fcprojw"][i].t() + p["fcprojb"][i]
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"][:cfg["V"]].t()                        # (B, T, V), tied head
    logprobs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    nll = -logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ce, aux, z = nll.mean(), aux.mean(), z.mean()
    if cfg["E"] == 0:
        return ce, aux, z, ce
    return ce, aux, z, ce + cfg["aux_coeff"] * aux + cfg["z_coeff"] * z

# ----------------------------------------------------------------------------- data
def markov_tokens(V, ntok, seed, K=8, floor=0.1):
    """Random first-order Markov chain: each symbol has K likely successors holding
    (1-floor) of the mass (random Dirichlet weights), plus a uniform floor."""
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, V, size=(V, K))
    cum = np.cumsum(rng.dirichlet(np.ones(K), size=V), axis=1)
    u_floor, u_pick, u_any = rng.random(ntok), rng.random(ntok), rng.integers(0, V, ntok)
    tok = np.empty(ntok, dtype=np.uint16)
    prev = int(u_any[0])
    tok[0] = prev
    for i in range(1, ntok):
        if u_floor[i] < floor:
            prev = int(u_any[i])
        else:
            j = min(int(np.searchsorted(cum[prev], u_pick[i] * cum[prev, -1])), K - 1)
            prev = int(succ[prev, j])
        tok[i] = prev
    return tok

def batch(tokens, s, cfg):
    T, R = cfg["T"], cfg["R"]
    base = s * R * T
    rows = [tokens[base + i * T: base + i * T + T + 1].astype(np.int64) for i in range(R)]
    a = torch.from_numpy(np.stack(rows))
    return a[:, :-1].contiguous(), a[:, 1:].contiguous()

# ----------------------------------------------------------------------------- training
def lr_at(s, a):
    if s < a.warmup:
        return a.lr * (s + 1) / a.warmup
    decay = (s - a.warmup) / (a.nsteps - a.warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay))
    min_lr = a.lr * a.final_frac
    return min_lr + coeff * (a.lr - min_lr)

def grad_norm(params):
    # sum of squares accumulated in float64 for an accurate reference value
    return math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params.values()))

def min_margin(log, cfg):
    """the smallest decision margin of the routing (top-k order, and capacity with the probs policy)"""
    m = float("inf")
    for r in log:
        m = min(m, float(r["topk_margin"].min()))
        if cfg["policy"] == "probs":
            m = min(m, float(r["cap_margin"].min()))
    return m

# ----------------------------------------------------------------------------- Muon
MUON = ("qkvw", "attprojw", "fcw", "fcprojw", "efcw", "efcprojw", "sfcw", "sfcprojw")

def muon_matrices(cfg, k, t):
    """the Muon matrices of tensor k (t: the parameter or a tensor shaped like it), as 2-D views: per layer (and
    expert), q, k and v each, SwiGLU's gate and up each (llmc/muon.h's list)"""
    if t.numel() == 0:
        return []
    rows = t.shape[-2]
    if k == "qkvw":
        hs = cfg["C"] // cfg["NH"]
        parts = [cfg["NH"] * hs, cfg["KV"] * hs, cfg["KV"] * hs] if is_llama(cfg) else [rows // 3] * 3
    elif k in ("fcw", "efcw", "sfcw") and is_llama(cfg):
        parts = [rows // 2] * 2          # [gate; up]
    else:
        parts = [rows]
    out = []
    for w in t.reshape(-1, rows, t.shape[-1]):   # (a view: every leading index, layers and experts)
        r0 = 0
        for n in parts:
            out.append(w[r0:r0 + n])
            r0 += n
    return out

def newton_schulz(u):
    """torch.optim.Muon's orthogonalisation (5 steps, its coefficients, the norm clamped at 1e-7), in u's dtype"""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = u / u.norm().clamp_min(1e-7)
    tr = x.shape[0] > x.shape[1]
    if tr:
        x = x.T
    for _ in range(5):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tr else x

def muon_update(p, g, mom, cfg, k, lr, a):
    """M = mu M + (1-mu) g, U = (1-mu) g + mu M (torch.optim.Muon's lerps, Nesterov); each matrix
    W = W (1 - lr wd) - lr 0.2 sqrt(max(A, B)) NS(U) (adjust_lr_fn "match_rms_adamw")"""
    mom.lerp_(g, 1.0 - a.muon_momentum)
    u = g.lerp(mom, a.muon_momentum)
    for w, um in zip(muon_matrices(cfg, k, p), muon_matrices(cfg, k, u)):
        o = newton_schulz(um)
        w.mul_(1.0 - lr * a.weight_decay)
        w.add_(o, alpha=-lr * 0.2 * math.sqrt(max(w.shape)))

def train(params, tokens, cfg, a):
    """-> per step: CE losses, pre-clip norms, aux, z, dropped fraction, the smallest routing
    margin; the step-0 gradients and routing log"""
    m = {k: torch.zeros_like(v) for k, v in params.items()}
    vv = {k: torch.zeros_like(v) for k, v in params.items()}
    hist = dict(losses=[], norms=[], aux=[], z=[], dropped=[], loads=[], scores=[], margin=float("inf"))
    grads0, log0 = None, None
    for s in range(a.nsteps):
        for p in params.values():
            p.grad = None
        x, y = batch(tokens, s, cfg)
        log = []
        ce, aux, z, loss = forward(params, x, y, cfg, log)
        loss.backward()
        for p in params.values():   # tensors of no layer (the dense MLP when every layer is MoE)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if s == 0:
            grads0 = {k: p.grad.detach().clone() for k, p in params.items()}
            log0 = log
        norm = grad_norm(params)
        scale = a.clip / norm if norm > a.clip else 1.0
        lr, t = lr_at(s, a), s + 1
        with torch.no_grad():
            for k, p in params.items():
                wd = a.weight_decay if k in DECAYED else 0.0
                g = p.grad * scale
                if a.optimizer == "muon" and k in MUON:
                    muon_update(p, g, m[k], cfg, k, lr, a)
                    continue
                m[k] = a.b1 * m[k] + (1.0 - a.b1) * g
                vv[k] = a.b2 * vv[k] + (1.0 - a.b2) * g * g
                mhat = m[k] / (1.0 - a.b1 ** t)
                vhat = vv[k] / (1.0 - a.b2 ** t)
                p -= lr * (mhat / (torch.sqrt(vhat) + a.eps) + wd * p)
            if cfg["E"] and cfg["bias_rate"] > 0:   # loss-free balancing, in fp32 like the parameters
                for i, r in enumerate(log):
                    d = cfg["E"] * r["load"] - r["load"].sum()
                    cfg["bias"][i] -= cfg["bias_rate"] * torch.sign(d).to(torch.float32)
        hist["losses"].append(float(ce))
        hist["norms"].append(norm)
        hist["aux"].append(float(aux))
        hist["z"].append(float(z))
        hist["dropped"].append(sum(r["dropped"] for r in log) / len(log) if log else 0.0)
        hist["loads"].append([r["load"].tolist() for r in log])
        hist["scores"].append([r["score"] for r in log])
        hist["margin"] = min(hist["margin"], min_margin(log, cfg))
        moe = f"  aux {float(aux):.6f}  z {float(z):.6f}  dropped {hist['dropped'][-1]:.4f}" if cfg["E"] else ""
        print(f"step {s:3d}  loss {float(ce):.6f}  norm {norm:.6f}  lr {lr:.3e}"
              f"  clip {'yes' if norm > a.clip else 'no '}{moe}")
    return hist, grads0, log0

# ----------------------------------------------------------------------------- files
def header(*vals, dtype=np.int32):
    h = np.zeros(256, dtype=dtype)
    h[:len(vals)] = vals
    return h.tobytes()

def to_bf16(t):
    u = t.detach().contiguous().numpy().astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16           # round to nearest even
    return u.astype(np.uint16).tobytes()

def f32(t):
    return t.detach().contiguous().numpy().astype("<f4").tobytes()

def f32_bits(x):
    return int(np.array([x], dtype="<f4").view("<i4")[0])

def llama_header(cfg):
    """model file header slots 14..25 (llama_spec.md); the scaling slots are 0 without scaling"""
    sc = cfg["rope_kind"] == 1
    return [1, cfg["KV"], cfg["F"], int(cfg["tied"]), int(cfg["qkvbias"]), f32_bits(cfg["theta"]),
            f32_bits(cfg["norm_eps"]), cfg["rope_kind"]] + ([f32_bits(cfg["rope_factor"]), f32_bits(cfg["rope_low"]),
            f32_bits(cfg["rope_high"]), cfg["rope_orig"]] if sc else [0, 0, 0, 0])

def write_all(out, cfg, a, init, tokens, hist, grads0, log0, final):
    os.makedirs(out, exist_ok=True)
    moe, llama = cfg["E"] > 0, is_llama(cfg)
    # versions 23/25: sigmoid scores, shared or fine-grained experts (header [11] scores, [12] S, [13] H);
    # the Llama family file (33/35) has every slot, and the routing bias whenever E > 0
    v2 = moe and (llama or cfg["score"] == "sigmoid" or cfg["S"] > 0 or cfg["H"] != 4 * cfg["C"])
    mh = [cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]] + ([cfg["E"], cfg["k"], cfg["every"]] if moe else [])
    mh += [int(cfg["score"] == "sigmoid"), cfg["S"], cfg["H"]] if v2 else []
    if llama:   # versions 33/35: [8..13] the MoE fields (0 when dense), [14..25] the Llama fields, [26..29]
        mh += [0] * (0 if moe else 6) + llama_header(cfg)
        mh += [int(moe and cfg["norm_topk"]), cfg["shared_gate"], cfg["qk_norm"], cfg["pad"] + 1]
    for fname, version, conv in (("model.bin", 3, f32), ("model_bf16.bin", 5, to_bf16)):
        with open(os.path.join(out, fname), "wb") as f:
            f.write(header(20240326, version + (30 if llama else (20 if v2 else 10) if moe else 0), *mh))
            for k in names(cfg):
                f.write(conv(init[k]))
            if v2:   # the initial routing bias: zero, fp32
                f.write(np.zeros(len(layer_slots_moe(cfg)) * cfg["E"], dtype="<f4").tobytes())
    with open(os.path.join(out, "data.bin"), "wb") as f:
        f.write(header(20240520, 1, len(tokens)))
        f.write(tokens.astype("<u2").tobytes())
    losses, norms = hist["losses"], hist["norms"]
    with open(os.path.join(out, "state.bin"), "wb") as f:
        f.write(header(20241129, 1, cfg["T"], cfg["R"], a.nsteps, a.warmup))
        muon = a.optimizer == "muon"   # [9] 1: Muon, [10] its momentum, [11] the fp32 run's distance from fp64's (Muon, MoE)
        f.write(header(a.lr, a.b1, a.b2, a.eps, a.weight_decay, a.clip, a.final_frac,
                       losses[0], norms[0], float(muon), a.muon_momentum if muon else 0.0,
                       hist.get("fp64_dist", 0.0), dtype=np.float32))
        for k in names(cfg):
            f.write(f32(grads0[k]))
        f.write(np.array(losses, dtype="<f4").tobytes())
        f.write(np.array(norms, dtype="<f4").tobytes())
        for k in names(cfg):
            f.write(f32(final[k]))
    if moe:
        Lm = len(log0)
        with open(os.path.join(out, "moe.bin"), "wb") as f:
            f.write(header(20241130, 3, cfg["E"], cfg["k"], cfg["every"], cfg["F1000"],
                           0 if cfg["policy"] == "probs" else 1, Lm, cfg["R"], cfg["T"], a.nsteps, 1))
            f.write(header(cfg["aux_coeff"], cfg["z_coeff"], hist["aux"][0], hist["z"][0],
                           hist["dropped"][0], hist["margin"], cfg["bias_rate"], dtype=np.float32))
            for key, dt in (("choice", "<i4"), ("keep", "<i4"), ("topk_margin", "<f4"), ("cap_margin", "<f4")):
                for r in log0:
                    f.write(r[key].numpy().astype(dt).tobytes())
            for key in ("aux", "z", "dropped"):
                f.write(np.array(hist[key], dtype="<f4").tobytes())
            f.write(np.array(hist["loads"], dtype="<i4").tobytes())
            f.write(cfg["bias"].numpy().astype("<f4").tobytes())
            f.write(np.array(hist["drift"], dtype="<f4").tobytes())
            f.write(np.array(hist["allow"], dtype="<i4").tobytes())
    with open(os.path.join(out, "README.txt"), "w") as f:
        f.write(f"gpt2_ref.py reference state, config {a.config}, seed {a.seed}, data seed {a.data_seed}\n")
        f.write(" ".join(f"{k}={cfg[k]}" for k in ("L", "C", "NH", "V", "Vp", "maxT", "T", "R")))
        if llama:
            f.write("\narch=llama " + " ".join(f"{k}={cfg[k]}" for k in ("KV", "F", "tied", "qkvbias")))
            f.write(f" theta={np.float32(cfg['theta'])!s} norm_eps={np.float32(cfg['norm_eps'])!s}")   # float32 values
            if cfg["rope_kind"] == 1:
                f.write(" rope_scaling=llama3 " + " ".join(f"{k}={cfg[k]}" for k in
                                                             ("rope_factor", "rope_low", "rope_high", "rope_orig")))
            if cfg["qk_norm"]:
                f.write(" qk_norm=1")
        if moe:
            f.write(" " + " ".join(f"{k}={cfg[k]}" for k in ("E", "k", "every", "F1000", "policy", "aux_coeff", "z_coeff", "skew",
                                                             "score", "bias_rate", "S", "H")))
            if llama:
                f.write(" " + " ".join(f"{k}={cfg[k]}" for k in ("norm_topk", "shared_gate")))
            f.write(f"\nsmallest routing margin over all steps: {hist['margin']:.3e}")
        f.write(f"\nntok={len(tokens)} nsteps={a.nsteps} warmup={a.warmup} lr={a.lr} b1={a.b1} "
                f"b2={a.b2} eps={a.eps} wd={a.weight_decay} clip={a.clip} "
                f"final_frac={a.final_frac}\nnparams={sum(init[k].numel() for k in names(cfg))}\n")
        f.write(f"loss0={losses[0]:.6f} (ln V = {math.log(cfg['V']):.6f}) gradnorm0={norms[0]:.6f}\n")
        for s, (l, n) in enumerate(zip(losses, norms)):
            extra = f" aux {hist['aux'][s]:.6f} z {hist['z'][s]:.6f} dropped {hist['dropped'][s]:.4f}" if moe else ""
            f.write(f"step {s:3d} loss {l:.6f} norm {n:.6f}{extra}\n")

def d_term(init, tokens, cfg, nprobes=8):
    """-> per parameter name, the rms over nprobes draws of the step-0 gradient's change when each attention row's D
    carries its bf16 error (AttendD, D_NOISE), against the same backward with D exact"""
    global ATTEND_D, D_NOISE
    x, y = batch(tokens, 0, cfg)
    cfg0 = dict(cfg, bias=torch.zeros_like(cfg["bias"]))   # (the routing bias of step 0)

    def grads(noise):
        global D_NOISE
        D_NOISE = noise
        p = {k: v.clone().requires_grad_(True) for k, v in init.items()}
        forward(p, x, y, cfg0)[3].backward()
        return {k: (v.grad if v.grad is not None else torch.zeros_like(v)).detach() for k, v in p.items()}

    ATTEND_D = True
    exact, sq = grads(None), {k: torch.zeros_like(v) for k, v in init.items()}
    gen = torch.Generator().manual_seed(20241204)
    for _ in range(nprobes):
        g = grads(gen)
        for k in sq:
            sq[k] += (g[k] - exact[k]) ** 2
    ATTEND_D, D_NOISE = False, None
    return {k: (v / nprobes).sqrt() for k, v in sq.items()}

def write_d_term(out, cfg, dterm, nprobes=8):
    with open(os.path.join(out, "dterm.bin"), "wb") as f:
        f.write(header(20241204, 1, nprobes))
        for k in names(cfg):
            f.write(f32(dterm[k]))

# ----------------------------------------------------------------------------- self-test
def check(cfg, seed, nsamples=8, h=1e-5):
    """Autograd vs central finite differences in float64, on random elements of all
    parameters (tiny config, 2 rows; with --E the MoE model, with --arch llama the Llama model: untied,
    wte's samples come from the inputs' rows); also compares fp32 autograd to float64.
    Pass: |fd - autograd| <= 1e-5 * max(|fd|, |autograd|) + 1e-9 for every element."""
    cfg = dict(cfg, R=2)
    p32 = init_params(cfg, seed)
    p64 = {k: v.detach().double().requires_grad_(True) for k, v in p32.items()}
    tokens = markov_tokens(cfg["V"], 2 * cfg["T"] + 1, seed)
    x, y = batch(tokens, 0, cfg)
    forward(p64, x, y, cfg)[3].backward()
    forward(p32, x, y, cfg)[3].backward()
    for p in list(p64.values()) + list(p32.values()):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    g = torch.Generator().manual_seed(seed + 1)
    ok = True
    with torch.no_grad():
        for k in names(cfg):
            P, G = p64[k].view(-1), p64[k].grad.view(-1)
            C, rows = cfg["C"], None
            if k == "wte" and is_llama(cfg) and not cfg["tied"]:   # untied: only the inputs' rows have gradients
                rows = torch.unique(x).tolist()
            n_valid = (len(rows) if rows else cfg["V"]) * C if k in ("wte", "head") and P.numel() else P.numel()
            if n_valid == 0:
                continue
            worst_abs, worst_rel = 0.0, 0.0
            for i in torch.randint(0, n_valid, (nsamples,), generator=g).tolist():
                if rows:
                    i = rows[i // C] * C + i % C
                old = P[i].item()
                P[i] = old + h; lp = forward(p64, x, y, cfg)[3].item()
                P[i] = old - h; lm = forward(p64, x, y, cfg)[3].item()
                P[i] = old
                fd, ag = (lp - lm) / (2 * h), G[i].item()
                scale = max(abs(fd), abs(ag))
                worst_abs = max(worst_abs, abs(fd - ag))
                worst_rel = max(worst_rel, abs(fd - ag) / max(scale, 1e-30))
                ok &= abs(fd - ag) <= 1e-5 * scale + 1e-9
            rel32 = ((p32[k].grad.double() - p64[k].grad).norm() / p64[k].grad.norm()).item()
            ok &= rel32 < 1e-5
            print(f"check {k:9s} fd-vs-autograd max abs err {worst_abs:.1e} max rel err "
                  f"{worst_rel:.1e}   fp32-vs-fp64 grad rel err {rel32:.1e}")
    for k in ("wte", "head"):
        if k in p64 and p64[k].numel():
            pad = p64[k].grad[cfg["V"]:]
            ok &= bool((pad == 0).all())
            print(f"padded {k} rows grad all zero: {bool((pad == 0).all())}")
    print("CHECK PASSED" if ok else "CHECK FAILED")
    return ok

def parse(argv=None):
    """-> (argparse namespace, model config, parser)"""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    for k in ("L", "C", "NH", "V", "Vp", "maxT", "T", "R"):
        ap.add_argument("--" + k, type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--nsteps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--b1", type=float, default=0.9)
    ap.add_argument("--b2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=None)
    ap.add_argument("--final_frac", type=float, default=0.1)
    ap.add_argument("--optimizer", choices=("adamw", "muon"), default="adamw",
                    help="muon: the matrices inside the blocks by Muon (llmc/muon.h), the rest AdamW")
    ap.add_argument("--muon_momentum", type=float, default=0.95)
    ap.add_argument("--check", action="store_true", help="run the finite-difference self-test")
    ap.add_argument("--E", type=int, default=0, help="experts (0: dense)")
    ap.add_argument("--k", type=int, default=1, help="top-k")
    ap.add_argument("--every", type=int, default=1, help="layer l is MoE when l %% every == every-1")
    ap.add_argument("--F", type=float, default=None,
                    help="MoE: capacity factor, 0 = dropless (1.25); --arch llama: the MLP's hidden width (256 ceil(8C/3/256))")
    ap.add_argument("--cap", type=float, default=None,
                    help="--arch llama with --E: the capacity factor, 0 = dropless (1.25)")
    ap.add_argument("--policy", choices=("probs", "position"), default="probs")
    ap.add_argument("--aux_coeff", type=float, default=0.01)
    ap.add_argument("--z_coeff", type=float, default=0.001)
    ap.add_argument("--skew", action="store_true", help="route every token to expert 0 (capacity saturates)")
    ap.add_argument("--score", choices=("softmax", "sigmoid"), default="softmax", help="router scores")
    ap.add_argument("--bias_rate", type=float, default=0.0, help="loss-free balancing's bias step (0: off)")
    ap.add_argument("--H", type=int, default=None, help="an expert's hidden width (4C; --arch llama: F)")
    ap.add_argument("--S", type=int, default=0, help="shared experts (one MLP of width S*H per MoE layer)")
    ap.add_argument("--min_margin", type=float, default=1e-6,
                    help="MoE: advance the data seed until every routing margin is at least this")
    ap.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    llama_opts = dict(KV=(int, None, "kv heads"), theta=(float, 500000.0, "rope theta"),
                      norm_eps=(float, 1e-5, "RMSNorm eps (--eps is AdamW's)"), tied=(int, 0, "1: head = wte"),
                      qkvbias=(int, 0, "1: q/k/v biases (Qwen2)"), rope_scaling=(str, "none", "none or llama3"),
                      rope_factor=(float, 8.0, "llama3 scaling: factor"),
                      rope_low=(float, 1.0, "llama3 scaling: low_freq_factor"),
                      rope_high=(float, 4.0, "llama3 scaling: high_freq_factor"),
                      rope_orig=(int, 8192, "llama3 scaling: original_max_position_embeddings"),
                      qk_norm=(int, 0, "1: RMSNorm over the whole q and k projections before rope (OLMoE)"),
                      norm_topk=(int, 1, "with --E: 1 = the k gates renormalised to sum 1 (k > 1), 0 = the k p themselves"),
                      shared_gate=(int, 0, "with --S: 1 = the shared experts scaled per token by sigmoid(x . w) (Qwen2-MoE)"),
                      pad=(int, -1, "the padding token (transformers' pad_token_id): no gradient from its embedding lookup"))
    for k, (typ, default, text) in llama_opts.items():
        ap.add_argument("--" + k, type=typ, default=None, help=f"--arch llama: {text} (default {'NH' if default is None else default})")
    a = ap.parse_args(argv)
    given = [k for k in llama_opts if getattr(a, k) is not None]
    if a.arch != "llama" and given:
        ap.error(f"--{given[0]} needs --arch llama")
    scale_opts = [k for k in given if k.startswith("rope_") and k != "rope_scaling"]
    if scale_opts and a.rope_scaling != "llama3":
        ap.error(f"--{scale_opts[0]} needs --rope_scaling llama3")
    for k, (typ, default, text) in llama_opts.items():
        if getattr(a, k) is None:
            setattr(a, k, default)
    if a.arch == "llama" and (a.tied not in (0, 1) or a.qkvbias not in (0, 1) or a.rope_scaling not in ("none", "llama3")
                              or a.qk_norm not in (0, 1) or a.norm_topk not in (0, 1) or a.shared_gate not in (0, 1)):
        ap.error("--tied, --qkvbias, --qk_norm, --norm_topk and --shared_gate take 0 or 1, --rope_scaling none or llama3")
    if a.cap is not None and a.arch != "llama":
        ap.error("--cap needs --arch llama (GPT-2's capacity factor is --F)")
    if a.E == 0 and (a.cap is not None or "norm_topk" in given):
        ap.error(f"--{'cap' if a.cap is not None else 'norm_topk'} needs --E")
    if a.shared_gate and a.S == 0:
        ap.error("--shared_gate 1 needs shared experts (--S)")
    cfg = dict(CONFIGS[a.config])
    for k in ("L", "C", "NH", "V", "Vp", "maxT", "T", "R"):
        if getattr(a, k) is not None:
            cfg[k] = getattr(a, k)
    if a.arch == "llama":
        if a.skew:
            ap.error("--arch llama: no --skew (it sets the LayerNorm bias ln2b)")
        fp32 = lambda x: float(np.float32(x))   # the values the model file holds (float32 slots)
        F = -(-8 * cfg["C"] // (3 * 256)) * 256 if a.F is None else a.F
        if F != int(F) or F < 1:
            ap.error("--arch llama: --F is the MLP's hidden width, a positive integer")
        cfg.update(arch="llama", KV=cfg["NH"] if a.KV is None else a.KV, F=int(F), theta=fp32(a.theta), norm_eps=fp32(a.norm_eps),
                   tied=a.tied, qkvbias=a.qkvbias, rope_kind=int(a.rope_scaling == "llama3"),
                   rope_factor=fp32(a.rope_factor), rope_low=fp32(a.rope_low), rope_high=fp32(a.rope_high),
                   rope_orig=a.rope_orig, qk_norm=a.qk_norm, norm_topk=a.norm_topk, shared_gate=a.shared_gate, pad=a.pad)
        assert -1 <= a.pad < cfg["V"], "--pad: -1 (none) or a token below V"
        capf = 1.25 if a.cap is None else a.cap   # the capacity factor (--F is the MLP's width)
        hs = cfg["C"] // cfg["NH"]
        assert cfg["KV"] >= 1 and cfg["NH"] % cfg["KV"] == 0 and hs % 2 == 0, "llama: NH % KV == 0 and an even head size"
        assert cfg["rope_kind"] == 0 or (a.rope_factor > 0 and a.rope_high > a.rope_low > 0 and a.rope_orig > 0)
    else:
        capf = 1.25 if a.F is None else a.F
    cfg.update(E=a.E, k=a.k, every=a.every, F1000=int(round(1000 * capf)) if a.arch == "gpt2" or a.E else 0, policy=a.policy,
               aux_coeff=a.aux_coeff, z_coeff=a.z_coeff, skew=a.skew, score=a.score, bias_rate=a.bias_rate,
               H=a.H if a.H else cfg["F"] if a.arch == "llama" else 4 * cfg["C"], S=a.S)
    assert a.E == 0 or (1 <= a.k <= a.E and a.every >= 1 and capf >= 0 and cfg["H"] >= 1 and a.S >= 0)
    assert a.score == "softmax" or (a.k >= 2 and a.z_coeff == 0), "sigmoid scores need k >= 2 and z_coeff 0"
    assert a.bias_rate >= 0
    a.lr = cfg["lr"] if a.lr is None else a.lr
    a.clip = cfg["clip"] if a.clip is None else a.clip
    assert cfg["C"] % cfg["NH"] == 0 and cfg["Vp"] >= cfg["V"] <= 65536 and cfg["T"] <= cfg["maxT"]
    assert a.nsteps > a.warmup >= 1
    return a, cfg, ap

def load_allowance(scores, k, delta):
    """scores (..., E) the choice's p + b, each possibly off by delta / 2 in another fp32 run -> the most top-k
    assignments that can move to another expert: a chosen expert can leave only if it is within delta of the
    best unchosen, an unchosen one enter only if within delta of the last chosen; each move changes two loads by 1"""
    v = torch.sort(scores.reshape(-1, scores.shape[-1]).double(), dim=-1, descending=True).values
    if k >= v.shape[-1]:
        return 0
    leave = (v[:, :k] - v[:, k:k + 1] <= delta).sum(dim=-1)
    enter = (v[:, k - 1:k] - v[:, k:] <= delta).sum(dim=-1)
    return 2 * int(torch.minimum(leave, enter).sum())

def fp64_twin(hist, init, tokens, cfg, a):
    """The same steps in fp64, which measure how far an fp32 run of them lands from the exact one (test_gpt bounds
    ours by it). Muon: Newton-Schulz amplifies rounding (its slope near 0 is a = 3.44, five times). MoE: from the
    first AdamW step on, an element whose gradient is rounding noise of eps's size (1e-10..1e-8) moves by another
    fraction of lr in each run, and the router's scores drift ~100x further than step 0's rounding (tiny OLMoE:
    6e-8 at step 0, up to 1.2e-5 after), past the margins of some decisions. hist gets fp64_dist (the worst
    relative distance of the losses and norms) and, with MoE, per step the scores' drift (the largest so far of
    max |p + b - (p + b)64|, D) and per MoE layer the load allowance: another fp32 run lands within 2 D (2x
    for another order landing farther), so the two runs' scores differ by at most 3 D each and a gap flips
    only below delta = 6 D (load_allowance)."""
    cfg64 = dict(cfg, bias=torch.zeros_like(cfg["bias"], dtype=torch.float64))
    p64 = {k: v.double().clone().requires_grad_(True) for k, v in init.items()}
    with contextlib.redirect_stdout(io.StringIO()):
        h64, _, _ = train(p64, tokens, cfg64, a)
    hist["fp64_dist"] = max(max(abs(x - y) / abs(y) for x, y in zip(hist["losses"], h64["losses"])),
                            max(abs(x - y) / abs(y) for x, y in zip(hist["norms"], h64["norms"])))
    print(f"the fp32 run's losses and norms within {hist['fp64_dist']:.2e} (relative) of the fp64 run's")
    if not cfg["E"]:
        return
    hist["drift"], hist["allow"], D = [], [], 0.0
    for s32, s64 in zip(hist["scores"], h64["scores"]):
        D = max([D] + [float((x.double() - y).abs().max()) for x, y in zip(s32, s64)])
        hist["drift"].append(D)
        hist["allow"].append([load_allowance(x, cfg["k"], 6 * D) for x in s32])
    print("MoE scores' drift from the fp64 run per step: " + " ".join(f"{d:.1e}" for d in hist["drift"]) +
          "; load allowance (assignments) per step: " + " ".join(str(sum(x)) for x in hist["allow"]))

def main():
    a, cfg, ap = parse()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.check:
        sys.exit(0 if check(cfg, a.seed) else 1)
    if not a.out:
        ap.error("--out DIR is required (unless --check)")
    t0 = time.time()
    D = cfg["R"] * cfg["T"]
    init = {k: v.detach().clone() for k, v in init_params(cfg, a.seed).items()}
    print(f"config {a.config}: {cfg}  params {sum(v.numel() for v in init.values())}  ln(V) {math.log(cfg['V']):.4f}")
    # a near-tie in the routing flips with rounding (C vs PyTorch, or another summation order
    # under TP): advance the data seed until every decision of every step has a clear margin
    for a.data_seed in range(a.seed, a.seed + 50):
        tokens = markov_tokens(cfg["V"], (a.nsteps + 1) * D + 1, a.data_seed)
        if is_llama(cfg) and cfg["pad"] >= 0:   # the padding token in every batch: at every 16th position from the
            tokens[5::16] = cfg["pad"]          # 6th (never first in a row)
        params = {k: v.clone().requires_grad_(True) for k, v in init.items()}
        cfg["bias"] = torch.zeros(len(layer_slots_moe(cfg)), max(cfg["E"], 1))   # the routing bias, per MoE layer
        hist, grads0, log0 = train(params, tokens, cfg, a)
        if cfg["E"] == 0 or hist["margin"] >= a.min_margin:
            break
        print(f"data seed {a.data_seed}: smallest routing margin {hist['margin']:.2e} < {a.min_margin:.0e}, next seed")
    else:
        sys.exit(f"no data seed in 50 gives routing margins >= {a.min_margin}")
    if a.optimizer == "muon" or cfg["E"]:
        fp64_twin(hist, init, tokens, cfg, a)
    write_all(a.out, cfg, a, init, tokens, hist, grads0, log0, params)
    write_d_term(a.out, cfg, d_term(init, tokens, cfg))
    print(f"wrote {a.out} in {time.time() - t0:.1f} s")

if __name__ == "__main__":
    main()
