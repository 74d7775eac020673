#!/usr/bin/env bash
# Pipeline benchmark (not a test): bubble fraction per stage and activation memory per stage, 1F1B vs
# GPipe vs interleaved 1F1B (V 2 and 4 model chunks per stage) vs ZB-H1 (its own table, rounds side by side), pp 2 on the 2 cores (one rank per core: more ranks than cores make the waits meaningless).
# Model L8 C128 NH4, B2 T64 micro-batches, m = 2, 4, 8 per step; V = 256 (balanced stages) and 50257
# (the LM head makes the last stage the slow one: the first waits on it).
set -u
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
for V in 256 50257; do
echo "V $V"
printf "%-6s %-3s %8s %8s %8s %12s %12s %9s %6s\n" sched m ideal stage0 stage1 "act0 MiB" "act1 MiB" tok/s msgs
for sched in 1f1b gpipe vpp2 vpp4; do
    flags="--pp-schedule $sched" vpp=1
    case $sched in vpp*) vpp=${sched#vpp}; flags="--vpp $vpp";; esac
    for m in 2 4 8; do
        out=$(mpirun --oversubscribe --bind-to none -np 2 ./train_gpt -e "L=8,C=128,NH=4,V=$V,maxT=64" -b 2 -t 64 \
              -d $((2 * 64 * m)) -x 6 -s 0 -v 0 --pp 2 $flags --comm-report --memory-report)
        ideal=$(awk -v m=$m -v v=$vpp 'BEGIN { printf "%.3f", 1 / (v * m + 1) }')
        s0=$(awk '/^  stage 0:/ { print $3 }' <<<"$out"); s1=$(awk '/^  stage 1:/ { print $3 }' <<<"$out")
        a0=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == "activations" { printf "%.2f", $5 / 1048576 }' <<<"$out")
        a1=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 1 && $3 == "activations" { printf "%.2f", $5 / 1048576 }' <<<"$out")
        tok=$(awk '/average step/ { print $(NF-1) }' <<<"$out")
        msgs=$(grep -m1 "^  rank 0:  tp" <<<"$out" | sed 's/.* pp [0-9]* B (\([0-9]*\) calls).*/\1/')   # boundary messages stage 0 sends per step
        printf "%-6s %-3s %8s %8s %8s %12s %12s %9s %6s\n" $sched $m $ideal "$s0" "$s1" "$a0" "$a1" "$tok" "$msgs"
    done
done
done

# Uneven stages (--pp-layers): even against auto (FLOPs) and auto:FILE (the costs the auto run measured) at m 8,
# 1F1B, on two head-heavy shapes
echo
echo "uneven stages: 1F1B, pp 2, m 8, B2 T64 (ideal bubble 0.111)"
printf "%-28s %-8s %-7s %-16s %8s %8s %9s\n" model split layers "cost (layers)" stage0 stage1 tok/s
for model in "L=8,C=128,NH=4,V=50257,maxT=64" "L=16,C=128,NH=4,V=8192,maxT=64"; do
    for split in even auto measured; do   # measured: auto:FILE with the costs the auto run measured (its -o)
        flags=""; [ $split = auto ] && { flags="--pp-layers auto"; costs_dir=$(mktemp -d); }
        [ $split = measured ] && flags="--pp-layers auto:$costs_dir/pipeline_costs.txt"
        out=$(mpirun --oversubscribe --bind-to none -np 2 ./train_gpt -e "$model" -b 2 -t 64 -d 1024 -x 8 -s 0 -v 0 --pp 2 \
              $flags --comm-report $([ $split = auto ] && echo "-o $costs_dir"))
        layers=$(sed -n 's/^pipeline stages.*: layers \([0-9,]*\);.*/\1/p' <<<"$out")
        cost=$(sed -n 's/^pipeline stages.*cost in dense layers \([0-9.,]*\) .*/\1/p; s/^pipeline stages.*measured cost per micro-batch (ms) \([0-9.,]*\)$/\1 ms/p' <<<"$out")
        s0=$(awk '/^  stage 0:/ { print $3 }' <<<"$out"); s1=$(awk '/^  stage 1:/ { print $3 }' <<<"$out")
        tok=$(awk '/average step/ { print $(NF-1) }' <<<"$out")
        printf "%-28s %-8s %-7s %-16s %8s %8s %9s\n" "${model%%,maxT*}" $split "$layers" "$cost" "$s0" "$s1" "$tok"
    done
    rm -rf "$costs_dir"
done

# ZB-H1 against 1F1B, side by side in rounds (this machine's noise is larger than the difference at m 8): V 256,
# m = pp, 2pp, 4pp; per round and schedule the bubble of each stage, the activations of each, tok/s
echo
echo "ZB-H1 vs 1F1B: pp 2, L8 C128 V256, B2 T64, ${ROUNDS:=3} rounds (bubble stage 0 / 1, activations MiB stage 0 / 1, tok/s)"
for m in 2 4 8; do
    for round in $(seq 1 $ROUNDS); do
        line="m $m round $round:"
        for sched in 1f1b zb; do
            out=$(mpirun --oversubscribe --bind-to none -np 2 ./train_gpt -e "L=8,C=128,NH=4,V=256,maxT=64" -b 2 -t 64 \
                  -d $((2 * 64 * m)) -x 8 -s 0 -v 0 --pp 2 --pp-schedule $sched --comm-report --memory-report)
            s0=$(awk '/^  stage 0:/ { print $3 }' <<<"$out"); s1=$(awk '/^  stage 1:/ { print $3 }' <<<"$out")
            a0=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == "activations" { printf "%.2f", $5 / 1048576 }' <<<"$out")
            a1=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 1 && $3 == "activations" { printf "%.2f", $5 / 1048576 }' <<<"$out")
            tok=$(awk '/average step/ { print $(NF-1) }' <<<"$out")
            line+=" $sched $s0 / $s1, $a0 / $a1 MiB, $tok tok/s;"
        done
        echo "$line"
    done
done
