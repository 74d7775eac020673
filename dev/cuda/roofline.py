#!/usr/bin/env python3
"""A roofline model of one training step of train_gpt's CUDA build on one GPU (dense GPT-2, bf16, no tp/pp).

Every kernel the step launches (train_gpt.cu: gpt2_forward, layer_forward, gpt2_head, layer_backward, the
optimizer), with its FLOPs and the bytes it must move to and from HBM, so its time at the roofline is
max(flops / peak, bytes / bandwidth) and its bound is whichever wins. Next to it the time at the efficiency
the kernel's harness measured on a GPU (dev/cuda/*.cu "time" lines: achieved TFLOP/s or GB/s over the
peak; measured at the harness's shapes, e.g. attention at B4, the GEMMs at N 4096, so a ranking more than
a forecast); without a measurement for a kind of kernel, the roofline time is used. The sums give two predicted
MFUs: at the roofline (what perfect kernels would reach) and at the measured efficiencies (what these
kernels reach once launches and host synchronisation are gone); the measured step time says how much the
rest costs.

  python3 dev/cuda/roofline.py                       # GPT-2 124M, B16 T1024, H200, cuBLAS attention
  python3 dev/cuda/roofline.py --attention flash     # the flash kernels instead
  python3 dev/cuda/roofline.py --model 350m -b 8     # L24 C1024 NH16
  python3 dev/cuda/roofline.py --measured build/gpu_check/harness_bf16_*.log --step-ms 74.5
  python3 dev/cuda/roofline.py --attention flash --attention-tflops 350    # what if attention ran at 350 TFLOP/s

Model FLOPs (for MFU, as scripts/gpu_check.sh): 6 N + 6 L C T per token (weights, and causal attention).
Bytes are bf16 activations and weights (X = 2), fp32 statistics, AdamW state and master weights.
"""
import argparse
import glob
import re

MODELS = {"124m": (12, 768, 12), "350m": (24, 1024, 16), "774m": (36, 1280, 20), "1558m": (48, 1600, 25)}
GPUS = {"h200": (790e12, 4.8e12), "h100": (790e12, 3.35e12)}   # dense bf16 FLOP/s (measured on an H200), HBM bytes/s
X = 2   # bytes per bf16 element

# Efficiencies the kernel harnesses measured on an H200 (2026-11-30, scripts/gpu_check.sh, bf16): the
# harness line, and what it reports (TFLOP/s or GB/s). Kinds map rows of the step to these.
H200_MEASURED = {
    "gemm":              ("matmul_forward/backward (qkv, fc, fcproj, N 4096)", 530.0, "TFLOP/s"),   # mean of 586-716 fwd, 369-544 bwd
    "gemm_gelu_fwd":     ("fc fwd fused", 455.8, "TFLOP/s"),
    "gemm_dgelu_bwd":    ("fcproj bwd fused", 507.5, "TFLOP/s"),
    "gemm_head":         ("lm head chunk", 470.0, "TFLOP/s"),                                         # fwd 573, bwd 372
    "attn_cublas_fwd":   ("cublas forward (B4 T1024 hs64)", 32.6, "TFLOP/s causal"),
    "attn_cublas_bwd":   ("cublas backward", 36.9, "TFLOP/s causal"),
    "attn_flash_fwd":    ("flash forward (B4 T1024 hs64; the WMMA version)", 27.8, "TFLOP/s causal"),
    "attn_flash_bwd":    ("flash backward (the WMMA version)", 24.4, "TFLOP/s causal"),
    "layernorm_fwd":     ("layernorm_forward", 2131.0, "GB/s"),
    "layernorm_bwd":     ("layernorm_backward", 566.1, "GB/s"),
    "residual_ln_fwd":   ("residual_layernorm fused", 3429.7, "GB/s"),
    "residual_bias_fwd": ("residual_bias_forward", 2152.2, "GB/s"),
    "bias_bwd":          ("bias_backward (C 768)", 893.0, "GB/s"),
    "embedding_fwd":     ("embedding_forward", 1275.4, "GB/s"),
    "embedding_bwd":     ("embedding_backward", 45.8, "GB/s"),
    "position_fwd":      ("position_forward", 1548.2, "GB/s"),
    "position_bwd":      ("position_backward", 1479.1, "GB/s"),
    "ce_fused":          ("ce_loss_dlogits (the two-pass version's read + write pass; a stand-in until ce_fused is timed)", 3551.9, "GB/s"),
    "global_norm":       ("sum_of_squares 124M", 1303.4, "GB/s"),
    "adamw":             ("adamw_update (master)", 3270.2, "GB/s"),
}
# harness line name -> kind, for --measured logs
HARNESS_KIND = {"fc fwd fused": "gemm_gelu_fwd", "fcproj bwd fused": "gemm_dgelu_bwd", "cublas forward": "attn_cublas_fwd",
                "cublas backward": "attn_cublas_bwd", "flash forward": "attn_flash_fwd", "flash backward": "attn_flash_bwd",
                "cudnn forward": "attn_cudnn_fwd", "cudnn backward": "attn_cudnn_bwd",
                "layernorm_forward": "layernorm_fwd", "layernorm_backward": "layernorm_bwd", "residual_layernorm fused": "residual_ln_fwd",
                "residual_bias_forward": "residual_bias_fwd", "bias_backward": "bias_bwd", "embedding_forward": "embedding_fwd",
                "embedding_backward": "embedding_bwd", "position_forward": "position_fwd", "position_backward": "position_bwd",
                "ce_fused": "ce_fused", "sum_of_squares 124M": "global_norm",
                "adamw_update (master)": "adamw"}


def read_measured(patterns):
    """'time NAME ms [GB/s] [TFLOP/s]' lines of harness logs -> {kind: (name, rate, unit)} (first line of each name)"""
    found = {}
    for pattern in patterns:
        for path in glob.glob(pattern):
            for line in open(path):
                m = re.match(r"\s*(?:bf16\s+)?time (.+?)\s+([0-9.]+) ms(?:\s+([0-9.]+) GB/s)?(?:\s+([0-9.]+) TFLOP/s)?", line)
                if not m or m.group(1) not in HARNESS_KIND or HARNESS_KIND[m.group(1)] in found:
                    continue
                kind = HARNESS_KIND[m.group(1)]
                if m.group(4):
                    found[kind] = (m.group(1), float(m.group(4)), "TFLOP/s causal" if kind.startswith("attn") else "TFLOP/s")
                elif m.group(3):
                    found[kind] = (m.group(1), float(m.group(3)), "GB/s")
    return found


def step_kernels(L, C, NH, V, B, T, ce_chunk, attention):
    """-> [(name, launches per step, flops, bytes, kind)] for one step of one micro-batch of B x T tokens"""
    BT, hs, Vp = B * T, C // NH, (V + 127) // 128 * 128
    P = Vp * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C   # parameters (wte, wpe at maxT 1024, layers, lnf)
    S = B * NH * T * T                                           # score elements of one layer (the full square)
    attn_causal = 4 * B * NH * hs * T * (T + 1) / 2              # QK^T and PV over the causal half
    rows = []

    def gemm(name, n, ic, oc, count=1, kind="gemm", extra_bytes=0, backward=False):   # extra_bytes: per launch
        f = 2 * n * ic * oc * (2 if backward else 1)
        b = X * (n * ic + ic * oc + n * oc) * (2 if backward else 1) + extra_bytes
        rows.append((name, count, count * f, count * b, kind))

    def mem(name, count, nbytes, kind):
        rows.append((name, count, 0, count * nbytes, kind))

    # forward
    mem("embedding_forward (wte rows)", 1, 2 * BT * C * X + BT * 4, "embedding_fwd")
    mem("position_forward", 1, 2 * BT * C * X + T * C * X, "position_fwd")
    mem("layernorm_forward (ln1)", L, 2 * BT * C * X + 2 * BT * 4, "layernorm_fwd")
    gemm("matmul qkv (+bias)", BT, C, 3 * C, L)
    if attention in ("flash", "cudnn"):
        # HBM: q, k, v read once (a head's K, V tiles, re-read by every query tile, stay in L2), out and lse written
        rows.append((f"{attention} attention forward", L, L * attn_causal, L * (4 * BT * C * X + B * NH * T * 4), f"attn_{attention}_fwd"))
    else:
        rows.append(("attention S = QK^T (cuBLAS, full T x T)", L, L * 2 * S * hs, L * (S * 4 + 2 * BT * C * X), "attn_cublas_fwd"))
        rows.append(("attention softmax -> P, lse", L, 0, L * (S * 4 + S * X), "attn_cublas_fwd"))
        rows.append(("attention Y = P V (cuBLAS)", L, L * 2 * S * hs, L * (S * X + 2 * BT * C * X), "attn_cublas_fwd"))
    gemm("matmul attproj", BT, C, C, L)
    mem("residual + bias + layernorm (ln2), fused", L, 4 * BT * C * X + 2 * BT * 4, "residual_ln_fwd")
    gemm("matmul fc + GELU, fused (two outputs)", BT, C, 4 * C, L, "gemm_gelu_fwd", extra_bytes=BT * 4 * C * X)
    gemm("matmul fcproj", BT, 4 * C, C, L)
    mem("residual + bias", L, 3 * BT * C * X, "residual_bias_fwd")
    mem("layernorm_forward (lnf)", 1, 2 * BT * C * X + 2 * BT * 4, "layernorm_fwd")
    # the head: chunk by chunk, logits (n, Vp) written by the GEMM, then one kernel per chunk (tp 1): each row
    # read once for its max and sum, again from L2 for dlogits, which are written over it
    chunks = (BT + ce_chunk - 1) // ce_chunk
    n = min(ce_chunk, BT)
    gemm("LM head logits (per CE chunk)", n, C, Vp, chunks, "gemm_head")
    mem("ce_fused (stats, loss, dlogits in one pass)", chunks, 2 * n * Vp * X, "ce_fused")
    gemm("LM head backward: dh, dwte (per chunk)", n, Vp, C, chunks, "gemm_head", backward=True)
    # backward
    mem("layernorm_backward (lnf)", 1, 4 * BT * C * X + 2 * BT * 4, "layernorm_bwd")
    mem("bias_backward (fcproj)", L, BT * C * X, "bias_bwd")
    gemm("matmul fcproj backward + dGELU, fused", BT, 4 * C, C, L, "gemm_dgelu_bwd", backward=True, extra_bytes=BT * 4 * C * X)
    gemm("matmul fc backward (+bias)", BT, C, 4 * C, L, backward=True, extra_bytes=BT * 4 * C * X)
    mem("layernorm_backward (ln2, + residual grad)", L, 4 * BT * C * X + 2 * BT * 4, "layernorm_bwd")
    mem("bias_backward (attproj)", L, BT * C * X, "bias_bwd")
    gemm("matmul attproj backward", BT, C, C, L, backward=True)
    if attention == "flash":
        # D = dY.Y once per query row (its own kernel: dY, Y read, D (B, NH, T) fp32 written); then two kernels
        # (dK dV over query tiles; dQ over key tiles), each reading q, k, v, dY, D and lse; dqkv written
        # the dK/dV kernel recomputes S = QK^T and dP = dY V^T and forms dV, dK (4 products); the dQ kernel
        # recomputes S and dP and forms dQ (3): 7 products of the forward's 2 (QK^T, PV) = 7/2 of its FLOPs
        mem("flash D = dY.Y per row", L, 2 * BT * C * X + B * NH * T * 4, "layernorm_bwd")
        rows.append(("flash attention backward (dK dV; dQ)", 2 * L, L * 7 / 2 * attn_causal, L * (2 * (4 * BT * C * X + 2 * B * NH * T * 4) + 3 * BT * C * X), "attn_flash_bwd"))
    elif attention == "cudnn":
        # cuDNN's fused backward (FlashAttention-2's order, as its documentation describes it): S and dP recomputed
        # once, dV, dK, dQ formed: 5 products = 5/2 of the forward's FLOPs; q, k, v, out, dY, lse read, dQ summed in
        # an fp32 workspace (written and read), dqkv written. Its efficiency is not measured yet: the roofline time.
        rows.append(("cudnn attention backward", L, L * 5 / 2 * attn_causal, L * (5 * BT * C * X + B * NH * T * 4 + 2 * BT * C * 4 + 3 * BT * C * X), "attn_cudnn_bwd"))
    else:
        rows.append(("attention S, dP = QK^T, dY V^T (cuBLAS)", 2 * L, L * 4 * S * hs, L * (2 * S * 4 + 4 * BT * C * X), "attn_cublas_bwd"))
        rows.append(("attention softmax backward -> P, dS", L, 0, L * (2 * S * 4 + 2 * S * X), "attn_cublas_bwd"))
        rows.append(("attention dV, dQ, dK (cuBLAS)", 3 * L, L * 6 * S * hs, L * (3 * S * X + 6 * BT * C * X), "attn_cublas_bwd"))
    gemm("matmul qkv backward (+bias)", BT, C, 3 * C, L, backward=True, extra_bytes=BT * 3 * C * X)
    mem("layernorm_backward (ln1, + residual grad)", L, 4 * BT * C * X + 2 * BT * 4, "layernorm_bwd")
    mem("position_backward", 1, BT * C * X + T * C * 4, "position_bwd")
    mem("embedding_backward (dwte rows, deterministic)", 1, BT * C * X + BT * 4, "embedding_bwd")
    # the update
    mem("gradient norm (sum of squares)", 1, P * X, "global_norm")
    mem("AdamW (bf16 params, fp32 master, m, v)", 1, P * (2 * X + 24), "adamw")
    return rows, P


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="124m", choices=sorted(MODELS))
    ap.add_argument("-b", type=int, default=16)
    ap.add_argument("-t", type=int, default=1024)
    ap.add_argument("--ce-chunk", type=int, default=2048)
    ap.add_argument("--attention", default="cublas", choices=["cublas", "flash", "cudnn"])
    ap.add_argument("--gpu", default="h200", choices=sorted(GPUS))
    ap.add_argument("--measured", nargs="*", default=[], help="harness logs with 'time' lines (default: the H200 figures above)")
    ap.add_argument("--step-ms", type=float, default=0.0, help="a measured step time to compare with")
    ap.add_argument("--attention-tflops", type=float, default=0.0, help="what if: attention forward and backward at this causal TFLOP/s")
    a = ap.parse_args()
    L, C, NH = MODELS[a.model]
    peak, bw = GPUS[a.gpu]
    measured = dict(H200_MEASURED)
    measured.update(read_measured(a.measured))
    if a.attention_tflops > 0:
        for kind in ("attn_cublas_fwd", "attn_cublas_bwd", "attn_flash_fwd", "attn_flash_bwd", "attn_cudnn_fwd", "attn_cudnn_bwd"):
            measured[kind] = ("what if", a.attention_tflops, "TFLOP/s causal")
    rows, P = step_kernels(L, C, NH, 50257, a.b, a.t, a.ce_chunk, a.attention)
    tokens = a.b * a.t
    model_flops = (6 * P + 6 * L * C * a.t) * tokens
    print(f"GPT-2 {a.model} (L{L} C{C} NH{NH}, {P / 1e6:.1f}M parameters), B{a.b} T{a.t}, bf16, {a.attention} attention, CE chunk {a.ce_chunk}; "
          f"{a.gpu.upper()}: {peak / 1e12:.0f} TFLOP/s bf16 dense, {bw / 1e12:.1f} TB/s")
    print(f"{'kernel':48s} {'launches':>8s} {'GFLOP':>9s} {'MB':>9s} {'roofline ms':>11s} {'bound':>7s} {'measured eff':>12s} {'ms at eff':>9s}")
    roof_of = lambda r: max(r[2] / peak, r[3] / bw)
    kind_roof = {}
    for r in rows:
        kind_roof[r[4]] = kind_roof.get(r[4], 0.0) + roof_of(r)
    attn_causal = 4 * a.b * NH * (C // NH) * a.t * (a.t + 1) / 2 * L   # the harness's attention FLOPs (forward; backward 2.5x)
    total_roof = total_eff = 0.0
    launches = 0
    for name, count, flops, nbytes, kind in rows:
        t_flop, t_mem = flops / peak, nbytes / bw
        roof = max(t_flop, t_mem)
        bound = "compute" if t_flop >= t_mem else "memory"
        eff_txt, at_eff = "-", roof
        if kind in measured:
            _, rate, unit = measured[kind]
            if kind.startswith("attn"):   # a rate over the causal FLOPs of the whole forward (backward): shared by its rows
                kind_time = attn_causal * (1.0 if kind.endswith("fwd") else 2.5) / (rate * 1e12)
                at_eff, eff_txt = kind_time * roof / kind_roof[kind], f"{rate:.0f} TF/s"
            elif unit == "TFLOP/s":
                at_eff, eff_txt = t_flop / (rate * 1e12 / peak), f"{100 * rate * 1e12 / peak:.0f}%"
            else:
                at_eff, eff_txt = t_mem / (rate * 1e9 / bw), f"{100 * rate * 1e9 / bw:.0f}%"
        total_roof += roof
        total_eff += at_eff
        launches += count
        print(f"{name:48s} {count:8d} {flops / 1e9:9.1f} {nbytes / 1e6:9.1f} {roof * 1e3:11.3f} {bound:>7s} {eff_txt:>12s} {at_eff * 1e3:9.3f}")
    mfu = lambda t: 100 * model_flops / t / peak
    print(f"{'sum':48s} {launches:8d} {sum(r[2] for r in rows) / 1e9:9.1f} {sum(r[3] for r in rows) / 1e6:9.1f} {total_roof * 1e3:11.3f} "
          f"{'':7s} {'':12s} {total_eff * 1e3:9.3f}")
    print(f"model FLOPs per step {model_flops / 1e12:.2f} T (6N + 6LCT per token); predicted MFU vs {peak / 1e12:.0f} TFLOP/s: "
          f"{mfu(total_roof):.1f}% at the roofline, {mfu(total_eff):.1f}% at the measured kernel efficiencies "
          f"({model_flops / total_eff / 989e12 * 100:.1f}% vs 989)")
    if a.step_ms > 0:
        t = a.step_ms * 1e-3
        print(f"measured step {a.step_ms:.1f} ms: MFU {mfu(t):.1f}% vs {peak / 1e12:.0f} ({model_flops / t / 989e12 * 100:.1f}% vs 989); "
              f"{a.step_ms - total_eff * 1e3:.1f} ms outside the kernels' measured times (launches, host synchronisation, gaps)")


if __name__ == "__main__":
    main()
