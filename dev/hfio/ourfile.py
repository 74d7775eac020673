"""Our model file (llm.c's format; ours for MoE and the Llama family): shapes, header, read, write; number helpers."""
import json
import math
import os
import struct
import zlib

import numpy as np

from cli import fail, read_regular


MODEL_MAGIC = 20240326
HEADER_INTS = 256
EPS = 1e-5
MOE_NAMES = ("routerw", "efcw", "efcb", "efcprojw", "efcprojb", "sfcw", "sfcb", "sfcprojw", "sfcprojb")


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


def short(x):
    """a float32 value as the shortest decimal that reads back as it (1e-05, not 9.99999974738e-06)"""
    return float(str(np.float32(x)))
