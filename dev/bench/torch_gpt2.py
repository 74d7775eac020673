#!/usr/bin/python3
"""
The PyTorch side of the CPU benchmark: the same GPT-2 (tied head, padded vocab, GELU-tanh), written
the idiomatic fast way (torch.nn.functional ops, torch.optim.AdamW, grad clipping), timed on the
same threads as train_gpt. Prints one line: "torch VERSION tok/s X ms/step Y blas Z cpu-ms/step W" (W: the
process's CPU time per step, all threads: on a loaded machine a 1-thread run's W is its unloaded ms/step).
usage: /usr/bin/python3 dev/bench/torch_gpt2.py --L 4 --C 128 --NH 4 --V 50257 --Vp 50304 --maxT 1024 --B 4 --T 64 --steps 20 --threads 2
GPU (dev/bench/bench_gpu.sh): --device cuda --bf16 (autocast) --sdpa (F.scaled_dot_product_attention) --compile
(torch.compile) --data FILE (the steps' tokens from an llm.c shard, as train_gpt reads it, instead of random ones)
"""
import argparse, math
import torch
import torch.nn.functional as F
from torch_bench import add_run_args, setup, train

p = argparse.ArgumentParser()
for k, v in dict(L=4, C=128, NH=4, V=50257, Vp=50304, maxT=1024, B=4, T=64, steps=20, warmup=3, threads=2).items():
    p.add_argument("--" + k, type=int, default=v)
add_run_args(p)
a = p.parse_args()
dev = setup(a)
L, C, NH = a.L, a.C, a.NH
P = {}
def w(*shape, std=0.02):
    return torch.nn.Parameter((torch.randn(*shape) * std).to(dev))
def const(n, value):
    return torch.nn.Parameter(torch.full((n,), value, device=dev))
P["wte"] = w(a.Vp, C); P["wpe"] = w(a.maxT, C)
blocks = []
for l in range(L):
    blocks.append(dict(ln1w=const(C, 1.0), ln1b=const(C, 0.0), qkvw=w(3 * C, C), qkvb=const(3 * C, 0.0),
                       attprojw=w(C, C, std=0.02 / math.sqrt(2 * L)), attprojb=const(C, 0.0),
                       ln2w=const(C, 1.0), ln2b=const(C, 0.0), fcw=w(4 * C, C), fcb=const(4 * C, 0.0),
                       fcprojw=w(C, 4 * C, std=0.02 / math.sqrt(2 * L)), fcprojb=const(C, 0.0)))
P["lnfw"] = const(C, 1.0); P["lnfb"] = const(C, 0.0)
params = list(P.values()) + [t for b in blocks for t in b.values()]
mask = torch.ones(a.T, a.T, dtype=torch.bool, device=dev).triu(1)

def forward(idx, tgt):
    B, T = idx.shape
    x = F.embedding(idx, P["wte"]) + P["wpe"][:T]
    hs = C // NH
    for b in blocks:
        h = F.layer_norm(x, (C,), b["ln1w"], b["ln1b"])
        q, k, v = F.linear(h, b["qkvw"], b["qkvb"]).split(C, dim=-1)
        q, k, v = [t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v)]
        if a.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
            att = F.softmax(att.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
            y = att @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, b["attprojw"], b["attprojb"])
        h = F.layer_norm(x, (C,), b["ln2w"], b["ln2b"])
        x = x + F.linear(F.gelu(F.linear(h, b["fcw"], b["fcb"]), approximate="tanh"), b["fcprojw"], b["fcprojb"])
    x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"])
    logits = F.linear(x, P["wte"][:a.V])
    return F.cross_entropy(logits.reshape(-1, a.V).float(), tgt.reshape(-1))

def loss_of(idx, tgt):
    if a.bf16:
        with torch.autocast(device_type=a.device, dtype=torch.bfloat16):
            return forward(idx, tgt)
    return forward(idx, tgt)

train(a, dev, params, loss_of)
