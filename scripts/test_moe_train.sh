#!/usr/bin/env bash
# Mixture of Experts end to end (train_gpt itself, not test_gpt): main.log's aux, z and drop lines, the
# loss falls; checkpoint + resume under ep 2 x zero 3 repeats the uninterrupted run exactly; sampling
# (dropless) and validation under ep 2 x tp 2 + sp and under pp 2 x ep 2; sparse upcycling of a dense
# checkpoint with k = E is the dense model at the first step; the MoE model file (version 13); sigmoid
# scores with loss-free balancing: the load lines, resume, the model file (version 23) with its bias.
# Usage: bash scripts/test_moe_train.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
TINY="L=2,C=64,NH=4,V=256,maxT=64"
MOE="$TINY,E=4,k=2"

# 1. one process, built-in corpus: trl, aux, z, drop lines per step; the loss falls
"$BIN/train_gpt" -e "$MOE" -t 32 -b 4 -x 30 -l 3e-3 -v 15 -m 4 -s 0 -o "$W/a" >"$W/a.log" 2>&1
say $? "train_gpt trains a MoE model (E 4, k 2) for 30 steps"
n=0
for key in trl aux z drop; do n=$((n + $(grep -cE "^s:[0-9]+ $key:[0-9]+\.[0-9]{6}$" "$W/a/main.log"))); done
[ "$n" = 120 ]; say $? "main.log has 30 lines each of trl, aux, z and drop (got $n of 120)"
first=$(awk -F'trl:' '/trl:/ { print $2; exit }' "$W/a/main.log"); last=$(awk -F'trl:' '/trl:/ { x = $2 } END { print x }' "$W/a/main.log")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }'; say $? "the MoE model's loss falls: $first -> $last"
grep -q "^moe: 2 of 2 layers (every 1), 4 experts of width 256 + 0 shared, top-2 of softmax scores, capacity factor 1.250 (20 per expert and sequence)" "$W/a.log"
say $? "the start-up line states the MoE layers and the capacity (ceil(2*32*1.25/4) = 20)"

# 2. resume through main() under ep 2 x zero 3 (4 ranks): 10 steps straight vs 6 + checkpoint + resume
common=(-e "$MOE" -t 32 -b 2 -v 0 -s 0 -l 3e-3 -c 0.1 --ep 2 --zero 3)
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 10 -o "$W/full" >/dev/null 2>&1
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 6 -n 3 -o "$W/ckpt" >/dev/null 2>&1
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 10 -y 1 -o "$W/ckpt" >"$W/resume.log" 2>&1
rc=$?
grep -q "resumed from step 6" "$W/resume.log" && [ $rc = 0 ]; say $? "ep 2 x zero 3: -y 1 resumes from step 6"
diff <(grep -E "trl|aux|z:|drop" "$W/full/main.log") <(grep -E "trl|aux|z:|drop" "$W/ckpt/main.log") >/dev/null
say $? "ep 2 x zero 3: the resumed main.log (trl, aux, z, drop) equals the uninterrupted one, all 10 steps"
ver=$(python3 -c "import struct,sys; h=struct.unpack('<11i', open(sys.argv[1],'rb').read(44)); print(h[1], h[8], h[9], h[10])" "$W/ckpt/model_00000006.bin")
[ "$ver" = "13 4 2 1" ]; say $? "the checkpoint is a MoE model file: version 13, E 4, k 2, every 1 (got $ver)"

# 3. sampling (dropless) and validation under ep 2 x tp 2 + sp, and under pp 2 x ep 2 with every 2nd layer MoE
$MPIRUN -np 4 "$BIN/train_gpt" -e "$MOE" -t 32 -b 2 -x 4 -v 2 -m 2 -s 2 -g 8 --tp 2 --sp --ep 2 >"$W/sample.log" 2>&1
[ $? = 0 ] && grep -q "generating:" "$W/sample.log" && [ "$(grep -c 'val loss' "$W/sample.log")" = 3 ]
say $? "sampling and validation run under ep 2 x tp 2 + sp"
$MPIRUN -np 4 "$BIN/train_gpt" -e "L=4,C=64,NH=4,V=256,maxT=64,E=4,k=1,every=2" -t 32 -b 1 -d 128 -x 4 -v 2 -m 2 -s 2 -g 8 --pp 2 --ep 2 \
    --comm-report >"$W/sample_pp.log" 2>&1
[ $? = 0 ] && grep -q "generating:" "$W/sample_pp.log" && grep -q "pipeline bubble" "$W/sample_pp.log"
say $? "training, sampling and the bubble report run under pp 2 x ep 2 (top-1, every 2nd layer MoE)"
$MPIRUN -np 4 "$BIN/train_gpt" -e "$MOE" -t 32 -b 2 -x 4 -v 2 -m 2 -s 2 -g 8 --cp 2 --ep 2 >"$W/sample_cp.log" 2>&1
[ $? = 0 ] && grep -q "generating:" "$W/sample_cp.log" && [ "$(grep -c 'val loss' "$W/sample_cp.log")" = 3 ] && grep -q "edp 2" "$W/sample_cp.log"
say $? "training, sampling and validation run under cp 2 x ep 2 (the experts' gradients summed over edp = dp/ep x cp = 2)"

# 4. sparse upcycling: a dense checkpoint with --experts 4 --topk 4 (every expert a copy of the MLP,
#    gates summing to 1) computes the dense model: the same first loss up to rounding (the gates sum to
#    1 within a few ulps, the experts' GEMMs run on other row counts, which may change a BLAS kernel's
#    summation order): within test_gpt.cu's LOSS tolerance, 1e-5 relative
"$BIN/train_gpt" -e "$TINY" -t 32 -b 4 -x 2 -n 2 -v 0 -s 0 -o "$W/dense" >/dev/null 2>&1
"$BIN/train_gpt" -e "$W/dense/model_00000002.bin" -t 32 -b 4 -x 1 -v 0 -s 0 -o "$W/dense_next" >/dev/null 2>&1
"$BIN/train_gpt" -e "$W/dense/model_00000002.bin" -t 32 -b 4 -x 1 -v 0 -s 0 --experts 4 --topk 4 --z-coeff 0 -o "$W/upcycled" >"$W/upcycled.log" 2>&1
a=$(awk -F'trl:' '/trl:/ { print $2; exit }' "$W/dense_next/main.log"); b=$(awk -F'trl:' '/trl:/ { print $2; exit }' "$W/upcycled/main.log")
grep -q "upcycled to 4 experts" "$W/upcycled.log" && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }'
say $? "sparse upcycling (E 4, k 4): first loss $b equals the dense model's $a (1e-5 relative)"

# 5. sigmoid scores + loss-free balancing through main() under cp 2 x ep 2 (4 ranks): a load line per MoE layer
#    and step whose counts sum to the step's assignments (128 tokens x k 2); 10 steps straight = 6 + checkpoint
#    + resume, every main.log line (the loads decide the bias, the bias the routing); the checkpoint is a
#    version-23 file with sigmoid scores and a bias moved by the rate; it loads as a model (-e) and trains
common=(-e "$MOE" -t 32 -b 2 -v 0 -s 0 -l 3e-3 --cp 2 --ep 2 --router-score sigmoid --moe-bias-rate 0.01)
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 10 -o "$W/sig_full" >"$W/sig_full.log" 2>&1
say $? "sigmoid scores + --moe-bias-rate train under cp 2 x ep 2"
n=$(awk '/^s:[0-9]+ moe[01]:max\/mean [0-9.]+ min\/mean [0-9.]+ drop [0-9.]+ dead [0-9]+ load [0-9,]+$/ { split($NF, c, ","); t = 0; for (i in c) t += c[i]; if (t == 256 && length(c) == 4) n++ } END { print n + 0 }' "$W/sig_full/main.log")
[ "$n" = 20 ]; say $? "main.log has a load line per MoE layer and step, 4 counts summing to 256 (got $n of 20)"
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 6 -n 3 -o "$W/sig_ckpt" >/dev/null 2>&1
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 10 -y 1 -o "$W/sig_ckpt" >/dev/null 2>&1
cmp -s "$W/sig_full/main.log" "$W/sig_ckpt/main.log"
say $? "sigmoid + balancing: the resumed main.log (losses, loads) equals the uninterrupted one"
hdr=$(python3 -c "
import struct, sys
b = open(sys.argv[1], 'rb').read(); h = struct.unpack('<12i', b[:48])
bias = struct.unpack('<8f', b[-32:])
print(h[1], h[11], sum(1 for x in bias if x != 0.0), all(abs(round(x / 0.01) * 0.01 - x) < 1e-6 for x in bias))" "$W/sig_ckpt/model_00000006.bin")
set -- $hdr
[ "$1" = 23 ] && [ "$2" = 1 ] && [ "$3" -gt 0 ] && [ "$4" = True ]
say $? "the checkpoint is version 23, sigmoid scores, its bias moved in steps of the rate (got: $hdr)"
"$BIN/train_gpt" -e "$W/sig_ckpt/model_00000010.bin" -t 32 -b 4 -x 2 -v 2 -m 2 -s 2 -g 8 >"$W/sig_load.log" 2>&1
[ $? = 0 ] && grep -q "top-2 of sigmoid scores" "$W/sig_load.log" && grep -q "generating:" "$W/sig_load.log"
say $? "the version-23 file loads as a model (sigmoid scores kept), trains, validates and samples"

# 6. fine-grained (H = C) and shared experts (S = 1) through main() under tp 2 + sp x ep 2: 6 steps straight =
#    3 + checkpoint + resume; the checkpoint is version 23 with S 1 and H 64 in its header
FG="$TINY,E=8,k=2,H=64,S=1"
common=(-e "$FG" -t 32 -b 2 -v 0 -s 0 -l 3e-3 --tp 2 --sp --ep 2)
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 6 -o "$W/fg_full" >"$W/fg_full.log" 2>&1
[ $? = 0 ] && grep -q "8 experts of width 64 + 1 shared, top-2" "$W/fg_full.log"
say $? "fine-grained + shared experts train under tp 2 + sp x ep 2 (the start-up line states width and shared)"
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 3 -n 3 -o "$W/fg_ckpt" >/dev/null 2>&1
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 6 -y 1 -o "$W/fg_ckpt" >/dev/null 2>&1
cmp -s "$W/fg_full/main.log" "$W/fg_ckpt/main.log"
say $? "fine-grained + shared: the resumed main.log equals the uninterrupted one"
hdr=$(python3 -c "import struct,sys; h=struct.unpack('<14i', open(sys.argv[1],'rb').read(56)); print(h[1], h[11], h[12], h[13])" "$W/fg_ckpt/model_00000003.bin")
[ "$hdr" = "23 0 1 64" ]; say $? "the checkpoint is version 23: softmax scores, S 1, H 64 (got $hdr)"

# 7. MoE on the Llama body (OLMoE-like: QK-norm, gates not renormalised; H = 4C, softmax, no shared experts: the
#    shape a GPT-2 MoE file would store without the bias) through main() under ep 2 x tp 2 + sp: 6 steps straight =
#    3 + checkpoint + resume; the checkpoint is a family file (version 33) with its bias, and loads as a model
LM="arch=llama,L=2,C=64,NH=4,KV=2,V=250,maxT=64,E=4,k=2,H=256,topknorm=0,qknorm=1"
common=(-e "$LM" -t 32 -b 2 -v 0 -s 0 -l 3e-3 --tp 2 --sp --ep 2 --capacity-factor 0)
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 6 -o "$W/lm_full" >"$W/lm_full.log" 2>&1
[ $? = 0 ] && grep -q "QK-norm" "$W/lm_full.log" && grep -q "top-2 of softmax scores (not renormalised)" "$W/lm_full.log"
say $? "a Llama MoE model (QK-norm, gates not renormalised, dropless) trains under ep 2 x tp 2 + sp"
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 3 -n 3 -o "$W/lm_ckpt" >/dev/null 2>&1
$MPIRUN -np 4 "$BIN/train_gpt" "${common[@]}" -x 6 -y 1 -o "$W/lm_ckpt" >/dev/null 2>&1
cmp -s "$W/lm_full/main.log" "$W/lm_ckpt/main.log"
say $? "Llama MoE: the resumed main.log equals the uninterrupted one"
hdr=$(python3 -c "import struct,sys; h=struct.unpack('<29i', open(sys.argv[1],'rb').read(116)); print(h[1], h[8], h[13], h[26], h[28])" "$W/lm_ckpt/model_00000003.bin")
[ "$hdr" = "33 4 256 0 1" ]; say $? "the checkpoint is a family file: version 33, E 4, H 256, norm_topk 0, qk_norm 1 (got $hdr)"
"$BIN/train_gpt" -e "$W/lm_ckpt/model_00000006.bin" -t 32 -b 2 -x 1 -v 0 -s 0 >"$W/lm_load.log" 2>&1
[ $? = 0 ] && grep -q "^step    1/1" "$W/lm_load.log"; say $? "the Llama MoE checkpoint loads as a model and trains"
