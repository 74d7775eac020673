"""
Transformers' own training of the families we import (scripts/test_hf_train.sh trains each beside train_gpt):
transformers 4.49's model class in fp32 on the CPU, torch.optim.AdamW, the global gradient norm clipped.

    hf_train_ref.py make W
        For each case of CASES a random model made as transformers initialises one (from_config with
        initializer_range 0.05: normal weights, the padding row of the embedding zero where the config has a
        pad_token_id), then every norm weight 1 + 0.1 N(0, 1) and every bias 0.05 N(0, 1) (not ones, not zeros),
        saved with save_pretrained. W/train.bin: random tokens < V (an llm.c uint16 shard) with the padding id 1
        at every 16th position from the 6th (OLMoE's pad_token_id, and the llama case's), so every batch holds it.
        The MoE cases take the first seed whose routing of every step's batch, in fp32 and in float64, has no
        top-k margin under MIN_MARGIN (hf_moe_ref.py's reasoning: the same experts on both sides).
    hf_train_ref.py train SHARD -b B -t T -n N --lr LR --wd WD --clip CLIP DIR...
        N steps of training, step s on the shard's tokens s B T .. (s + 1) B T (+1) as B rows of T (train_gpt's
        batch at one rank, and its global batch in any layout), the loss the mean cross-entropy (no router
        loss); AdamW (betas 0.9 / 0.95, eps 1e-8, weight decay WD on every parameter of two or more dimensions,
        as train_gpt's -c), lr constant, the gradient scaled by CLIP / norm when its norm is over CLIP. Once
        in fp32 and once in float64 from the same start; per DIR (named by its last path component) and step a line
        "step NAME S LOSS32 LOSS64 NORM32 NORM64 MARGIN" (the loss before the step's update, the norm before
        clipping, the batch's smallest routing margin in fp32, 1 for a dense model).
"""
import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_llama_ref as dense  # noqa: E402  (sets HF_HUB_OFFLINE)
import hf_moe_ref as moe  # noqa: E402
import numpy as np  # noqa: E402

MIN_MARGIN = moe.MIN_MARGIN
PAD = 1          # the padding id written into the data every PAD_EVERY tokens
PAD_EVERY = 16
V = dense.V
B, T, STEPS = 4, 32, 6   # what make checks the routing of (test_hf_train.sh's run)
GPT2 = dict(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64, activation_function="gelu_new",
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
CASES = {   # name: (model_type, config fields over hf_llama_ref's BASE, or GPT2's for gpt2)
    "gpt2": ("gpt2", {}),
    # llama3 RoPE scaling, GQA, untied, a padding token
    "llama": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500000.0,
                            rope_scaling=dense.LLAMA3, pad_token_id=PAD)),
    "mistral": ("mistral", dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=1e6, sliding_window=None)),
    # q/k/v biases, tied
    "qwen2": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6, use_sliding_window=False,
                            sliding_window=64, max_window_layers=2)),
    "mixtral": ("mixtral", dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                intermediate_size=64, tie_word_embeddings=False, rope_theta=1e6, sliding_window=None,
                                router_jitter_noise=0.0)),
    # OLMoE as transformers makes one: pad_token_id 1 (its default), QK-norm, raw top-k
    "olmoe": ("olmoe", dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, intermediate_size=32,
                            norm_topk_prob=False, tie_word_embeddings=False)),
    # the gated shared expert, raw top-k, dense layers between
    "qwen2_moe": ("qwen2_moe", dict(num_hidden_layers=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                    intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                    decoder_sparse_step=2, norm_topk_prob=False, tie_word_embeddings=False,
                                    rope_theta=1e6, use_sliding_window=False, sliding_window=64, max_window_layers=4)),
    # renormalised top-k, tied
    "qwen2_moe_norm": ("qwen2_moe", dict(num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                         decoder_sparse_step=1, norm_topk_prob=True, tie_word_embeddings=True,
                                         mlp_only_layers=[])),
}


def initialised_model(mt, fields, seed):
    """transformers' own initialisation (initializer_range 0.05), then random norm weights and biases"""
    import torch
    import transformers
    base = GPT2 if mt == "gpt2" else dense.BASE
    conf = transformers.AutoConfig.for_model(mt, **{**base, "initializer_range": 0.05, **fields})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(conf, torch_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith("weight"):   # the norms' weights (RMSNorm, LayerNorm, q/k norms)
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
    return model


def write_train(w):
    """w/train.bin: random tokens < V, the padding id at every PAD_EVERY-th position from the 6th"""
    n = (STEPS + 2) * B * T + 1
    toks = np.random.default_rng(2).integers(0, V, size=n)
    toks[5::PAD_EVERY] = PAD   # (never first in a row: there a zero embedding reaches the router as a
    # zero vector, every expert tied)
    h = np.zeros(256, dtype="<i4")
    h[:3] = [20240520, 1, n]
    with open(os.path.join(w, "train.bin"), "wb") as f:
        f.write(h.tobytes() + toks.astype("<u2").tobytes())


def batches(shard, b, t, n):
    import torch
    toks = np.fromfile(shard, dtype="<u2", offset=1024).astype(np.int64)
    if toks.size < n * b * t + 1:
        sys.exit(f"error: {shard} has {toks.size} tokens, {n} steps of {b} x {t} need {n * b * t + 1}")
    return [torch.tensor(np.stack([toks[(s * b + r) * t:(s * b + r) * t + t + 1] for r in range(b)])) for s in range(n)]


def train(model, rows, lr, wd, clip):
    """-> per step (loss, the norm before clipping, the smallest routing margin)"""
    import torch
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}], lr=lr,
                            betas=(0.9, 0.95), eps=1e-8)
    k = getattr(model.config, "num_experts_per_tok", 0)
    out = []
    for r in rows:
        o = model(input_ids=r[:, :-1], output_router_logits=True) if k else model(input_ids=r[:, :-1])
        logits = o.logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), r[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
        if clip > 0 and norm > clip:   # (train_gpt's rule: scale = clip / norm; torch's clip_grad_norm_ adds 1e-6)
            for g in grads:
                g.mul_(clip / norm)
        opt.step()
        m = moe.margins(o.router_logits, k) if k else 1.0
        out.append((loss.item(), norm, m))
    return out


def clear_moe_model(mt, fields, seed, rows):
    """the first seed from seed whose training routes every step's batch with margins >= MIN_MARGIN in fp32 and
    in float64"""
    import copy
    for s in range(seed, seed + 100):
        model = initialised_model(mt, fields, s)
        m64 = copy.deepcopy(model).double()
        r32, r64 = train(model, rows, 1e-3, 0.1, 1.0), train(m64, rows, 1e-3, 0.1, 1.0)
        if min(x[2] for x in r32 + r64) >= MIN_MARGIN:
            return initialised_model(mt, fields, s), s
    sys.exit(f"error: {mt} {fields}: no seed in 100 routes every step with margins >= {MIN_MARGIN}")


def cmd_make(a):
    import transformers
    transformers.logging.set_verbosity_error()
    os.makedirs(a.w, exist_ok=True)
    write_train(a.w)
    rows = batches(os.path.join(a.w, "train.bin"), B, T, STEPS)
    for i, (name, (mt, fields)) in enumerate(CASES.items()):
        d = os.path.join(a.w, name)
        shutil.rmtree(d, ignore_errors=True)
        if mt in ("mixtral", "olmoe", "qwen2_moe"):
            model, seed = clear_moe_model(mt, fields, 100 * i, rows)
            print(f"{name}: seed {seed} routes {STEPS} steps with margins >= {MIN_MARGIN:.0e}")
        else:
            model = initialised_model(mt, fields, 100 * i)
        model.save_pretrained(d, safe_serialization=True)


def cmd_train(a):
    import copy
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    rows = batches(a.shard, a.b, a.t, a.n)
    for d in a.dirs:
        name = os.path.basename(d.rstrip("/"))
        model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                                  attn_implementation="eager")
        m64 = copy.deepcopy(model).double()
        r32, r64 = train(model, rows, a.lr, a.wd, a.clip), train(m64, rows, a.lr, a.wd, a.clip)
        for s, (x, y) in enumerate(zip(r32, r64)):
            print(f"step {name} {s} {x[0]:.9f} {y[0]:.12f} {x[1]:.9g} {y[1]:.12g} {x[2]:.3e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("w")
    t = sub.add_parser("train")
    t.add_argument("shard")
    for f, typ in (("-b", int), ("-t", int), ("-n", int), ("--lr", float), ("--wd", float), ("--clip", float)):
        t.add_argument(f, type=typ, required=True)
    t.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    {"make": cmd_make, "train": cmd_train}[a.cmd](a)


if __name__ == "__main__":
    main()
