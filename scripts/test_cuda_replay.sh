#!/usr/bin/env bash
# CUDA kernels whose bodies are replayed on the CPU, every block and thread in turn (dev/cuda/*_replay.cu:
# the all-SM column sums, the multi-tensor AdamW launch, the cross-entropy kernels in bf16 and fp32,
# the flash kernels with their warp operations emulated from the PTX layouts;
# built by nvcc as host code: no GPU needed): their indexing and slicing against the exact results.
# Usage: bash scripts/test_cuda_replay.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
set -u
cd "$(dirname "$0")/.."
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
# (the five binaries built first, two at a time: nvcc is most of their cost on 2 cores)
make -s -j2 -C dev/cuda bin/column_sums_replay bin/adamw_replay bin/fused_ce_replay bin/fused_ce_replay_fp32 bin/flash_replay \
    2>&1 || echo "FAIL make -C dev/cuda: the replay binaries"
make -s -C dev/cuda replay 2>&1 || echo "FAIL make -C dev/cuda replay"
make -s -C dev/cuda flash-replay 2>&1 || echo "FAIL make -C dev/cuda flash-replay"
# the replay's emulation must be able to fail: an ldmatrix with .trans inverted, a cp.async wait that retires one
# group too few (its tile read before it landed)
for m in ldmatrix cp-wait; do
    out=$(./dev/cuda/bin/flash_replay --mutate-$m 2>&1)
    n=$(grep -c '^FAIL flash replay B' <<< "$out") total=$(grep -c 'flash replay B' <<< "$out")
    [ "$n" -ge 1 ] && echo "ok   flash replay --mutate-$m fails: $n of $total comparisons" \
        || echo "FAIL flash replay --mutate-$m: the mutation was not caught"
done
