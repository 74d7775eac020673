#!/usr/bin/env bash
# GPT-2 124M on FineWeb 10B as llm.c's users run it (llm.c's recipe): 12 layers, 768 channels, 12 heads, -b 64
# -t 1024 per GPU, 524,288 tokens a step (the rest by gradient accumulation over the GPUs found), ZeRO-1, AdamW lr
# 6e-4 with 700 warm-up steps and a cosine decay to 0, weight decay 0.1, 18,865 steps (~10B tokens, one epoch);
# validation loss and HellaSwag every 250 steps, a checkpoint every 5,000, and -y 2: a rerun resumes.
#   bash scripts/run_gpt2_124M.sh            the data first if missing (dev/data/fineweb.py, dev/data/hellaswag.py:
#                                            downloads, or FINEWEB_INPUT=DIR of local parquet / jsonl and
#                                            HELLASWAG_INPUT=FILE), then training on every GPU of this machine
#   DRY=1 bash scripts/run_gpt2_124M.sh      the same script on the CPU in under a minute: a 2-layer model, a few
#                                            steps, a small local shard and eval file made here; main.log with val and
#                                            HellaSwag lines, and its plot
# Extra flags go to train_gpt (e.g. --recompute mlp where -b 64 does not fit). OUT=DIR sets -o (log124M).
# On many nodes, the same command under mpirun --hostfile or srun (README, "Many nodes").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
OUT=${OUT:-log124M}
if [ "${DRY:-0}" = 1 ]; then
    D=${DRY_DIR:-build/dry124M}
    rm -rf "$D" && mkdir -p "$D/in"
    # a small local "FineWeb": tinyshakespeare's paragraphs (or this repository's README) as jsonl documents, and
    # HellaSwag-format examples from its lines (ctx a line, the right ending the next line, three other lines)
    "$PY" - "$D" <<'PYEOF'
import json, os, random, sys
D = sys.argv[1]
src = "../shared/data/tinyshakespeare.txt" if os.path.exists("../shared/data/tinyshakespeare.txt") else "README.md"
text = open(src, encoding="utf-8").read()[:300000]
docs = [d for d in text.split("\n\n") if d.strip()]
with open(f"{D}/in/docs.jsonl", "w") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
lines = [l for l in text.splitlines() if 20 < len(l) < 80]
rng = random.Random(0)
with open(f"{D}/hellaswag.jsonl", "w") as f:
    for i in range(24):
        k = rng.randrange(len(lines) - 1)
        endings = [lines[rng.randrange(len(lines))] for _ in range(3)]
        label = rng.randrange(4)
        endings.insert(label, lines[k + 1])
        f.write(json.dumps({"ctx": lines[k], "endings": endings, "label": label}) + "\n")
PYEOF
    "$PY" dev/data/fineweb.py --input "$D/in" --out "$D/fineweb" --shard-size 20000 --workers 2
    "$PY" dev/data/hellaswag.py --input "$D/hellaswag.jsonl" --out "$D/hellaswag_val.bin"
    TG=${DRY_BIN:-build/cpu-nompi}/train_gpt   # (DRY_BIN: a build of one's own, used as it is)
    [ -n "${DRY_BIN:-}" ] || make -s BACKEND=cpu NO_MPI=1 BUILD_DIR=build/cpu-nompi
    CMD=("$TG" -i "$D/fineweb/fineweb_train_*.bin" -j "$D/fineweb/fineweb_val_*.bin" -o "$D/run"
         -e "L=2,C=64,NH=4,V=50257,maxT=64" -b 4 -t 64 -d 512 --zero 1 -l 6e-4 -u 2 -q 0.0 -c 0.1 -x 6 -v 3 -m 4
         -n 3 -y 2 -s 0 --hellaswag "$D/hellaswag_val.bin")
    echo "DRY=1: ${CMD[*]} $*"
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "${CMD[@]}" "$@"
    "$PY" dev/plot.py "$D/run/main.log" -o "$D/run/loss.png"
    exit 0
fi

DATA=dev/data/fineweb10B
HS=dev/data/hellaswag/hellaswag_val.bin
if ! ls $DATA/fineweb_train_*.bin >/dev/null 2>&1; then
    echo "== FineWeb 10B into $DATA (about 100 shards of 100M tokens)"
    "$PY" dev/data/fineweb.py --version 10B ${FINEWEB_INPUT:+--input "$FINEWEB_INPUT"} --out $DATA
fi
if [ ! -f $HS ]; then
    echo "== HellaSwag's validation set into $HS"
    "$PY" dev/data/hellaswag.py ${HELLASWAG_INPUT:+--input "$HELLASWAG_INPUT"} --out $HS
fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
if [ "$NGPU" -lt 1 ]; then echo "error: no GPU found (nvidia-smi -L); DRY=1 runs the recipe on the CPU" >&2; exit 1; fi
make -s BACKEND=cuda
CMD=(./train_gpt -i "$DATA/fineweb_train_*.bin" -j "$DATA/fineweb_val_*.bin" -o "$OUT" -e d12 -b 64 -t 1024
     -d 524288 --zero 1 -l 0.0006 -u 700 -q 0.0 -c 0.1 -x 18865 -v 250 -m 20 -n 5000 -y 2 -s 20000
     --hellaswag "$HS")
LAUNCH=(mpirun -np "$NGPU")
[ "$(id -u)" = 0 ] && LAUNCH+=(--allow-run-as-root)
echo "== ${LAUNCH[*]} ${CMD[*]} $*"
"${LAUNCH[@]}" "${CMD[@]}" "$@"
"$PY" dev/plot.py "$OUT/main.log" -o "$OUT/loss.png"
