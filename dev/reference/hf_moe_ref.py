"""
The Hugging Face side of scripts/test_hf_moe.sh (transformers 4.49, offline, fp32 on the CPU): MixtralForCausalLM,
OlmoeForCausalLM and Qwen2MoeForCausalLM, as hf_llama_ref.py does the dense families (its val shard, loss,
greedy and same are reused):

    hf_moe_ref.py make W
        W/val.bin (hf_llama_ref.py's: 4096 random tokens < 300); for each case of CASES a random model (every
        parameter random, the norms' weights around 1) whose routing of train_gpt's first val batch (-b 4 -t 32)
        has no near tie: the first seed from the case's whose top-k margin (the smallest gap between consecutive
        sorted router probabilities among the first k+1, over every MoE layer and token) is at least MIN_MARGIN,
        in fp32 and in float64, which route alike; saved with save_pretrained; for each of REFUSED a directory
        that dev/hf.py import must refuse
    hf_moe_ref.py ref SHARD -b B -t T --ids IDS -n N DIR...
        per DIR, named by its last path component: "loss NAME X Y" (transformers' CE in fp32 and float64, the
        load-balancing loss left out), "route NAME M" (the batch's smallest top-k margin), "greedy NAME IDS..."
        and "margin NAME K": the first greedy step whose top two logits are within 1e-4 or whose forward routes
        some token with a margin under MIN_MARGIN (N: none), past which an fp32 rounding may change the result
    hf_moe_ref.py same DIR1 DIR2 (hf_llama_ref.py's)

Routing margins: our forward and transformers' differ by fp32 rounding in the order of sums (~1e-6 of the
router's inputs, ~1e-7 of a probability); a top-k choice flips only where two probabilities are that close, and a
flip changes the loss by far more than rounding. MIN_MARGIN = 1e-5 is 100x that: no flip, the same experts.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_llama_ref as dense  # noqa: E402  (sets HF_HUB_OFFLINE)
import numpy as np  # noqa: E402

MIN_MARGIN = 1e-5
B, T = 4, 32   # train_gpt's first val batch, as test_hf_moe.sh runs it
CASES = {   # name: (model_type, config fields over hf_llama_ref's BASE: V 300, C 64, NH 4, L 2, maxT 64)
    # every layer MoE, the top 2 renormalised; untied, GQA; Mixtral's intermediate_size is an expert's width
    "mixtral": ("mixtral", dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                intermediate_size=64, tie_word_embeddings=False, rope_theta=1e6, sliding_window=None,
                                router_jitter_noise=0.0)),
    "mixtral_tied": ("mixtral", dict(num_key_value_heads=1, num_local_experts=8, num_experts_per_tok=2,
                                     intermediate_size=32, tie_word_embeddings=True, rope_theta=10000.0)),
    # dense layers (every 2: layers 1 and 3 MoE, F 96), the gated shared expert 2H wide, q/k/v biases, raw gates
    "qwen2_moe": ("qwen2_moe", dict(num_hidden_layers=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                    intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                    decoder_sparse_step=2, norm_topk_prob=False, tie_word_embeddings=False,
                                    rope_theta=1e6, use_sliding_window=False, sliding_window=64, max_window_layers=4)),
    # renormalised gates, every layer MoE, S 1, tied, E 8
    "qwen2_moe_norm": ("qwen2_moe", dict(num_key_value_heads=1, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=48, shared_expert_intermediate_size=48,
                                         decoder_sparse_step=1, norm_topk_prob=True, tie_word_embeddings=True,
                                         mlp_only_layers=[])),
    # QK-norm, raw gates (OLMoE's default), E 8
    "olmoe": ("olmoe", dict(num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, intermediate_size=32,
                            norm_topk_prob=False, tie_word_embeddings=False, pad_token_id=None)),
    # renormalised, MQA, tied, E 4, llama3 RoPE scaling
    "olmoe_norm": ("olmoe", dict(num_key_value_heads=1, num_experts=4, num_experts_per_tok=2, intermediate_size=48,
                                 norm_topk_prob=True, tie_word_embeddings=True, pad_token_id=None,
                                 rope_scaling=dense.LLAMA3)),
}
REFUSED = {   # name: (a case, its config fields changed, config.json fields changed after saving)
    "bad_jitter": ("mixtral", dict(router_jitter_noise=0.1), {}),
    "bad_mixtral_window": ("mixtral", dict(sliding_window=32), {}),
    "bad_mixtral_k1": ("mixtral", dict(num_experts_per_tok=1), {}),
    "bad_k_over_e": ("mixtral", {}, {"num_experts_per_tok": 5}),
    "bad_mlp_only": ("qwen2_moe", dict(mlp_only_layers=[1]), {}),
    "bad_shared_width": ("qwen2_moe", dict(shared_expert_intermediate_size=48), {}),
    "bad_sparse_step": ("qwen2_moe", {}, {"decoder_sparse_step": 5}),
    "bad_qwen2_moe_window": ("qwen2_moe", dict(use_sliding_window=True, sliding_window=32), {}),
    "bad_norm_topk_prob": ("qwen2_moe", {}, {"norm_topk_prob": "yes"}),
    "bad_clip_qkv": ("olmoe", dict(clip_qkv=8.0), {}),
    "bad_olmoe_bias": ("olmoe", dict(attention_bias=True), {}),
    "bad_vocab": ("mixtral", {}, {"vocab_size": 2**20 + 1}),   # past the model file's Vp <= 2^20
    "vocab_2p20": ("mixtral", {}, {"vocab_size": 2**20}),      # the config passes; the weights (V 300) do not
}


def margins(router_logits, k):
    """the smallest top-k margin over every MoE layer's router logits (tokens, E): gaps between consecutive
    sorted probabilities among the first k+1 (k+1 <= E), of the softmax in float64"""
    import torch
    m = float("inf")
    for rl in router_logits:
        p = torch.softmax(rl.double(), dim=-1)
        top = torch.topk(p, min(k + 1, p.shape[-1]), dim=-1).values
        m = min(m, (top[:, :-1] - top[:, 1:]).min().item())
    return m


def routing(model, rows):
    """(the top-k choices of every MoE layer, the smallest margin) of the batch rows (labels not given: no loss)"""
    import torch
    k = model.config.num_experts_per_tok
    with torch.no_grad():
        out = model(input_ids=rows, output_router_logits=True)
    choice = [torch.topk(rl.double(), k, dim=-1).indices for rl in out.router_logits]
    return choice, margins(out.router_logits, k)


def val_rows(shard):
    import torch
    toks = np.fromfile(shard, dtype="<u2", offset=1024).astype(np.int64)
    return torch.tensor(np.stack([toks[b * T:b * T + T + 1] for b in range(B)]))


def clear_model(mt, fields, seed, rows):
    """the random model of the first seed from seed whose routing of rows has margins >= MIN_MARGIN (fp32 and
    float64 choosing alike); -> (model, seed, margin)"""
    for s in range(seed, seed + 100):
        model = dense.random_model(mt, fields, s).eval()
        c32, m32 = routing(model, rows)
        c64, m64 = routing(model.double(), rows)
        model.float()
        same = all(bool((a == b).all()) for a, b in zip(c32, c64))
        if same and min(m32, m64) >= MIN_MARGIN:
            return model, s, m32
    sys.exit(f"error: {mt} {fields}: no seed in 100 routes with margins >= {MIN_MARGIN}")


def cmd_make(a):
    import transformers
    transformers.logging.set_verbosity_error()
    dense.write_val(a.w)
    rows = val_rows(os.path.join(a.w, "val.bin"))
    for i, (name, (mt, fields)) in enumerate(CASES.items()):
        d = os.path.join(a.w, name)
        shutil.rmtree(d, ignore_errors=True)
        model, seed, m = clear_model(mt, fields, 100 * i, rows)
        dense.save_with_edits(model, d, {})
        print(f"{name}: seed {seed}, smallest routing margin {m:.2e}")
    for name, (case, fields, edits) in REFUSED.items():
        mt, base = CASES[case]
        d = os.path.join(a.w, name)
        shutil.rmtree(d, ignore_errors=True)
        dense.save_with_edits(dense.random_model(mt, {**base, **fields}, 0), d, edits)


def greedy(model, ids, n):
    """n argmax tokens after ids (full forwards, as train_gpt -g); the first step past which they may differ
    (the top two logits within 1e-4, or a routing margin under MIN_MARGIN), n if none"""
    import torch
    ids, out, cut = torch.tensor([ids]), [], n
    k = model.config.num_experts_per_tok
    with torch.no_grad():
        for step in range(n):
            o = model(ids, output_router_logits=True)
            logits = o.logits[0, -1]
            top = torch.topk(logits, 2).values
            if cut == n and ((top[0] - top[1]).item() < 1e-4 or margins(o.router_logits, k) < MIN_MARGIN):
                cut = step
            out.append(int(torch.argmax(logits)))
            ids = torch.cat([ids, torch.tensor([[out[-1]]])], 1)
    return out, cut


def cmd_ref(a):
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    global B, T
    B, T = a.b, a.t
    rows = val_rows(a.shard)
    ids = [int(x) for x in a.ids.split(",")]
    for d in a.dirs:
        name = os.path.basename(d.rstrip("/"))
        model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
        with torch.no_grad():   # CE only: output_router_logits off, no load-balancing term
            l32 = model(input_ids=rows, labels=rows, output_router_logits=False).loss.item()
            _, m = routing(model, rows)
            gen, cut = greedy(model, ids, a.n)
            l64 = model.double()(input_ids=rows, labels=rows, output_router_logits=False).loss.item()
        print(f"loss {name} {l32:.7f} {l64:.9f}")
        print(f"route {name} {m:.3e}")
        print(f"greedy {name} " + " ".join(map(str, gen)))
        print(f"margin {name} {cut}")


def main():
    dense.cli(__doc__, {"make": cmd_make, "ref": cmd_ref, "same": dense.cmd_same})


if __name__ == "__main__":
    main()
