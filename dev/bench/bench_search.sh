#!/usr/bin/env bash
# The layout search's cost model against real runs (a benchmark, not a test): this machine's rates measured
# once (--calibrate, 2 ranks at once, one thread each, as the runs), then for one model and global batch a
# set of layouts at np 2 (one rank per core) and at np 4 (two ranks per core: the model's `cores` term) --
# each run's predicted step time (--plan N --machine FILE) beside its measured one (the median over runs of
# the median of steps 2-6; the spread over runs is the noise) -- and the Spearman rank correlation of
# predicted against measured, per world size; the predicted best against the measured best; the worst
# misprediction (measured / predicted, over the median of that ratio).
# Usage: bash dev/bench/bench_search.sh [RUNS (4)] [OUT (dev/bench/search_results.txt)]
#        (NPS=2: just the np 2 half)
set -u
cd "$(dirname "$0")/../.."
RUNS=${1:-4}
OUT=${2:-dev/bench/search_results.txt}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# each rank bound to a core, round-robin (np 4: ranks 0 and 2 on core 0, 1 and 3 on core 1): the same placement
# every run. Unbound, the scheduler's placement differs from run to run (two tp partners on one core or not),
# and a layout's runs at np 4 split into two modes up to 2x apart
MPIRUN="mpirun --oversubscribe --map-by core --bind-to core:overload-allowed"
# C 192: large enough that the GEMMs, not the per-kernel overheads, take most of a step (at C 128 on these
# machines --recompute full measured no slower than none); L 4 for --vpp 2 at pp 2
MODEL="L=4,C=192,NH=4,V=2048,maxT=64"
COMMON=(-e "$MODEL" -t 64 -d 1024)
MACHINE=$(mktemp)
$MPIRUN -np 2 ./train_gpt "${COMMON[@]}" -b 8 --calibrate "$MACHINE" </dev/null | tail -n 1
cat "$MACHINE"

LAYOUTS2=(
    "-b 8" "-b 4" "-b 2" "-b 1" "-b 8 --zero 1" "-b 8 --zero 2" "-b 8 --zero 3" "-b 1 --zero 3"
    "-b 8 --recompute mlp" "-b 8 --recompute full" "-b 16 --tp 2 --sp" "-b 16 --tp 2" "-b 4 --tp 2 --sp"
    "-b 16 --tp 2 --sp --recompute full" "-b 16 --cp 2" "-b 4 --cp 2" "-b 16 --pp 2" "-b 8 --pp 2" "-b 4 --pp 2"
    "-b 1 --pp 2" "-b 8 --pp 2 --pp-schedule gpipe" "-b 4 --pp 2 --pp-schedule zb" "-b 4 --pp 2 --vpp 2"
    "-b 8 --pp 2 --pp-layers auto" "-b 16 --pp 2 --recompute full" "-b 1 --zero 3 --recompute full"
    "-b 1 --pp 2 --recompute full" "-b 16 --tp 2 --recompute full")
LAYOUTS4=(
    "-b 4" "-b 2" "-b 1" "-b 4 --zero 3" "-b 1 --zero 3" "-b 4 --recompute full" "-b 8 --tp 2 --sp"
    "-b 8 --tp 2" "-b 16 --tp 4 --sp" "-b 8 --cp 2" "-b 16 --cp 2 --tp 2 --sp" "-b 4 --cp 2 --pp 2"
    "-b 8 --pp 2" "-b 2 --pp 2 --pp-schedule zb" "-b 2 --pp 2 --vpp 2" "-b 16 --pp 4" "-b 2 --pp 4"
    "-b 4 --tp 2 --sp --pp 2" "-b 16 --tp 2 --pp 2" "-b 8 --pp 2 --recompute full" "-b 16 --pp 4 --recompute full"
    "-b 16 --tp 4" "-b 16 --cp 4" "-b 1 --pp 4 --recompute full")

# median of the numbers on stdin
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# the predictions, then the runs in rounds: every layout once per round, so that a slow spell of this shared
# machine falls on all of them rather than on one layout's runs
: >"$OUT.pred"; : >"$OUT.runs"
for np in ${NPS:-2 4}; do
    if [ $np = 2 ]; then LAYOUTS=("${LAYOUTS2[@]}"); else LAYOUTS=("${LAYOUTS4[@]}"); fi
    for flags in "${LAYOUTS[@]}"; do
        pred=$(./train_gpt "${COMMON[@]}" $flags -s 0 -v 0 --plan $np --machine "$MACHINE" \
               | sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p')
        printf "%s\t%s\t%s\n" $np "$pred" "$flags" >>"$OUT.pred"
    done
done
for r in $(seq "$RUNS"); do
    while IFS=$'\t' read -r np pred flags; do
        ms=$($MPIRUN -np $np ./train_gpt "${COMMON[@]}" $flags -x 6 -s 0 -v 0 </dev/null \
             | awk '$1 == "step" && $2 + 0 >= 2 { for (i = 1; i <= NF; i++) if ($(i + 1) == "ms") print $i }' | median)
        printf "%s\t%s\t%s\n" $np "$flags" "$ms" | tee -a "$OUT.runs"
    done <"$OUT.pred"
done
: >"$OUT.rows"
while IFS=$'\t' read -r np pred flags; do
    mapfile -t runs < <(awk -F'\t' -v np=$np -v f="$flags" '$1 == np && $2 == f { print $3 }' "$OUT.runs")
    meas=$(printf "%s\n" "${runs[@]}" | median)
    noise=$(printf "%s\n" "${runs[@]}" | awk -v m="$meas" 'NR == 1 { lo = hi = $1 } { if ($1 < lo) lo = $1; if ($1 > hi) hi = $1 } END { printf "%.2f", (hi - lo) / m }')
    printf "%s\t%s\t%s\t%s\t%s\n" $np "$pred" "$meas" "$noise" "$flags" >>"$OUT.rows"
done <"$OUT.pred"

# Spearman per world size (ranks with ties averaged), best predicted vs best measured, worst misprediction
python3 - "$OUT.rows" "$OUT.runs" <<'PYEOF' | tee "$OUT"
import sys, statistics
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i]); r = [0.0] * len(v); i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]: j += 1
        for k in range(i, j + 1): r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r
def spearman(x, y):
    rx, ry = ranks(x), ranks(y); mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den
runs = {}
for l in open(sys.argv[2]):
    n, f, ms = l.rstrip("\n").split("\t"); runs.setdefault((n, f), []).append(float(ms))
for np in ("2", "4"):
    sel = [r for r in rows if r[0] == np]
    if not sel: continue
    # the measurements' own agreement: Spearman between two rounds of the same runs (the ceiling any model meets)
    k = min(len(runs[(np, r[4])]) for r in sel)
    agree = [spearman([runs[(np, r[4])][a] for r in sel], [runs[(np, r[4])][b] for r in sel])
             for a in range(k) for b in range(a + 1, k)]
    if agree: print(f"np {np}: two rounds of the same runs agree at Spearman {min(agree):.2f}-{max(agree):.2f} (median {statistics.median(agree):.2f})")
    p = [float(r[1]) for r in sel]; m = [float(r[2]) for r in sel]; noise = [float(r[3]) for r in sel]
    ratio = [b / a for a, b in zip(p, m)]; scale = statistics.median(ratio)
    print(f"np {np}: {len(sel)} layouts, Spearman {spearman(p, m):.3f}; measured / predicted: median {scale:.2f}, "
          f"range {min(ratio):.2f}-{max(ratio):.2f}; noise (run spread / median): median {statistics.median(noise):.2f}, max {max(noise):.2f}")
    bp = min(range(len(p)), key=lambda i: p[i]); bm = min(range(len(m)), key=lambda i: m[i])
    print(f"  predicted best: {sel[bp][4]} measured {m[bp]:.1f} ms; measured best: {sel[bm][4]} {m[bm]:.1f} ms "
          f"({100 * (m[bp] / m[bm] - 1):.1f}% slower; its noise {noise[bp]:.2f})")
    worst = max(range(len(p)), key=lambda i: abs(ratio[i] / scale - 1))
    print(f"  worst: {sel[worst][4]}: predicted {p[worst]:.1f} ms, measured {m[worst]:.1f} ms "
          f"({ratio[worst] / scale:.2f}x the median ratio)")
    for r, q in sorted(zip(sel, ratio), key=lambda t: float(t[0][2])):
        print(f"  {float(r[1]):9.1f} {float(r[2]):9.1f} {q / scale:6.2f} {float(r[3]):5.2f}  {r[4]}")
PYEOF
