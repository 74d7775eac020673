#!/usr/bin/python3
"""
PyTorch (fp32, CPU) reference of GPT-2 exactly as llm.c defines it.  Writes a
*reference state* that the C/CUDA test harness compares against.

Usage:  /usr/bin/python3 dev/reference/gpt2_ref.py --config tiny|d4 --out DIR
        [--L --C --NH --V --Vp --maxT --T --R --nsteps --lr --clip ... --seed --threads]
        /usr/bin/python3 dev/reference/gpt2_ref.py --check   (finite-difference self-test)

Model: params (llm.c order; per-layer tensors stacked on dim 0; Linear weights are
(out, in), y = x @ W^T + b; qkvw rows = [Q; K; V], head h uses cols h*hs..(h+1)*hs):
  wte (Vp,C) wpe (maxT,C) ln1w ln1b (L,C) qkvw (L,3C,C) qkvb (L,3C) attprojw (L,C,C)
  attprojb (L,C) ln2w ln2b (L,C) fcw (L,4C,C) fcb (L,4C) fcprojw (L,C,4C) fcprojb (L,C)
  lnfw lnfb (C).  LayerNorm eps 1e-5, GELU tanh approximation, tied head
  logits = x @ wte[:V]^T (padded rows never enter the softmax), loss = mean CE.
Init (seed): weights N(0,.02), attprojw/fcprojw N(0,.02/sqrt(2L)), wpe N(0,.01),
  biases N(0,.02), LN weights 1+N(0,.05), LN biases N(0,.02); wte rows V..Vp-1 = 0.
Training: step s uses R rows of T tokens: row i inputs = tok[s*D+i*T : +T], targets
  shifted by one (D = R*T).  Global-norm clip, then llm.c AdamW (hand written), weight
  decay only on wte, wpe, qkvw, attprojw, fcw, fcprojw; llm.c cosine lr with warmup.

Files in DIR (all little-endian):
  model.bin      int32 hdr[256] = {20240326, 3, maxT, V, L, NH, C, Vp, 0...}, then the 16
                 INITIAL tensors as fp32 (wte with all Vp rows)
  model_bf16.bin same with hdr[1] = 5 and tensors as bf16 (round-to-nearest-even)
  data.bin       int32 hdr[256] = {20240520, 1, ntok, 0...}, then ntok uint16 tokens,
                 ntok = (nsteps+1)*D + 1, seeded random first-order Markov chain
  state.bin      int32 hdr[256] = {20241129, 1, T, R, nsteps, warmup, 0...}
                 fp32 fhdr[256] = {lr, b1, b2, eps, weight_decay, clip, final_frac,
                                   loss0, gradnorm0, 0...}
                 16 fp32 gradient tensors of step 0 (raw, before clipping; llm.c order)
                 fp32 step_losses[nsteps], fp32 step_norms[nsteps] (pre-clip norms)
                 16 fp32 parameter tensors after the last step
  README.txt     human-readable summary
"""
import argparse, math, os, sys, time
import numpy as np
import torch

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}
CONFIGS = {
    "tiny": dict(L=4, C=64, NH=4, V=250, Vp=256, maxT=64, T=32, R=8, lr=3e-3, clip=0.6),
    "d4": dict(L=4, C=256, NH=4, V=50257, Vp=50304, maxT=1024, T=64, R=4, lr=1e-3, clip=1.0),
}

def param_shapes(cfg):
    L, C, V, Vp, maxT = cfg["L"], cfg["C"], cfg["V"], cfg["Vp"], cfg["maxT"]
    return [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
            (L, C), (L, C), (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]

def init_params(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    proj_std = 0.02 / math.sqrt(2 * cfg["L"])
    params = {}
    for name, shape in zip(NAMES, param_shapes(cfg)):
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if name in ("ln1w", "ln2w", "lnfw"):
            t = 1.0 + 0.05 * r                      # LN weights 1 + N(0, 0.05)
        elif name in ("attprojw", "fcprojw"):
            t = proj_std * r
        elif name == "wpe":
            t = 0.01 * r
        else:
            t = 0.02 * r                            # other weights, biases, LN biases
        if name == "wte":
            t[cfg["V"]:] = 0.0                      # padded vocab rows are exactly zero
        params[name] = t.requires_grad_(True)
    return params

# ----------------------------------------------------------------------------- model
def layernorm(x, w, b, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)   # biased variance
    return (x - mean) / torch.sqrt(var + eps) * w + b

def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

def attention(x, w, b, NH):
    B, T, C = x.shape
    hs = C // NH
    qkv = x @ w.t() + b                                         # (B, T, 3C)
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    q = q.reshape(B, T, NH, hs).transpose(1, 2)                 # (B, NH, T, hs)
    k = k.reshape(B, T, NH, hs).transpose(1, 2)
    v = v.reshape(B, T, NH, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))   # (B, NH, T, T)
    mask = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)  # True above diagonal
    att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
    y = att @ v                                                 # (B, NH, T, hs)
    return y.transpose(1, 2).reshape(B, T, C)

def forward(p, idx, targets, cfg):
    B, T = idx.shape
    x = p["wte"][idx] + p["wpe"][:T]
    for l in range(cfg["L"]):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        h = attention(h, p["qkvw"][l], p["qkvb"][l], cfg["NH"])
        x = x + h @ p["attprojw"][l].t() + p["attprojb"][l]
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        h = gelu_tanh(h @ p["fcw"][l].t() + p["fcb"][l])
        x = x + h @ p["fcprojw"][l].t() + p["fcprojb"][l]
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"][:cfg["V"]].t()                        # (B, T, V), tied head
    logprobs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    nll = -logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return nll.mean()

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

def train(params, tokens, cfg, a):
    m = {k: torch.zeros_like(v) for k, v in params.items()}
    vv = {k: torch.zeros_like(v) for k, v in params.items()}
    losses, norms, grads0 = [], [], None
    for s in range(a.nsteps):
        for p in params.values():
            p.grad = None
        x, y = batch(tokens, s, cfg)
        loss = forward(params, x, y, cfg)
        loss.backward()
        if s == 0:
            grads0 = {k: p.grad.detach().clone() for k, p in params.items()}
        norm = grad_norm(params)
        scale = a.clip / norm if norm > a.clip else 1.0
        lr, t = lr_at(s, a), s + 1
        with torch.no_grad():
            for k, p in params.items():
                wd = a.weight_decay if k in DECAYED else 0.0
                g = p.grad * scale
                m[k] = a.b1 * m[k] + (1.0 - a.b1) * g
                vv[k] = a.b2 * vv[k] + (1.0 - a.b2) * g * g
                mhat = m[k] / (1.0 - a.b1 ** t)
                vhat = vv[k] / (1.0 - a.b2 ** t)
                p -= lr * (mhat / (torch.sqrt(vhat) + a.eps) + wd * p)
        losses.append(float(loss))
        norms.append(norm)
        print(f"step {s:3d}  loss {losses[-1]:.6f}  norm {norm:.6f}  lr {lr:.3e}"
              f"  clip {'yes' if norm > a.clip else 'no '}")
    return losses, norms, grads0

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

def write_all(out, cfg, a, init, tokens, losses, norms, grads0, final):
    os.makedirs(out, exist_ok=True)
    mh = [cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    with open(os.path.join(out, "model.bin"), "wb") as f:
        f.write(header(20240326, 3, *mh))
        for k in NAMES:
            f.write(f32(init[k]))
    with open(os.path.join(out, "model_bf16.bin"), "wb") as f:
        f.write(header(20240326, 5, *mh))
        for k in NAMES:
            f.write(to_bf16(init[k]))
    with open(os.path.join(out, "data.bin"), "wb") as f:
        f.write(header(20240520, 1, len(tokens)))
        f.write(tokens.astype("<u2").tobytes())
    with open(os.path.join(out, "state.bin"), "wb") as f:
        f.write(header(20241129, 1, cfg["T"], cfg["R"], a.nsteps, a.warmup))
        f.write(header(a.lr, a.b1, a.b2, a.eps, a.weight_decay, a.clip, a.final_frac,
                       losses[0], norms[0], dtype=np.float32))
        for k in NAMES:
            f.write(f32(grads0[k]))
        f.write(np.array(losses, dtype="<f4").tobytes())
        f.write(np.array(norms, dtype="<f4").tobytes())
        for k in NAMES:
            f.write(f32(final[k]))
    with open(os.path.join(out, "README.txt"), "w") as f:
        f.write(f"gpt2_ref.py reference state, config {a.config}, seed {a.seed}\n")
        f.write(" ".join(f"{k}={cfg[k]}" for k in ("L", "C", "NH", "V", "Vp", "maxT", "T", "R")))
        f.write(f"\nntok={len(tokens)} nsteps={a.nsteps} warmup={a.warmup} lr={a.lr} b1={a.b1} "
                f"b2={a.b2} eps={a.eps} wd={a.weight_decay} clip={a.clip} "
                f"final_frac={a.final_frac}\nnparams={sum(init[k].numel() for k in NAMES)}\n")
        f.write(f"loss0={losses[0]:.6f} (ln V = {math.log(cfg['V']):.6f}) gradnorm0={norms[0]:.6f}\n")
        for s, (l, n) in enumerate(zip(losses, norms)):
            f.write(f"step {s:3d} loss {l:.6f} norm {n:.6f}\n")

# ----------------------------------------------------------------------------- self-test
def check(cfg, seed, nsamples=8, h=1e-5):
    """Autograd vs central finite differences in float64, on random elements of all
    16 parameters (tiny config, 2 rows); also compares fp32 autograd to float64.
    Pass: |fd - autograd| <= 1e-5 * max(|fd|, |autograd|) + 1e-9 for every element."""
    cfg = dict(cfg, R=2)
    p32 = init_params(cfg, seed)
    p64 = {k: v.detach().double().requires_grad_(True) for k, v in p32.items()}
    tokens = markov_tokens(cfg["V"], 2 * cfg["T"] + 1, seed)
    x, y = batch(tokens, 0, cfg)
    forward(p64, x, y, cfg).backward()
    forward(p32, x, y, cfg).backward()
    g = torch.Generator().manual_seed(seed + 1)
    ok = True
    with torch.no_grad():
        for k in NAMES:
            P, G = p64[k].view(-1), p64[k].grad.view(-1)
            n_valid = cfg["V"] * cfg["C"] if k == "wte" else P.numel()
            worst_abs, worst_rel = 0.0, 0.0
            for i in torch.randint(0, n_valid, (nsamples,), generator=g).tolist():
                old = P[i].item()
                P[i] = old + h; lp = forward(p64, x, y, cfg).item()
                P[i] = old - h; lm = forward(p64, x, y, cfg).item()
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
    pad = p64["wte"].grad[cfg["V"]:]
    ok &= bool((pad == 0).all())
    print(f"padded wte rows grad all zero: {bool((pad == 0).all())}")
    print("CHECK PASSED" if ok else "CHECK FAILED")
    return ok

def main():
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
    ap.add_argument("--check", action="store_true", help="run the finite-difference self-test")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = dict(CONFIGS[a.config])
    for k in ("L", "C", "NH", "V", "Vp", "maxT", "T", "R"):
        if getattr(a, k) is not None:
            cfg[k] = getattr(a, k)
    a.lr = cfg["lr"] if a.lr is None else a.lr
    a.clip = cfg["clip"] if a.clip is None else a.clip
    assert cfg["C"] % cfg["NH"] == 0 and cfg["Vp"] >= cfg["V"] <= 65536 and cfg["T"] <= cfg["maxT"]
    assert a.nsteps > a.warmup >= 1
    if a.check:
        sys.exit(0 if check(cfg, a.seed) else 1)
    if not a.out:
        ap.error("--out DIR is required (unless --check)")
    t0 = time.time()
    D = cfg["R"] * cfg["T"]
    tokens = markov_tokens(cfg["V"], (a.nsteps + 1) * D + 1, a.seed)
    params = init_params(cfg, a.seed)
    init = {k: v.detach().clone() for k, v in params.items()}
    print(f"config {a.config}: {cfg}  params {sum(v.numel() for v in init.values())}"
          f"  ntok {len(tokens)}  ln(V) {math.log(cfg['V']):.4f}")
    losses, norms, grads0 = train(params, tokens, cfg, a)
    write_all(a.out, cfg, a, init, tokens, losses, norms, grads0, params)
    print(f"wrote {a.out} in {time.time() - t0:.1f} s")

if __name__ == "__main__":
    main()
