#!/usr/bin/env bash
# Load balancing on tinyshakespeare (GPT-2 tokens), CPU build: a MoE model (L4 C128 NH4, E 8 top-2, F 1.25,
# softmax scores) from a skewed router init (gpt2_ref.py --skew: every token's first choice is expert 0, as
# refs/moe_skew) trained STEPS steps of 8 x 64 tokens four ways: neither balancing, the Switch aux loss only
# (0.01), loss-free balancing only (--moe-bias-rate RATE, aux 0), both. Reported per way, as the mean of 2
# init seeds: max/mean load per MoE layer (main.log's load lines) averaged over the last third of the steps
# (the mean over the layers; the worst layer of each seed, averaged; the worst layer of the seeds' per-layer
# means), the dropped fraction there, and the final validation loss.
# A benchmark, not a test: its numbers go to dev/notes/moe.md.
# Usage: bash dev/bench/bench_moe_balance.sh [STEPS (default 300)] [RATE (default 0.01)] [THREADS (default 2)]
#        (WAYS="bias only,both" runs just those; SCORE=sigmoid: sigmoid router scores, z-loss 0;
#         BATCH=16: 16 sequences of 64 tokens a step; LR=1e-3: another learning rate)
set -eu
cd "$(dirname "$0")/../.."
STEPS=${1:-300}
RATE=${2:-0.01}
THREADS=${3:-2}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
DATA=dev/data/tinyshakespeare
[ -f $DATA/tiny_shakespeare_train.bin ] || $PY dev/data/tinyshakespeare.py --input ../shared/data/tinyshakespeare.txt --out $DATA
V=$(od -An -t d4 -j 8 -N 4 $DATA/tokenizer.bin | tr -d ' ')
[ "$V" = 50257 ] || echo "(the tokenizer has $V tokens, not GPT-2's: scripts/setup.sh installs the GPT-2 one)"
Vp=$(( (V + 127) / 128 * 128 ))

for seed in 1337 1338; do   # the skewed initial model (the reference writes it, then trains 2 steps: cheap)
    /usr/bin/python3 dev/reference/gpt2_ref.py --config tiny --L 4 --C 128 --NH 4 --V $V --Vp $Vp --maxT 64 --T 64 \
        --R 1 --nsteps 2 --warmup 1 --E 8 --k 2 --skew --min_margin 0 --seed $seed --score ${SCORE:-softmax} \
        $([ "${SCORE:-softmax}" = sigmoid ] && echo --z_coeff 0) --out "$W/init$seed" >/dev/null
done
ways=("neither:--aux-coeff 0" "aux only:--aux-coeff 0.01" "bias only:--aux-coeff 0 --moe-bias-rate $RATE"
      "both:--aux-coeff 0.01 --moe-bias-rate $RATE")
echo "E 8 top-2 F 1.25, ${SCORE:-softmax} scores, L4 C128, $STEPS steps of ${BATCH:-8}x64 tokens (lr ${LR:-3e-3}), skewed router init; bias rate $RATE; $THREADS threads"
printf "%-10s %-34s %-12s %-10s %s\n" way "max/mean (mean, worst, worst mean)" dropped "val loss" "(each seed: max/mean mean, val)"
for w in "${ways[@]}"; do
    name=${w%%:*}; flags=${w#*:}
    [ -n "${WAYS:-}" ] && [[ ",$WAYS," != *",$name,"* ]] && continue   # WAYS="bias only,both": just those
    out=""
    for seed in 1337 1338; do
        d="$W/run_${name// /_}_$seed"
        OMP_NUM_THREADS=$THREADS ./train_gpt -i $DATA/tiny_shakespeare_train.bin -j $DATA/tiny_shakespeare_val.bin \
            -e "$W/init$seed/model.bin" -b ${BATCH:-8} -t 64 -x $STEPS -l ${LR:-3e-3} -u 20 -q 0.1 -c 0.1 -v $STEPS -m 8 -s 0 \
            $flags -o "$d" >"$d.log" 2>&1 || { echo "run $name seed $seed failed:"; tail -3 "$d.log"; exit 1; }
        # per layer: max/mean averaged over the last third of the steps; dropped likewise; the last val loss;
        # then each layer's figure, in layer order
        out+=$(awk -v from=$((STEPS - STEPS / 3)) '
            /^s:[0-9]+ moe[0-9]+:/ { split($1, s, ":"); if (s[2] + 0 < from) next
                                     l = substr($2, 4); sub(/:.*/, "", l); mm[l] += $3; dr[l] += $7; n[l]++ }
            /^s:[0-9]+ tel:/ { split($2, v, ":"); val = v[2] }
            END { worst = 0; sum = 0; ds = 0; nl = 0; per = ""
                  for (l = 0; l < 256; l++) if (l in mm) {
                      m = mm[l] / n[l]; sum += m; ds += dr[l] / n[l]; nl++; if (m > worst) worst = m; per = per sprintf(" %.4f", m) }
                  printf "%.4f %.4f %.5f %.4f%s\n", sum / nl, worst, ds / nl, val, per }' "$d/main.log")$'\n'
    done
    echo "$out" | awk -v name="$name" 'NF >= 5 { m += $1; w += $2; d += $3; v += $4; k++; each = each sprintf(" %.3f/%.4f", $1, $4)
                                                for (i = 5; i <= NF; i++) layer[i] += $i; nf = NF }
        END { wm = 0; for (i = 5; i <= nf; i++) if (layer[i] / k > wm) wm = layer[i] / k
              printf "%-10s %-34s %-12s %-10s %s\n", name, sprintf("%.3f, %.3f, %.3f", m / k, w / k, wm), sprintf("%.4f", d / k),
              sprintf("%.4f", v / k), each }'
done
