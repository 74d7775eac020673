#!/usr/bin/python3
"""
The step-0 gradients of a dense reference state as a bf16 GPU build computes them, emulated in
PyTorch on the CPU: the input of test_gpt's --check-tolerance (the bf16 tolerances must pass them).

Usage:  .venv/bin/python dev/reference/bf16_grads.py --ref refs/d4 --out FILE

Emulated rounding (round to nearest even, both directions): the parameters are bf16; every
activation a kernel stores is bf16 (the residual stream, each LayerNorm output, qkv, the attention
output, each projection, fc and its GELU, the final LayerNorm) and so is the gradient of each
(rounded again on the way back); products accumulate in fp32, as cuBLAS does; the softmaxes (the
attention's and the loss's) run in fp32, the attention's backward with D = rowsum(dY o Y) from the stored bf16 Y
(as the kernels: FlashAttention's recipe); the parameter gradients are stored bf16. FILE: the 16
gradient tensors, fp32 (holding bf16 values), in llm.c order, nothing else.
"""
import argparse, os, sys
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref as ref


class Round(torch.autograd.Function):
    """x -> bf16(x) on the way forward, g -> bf16(g) on the way back (a stored activation, its gradient)"""
    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).float()

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).float()


R = Round.apply


class AttendStoredY(ref.AttendD):
    """causal attention in fp32 (scores, softmax, P v); its backward as the kernels run it: D = rowsum(dy o y) from
    the stored bf16 y (FlashAttention's recipe), where the reference's D is exact"""
    @staticmethod
    def backward(ctx, dy):
        q, k, v, P, y = ctx.saved_tensors
        D = (dy * y.to(torch.bfloat16).float()).sum(-1, keepdim=True)
        dS = P * (dy @ v.transpose(-2, -1) - D)
        return dS @ k * ctx.scale, dS.transpose(-2, -1) @ q * ctx.scale, P.transpose(-2, -1) @ dy, None


def attention_bf16(h, w, b, NH):
    B, T, C = h.shape
    hs = C // NH
    qkv = R(h @ w.t() + b)
    q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, NH, hs).transpose(1, 2) for i in range(3))
    y = AttendStoredY.apply(q, k, v, 1.0 / hs ** 0.5)
    return R(y.transpose(1, 2).reshape(B, T, C))


def forward_bf16(p, idx, targets, cfg):
    B, T = idx.shape
    x = R(p["wte"][idx] + p["wpe"][:T])
    for l in range(cfg["L"]):
        h = R(ref.layernorm(x, p["ln1w"][l], p["ln1b"][l]))
        h = attention_bf16(h, p["qkvw"][l], p["qkvb"][l], cfg["NH"])
        x = R(x + R(h @ p["attprojw"][l].t() + p["attprojb"][l]))
        h = R(ref.layernorm(x, p["ln2w"][l], p["ln2b"][l]))
        h = R(ref.gelu_tanh(R(h @ p["fcw"][l].t() + p["fcb"][l])))
        x = R(x + R(h @ p["fcprojw"][l].t() + p["fcprojb"][l]))
    x = R(ref.layernorm(x, p["lnfw"], p["lnfb"]))
    logits = x @ p["wte"][:cfg["V"]].t()                    # fp32, as the fused loss computes them
    return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--ref", required=True, help="a dense reference state (model.bin, data.bin, state.bin)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    h = np.fromfile(os.path.join(a.ref, "model.bin"), dtype="<i4", count=256)
    if h[0] != 20240326 or h[1] != 3:
        sys.exit(f"{a.ref}/model.bin: expected a dense fp32 model file (version 3), got version {h[1]}")
    s = np.fromfile(os.path.join(a.ref, "state.bin"), dtype="<i4", count=256)
    cfg = dict(maxT=int(h[2]), V=int(h[3]), L=int(h[4]), NH=int(h[5]), C=int(h[6]), Vp=int(h[7]),
               T=int(s[2]), R=int(s[3]), E=0)
    flat = np.fromfile(os.path.join(a.ref, "model.bin"), dtype="<f4", offset=1024)
    p, off = {}, 0
    for name, shape in zip(ref.NAMES, ref.param_shapes(cfg)):
        n = int(np.prod(shape))
        t = torch.from_numpy(flat[off:off + n].copy()).reshape(shape)
        p[name] = t.to(torch.bfloat16).float().requires_grad_(True)   # bf16 parameters
        off += n
    dh = np.fromfile(os.path.join(a.ref, "data.bin"), dtype="<i4", count=256)
    tokens = np.fromfile(os.path.join(a.ref, "data.bin"), dtype="<u2", offset=1024, count=int(dh[2]))
    x, y = ref.batch(tokens, 0, cfg)
    loss = forward_bf16(p, x, y, cfg)
    loss.backward()
    with open(a.out, "wb") as f:
        for name in ref.NAMES:
            f.write(p[name].grad.to(torch.bfloat16).float().contiguous().numpy().astype("<f4").tobytes())
    print(f"{a.out}: bf16-emulated step-0 gradients of {a.ref} (loss {loss.item():.6f})")


if __name__ == "__main__":
    main()
