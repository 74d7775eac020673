#!/usr/bin/env bash
# Trained side by side: transformers' own training of each family we import (dev/reference/hf_train_ref.py: its
# model class, torch.optim.AdamW, the global norm clipped) against train_gpt on the imported model, 6 steps, the
# loss and the gradient norm before clipping at every step, in one process and in a parallel layout. GPT-2, Llama
# (llama3 RoPE scaling, a padding token), Mistral, Qwen2 (q/k/v biases), Mixtral, OLMoE (pad_token_id 1, QK-norm,
# raw top-k) and Qwen2-MoE (the gated shared expert, raw and renormalised top-k), each made as transformers
# initialises it (initializer_range 0.05, the padding row zero) with random norm weights and biases; the padding
# id is in every batch. Our side: lr 1e-3 constant, no warm-up, weight decay 0.1 on the 2-D matrices, clip 1; MoE
# dropless with aux 0 and z 0 (transformers' loss is the CE alone). The MoE models route every step's batch with
# top-k margins >= 1e-5 in transformers' fp32 and float64 runs (hf_train_ref.py make picks such seeds), so both
# sides choose the same experts.
#
# Tolerance, per step s. Both programs are fp32 evaluations of the same training in different summation orders;
# float64 (transformers' same training in double) stands for the exact trajectory. At step 0 the loss differs by
# the forward's rounding: 1e-5 of the loss + 5e-7 (test_hf_llama.sh's bound). After an update the parameters
# differ too: AdamW moves an element by about lr whatever its gradient's size, so an element whose gradient is at
# rounding level moves one way in one program and not in the other, and such differences add up over the steps.
# How far rounding moves this training is measured: f_s = the largest |fp32 - float64| of transformers' runs at
# steps 0..s. Our fp32 run is another ordering of the same sums, its own distance from float64 of the same size,
# so |ours - transformers| <= f(ours) + f_s ~ 2 f_s; the bound is 1e-5 |x| + 5e-7 + 4 f_s for the loss and
# 1e-5 |x| + 4 f_s for the norm (a sum of squares over every gradient element: relative rounding ~1e-6).
# OLMoE before its padding fix: the norm 262 against 2.03 at step 0.
# Usage: bash scripts/test_hf_train.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
need_py transformers safetensors torch
W="$W/hf_train"
rm -rf "$W" && mkdir -p "$W"
REF="$PY dev/reference/hf_train_ref.py"
HF="$PY dev/hf.py"
N=6; LR=1e-3; WD=0.1; CLIP=1.0
OURS="-i $W/train.bin -t 32 -x $N -l $LR -c $WD -k constant -u 0 --grad-clip $CLIP -v 0 -s 0"
MOE="--aux-coeff 0 --z-coeff 0 --capacity-factor 0"

$REF make "$W" >"$W/make.log" 2>&1
say $? "transformers makes the 8 models as it initialises them (MoE seeds routing all $N steps with margins >= 1e-5: $(grep -c routes "$W/make.log"))"

# per step "S LOSS NORM" of a train_gpt log
steps() { awk '/^step / { split($2, a, "/"); print a[1] - 1, $5, $8 }' "$1"; }
# compare LOG NAME: every step of ours within the bound of transformers' (the header's derivation); prints the worst
compare() {
    paste -d' ' <(steps "$1") <(awk -v m="$2" '$1 == "step" && $2 == m { print $4, $5, $6, $7, $8 }' "$W/ref.log") | awk -v n=$N '
        function abs(x) { return x < 0 ? -x : x }
        NF == 8 {
            fl = abs($4 - $5) > fl ? abs($4 - $5) : fl; fn = abs($6 - $7) > fn ? abs($6 - $7) : fn
            dl = abs($2 - $4); dn = abs($3 - $6)
            tl = 1e-5 * abs($5) + 5e-7 + 4 * fl; tn = 1e-5 * abs($7) + 4 * fn
            ok += (dl <= tl && dn <= tn && $8 >= 1e-5); rows++
            if (dl / tl > wl) { wl = dl / tl; sl = $1 } if (dn / tn > wn) { wn = dn / tn; sn = $1 }
            last = sprintf("step %d: loss %s / %s, norm %s / %s", $1, $2, $4, $3, $6)
        }
        END { printf "worst loss |diff| %.2f of its bound (step %d), norm %.2f (step %d); %s", wl, sl, wn, sn, last
              exit !(rows == n && ok == n) }'
}

# name, the parallel layout: ranks, then flags (-b is per rank: 4 rows a step in all)
CASES=(
    "gpt2 2 -b 4 --tp 2 --sp"
    "llama 2 -b 2 -d 128 --pp 2 --pp-schedule zb"
    "mistral 2 -b 4 --cp 2"
    "qwen2 4 -b 2 --tp 2 --sp --zero 2"
    "mixtral 2 -b 2 --ep 2"
    "olmoe 4 -b 2 --tp 2 --sp --ep 2"
    "qwen2_moe 4 -b 1 -d 128 --pp 2 --ep 2"
    "qwen2_moe_norm 2 -b 4 --cp 2 --cp-kind ulysses"
)
dirs=""; for c in "${CASES[@]}"; do dirs="$dirs $W/${c%% *}"; done
$REF train "$W/train.bin" -b 4 -t 32 -n $N --lr $LR --wd $WD --clip $CLIP $dirs >"$W/ref.log" 2>&1   # (one process: all)
for c in "${CASES[@]}"; do
    set -- $c
    m=$1; np=$2; shift 2
    flags=""; case $m in mixtral|olmoe|qwen2_moe*) flags=$MOE ;; esac
    $HF import "$W/$m" "$W/$m.bin" >"$W/import_$m.log" 2>&1 || { say 1 "$m: import: $(cat "$W/import_$m.log")"; continue; }
    "$BIN/train_gpt" -e "$W/$m.bin" -b 4 $OURS $flags >"$W/one_$m.log" 2>&1
    r=$(compare "$W/one_$m.log" $m)
    say $? "$m trained $N steps in one process = transformers' training (loss and pre-clip norm each step): $r"
    $MPIRUN -np $np "$BIN/train_gpt" -e "$W/$m.bin" $OURS $flags "$@" >"$W/par_$m.log" 2>&1
    r=$(compare "$W/par_$m.log" $m)
    say $? "$m trained $N steps under $* ($np ranks) = transformers' training: $r"
done

# the reference must be able to disagree: our PyTorch reference (gpt2_ref.py --arch llama, what test_gpt checks
# against) against transformers' classes, the loss and every gradient of a batch, 18 cases from the reference's
# init and 6 initialised as transformers initialises (a padding token where the family has one) over 3 batches
# each (dev/reference/llama_hf_check.py; its tolerance: 4x the reference's own fp32-against-float64 difference)
$PY dev/reference/llama_hf_check.py >"$W/check.log" 2>&1
rc=$?
awk '/^== / { name = substr($0, 4); sub(/  \(C .*/, "", name) } /^   -- batch/ { b = " " $2 " " $3 }
     /^   (PASS|FAIL)/ { printf "%s reference = transformers (loss, every gradient): %s%s:%s\n", $1 == "PASS" ? "ok  " : "FAIL", name, b, substr($0, 8) }' "$W/check.log"
say $rc "llama_hf_check.py: $(tail -n 1 "$W/check.log")"
