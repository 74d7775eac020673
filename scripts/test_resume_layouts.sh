#!/usr/bin/env bash
# Resume into another layout through train_gpt, dense models: a checkpoint written at step 5 by layout A
# resumes in layout B (the same model and global batch) for 5 more steps, and those 5 losses equal an
# uninterrupted 10-step run of layout B's within 1e-5 relative: the two runs differ only in the order of
# their floating-point sums (layout, BLAS kernels), which moves a dense model's loss by ~1e-7 relative per
# step (test_gpt.cu's LOSS derivation; 2e-7 seen after 10 steps under three kernel choices). MoE models are
# checked by test_gpt --resume-from instead (the matrix's resume pairs): the step after the checkpoint
# against what layout A computes from it, because over 5 steps a routing decision near a tie may flip
# between layouts and fork the trajectory. (The parameters are not compared element-wise: one whose
# gradient is rounding noise moves by about lr per step whatever the noise; the losses are the check.)
# Usage: bash scripts/test_resume_layouts.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"

# pair NAME MODEL "NP_A FLAGS_A" "NP_B FLAGS_B"   (constant lr: -q 1; the built-in corpus; 512 tokens per step)
pair() {
    local name=$1 model=$2 a=($3) b=($4)
    local common=(-e "$model" -t 32 -d 512 -v 0 -s 0 -l 3e-3 -c 0.1 -q 1)
    local d="$W/$name"
    rm -rf "$d.a" "$d.b"
    $MPIRUN -np ${a[0]} "$BIN/train_gpt" "${common[@]}" "${a[@]:1}" -x 5 -n 5 -o "$d.a" >"$d.a.log" 2>&1
    $MPIRUN -np ${b[0]} "$BIN/train_gpt" "${common[@]}" "${b[@]:1}" -x 10 -n 10 -o "$d.b" >"$d.b.log" 2>&1
    $MPIRUN -np ${b[0]} "$BIN/train_gpt" "${common[@]}" "${b[@]:1}" -x 10 -n 10 -y 1 -o "$d.a" >"$d.r.log" 2>&1
    local rc=$?
    grep -q "resumed from step 5" "$d.r.log" && [ $rc = 0 ] && python3 - "$d.a" "$d.b" <<'EOF'
import struct, sys, math
def trl(d):
    return {int(l.split()[0][2:]): float(l.split("trl:")[1]) for l in open(d + "/main.log") if " trl:" in l}
a, b = trl(sys.argv[1]), trl(sys.argv[2])
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in range(5, 10))
print(f"     (steps 6-10: worst relative loss difference {worst:.1e})")
sys.exit(0 if len(a) == 10 and worst <= 1e-5 else 1)
EOF
    say $? "$name: resumed from layout A's step-5 checkpoint, layout B's steps 6-10 equal its uninterrupted run's"
}

M="L=4,C=64,NH=4,V=256,maxT=64"
pair tp2sp_dp2z3__dp4z1     "$M" "4 --tp 2 --sp --zero 3 -b 8"   "4 --zero 1 -b 4"
pair pp2__tp2sp             "$M" "2 --pp 2 -b 4"                 "2 --tp 2 --sp -b 16"
pair dp4z2__single          "$M" "4 --zero 2 -b 4"               "1 -b 8"
pair single__pp2_dp2z3      "$M" "1 -b 16"                       "4 --pp 2 --zero 3 -b 4"
pair pp2z1__pp4z2           "$M" "2 --pp 2 --zero 1 -b 16"       "4 --pp 4 --zero 2 -b 8"
pair pp2vpp2__pp4             "$M" "2 --pp 2 --vpp 2 -b 4"         "4 --pp 4 -b 4"
pair pp4vpp2z1__pp2vpp2tp2sp  "L=8,C=64,NH=4,V=256,maxT=64" "4 --pp 4 --vpp 2 --zero 1 -b 4" "4 --pp 2 --vpp 2 --tp 2 --sp -b 8"
pair cp2z3__pp2tp2sp          "$M" "4 --cp 2 --zero 3 -b 8"        "4 --pp 2 --tp 2 --sp -b 8"
pair dp2__cp4                 "$M" "2 -b 8"                        "4 --cp 4 -b 16"

# MoE through train_gpt: the resume runs (its numbers are test_gpt --resume-from's to check)
d="$W/moe_cp2ep2z2__ep2tp2sp"
rm -rf "$d.a"
common=(-e "$M,E=4,k=2" -t 32 -d 512 -v 0 -s 0 -l 3e-3 -c 0.1 -q 1)
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" --cp 2 --ep 2 --zero 2 -b 8 -x 5 -n 5 -o "$d.a" >"$d.a.log" 2>&1
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" --ep 2 --tp 2 --sp -b 8 -x 10 -n 10 -y 1 -o "$d.a" >"$d.r.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "resumed from step 5" "$d.r.log" && [ "$(grep -cE '^s:[0-9]+ trl:[0-9]+\.[0-9]+$' "$d.a/main.log")" = 10 ]
say $? "moe_cp2ep2z2__ep2tp2sp: train_gpt resumes a MoE checkpoint of cp 2 x ep 2 ZeRO 2 under ep 2 x tp 2 + SP (10 steps logged)"
