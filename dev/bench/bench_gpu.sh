#!/usr/bin/env bash
# The GPU benchmark (not a test): train_gpt's CUDA build beside PyTorch on the same GPU, GPT-2 124M (L12 C768
# NH12, V 50257 padded to 50304) at B16 T1024, both in bf16, both reading the same random tokens (one llm.c shard
# written here), both timed as the mean step after a warm-up, both rated with one FLOP formula (train_gpt's MFU:
# 6 N + 6 L C T per token, N the parameters with the padded vocabulary) against 790 TFLOP/s (an H200's dense bf16
# as measured reachable) and 989 (its data sheet).
#   PyTorch: bf16 autocast, F.scaled_dot_product_attention, torch.compile, fused AdamW (dev/bench/torch_gpt2.py)
#   ours:    --attention cublas, then flash, then cudnn (when build/cuda-cudnn exists); --ce-chunk 2048
# usage: bash dev/bench/bench_gpu.sh [BIN_DIR (build/cuda)] [STEPS (30)]    (from the repo root, after the CUDA build)
# env: DEVICE=cpu L= C= NH= B= T= runs the plumbing on the CPU build with a small model (no timing worth reading);
#      PY (python3: the GPU machine's PyTorch with CUDA)
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-build/cuda}
STEPS=${2:-30}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
L=${L:-12} C=${C:-768} NH=${NH:-12} B=${B:-16} T=${T:-1024}
V=50257 VP=50304 MAXT=1024
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# the tokens: one shard of random ids, enough for either side's steps and warm-up
NTOK=$(( (STEPS + 5) * B * (T + 1) + 1 ))
$PY - "$W/tokens_000000.bin" $NTOK $V <<'EOF' || { echo "could not write the token shard"; exit 1; }
import sys, numpy as np
path, n, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
header = np.zeros(256, dtype="<i4"); header[:3] = (20240520, 1, n)
tokens = np.random.default_rng(0).integers(0, V, n, dtype=np.uint16)
with open(path, "wb") as f:
    f.write(header.tobytes()); f.write(tokens.astype("<u2").tobytes())
EOF

# FLOPs per token, train_gpt's formula: N = wte (Vp C) + wpe (maxT C) + L (12 C^2 + 13 C) + 2 C
FLOPS_TOK=$(awk -v L=$L -v C=$C -v Vp=$VP -v mT=$MAXT -v T=$T 'BEGIN {
    N = Vp * C + mT * C + L * (12 * C * C + 13 * C) + 2 * C; printf "%.0f", 6 * N + 6 * L * C * T }')
row() {   # NAME MS
    awk -v n="$1" -v ms="$2" -v f=$FLOPS_TOK -v bt=$((B * T)) 'BEGIN {
        if (ms == "" || ms <= 0) { printf "%-34s %10s\n", n, "(no result)"; exit }
        tps = bt / (ms / 1000); printf "%-34s %10.1f %12.0f %9.1f%% %9.1f%%\n", n, ms, tps, 100 * tps * f / 790e12, 100 * tps * f / 989e12 }'
}

echo "GPU benchmark: GPT-2 L$L C$C NH$NH, V $V (padded $VP), B$B T$T, $STEPS steps, device $DEVICE"
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
printf "%-34s %10s %12s %10s %10s\n" "" "ms/step" "tok/s" "MFU(790)" "MFU(989)"

ours() {   # NAME ARGS...: one run; its mean step ("average step: X ms": the steps after the first)
    local name=$1; shift
    local log="$W/$name.log"
    "$BIN/train_gpt" -e "L=$L,C=$C,NH=$NH,V=$V,maxT=$MAXT" -i "$W/tokens_*.bin" -b $B -t $T -x $STEPS -v 0 -s 0 \
        --ce-chunk 2048 "$@" >"$log" 2>&1 || { echo "($name failed: $(tail -n 1 "$log"))"; }
    row "$name" "$(sed -n 's/^average step: \([0-9.]*\) ms.*/\1/p' "$log")"
}
if [ "$DEVICE" = cuda ]; then
    ours "train_gpt --attention cublas" --attention cublas
    ours "train_gpt --attention flash" --attention flash
    if [ -x build/cuda-cudnn/train_gpt ]; then   # (make USE_CUDNN=1 BUILD_DIR=build/cuda-cudnn)
        B0=$BIN; BIN=build/cuda-cudnn; ours "train_gpt --attention cudnn" --attention cudnn; BIN=$B0
    fi
    TORCH_FLAGS="--device cuda --bf16 --sdpa --compile"
else
    ours "train_gpt (CPU build)"
    TORCH_FLAGS="--device cpu"
fi
TLOG="$W/torch.log"
$PY dev/bench/torch_gpt2.py $TORCH_FLAGS --L $L --C $C --NH $NH --V $V --Vp $VP --maxT $MAXT --B $B --T $T \
    --steps $STEPS --warmup 5 --data "$W/tokens_000000.bin" >"$TLOG" 2>&1 || echo "(PyTorch failed: $(tail -n 1 "$TLOG"))"
row "PyTorch ($TORCH_FLAGS)" "$(sed -n 's/.* ms\/step \([0-9.]*\) .*/\1/p' "$TLOG" | tail -n 1)"
head -n 1 "$TLOG" | grep -q '^torch ' && echo "($(cut -d' ' -f1-2 "$TLOG" | head -n 1))"
