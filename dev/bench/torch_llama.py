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
import argparse
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM
from torch_bench import add_run_args, setup, train

p = argparse.ArgumentParser()
for k, v in dict(L=4, C=256, NH=4, KV=2, F=0, V=50257, maxT=1024, B=4, T=256, steps=20, warmup=3, threads=2,
                 tied=0).items():
    p.add_argument("--" + k, type=int, default=v)
p.add_argument("--theta", type=float, default=500000.0)
p.add_argument("--eps", type=float, default=1e-5)
add_run_args(p)
a = p.parse_args()
Fw = a.F or 256 * -(-8 * a.C // 3 // 256)   # ceil(8C/3/256) as train_gpt: integer 8C/3 first (768 at C 256)
dev = setup(a)
cfg = LlamaConfig(vocab_size=a.V, hidden_size=a.C, intermediate_size=Fw, num_hidden_layers=a.L,
                  num_attention_heads=a.NH, num_key_value_heads=a.KV, max_position_embeddings=a.maxT,
                  rms_norm_eps=a.eps, rope_theta=a.theta, tie_word_embeddings=bool(a.tied), attention_bias=False,
                  mlp_bias=False, hidden_act="silu", attention_dropout=0.0, use_cache=False,
                  attn_implementation="sdpa" if a.sdpa else "eager")   # (fp32 weights: the default dtype)
model = LlamaForCausalLM(cfg).to(dev).train()
params = [t for t in model.parameters()]

def loss_of(idx, tgt):
    with torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.bf16):
        logits = model(input_ids=idx).logits   # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, a.V).float(), tgt.reshape(-1))

train(a, dev, params, loss_of)
