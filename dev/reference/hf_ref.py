"""
The Hugging Face side of scripts/test_hf.sh (transformers, offline, fp32 on the CPU):

    hf_ref.py rand DIR --vocab V --ctx T --embd C --layer L --head NH [--seed S] [--hub-names] [--set KEY=VALUE ...]
        a GPT2LMHeadModel with every parameter random (biases and LayerNorms too, so that a misplaced
        tensor shows), saved with save_pretrained (model.safetensors); --set KEY=VALUE sets a config field
        (JSON values: n_inner=96, activation_function='"relu"', tie_word_embeddings=false)
    hf_ref.py shard PATH --vocab V --tokens N [--seed S]
        N random tokens in an llm.c data shard (the val data of both sides)
    hf_ref.py loss DIR SHARD -b B -t T
        transformers' mean loss over the batch train_gpt's first val batch is: row b is the shard's tokens
        b*T .. b*T+T (T+1 tokens, labels = inputs: HF shifts them itself); prints "hf loss %.7f"
    hf_ref.py greedy DIR IDS N
        N tokens after the comma-separated IDS, each the most likely (as train_gpt --sample-temperature 0);
        prints "greedy IDS..." and "margin K": the first step whose top two logits are within 1e-4 (N: none)
    hf_ref.py tok DIR TEXT
        the ids AutoTokenizer.from_pretrained(DIR) gives TEXT
    hf_ref.py same DIR1 DIR2
        exits 0 when the two directories' weights are equal, else names the first that differs
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()


def cmd_rand(a):
    from transformers import GPT2Config, GPT2LMHeadModel
    over = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in a.set)}
    cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.ctx, n_embd=a.embd, n_layer=a.layer, n_head=a.head,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **over)
    torch.manual_seed(a.seed)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    model.save_pretrained(a.dir, safe_serialization=True)
    if a.hub_names:   # the names of the hub's gpt2 files: no 'transformer.' prefix, no lm_head
        from safetensors.numpy import load_file, save_file
        path = os.path.join(a.dir, "model.safetensors")
        sd = load_file(path)
        save_file({k[len("transformer."):]: v for k, v in sd.items() if k.startswith("transformer.")}, path,
                  metadata={"format": "pt"})


def cmd_shard(a):
    rng = np.random.default_rng(a.seed)
    toks = rng.integers(0, a.vocab, size=a.tokens).astype("<u2")
    h = np.zeros(256, dtype="<i4")
    h[:3] = [20240520, 1, a.tokens]
    with open(a.path, "wb") as f:
        f.write(h.tobytes())
        f.write(toks.tobytes())


def cmd_loss(a):
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(a.dir, torch_dtype=torch.float32).eval()
    toks = np.fromfile(a.shard, dtype="<u2", offset=1024).astype(np.int64)
    B, T = a.b, a.t
    if toks.size < B * T + 1:
        sys.exit(f"error: {a.shard} has {toks.size} tokens, a batch needs {B * T + 1}")
    rows = torch.tensor(np.stack([toks[b * T:b * T + T + 1] for b in range(B)]))
    if T + 1 > model.config.n_positions:
        sys.exit(f"error: -t {T}: T + 1 tokens are fed, at most n_positions {model.config.n_positions}")
    with torch.no_grad():
        # labels = the inputs: transformers shifts them, so the T+1 tokens give the B*T predictions of
        # train_gpt's batch (the last position's logits are not used; causal attention keeps it out of the rest)
        loss = model(input_ids=rows, labels=rows).loss
    print(f"hf loss {loss.item():.7f}")


def cmd_greedy(a):
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(a.dir, torch_dtype=torch.float32).eval()
    ids = torch.tensor([[int(x) for x in a.ids.split(",")]])
    out, tie = [], a.n
    with torch.no_grad():
        for k in range(a.n):
            logits = model(ids[:, -model.config.n_positions:]).logits[0, -1]
            top = torch.topk(logits, 2).values
            if tie == a.n and (top[0] - top[1]).item() < 1e-4:
                tie = k
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    print("greedy " + " ".join(map(str, out)))
    print(f"margin {tie}")


def cmd_tok(a):
    from transformers import AutoTokenizer
    print(" ".join(str(i) for i in AutoTokenizer.from_pretrained(a.dir)(a.text)["input_ids"]))


def cmd_same(a):
    from safetensors.numpy import load_file
    x = load_file(os.path.join(a.dir1, "model.safetensors"))
    y = load_file(os.path.join(a.dir2, "model.safetensors"))
    strip = lambda d: {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in d.items()
                       if not k.endswith(".attn.bias") and not k.endswith("masked_bias") and k != "lm_head.weight"}
    x, y = strip(x), strip(y)
    if set(x) != set(y):
        sys.exit(f"different names: {sorted(set(x) ^ set(y))[:5]}")
    for k in sorted(x):
        if x[k].shape != y[k].shape or not np.array_equal(x[k], y[k]):
            sys.exit(f"{k} differs")
    print(f"{len(x)} tensors equal")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rand")
    r.add_argument("dir")
    for k, v in (("vocab", 300), ("ctx", 64), ("embd", 32), ("layer", 2), ("head", 4), ("seed", 0)):
        r.add_argument("--" + k, type=int, default=v)
    r.add_argument("--hub-names", action="store_true", help="tensor names without 'transformer.'")
    r.add_argument("--set", action="append", default=[], help="KEY=VALUE: a config field (a JSON value)")
    s = sub.add_parser("shard")
    s.add_argument("path")
    s.add_argument("--vocab", type=int, required=True)
    s.add_argument("--tokens", type=int, required=True)
    s.add_argument("--seed", type=int, default=0)
    lo = sub.add_parser("loss")
    lo.add_argument("dir")
    lo.add_argument("shard")
    lo.add_argument("-b", type=int, required=True)
    lo.add_argument("-t", type=int, required=True)
    g = sub.add_parser("greedy")
    g.add_argument("dir")
    g.add_argument("ids")
    g.add_argument("n", type=int)
    t = sub.add_parser("tok")
    t.add_argument("dir")
    t.add_argument("text")
    m = sub.add_parser("same")
    m.add_argument("dir1")
    m.add_argument("dir2")
    a = ap.parse_args()
    {"rand": cmd_rand, "shard": cmd_shard, "loss": cmd_loss, "greedy": cmd_greedy, "tok": cmd_tok,
     "same": cmd_same}[a.cmd](a)


if __name__ == "__main__":
    main()
