#!/usr/bin/env bash
# The memory and speed levers side by side (not a test; 2 cores, one thread per rank, noisy):
#   1. --recompute none|mlp|full: step time and activation memory (L4 C128 V256, B8 T128, one rank)
#   2. --async-checkpoint: wall time of 8 steps with a checkpoint after every step (d4, B4 T64), against
#      synchronous checkpoints and none
#   3. --overlap 0|1: step time of dp 2 at ZeRO 0 and 3, and of pp 2 (L4 C256, B4 T128)
set -u
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN="mpirun --oversubscribe --bind-to none"
W=$(mktemp -d)
avg() { awk '/average step/ { print $3 }'; }

echo "1. activation recompute (one rank)"
printf "%-6s %10s %16s\n" mode "step ms" "activations MiB"
for r in none mlp full; do
    out=$(./train_gpt -e "L=4,C=128,NH=4,V=256,maxT=128" -b 8 -t 128 -x 8 -v 0 -s 0 --recompute $r --memory-report 2>&1)
    act=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == "activations" { printf "%.2f", $5 / 1048576 }' <<<"$out")
    printf "%-6s %10s %16s\n" $r "$(avg <<<"$out")" "$act"
done

echo "2. checkpoints after every step, 8 steps (wall seconds)"
for mode in none sync async; do
    rm -rf "$W/ck"
    flags=""
    [ $mode != none ] && flags="-n 1 -o $W/ck"
    [ $mode = async ] && flags="$flags --async-checkpoint"
    t0=$(date +%s.%N)
    ./train_gpt -e d4 -b 4 -t 64 -x 8 -v 0 -s 0 $flags >/dev/null 2>&1
    t1=$(date +%s.%N)
    printf "%-6s %8.2f s\n" $mode "$(echo "$t1 - $t0" | bc)"
done

echo "3. communication overlap (step ms, average of the timed steps)"
printf "%-14s %10s %10s\n" layout "overlap 0" "overlap 1"
for layout in "--zero 0" "--zero 3" "--pp 2 -d 2048"; do
    row=""
    for o in 0 1; do
        out=$($MPIRUN -np 2 ./train_gpt -e "L=4,C=256,NH=4,V=512,maxT=128" -b 4 -t 128 -x 12 -v 0 -s 0 $layout --overlap $o 2>&1)
        row="$row $(printf "%10s" "$(avg <<<"$out")")"
    done
    printf "%-14s%s\n" "${layout%% -d*}" "$row"
done
rm -rf "$W"
