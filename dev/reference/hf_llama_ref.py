"""
The Hugging Face side of scripts/test_hf_llama.sh (transformers 4.49, offline, fp32 on the CPU):

    hf_llama_ref.py make W
        W/val.bin: 4096 random tokens < 300 (an llm.c data shard, the val data of both sides); for each case of
        CASES a random model (every parameter random, the norms' weights around 1, seeded), fp32, saved with
        save_pretrained; for each of REFUSED a directory that dev/hf.py import must refuse (a real model of that
        config where transformers builds one); W/tok: a byte-level BPE tokenizer of 300 ids trained on a few
        lines (tokenizers, in memory), saved with save_pretrained, for dev/sample.py --tokenizer
    hf_llama_ref.py ref SHARD -b B -t T --ids IDS -n N DIR...
        per DIR (AutoModelForCausalLM: Llama, Mistral or Qwen2), named by its last path component:
        "loss NAME X Y": transformers' mean loss over train_gpt's first val batch (row b is the shard's tokens
        b*T .. b*T+T: T+1 tokens, labels = inputs, HF shifts them itself) in fp32 (X) and float64 (Y: how far
        fp32's rounding moves it); "greedy NAME IDS...": N tokens after IDS, each the argmax of a full forward
        over the text (generate(do_sample=False) without its cache, as train_gpt --sample-temperature 0 does
        it; generate() itself needs a newer torch than Debian's 1.13); "margin NAME K": the first step whose top
        two logits are within 1e-4 (N: none), past which an fp32 rounding may flip the argmax
    hf_llama_ref.py same DIR1 DIR2
        exits 0 when DIR2's model.safetensors holds every tensor of DIR1's, bit for bit, and nothing else
"""
import argparse
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
import numpy as np  # noqa: E402

V = 300
BASE = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, rms_norm_eps=1e-5, hidden_act="silu", attention_dropout=0.0,
            bos_token_id=None, eos_token_id=None)
# Llama 3.1's factors; its original_max_position_embeddings 8192 would rescale only frequencies whose angles stay
# under 0.05 in 32 positions (a loss change of 2e-6: unseen); 64 keeps i = 0, smooths i = 1, divides i >= 2
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)
CASES = {   # name: (model_type, config fields over BASE)
    "llama": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500000.0)),
    # llama3 scaling (every band of it in use at head size 16: kept, smoothed, divided), Llama 3.1's positions
    "llama_tied": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500000.0,
                                 rope_scaling=LLAMA3, max_position_embeddings=131072)),
    "mistral": ("mistral", dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=1e6, sliding_window=None)),
    # q/k/v biases; a window of max_position_embeddings (no effect on any sequence our model runs)
    "qwen2": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6, use_sliding_window=False,
                            sliding_window=64, max_window_layers=2)),
}
REFUSED = {   # name: (a case, its config fields changed, config.json fields changed after saving: None deletes)
    "bad_dynamic": ("llama", dict(rope_scaling=dict(rope_type="dynamic", factor=2.0)), {}),
    "bad_yarn": ("llama", dict(rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16)),
                 {}),
    "bad_window": ("mistral", dict(sliding_window=32), {}),
    "bad_window_qwen2": ("qwen2", dict(sliding_window=32, use_sliding_window=False), {}),
    "bad_window_default": ("mistral", dict(max_position_embeddings=8192), {"sliding_window": None}),   # 4096
    "bad_attention_bias": ("llama", dict(attention_bias=True), {}),
    "bad_mlp_bias": ("llama", dict(mlp_bias=True), {}),
    "bad_act": ("llama", dict(hidden_act="gelu"), {}),
    "bad_head_dim": ("llama", dict(head_dim=8), {}),
    "bad_type": ("llama", {}, {"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}),
}
TOKENIZER_TEXT = ["First Citizen: Before we proceed any further, hear me speak.",
                  "All: Speak, speak. You are all resolved rather to die than to famish?",
                  "Naïve café, déjà vu: ünïcödé text too."]


def random_model(model_type, fields, seed):
    import torch
    import transformers
    conf = transformers.AutoConfig.for_model(model_type, **{**BASE, **fields})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(conf, torch_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.1 * torch.randn_like(p))
    return model


def save_with_edits(model, d, edits):
    model.save_pretrained(d, safe_serialization=True)
    if edits:
        path = os.path.join(d, "config.json")
        hc = json.load(open(path))
        for k, v in edits.items():
            hc.pop(k, None) if v is None else hc.__setitem__(k, v)
        json.dump(hc, open(path, "w"), indent=2)


def make_tokenizer(d):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=V, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(TOKENIZER_TEXT, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>").save_pretrained(d)


def write_val(w):
    """w/val.bin: 4096 random tokens < V, an llm.c uint16 shard"""
    rng = np.random.default_rng(1)
    h = np.zeros(256, dtype="<i4")
    h[:3] = [20240520, 1, 4096]
    with open(os.path.join(w, "val.bin"), "wb") as f:
        f.write(h.tobytes() + rng.integers(0, V, size=4096).astype("<u2").tobytes())


def cmd_make(a):
    import transformers
    transformers.logging.set_verbosity_error()
    write_val(a.w)
    for seed, (name, (mt, fields)) in enumerate(CASES.items()):
        shutil.rmtree(os.path.join(a.w, name), ignore_errors=True)
        save_with_edits(random_model(mt, fields, seed), os.path.join(a.w, name), {})
    for name, (case, fields, edits) in REFUSED.items():
        mt, base = CASES[case]
        shutil.rmtree(os.path.join(a.w, name), ignore_errors=True)
        save_with_edits(random_model(mt, {**base, **fields}, 0), os.path.join(a.w, name), edits)
    shutil.rmtree(os.path.join(a.w, "tok"), ignore_errors=True)
    make_tokenizer(os.path.join(a.w, "tok"))


def loss_of(model, rows):
    # labels = the inputs: transformers shifts them, so the T+1 tokens give the B*T predictions of train_gpt's
    # batch (the last position's logits are not used; causal attention keeps it out of the rest)
    import torch
    with torch.no_grad():
        return model(input_ids=rows, labels=rows).loss.item()


def greedy(model, ids, n):
    import torch
    ids, out, tie = torch.tensor([ids]), [], n
    with torch.no_grad():
        for k in range(n):
            logits = model(ids).logits[0, -1]
            top = torch.topk(logits, 2).values
            if tie == n and (top[0] - top[1]).item() < 1e-4:
                tie = k
            out.append(int(torch.argmax(logits)))
            ids = torch.cat([ids, torch.tensor([[out[-1]]])], 1)
    return out, tie


def cmd_ref(a):
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    toks = np.fromfile(a.shard, dtype="<u2", offset=1024).astype(np.int64)
    B, T = a.b, a.t
    if toks.size < B * T + 1:
        sys.exit(f"error: {a.shard} has {toks.size} tokens, a batch needs {B * T + 1}")
    rows = torch.tensor(np.stack([toks[b * T:b * T + T + 1] for b in range(B)]))
    ids = [int(x) for x in a.ids.split(",")]
    for d in a.dirs:
        name = os.path.basename(d.rstrip("/"))
        model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
        if T + 1 > model.config.max_position_embeddings:
            sys.exit(f"error: -t {T}: T + 1 tokens are fed, at most {model.config.max_position_embeddings}")
        l32 = loss_of(model, rows)
        gen, tie = greedy(model, ids, a.n)
        l64 = loss_of(model.double(), rows)
        print(f"loss {name} {l32:.7f} {l64:.9f}")
        print(f"greedy {name} " + " ".join(map(str, gen)))
        print(f"margin {name} {tie}")


def cmd_same(a):
    from safetensors.numpy import load_file
    x = load_file(os.path.join(a.dir1, "model.safetensors"))
    y = load_file(os.path.join(a.dir2, "model.safetensors"))
    if set(x) != set(y):
        sys.exit(f"different names: {sorted(set(x) ^ set(y))[:5]}")
    for k in sorted(x):
        if x[k].dtype != y[k].dtype or x[k].shape != y[k].shape or not np.array_equal(x[k], y[k]):
            sys.exit(f"{k} differs")
    print(f"{len(x)} tensors equal")


def cli(doc, commands):
    """The make / ref / same command line (this script's and hf_moe_ref.py's): commands maps each to its function."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("w")
    r = sub.add_parser("ref")
    r.add_argument("shard")
    r.add_argument("-b", type=int, required=True)
    r.add_argument("-t", type=int, required=True)
    r.add_argument("--ids", required=True)
    r.add_argument("-n", type=int, required=True)
    r.add_argument("dirs", nargs="+")
    s = sub.add_parser("same")
    s.add_argument("dir1")
    s.add_argument("dir2")
    a = ap.parse_args()
    commands[a.cmd](a)


def main():
    cli(__doc__, {"make": cmd_make, "ref": cmd_ref, "same": cmd_same})


if __name__ == "__main__":
    main()
