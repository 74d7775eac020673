#!/usr/bin/env bash
# A GPU session in one call (issue #57): gpu_check.sh, then dev/bench/bench_gpu.sh, then gpu_layouts.sh, each under
# its own budget inside one deadline, so that the call ends well inside the device's limit; what did not fit is
# said in the summary. The logs come back as one tarball ($OUT/gpu_logs.tar.gz) beside the summary.
#   bash scripts/gpu_session.sh --prepare   here (nvcc 13, PyPI, PyTorch): the CUDA binaries (bf16, fp32, cuDNN;
#                                           MPI builds with the Open MPI wheel's mpicxx) and the kernel harnesses
#                                           built for sm_90, the PyTorch references written, all packed with the
#                                           wheel into build/gpu_carry.tar.xz: carry that one file
#   bash scripts/gpu_session.sh [SECONDS]   there (default 540): unpacks it, checks that the carried binaries load
#                                           (else builds them there), runs the three
set -u
cd "$(dirname "$0")/.."
PACK=build/gpu_carry.tar.xz
# the references: carried (xz leaves float data near its size: ~45 MB of the 64 MB a call carries), and written
# there by PyTorch in the background while the harnesses run (d4 alone is 218 MB)
REFS="tiny l8 moe muon llama llama_hs128 llama_mixtral llama_olmoe llama_qwenmoe muon_mixtral"
REFS_THERE="d4 moe_pos moe_dl moe_k1 moe_sig muon_moe"
# write_refs PY NAME...: each reference as scripts/test_matrix.sh's `reference` line writes it
write_refs() {
    local py=$1 r args; shift
    for r in "$@"; do
        [ -f refs/$r/dterm.bin ] && continue   # (written last: a whole reference)
        args=$(sed -n "s/^reference $r \(.*\)/\1/p" scripts/test_matrix.sh | sed 's/ *#.*//')
        [ -n "$args" ] || { echo "no reference line for $r in scripts/test_matrix.sh"; return 1; }
        $py dev/reference/gpt2_ref.py $args --out refs/$r >/dev/null || { echo "reference $r failed"; return 1; }
    done
}

if [ "${1:-}" = --prepare ]; then
    bash scripts/gpu_layouts.sh --prepare || exit 1
    source scripts/gpu_env.sh
    write_refs /usr/bin/python3 $REFS || exit 1
    make BACKEND=cuda BUILD_DIR=build/cuda -j2 >/dev/null &&
    make BACKEND=cuda BUILD_DIR=build/cuda-fp32 PRECISION=FP32 -j2 >/dev/null &&
    make BACKEND=cuda BUILD_DIR=build/cuda-cudnn USE_CUDNN=1 -j2 >/dev/null &&
    make -C dev/cuda -j2 >/dev/null && make -C dev/cuda PRECISION=FP32 -j2 >/dev/null || { echo "a build failed"; exit 1; }
    tar -cf - build/carry build/cuda build/cuda-fp32 build/cuda-cudnn dev/cuda/bin $(for r in $REFS; do echo refs/$r; done) | xz -T0 -6 > $PACK
    echo "carry: $PACK ($(du -h $PACK | cut -f1))"
    exit 0
fi

TOTAL=${1:-540}
T0=$(date +%s)
left() { echo $(( TOTAL - ($(date +%s) - T0) )); }
OUT=${OUT:-build/gpu_out}
LOGS=build/gpu_logs
mkdir -p "$OUT" "$LOGS"
exec > >(tee "$LOGS/session.log") 2>&1
echo "=== gpu_session: $(date -u), budget ${TOTAL}s"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode,clocks.max.sm --format=csv,noheader
[ -f $PACK ] && tar -xJf $PACK && echo "unpacked $PACK"
PY_LD=${LD_LIBRARY_PATH:-}   # PyTorch keeps its own CUDA libraries: the benches run with the machine's path
source scripts/gpu_env.sh
export PY="env LD_LIBRARY_PATH=$PY_LD python3"
# the references not carried, written by PyTorch on 4 threads while the harnesses run; gpu_check.sh waits for them
export REFS_READY=$LOGS/refs_ready
rm -f $REFS_READY
( OMP_NUM_THREADS=4 write_refs "$PY" $REFS_THERE > $LOGS/refs_there.log 2>&1; echo "refs written: exit $?" >> $LOGS/refs_there.log
  touch $REFS_READY ) &
# the carried binaries load here (every library found), or they are built here
SKIP_BUILD=1
for b in build/cuda/train_gpt build/cuda/test_gpt build/cuda-fp32/test_gpt dev/cuda/bin/bf16/matmul; do
    if ! "$b" -h >/dev/null 2>&1 && ldd "$b" 2>&1 | grep -q "not found"; then
        echo "$b does not load here: $(ldd "$b" | grep 'not found' | tr '\n' ' '); building here"; SKIP_BUILD=0
    fi
done
[ -x build/cuda-cudnn/train_gpt ] && ! build/cuda-cudnn/train_gpt -h >/dev/null 2>&1 &&
    echo "build/cuda-cudnn does not load here: $(ldd build/cuda-cudnn/train_gpt | grep 'not found' | tr '\n' ' ')"
export SKIP_BUILD

# 1. gpu_check.sh: its own budget (at most 340 s: it needed ~330 on 2026-12-04)
b=$(( $(left) - 190 )); [ $b -gt 340 ] && b=340
echo "=== 1. gpu_check.sh (budget ${b}s)"
BENCH="env LOG_DIR=$LOGS/bench bash dev/bench/bench_gpu.sh build/cuda 20"
BEFORE_QUEUE="setsid $BENCH start" WAIT_QUIET="$BENCH wait" LOG_DIR=$LOGS/gpu_check timeout $b bash scripts/gpu_check.sh
echo "gpu_check exit $?"

# 2. the benchmark beside PyTorch (GPT-2 124M, then the Llama 135M shape), 20 steps
b=$(( $(left) - 100 )); [ $b -gt 170 ] && b=170
if [ $b -ge 40 ]; then
    echo "=== 2. bench_gpu.sh (budget ${b}s)"
    timeout $b $BENCH all; echo "bench_gpu exit $?"
else echo "=== 2. bench_gpu.sh: not run (${b}s left for it)"; fi
kill $(cat $LOGS/bench/torch_*.pid 2>/dev/null) 2>/dev/null   # PyTorch runs the benchmark did not time

# 3. several ranks on one GPU: what is left
b=$(( $(left) - 15 ))
if [ $b -ge 30 ]; then
    echo "=== 3. gpu_layouts.sh (budget ${b}s)"
    LOG_DIR=$LOGS/layouts TIMEOUT=60 timeout $b bash scripts/gpu_layouts.sh; echo "gpu_layouts exit $?"
else echo "=== 3. gpu_layouts.sh: not run (${b}s left)"; fi

echo "=== gpu_session done in $(( $(date +%s) - T0 ))s"
cp "$LOGS/gpu_check/summary.txt" "$OUT/gpu_check_summary.txt" 2>/dev/null
cp "$LOGS/session.log" "$OUT/" 2>/dev/null
tar -czf "$OUT/gpu_logs.tar.gz" $LOGS 2>/dev/null
