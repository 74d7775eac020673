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
import argparse, math, time
import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
for k, v in dict(L=4, C=128, NH=4, V=50257, Vp=50304, maxT=1024, B=4, T=64, steps=20, warmup=3, threads=2).items():
    p.add_argument("--" + k, type=int, default=v)
p.add_argument("--device", default="cpu")
p.add_argument("--bf16", action="store_true")
p.add_argument("--sdpa", action="store_true")
p.add_argument("--compile", action="store_true")
p.add_argument("--data", default=None)
p.add_argument("--go", default=None)   # after the warm-up, print "warm" and wait for this file to exist
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
dev = torch.device(a.device)
if a.device == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = True
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

step_loss = torch.compile(loss_of) if a.compile else loss_of
opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                        **({"fused": True} if a.device == "cuda" else {}))   # (fused: torch >= 2.0)
n = (a.steps + a.warmup) * a.B * (a.T + 1)
if a.data:   # an llm.c shard: int32 header[256] (magic 20240520, version, count), then uint16 tokens
    import numpy as np
    tok = np.fromfile(a.data, dtype="<u2", offset=1024).astype(np.int64)
    if len(tok) < n:
        raise SystemExit(f"--data {a.data}: {len(tok)} tokens, the steps need {n}")
    data = torch.from_numpy(tok[:n].copy()).view(a.steps + a.warmup, a.B, a.T + 1)
else:
    data = torch.randint(0, a.V, (a.steps + a.warmup, a.B, a.T + 1))
data = data.to(dev)
sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
times, cpu = [], []
for s in range(a.steps + a.warmup):
    if a.go and s == a.warmup:   # compiled and warm: the timed steps wait for a quiet GPU (bench_gpu.sh)
        import os
        print("warm", flush=True)
        while not os.path.exists(a.go):
            time.sleep(0.05)
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    loss = step_loss(data[s, :, :-1], data[s, :, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sync()
    if s >= a.warmup:
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
ms, cpu_ms = 1000 * sum(times) / len(times), 1000 * sum(cpu) / len(cpu)
blas = "unknown"
try:   # Debian's torch calls whatever libblas.so.3 the system alternative points to
    import subprocess
    alt = subprocess.run(["update-alternatives", "--query", "libblas.so.3-x86_64-linux-gnu"], capture_output=True, text=True).stdout
    blas = [l.split()[1] for l in alt.splitlines() if l.startswith("Value:")][0]
except Exception:
    pass
print("torch %s tok/s %.0f ms/step %.1f blas %s cpu-ms/step %.1f" % (torch.__version__, a.B * a.T / (ms / 1000), ms, blas, cpu_ms))
