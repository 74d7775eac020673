#!/usr/bin/env bash
# CPU benchmarks (not tests: timings on a 2-core machine are noisy, so what matters are the ratios
# measured side by side in one run). Prints four tables:
#   1. tokens/s of train_gpt vs PyTorch (same model, same threads), and the ratio
#   2. peak logits memory at T=1024: --ce-chunk 0 (full logits) vs the chunked default
#   3. data parallel d4 at dp 2: tokens/s and bytes per step for each ZeRO stage
#   4. peak memory per rank for T = 1024, 4096, 16384 (V=50304) at tp 1/2/4, with and without chunked CE
# usage: bash dev/bench/bench_cpu.sh [threads]      (run from the repo root after make)
set -u
cd "$(dirname "$0")/../.."
TH=${1:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
PY=/usr/bin/python3
MODEL="L=4,C=128,NH=4,V=50257,maxT=1024"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

echo "== 1. throughput: L4 C128 NH4 V50257 (Vp 50304), B4 T64, $TH threads, 20 steps after warm-up"
ours=$(OMP_NUM_THREADS=$TH ./train_gpt -e "$MODEL" -b 4 -t 64 -x 23 -s 0 -v 0 | awk '/average step/ { print $(NF-1) }')
torch_line=$($PY dev/bench/torch_gpt2.py --threads "$TH" --steps 20)
torch=$(awk '{ print $4 }' <<<"$torch_line")
echo "train_gpt (CPU build): $ours tok/s"
echo "PyTorch:               $torch tok/s   [$torch_line]"
awk -v a="$ours" -v b="$torch" 'BEGIN { printf "ratio train_gpt / PyTorch: %.2fx\n", a / b }'

echo
echo "== 2. peak logits/loss memory, B4 T1024, one rank (from --memory-report)"
for chunk in 0 256; do
    peak=$(OMP_NUM_THREADS=$TH ./train_gpt -e "$MODEL" -b 4 -t 1024 -x 1 -s 0 -v 0 --ce-chunk $chunk --memory-report | awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == "logits" { print $5 }')
    echo "--ce-chunk $chunk: $(mib "$peak") MiB"
    [ $chunk = 0 ] && full=$peak || chunked=$peak
done
awk -v a="$chunked" -v b="$full" 'BEGIN { printf "chunked / full = %.4f (target < 0.1)\n", a / b }'

echo
echo "== 3. data parallel: d4 (V50257) at dp 2, B4 T64, 1 thread per rank, 6 steps"
printf "%-6s %10s %16s %16s %16s %16s\n" zero tok/s "dp bytes/step" "params B/rank" "grads B/rank" "optim B/rank"
for z in 0 1 2 3; do
    out=$(OMP_NUM_THREADS=1 $MPIRUN -np 2 ./train_gpt -e d4 -b 4 -t 64 -x 6 -s 0 -v 0 --zero $z --comm-report --memory-report)
    tok=$(awk '/average step/ { print $(NF-1) }' <<<"$out")
    dpb=$(awk '$1 == "comm" && $2 == 0 && $3 == "dp" { print $4 }' <<<"$out")
    get() { awk -v c="$1" '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == c { print $5 }' <<<"$out"; }
    printf "%-6s %10s %16s %16s %16s %16s\n" $z "$tok" "$dpb" "$(get parameters)" "$(get gradients)" "$(get optimizer)"
done
echo "(ring all-reduce of all gradients = 2(p-1)/p * 4P = 4P bytes at dp 2; zero 3 gathers each layer twice: ~1.5x)"

echo
echo "== 4. peak memory per rank (MiB), L4 C128 NH4 V50257 (Vp 50304), B1, set-up only (-x 0): every buffer is preallocated"
printf "%-6s %-3s %-4s %-9s %12s %12s %12s\n" T tp sp ce activations logits total
for T in 1024 4096 16384; do
    for tp in 1 2 4; do
        for chunk in 0 256; do
            sp=""; [ $tp -gt 1 ] && sp="--sp"
            out=$(OMP_NUM_THREADS=1 $MPIRUN -np $tp ./train_gpt -e "L=4,C=128,NH=4,V=50257,maxT=16384" -b 1 -t $T -x 0 -s 0 -v 0 \
                  --tp $tp $sp --ce-chunk $chunk --memory-report)
            act=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == "activations" { print $5 }' <<<"$out")
            lg=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == "logits" { print $5 }' <<<"$out")
            tot=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 != "total" { s += $5 } END { print s }' <<<"$out")
            printf "%-6s %-3s %-4s %-9s %12s %12s %12s\n" $T $tp "${sp:+yes}" "$([ $chunk = 0 ] && echo full || echo chunk256)" \
                   "$(mib "$act")" "$(mib "$lg")" "$(mib "$tot")"
        done
    done
done
