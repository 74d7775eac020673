#!/usr/bin/env bash
# Hugging Face interop of the Llama family (dev/hf.py) against transformers 4.49's LlamaForCausalLM,
# MistralForCausalLM and Qwen2ForCausalLM (dev/reference/hf_llama_ref.py, fp32, CPU). Four random models saved
# with save_pretrained: Llama (KV 2 of NH 4, untied), Llama tied with Llama 3.1's rope_scaling (llama3) and
# 131072 positions (KV 1), Mistral (sliding_window null), Qwen2 (q/k/v biases, tied, a window of the positions);
# each imported gives transformers' loss and greedy continuation, export -> import gives the model file byte for
# byte, import -> export every tensor bit for bit. Two models trained here, exported (as Llama, and with biases as
# Qwen2), give ours in transformers. Two imports under tp 2 + sp x pp 2; --bf16; what our model cannot be is
# refused by name; dev/sample.py --tokenizer takes a Hugging Face tokenizer.
# The loss tolerance (as scripts/test_hf.sh's): both sides compute in fp32, in different orders (one qkv and one
# gate-up GEMM against three and two, the libraries' blocking, the softmax and RMSNorm sums), through 2 layers:
# each op's relative error is ~1e-7 to 1e-6, a few dozen of them add up to well under 1e-5 of the loss; the val
# line prints 6 decimals (5e-7 of ~6). The reference also prints its loss in float64: fp32's own rounding error,
# the size of each side's.
# Usage: bash scripts/test_hf_llama.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
need_py transformers safetensors torch tokenizers
W="$W/hf_llama"   # made afresh: the cases below write at fixed names
rm -rf "$W" && mkdir -p "$W"
REF="$PY dev/reference/hf_llama_ref.py"
HF="$PY dev/hf.py"
B=4; T=32; IDS=1,2,3; N=12
CASES="llama llama_tied mistral qwen2"
TRAINED="trained_llama trained_qwen2"
. "$(dirname "$0")/test_hf_lib.sh"

$REF make "$W" >"$W/make.log" 2>&1
say $? "transformers builds the four random models, the configs to refuse and a byte-level BPE tokenizer (V 300)"

# models trained here 20 steps on the built-in corpus: a Llama, and a Qwen2-like one (q/k/v biases, tied, MQA)
"$BIN/train_gpt" -e "arch=llama,L=2,C=64,NH=4,KV=2,V=300,maxT=64,F=128" -b 4 -t 32 -x 20 -l 3e-3 -v 0 -s 0 \
    -o "$W/run_llama" >"$W/train_llama.log" 2>&1
"$BIN/train_gpt" -e "arch=llama,L=2,C=64,NH=4,KV=1,V=300,maxT=64,F=96,qkvbias=1,tied=1,theta=10000" -b 4 -t 32 -x 20 \
    -l 3e-3 -v 0 -s 0 -o "$W/run_qwen2" >"$W/train_qwen2.log" 2>&1
import_export_all
dirs=""; for m in $CASES $TRAINED; do dirs="$dirs $W/$m"; done
$REF ref "$W/val.bin" -b $B -t $T --ids $IDS -n $N $dirs >"$W/ref.log" 2>&1

# 1. the same loss, the same greedy continuation
for m in $CASES $TRAINED; do
    check_loss $m
    # transformers' next tokens are ours (--sample-temperature 0) up to the first step whose top two logits are
    # within 1e-4 (fp32 rounding of the logits is ~1e-6 of them: beyond that an argmax cannot flip)
    check_greedy $m
done

# 2. round trips
check_round_trips

# 3. another layout: tp 2 (a kv head per rank) + sp x pp 2
for m in llama qwen2; do
    a=$($MPIRUN -np 4 "$BIN/train_gpt" -e "$W/$m.bin" -x 0 -j "$W/val.bin" -m 1 -b $B -t $T -s 0 --tp 2 --sp --pp 2 2>&1 \
        | awk '/^val loss/ { print $3 }')
    b=$(ref loss $m 3)
    close "$a" "$b"
    say $? "$m imported, under tp 2 + sp x pp 2: $a = transformers' $b"
done

# 4. --bf16: version 35, every value the fp32 import's rounded to nearest even; bf16 -> export -> import --bf16 is exact
check_bf16_import llama_tied

# 5. refused, naming the field: one line, a non-zero exit, nothing written
refused bad_dynamic rope_scaling
refused bad_yarn rope_scaling
refused bad_window sliding_window
refused bad_window_qwen2 sliding_window
refused bad_window_default sliding_window
refused bad_attention_bias attention_bias
refused bad_mlp_bias mlp_bias
refused bad_act hidden_act
refused bad_head_dim head_dim
refused bad_type model_type

# 6. dev/sample.py --tokenizer: a Hugging Face tokenizer (byte-level BPE) encodes the prompt and decodes the sample
PROMPT="First Citizen: Naïve café, speak."
$PY dev/sample.py "$PROMPT" -e "$(model trained_llama)" --tokenizer "$W/tok" -g 8 --bin "$BIN/train_gpt" >"$W/sample.log" 2>&1
[ $? = 0 ] && $PY -c "import sys; t = open(sys.argv[1], encoding='utf-8').read(); sys.exit(not t.startswith(sys.argv[2]))" "$W/sample.log" "$PROMPT"
say $? "sample.py --tokenizer: the prompt round-trips through AutoTokenizer and train_gpt: $(head -n 1 "$W/sample.log" | tr -cd '[:print:]' | head -c 60)"
$PY dev/sample.py "hi" -e "$(model trained_llama)" --tokenizer "$W/llama" -g 2 --bin "$BIN/train_gpt" >"$W/sample_bad.log" 2>&1
[ $? != 0 ] && [ "$(wc -l <"$W/sample_bad.log")" = 1 ] && grep -q "^error: --tokenizer $W/llama" "$W/sample_bad.log"
say $? "sample.py --tokenizer of a directory without a tokenizer: $(cat "$W/sample_bad.log")"

# 7. dev/data/tinyshakespeare.py --tokenizer DIR: a Hugging Face tokenizer's ids in llm.c's shards (each document
#    after the tokenizer's BOS, else its EOS), uint16 for the BPE of 300 ids; a word-level tokenizer of 70,000 ids
#    (past 65,536) writes uint32 shards (version 7) that a V 70,000 Llama trains on
for i in $(seq 60); do printf 'First Citizen:\nBefore we proceed any further, hear me speak, %d.\n\nAll:\nSpeak, speak.\n\n' $i; done >"$W/ts.txt"
$PY dev/data/tinyshakespeare.py --input "$W/ts.txt" --out "$W/ts_tok" --tokenizer "$W/tok" --val-tokens 500 >"$W/ts_tok.log" 2>&1 \
    && $PY - "$W/ts.txt" "$W/tok" "$W/ts_tok/ts_val.bin" "$W/ts_tok/ts_train.bin" <<'PYEOF'
import sys, numpy as np
from transformers import AutoTokenizer
text, tok = open(sys.argv[1], encoding="utf-8").read(), AutoTokenizer.from_pretrained(sys.argv[2], local_files_only=True)
docs, ids = text.split("\n\n"), []
start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
for i, d in enumerate(docs):
    ids += [start] + tok.encode(d + ("\n\n" if i < len(docs) - 1 else ""), add_special_tokens=False)
got = []
for path in sys.argv[3:]:
    h = np.fromfile(path, dtype="<i4", count=256)
    assert h[0] == 20240520 and h[1] == 1, h[:3]
    got += np.fromfile(path, dtype="<u2", offset=1024).tolist()
sys.exit(got != ids)
PYEOF
[ $? = 0 ] && [ ! -e "$W/ts_tok/tokenizer.bin" ]
say $? "tinyshakespeare.py --tokenizer DIR: the shards hold AutoTokenizer's ids of every document after its BOS/EOS (uint16, V 300), no tokenizer.bin"
$PY - "$W/ts.txt" "$W/tok70k" <<'PYEOF' >/dev/null 2>&1
import re, sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = sorted(set(re.findall(r"\w+|[^\w\s]", open(sys.argv[1], encoding="utf-8").read())))
vocab = {w: i for i, w in enumerate(["<unk>", "<s>"] + words + [f"w{i}" for i in range(70000 - 2 - len(words))])}
tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>")); tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", unk_token="<unk>").save_pretrained(sys.argv[2])
PYEOF
$PY dev/data/tinyshakespeare.py --input "$W/ts.txt" --out "$W/ts70k" --tokenizer "$W/tok70k" --val-tokens 500 >"$W/ts70k.log" 2>&1
v=$($PY -c "import numpy as np, sys; h = np.fromfile(sys.argv[1], dtype='<i4', count=2); print(h[0], h[1])" "$W/ts70k/ts_train.bin" 2>/dev/null)
"$BIN/train_gpt" -e "arch=llama,L=1,C=64,NH=4,V=70000,maxT=64" -i "$W/ts70k/ts_train.bin" -j "$W/ts70k/ts_val.bin" -t 32 -b 2 -x 2 \
    -v 2 -m 1 -s 0 >"$W/ts70k_train.log" 2>&1
[ $? = 0 ] && [ "$v" = "20240801 7" ] && grep -q "^step    2/2" "$W/ts70k_train.log"
say $? "tinyshakespeare.py --tokenizer DIR of 70,000 ids writes uint32 shards ($v) that a V 70,000 Llama trains on"
