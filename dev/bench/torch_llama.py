"""
The PyTorch side of the CPU benchmark's Llama rows: transformers' LlamaForCausalLM (eager attention, fp32, no
biases, untied head unless --tied 1), the same shape as train_gpt's `-e "arch=llama,..."`, trained the idiomatic
way (the model's logits, F.cross_entropy, torch.optim.AdamW, grad clipping) on the same threads. Prints the line
torch_gpt2.py prints: "torch VERSION tok/s X ms/step Y blas Z cpu-ms/step W" (W: the process's CPU time per step).
usage: .venv/bin/python dev/bench/torch_llama.py --L 4 --C 256 --NH 4 --KV 2 --F 768 --V 50257 --maxT 1024 \
           --B 4 --T 256 --steps 20 --threads 2
(F 0: our default, 256 ceil(8C/3/256); theta 500000 and eps 1e-5 as our defaults)
GPU (dev/bench/bench_gpu.sh): --device cuda --bf16 (autocast) --sdpa (the model's SDPA attention) --compile
(torch.compile of the step's loss) --data FILE (the steps' tokens from an llm.c shard, as train_gpt reads it)
"""
import argparse, subprocess, time
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
for k, v in dict(L=4, C=256, NH=4, KV=2, F=0, V=50257, maxT=1024, B=4, T=256, steps=20, warmup=3, threads=2,
                 tied=0).items():
    p.add_argument("--" + k, type=int, default=v)
p.add_argument("--theta", type=float, default=500000.0)
p.add_argument("--eps", type=float, default=1e-5)
p.add_argument("--device", default="cpu")
p.add_argument("--bf16", action="store_true")
p.add_argument("--sdpa", action="store_true")
p.add_argument("--compile", action="store_true")
p.add_argument("--data", default=None)
p.add_argument("--go", default=None)   # after the warm-up, print "warm" and wait for this file to exist
a = p.parse_args()
Fw = a.F or 256 * -(-8 * a.C // 3 // 256)   # ceil(8C/3/256) as train_gpt: integer 8C/3 first (768 at C 256)
torch.set_num_threads(a.threads)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=a.V, hidden_size=a.C, intermediate_size=Fw, num_hidden_layers=a.L,
                  num_attention_heads=a.NH, num_key_value_heads=a.KV, max_position_embeddings=a.maxT,
                  rms_norm_eps=a.eps, rope_theta=a.theta, tie_word_embeddings=bool(a.tied), attention_bias=False,
                  mlp_bias=False, hidden_act="silu", attention_dropout=0.0, use_cache=False,
                  attn_implementation="sdpa" if a.sdpa else "eager")   # (fp32 weights: the default dtype)
dev = torch.device(a.device)
if a.device == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = True
model = LlamaForCausalLM(cfg).to(dev).train()
params = [t for t in model.parameters()]
opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                        **({"fused": True} if a.device == "cuda" else {}))
n = (a.steps + a.warmup) * a.B * (a.T + 1)
if a.data:   # an llm.c shard: int32 header[256], then uint16 tokens
    import numpy as np
    tok = np.fromfile(a.data, dtype="<u2", offset=1024).astype(np.int64)
    if len(tok) < n:
        raise SystemExit(f"--data {a.data}: {len(tok)} tokens, the steps need {n}")
    data = torch.from_numpy(tok[:n].copy()).view(a.steps + a.warmup, a.B, a.T + 1)
else:
    data = torch.randint(0, a.V, (a.steps + a.warmup, a.B, a.T + 1))
data = data.to(dev)

def loss_of(idx, tgt):
    with torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.bf16):
        logits = model(input_ids=idx).logits   # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, a.V).float(), tgt.reshape(-1))

step_loss = torch.compile(loss_of) if a.compile else loss_of
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
    alt = subprocess.run(["update-alternatives", "--query", "libblas.so.3-x86_64-linux-gnu"], capture_output=True,
                         text=True).stdout
    blas = [l.split()[1] for l in alt.splitlines() if l.startswith("Value:")][0]
except Exception:
    pass
print("torch %s tok/s %.0f ms/step %.1f blas %s cpu-ms/step %.1f" % (torch.__version__, a.B * a.T / (ms / 1000), ms,
                                                                     blas, cpu_ms))
