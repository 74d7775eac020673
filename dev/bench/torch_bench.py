"""
What dev/bench/torch_gpt2.py and torch_llama.py share: the flags of a run besides the model's shape, the threads,
seed and device, and the timed training (AdamW, grad clipping, the steps' tokens random or from an llm.c shard)
that prints the one line both print: "torch VERSION tok/s X ms/step Y blas Z cpu-ms/step W".
"""
import os, subprocess, time
import torch


def add_run_args(p):
    """the flags both take after the model's: --device, --bf16, --sdpa, --compile, --data FILE, --go FILE"""
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--sdpa", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--data", default=None)
    p.add_argument("--go", default=None)   # after the warm-up, print "warm" and wait for this file to exist


def setup(a):
    """a.threads threads, seed 0; the device (TF32 matmuls on CUDA)"""
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    return dev


def step_tokens(a, dev):
    """(warmup + steps, B, T + 1) tokens on dev: random below a.V, or the first of the shard --data"""
    n = (a.steps + a.warmup) * a.B * (a.T + 1)
    if a.data:   # an llm.c shard: int32 header[256] (magic 20240520, version, count), then uint16 tokens
        import numpy as np
        tok = np.fromfile(a.data, dtype="<u2", offset=1024).astype(np.int64)
        if len(tok) < n:
            raise SystemExit(f"--data {a.data}: {len(tok)} tokens, the steps need {n}")
        data = torch.from_numpy(tok[:n].copy()).view(a.steps + a.warmup, a.B, a.T + 1)
    else:
        data = torch.randint(0, a.V, (a.steps + a.warmup, a.B, a.T + 1))
    return data.to(dev)


def train(a, dev, params, loss_of):
    """a.warmup + a.steps steps of AdamW on loss_of(idx, tgt) (compiled with --compile), the gradients clipped at
    norm 1; prints the timed steps' line"""
    step_loss = torch.compile(loss_of) if a.compile else loss_of
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            **({"fused": True} if a.device == "cuda" else {}))   # (fused: torch >= 2.0)
    data = step_tokens(a, dev)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    times, cpu = [], []
    for s in range(a.steps + a.warmup):
        if a.go and s == a.warmup:   # compiled and warm: the timed steps wait for a quiet GPU (bench_gpu.sh)
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
