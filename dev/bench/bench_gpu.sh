#!/usr/bin/env bash
# The GPU benchmark (not a test): train_gpt's CUDA build beside PyTorch on the same GPU, GPT-2 124M (L12 C768
# NH12, V 50257 padded to 50304) at B16 T1024, both in bf16, both reading the same random tokens (one llm.c shard
# written here), both timed as the mean step after a warm-up, both rated with one FLOP formula (train_gpt's MFU:
# 6 N + 6 L C T per token, N the parameters with the padded vocabulary) against 790 TFLOP/s (an H200's dense bf16
# as measured reachable) and 989 (its data sheet). Then the same for a Llama of SmolLM2-135M's shape.
#   PyTorch: bf16 autocast, F.scaled_dot_product_attention, torch.compile, fused AdamW (dev/bench/torch_gpt2.py;
#            transformers' LlamaForCausalLM with SDPA attention: dev/bench/torch_llama.py)
#   ours:    --attention cublas, then flash, then cudnn (when build/cuda-cudnn exists); --ce-chunk 2048
# usage: bash dev/bench/bench_gpu.sh [BIN_DIR (build/cuda)] [STEPS (30)] [MODE]   (from the repo root, after the CUDA build)
#   MODE all (default): everything in turn
#   MODE start: write the tokens and start both PyTorch runs, which compile and warm up, then wait (their --go
#               files) until a later `all` in the same LOG_DIR times them on a quiet GPU: compilation overlaps
#               other work (gpu_session.sh starts them beside gpu_check.sh's test_gpt runs)
#   MODE wait: until the started PyTorch runs are warm (at most 150 s), so that other timings are not disturbed
# env: DEVICE=cpu L= C= NH= B= T= runs the plumbing on the CPU build with a small model (no timing worth reading);
#      PY (python3: the GPU machine's PyTorch with CUDA); LOG_DIR (keep the logs there; else a temporary folder)
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-build/cuda}
STEPS=${2:-30}
MODE=${3:-all}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
L=${L:-12} C=${C:-768} NH=${NH:-12} B=${B:-16} T=${T:-1024}
LL=30 LC=576 LNH=9 LKV=3 LF=1536   # the Llama: SmolLM2-135M's shape (tied), GPT-2's V, the same B, T and tokens
[ "$DEVICE" = cpu ] && LL=2 LC=64 LNH=4 LKV=2 LF=128
V=50257 VP=50304 MAXT=1024
W=${LOG_DIR:-}
if [ -n "$W" ]; then mkdir -p "$W"; [ "$MODE" = all ] && trap 'rm -f "$W"/tokens_*.bin' EXIT
else [ "$MODE" = all ] || { echo "MODE $MODE needs LOG_DIR"; exit 2; }; W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$DEVICE" = cuda ]; then
    TORCH_FLAGS="--device cuda --bf16 --sdpa --compile"
else
    TORCH_FLAGS="--device cpu"
fi

# torch_start NAME SCRIPT ARGS...: a PyTorch run in the background, its timed steps waiting for $W/NAME.go
torch_start() {
    local name=$1 script=$2; shift 2
    rm -f "$W/$name.go"
    $PY dev/bench/$script "$@" --steps $STEPS --warmup 5 --data "$W/tokens_000000.bin" --go "$W/$name.go" \
        >"$W/$name.log" 2>&1 &
    echo $! > "$W/$name.pid"
}
torch_started() { kill -0 "$(cat "$W/torch_gpt2.pid" 2>/dev/null)" 2>/dev/null; }   # (started and still there)
start_torch() {
    torch_start torch_gpt2 torch_gpt2.py $TORCH_FLAGS --L $L --C $C --NH $NH --V $V --Vp $VP --maxT $MAXT --B $B --T $T
    torch_start torch_llama torch_llama.py $TORCH_FLAGS --L $LL --C $LC --NH $LNH --KV $LKV --F $LF --V $V --maxT $MAXT \
        --tied 1 --B $B --T $T
}
# torch_wait_warm NAME: until the run printed "warm" or ended (at most 150 s)
torch_wait_warm() {
    local i
    for i in $(seq 1 1500); do
        grep -q '^warm' "$W/$1.log" 2>/dev/null && return 0
        kill -0 "$(cat "$W/$1.pid" 2>/dev/null)" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
# torch_time NAME: its timed steps now (the GPU quiet), then its ms per step
torch_time() {
    local pid i
    pid=$(cat "$W/$1.pid" 2>/dev/null)
    torch_wait_warm torch_gpt2; torch_wait_warm torch_llama   # neither still compiling or warming up
    touch "$W/$1.go"
    for i in $(seq 1 1200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill "$pid" 2>/dev/null
    sed -n 's/.* ms\/step \([0-9.]*\) .*/\1/p' "$W/$1.log" | tail -n 1
}

# the tokens: one shard of random ids, enough for either side's steps and warm-up
write_tokens() {
    NTOK=$(( (STEPS + 5) * B * (T + 1) + 1 ))
    $PY - "$W/tokens_000000.bin" $NTOK $V <<'EOF'
import sys, numpy as np
path, n, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
header = np.zeros(256, dtype="<i4"); header[:3] = (20240520, 1, n)
tokens = np.random.default_rng(0).integers(0, V, n, dtype=np.uint16)
with open(path, "wb") as f:
    f.write(header.tobytes()); f.write(tokens.astype("<u2").tobytes())
EOF
}

case "$MODE" in
    start) write_tokens || { echo "could not write the token shard"; exit 1; }; start_torch
           echo "bench_gpu: PyTorch runs started (pids $(cat "$W"/torch_*.pid | tr '\n' ' '))"; exit 0 ;;
    wait)  torch_wait_warm torch_gpt2; torch_wait_warm torch_llama
           echo "bench_gpu: PyTorch runs warm: $(grep -c '^warm' "$W"/torch_*.log | tr '\n' ' ')"; exit 0 ;;
    all)   ;;
    *)     echo "usage: bash dev/bench/bench_gpu.sh [BIN_DIR] [STEPS] [all|start|wait]"; exit 2 ;;
esac
if ! torch_started; then write_tokens || { echo "could not write the token shard"; exit 1; }; fi

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
else
    ours "train_gpt (CPU build)"
fi
torch_started || start_torch
row "PyTorch ($TORCH_FLAGS)" "$(torch_time torch_gpt2)"
grep -q '^torch ' "$W/torch_gpt2.log" && echo "($(grep '^torch ' "$W/torch_gpt2.log" | cut -d' ' -f1-2 | head -n 1))" ||
    echo "(PyTorch failed: $(tail -n 1 "$W/torch_gpt2.log"))"

# the Llama: both rated with N as train_gpt counts it (its "N parameters" line) and its attention term 6 L C T
echo
echo "Llama (SmolLM2-135M shape): L$LL C$LC NH$LNH KV$LKV F$LF tied, V $V, B$B T$T"
printf "%-34s %10s %12s %10s %10s\n" "" "ms/step" "tok/s" "MFU(790)" "MFU(989)"
"$BIN/train_gpt" -e "arch=llama,L=$LL,C=$LC,NH=$LNH,KV=$LKV,F=$LF,V=$V,maxT=$MAXT,tied=1" -i "$W/tokens_*.bin" -b $B -t $T \
    -x $STEPS -v 0 -s 0 --ce-chunk 2048 >"$W/llama.log" 2>&1 || echo "(train_gpt llama failed: $(tail -n 1 "$W/llama.log"))"
NL=$(awk '/parameters,/ { for (i = 1; i < NF; i++) if ($(i+1) == "parameters,") print $i }' "$W/llama.log" | head -n 1)
FLOPS_TOK=$(awk -v N=${NL:-0} -v L=$LL -v C=$LC -v T=$T 'BEGIN { printf "%.0f", 6 * N + 6 * L * C * T }')
row "train_gpt (Llama)" "$(sed -n 's/^average step: \([0-9.]*\) ms.*/\1/p' "$W/llama.log")"
row "PyTorch Llama ($TORCH_FLAGS)" "$(torch_time torch_llama)"
grep -q '^torch ' "$W/torch_llama.log" || echo "(PyTorch Llama failed: $(tail -n 1 "$W/torch_llama.log"))"
echo "(N = ${NL:-?} parameters as train_gpt counts them; $FLOPS_TOK FLOPs per token)"
