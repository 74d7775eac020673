#!/usr/bin/env bash
# The GPU check (DESIGN.md section 7): run it on a machine with one NVIDIA GPU (sm_90 by default).
#   1. builds the cuda backend (bf16 and fp32)
#   2. builds and runs every dev/cuda harness (CUDA kernel vs the CPU loop, timing), bf16 and fp32
#   3. test_gpt on one GPU against the PyTorch reference (refs/: carry it, or PyTorch writes it)
#   3c. the same for the Llama family (refs/llama: KV 2 of NH 4, untied; refs/llama_hs128: head size 128, llama3
#      RoPE scaling, also with the cuBLAS attention: flash is the default where it applies)
#   4. a short GPT-2 124M-shaped throughput run: tokens/s and MFU (flash attention; the same with cuBLAS attention, with MoE,
#      and a SmolLM2-135M-shaped Llama)
#   5. the roofline model (dev/cuda/roofline.py) with the efficiencies the harnesses measured, beside the step
# and prints a summary (also $LOG_DIR/summary.txt; the roofline table in $LOG_DIR/roofline.txt). Budget: under 8 minutes on an H200 (each step has its own timeout).
# Usage: bash scripts/gpu_check.sh            (CUDA_ARCH=90 by default; JOBS=16 parallel builds)
set -u
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
CUDA_ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
LOG_DIR=${LOG_DIR:-build/gpu_check}
mkdir -p "$LOG_DIR"
T0=$(date +%s)
SUMMARY=()
FAILED=0

# step NAME TIMEOUT_SECONDS 'COMMAND': runs it (bash -c) with its output in $LOG_DIR/NAME.log and on screen
step() {
    local name=$1 limit=$2 cmd=$3
    local t=$(date +%s)
    echo "=== $name (limit ${limit}s): $cmd"
    timeout "$limit" bash -c "$cmd" 2>&1 | tee "$LOG_DIR/$name.log"
    local rc=${PIPESTATUS[0]}
    local dt=$(( $(date +%s) - t ))
    if [ "$rc" -eq 0 ]; then
        SUMMARY+=("ok    $name (${dt}s)")
    else
        [ "$rc" -eq 124 ] && SUMMARY+=("FAIL  $name: timed out after ${limit}s") || SUMMARY+=("FAIL  $name: exit $rc (${dt}s), log $LOG_DIR/$name.log")
        FAILED=$((FAILED + 1))
    fi
    return "$rc"
}
# queue NAME TIMEOUT_SECONDS 'COMMAND': a check that needs no quiet GPU (test_gpt), run later by run_queue N: N at a
# time, their results in the summary in the order queued
QUEUE=()
queue() { QUEUE+=("$1|$2|$3"); }
run_queue() {
    local n=$1 i=0 pids=() q name limit cmd
    for q in "${QUEUE[@]}"; do
        name=${q%%|*} q=${q#*|}; limit=${q%%|*} cmd=${q#*|}
        ( t=$(date +%s); timeout "$limit" bash -c "$cmd" > "$LOG_DIR/$name.log" 2>&1; rc=$?
          echo "$rc $(( $(date +%s) - t ))" > "$LOG_DIR/$name.rc" ) &
        pids+=($!); i=$((i + 1))
        [ $((i % n)) -eq 0 ] && wait "${pids[@]}" && pids=()
    done
    wait
    for q in "${QUEUE[@]}"; do
        name=${q%%|*} q=${q#*|}; limit=${q%%|*}
        read -r rc dt < "$LOG_DIR/$name.rc" 2>/dev/null || { rc=1; dt=?; }
        echo "=== $name: exit $rc (${dt}s); $(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$LOG_DIR/$name.log" | tail -n 1)"
        if [ "$rc" -eq 0 ]; then SUMMARY+=("ok    $name (${dt}s)")
        else
            [ "$rc" -eq 124 ] && SUMMARY+=("FAIL  $name: timed out after ${limit}s") || SUMMARY+=("FAIL  $name: exit $rc (${dt}s), log $LOG_DIR/$name.log")
            FAILED=$((FAILED + 1))
        fi
    done
    QUEUE=()
}

echo "=== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "(nvidia-smi not available)"
nvcc --version | tail -1

# 1. the cuda backend, both precisions (the two builds in parallel). One GPU needs neither Open MPI nor
#    NCCL: without them (the device image may lack them) build the single-process NO_MPI=1 variant.
MPI_FLAG=""
if ! command -v mpicxx >/dev/null 2>&1 || { [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ] && [ ! -f "${NCCL_HOME:-/none}/include/nccl.h" ]; }; then
    MPI_FLAG="NO_MPI=1"; echo "(no Open MPI or NCCL here: building with NO_MPI=1)"
fi
# SKIP_BUILD=1: the binaries and harnesses were built elsewhere for this GPU and carried (scripts/gpu_session.sh)
if [ "${SKIP_BUILD:-0}" = 1 ]; then SUMMARY+=("skip  build_cuda, build_harnesses: carried (SKIP_BUILD=1)"); else
step build_cuda 240 "make BACKEND=cuda BUILD_DIR=build/cuda CUDA_ARCH=$CUDA_ARCH $MPI_FLAG -j2 & a=\$!;
                    make BACKEND=cuda BUILD_DIR=build/cuda-fp32 PRECISION=FP32 CUDA_ARCH=$CUDA_ARCH $MPI_FLAG -j2 & b=\$!;
                    wait \$a && wait \$b"

# 2. the kernel harnesses, bf16 then fp32
step build_harnesses 240 "make -C dev/cuda CUDA_ARCH=$CUDA_ARCH -j$JOBS && make -C dev/cuda PRECISION=FP32 CUDA_ARCH=$CUDA_ARCH -j$JOBS"
fi
for prec in bf16 fp32; do
    for op in $(sed -n 's/^OPS := //p' dev/cuda/Makefile); do
        if [ -x "dev/cuda/bin/$prec/$op" ]; then
            step "harness_${prec}_$op" 90 "dev/cuda/bin/$prec/$op"
        else
            SUMMARY+=("FAIL  harness_${prec}_$op: not built"); FAILED=$((FAILED + 1))
        fi
    done
done

# REFS_READY: a file that appears when the references written in the background are there (gpu_session.sh)
for i in $(seq 1 240); do [ -z "${REFS_READY:-}" ] || [ -f "$REFS_READY" ] && break; sleep 0.5; done
# 3. test_gpt on one GPU against the PyTorch reference states (refs/tiny, refs/d4: carry them, or they are
#    written here when PyTorch is installed). fp32 build: the fp32 tolerances; bf16 build: the bf16 row.
for cfg in tiny d4; do
    if [ ! -f refs/$cfg/state.bin ]; then
        python3 dev/reference/gpt2_ref.py --config $cfg --out refs/$cfg >/dev/null 2>&1 || echo "(no refs/$cfg and no PyTorch to write it)"
    fi
done
for cfg in tiny d4; do
    if [ -f refs/$cfg/state.bin ]; then
        queue test_gpt_fp32_$cfg 90 "./build/cuda-fp32/test_gpt --ref refs/$cfg -b 4 --check-memory"
        queue test_gpt_bf16_$cfg 90 "./build/cuda/test_gpt --ref refs/$cfg -b 4 --check-memory"
        [ $cfg = d4 ] && queue test_gpt_bf16_d4_cublas 90 "./build/cuda/test_gpt --ref refs/d4 -b 4 --check-memory --attention cublas"
    else
        SUMMARY+=("FAIL  test_gpt_$cfg: no reference state refs/$cfg"); FAILED=$((FAILED + 1))
    fi
done

# 3b. the MoE kernels (router, top-k, capacity, dispatch/combine, aux and z losses) and recompute on one GPU,
#     against the PyTorch MoE references (carry refs/moe*: the MoE reference needs its flags, see test_matrix.sh)
for cfg in moe moe_pos moe_dl moe_k1 moe_sig; do
    if [ -f refs/$cfg/state.bin ]; then
        queue test_gpt_fp32_$cfg 90 "./build/cuda-fp32/test_gpt --ref refs/$cfg -b 2 --check-memory"
        queue test_gpt_bf16_$cfg 90 "./build/cuda/test_gpt --ref refs/$cfg -b 2 --check-memory"
    else
        SUMMARY+=("skip  test_gpt_$cfg: no reference state refs/$cfg (carry it)")
    fi
done
# 3c. the Llama family on one GPU (RMSNorm, RoPE, SwiGLU, grouped-query attention, the untied head): the
#     matrix's Llama references (test_matrix.sh's `reference llama ...` lines; carry refs/llama*, or PyTorch
#     writes them here), fp32 and bf16; head size 128 through the flash kernels too
ref_llama() {   # NAME FLAGS...: the reference as scripts/test_matrix.sh writes it
    local name=$1; shift
    [ -f refs/$name/dterm.bin ] || python3 dev/reference/gpt2_ref.py "$@" --out refs/$name >/dev/null 2>&1 ||
        echo "(no refs/$name and no PyTorch to write it)"
}
ref_llama llama --config tiny --arch llama --KV 2
ref_llama llama_hs128 --config tiny --arch llama --L 2 --C 256 --NH 2 --KV 1 --F 96 --rope_scaling llama3 --rope_orig 64
# MoE on the Llama body, dropless: the local experts' projections as grouped GEMMs (cuBLAS >= 12.5); OLMoE's QK-norm
ref_llama llama_mixtral --config tiny --arch llama --KV 2 --E 4 --k 2 --H 64 --cap 0
ref_llama llama_olmoe --config tiny --arch llama --KV 2 --E 4 --k 2 --H 32 --norm_topk 0 --qk_norm 1 --cap 0
ref_llama llama_qwenmoe --config tiny --arch llama --KV 2 --qkvbias 1 --F 96 --E 4 --k 2 --H 32 --S 2 --shared_gate 1 --norm_topk 0 --every 2 --cap 0
for cfg in llama llama_hs128 llama_mixtral llama_olmoe llama_qwenmoe; do
    if [ -f refs/$cfg/state.bin ]; then
        queue test_gpt_fp32_$cfg 90 "./build/cuda-fp32/test_gpt --ref refs/$cfg -b 8 --check-memory --check-comm"
        queue test_gpt_bf16_$cfg 90 "./build/cuda/test_gpt --ref refs/$cfg -b 8 --check-memory --check-comm"
        [ $cfg = llama_hs128 ] && queue test_gpt_bf16_llama_hs128_cublas 90 "./build/cuda/test_gpt --ref refs/$cfg -b 8 --check-memory --attention cublas"
    else
        SUMMARY+=("FAIL  test_gpt_$cfg: no reference state refs/$cfg"); FAILED=$((FAILED + 1))
    fi
done
[ -f refs/tiny/state.bin ] && queue test_gpt_fp32_recompute 90 "./build/cuda-fp32/test_gpt --ref refs/tiny -b 4 --recompute full --check-memory"
# 3d. Muon (Newton-Schulz's GEMMs, the momentum and update kernels) on one GPU: GPT-2, its MoE form, a Mixtral shape
for cfg in muon muon_moe muon_mixtral; do
    if [ -f refs/$cfg/state.bin ]; then
        queue test_gpt_fp32_$cfg 90 "./build/cuda-fp32/test_gpt --ref refs/$cfg --check-memory --check-comm"
        queue test_gpt_bf16_$cfg 90 "./build/cuda/test_gpt --ref refs/$cfg --check-memory --check-comm"
    else
        SUMMARY+=("skip  test_gpt_$cfg: no reference state refs/$cfg (carry it)")
    fi
done
# the test_gpt checks above, 6 at a time (correctness only: the GPU is shared among them); BEFORE_QUEUE: a command
# started beside them (gpu_session.sh: PyTorch's benchmark runs compile meanwhile), WAIT_QUIET: one that returns
# when it no longer uses the GPU (they are warm and wait), before the timed runs below
[ -n "${BEFORE_QUEUE:-}" ] && bash -c "$BEFORE_QUEUE"
run_queue 6
[ -n "${WAIT_QUIET:-}" ] && bash -c "$WAIT_QUIET"
# a run that cannot fit stops before allocating, with the plan and the levers (the free device memory as limit)
step oom_stops_early 60 "./build/cuda/train_gpt -e d48 -b 64 -t 1024 -x 1 -v 0 -s 0 > $LOG_DIR/oom.out 2>&1;
                         rc=\$?; cat $LOG_DIR/oom.out | tail -25; [ \$rc -ne 0 ] && grep -q 'exceeds the free device memory' $LOG_DIR/oom.out && ! grep -q '^step' $LOG_DIR/oom.out"

# 4. GPT-2 124M-shaped throughput (d12: L12 C768 NH12 V50257), B16 T1024, bf16, 30 steps. MFU counts
#    6N + 6 L C T flops per token against 790 TFLOP/s (an H200's measured dense bf16 rate) and the 989 peak.
step throughput_124m 240 "./build/cuda/train_gpt -e d12 -b 16 -t 1024 -x 30 -v 0 -s 0 --ce-chunk 2048 --memory-report"   # (flash: the default)
if [ -f "$LOG_DIR/throughput_124m.log" ]; then
    awk '/parameters,/ { for (i = 1; i < NF; i++) if ($(i+1) == "parameters,") N = $i }
         /average step/ { tok = $(NF-1) }
         END { if (tok > 0) { f = 6 * N + 6 * 12 * 768 * 1024; printf "  124M: %d tok/s, %.1f ms/step, MFU %.1f%% of 790 TFLOP/s (H200 measured dense bf16), %.1f%% of 989 (%.3g flops per token)\n",
                                tok, 16384000 / tok, 100 * tok * f / 790e12, 100 * tok * f / 989e12, f } }' \
        "$LOG_DIR/throughput_124m.log" | tee "$LOG_DIR/mfu.txt"
fi

# 4a. the cost model's machine file for this GPU (--calibrate at the 124M shapes; --machine reads it), and the
#     model's prediction for the step above beside its measurement
step calibrate_h200 60 "./build/cuda/train_gpt -e d12 -b 16 -t 1024 --calibrate $LOG_DIR/machine_h200.txt && cat $LOG_DIR/machine_h200.txt && ./build/cuda/train_gpt -e d12 -b 16 -t 1024 -s 0 -v 0 --plan 1 --machine $LOG_DIR/machine_h200.txt | grep '^predicted step'"

# 4b. the same with the cuBLAS attention (an (NH, T, T) workspace)
step throughput_124m_cublas 120 "./build/cuda/train_gpt -e d12 -b 16 -t 1024 -x 20 -v 0 -s 0 --ce-chunk 2048 --attention cublas --memory-report"

# 4c. cuDNN's fused attention (make USE_CUDNN=1: needs the frontend's headers, .venv/lib/python3*/site-packages/include
#     from make setup on a machine with PyPI: carry it), checked against the d4 reference, then the same step
if [ "${SKIP_BUILD:-0}" = 1 ] && build/cuda-cudnn/train_gpt -h >/dev/null 2>&1 ||
   { ls .venv/lib/python3*/site-packages/include/cudnn_frontend.h >/dev/null 2>&1 && [ -f /usr/local/cuda/include/cudnn.h ]; }; then
    [ "${SKIP_BUILD:-0}" = 1 ] || step build_cuda_cudnn 300 "make BACKEND=cuda BUILD_DIR=build/cuda-cudnn USE_CUDNN=1 CUDA_ARCH=$CUDA_ARCH $MPI_FLAG -j2"
    [ -f refs/d4/state.bin ] && step test_gpt_bf16_d4_cudnn 120 "./build/cuda-cudnn/test_gpt --ref refs/d4 -b 4 --check-memory --attention cudnn"
    step throughput_124m_cudnn 120 "./build/cuda-cudnn/train_gpt -e d12 -b 16 -t 1024 -x 20 -v 0 -s 0 --ce-chunk 2048 --attention cudnn --memory-report"
else
    SUMMARY+=("skip  cudnn: no carried build/cuda-cudnn that loads, and no cudnn_frontend.h in .venv or no cudnn.h to build one")
fi

# 5. the same shape with MoE every 2nd layer (E 8, top-2, F 1.25): tokens/s beside the dense run
step throughput_124m_moe 180 "./build/cuda/train_gpt -e d12 --experts 8 --topk 2 --moe-every 2 -b 16 -t 1024 -x 20 -v 0 -s 0 --ce-chunk 2048 --memory-report"

# 5b. a SmolLM2-135M-shaped Llama (L30 C576 NH9 KV3 F1536, tied, GPT-2's V 50257), the 124M run's B16 T1024 and
#     CE chunk: tokens/s and MFU counted as for 124M (6N + 6 L C T flops per token)
SMOL="arch=llama,L=30,C=576,NH=9,KV=3,F=1536,V=50257,maxT=1024,tied=1"
step throughput_llama_135m 240 "./build/cuda/train_gpt -e $SMOL -b 16 -t 1024 -x 30 -v 0 -s 0 --ce-chunk 2048 --memory-report"
if [ -f "$LOG_DIR/throughput_llama_135m.log" ]; then
    awk '/parameters,/ { for (i = 1; i < NF; i++) if ($(i+1) == "parameters,") N = $i }
         /average step/ { tok = $(NF-1) }
         END { if (tok > 0) { f = 6 * N + 6 * 30 * 576 * 1024; printf "  Llama 135M (SmolLM2 shape): %d tok/s, %.1f ms/step, MFU %.1f%% of 790 TFLOP/s, %.1f%% of 989 (%.3g flops per token)\n",
                                tok, 16384000 / tok, 100 * tok * f / 790e12, 100 * tok * f / 989e12, f } }' \
        "$LOG_DIR/throughput_llama_135m.log" | tee "$LOG_DIR/mfu_llama.txt"
fi

# 5c. the cost model's prediction of each step measured above (the machine file from 4a), beside its measurement
predict() {   # NAME LOG ARGS...: "NAME: predicted X ms, measured Y ms"
    local name=$1 log=$2; shift 2
    local p=$(./build/cuda/train_gpt "$@" -s 0 -v 0 --plan 1 --machine $LOG_DIR/machine_h200.txt 2>&1 | sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p')
    local m=$(awk '/^average step/ { print $3 }' "$log" 2>/dev/null)
    echo "  cost model, $name: predicted ${p:-?} ms, measured ${m:-?} ms"
}
if [ -f $LOG_DIR/machine_h200.txt ]; then
    {
    predict "124M flash attention" $LOG_DIR/throughput_124m.log -e d12 -b 16 -t 1024 --ce-chunk 2048
    predict "124M cuBLAS attention" $LOG_DIR/throughput_124m_cublas.log -e d12 -b 16 -t 1024 --ce-chunk 2048 --attention cublas
    predict "124M MoE E8 k2 every 2" $LOG_DIR/throughput_124m_moe.log -e d12 --experts 8 --topk 2 --moe-every 2 -b 16 -t 1024 --ce-chunk 2048
    predict "Llama 135M" $LOG_DIR/throughput_llama_135m.log -e $SMOL -b 16 -t 1024 --ce-chunk 2048
    } | tee "$LOG_DIR/predictions.txt"
fi

# 6. the roofline model of the same step, with the efficiencies the harnesses just measured, beside the measurement
STEP_MS=$(awk '/^average step/ { print $3 }' "$LOG_DIR/throughput_124m.log" 2>/dev/null)
python3 dev/cuda/roofline.py --attention flash --measured "$LOG_DIR"/harness_bf16_*.log ${STEP_MS:+--step-ms $STEP_MS} > "$LOG_DIR/roofline.txt" 2>&1
STEP_MS=$(awk '/^average step/ { print $3 }' "$LOG_DIR/throughput_124m_cublas.log" 2>/dev/null)
python3 dev/cuda/roofline.py --attention cublas --measured "$LOG_DIR"/harness_bf16_*.log ${STEP_MS:+--step-ms $STEP_MS} > "$LOG_DIR/roofline_cublas.txt" 2>&1

echo
{
echo "=== gpu_check summary ($(( $(date +%s) - T0 ))s total, budget 480s)"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
# the timings of the kernels, one line each, for the record
grep -h "^  time" "$LOG_DIR"/harness_bf16_*.log 2>/dev/null | sed 's/^/  bf16 /'
cat "$LOG_DIR/mfu.txt" 2>/dev/null
cat "$LOG_DIR/mfu_llama.txt" 2>/dev/null
cat "$LOG_DIR/predictions.txt" 2>/dev/null
grep -h "^average step" "$LOG_DIR/throughput_124m_cublas.log" 2>/dev/null | sed 's/^/  124M --attention cublas: /'
grep -h "^average step" "$LOG_DIR/throughput_124m_moe.log" 2>/dev/null | sed 's/^/  124M MoE E8 k2 every 2: /'
echo "  roofline (dev/cuda/roofline.py, 124M B16 T1024, flash attention):"
tail -n 3 "$LOG_DIR/roofline.txt" | sed 's/^/    /'
if [ "$FAILED" -eq 0 ]; then echo "GPU CHECK PASSED"; else echo "GPU CHECK FAILED: $FAILED step(s)"; fi
} | tee "$LOG_DIR/summary.txt"
exit $(( FAILED > 0 ))
