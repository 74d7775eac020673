#!/usr/bin/env bash
# The last step of `make train`: tinyshakespeare -> token shards (GPT-2 tokens with the PyPI packages
# of scripts/setup.sh, else bytes), a small model trained on them with samples printed as text, and
# its loss curve. Without the text file it trains on the built-in corpus instead.
# Usage: bash scripts/train_tinyshakespeare.sh [BIN_DIR [TEXT]]   (OUT=dir for main.log and loss.png)
set -eu
cd "$(dirname "$0")/.."
BIN=${1:-.}
TEXT=${2:-../shared/data/tinyshakespeare.txt}
OUT=${OUT:-out/tinyshakespeare}
DATA=dev/data/tinyshakespeare
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3

if [ ! -f "$TEXT" ]; then
    echo "== no $TEXT: training on the built-in corpus instead"
    "$BIN/train_gpt" -o out/builtin --overwrite   # (make train again: a fresh run, the last one replaced)
    exit
fi
echo "== tokenizing $TEXT"
$PY dev/data/tinyshakespeare.py --input "$TEXT" --out $DATA
V=$(od -An -t d4 -j 8 -N 4 $DATA/tokenizer.bin | tr -d ' ')   # the tokenizer's vocab size (header [2])
echo "== training a 4-layer model (C 128, vocab $V) for 300 steps of 8x64 tokens; samples every 100 steps"
"$BIN/train_gpt" -i $DATA/tiny_shakespeare_train.bin -j $DATA/tiny_shakespeare_val.bin \
    -e "L=4,C=128,NH=4,V=$V,maxT=256" -b 8 -t 64 -x 300 -l 3e-3 -u 20 -q 0.1 -c 0.1 -v 25 -m 8 -s 100 -g 64 -o "$OUT" --overwrite
if $PY -c "import matplotlib" 2>/dev/null; then
    $PY dev/plot.py "$OUT/main.log" -o "$OUT/loss.png" --label "tinyshakespeare, vocab $V" --smooth 10 \
        --title "train_gpt: 4 layers, C 128, 512 tokens/step"
else
    echo "(no matplotlib for $PY: no loss plot; bash scripts/setup.sh installs it)"
fi
