#!/usr/bin/env bash
# --trace: every rank writes a valid Chrome trace with the spans it promises (the forward and backward of
# each layer and micro-batch, the head, collectives with their group and bytes, the pipeline exchanges,
# the optimizer, checkpoints), and the bubble measured from the trace is the one --comm-report prints;
# --comm-report's exposed communication per group.
# Usage: bash scripts/test_trace.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"

# pp 2 x dp 2, 4 micro-batches, 3 steps, a checkpoint at step 3
$MPIRUN -np 4 "$BIN/train_gpt" -e "L=4,C=64,NH=4,V=256,maxT=64" -t 32 -b 2 -d 512 -x 3 -n 3 -v 0 -s 0 --pp 2 --zero 1 \
    --comm-report --trace "$W/tr" -o "$W/out" >"$W/run.log" 2>&1
say $? "train_gpt --trace runs under pp 2 x dp 2"
python3 - "$W/tr" "$W/run.log" <<'EOF'
import json, os, re, sys
d, log = sys.argv[1], open(sys.argv[2]).read()
def say(ok, msg): print(("ok   " if ok else "FAIL ") + msg)
files = sorted(f for f in os.listdir(d) if re.fullmatch(r"trace_\d\.json", f))
say(files == ["trace_%d.json" % r for r in range(4)], f"one trace file per rank: {files}")
ev = {int(f[6]): [e for e in json.load(open(os.path.join(d, f)))["traceEvents"] if e.get("ph") == "X"] for f in files}
def names(r, cat): return [(e["name"], e.get("args", {}).get("layer"), e.get("args", {}).get("micro")) for e in ev[r] if e["cat"] == cat]
# stage 0 (ranks 0, 1: tp 1, so pp_rank = rank % 2... with tp 1: pp_rank = r % 2) holds layers 0-1, stage 1 layers 2-3
for r in range(4):
    st = r % 2
    layers = [0, 1] if st == 0 else [2, 3]
    fw = sorted((l, m) for n, l, m in names(r, "forward") if n == "layer")
    bw = sorted((l, m) for n, l, m in names(r, "backward") if n == "layer")
    want = sorted((l, m) for l in layers for m in range(4)) * 3
    say(fw == sorted(want) and bw == sorted(want), f"rank {r}: a forward and a backward span per layer {layers} and micro-batch, 3 steps")
heads = [m for n, l, m in names(1, "forward+backward")]
say(sorted(heads) == sorted([0, 1, 2, 3] * 3), "the last stage traces the head of every micro-batch")
comm = [e for e in ev[0] if e["cat"] == "comm"]
arg = lambda e, k: e.get("args", {}).get(k)   # (a wait span has no args)
say(any(arg(e, "group") == "dp" and arg(e, "bytes") > 0 for e in comm) and any(arg(e, "group") == "pp" for e in comm),
    f"collectives with their group and bytes ({len(comm)} on rank 0: dp, pp, ...)")
say(all(sum(1 for e in ev[r] if e["cat"] == "optimizer") == 3 and sum(1 for e in ev[r] if e["cat"] == "io") == 1 for r in range(4)),
    "an optimizer span per step and the checkpoint on every rank")
rep = [float(x) for x in re.findall(r"stage \d: ([0-9.]+)", log)]
steps = {r: [e for e in ev[r] if e["cat"] == "step"][1:] for r in range(4)}
def bubble(r):
    fr = [sum(e["dur"] for e in ev[r] if e["cat"] == "pipeline" and e["ts"] >= s["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-3) / s["dur"] for s in steps[r]]
    return sum(fr) / len(fr)
tr = [bubble(0), bubble(1)]   # the report prints the (tp 0, dp 0) rank of each stage: ranks 0 and 1
say(len(rep) == 2 and all(abs(a - b) < 0.01 for a, b in zip(rep, tr)), f"bubble from the trace {tr[0]:.3f} {tr[1]:.3f} = --comm-report's {rep}")
# the exposed communication (CPU: time inside each group's MPI calls and waits, per step): a line per rank and
# group; zero exactly where a group moved nothing (one rank), positive where it moved bytes; never more in all
# than the step itself
exp = {(int(r), g): float(v) for r, g, v in re.findall(r"^exposed (\d+) (\w+) ([0-9.]+)$", log, re.M)}
moved = {(int(r), g): float(b) for r, g, b in re.findall(r"^comm (\d+) (\w+) ([0-9.]+)$", log, re.M)}
step = float(re.search(r"^exposed communication .* step ([0-9.]+) ms:$", log, re.M).group(1))
groups = sorted({g for _, g in exp})
want = ["cp", "dp", "edp", "emb", "ep", "pp", "tp", "world"]   # (no cp: no dpcp group)
say(groups == want and len(exp) == 4 * len(want), f"an exposed-communication line per rank and group ({len(exp)} of 32: {groups})")
say(all((exp[k] > 0) == (b > 0) for k, b in moved.items()),
    "exposed time > 0 exactly in the groups that moved bytes (" + ", ".join(f"{g} {exp[(0, g)]:.2f}" for g in groups) + " ms on rank 0)")
say(all(sum(v for (r2, _), v in exp.items() if r2 == r) <= step for r in range(4)),
    f"each rank's exposed time in all groups is at most its step ({step} ms)")
EOF
say $? "the trace checks above ran to their end (an exception would skip the rest)"
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
if $PY -c "import matplotlib" 2>/dev/null; then
    $PY dev/trace.py "$W/tr" --png "$W/tr.png" --merge "$W/merged.json" >/dev/null 2>&1 && [ -s "$W/tr.png" ] && python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$W/merged.json"
    say $? "dev/trace.py merges the ranks into one trace and draws the timeline"
fi
