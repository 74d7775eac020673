#!/usr/bin/env bash
# CUDA kernels whose bodies are replayed on the CPU, every block and thread in turn (dev/cuda/*_replay.cu,
# built by nvcc as host code: no GPU needed): their indexing and slicing against the exact results.
# Usage: bash scripts/test_cuda_replay.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
set -u
cd "$(dirname "$0")/.."
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
make -s -C dev/cuda replay 2>&1 || echo "FAIL make -C dev/cuda replay"
