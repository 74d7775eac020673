#!/usr/bin/env bash
# The memory and speed levers end to end: --recompute mlp and full give bit-identical losses and final
# files to none (dense and MoE, with tp + sp, pp and ZeRO 3), and their activation memory is the
# stored part of none's (the matrix asserts the formulas); --async-checkpoint writes the same files as
# synchronous checkpoints and survives a kill -9 mid-write; --overlap 1 is bit-identical to --overlap 0.
# Usage: bash scripts/test_levers.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
act() { awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == "activations" { print $5 }' "$1"; }

# 1. recompute: bit-identical to none
recompute_case() {   # NAME NP FLAGS...
    local name=$1 np=$2; shift 2
    for r in none mlp full; do
        rm -rf "$W/$name.$r"
        $MPIRUN -np $np "$BIN/train_gpt" -t 32 -x 6 -n 6 -v 3 -m 2 -s 0 -l 3e-3 -c 0.1 --recompute $r --memory-report "$@" -o "$W/$name.$r" >"$W/$name.$r.log" 2>&1
    done
    local ok=0
    for r in mlp full; do
        cmp -s "$W/$name.none/main.log" "$W/$name.$r/main.log" && cmp -s "$W/$name.none/model_00000006.bin" "$W/$name.$r/model_00000006.bin" \
            && cmp -s "$W/$name.none/state_00000006.bin" "$W/$name.$r/state_00000006.bin" || ok=1
    done
    say $ok "$name: --recompute mlp and full: main.log, model and optimizer state bit-identical to none; activations (rank 0) $(act "$W/$name.none.log") / $(act "$W/$name.mlp.log") / $(act "$W/$name.full.log") B"
}
recompute_case dense_tp2sp_zero3 4 -e "L=4,C=64,NH=4,V=256,maxT=64" -b 2 --tp 2 --sp --zero 3
recompute_case dense_pp2 2 -e "L=4,C=64,NH=4,V=256,maxT=64" -b 1 -d 128 --pp 2
recompute_case moe_ep2_tp2sp 4 -e "L=4,C=64,NH=4,V=256,maxT=64,E=4,k=2,every=2" -b 4 --tp 2 --sp --ep 2 --zero 1

# 2. asynchronous checkpoints: the same files as synchronous ones; a kill -9 while one is being written
#    leaves the previous checkpoint to resume from, and that resume is exact
async_case() {   # NAME NP FLAGS...
    local name=$1 np=$2; shift 2
    for mode in sync async; do
        rm -rf "$W/$name.$mode"
        $MPIRUN -np $np "$BIN/train_gpt" -t 32 -x 6 -n 2 -v 0 -s 0 -l 3e-3 $([ $mode = async ] && echo --async-checkpoint) "$@" \
            -o "$W/$name.$mode" >"$W/$name.$mode.log" 2>&1
    done
    local ok=0 n=0
    for f in "$W/$name.sync/"*; do   # (the flight/ rings hold times: not compared)
        [ -d "$f" ] && continue
        n=$((n + 1)); cmp -s "$f" "$W/$name.async/$(basename "$f")" || ok=1
    done
    say $ok "$name: --async-checkpoint writes the same $n files (model, state, DONE markers, main.log) as synchronous checkpoints"
}
async_case dense_tp2sp_zero3 4 -e "L=4,C=64,NH=4,V=256,maxT=64" -b 2 --tp 2 --sp --zero 3
async_case moe_ep2 2 -e "L=4,C=64,NH=4,V=256,maxT=64,E=4,k=2" -b 4 --ep 2 --zero 1
TINY="L=2,C=64,NH=4,V=256,maxT=64"
"$BIN/train_gpt" -e "$TINY" -t 32 -x 12 -n 2 -v 0 -s 0 -l 3e-3 -o "$W/akill_ref" >/dev/null 2>&1
rm -rf "$W/akill"
TRAIN_GPT_SLOW_CHECKPOINT=2 "$BIN/train_gpt" -e "$TINY" -t 32 -x 12 -n 2 -v 0 -s 0 -l 3e-3 --async-checkpoint -o "$W/akill" >/dev/null 2>&1 &
pid=$!
for i in $(seq 1 200); do [ -f "$W/akill/model_00000004.bin" ] && break; sleep 0.05; done
kill -9 $pid; wait $pid 2>/dev/null
[ -f "$W/akill/DONE_00000002" ] && [ ! -f "$W/akill/DONE_00000004" ] && [ ! -f "$W/akill/state_00000004.bin" ]
say $? "kill -9 while the step-4 checkpoint is being written: step 2 is the newest DONE, step 4's state never appeared"
"$BIN/train_gpt" -e "$TINY" -t 32 -x 12 -n 2 -v 0 -s 0 -l 3e-3 --async-checkpoint -y 1 -o "$W/akill" >"$W/akill.resume.log" 2>&1
grep -q "resumed from step 2" "$W/akill.resume.log" && cmp -s "$W/akill_ref/model_00000012.bin" "$W/akill/model_00000012.bin" \
    && cmp -s "$W/akill_ref/state_00000012.bin" "$W/akill/state_00000012.bin" && diff <(grep trl "$W/akill_ref/main.log") <(grep trl "$W/akill/main.log") >/dev/null
say $? "resumed from step 2: the final files and main.log equal an uninterrupted run's"

# 3. overlap: --overlap 1 (ZeRO-3 prefetch of the next unit's parameters, non-blocking pipeline sends)
#    moves only when communication waits, never what is computed: bit-identical to --overlap 0
overlap_case() {   # NAME NP FLAGS...
    local name=$1 np=$2; shift 2
    for o in 0 1; do
        rm -rf "$W/$name.o$o"
        $MPIRUN -np $np "$BIN/train_gpt" -t 32 -x 6 -n 6 -v 3 -m 2 -s 0 -l 3e-3 -c 0.1 --overlap $o "$@" -o "$W/$name.o$o" >"$W/$name.o$o.log" 2>&1
    done
    cmp -s "$W/$name.o0/main.log" "$W/$name.o1/main.log" && cmp -s "$W/$name.o0/model_00000006.bin" "$W/$name.o1/model_00000006.bin" \
        && cmp -s "$W/$name.o0/state_00000006.bin" "$W/$name.o1/state_00000006.bin"
    say $? "$name: --overlap 1: main.log, model and optimizer state bit-identical to --overlap 0"
}
overlap_case dense_dp2_zero3 2 -e "L=4,C=64,NH=4,V=256,maxT=64" -b 2 --zero 3
overlap_case dense_pp2_dp2_zero3 4 -e "L=4,C=64,NH=4,V=256,maxT=64" -b 1 -d 128 --pp 2 --zero 3
overlap_case dense_pp4_gpipe 4 -e "L=4,C=64,NH=4,V=256,maxT=64" -b 1 -d 256 --pp 4 --pp-schedule gpipe
overlap_case moe_tp2sp_ep2_zero3 4 -e "L=4,C=64,NH=4,V=256,maxT=64,E=4,k=2,every=2" -b 4 --tp 2 --sp --ep 2 --zero 3

# ZB-H1 runs 1F1B's forwards and backwards, the W passes (each dense layer's weight gradients) later but in
# micro-batch order: the same products into the same gradients in the same order, so bit-identical steps
zb_case() {   # NAME NP FLAGS...
    local name=$1 np=$2; shift 2
    for s in 1f1b zb; do
        rm -rf "$W/$name.$s"
        $MPIRUN -np $np "$BIN/train_gpt" -t 32 -x 6 -n 6 -v 3 -m 2 -s 0 -l 3e-3 -c 0.1 --pp-schedule $s "$@" -o "$W/$name.$s" >"$W/$name.$s.log" 2>&1
    done
    cmp -s "$W/$name.1f1b/main.log" "$W/$name.zb/main.log" && cmp -s "$W/$name.1f1b/model_00000006.bin" "$W/$name.zb/model_00000006.bin" \
        && cmp -s "$W/$name.1f1b/state_00000006.bin" "$W/$name.zb/state_00000006.bin"
    say $? "$name: --pp-schedule zb: main.log, model and optimizer state bit-identical to 1f1b"
}
zb_case zb_pp4 4 -e "L=4,C=64,NH=4,V=256,maxT=64" -b 1 -d 256 --pp 4
zb_case zb_pp2_tp2sp_zero2 4 -e "L=4,C=64,NH=4,V=256,maxT=64" -b 2 -d 512 --pp 2 --tp 2 --sp --zero 2
zb_case zb_pp2_dp2_zero3_mlp 4 -e "L=4,C=64,NH=4,V=256,maxT=64" -b 1 -d 256 --pp 2 --zero 3 --recompute mlp
zb_case zb_pp2_tp2sp_full 4 -e "L=4,C=64,NH=4,V=256,maxT=64" -b 2 -d 512 --pp 2 --tp 2 --sp --recompute full
zb_case zb_pp2_moe_ep2 4 -e "L=4,C=64,NH=4,V=256,maxT=64,E=4,k=2,every=2" -b 2 -d 256 --pp 2 --ep 2 --zero 1
zb_case zb_pp2_moe_shared_full 4 -e "L=4,C=64,NH=4,V=256,maxT=64,E=8,k=2,H=32,S=1" -b 2 -d 256 --pp 2 --ep 2 --zero 3 --recompute full
zb_case zb_pp2_moe_dropless_tp2sp 4 -e "L=4,C=64,NH=4,V=256,maxT=64,E=4,k=2,every=2" -b 2 -d 512 --pp 2 --tp 2 --sp --capacity-factor 0 --recompute mlp
