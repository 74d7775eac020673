#!/usr/bin/python3
"""
The PyTorch side of the CPU benchmark: the same GPT-2 (tied head, padded vocab, GELU-tanh), written
the idiomatic fast way (torch.nn.functional ops, torch.optim.AdamW, grad clipping), timed on the
same threads as train_gpt. Prints one line: "torch VERSION tok/s X ms/step Y blas Z cpu-ms/step W" (W: the
process's CPU time per step, all threads: on a loaded machine a 1-thread run's W is its unloaded ms/step).
usage: /usr/bin/python3 dev/bench/torch_gpt2.py --L 4 --C 128 --NH 4 --V 50257 --Vp 50304 --maxT 1024 --B 4 --T 64 --steps 20 --threads 2
"""
import argparse, math, time
import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
for k, v in dict(L=4, C=128, NH=4, V=50257, Vp=50304, maxT=1024, B=4, T=64, steps=20, warmup=3, threads=2).items():
    p.add_argument("--" + k, type=int, default=v)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
L, C, NH = a.L, a.C, a.NH
P = {}
def w(*shape, std=0.02):
    return torch.nn.Parameter(torch.randn(*shape) * std)
P["wte"] = w(a.Vp, C); P["wpe"] = w(a.maxT, C)
blocks = []
for l in range(L):
    blocks.append(dict(ln1w=torch.nn.Parameter(torch.ones(C)), ln1b=torch.nn.Parameter(torch.zeros(C)),
                       qkvw=w(3 * C, C), qkvb=torch.nn.Parameter(torch.zeros(3 * C)),
                       attprojw=w(C, C, std=0.02 / math.sqrt(2 * L)), attprojb=torch.nn.Parameter(torch.zeros(C)),
                       ln2w=torch.nn.Parameter(torch.ones(C)), ln2b=torch.nn.Parameter(torch.zeros(C)),
                       fcw=w(4 * C, C), fcb=torch.nn.Parameter(torch.zeros(4 * C)),
                       fcprojw=w(C, 4 * C, std=0.02 / math.sqrt(2 * L)), fcprojb=torch.nn.Parameter(torch.zeros(C))))
P["lnfw"] = torch.nn.Parameter(torch.ones(C)); P["lnfb"] = torch.nn.Parameter(torch.zeros(C))
params = list(P.values()) + [t for b in blocks for t in b.values()]
mask = torch.ones(a.T, a.T, dtype=torch.bool).triu(1)

def forward(idx, tgt):
    B, T = idx.shape
    x = F.embedding(idx, P["wte"]) + P["wpe"][:T]
    hs = C // NH
    for b in blocks:
        h = F.layer_norm(x, (C,), b["ln1w"], b["ln1b"])
        q, k, v = F.linear(h, b["qkvw"], b["qkvb"]).split(C, dim=-1)
        q, k, v = [t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = F.softmax(att.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, b["attprojw"], b["attprojb"])
        h = F.layer_norm(x, (C,), b["ln2w"], b["ln2b"])
        x = x + F.linear(F.gelu(F.linear(h, b["fcw"], b["fcb"]), approximate="tanh"), b["fcprojw"], b["fcprojb"])
    x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"])
    logits = F.linear(x, P["wte"][:a.V])
    return F.cross_entropy(logits.reshape(-1, a.V), tgt.reshape(-1))

opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
data = torch.randint(0, a.V, (a.steps + a.warmup, a.B, a.T + 1))
times, cpu = [], []
for s in range(a.steps + a.warmup):
    t0, c0 = time.perf_counter(), time.process_time()
    loss = forward(data[s, :, :-1], data[s, :, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
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
