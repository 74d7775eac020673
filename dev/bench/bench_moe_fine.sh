#!/usr/bin/env bash
# Fine-grained and shared experts on the CPU build (timings, not tests: ratios measured side by side in one run):
#   1. tokens/s of a fine-grained MoE model (L4 C128 NH4 V257, E 64 top-8 of width H = C/2, 1 shared expert:
#      an active MLP width of 9H = 4.5C) against the dense model of the same shape (MLP 4C), one rank, B8 T128;
#      the ratio, and the ratio normalised by the FLOPs per token; with a capacity (F 1.25, the padded dispatch:
#      its experts also run the padding rows) and dropless (F 0, the counted dispatch, as DeepSeek-V3 and OLMoE
#      train)
#   1b. an OLMoE-shaped MoE on the Llama body (E 64 top-8, SwiGLU experts of width H = C/2, no renormalisation of the
#      top-k, QK-norm; dropless) against the dense Llama of the same active parameters (SwiGLU F = kH): tokens/s per
#      FLOP, one rank, B8 T128 (OLMOE_ONLY=1: this section alone)
#   2. the expert all-to-alls at ep 2 and ep 4 (one thread per rank), padded (a capacity's dispatch) and counted
#      (the counts exchanged first): ep bytes per step and their share of the step time
# Usage: bash dev/bench/bench_moe_fine.sh [THREADS (default 2)]   (ROUNDS=4: rounds of sections 1 and 1b;
#        THROUGHPUT_ONLY=1: sections 1 and 1b; OLMOE_ONLY=1: 1b)
set -eu
cd "$(dirname "$0")/../.."
THREADS=${1:-2}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
SHAPE="L=4,C=128,NH=4,V=257,maxT=128"
FINE="$SHAPE,E=64,k=8,H=64,S=1"
avg() { awk '/^average step/ { print $(NF-1) }' "$1"; }

ROUNDS=${ROUNDS:-2}
if [ -z "${OLMOE_ONLY:-}" ]; then
echo "== 1. throughput, one rank, $THREADS threads, B8 T128, 20 steps (the first is not timed): dense, MoE F 1.25, MoE dropless; $ROUNDS rounds"
for round in $(seq $ROUNDS); do
    for model in dense fine dropless; do
        e=$SHAPE; [ $model != dense ] && e=$FINE
        f=(); [ $model = dropless ] && f=(--capacity-factor 0)
        OMP_NUM_THREADS=$THREADS ./train_gpt -e "$e" -b 8 -t 128 -x 20 -v 0 -s 0 "${f[@]}" >"$W/$model$round.log" 2>&1
    done
done
python3 - $(for r in $(seq $ROUNDS); do echo "$(avg "$W/dense$r.log") $(avg "$W/fine$r.log") $(avg "$W/dropless$r.log")"; done) <<'EOF'
import statistics, sys
v = list(map(float, sys.argv[1:]))
L, C, V, T, E, k, H, S = 4, 128, 257, 128, 64, 8, 64, 1
# FLOPs per token: 6 x the weights a token meets (attention 4C^2, each MLP it visits with its biases, the router
# E C, the tied head V C) + the attention scores 6 L T C
mlp = lambda width: 2 * C * width + width + C
f_dense = 6 * (L * (4 * C * C + mlp(4 * C)) + V * C) + 6 * L * T * C
f_fine = 6 * (L * (4 * C * C + k * mlp(H) + mlp(S * H) + E * C) + V * C) + 6 * L * T * C
print(f"FLOPs per token: dense {f_dense:.4g}, E{E} top-{k} H{H} + {S} shared {f_fine:.4g} ({f_fine / f_dense:.3f}x)")
per = {"F 1.25": [], "dropless": []}
for r in range(len(v) // 3):
    d, m, n = v[3 * r: 3 * r + 3]
    print(f"round {r + 1}: dense {d:.0f} tok/s; MoE F 1.25 {m:.0f} tok/s, per FLOP {m / d * f_fine / f_dense:.2f}; "
          f"dropless {n:.0f} tok/s, per FLOP {n / d * f_fine / f_dense:.2f}")
    per["F 1.25"].append(m / d * f_fine / f_dense); per["dropless"].append(n / d * f_fine / f_dense)
for k_, x in per.items():
    print(f"tok/s per FLOP of the dense model's, {k_}: mean {sum(x) / len(x):.2f}, min {min(x):.2f}, max {max(x):.2f}")
EOF
fi

# 1b. OLMoE's shape on the Llama body: E 64 top-8 of width H = C/2 (SwiGLU), softmax top-k not renormalised, QK-norm,
# dropless; the dense Llama of the same active parameters: SwiGLU of width F = k H (and the same QK-norm)
LSHAPE="arch=llama,L=4,C=128,NH=4,V=257,maxT=128,qknorm=1"
OLMOE="$LSHAPE,E=64,k=8,H=64,topknorm=0"
echo "== 1b. throughput, one rank, $THREADS threads, B8 T128, 20 steps: dense Llama (F 512) against OLMoE-shaped"
echo "   (E 64 top-8, SwiGLU H 64, dropless); $ROUNDS rounds"
for round in $(seq $ROUNDS); do
    OMP_NUM_THREADS=$THREADS ./train_gpt -e "$LSHAPE,F=512" -b 8 -t 128 -x 20 -v 0 -s 0 >"$W/ldense$round.log" 2>&1
    OMP_NUM_THREADS=$THREADS ./train_gpt -e "$OLMOE" -b 8 -t 128 -x 20 -v 0 -s 0 --capacity-factor 0 \
        >"$W/olmoe$round.log" 2>&1
done
python3 - $(for r in $(seq $ROUNDS); do echo "$(avg "$W/ldense$r.log") $(avg "$W/olmoe$r.log")"; done) <<'EOF'
import statistics, sys
v = list(map(float, sys.argv[1:]))
L, C, V, T, E, k, H = 4, 128, 257, 128, 64, 8, 64
# FLOPs per token: 6 x the weights a token meets (attention 4C^2, SwiGLU's 3 C F without biases, the router E C,
# the untied head V C) + the attention scores 6 L T C (RMSNorms, QK-norm and SwiGLU's products: not counted)
f_dense = 6 * (L * (4 * C * C + 3 * C * k * H) + V * C) + 6 * L * T * C
f_moe = 6 * (L * (4 * C * C + k * 3 * C * H + E * C) + V * C) + 6 * L * T * C
print(f"FLOPs per token: dense Llama F {k * H} {f_dense:.4g}, E{E} top-{k} SwiGLU H{H} {f_moe:.4g} ({f_moe / f_dense:.3f}x)")
per = []
for r in range(len(v) // 2):
    d, m = v[2 * r: 2 * r + 2]
    per.append(m / d * f_moe / f_dense)
    print(f"round {r + 1}: dense {d:.0f} tok/s; OLMoE-shaped dropless {m:.0f} tok/s, per FLOP {per[-1]:.2f}")
print(f"tok/s per FLOP of the dense Llama's, OLMoE-shaped dropless: mean {sum(per) / len(per):.2f}, "
      f"min {min(per):.2f}, max {max(per):.2f}, median {statistics.median(per):.2f}")
# each side's best round: the one other jobs on the machine disturbed least (as bench_cpu.sh's tables)
bd, bm = max(v[0::2]), max(v[1::2])
print(f"best of {len(per)} rounds: dense {bd:.0f} tok/s, OLMoE-shaped {bm:.0f}: per FLOP {bm / bd * f_moe / f_dense:.2f}")
EOF

[ -n "${THROUGHPUT_ONLY:-}${OLMOE_ONLY:-}" ] && exit 0   # (THROUGHPUT_ONLY=1: section 1 alone)

echo "== 2. the all-to-alls, one thread per rank, B8 T128 per rank, 10 steps: padded (a capacity's dispatch) and counted"
echo "   (TRAIN_GPT_COUNTED_DISPATCH=1: the counts exchanged first); ep bytes per step of rank 0, the all-to-all share"
for ep in 2 4; do
    for mode in padded counted; do
        env=(); [ $mode = counted ] && env=(env TRAIN_GPT_COUNTED_DISPATCH=1)
        OMP_NUM_THREADS=1 "${env[@]}" $MPIRUN -np $ep ./train_gpt -e "$FINE" -b 8 -t 128 -x 10 -v 0 -s 0 --ep $ep --comm-report \
            >"$W/ep$ep$mode.log" 2>&1
        bytes=$(awk '$1 == "comm" && $2 == 0 && $3 == "ep" { printf "%.2f MiB", $4 / 1048576 }' "$W/ep$ep$mode.log")
        echo "ep $ep $mode: $bytes; $(grep '^MoE all-to-all' "$W/ep$ep$mode.log" | sed 's/^MoE all-to-all ([^)]*): //') ($(avg "$W/ep$ep$mode.log") tok/s over $ep ranks)"
    done
done
