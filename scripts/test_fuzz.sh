#!/usr/bin/env bash
# A bounded fuzz test of every file train_gpt reads: a checkpoint (model and state files), a data shard (uint16
# and uint32) and a tokenizer, mutated a few hundred times (bytes flipped in the header and the body, header
# fields set to extreme values, truncated, extended), each resumed or trained on by the single-process build
# (NO_MPI=1, ~0.05 s a run). Every run must end cleanly: exit 0 (a harmless mutation) or exit 1 with
# one "error: ..." line; a signal (a crash), a timeout (a hang) or a silent failure fails the test.
# Then VALID mutations with valid CRCs (the mutated file's CRC recomputed, and the state's record of its model
# file's CRC), so that each reaches the checks behind the CRC: a MoE checkpoint (model file version 23, state
# version 3, resumed without -e, so that its header gives the shape) and a bf16 MoE model file (version 25,
# trained from with -e). Each must end cleanly, and a run that goes on (exit 0) must have been given a legal
# file: only an unused or informational header field changed, or a field set to another legal value of the
# same size (V <= Vp, NH dividing C, k <= E, the router's scores, the generator state, -e's CRC scope 0), or
# a weight to a finite value (AdamW's v: not negative). Fixed seeds: the same mutations every run.
# Last, the flight recorder's rings as dev/flight.sh reads them (a run directory's flight/: two rings of one job):
# 200 mutated headers and truncations, and the reprobe's cases (a world or rank byte set high, a FIFO, a folder in
# a ring's place, another rank's or world's ring): each reading ends within 20 s, exit 0 or 1, and each named case
# is skipped with a line saying why.
# Usage: bash scripts/test_fuzz.sh BIN_DIR WORK_DIR [RUNS (500)] [VALID (300)]  (prints "ok ..." / "FAIL ..." lines)
set -u
W=$2
RUNS=${3:-500}
VALID=${4:-300}
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
# the originals: a checkpoint at step 2, a data shard in each of llm.c's formats (uint16, uint32), a tokenizer
ck = os.path.join(W, "ckpt")
shutil.rmtree(ck, ignore_errors=True)
rc, out = run(base + ["-x", "2", "-n", "2", "-o", ck])
assert rc == 0, out
toks = [random.randrange(256) for _ in range(4000)]
hdr = [0] * 256; hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
data = struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks)
hdr[0], hdr[1] = 20240801, 7
data7 = struct.pack("<256i", *hdr) + struct.pack("<%dI" % len(toks), *toks)
th = [0] * 256; th[0], th[1], th[2], th[3] = 20240328, 2, 256, 255
tok = struct.pack("<256i", *th) + b"".join(bytes([1, i]) for i in range(256))
originals = {"model": open(os.path.join(ck, "model_00000002.bin"), "rb").read(),
             "state": open(os.path.join(ck, "state_00000002.bin"), "rb").read(), "data": data, "data7": data7,
             "tokenizer": tok}
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
    target = ["model", "state", "state", "data", "tokenizer", "model", "state", "state", "data7", "tokenizer"][n % 10]
    d = os.path.join(W, "f")
    shutil.rmtree(d, ignore_errors=True)
    mutated, kind = mutate(originals[target])
    if target in ("model", "state"):
        shutil.copytree(ck, d, ignore=shutil.ignore_patterns(".lock", "main.log"))
        open(os.path.join(d, target + "_00000002.bin"), "wb").write(mutated)
        args = base + ["-x", "3", "-y", "1", "-o", d]
    else:
        os.makedirs(d)
        open(os.path.join(d, "shard.bin"), "wb").write(data if target == "tokenizer" else mutated)   # (data, data7)
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
print(("ok   " if not bad else "FAIL ") + f"fuzz: {runs} mutated model, state, data (uint16, uint32) and tokenizer files: no crash, no hang, no silent failure")
EOF
python3 - "$NOMPI" "$W" "$VALID" <<'EOF'
import math, os, random, shutil, struct, subprocess, sys, zlib
binary, W, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
SEED = 20261207
random.seed(SEED)
TINY = "L=2,C=64,NH=4,V=256,maxT=64,E=4,k=2"   # (every layer MoE: Lm 2, a routing bias of 2 x 4)
flags = ["-t", "32", "-b", "2", "-v", "0", "-s", "0", "-l", "3e-3", "--moe-bias-rate", "0.01"]
def run(args, timeout=20):
    try:
        p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stderr + p.stdout
    except subprocess.TimeoutExpired:
        return None, ""
def header(b):
    return list(struct.unpack("<256i", b[:1024]))
def with_crc(b):   # header slot 255: the CRC-32 of what slot 254 says (1: header and body; else the body)
    h = header(b); h[255] = 0
    crc = zlib.crc32(b[1024:], zlib.crc32(struct.pack("<256i", *h)) if h[254] == 1 else 0) or 1
    return b[:1020] + struct.pack("<I", crc) + b[1024:]
def to_bf16(x):    # round to nearest even, as train_gpt's float_to_bf16
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
# the originals: a MoE checkpoint at step 2 (model file version 23: its routing bias moved), and its model as
# a bf16 file (version 25)
ck = os.path.join(W, "vck")
shutil.rmtree(ck, ignore_errors=True)
rc, out = run(["-e", TINY] + flags + ["-x", "2", "-n", "2", "-o", ck])
assert rc == 0, out
model = open(os.path.join(ck, "model_00000002.bin"), "rb").read()
state = open(os.path.join(ck, "state_00000002.bin"), "rb").read()
mh = header(model); assert mh[1] == 23, mh[:16]
nb = 2 * mh[8]                                        # the routing bias (fp32 in both versions)
P = (len(model) - 1024) // 4 - nb
params = struct.unpack("<%df" % P, model[1024:1024 + 4 * P])
h25 = list(mh); h25[1] = 25
model25 = with_crc(struct.pack("<256i", *h25) + struct.pack("<%dH" % P, *[to_bf16(x) for x in params]) + model[1024 + 4 * P:])
originals = {"model23": model, "state3": state, "model25": model25}
USED = {"model23": list(range(14)) + [254], "model25": list(range(14)) + [254], "state3": list(range(30)) + [254]}
STATE_INFO = {7, 8, 13, 14, 19, 20, 21, 22, 23, 24, 25}   # epoch, shard, the layout, the run's -x: for the reader
def legal_header(target, h0, h):
    """Whether a header that differs from h0 in one slot describes a legal file of the same size."""
    s = [i for i in range(255) if h[i] != h0[i]][0]
    if target == "state3":
        if s in STATE_INFO or s >= 30: return True
        if s in (15, 16): return (h[15] | h[16]) != 0          # another generator state, not 0
        if s == 18: return 0 <= h[18] <= h[4]                  # skipped updates in a row, at most all skipped
        return False
    if 14 <= s < 254: return True                               # unused by versions 23/25
    if s == 3: return 1 <= h[3] <= h[7]                         # V <= Vp
    if s == 5: return 1 <= h[5] <= h[6] and h[6] % h[5] == 0    # NH divides C
    if s == 9: return 1 <= h[9] <= h[8] and (h[11] == 0 or h[9] >= 2)   # k <= E (sigmoid: k >= 2)
    if s == 11: return h[11] in (0, 1) and (h[11] == 0 or h[9] >= 2)
    if s == 254: return target == "model25" and h[254] == 0     # a body-only CRC: -e reads older files
    return False
def legal_body(target, b, off):
    """Whether the body value holding byte off is still legal (finite; AdamW's v not negative)."""
    if target == "model25" and off < 1024 + 2 * P:
        i = (off - 1024) & ~1
        x = struct.unpack("<f", struct.pack("<I", struct.unpack("<H", b[1024 + i:1026 + i])[0] << 16))[0]
        return math.isfinite(x)
    base = 1024 + 2 * P if target == "model25" else 1024
    i = (off - base) & ~3
    x = struct.unpack("<f", b[base + i:base + i + 4])[0]
    return math.isfinite(x) and not (target == "state3" and P <= i // 4 < 2 * P and x < 0)
def mutate(target, b):
    b = bytearray(b)
    kind = random.choice(["field", "field", "field", "flip_header", "flip_body", "truncate", "extend"])
    off = None
    if kind == "field":
        i = random.choice(USED[target] + [random.randrange(255)])
        v = random.choice([0, 1, -1, 2, 3, 7, 64, 255, 256, 257, 1000000, 2**31 - 1, -2**31, random.randrange(-2**31, 2**31)])
        b[4 * i:4 * i + 4] = struct.pack("<i", v)
    elif kind == "flip_header":
        b[random.randrange(1020)] ^= 1 << random.randrange(8)
    elif kind == "flip_body":
        off = random.randrange(1024, len(b)); b[off] ^= 1 << random.randrange(8)
    elif kind == "truncate":
        b = b[:random.randrange(1024, len(b))]
    else:
        b += bytes(random.randrange(256) for _ in range(random.randrange(1, 64)))
    return with_crc(bytes(b)), kind, off
stats = {"clean": 0, "legal": 0, "crash": 0, "hang": 0, "silent": 0, "illegal": 0}
bad = []
for n in range(runs):
    target = ["model23", "state3", "model25"][n % 3]
    d = os.path.join(W, "v")
    shutil.rmtree(d, ignore_errors=True)
    orig = originals[target]
    mutated, kind, off = mutate(target, orig)
    if target == "model25":
        os.makedirs(d)
        path = os.path.join(d, "model25.bin")
        open(path, "wb").write(mutated)
        args = ["-e", path] + flags + ["-x", "1"]
    else:
        shutil.copytree(ck, d, ignore=shutil.ignore_patterns(".lock"))   # (main.log: the run's identity checked)
        st = state
        if target == "model23":
            open(os.path.join(d, "model_00000002.bin"), "wb").write(mutated)
            h = header(st); h[26] = header(mutated)[255]                    # the state names this model file
            st = with_crc(struct.pack("<256i", *h) + st[1024:])
        else:
            st = mutated
        open(os.path.join(d, "state_00000002.bin"), "wb").write(st)
        args = flags + ["-x", "3", "-y", "1", "-o", d]                      # no -e: the checkpoint's shape
    rc, out = run(args)
    h0, h = header(orig), header(mutated)
    changed = [i for i in range(255) if h[i] != h0[i]]
    what = f"{target} {kind}: slots {changed} {[h0[i] for i in changed]} -> {[h[i] for i in changed]}"
    if rc is None:
        stats["hang"] += 1; bad.append(what + ": timeout")
    elif rc < 0 or rc >= 128:
        stats["crash"] += 1; bad.append(what + f": signal/exit {rc}")
    elif rc == 0:
        if len(mutated) == len(orig) and (legal_body(target, mutated, off) if kind == "flip_body" else
                                          not changed or (len(changed) == 1 and legal_header(target, h0, h))):
            stats["legal"] += 1
        else:
            stats["illegal"] += 1; bad.append(what + ": ran (exit 0) on an illegal file")
    elif any(l.startswith("error: ") for l in out.splitlines()):
        stats["clean"] += 1
    else:
        stats["silent"] += 1; bad.append(what + f": exit {rc} without an error line: {out[-200:]!r}")
print(f"     ({runs} mutations with valid CRCs, seed {SEED}: {stats['clean']} refused with an error line, {stats['legal']} ran "
      f"on a legal file, {stats['illegal']} ran on an illegal one, {stats['crash']} crashes, {stats['hang']} hangs, "
      f"{stats['silent']} silent failures)")
for b in bad[:5]:
    print("     ", b)
print(("ok   " if not bad else "FAIL ") + f"fuzz: {runs} mutated MoE model files (versions 23, 25) and state files (version 3) "
      f"with valid CRCs (seed {SEED}): each refused with an error line, or legal and run ({stats['legal']})")
EOF

bash dev/flight.sh /nonexistent >/dev/null 2>&1   # (builds build/flight)
python3 - build/flight "$W" "$NOMPI" <<'EOF'
import os, random, shutil, struct, subprocess, sys
flight, W, nompi = sys.argv[1], sys.argv[2], sys.argv[3]
random.seed(20261203)
run_dir = os.path.join(W, "ringrun")
shutil.rmtree(run_dir, ignore_errors=True)
subprocess.run([nompi, "-e", "L=2,C=64,NH=4,V=256,maxT=64", "-t", "32", "-b", "2", "-x", "2", "-v", "0", "-s", "0",
                "-o", run_dir], capture_output=True, text=True)
ring0 = open(os.path.join(run_dir, "flight", "rank_00000.ring"), "rb").read()
def as_rank(b, rank, world):   # header: magic 8, version, header_bytes, record_bytes, capacity, rank (24), world (28)
    b = bytearray(b); b[24:32] = struct.pack("<2i", rank, world); return bytes(b)
rings = [as_rank(ring0, 0, 2), as_rank(ring0, 1, 2)]
def mutate(b):
    b = bytearray(b)
    kind = random.choice(["flip", "flip", "field", "byte", "truncate"])
    if kind == "flip":
        b[random.randrange(1600)] ^= 1 << random.randrange(8)
    elif kind == "field":
        i = random.randrange(0, 64)
        b[4 * i:4 * i + 4] = struct.pack("<i", random.choice([0, -1, 1, 2, 65536, 65537, 2**31 - 1, -2**31]))
    elif kind == "byte":
        b[random.randrange(16, 40)] = random.randrange(256)
    else:
        b = b[:random.randrange(len(b))]
    return bytes(b), kind
D = os.path.join(W, "rings")
def trial(name, setup):
    shutil.rmtree(D, ignore_errors=True)
    os.makedirs(D)
    for r, b in enumerate(rings):
        open(os.path.join(D, "rank_%05d.ring" % r), "wb").write(b)
    setup(D)
    try:
        p = subprocess.run([flight, D, "--list", "4"], capture_output=True, text=True, errors="replace", timeout=20)
    except subprocess.TimeoutExpired:
        return f"{name}: timeout", ""
    if p.returncode not in (0, 1):
        return f"{name}: exit {p.returncode}", p.stderr
    if p.returncode == 0 and not p.stdout.startswith("diagnosis: "):
        return f"{name}: exit 0 without a diagnosis line", p.stderr
    return None, p.stderr
def write_ring(rank, data):
    return lambda d: open(os.path.join(d, "rank_%05d.ring" % rank), "wb").write(data)
def set_byte(i, v):
    b = bytearray(rings[1]); b[i] = v; return write_ring(1, bytes(b))
def replace(make):
    return lambda d: (os.unlink(os.path.join(d, "rank_00001.ring")), make(os.path.join(d, "rank_00001.ring")))
named = {"byte 31 = 0x53 (world)": set_byte(31, 0x53), "byte 27 = 0x10 (rank)": set_byte(27, 0x10),
         "byte 26 = 0x80 (rank)": set_byte(26, 0x80), "byte 30 = 0x7f (world)": set_byte(30, 0x7f),
         "a FIFO as rank 1's ring": replace(os.mkfifo), "a folder as rank 1's ring": replace(os.mkdir),
         "rank 1's ring naming rank 0": write_ring(1, as_rank(ring0, 0, 2)),
         "rank 1's ring naming world 3": write_ring(1, as_rank(ring0, 1, 3))}
bad, said = [], {}
for k, f in named.items():   # each skipped, saying why
    x, err = trial(k, f)
    said[k] = err.strip()
    if x or "flight: skipped" not in err:
        bad.append(x or f"{k}: no line saying the ring was skipped")
n = 200
for i in range(n):
    m, kind = mutate(rings[i % 2])
    x, _ = trial(f"mutation {i} ({kind})", write_ring(i % 2, m))
    if x:
        bad.append(x)
for b in bad[:5]:
    print("     ", b)
print(("ok   " if not bad else "FAIL ") + f"fuzz: dev/flight.sh on {n} mutated rings and {len(named)} named cases (world and rank "
      f"bytes high, a FIFO, a folder, another rank's or world's ring: each skipped with a line): each read ends within "
      f"20 s, exit 0 or 1; e.g. {said['byte 31 = 0x53 (world)'][:160]}")
EOF
