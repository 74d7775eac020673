#!/usr/bin/env bash
# Overlap and exposed communication on the CPU build (timings, not tests: measured side by side in one run):
#   1. dp 2 at ZeRO 3 and at ZeRO 1 (L4 C128 NH4 V257, B4 T128, one thread per rank): --overlap 1 (ZeRO-3 prefetch,
#      the dp reductions started as each unit's backward ends) against --overlap 0, the median step and the
#      exposed dp time per step (--comm-report: the time inside the dp group's MPI calls and waits), twice each
#   2. --trace's cost: the same run traced and untraced (the median of the steps after the first)
# Usage: bash dev/bench/bench_overlap.sh [STEPS (default 12)]
set -eu
cd "$(dirname "$0")/../.."
STEPS=${1:-12}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN="mpirun --oversubscribe --bind-to none"
RUN=(-e "L=4,C=128,NH=4,V=257,maxT=128" -b 4 -t 128 -x "$STEPS" -v 0 -s 0 --comm-report)
# the median of rank 0's step times after the first step
median() { awk '/^step +[0-9]+\// { for (i = 1; i <= NF; i++) if ($i == "ms") print $(i - 1) }' "$1" | tail -n +2 | sort -n |
           awk '{ t[n++] = $1 } END { printf "%.1f", n % 2 ? t[(n - 1) / 2] : (t[n / 2 - 1] + t[n / 2]) / 2 }'; }
exposed() { awk -v g="$2" '$1 == "exposed" && $3 == g { s += $4; n++ } END { printf "%.2f", s / n }' "$1"; }

echo "== 1. dp 2, one thread per rank, $STEPS steps: median step (rank 0) and exposed dp time per step (mean of the 2 ranks)"
printf "%-8s %-9s %-14s %-14s\n" zero overlap "step ms" "exposed dp ms"
for zero in 3 1; do
    for round in 1 2; do
        for ov in 1 0; do
            $MPIRUN -np 2 ./train_gpt "${RUN[@]}" --zero $zero --overlap $ov >"$W/z$zero.o$ov.$round.log" 2>&1
            printf "%-8s %-9s %-14s %-14s\n" $zero $ov "$(median "$W/z$zero.o$ov.$round.log")" "$(exposed "$W/z$zero.o$ov.$round.log" dp)"
        done
    done
done

echo "== 2. --trace's cost, dp 2 zero 1, $STEPS steps, twice: median step untraced vs traced (rank 0)"
for round in 1 2; do
    $MPIRUN -np 2 ./train_gpt "${RUN[@]}" --zero 1 >"$W/plain.$round.log" 2>&1
    $MPIRUN -np 2 ./train_gpt "${RUN[@]}" --zero 1 --trace "$W/tr$round" >"$W/traced.$round.log" 2>&1
    a=$(median "$W/plain.$round.log"); b=$(median "$W/traced.$round.log")
    echo "round $round: untraced $a ms, traced $b ms ($(awk -v a="$a" -v b="$b" 'BEGIN { printf "%+.1f%%", 100 * (b - a) / a }'))"
done
