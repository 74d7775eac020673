#!/usr/bin/env bash
# Use what you trained: a run with -o leaves its last step's model; -nk/-nm keep exactly the promised
# checkpoints; -x 0 runs the end's work only (validation over the whole val set equal to the training
# run's last, a sample); a resume at the last step still validates and samples; sampling slides past -t,
# is seeded, greedy at temperature 0 (= top-k 1); dev/sample.py prints text from a tinyshakespeare model;
# nothing is allocated on the device after set-up (an allocation made on purpose stops the run).
# Usage: bash scripts/test_use.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
TINY="L=2,C=64,NH=4,V=256,maxT=64"
run() { "$BIN/train_gpt" -e "$TINY" -t 32 -b 4 -l 3e-3 "$@"; }     # the tiny model, fresh or resumed
M6() { "$BIN/train_gpt" -e "$W/val/model_00000006.bin" -t 32 -b 4 "$@"; }   # the model trained in 2.
steps_in() { ls "$1" | sed -n 's/^DONE_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tr '\n' ' '; }

# 1. the last step's model without -n; retention
run -x 5 -v 0 -s 0 -o "$W/last" >"$W/last.log" 2>&1
[ $? = 0 ] && [ -f "$W/last/model_00000005.bin" ] && [ -f "$W/last/state_00000005.bin" ] && [ "$(steps_in "$W/last")" = "5 " ]
say $? "a run with -o and no -n leaves its last step's model and state (DONE: $(steps_in "$W/last"))"
run -x 7 -n 1 -nk 2 -nm 3 -v 0 -s 0 -o "$W/keep" >/dev/null 2>&1
[ "$(steps_in "$W/keep")" = "3 6 7 " ] && [ "$(ls "$W/keep" | grep -c '\.bin$')" = 6 ] && ! ls "$W/keep" | grep -q tmp
say $? "-n 1 -nk 2 -nm 3 over 7 steps keeps the newest 2 and the multiples of 3: $(steps_in "$W/keep")(expected 3 6 7)"
run -x 6 -n 2 -nk 1 -v 0 -s 0 -o "$W/keep1" >/dev/null 2>&1
[ "$(steps_in "$W/keep1")" = "6 " ] && [ "$(ls "$W/keep1" | grep -c '\.bin$')" = 2 ]
say $? "-nk 1 keeps only the newest checkpoint: $(steps_in "$W/keep1")"

# 2. -x 0: the end's work only. Validation over the whole val set (-m -1) equals the training run's last
run -x 6 -v 3 -m -1 -s 0 -o "$W/val" >"$W/val.log" 2>&1
a=$(grep "val loss" "$W/val.log" | tail -n 1 | awk '{ print $3 }')
M6 -x 0 -m -1 -s 0 >"$W/x0.log" 2>&1
b=$(grep "val loss" "$W/x0.log" | awk '{ print $3 }')
[ -n "$a" ] && [ "$a" = "$b" ] && ! grep -q "^step " "$W/x0.log" && grep -q "perplexity" "$W/x0.log"
say $? "-x 0 -m -1 runs no step and prints the val loss and perplexity of the whole val set: $b = the training run's last $a"
# a resume at the last step still validates and samples, and writes nothing new
run -x 6 -v 3 -m -1 -s 3 -g 8 -y 1 -o "$W/val" >"$W/again.log" 2>&1
[ $? = 0 ] && grep -q "resumed from step 6" "$W/again.log" && grep -q "val loss $a" "$W/again.log" && grep -q "^generating:" "$W/again.log" \
    && [ "$(steps_in "$W/val")" = "6 " ]
say $? "a resume at step == -x runs the end's validation (val loss $a) and sample"
run -x 9 -v 0 -s 0 -y 1 -o "$W/val" >"$W/longer.log" 2>&1
grep -q "the checkpoint's run had -x 6, this one -x 9: the learning-rate schedule is stretched" "$W/longer.log"
say $? "a resume with another -x says so: $(grep -m1 "checkpoint's run had" "$W/longer.log" | cut -c1-80)..."

# 3. sampling: past -t the window slides; seeded; temperature 0 = top-k 1 (the most likely token)
ids() { grep "^sample ids:" "$1" | tail -n 1 | cut -d: -f2; }
M6 -x 0 -v 0 -s 0 -g 50 --prompt-ids 1,2,3 >"$W/s1.log" 2>&1
M6 -x 0 -v 0 -s 0 -g 50 --prompt-ids 1,2,3 >"$W/s2.log" 2>&1
n=$(ids "$W/s1.log" | wc -w)
[ "$n" = 50 ] && [ "$(ids "$W/s1.log")" = "$(ids "$W/s2.log")" ]
say $? "-g 50 with -t 32 after --prompt-ids 1,2,3: $n tokens (the window slides), the same in two runs (seeded)"
M6 -x 0 -v 0 -s 0 -g 20 --prompt-ids 5 --sample-temperature 0 >"$W/g0.log" 2>&1
M6 -x 0 -v 0 -s 0 -g 20 --prompt-ids 5 --sample-top-k 1 >"$W/k1.log" 2>&1
M6 -x 0 -v 0 -s 0 -g 20 --prompt-ids 5 --sample-top-k 5 --sample-temperature 0.7 >"$W/k5.log" 2>&1
[ -n "$(ids "$W/g0.log")" ] && [ "$(ids "$W/g0.log")" = "$(ids "$W/k1.log")" ] && [ "$(ids "$W/k5.log" | wc -w)" = 20 ]
say $? "--sample-temperature 0 and --sample-top-k 1 both take the most likely token: the same 20 ids; top-k 5 at 0.7 samples"
# the same samples in another layout (tp 2 + sp x pp 2): the coins are the same; only a coin within rounding of a
# boundary could pick another token
$MPIRUN -np 4 "$BIN/train_gpt" -e "$W/val/model_00000006.bin" -t 32 -b 4 -x 0 -v 0 -s 0 -g 20 --prompt-ids 1,2,3 --tp 2 --sp --pp 2 \
    >"$W/s4.log" 2>&1
M6 -x 0 -v 0 -s 0 -g 20 --prompt-ids 1,2,3 >"$W/s1b.log" 2>&1
[ -n "$(ids "$W/s4.log")" ] && [ "$(ids "$W/s4.log")" = "$(ids "$W/s1b.log")" ]
say $? "the same 20 sampled ids under tp 2 + sp x pp 2 as on one rank"
# the default run on the built-in corpus says what its ids are
run -x 1 -v 0 -s 1 -g 4 >"$W/builtin.log" 2>&1
grep -q "^generating: token ids (the built-in corpus is a Markov chain over token ids, not text)" "$W/builtin.log"
say $? "the built-in corpus's sample says what its ids are"

# 4. nothing allocated on the device after the first step: validation, samples, checkpoints (tp 2 x pp 2)
$MPIRUN -np 4 "$BIN/train_gpt" -e "$TINY" -t 32 -b 2 -x 4 -v 2 -m 2 -s 2 -g 8 -n 2 --tp 2 --pp 2 --memory-report -o "$W/alloc" \
    >"$W/alloc.log" 2>&1
grep -q "^device allocations after the first step: 0 " "$W/alloc.log"
say $? "no device allocation after the first step (validation, samples, checkpoints under tp 2 x pp 2): $(grep -m1 '^device allocations' "$W/alloc.log")"
# the allocator stops one (every buffer is allocated at set-up: on CUDA an allocation waits for the whole device)
TRAIN_GPT_ALLOC_AT_STEP=2 run -x 4 -v 0 -s 0 >"$W/alloc_bad.log" 2>&1
[ $? != 0 ] && grep -q "a device allocation of 256 bytes (workspace) after set-up" "$W/alloc_bad.log"
say $? "a device allocation after set-up stops the run: $(grep -m1 -o 'a device allocation.*' "$W/alloc_bad.log")"

# 5. dev/sample.py: text in, text out, from a model trained on tinyshakespeare (GPT-2 tokens with the .venv's
#    tiktoken, else bytes)
TS=../shared/data/tinyshakespeare.txt
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
if [ -f "$TS" ]; then
    $PY dev/data/tinyshakespeare.py --input "$TS" --out "$W/ts" >"$W/ts_prep.log" 2>&1
    V=$(od -An -t d4 -j 8 -N 4 "$W/ts/tokenizer.bin" | tr -d ' ')
    "$BIN/train_gpt" -i "$W/ts/tiny_shakespeare_train.bin" -e "L=2,C=64,NH=4,V=$V,maxT=64" -b 4 -t 64 -x 10 -l 3e-3 -v 0 -s 0 -o "$W/tsm" \
        >"$W/tsm.log" 2>&1
    $PY dev/sample.py "First Citizen:" -e "$W/tsm/model_00000010.bin" -g 16 -t 64 >"$W/sample_py.log" 2>&1
    rc=$?
    [ $rc = 0 ] && head -n 1 "$W/sample_py.log" | grep -q "^First Citizen:." && ! grep -qE '^[0-9 ]+$' "$W/sample_py.log"
    say $? "dev/sample.py continues 'First Citizen:' as text (V $V): $(head -c 70 "$W/sample_py.log" | tr '\n' ' ')..."
    # a model evaluated on a val set alone (-x 0 -j, no -i): the loss with -i given as well
    a=$("$BIN/train_gpt" -e "$W/tsm/model_00000010.bin" -t 64 -x 0 -j "$W/ts/tiny_shakespeare_val.bin" -m 4 -s 0 2>&1 | awk '/^val loss/ { print $3 }')
    b=$("$BIN/train_gpt" -e "$W/tsm/model_00000010.bin" -t 64 -x 0 -i "$W/ts/tiny_shakespeare_train.bin" -j "$W/ts/tiny_shakespeare_val.bin" -m 4 -s 0 2>&1 \
        | awk '/^val loss/ { print $3 }')
    [ -n "$a" ] && [ "$a" = "$b" ]
    say $? "-x 0 -j VAL without -i evaluates a model on VAL: val loss $a (= $b with -i too)"
fi

# 6. the README's flag table has a row for every flag train_gpt -h lists (aliases too); its file table names every llmc/ header
missing=""
sed -n '/^## Flags/,/^## [^F]/p' README.md >"$W/readme_flags.md"
for f in $("$BIN/train_gpt" -h 2>&1 | sed -n 's/^  \(-[^ ,]*\)\(, \(-[^ ,]*\)\)\{0,1\} .*/\1 \3/p'); do
    grep -qE "^\|.*\`${f}[\` ]" "$W/readme_flags.md" || missing="$missing $f"
done
for h in llmc/*.h; do
    n=$(basename "$h" .h); grep -qE "(\`llmc/$n\.h\`|[{,]$n[,}]|\`$n\.h\`)" README.md || missing="$missing $h"
done
[ -z "$missing" ] && [ "$("$BIN/train_gpt" -h 2>&1 | grep -c '^  -')" -gt 50 ]
say $? "the README's flag table has every flag of train_gpt -h, its file table every llmc/ header${missing:+ (missing:$missing)}"
