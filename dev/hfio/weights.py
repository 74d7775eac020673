"""A Hugging Face checkpoint's tensors: safetensors (tensors tiling the data) or pytorch_model.bin; each taken once."""
import json
import math
import os

import numpy as np

from cli import fail, read_regular
from .ourfile import read_json


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
