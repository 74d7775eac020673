#!/usr/bin/env bash
# Mixture-of-Experts benchmarks on the CPU build (timings, not tests: ratios measured side by side in one run).
#   1. tokens/s of a MoE model (L4 C128 NH4 V257, E8 top-2) against the dense model of the same shape, one
#      rank, B8 T128: the ratio, and the ratio normalised by the FLOPs per token (top-2 runs two MLPs per token)
#   2. the share of the step time spent in the expert all-to-alls at ep 2 and ep 4 (one thread per rank)
#   3. the capacity factor on tinyshakespeare (bytes, V 257): the fraction of assignments dropped and the
#      validation loss after the same number of steps for F = 1.0, 1.05, 1.25, 1.5 and dropless, and the
#      dense model of the same shape
# Usage: bash dev/bench/bench_moe.sh [STEPS (default 300)] [THREADS (default 2)]
set -eu
cd "$(dirname "$0")/../.."
STEPS=${1:-300}
THREADS=${2:-2}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
SHAPE="L=4,C=128,NH=4,V=257,maxT=128"
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
avg() { awk '/^average step/ { print $(NF-1) }' "$1"; }

echo "== 1. throughput, one rank, $THREADS threads, B8 T128, 20 steps (the first is not timed)"
for model in dense moe; do
    e=$SHAPE; [ $model = moe ] && e="$SHAPE,E=8,k=2"
    OMP_NUM_THREADS=$THREADS ./train_gpt -e "$e" -b 8 -t 128 -x 20 -v 0 -s 0 >"$W/$model.log" 2>&1
done
d=$(avg "$W/dense.log"); m=$(avg "$W/moe.log")
# FLOPs per token: 6 x the weights a token meets (attention 4C^2, MLP 8C^2 per expert it visits, the router
# E C, the tied head V C) + the attention scores 6 L T C
python3 - "$d" "$m" <<'EOF'
import sys
dense, moe = float(sys.argv[1]), float(sys.argv[2])
L, C, V, T, E, k = 4, 128, 257, 128, 8, 2
f_dense = 6 * (L * 12 * C * C + V * C) + 6 * L * T * C
f_moe = 6 * (L * (4 * C * C + k * 8 * C * C + E * C) + V * C) + 6 * L * T * C
print(f"dense {dense:.0f} tok/s, MoE {moe:.0f} tok/s: ratio {moe / dense:.2f}; FLOPs per token {f_dense:.3g} vs {f_moe:.3g} "
      f"({f_moe / f_dense:.2f}x): normalised ratio {moe / dense * f_moe / f_dense:.2f}")
EOF

echo "== 2. the all-to-all's share of the step, one thread per rank, B8 T128 per rank, 10 steps"
for ep in 2 4; do
    OMP_NUM_THREADS=1 $MPIRUN -np $ep ./train_gpt -e "$SHAPE,E=8,k=2" -b 8 -t 128 -x 10 -v 0 -s 0 --ep $ep --comm-report >"$W/ep$ep.log" 2>&1
    echo "ep $ep: $(grep '^MoE all-to-all' "$W/ep$ep.log") ($(avg "$W/ep$ep.log") tok/s over $ep ranks)"
done

echo "== 3. capacity factor, tinyshakespeare bytes, $STEPS steps of B8 T128, validation over 16 batches"
if [ ! -f ../shared/data/tinyshakespeare.txt ]; then echo "(../shared/data/tinyshakespeare.txt not found: skipped)"; exit 0; fi
$PY dev/data/tinyshakespeare.py --input ../shared/data/tinyshakespeare.txt --out "$W/ts" --tokenizer byte >/dev/null
TS=(-i "$W/ts/tiny_shakespeare_train.bin" -j "$W/ts/tiny_shakespeare_val.bin" -b 8 -t 128 -x "$STEPS" -l 1e-3 -u 20 -q 0.1 -c 0.1
    -v "$STEPS" -m 16 -s 0)
printf "%-10s %-16s %-12s %s\n" "model" "dropped (mean)" "val loss" "tok/s"
for F in dense 1.0 1.05 1.25 1.5 0; do
    if [ $F = dense ]; then args=(-e "$SHAPE"); else args=(-e "$SHAPE,E=8,k=2" --capacity-factor $F); fi
    OMP_NUM_THREADS=$THREADS ./train_gpt "${TS[@]}" "${args[@]}" -o "$W/F$F" >"$W/F$F.log" 2>&1
    drop=$(awk -F'drop:' '/drop:/ { s += $2; n++ } END { if (n) printf "%.4f", s / n; else print "-" }' "$W/F$F/main.log")
    val=$(awk -F'tel:' '/tel:/ { x = $2 } END { print x }' "$W/F$F/main.log")
    name=$F; [ $F = 0 ] && name=dropless; [ $F != dense ] && name="F $name"
    printf "%-10s %-16s %-12s %s\n" "$name" "$drop" "$val" "$(avg "$W/F$F.log")"
done
