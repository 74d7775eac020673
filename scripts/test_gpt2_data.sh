#!/usr/bin/env bash
# The GPT-2 recipe's data (dev/data/fineweb.py, dev/data/hellaswag.py) on small local inputs, offline:
#  - fineweb.py on a parquet file (3 row groups) and a jsonl file: the shards' tokens are GPT-2's ids of the
#    documents in order, each after <|endoftext|>; every shard but the last holds --shard-size tokens, the first is
#    val; killed (SIGKILL) right after a shard's file and before its manifest entry, a rerun writes the same files
#    as an uninterrupted run; 2 workers give the files 1 worker gives; bad inputs are one line and no shard.
#  - hellaswag.py: its file, read by an independent reader here, is llm.c's format exactly (header, delimiter,
#    byte counts, index, label, the tokens of ctx and of " " + each ending); with --tokenizer DIR the context
#    starts with the tokenizer's BOS; tokens past 65,534 give version 2 (uint32 fields); bad inputs one line.
#  - many nodes' first line: at np 4 rank 0 prints every rank's host and node-local rank.
#  - --hellaswag: the count = transformers' acc_norm on the exported model, in one process and 4 layouts; the
#    evaluations in main.log and the plot; bad eval files; DRY=1 scripts/run_gpt2_124M.sh under a minute.
# Usage: bash scripts/test_gpt2_data.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
need_py pyarrow tiktoken transformers
W="$W/gpt2_data"
rm -rf "$W" && mkdir -p "$W/in"
FW="$PY dev/data/fineweb.py"
HS="$PY dev/data/hellaswag.py"

$PY - "$W" <<'PYEOF'
import json, random, sys
import pyarrow as pa, pyarrow.parquet as pq
W = sys.argv[1]
random.seed(7)
words = "the quick brown fox jumps over a lazy dog , while 42 cats watch . Ünïcode too ! and then".split()
docs = [" ".join(random.choice(words) for _ in range(random.randint(3, 150))) for _ in range(240)]
pq.write_table(pa.table({"id": list(range(120)), "text": docs[:120]}), f"{W}/in/a.parquet", row_group_size=50)
with open(f"{W}/in/b.jsonl", "w") as f:
    for d in docs[120:]:
        f.write(json.dumps({"text": d, "url": "x"}) + "\n")
json.dump(docs, open(f"{W}/docs.json", "w"))
pq.write_table(pa.table({"content": ["a", "b"]}), f"{W}/notext.parquet")
PYEOF
S=3000
$FW --input "$W/in" --out "$W/one" --shard-size $S --workers 1 >"$W/one.log" 2>&1
say $? "fineweb.py: $(tail -n 1 "$W/one.log")"
$PY - "$W" $S <<'PYEOF'
import glob, json, os, struct, sys
sys.path.insert(0, "dev/data")
from tinyshakespeare import make_tokenizer
W, S = sys.argv[1], int(sys.argv[2])
tok = make_tokenizer("gpt2")
want = [t for d in json.load(open(f"{W}/docs.json")) for t in [tok.eot] + tok.encode(d)]
files = sorted(glob.glob(f"{W}/one/fineweb_*_*.bin"), key=lambda p: int(p[-10:-4]))
got, sizes = [], []
for p in files:
    b = open(p, "rb").read()
    h = struct.unpack("<256i", b[:1024])
    assert h[:2] == (20240520, 1) and len(b) == 1024 + 2 * h[2], p
    got += struct.unpack(f"<{h[2]}H", b[1024:])
    sizes.append(h[2])
names = [os.path.basename(p) for p in files]
ok = (got == want and all(n == S for n in sizes[:-1]) and 0 < sizes[-1] <= S and names[0] == "fineweb_val_000000.bin"
      and all(n == f"fineweb_train_{i:06d}.bin" for i, n in enumerate(names) if i))
print(f"{len(files)} shards of {sizes[0]}..{sizes[-1]} tokens, {len(got)} tokens = GPT-2's ids of the 240 documents each after <|endoftext|>: {got == want}")
sys.exit(not ok)
PYEOF
say $? "fineweb.py's shards: the documents' GPT-2 ids in order, each after <|endoftext|>, $S tokens a shard but the last, the first val"
$FW --input "$W/in" --out "$W/two" --shard-size $S --workers 2 >/dev/null 2>&1 && diff -r "$W/one" "$W/two" >/dev/null
say $? "fineweb.py with 2 workers writes the files 1 worker writes"
{ FINEWEB_TEST_KILL=3 $FW --input "$W/in" --out "$W/kill" --shard-size $S --workers 2 >/dev/null 2>&1; } 2>/dev/null
rc=$?
n=$(grep -c '"file"' "$W/kill/fineweb_manifest.json")
$FW --input "$W/in" --out "$W/kill" --shard-size $S --workers 2 >/dev/null 2>&1 && diff -r "$W/one" "$W/kill" >/dev/null && [ $rc = 137 ] && [ "$n" = 3 ]
say $? "fineweb.py killed (SIGKILL, exit $rc) after shard 3's file and before its manifest entry ($n recorded): the rerun writes the same files"
{ FINEWEB_TEST_KILL=mid:2 $FW --input "$W/in" --out "$W/kill3" --shard-size $S --workers 2 >/dev/null 2>&1; } 2>/dev/null
rc=$?
n=$(grep -c '"file"' "$W/kill3/fineweb_manifest.json")
$FW --input "$W/in" --out "$W/kill3" --shard-size $S --workers 2 >/dev/null 2>&1 && diff -r "$W/one" "$W/kill3" >/dev/null && [ $rc = 137 ] && [ "$n" = 3 ]
say $? "fineweb.py killed (SIGKILL, exit $rc) halfway through shard 4 ($n recorded): the rerun writes the same files"
$FW --input "$W/in" --out "$W/one" --shard-size 5000 --workers 1 >"$W/other.log" 2>&1
[ $? != 0 ] && [ "$(wc -l <"$W/other.log")" = 1 ] && grep -q "^error: .*records other inputs or settings" "$W/other.log"
say $? "a rerun with another --shard-size is refused: $(cat "$W/other.log")"
mkdir -p "$W/empty" "$W/nt"; cp "$W/notext.parquet" "$W/nt/"
for c in "empty:no \*.parquet" "nt:no 'text' column"; do
    d=${c%%:*}; pat=${c#*:}
    $FW --input "$W/$d" --out "$W/out_$d" --shard-size $S >"$W/$d.log" 2>&1
    [ $? != 0 ] && [ "$(wc -l <"$W/$d.log")" = 1 ] && grep -q "^error: .*$pat" "$W/$d.log" && [ -z "$(ls "$W/out_$d" 2>/dev/null | grep bin)" ]
    say $? "fineweb.py on $d input: one line, no shard: $(cat "$W/$d.log")"
done

# hellaswag.py: examples made here (llm.c's fields), and an independent reader of the file
$PY - "$W" <<'PYEOF'
import json, random, sys
W = sys.argv[1]
random.seed(3)
words = "a man is sitting on the roof he is ripping tiles off starts pulling up roofing woman dog bucket".split()
sent = lambda n: " ".join(random.choice(words) for _ in range(n))
with open(f"{W}/hs.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"ind": 1000 + i, "ctx": sent(random.randint(2, 9)), "label": random.randrange(4),
                            "endings": [sent(random.randint(1, 4)) + "." for _ in range(4)]}) + "\n")
lines = open(f"{W}/hs.jsonl").read().splitlines()
bad = json.loads(lines[0]); bad["label"] = 4
open(f"{W}/hs_label.jsonl", "w").write(lines[1] + "\n" + json.dumps(bad) + "\n")
open(f"{W}/hs_empty.jsonl", "w").write("")
PYEOF
cat >"$W/reader.py" <<'PYEOF'
# An independent reader of llm.c's eval file: -> (version, [(index, label, context, [completion] * 4)])
import struct, sys
def read(path):
    b = open(path, "rb").read()
    h = struct.unpack("<256i", b[:1024])
    assert h[0] == 20240522 and h[1] in (1, 2), h[:2]
    w = 2 if h[1] == 1 else 4
    f = "H" if w == 2 else "I"
    v = struct.unpack(f"<{(len(b) - 1024) // w}{f}", b[1024:])
    out, i, longest = [], 0, 0
    for _ in range(h[2]):
        assert v[i] == (1 << (8 * w)) - 1, "delimiter"
        nbytes, idx, label, n = v[i + 1], v[i + 2], v[i + 3], v[i + 4]
        j = i + 5
        ctx = list(v[j + 1:j + 1 + v[j]]); j += 1 + v[j]
        ends = []
        for _ in range(n):
            ends.append(list(v[j + 1:j + 1 + v[j]])); j += 1 + v[j]
        assert nbytes == (j - i) * w, "EXAMPLE_BYTES"
        longest = max(longest, nbytes)
        out.append((idx, label, ctx, ends))
        i = j
    assert i == len(v) and longest == h[3], "the stream's end, the longest example"
    return h[1], out
PYEOF
check_hs() {   # FILE JSONL TOKENIZER: the file's examples = the jsonl's, tokenized
    $PY - "$@" <<'PYEOF'
import json, sys
sys.path.insert(0, "dev/data"); sys.path.insert(0, sys.argv[1].rsplit("/", 1)[0])
from tinyshakespeare import make_tokenizer
from reader import read
path, jsonl, kind = sys.argv[1], sys.argv[2], sys.argv[3]
tok = make_tokenizer(kind)
bos = [tok.eot] if tok.name == "hf" else []
version, got = read(path)
want = [(i, e["label"], bos + tok.encode(e["ctx"]), [tok.encode(" " + x) for x in e["endings"]])
        for i, e in enumerate(json.loads(l) for l in open(jsonl))]
print(f"version {version}, {len(got)} examples")
sys.exit(not (version == 1 and got == want))
PYEOF
}
$HS --input "$W/hs.jsonl" --out "$W/hs.bin" >"$W/hs.log" 2>&1 && check_hs "$W/hs.bin" "$W/hs.jsonl" gpt2 >"$W/hs_check.log" 2>&1
say $? "hellaswag.py: an independent reader finds llm.c's format, every field and token (GPT-2's BPE of ctx and of ' ' + each ending): $(cat "$W/hs_check.log")"
$PY -c "import sys; sys.path.insert(0, 'dev/reference'); import hf_llama_ref as h; h.make_tokenizer('$W/tok')" >/dev/null 2>&1
$HS --input "$W/hs.jsonl" --out "$W/hs_tok.bin" --tokenizer "$W/tok" >/dev/null 2>&1 && check_hs "$W/hs_tok.bin" "$W/hs.jsonl" "$W/tok" >"$W/hs_check.log" 2>&1
say $? "hellaswag.py --tokenizer DIR: the context after the tokenizer's BOS, its ids: $(cat "$W/hs_check.log")"
$PY - "$W" <<'PYEOF'
import sys
sys.path.insert(0, "dev/data"); sys.path.insert(0, sys.argv[1])
import hellaswag
from reader import read
W = sys.argv[1]
enc = [(2, [1, 70000, 5], [[65535], [3, 4], [128255], [9]]), (0, [65534], [[1], [2], [3], [4]])]
v, longest = hellaswag.write_evalfile(f"{W}/v2.bin", enc)
version, got = read(f"{W}/v2.bin")
ok = v == version == 2 and got == [(i, l, c, e) for i, (l, c, e) in enumerate(enc)]
v1, _ = hellaswag.write_evalfile(f"{W}/v1.bin", [(0, [65534], [[1], [2], [3], [4]])])
print(f"ids 65535 and past: version {version}, read back {'exactly' if ok else 'WRONG'}; the largest 65534 alone: version {v1}")
sys.exit(not (ok and v1 == 1))
PYEOF
say $? "hellaswag.py's version 2 (uint32 fields, delimiter 0xFFFFFFFF) for ids past 65,534, read back exactly"
for c in "label:'label' = 4: expected 0 to 3" "empty:no examples"; do
    n=${c%%:*}; pat=${c#*:}
    $HS --input "$W/hs_$n.jsonl" --out "$W/hs_$n.bin" >"$W/hs_$n.log" 2>&1
    [ $? != 0 ] && [ "$(wc -l <"$W/hs_$n.log")" = 1 ] && grep -qF "$pat" "$W/hs_$n.log" && [ ! -e "$W/hs_$n.bin" ] && [ ! -e "$W/hs_$n.bin.tmp" ]
    say $? "hellaswag.py on a file with $n: one line, nothing written: $(cat "$W/hs_$n.log")"
done

# where the ranks run: rank 0 prints every rank's host and node-local rank (np 4 on this one host)
$MPIRUN -np 4 "$BIN/train_gpt" -e d1 -b 2 -t 32 -x 1 -v 0 -s 0 >"$W/hosts.log" 2>&1
[ "$(grep -c '^hosts:' "$W/hosts.log")" = 1 ] && grep -qx "hosts: $(hostname) ranks 0-3 (local 0-3)" "$W/hosts.log"
say $? "np 4: rank 0 prints every rank's host and local rank: $(grep -m1 '^hosts:' "$W/hosts.log")"

# --hellaswag: a Llama (V 300, the byte-level BPE tokenizer made above) trained here briefly on the examples' own
# text (so it is better than chance), exported: its count = transformers' acc_norm computed the llm.c way on the
# export (each completion's mean cross-entropy, the lowest predicted, the first on a tie), up to examples whose two
# lowest means are within 1e-4 (both sides are fp32 sums of at most 64 token losses of ~5 each: ~1e-6 apart; 1e-4 is
# 100x that); the same count in one process and at dp 2 (B 3: an example's rows across micro-batches), tp 2 + SP,
# pp 2 (cp: below). Some examples exceed the 65 tokens of a row: transformers is given the context cut as the
# format's rule says (from the left, alike for the 4 completions, to fit the longest).
$PY - "$W" <<'PYEOF2'
import json, struct, sys
sys.path.insert(0, "dev/data")
from tinyshakespeare import make_tokenizer
W = sys.argv[1]
tok = make_tokenizer(f"{W}/tok")
ids = []
for l in open(f"{W}/hs.jsonl"):
    e = json.loads(l)
    ids += [tok.eot] + tok.encode(e["ctx"] + " " + e["endings"][e["label"]])
ids = (ids * 40)[:40000]
open(f"{W}/hs_train.bin", "wb").write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)) + struct.pack(f"<{len(ids)}H", *ids))
PYEOF2
M="arch=llama,L=2,C=64,NH=4,KV=2,V=300,maxT=64"
HSB="$W/hs_tok.bin"
"$BIN/train_gpt" -e "$M" -i "$W/hs_train.bin" -b 8 -t 64 -x 40 -l 3e-3 -v 0 -s 0 -o "$W/hs_run" >/dev/null 2>&1
$PY dev/hf.py export "$W/hs_run/model_00000040.bin" "$W/hs_hf" >/dev/null 2>&1
$PY - "$W" >"$W/hs_ref.log" 2>&1 <<'PYEOF2'
import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, transformers
sys.path.insert(0, sys.argv[1])
from reader import read
W = sys.argv[1]
model = transformers.AutoModelForCausalLM.from_pretrained(f"{W}/hs_hf", torch_dtype=torch.float32).eval()
_, examples = read(f"{W}/hs_tok.bin")
correct = near = 0
with torch.no_grad():
    for _, label, ctx, ends in examples:
        means = []
        ctx = ctx[max(0, len(ctx) + max(len(e) for e in ends) - 65):]   # (-t 64: rows of 65 tokens)
        for e in ends:
            row = torch.tensor([ctx + e])
            logits = model(row).logits[0, :-1]
            losses = torch.nn.functional.cross_entropy(logits, row[0, 1:], reduction="none")
            means.append(losses[len(ctx) - 1:].mean().item())
        best = min(range(4), key=lambda c: (means[c], c))
        s = sorted(means)
        near += s[1] - s[0] < 1e-4
        correct += best == label
print(f"transformers {correct} {len(examples)} {near}")
PYEOF2
read -r _ hc hn hnear < <(grep '^transformers ' "$W/hs_ref.log")
for L in "1 -b 4" "2 -b 3" "2 -b 4 --tp 2 --sp" "2 -b 4 --pp 2"; do
    set -- $L; np=$1; shift
    launch="$MPIRUN -np $np"; [ $np = 1 ] && launch=""
    $launch "$BIN/train_gpt" -e "$W/hs_run/model_00000040.bin" -x 0 -t 64 -v 0 -s 0 --hellaswag "$HSB" "$@" >"$W/hs_ours.log" 2>&1
    ours=$(grep -m1 '^HellaSwag: [0-9]*/' "$W/hs_ours.log")
    c=$(sed 's|^HellaSwag: \([0-9]*\)/.*|\1|' <<<"$ours")
    [ -n "$hc" ] && [ -n "$c" ] && awk -v a="$c" -v b="$hc" -v n="$hnear" 'BEGIN { d = a - b; exit !((d < 0 ? -d : d) <= n) }' \
        && grep -q "^HellaSwag: [0-9]*/$hn = " <<<"$ours"
    say $? "--hellaswag under ${*}: ${ours:-no line} = transformers' acc_norm on the export (LlamaForCausalLM), $hc/$hn (near ties: ${hnear:-?})"
done
# a MoE model (the trained model upcycled, 4 experts top-2, dropless here as when sampling): ep 2 x pp 2 with ZeRO-3
# and cp 2 x ep 2 count what one process counts
MOE=(-e "$W/hs_run/model_00000040.bin" --experts 4 --topk 2 -x 0 -t 64 -v 0 -s 0 --hellaswag "$HSB")
one=$("$BIN/train_gpt" "${MOE[@]}" -b 4 2>&1 | grep -m1 '^HellaSwag: [0-9]*/')
for L in "-b 2 --ep 2 --pp 2 --zero 3" "-b 4 --cp 2 --ep 2"; do
    got=$($MPIRUN -np 4 "$BIN/train_gpt" "${MOE[@]}" $L 2>&1 | grep -m1 '^HellaSwag: [0-9]*/')
    [ -n "$one" ] && [ "$got" = "$one" ]
    say $? "--hellaswag on a MoE model under $L: ${got:-no line} = one process's ${one:-none}"
done
"$BIN/train_gpt" -e "$W/hs_run/model_00000040.bin" -i "$W/hs_train.bin" -x 4 -v 2 -m 4 -t 64 -s 0 --hellaswag "$HSB" -o "$W/hs_log" >/dev/null 2>&1
[ "$(grep -c '^s:[0-9]* eval:' "$W/hs_log/main.log")" = 2 ] && $PY dev/plot.py "$W/hs_log/main.log" -o "$W/hs_log/plot.png" >/dev/null 2>&1 && [ -s "$W/hs_log/plot.png" ]
say $? "-v 2 -x 4 --hellaswag: main.log has the evaluations of steps 2 and 4 ($(grep '^s:[0-9]* eval:' "$W/hs_log/main.log" | tr '\n' ' ')), dev/plot.py draws them"
# bad eval files: truncated, wrong magic, a label out of range, -h 1
head -c 1500 "$HSB" >"$W/hs_trunc.bin"
$PY -c "import sys; b = bytearray(open(sys.argv[1], 'rb').read()); b[0] ^= 1; b[1024 + 6] = 7; open(sys.argv[2], 'wb').write(b); b[0] ^= 1; open(sys.argv[3], 'wb').write(b)" "$HSB" "$W/hs_magic.bin" "$W/hs_lab.bin"
for c in "trunc:does not fit" "magic:expected 20240522" "lab:label 7"; do
    n=${c%%:*}; pat=${c#*:}
    "$BIN/train_gpt" -e "$M" -x 0 -t 64 -v 0 -s 0 --hellaswag "$W/hs_$n.bin" >"$W/hs_bad.log" 2>&1
    [ $? = 1 ] && [ "$(grep -c '^error' "$W/hs_bad.log")" = 1 ] && grep -q "^error: --hellaswag .*$pat" "$W/hs_bad.log"
    say $? "--hellaswag on a $n eval file: one line: $(grep -m1 '^error' "$W/hs_bad.log" | cut -c1-150)"
done
"$BIN/train_gpt" -h 1 -x 0 >"$W/hs_h1.log" 2>&1
[ $? = 1 ] && grep -q "^error: -h 1 is llm.c's HellaSwag switch.*--hellaswag FILE" "$W/hs_h1.log"
say $? "-h 1 (llm.c's spelling): $(grep -m1 '^error' "$W/hs_h1.log" | cut -c1-120)"

# the recipe: DRY=1 runs scripts/run_gpt2_124M.sh on the CPU (a 2-layer model, 6 steps, a small local FineWeb and
# HellaSwag file made from text); main.log has validation and HellaSwag lines, and the plot is drawn
t0=$SECONDS
DRY=1 DRY_BIN="$BIN" DRY_DIR="$W/dry" bash scripts/run_gpt2_124M.sh >"$W/dry.log" 2>&1
rc=$?
[ $rc = 0 ] && [ "$(grep -c '^s:[0-9]* tel:' "$W/dry/run/main.log")" -ge 2 ] && [ "$(grep -c '^s:[0-9]* eval:' "$W/dry/run/main.log")" = 2 ] \
    && [ -s "$W/dry/run/loss.png" ] && [ $((SECONDS - t0)) -lt 60 ]
say $? "DRY=1 scripts/run_gpt2_124M.sh: exit $rc in $((SECONDS - t0)) s, main.log: $(grep -E '^s:[0-9]+ (tel|eval):' "$W/dry/run/main.log" 2>/dev/null | tr '\n' ' ')and loss.png"
