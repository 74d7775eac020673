#!/usr/bin/env bash
# Context parallelism's three kinds side by side (a benchmark, not a test): the ring (--cp-kind ring), Ulysses
# (--cp-kind ulysses) and the hybrid (--cp-kind hybrid --cp-ulysses 2) at T 1024-8192, cp 2 and 4 on CPU ranks
# (one rank per core at cp 2, two per core at cp 4: 2-core machines). Per layout: the bytes one rank sends over cp
# per layer and step (--comm-report's, which test_gpt --check-comm asserts equal to cost_model.h's formula, the
# formula beside it), the step time measured (over rounds of the median of steps 2..X: their median, and their
# minimum, the least disturbed on a machine others share) and the cost model's
# (--plan N --machine FILE, the rates --calibrate measured here once, 2 ranks at once), its exposed cp part too.
# The runs go in rounds, every layout once per round, so that a slow spell of a shared machine falls on all.
# Usage: bash dev/bench/bench_cp.sh [ROUNDS (5)] [T values ("1024 2048 4096 8192")]   (prints a markdown table)
set -u
cd "$(dirname "$0")/../.."
ROUNDS=${1:-5}
TS=${2:-1024 2048 4096 8192}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN="mpirun --oversubscribe --map-by core --bind-to core:overload-allowed"
L=2 C=128 NH=4
MODEL="L=$L,C=$C,NH=$NH,V=256,maxT=8192"
STEPS=4
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
$MPIRUN -np 2 ./train_gpt -e "$MODEL" -t 2048 -b 1 --calibrate "$W/machine" </dev/null | tail -n 1 >&2

LAYOUTS=()   # "T|cp|flags"
for T in $TS; do
    for k in ring ulysses; do LAYOUTS+=("$T|2|--cp 2 --cp-kind $k"); done
    for k in ring ulysses "hybrid --cp-ulysses 2"; do LAYOUTS+=("$T|4|--cp 4 --cp-kind $k"); done
done
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# the predictions (time, its exposed cp), then the runs in rounds
for i in "${!LAYOUTS[@]}"; do
    IFS='|' read -r T np flags <<<"${LAYOUTS[$i]}"
    ./train_gpt -e "$MODEL" -t $T -b 1 $flags -s 0 -v 0 --plan $np --machine "$W/machine" \
        | sed -n 's/^predicted step: \([0-9.]*\) ms.* cp \([0-9.]*\) ep.*/\1 \2/p' >"$W/pred.$i"
done
for r in $(seq "$ROUNDS"); do
    for i in "${!LAYOUTS[@]}"; do
        IFS='|' read -r T np flags <<<"${LAYOUTS[$i]}"
        out=$($MPIRUN -np $np ./train_gpt -e "$MODEL" -t $T -b 1 $flags -x $STEPS -s 0 -v 0 --comm-report </dev/null)
        awk '$1 == "step" && $2 + 0 >= 2 { for (i = 1; i <= NF; i++) if ($(i + 1) == "ms") print $i }' <<<"$out" | median >>"$W/ms.$i"
        awk -v L=$L '$1 == "comm" && $2 == 0 && $3 == "cp" { print $4 / L }' <<<"$out" >"$W/bytes.$i"
        echo "round $r: T ${LAYOUTS[$i]}: $(tail -n 1 "$W/ms.$i") ms" >&2
    done
done

# the formula (cost_model.h's cp_attention_comm; GPT-2: Ckv = C): per layer, BT = T/cp local tokens, 4-byte floats
#   ring over N' = cp/U positions: (3N' - 2) hops of BT 2C;  all-to-all over U: (U-1)/U BT (fwd 3C + C, bwd C + C + 3C)
echo "| T | cp | kind | bytes/rank/layer (measured) | formula | step ms: median (min) | predicted ms | predicted exposed cp ms |"
echo "|---|---|---|---|---|---|---|---|"
for i in "${!LAYOUTS[@]}"; do
    IFS='|' read -r T np flags <<<"${LAYOUTS[$i]}"
    kind=$(sed 's/.*--cp-kind \([a-z]*\).*/\1/' <<<"$flags"); U=1
    [ $kind = ulysses ] && U=$np; [ $kind = hybrid ] && U=2 && kind="hybrid u 2"
    formula=$(awk -v T=$T -v N=$np -v U=$U -v C=$C 'BEGIN { BT = T / N; R = N / U; b = 0
        if (R > 1) b += (3 * R - 2) * BT * 2 * C; if (U > 1) b += (U - 1) / U * BT * 9 * C; printf "%.0f", 4 * b }')
    ms=$(median <"$W/ms.$i"); lo=$(sort -g "$W/ms.$i" | head -n 1); read -r pred pcp <"$W/pred.$i"
    printf "| %s | %s | %s | %s | %s | %.0f (%.0f) | %.1f | %.2f |\n" $T $np "$kind" "$(cat "$W/bytes.$i")" $formula "$ms" \
        "$lo" "$pred" "$pcp"
done
echo
echo "machine file (--calibrate, 2 ranks):"
grep -vE '^#' "$W/machine" | tr '\n' ' '
echo
