#!/usr/bin/env bash
# train_gpt end to end (the program itself, not test_gpt): main.log format, the loss falls on the
# built-in corpus, checkpoint + resume through main() repeats the uninterrupted losses exactly,
# sampling and validation run under tp+sp+zero3, shuffling is seeded and deterministic.
# Usage: bash scripts/test_train.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
TINY="L=2,C=64,NH=4,V=256,maxT=64"

# 1. one process, built-in corpus: main.log lines, falling loss
"$BIN/train_gpt" -e "$TINY" -t 32 -b 4 -x 40 -l 3e-3 -v 20 -m 4 -s 0 -o "$W/a" >"$W/a.log" 2>&1
say $? "train_gpt runs 40 steps on the built-in corpus"
n=$(grep -cE '^s:[0-9]+ trl:[0-9]+\.[0-9]{6}$' "$W/a/main.log"); v=$(grep -cE '^s:[0-9]+ tel:[0-9]+\.[0-9]{6}$' "$W/a/main.log")
[ "$n" = 40 ] && [ "$v" = 3 ]; say $? "main.log has 40 's:STEP trl:LOSS' and 3 's:STEP tel:LOSS' lines, 6 decimals (got $n, $v)"
first=$(awk -F'trl:' '/trl:/ { print $2; exit }' "$W/a/main.log"); last=$(awk -F'trl:' '/trl:/ { x = $2 } END { print x }' "$W/a/main.log")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }'; say $? "the loss falls: $first -> $last"
grep -q "entropy rate 1.2130 nats/token" "$W/a.log"; say $? "the built-in corpus prints its entropy rate (the loss floor)"

# 2. resume through main(): 10 steps straight vs 6 steps + checkpoint + resume to 10 (same layout)
resume_case() {   # NAME NP FLAGS...
    local name=$1 np=$2; shift 2
    local launch="$MPIRUN -np $np"
    $launch "$BIN/train_gpt" -e "$TINY" -t 32 -x 10 -v 0 -s 0 -l 3e-3 -c 0.1 "$@" -o "$W/$name.full" >/dev/null 2>&1
    $launch "$BIN/train_gpt" -e "$TINY" -t 32 -x 6 -n 3 -v 0 -s 0 -l 3e-3 -c 0.1 "$@" -o "$W/$name.ckpt" >/dev/null 2>&1
    # (-q defaults to 1: a constant lr, so the 6-step first run has the schedule of the 10-step one)
    $launch "$BIN/train_gpt" -e "$TINY" -t 32 -x 10 -y 1 -v 0 -s 0 -l 3e-3 -c 0.1 "$@" -o "$W/$name.ckpt" >"$W/$name.resume.log" 2>&1
    local rc=$?
    grep -q "resumed from step 6" "$W/$name.resume.log" && [ $rc = 0 ]
    say $? "$name: -y 1 resumes from the newest checkpoint (step 6)"
    ls "$W/$name.ckpt" | grep -q '\.tmp$'; [ $? != 0 ]; say $? "$name: no temporary files left after checkpoints"
    diff <(grep trl "$W/$name.full/main.log") <(grep trl "$W/$name.ckpt/main.log") >/dev/null
    say $? "$name: resumed main.log equals the uninterrupted one, all 10 steps, to 6 decimals"
}
resume_case single 1 -b 4
resume_case tp_sp_zero3 4 -b 2 --tp 2 --sp --zero 3
resume_case zero1_accum 2 -b 1 -d 128 --zero 1
resume_case pp2_zero2 4 -b 1 -d 128 --pp 2 --zero 2

# 3. sampling and validation under tp 2 + sp + zero 3, and under pp 2 (the bubble is reported)
$MPIRUN -np 4 "$BIN/train_gpt" -e "$TINY" -t 32 -b 2 -x 4 -v 2 -m 2 -s 2 -g 8 --tp 2 --sp --zero 3 >"$W/sample.log" 2>&1
[ $? = 0 ] && grep -q "generating:" "$W/sample.log" && [ "$(grep -c 'val loss' "$W/sample.log")" = 3 ]
say $? "sampling and validation run under tp 2 + sp + zero 3"
$MPIRUN -np 4 "$BIN/train_gpt" -e "$TINY" -t 32 -b 1 -d 128 -x 4 -v 2 -m 2 -s 2 -g 8 --pp 2 --tp 2 --sp --comm-report >"$W/sample_pp.log" 2>&1
[ $? = 0 ] && grep -q "generating:" "$W/sample_pp.log" && [ "$(grep -c 'val loss' "$W/sample_pp.log")" = 3 ] && grep -q "pipeline bubble" "$W/sample_pp.log"
say $? "sampling, validation and the bubble report run under pp 2 + tp 2 + sp"

# 4. shuffling: seeded (two runs agree), and it changes the order (differs from --shuffle 0)
python3 - "$W" <<'EOF'
import struct, sys, random
random.seed(5)
for k in range(3):
    toks = [random.randrange(256) for _ in range(3000)]
    hdr = [0] * 256; hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    open("%s/shard_%d.bin" % (sys.argv[1], k), "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))
EOF
for s in 1 1b 0; do
    "$BIN/train_gpt" -e "$TINY" -t 32 -b 4 -x 8 -v 0 -s 0 -i "$W/shard_*.bin" --shuffle ${s%b} -o "$W/shuf$s" >/dev/null 2>&1
done
diff "$W/shuf1/main.log" "$W/shuf1b/main.log" >/dev/null; say $? "--shuffle 1 is deterministic for a seed"
! diff "$W/shuf1/main.log" "$W/shuf0/main.log" >/dev/null; say $? "--shuffle 1 changes the batch order"

# 5. one epoch (-x -1) counts the batches of every shard, whatever their sizes and order
python3 - "$W" <<'EOF2'
import struct, sys
for name, n in (("small", 600), ("large", 20000)):
    toks = [i % 251 for i in range(n)]
    hdr = [0] * 256; hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    open("%s/epoch_%s.bin" % (sys.argv[1], name), "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % n, *toks))
EOF2
for sh in 0 1; do
    "$BIN/train_gpt" -e "$TINY" -t 32 -b 4 -x -1 -v 0 -s 0 -i "$W/epoch_*.bin" --shuffle $sh 2>&1 | grep -q "^step    1/160 "
    say $? "-x -1 with shards of 600 and 20000 tokens (--shuffle $sh): one epoch = 4 + 156 = 160 steps of B*T = 128"
done

# 6. tinyshakespeare from ../shared (as CI has it): shards + tokenizer, training, decoded samples
TS=../shared/data/tinyshakespeare.txt
if [ -f "$TS" ]; then
    python3 dev/data/tinyshakespeare.py --input "$TS" --out "$W/ts" --tokenizer byte >"$W/ts_prep.log" 2>&1   # V=257 below
    say $? "dev/data/tinyshakespeare.py writes shards and a tokenizer from $TS"
    "$BIN/train_gpt" -i "$W/ts/tiny_shakespeare_train.bin" -j "$W/ts/tiny_shakespeare_val.bin" -e "L=2,C=64,NH=4,V=257,maxT=64" \
        -b 4 -t 64 -x 30 -l 3e-3 -v 15 -m 4 -s 30 -g 32 >"$W/ts.log" 2>&1
    rc=$?
    # a decoded sample is text: the tokenizer was found next to the shards (no bare token ids)
    sample=$(awk '/^generating:/ { g = 1; next } g && /^---$/ { if (++c == 2) exit; next } g && c == 1' "$W/ts.log" | tr -d '\n')
    [ $rc = 0 ] && [ -n "$sample" ] && ! grep -qE '^([0-9]+ )+$' <<<"$sample"
    say $? "train_gpt trains on tinyshakespeare and decodes its samples with the tokenizer"
fi
