#!/usr/bin/env bash
# A bounded fuzz test of every file train_gpt reads: a checkpoint (model and state files), a data shard
# and a tokenizer, mutated a few hundred times (bytes flipped in the header and the body, header fields
# set to extreme values, truncated, extended), each resumed or trained on by the single-process build
# (NO_MPI=1, ~0.05 s a run). Every run must end cleanly: exit 0 (a harmless mutation) or exit 1 with
# one "error: ..." line; a signal (a crash), a timeout (a hang) or a silent failure fails the test.
# Usage: bash scripts/test_fuzz.sh BIN_DIR WORK_DIR [RUNS (default 300)]  (prints "ok ..." / "FAIL ..." lines)
set -u
W=$2
RUNS=${3:-500}
mkdir -p "$W"
NOMPI=build/cpu-nompi/train_gpt
[ -x "$NOMPI" ] || { echo "FAIL fuzz: $NOMPI is missing (make NO_MPI=1 BUILD_DIR=build/cpu-nompi)"; exit 0; }
python3 - "$NOMPI" "$W" "$RUNS" <<'EOF'
import os, random, shutil, struct, subprocess, sys
binary, W, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
random.seed(20261130)
TINY = "L=2,C=64,NH=4,V=256,maxT=64"
base = ["-e", TINY, "-t", "32", "-b", "2", "-v", "0", "-s", "0", "-l", "3e-3"]
def run(args, timeout=20):
    try:
        p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stderr + p.stdout
    except subprocess.TimeoutExpired:
        return None, ""
# the originals: a checkpoint at step 2, a data shard, a tokenizer (llm.c formats)
ck = os.path.join(W, "ckpt")
shutil.rmtree(ck, ignore_errors=True)
rc, out = run(base + ["-x", "2", "-n", "2", "-o", ck])
assert rc == 0, out
toks = [random.randrange(256) for _ in range(4000)]
hdr = [0] * 256; hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
data = struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks)
th = [0] * 256; th[0], th[1], th[2], th[3] = 20240328, 2, 256, 255
tok = struct.pack("<256i", *th) + b"".join(bytes([1, i]) for i in range(256))
originals = {"model": open(os.path.join(ck, "model_00000002.bin"), "rb").read(),
             "state": open(os.path.join(ck, "state_00000002.bin"), "rb").read(), "data": data, "tokenizer": tok}
def mutate(b):
    b = bytearray(b)
    kind = random.choice(["flip_header", "flip_body", "field", "field", "truncate", "extend"])
    if kind == "flip_header":
        b[random.randrange(1024)] ^= 1 << random.randrange(8)
    elif kind == "flip_body":
        b[random.randrange(1024, len(b))] ^= 1 << random.randrange(8)
    elif kind == "field":
        i = random.choice(list(range(16)) + [255, random.randrange(256)])
        b[4 * i:4 * i + 4] = struct.pack("<i", random.choice([0, 1, -1, 2, 7, 1000000, 2**31 - 1, -2**31, random.randrange(-2**31, 2**31)]))
    elif kind == "truncate":
        b = b[:random.randrange(len(b))]
    else:
        b += bytes(random.randrange(256) for _ in range(random.randrange(1, 64)))
    return bytes(b), kind
stats = {"clean": 0, "ran": 0, "crash": 0, "hang": 0, "silent": 0}
bad = []
for n in range(runs):
    target = ["model", "state", "state", "data", "tokenizer"][n % 5]
    d = os.path.join(W, "f")
    shutil.rmtree(d, ignore_errors=True)
    mutated, kind = mutate(originals[target])
    if target in ("model", "state"):
        shutil.copytree(ck, d, ignore=shutil.ignore_patterns(".lock", "main.log"))
        open(os.path.join(d, target + "_00000002.bin"), "wb").write(mutated)
        args = base + ["-x", "3", "-y", "1", "-o", d]
    else:
        os.makedirs(d)
        open(os.path.join(d, "shard.bin"), "wb").write(data if target == "tokenizer" else mutated)
        open(os.path.join(d, "tokenizer.bin"), "wb").write(mutated if target == "tokenizer" else tok)
        args = base + ["-x", "2", "-i", os.path.join(d, "shard.bin"), "-s", "2", "-g", "8"]
        args.remove("-s"); args.remove("0")   # (sample, so the tokenizer is used)
    rc, out = run(args)
    if rc is None:
        stats["hang"] += 1; bad.append((target, kind, "timeout"))
    elif rc < 0 or rc >= 128:
        stats["crash"] += 1; bad.append((target, kind, f"signal/exit {rc}"))
    elif rc == 0:
        stats["ran"] += 1
    elif any(l.startswith("error: ") for l in out.splitlines()):
        stats["clean"] += 1
    else:
        stats["silent"] += 1; bad.append((target, kind, f"exit {rc} without an error line: {out[-200:]!r}"))
print(f"     ({runs} mutations: {stats['clean']} clean errors, {stats['ran']} ran (harmless mutations), "
      f"{stats['crash']} crashes, {stats['hang']} hangs, {stats['silent']} silent failures)")
for b in bad[:5]:
    print("     ", b)
print(("ok   " if not bad else "FAIL ") + f"fuzz: {runs} mutated model, state, data and tokenizer files: no crash, no hang, no silent failure")
EOF
