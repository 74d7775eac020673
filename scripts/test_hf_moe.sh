#!/usr/bin/env bash
# Hugging Face interop of MoE on the Llama body (dev/hf.py) against transformers 4.49's MixtralForCausalLM,
# OlmoeForCausalLM and Qwen2MoeForCausalLM (dev/reference/hf_moe_ref.py, fp32, CPU), as scripts/test_hf_llama.sh
# does the dense families. Six random models saved with save_pretrained: Mixtral (E 4, untied) and Mixtral (E 8,
# MQA, tied), Qwen2-MoE (4 layers, every 2nd MoE, dense F 96, a gated shared expert 2H wide, raw gates) and
# Qwen2-MoE (renormalised gates, S 1, tied), OLMoE (QK-norm, raw gates) and OLMoE (renormalised, tied, llama3
# RoPE scaling); each imported gives transformers' loss and greedy continuation, export -> import gives the model
# file byte for byte, import -> export every tensor bit for bit. Three models trained here (Mixtral-like,
# Qwen2-MoE-like, OLMoE-like), exported, give ours in transformers. Three imports under tp 2 + sp + ep 2 and ep 4;
# --bf16; refusals by name, on import (the config's field) and on export (what no class computes).
# Our side runs dropless (--capacity-factor 0) with --aux-coeff 0 --z-coeff 0: transformers' loss is the CE alone.
# The loss tolerance is test_hf_llama.sh's (fp32 both sides in different orders, here also the experts' outputs
# summed per expert against per token: each op's relative error ~1e-7 to 1e-6, a few dozen add up to well under
# 1e-5 of the loss). It holds only where both sides choose the same experts: hf_moe_ref.py builds each random model
# from the first seed whose routing of this batch has no top-k margin under 1e-5 (100x the ~1e-7 by which fp32
# rounding moves a router probability), and the trained models' margins are checked here the same way.
# Usage: bash scripts/test_hf_moe.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
need_py transformers safetensors torch
W="$W/hf_moe"   # made afresh: the cases below write at fixed names
rm -rf "$W" && mkdir -p "$W"
REF="$PY dev/reference/hf_moe_ref.py"
HF="$PY dev/hf.py"
B=4; T=32; IDS=1,2,3; N=12
MOE="--aux-coeff 0 --z-coeff 0 --capacity-factor 0"
CASES="mixtral mixtral_tied qwen2_moe qwen2_moe_norm olmoe olmoe_norm"
TRAINED="trained_mixtral trained_qwen2_moe trained_olmoe"
. "$(dirname "$0")/test_hf_lib.sh"

$REF make "$W" >"$W/make.log" 2>&1
say $? "transformers builds the six random MoE models (routed without near ties: $(grep -c margin "$W/make.log") seeds found) and the configs to refuse"

# models trained here 20 steps on the built-in corpus (aux and z on, capacity 1.25): Mixtral-like (every layer,
# renormalised, H = F), Qwen2-MoE-like (every 2nd layer, a gated shared expert, q/k/v biases, raw gates, tied, MQA),
# OLMoE-like (QK-norm, raw gates)
train() { "$BIN/train_gpt" -e "arch=llama,C=64,NH=4,V=300,maxT=64,$2" -b 4 -t 32 -x 20 -l 3e-3 -v 0 -s 0 -o "$W/run_$1" \
    >"$W/train_$1.log" 2>&1; }
train mixtral "L=2,KV=2,F=64,E=4,k=2"
train qwen2_moe "L=4,KV=1,F=96,E=4,k=2,H=32,S=2,sgate=1,qkvbias=1,every=2,topknorm=0,tied=1,theta=10000"
train olmoe "L=2,KV=2,F=32,E=8,k=2,qknorm=1,topknorm=0,theta=10000"
import_export_all
dirs=""; for m in $CASES $TRAINED; do dirs="$dirs $W/$m"; done
$REF ref "$W/val.bin" -b $B -t $T --ids $IDS -n $N $dirs >"$W/ref.log" 2>&1

# 1. the same experts, the same loss, the same greedy continuation
for m in $CASES $TRAINED; do
    r=$(ref route $m 3)
    awk -v r="$r" 'BEGIN { exit !(r != "" && r >= 1e-5) }'
    say $? "$m: transformers routes the batch with top-k margins >= 1e-5 (smallest $r): both sides choose the same experts"
    check_loss $m
    # transformers' next tokens are ours up to the first step with the top two logits within 1e-4 or a routing
    # margin under 1e-5 (beyond those an fp32 rounding may flip an argmax or an expert)
    check_greedy $m
done

# 2. round trips
check_round_trips

# 3. other layouts (dp 2 x -b 2 and dp 4 x -b 1 read the same 4 rows): tp 2 + sp + ep 2 (OLMoE: QK-norm's sums
# over tp), ep 4
for run in "qwen2_moe 4 -b 2 --tp 2 --sp --ep 2" "olmoe 4 -b 2 --tp 2 --sp --ep 2" "mixtral 4 -b 1 --ep 4"; do
    set -- $run
    m=$1; np=$2; shift 2
    a=$($MPIRUN -np $np "$BIN/train_gpt" -e "$W/$m.bin" -x 0 -j "$W/val.bin" -m 1 -t $T -s 0 $MOE "$@" 2>&1 \
        | awk '/^val loss/ { print $3 }')
    b=$(ref loss $m 3)
    close "$a" "$b"
    say $? "$m imported, under $*: $a = transformers' $b"
done

# 4. --bf16: version 35 (the routing bias stays fp32), every value the fp32 import's rounded to nearest even;
# bf16 -> export -> import --bf16 is exact
check_bf16_import qwen2_moe

# 5. import refuses, naming the field: one line, a non-zero exit, nothing written
refused bad_jitter router_jitter_noise
refused bad_mixtral_window sliding_window
refused bad_mixtral_k1 num_experts_per_tok
refused bad_k_over_e num_experts_per_tok
refused bad_mlp_only mlp_only_layers
refused bad_shared_width shared_expert_intermediate_size
refused bad_sparse_step decoder_sparse_step
refused bad_qwen2_moe_window sliding_window
refused bad_norm_topk_prob norm_topk_prob
refused bad_clip_qkv clip_qkv
refused bad_olmoe_bias attention_bias
refused bad_vocab vocab_size
$HF import "$W/vocab_2p20" "$W/refused.bin" >"$W/refused.log" 2>&1
[ $? != 0 ] && grep -q "'model.embed_tokens.weight' has shape (300, 64), expected (1048576, 64)" "$W/refused.log"
say $? "vocab_size 2^20 (Vp 2^20, the bound) passes config.json's check; the weights then must have it: $(cat "$W/refused.log")"

# 6. export refuses what no class of transformers computes: one line naming why, no directory
$PY - "$W" <<'PYEOF'
import sys
import numpy as np
sys.path.insert(0, "dev")
from hf import read_model, write_model
w = sys.argv[1]
cfg, t = read_model(f"{w}/mixtral.bin")
write_model(f"{w}/x_sigmoid.bin", {**cfg, "score": 1}, t, False)
bias = t["bias"].copy(); bias[0, 1] = 0.5
write_model(f"{w}/x_bias.bin", cfg, {**t, "bias": bias}, False)
write_model(f"{w}/x_raw.bin", {**cfg, "norm_topk": 0}, t, False)
cfg, t = read_model(f"{w}/qwen2_moe.bin")
write_model(f"{w}/x_ungated.bin", {**cfg, "sgate": 0}, {**t, "sgatew": np.zeros((0,), np.float32)}, False)
PYEOF
"$BIN/train_gpt" -e "L=2,C=64,NH=4,V=300,maxT=64,E=4,k=2" -b 4 -t 32 -x 1 -v 0 -s 0 -o "$W/run_gpt2moe" >/dev/null 2>&1
cp "$W/run_gpt2moe/model_00000001.bin" "$W/x_gpt2moe.bin"
"$BIN/train_gpt" -e "arch=llama,L=2,C=64,NH=4,V=300,maxT=64,qknorm=1" -b 4 -t 32 -x 1 -v 0 -s 0 -o "$W/run_qkdense" >/dev/null 2>&1
cp "$W/run_qkdense/model_00000001.bin" "$W/x_qkdense.bin"
unexported() {   # MODEL WHAT
    $HF export "$W/$1.bin" "$W/$1_out" >"$W/unexported.log" 2>&1
    local rc=$?
    [ $rc != 0 ] && [ "$(wc -l <"$W/unexported.log")" = 1 ] && grep -q "^error: model file .*$2" "$W/unexported.log" \
        && [ ! -e "$W/$1_out" ]
    say $? "export refuses $1: $(cat "$W/unexported.log")"
}
unexported x_sigmoid "sigmoid"
unexported x_bias "routing bias"
unexported x_raw "norm_topk 0"
unexported x_ungated "without their gate"
unexported x_gpt2moe "GPT-2 MoE"
unexported x_qkdense "QK-norm without experts"
