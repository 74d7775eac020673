#!/usr/bin/env bash
# Bad input: each case must exit non-zero with one "error: ..." line naming the thing, within a
# timeout (no hang of the other ranks), and leave nothing in the output dir.
# Usage: bash scripts/test_bad_input.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
PY=python3
TINY="L=2,C=64,NH=4,V=250,maxT=64"

# files: a good tiny model and data shard, and broken variants of them
$PY - "$W" <<'EOF'
import struct, sys, os
w = sys.argv[1]
def header(magic, version, vals):
    h = [0] * 256; h[0] = magic; h[1] = version
    for i, v in enumerate(vals): h[2 + i] = v
    return struct.pack("<256i", *h)
L, C, NH, V, Vp, maxT = 2, 64, 4, 250, 256, 64
P = Vp*C + maxT*C + L*(2*C + 3*C*C + 3*C + C*C + C + 2*C + 4*C*C + 4*C + 4*C*C + C) + 2*C
body = struct.pack("<%df" % P, *([0.01] * P))
def write(name, data):
    open(os.path.join(w, name), "wb").write(data)
write("model_ok.bin", header(20240326, 3, [maxT, V, L, NH, C, Vp]) + body)
write("model_magic.bin", header(12345, 3, [maxT, V, L, NH, C, Vp]) + body)
write("model_version.bin", header(20240326, 7, [maxT, V, L, NH, C, Vp]) + body)
write("model_trunc.bin", header(20240326, 3, [maxT, V, L, NH, C, Vp]) + body[: len(body) // 2])
write("model_header.bin", header(20240326, 3, [maxT, V, L + 1, NH, C, Vp]) + body)
write("model_nh.bin", header(20240326, 3, [maxT, V, L, 3, C, Vp]) + body)
vals = [0.01] * P; vals[Vp * C + 7] = float("nan")   # wpe[7]
write("model_nan.bin", header(20240326, 3, [maxT, V, L, NH, C, Vp]) + struct.pack("<%df" % P, *vals))
vals = [0.01] * P; vals[3] = float("inf")            # wte[3]
write("model_inf.bin", header(20240326, 3, [maxT, V, L, NH, C, Vp]) + struct.pack("<%df" % P, *vals))
# MoE files (version 13): E 4, k 2, every 1; the dense MLP tensors hold no layer, the MoE tensors follow
E, k = 4, 2
Pm = Vp*C + maxT*C + L*(2*C + 3*C*C + 3*C + C*C + C + 2*C) + 2*C + L*E*(C + 4*C*C + 4*C + 4*C*C + C)
mbody = struct.pack("<%df" % Pm, *([0.01] * Pm))
write("moe_ok.bin", header(20240326, 13, [maxT, V, L, NH, C, Vp, E, k, 1]) + mbody)
write("moe_k.bin", header(20240326, 13, [maxT, V, L, NH, C, Vp, E, 5, 1]) + mbody)
write("moe_noexperts.bin", header(20240326, 13, [maxT, V, L, NH, C, Vp, 0, 0, 0]) + body)
write("moe_size.bin", header(20240326, 13, [maxT, V, L, NH, C, Vp, E, k, 1]) + body)
# version 23: the router's scores in slot 11 (1 sigmoid), S in 12, H in 13, the routing bias (L, E) fp32 after the tensors
zb = struct.pack("<%df" % (L * E), *([0.0] * (L * E)))
write("moe_sig.bin", header(20240326, 23, [maxT, V, L, NH, C, Vp, E, k, 1, 1, 0, 4 * C]) + mbody + zb)
write("moe_score.bin", header(20240326, 23, [maxT, V, L, NH, C, Vp, E, k, 1, 2, 0, 4 * C]) + mbody + zb)
nb = [0.0] * (L * E); nb[5] = float("nan")
write("moe_bias_nan.bin", header(20240326, 23, [maxT, V, L, NH, C, Vp, E, k, 1, 1, 0, 4 * C]) + mbody + struct.pack("<%df" % (L * E), *nb))
write("moe_bias_short.bin", header(20240326, 23, [maxT, V, L, NH, C, Vp, E, k, 1, 1, 0, 4 * C]) + mbody)
toks = [i % 200 for i in range(4097)]
write("data_ok.bin", header(20240520, 1, [len(toks)]) + struct.pack("<%dH" % len(toks), *toks))
write("data_magic.bin", header(1234, 1, [len(toks)]) + struct.pack("<%dH" % len(toks), *toks))
write("data_trunc.bin", header(20240520, 1, [len(toks)]) + struct.pack("<%dH" % 100, *toks[:100]))
bad = list(toks); bad[777] = 300
write("data_vocab.bin", header(20240520, 1, [len(bad)]) + struct.pack("<%dH" % len(bad), *bad))
EOF
touch "$W/not_a_dir"
mkdir -p "$W/empty_ckpt"

# expect NAME NP "EXPECTED TEXT" ARGS... : runs train_gpt with -o $W/out_NAME unless ARGS have one
expect() {
    local name=$1 np=$2 text=$3; shift 3
    local out="$W/out_$name"
    rm -rf "$out"
    local launch="$MPIRUN -np $np" o=(-o "$out")
    [ "$np" = 1 ] && launch=""          # a single process runs without mpirun (MPI singleton)
    for a in "$@"; do [ "$a" = -o ] && o=(); done   # the case names its own output dir
    timeout 60 $launch "$BIN/train_gpt" "${o[@]}" -s 0 -v 0 "$@" >"$W/$name.log" 2>&1
    local rc=$?
    local first
    first=$(grep -m1 '^error: ' "$W/$name.log")
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
        echo "FAIL $name: exit $rc (expected an error)"; tail -n 3 "$W/$name.log"; return
    fi
    if [ -z "$first" ] || ! grep -qF -- "$text" <<<"$first"; then
        echo "FAIL $name: no 'error: ...$text...' line"; head -n 3 "$W/$name.log"; return
    fi
    if [ -d "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
        echo "FAIL $name: wrote files: $(ls "$out")"; return
    fi
    echo "ok   $name: $first"
}

M="$W/model_ok.bin"
DOK="$W/data_ok.bin"
expect unknown_flag     1 "unknown flag '--bogus'"            -e "$TINY" --bogus 3
expect missing_value    1 "missing its value"                 -e "$TINY" -b
expect not_a_number     1 "-b expects an integer"             -e "$TINY" -b four
expect out_of_range     1 "--zero must be in"                 -e "$TINY" --zero 4
expect comm_streams     1 "--comm-streams must be in [0, 1]"  -e "$TINY" --comm-streams 2
expect bad_float        1 "-l expects a number"               -e "$TINY" -l 1e-3x
expect bad_scheduler    1 "-k expects"                        -e "$TINY" -k triangle
expect bad_descriptor   1 "malformed model descriptor"        -e "L=2,C=64,NH=5,V=250"
expect model_missing    1 "cannot open file"                  -e "$W/nope.bin"
expect model_magic      1 "bad magic"                         -e "$W/model_magic.bin"
expect model_version    1 "version 7"                         -e "$W/model_version.bin"
expect model_truncated  1 "bytes, expected"                   -e "$W/model_trunc.bin"
expect model_header     1 "bytes, expected"                   -e "$W/model_header.bin"
expect model_heads      1 "inconsistent header"               -e "$W/model_nh.bin"
expect data_magic       1 "bad magic"                         -e "$M" -i "$W/data_magic.bin" -t 32
expect data_truncated   1 "truncated or corrupt"              -e "$M" -i "$W/data_trunc.bin" -t 32
expect data_vocab       1 "token 300 at position 777"         -e "$M" -i "$W/data_vocab.bin" -t 32
expect data_no_match    1 "no files match"                    -e "$M" -i "$W/nothing_*.bin" -t 32
expect batch_divides    1 "is not a multiple of B*T*dp"       -e "$M" -i "$DOK" -b 4 -t 32 -d 1000
expect t_too_long       1 "larger than the model's maximum"   -e "$M" -i "$DOK" -t 128
expect unwritable_out   1 "not a writable directory"          -e "$M" -i "$DOK" -t 32 -o "$W/not_a_dir/sub"
expect nothing_resume   1 "nothing to resume"                 -e "$M" -i "$DOK" -t 32 -y 1 -o "$W/empty_ckpt"
expect world_size       3 "not divisible by tp*cp*pp"            -e "$TINY" --tp 2
expect tp_heads         3 "does not divide the number of heads" -e "$TINY" --tp 3
expect sp_tokens        2 "does not divide T"                 -e "$TINY" --tp 2 --sp -t 31
expect pp_too_deep      3 "--pp 3 is larger than the number of layers 2" -e "$TINY" --pp 3
expect pp_schedule      1 "--pp-schedule expects 1f1b, gpipe, interleaved or zb" -e "$TINY" --pp-schedule zb2
expect vpp_microbatches 2 "to be a multiple of --pp 2"        -e "$TINY" --pp 2 --vpp 2 -b 2 -t 32 -d 192
expect vpp_no_pipeline  1 "needs a pipeline (--pp >= 2)"      -e "$TINY" --vpp 2
expect vpp_layers       2 "--pp 2 x --vpp 2 = 4 model chunks, more than the 2 layers" -e "$TINY" --pp 2 --vpp 2 -t 32 -d 256
expect vpp_missing      1 "--pp-schedule interleaved needs --vpp" -e "$TINY" --pp-schedule interleaved
expect vpp_schedule     1 "--vpp 2 is the interleaved schedule, not --pp-schedule gpipe" -e "$TINY" --vpp 2 --pp-schedule gpipe
expect vpp_zb           1 "--vpp 2 is the interleaved schedule, not --pp-schedule zb" -e "$TINY" --vpp 2 --pp-schedule zb
expect pp_layers_sum    2 "--pp-layers '2,1': the counts sum to 3, the model has 2 layers" -e "$TINY" --pp 2 --pp-layers 2,1
expect pp_layers_zero   2 "--pp-layers '0,2': expected 2 layer counts (pp x vpp), each >= 1" -e "$TINY" --pp 2 --pp-layers 0,2
expect pp_layers_count  2 "--pp-layers '1,1,0': expected 2 layer counts" -e "$TINY" --pp 2 --pp-layers 1,1,0
expect pp_layers_text   2 "--pp-layers 'even': expected 2 layer counts" -e "$TINY" --pp 2 --pp-layers even
expect pp_layers_no_pp  1 "--pp-layers '1,1' needs a pipeline (--pp >= 2)" -e "$TINY" --pp-layers 1,1
printf 'model 2 64 4 256 0\nembedding 0.1\nhead 0.5\nlayer 0 0.2\n' >"$W/costs_short.txt"   # (layer 1 missing)
printf 'model 4 64 4 256 0\n' >"$W/costs_other.txt"
expect pp_costs_missing 2 "--pp-layers auto:$W/nothing.txt: cannot read the file" -e "$TINY" --pp 2 --pp-layers "auto:$W/nothing.txt"
expect pp_costs_short   2 "expected the lines 'model L C NH Vp E', 'embedding S', 'head S' and 'layer I S' for each of the 2 layers" -e "$TINY" --pp 2 --pp-layers "auto:$W/costs_short.txt"
expect pp_costs_model   2 "measured for L 4 C 64 NH 4 Vp 256 E 0, this model is L 2" -e "$TINY" --pp 2 --pp-layers "auto:$W/costs_other.txt"
# each line whole: a value that is not a finite number, a word after it, a number with junk
good_costs='model 2 64 4 256 0\nembedding 0.1\nhead 0.5\nlayer 0 0.2\nlayer 1 0.2\n'
printf "${good_costs/head 0.5/head inf}" >"$W/costs_inf.txt"; printf "${good_costs/head 0.5/head 1junk}" >"$W/costs_junk.txt"
printf "${good_costs/layer 0 0.2/layer 0 1x}" >"$W/costs_1x.txt"; printf "${good_costs/embedding 0.1/embedding 0.1 7}" >"$W/costs_trail.txt"
expect pp_costs_inf     2 "(line 3: 'head inf')"                -e "$TINY" --pp 2 --pp-layers "auto:$W/costs_inf.txt"
expect pp_costs_junk    2 "(line 3: 'head 1junk')"              -e "$TINY" --pp 2 --pp-layers "auto:$W/costs_junk.txt"
expect pp_costs_1x      2 "(line 4: 'layer 0 1x')"              -e "$TINY" --pp 2 --pp-layers "auto:$W/costs_1x.txt"
expect pp_costs_trail   2 "(line 2: 'embedding 0.1 7')"         -e "$TINY" --pp 2 --pp-layers "auto:$W/costs_trail.txt"
expect dp_mismatch      2 "--dp 4 does not match"             -e "$TINY" --dp 4
expect plan_precision   1 "--plan-precision expects bf16 or fp32" -e "$TINY" --plan 2 --plan-precision fp8
expect memory_limit     1 "--memory-limit expects a size such as 80G" -e "$TINY" --memory-limit 80Q
expect plan_layout      1 "world size 3 is not divisible by tp*cp*pp = 2*1*1" -e "$TINY" --plan 3 --tp 2
expect cp_world         3 "not divisible by tp*cp*pp = 1*2*1"  -e "$TINY" --cp 2
expect cp_chunks        2 "T = 34 is not a multiple of 2*cp = 4" -e "$TINY" --cp 2 -t 34
# cp's kinds (--cp-kind ring|ulysses|hybrid, --cp-ulysses U): a head shard is whole heads of the tp rank's (its kv
# heads too: U divides them, or they divide U), U only for the hybrid, with no default, strictly between 1 and cp
# and dividing it; the chunks as the ring's
H6="L=2,C=96,NH=6,V=250,maxT=64"
expect cp_kind_bad      1 "--cp-kind expects ring, ulysses or hybrid, got 'tree'" -e "$TINY" --cp-kind tree
expect cp_kind_no_cp    1 "--cp-kind ulysses: context parallelism needs --cp N >= 2" -e "$TINY" --cp-kind ulysses
expect cp_uly_heads     4 "--cp-kind ulysses: --cp 4 does not divide the 6 query heads per tp rank (NH 6 / --tp 1)" -e "$H6" --cp 4 --cp-kind ulysses -t 32
expect cp_uly_kv_heads  4 "--cp-kind ulysses: --cp 4 and the 3 kv heads per tp rank (KV 3 / --tp 1) do not divide one another" -e "arch=llama,L=2,C=96,NH=12,KV=3,V=250,maxT=64" --cp 4 --cp-kind ulysses -t 32
expect cp_hybrid_heads  1 "--cp-kind hybrid: --cp-ulysses 2 does not divide the 3 query heads per tp rank (NH 6 / --tp 2)" -e "$H6" --plan 8 --tp 2 --cp 4 --cp-kind hybrid --cp-ulysses 2 -t 32
expect cp_ulysses_ring  2 "--cp-ulysses 2 is the hybrid's all-to-all group size: it needs --cp-kind hybrid (not ring)" -e "$TINY" --cp 2 --cp-ulysses 2
expect cp_ulysses_uly   2 "--cp-ulysses 2 is the hybrid's all-to-all group size: it needs --cp-kind hybrid (not ulysses)" -e "$TINY" --cp 2 --cp-kind ulysses --cp-ulysses 2
expect cp_hybrid_no_u   4 "--cp-kind hybrid needs --cp-ulysses U (the all-to-all groups' size, 1 < U < cp dividing --cp 4; no default)" -e "$TINY" --cp 4 --cp-kind hybrid
expect cp_hybrid_u_cp   4 "--cp-ulysses 4 must be strictly between 1 and --cp 4 and divide it" -e "$TINY" --cp 4 --cp-kind hybrid --cp-ulysses 4
expect cp_hybrid_u_1    4 "--cp-ulysses 1 must be strictly between 1 and --cp 4 and divide it" -e "$TINY" --cp 4 --cp-kind hybrid --cp-ulysses 1
expect cp_hybrid_u_div  1 "--cp-ulysses 4 must be strictly between 1 and --cp 6 and divide it" -e "$TINY" --plan 6 --cp 6 --cp-kind hybrid --cp-ulysses 4 -t 48
expect cp_uly_chunks    2 "T = 34 is not a multiple of 2*cp = 4" -e "$TINY" --cp 2 --cp-kind ulysses -t 34
expect cp_hybrid_chunks 4 "T = 36 is not a multiple of 2*cp = 8" -e "$TINY" --cp 4 --cp-kind hybrid --cp-ulysses 2 -t 36
expect flag_twice       1 "flag -b is given twice"            -e "$TINY" -b 4 -t 32 -b 2
expect val_without_train 1 "-j needs -i"                      -e "$TINY" -t 32 -j "$DOK"
expect huge_descriptor  1 "out of host memory"                -e d128
expect bad_big_config   1 "malformed model descriptor"        -e "L=4,C=65536,NH=4"
expect batch_overflow   1 "too large"                         -e "L=1,C=64,NH=4,V=250,maxT=4096" -t 4096 -b 1048576
expect zero_t           1 "-t must be in"                     -e "$TINY" -t 0
expect negative_steps   1 "-x must be in"                     -e "$TINY" -x -5
# non-finite weights, paths, repeated flags
expect model_nan        1 "model_nan.bin: wpe[7] is nan, not a finite number" -e "$W/model_nan.bin"
expect model_inf        1 "model_inf.bin: wte[3] is inf, not a finite number" -e "$W/model_inf.bin"
expect empty_out        1 "-o expects a directory, got '' (an unset variable?)" -e "$TINY" -o ""
expect long_out         1 "bytes long, at most 4032"           -e "$TINY" -o "$W/$(printf 'a%.0s' $(seq 1 4980))"
expect zero_alias_twice 1 "flag --zero is given twice (or under its alias)" -e "$TINY" -z 1 --zero 2
expect tp_alias_twice   1 "flag --tp is given twice (or under its alias)"   -e "$TINY" --tp 1 --tensor-model-parallel-size 2
expect desc_key_twice   1 "malformed model descriptor"        -e "L=2,L=3,C=64,NH=4"
# sampling and retention
expect top_k_zero       1 "--sample-top-k must be in [1,"      -e "$TINY" --sample-top-k 0
expect temperature_neg  1 "--sample-temperature must be in [0," -e "$TINY" --sample-temperature -1
expect prompt_id_range  1 "--prompt-ids '3,999': expected token ids 0..249" -e "$TINY" --prompt-ids 3,999
expect prompt_id_syntax 1 "--prompt-ids '3;4': expected token ids" -e "$TINY" --prompt-ids "3;4"
expect prompt_text      1 "--prompt TEXT needs a byte model (V 257), this one has V 250" -e "$TINY" --prompt "First Citizen:"
expect prompt_both      1 "--prompt-ids and --prompt: give one of them" -e "$TINY" --prompt-ids 3 --prompt x
expect keep_negative    1 "-nk must be in [0,"                 -e "$TINY" -nk -1
expect val_zero         1 "-m must be -1 (the whole val set) or at least 1, got 0" -e "$TINY" -m 0
# Mixture of Experts
MOE="$TINY,E=4,k=2"
expect moe_ep_experts   3 "--ep 3 does not divide the number of experts 4" -e "$MOE" --ep 3
expect moe_ep_dp        2 "--ep 4 does not divide dp 2"       -e "$MOE" --ep 4
expect moe_ep_dense     2 "expert parallelism needs MoE layers" -e "$TINY" --ep 2
expect moe_k_large      1 "need 1 <= k <= E"                  -e "$TINY" --experts 2 --topk 3
expect moe_k_zero       1 "--topk must be in"                 -e "$TINY" --experts 2 --topk 0
expect moe_k_desc       1 "malformed model descriptor"        -e "$TINY,E=2,k=3"
expect moe_k_alone      1 "--topk, --moe-every, --expert-hidden and --shared-experts need --experts" -e "$TINY" --topk 2
expect moe_negative_F   1 "--capacity-factor must be in"      -e "$MOE" --capacity-factor -1
expect moe_F_decimals   1 "has more than 3 decimals"          -e "$MOE" --capacity-factor 1.2345
expect moe_policy       1 "--drop-policy expects probs or position" -e "$MOE" --drop-policy random
expect moe_every_deep   1 "1 <= every <= L"                   -e "$TINY" --experts 2 --moe-every 3
expect moe_alias_twice  1 "flag --experts is given twice"     -e "$TINY" --experts 2 --num-experts 2
expect moe_flag_vs_file 1 "--experts 8, but"                  -e "$W/moe_ok.bin" --experts 8
expect moe_header_k     1 "inconsistent header"               -e "$W/moe_k.bin"
expect moe_no_experts   1 "MoE file (version 13) with 0 experts" -e "$W/moe_noexperts.bin"
expect moe_file_size    1 "bytes, expected"                   -e "$W/moe_size.bin"
# router scores and loss-free balancing (moe.h)
expect moe_score_k1     1 "sigmoid router scores with top-1"  -e "$TINY,E=4" --router-score sigmoid
expect moe_score_z      1 "--z-coeff 0.001 with sigmoid router scores" -e "$MOE" --router-score sigmoid --z-coeff 0.001
expect moe_score_file   1 "--router-score sigmoid, but"       -e "$W/moe_ok.bin" --router-score sigmoid
expect moe_score_file2  1 "--router-score softmax, but"       -e "$W/moe_sig.bin" --router-score softmax
expect moe_score_dense  1 "--router-score sigmoid needs MoE layers" -e "$TINY" --router-score sigmoid
expect moe_score_bad    1 "--router-score expects softmax or sigmoid" -e "$MOE" --router-score tanh
expect moe_score_slot   1 "router scores 2 in header slot 11" -e "$W/moe_score.bin"
expect moe_bias_dense   1 "--moe-bias-rate 0.001 needs MoE layers" -e "$TINY" --moe-bias-rate 0.001
expect moe_bias_negative 1 "--moe-bias-rate must be in"       -e "$MOE" --moe-bias-rate -0.1
expect moe_bias_nan     1 "the routing bias [5]"              -e "$W/moe_bias_nan.bin"
expect moe_bias_short   1 "bytes, expected"                   -e "$W/moe_bias_short.bin"
# fine-grained and shared experts
expect moe_H_tp         2 "--tp 2 does not divide the experts' hidden width H = 33" -e "$MOE,H=33" --tp 2
expect moe_S_range      1 "--shared-experts must be in"       -e "$TINY" --experts 4 --shared-experts 65
expect moe_H_upcycle    1 "upcycling makes each expert a copy" -e "$W/model_ok.bin" --experts 4 --expert-hidden 64
expect moe_S_upcycle    1 "upcycling makes each expert a copy" -e "$W/model_ok.bin" --experts 4 --shared-experts 1
expect moe_H_desc       1 "malformed model descriptor"        -e "$TINY,H=64"
expect moe_S_vs_file    1 "--shared-experts 1, but"           -e "$W/moe_ok.bin" --shared-experts 1
# the Llama family: the shape's rules, the layout's, and MoE (not yet on a Llama body)
LL="arch=llama,L=2,C=64,NH=4,V=250,maxT=64"
expect llama_kv_divides 1 "(NH must be a multiple of KV >= 1)"  -e "$LL,KV=3"
expect llama_odd_head   1 "(RoPE needs an even head size C/NH)" -e "arch=llama,L=2,C=60,NH=4,V=250,maxT=64"
expect llama_theta      1 "(theta=0: expected a positive number from 1e-30 to 1e12)" -e "$LL,theta=0"
expect llama_eps        1 "(eps=-1: expected a positive number from 1e-30 to 1e12)" -e "$LL,eps=-1"
# values past a bound name the bound (reliability, fourth round: they said "a whole, positive number")
expect desc_maxT_big    1 "(maxT=1073741824: expected a whole number from 1 to 1048576)" -e "L=2,C=64,NH=4,V=250,maxT=1073741824"
expect desc_V_big       1 "(V=2147483647: expected a whole number from 1 to 1048576)" -e "L=2,C=64,NH=4,V=2147483647,maxT=64"
expect llama_eps_small  1 "(eps=1e-50: expected a positive number from 1e-30 to 1e12)" -e "$LL,eps=1e-50"
expect llama_theta_big  1 "(theta=1e40: expected a positive number from 1e-30 to 1e12)" -e "$LL,theta=1e40"
expect llama_pad_V      1 "(the padding token must be -1 (none) or below V)" -e "$LL,pad=250"
expect llama_pad_gpt2   1 "need arch=llama)"                    -e "$TINY,pad=1"
expect llama_arch       1 "(arch=mamba: expected llama or gpt2)" -e "arch=mamba,L=2,C=64,NH=4"
expect llama_keys_gpt2  1 "(KV, F, theta, eps, tied, qkvbias, topknorm, sgate, qknorm and pad need arch=llama)" -e "$TINY,KV=2"
expect llama_qknorm_gpt2 1 "need arch=llama)"                   -e "$TINY,qknorm=1"
expect llama_tp_kv      2 "--tp 2 does not divide the number of key/value heads KV = 1" -e "$LL,KV=1" --tp 2
expect llama_tp_F       2 "--tp 2 does not divide the MLP's hidden width F = 5" -e "$LL,KV=2,F=5" --tp 2
# MoE on the Llama body (Mixtral, OLMoE, Qwen2-MoE): the same rules as GPT-2's MoE, and its own keys'
expect llama_moe_k      1 "need 1 <= k <= E"                   -e "$LL,E=2,k=3"
expect llama_moe_H_tp   2 "--tp 2 does not divide the experts' hidden width H = 33" -e "$LL,E=4,k=2,H=33" --tp 2
expect llama_sgate_noS  1 "(a shared experts' gate (sgate=1) needs shared experts (S > 0))" -e "$LL,E=4,k=2,sgate=1"
expect llama_topknorm   1 "(topknorm, sgate and qknorm are 0 or 1)" -e "$LL,E=4,k=2,topknorm=2"
$BIN/train_gpt -e "$LL" -t 32 -b 2 -x 1 -n 1 -s 0 -v 0 -o "$W/llama_run" >/dev/null 2>&1   # (a dense Llama file)
expect llama_H_upcycle  1 "upcycling makes each expert a copy" -e "$W/llama_run/model_00000001.bin" --experts 4 --expert-hidden 32
# a key the descriptor names and a flag that disagrees: an error; a key it leaves out takes the flag's value, and
# the flag table's example (S=0 among its keys) is a descriptor
expect moe_H_named_flag 1 "--expert-hidden 64, but the descriptor has H = 256" -e "$MOE,H=256" --expert-hidden 64
expect moe_k_unnamed    1 "with --topk 9"                      -e "$TINY,E=8" --topk 9
for d in "$TINY,E=8,k=2 --expert-hidden 64" "L=4,C=64,NH=4,V=250,maxT=64,Vp=256,E=8,k=2,every=1,H=256,S=0" \
         "$LL,E=8,k=2,H=32,topknorm=0,qknorm=1" "$LL,KV=2,E=4,k=2,H=32,S=2,sgate=1,every=2,topknorm=0"; do
    timeout 60 "$BIN/train_gpt" -e $d -x 1 -b 2 -t 32 -s 0 -v 0 >"$W/desc_ok.log" 2>&1
    if [ $? -eq 0 ] && grep -q "^step    1/1" "$W/desc_ok.log"; then echo "ok   descriptor -e $d trains"
    else echo "FAIL descriptor -e $d: $(grep -m1 '^error' "$W/desc_ok.log")"; fi
done
expect moe_H_alone      1 "need --experts E"                  -e "$TINY" --expert-hidden 64
$BIN/train_gpt -e "$MOE" -t 32 -b 4 -x 2 -n 2 -s 0 -v 0 -o "$W/ckpt_moe" >/dev/null 2>&1
expect moe_resume_E     1 "a checkpoint resumes with its own shape" -e "$MOE" -t 32 -b 4 -x 4 -y 1 --experts 8 -o "$W/ckpt_moe"
expect moe_resume_k     1 "--topk 1, but the checkpoint has k = 2" -e "$MOE" -t 32 -b 4 -x 4 -y 1 --topk 1 -o "$W/ckpt_moe"
# the cost model's machine file (--machine): one line of key=value each
printf 'flops=1e12\nflopz=3\n' >"$W/machine_key.txt"; printf 'net_bw=-4e9\n' >"$W/machine_value.txt"
printf 'flops 1e12\n' >"$W/machine_syntax.txt"; printf 'node_bw_3=1e9\n' >"$W/machine_size.txt"
expect machine_missing  1 "--machine $W/nope.txt: cannot open it" -e "$TINY" --plan-search 4 --machine "$W/nope.txt"
expect machine_key      1 "line 2: unknown key 'flopz'"      -e "$TINY" --plan-search 4 --machine "$W/machine_key.txt"
expect machine_value    1 "net_bw = -4e+09 must be in [1, 1e+30]" -e "$TINY" --plan-search 4 --machine "$W/machine_value.txt"
expect machine_syntax   1 "line 1: expected key=value"       -e "$TINY" -x 1 --machine "$W/machine_syntax.txt"
expect machine_size     1 "'node_bw_3': the group size after node_bw_ must be 2, 4, ... or 128" -e "$TINY" --plan-search 4 --machine "$W/machine_size.txt"
printf 'overlap=1.5\n' >"$W/machine_overlap.txt"; printf 'flops_100=1e9\n' >"$W/machine_rows.txt"
expect machine_overlap  1 "overlap = 1.5 must be in [0, 1]"  -e "$TINY" --plan-search 4 --machine "$W/machine_overlap.txt"
expect machine_rows     1 "'flops_100': the rows after flops_ must be 1, 2, 4, ... or 65536" -e "$TINY" --plan-search 4 --machine "$W/machine_rows.txt"
# every value parsed whole, finite, in its key's range (values that made the model print -nan or overflow before)
printf 'cores=1e308\nflops=1e-308\n' >"$W/machine_huge.txt"; printf 'gpus_per_node=1e12\n' >"$W/machine_gpn.txt"
printf 'flops=inf\n' >"$W/machine_inf.txt"; printf 'flops=1e12abc\n' >"$W/machine_junk.txt"
printf 'flops=1e12 2\n' >"$W/machine_trail.txt"; printf 'gpus_per_node=2.5\n' >"$W/machine_frac.txt"
expect machine_huge     1 "line 1: cores = 1e+308 must be in [0, 1.04858e+06]" -e "$TINY" --plan-search 4 --machine "$W/machine_huge.txt"
expect machine_gpn      1 "line 1: gpus_per_node = 1e+12 must be in [1, 1.04858e+06]" -e "$TINY" --plan-search 4 --machine "$W/machine_gpn.txt"
expect machine_inf      1 "line 1: flops = 'inf' is not a finite number" -e "$TINY" --plan-search 4 --machine "$W/machine_inf.txt"
expect machine_junk     1 "line 1: flops = '1e12abc' is not a finite number" -e "$TINY" --plan-search 4 --machine "$W/machine_junk.txt"
expect machine_trail    1 "line 1: expected key=value (a number), got 'flops=1e12 2'" -e "$TINY" --plan-search 4 --machine "$W/machine_trail.txt"
expect machine_frac     1 "line 1: gpus_per_node = 2.5 must be a whole number" -e "$TINY" --plan-search 4 --machine "$W/machine_frac.txt"
expect plan_and_search  1 "--plan, --plan-search and --calibrate: give one of them" -e "$TINY" --plan 2 --plan-search 4
# a checkpoint written with one batch shape cannot be resumed with another
$BIN/train_gpt -e "$TINY" -t 32 -b 4 -x 2 -n 2 -s 0 -v 0 -o "$W/ckpt_shape" >/dev/null 2>&1
expect resume_shape     1 "was written with -t 32 -d 128"     -e "$TINY" -t 32 -b 2 -x 4 -y 1 -o "$W/ckpt_shape"
# Muon: its flags' values; a checkpoint keeps its optimizer (a resume with the other one is refused)
expect optimizer        1 "--optimizer expects adamw or muon, got 'sgd'" -e "$TINY" --optimizer sgd
expect muon_momentum    1 "--muon-momentum must be in [0, 0.999], got 1" -e "$TINY" --optimizer muon --muon-momentum 1
$BIN/train_gpt -e "$TINY" -t 32 -b 4 -x 2 -n 2 -s 0 -v 0 --optimizer muon -o "$W/ckpt_muon" >/dev/null 2>&1
expect resume_optimizer 1 "was written by a run with --optimizer muon, this run has adamw" -e "$TINY" -t 32 -b 4 -x 4 -y 1 -o "$W/ckpt_muon"
# a NO_MPI=1 binary launched as several ranks refuses instead of running N separate copies
if [ -x build/cpu-nompi/train_gpt ]; then
    timeout 60 $MPIRUN -np 2 build/cpu-nompi/train_gpt -e "$TINY" -t 32 -x 1 >"$W/nompi.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "^error: this binary was built with NO_MPI=1" "$W/nompi.log"; then
        echo "ok   nompi_under_mpirun: $(grep -m1 '^error' "$W/nompi.log")"
    else
        echo "FAIL nompi_under_mpirun: exit $rc"
    fi
fi
# a bad file seen by one rank only: every rank must exit (MPI_Abort), none may hang
timeout 60 $MPIRUN -np 3 "$BIN/test_gpt" --ref refs/tiny --bad-file-on-rank 1 >"$W/onerank.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "^error: cannot open file" "$W/onerank.log"; then
    echo "ok   one_rank_bad_file: exit $rc, $(grep -m1 '^error' "$W/onerank.log")"
else
    echo "FAIL one_rank_bad_file: exit $rc"
fi
