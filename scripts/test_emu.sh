#!/usr/bin/env bash
# The CUDA program on the emulated device (make BACKEND=emu, llmc/emu/): the CUDA build's kernels, launches,
# streams, cuBLASLt and NCCL calls run on the CPU and are checked against the PyTorch reference, as test_matrix.sh
# checks the CPU build. What `make test-emu` runs (.ci/run too).
#   1. fp32 (build/emu-checked, the fp32 build under AddressSanitizer + UBSan; build/emu-fp32 for 3 and 4): test_gpt at the CPU build's tolerances in the layouts of the issue's list
#   2. bf16 (build/emu-bf16): test_gpt at the bf16 tolerances; train_gpt's 10 losses beside the CPU build's
#   3. order independence: each train_gpt row under two seeds of the thread, block and stream orders, the
#      checkpoints compared byte for byte
#   4. it can fail: six mutations (a barrier removed, a grid one block short, the main stream's wait on the
#      communication stream removed, a read past an allocation's end, a block past __launch_bounds__ in a kernel
#      and in a template kernel), each caught
#   5. the checked build (build/emu-checked: AddressSanitizer and UBSan) runs every fp32 row (rows of 1 and 2) clean
#   6. coverage: every __global__ kernel in llmc/ launched by these rows ("kernels run under emulation: N of N")
#   7. a stalled peer (bf16, dp 2): rank 1 stopped (SIGSTOP) mid-run; rank 0, whose host waits behind an NCCL call
#      that never completes on the device, must stop within --timeout and print the diagnosis naming rank 1 (what
#      scripts/gpu_layouts.sh checks on a GPU)
#   0. first, the emulation's own parts: dev/emu/test_emu_cublas.cpp (cuBLASLt/cuBLAS against a double GEMM) and
#      dev/emu/test_emu_nccl.cpp (NCCL over MPI against the ring-order sums, at 4 and 3 ranks)
# Usage: bash scripts/test_emu.sh   (closes with "N passed, N failed")
set -u
cd "$(dirname "$0")/.."
. scripts/fault_lib.sh   # stop_rank1 (section 7)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN="mpirun --oversubscribe --bind-to none"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export EMU_LAUNCH_LOG=$TMP/launches
passed=0; failed=0; failed_names=()
t_start=$SECONDS

say() {   # RC DESCRIPTION: one check
    if [ "$1" = 0 ]; then passed=$((passed + 1)); echo "ok    $2"; else failed=$((failed + 1)); failed_names+=("$2"); echo "FAIL  $2"; fi
}

echo "== builds: fp32, bf16, checked (AddressSanitizer + UBSan)"
t0=$SECONDS
build() { make -s "$@" >"$TMP/build.$#.$RANDOM.log" 2>&1; }   # (the three at once: their five compiles share the cores)
build BACKEND=emu PRECISION=FP32 BUILD_DIR=build/emu-fp32 -j2 & p1=$!
build BACKEND=emu BUILD_DIR=build/emu-bf16 -j2 & p2=$!
build BACKEND=emu PRECISION=FP32 CHECKED=1 BUILD_DIR=build/emu-checked build/emu-checked/test_gpt & p3=$!
CXXFLAGS_EMU="-std=c++17 -O2 -Wall -Wextra -Wno-unused-function -Wno-missing-field-initializers -I${CUDA_HOME:-/usr/local/cuda}/include"
{ g++ $CXXFLAGS_EMU dev/emu/test_emu_cublas.cpp -o "$TMP/test_emu_cublas" &&
  mpicxx $CXXFLAGS_EMU -DOMPI_SKIP_MPICXX dev/emu/test_emu_nccl.cpp -o "$TMP/test_emu_nccl" -lpthread; } >"$TMP/build.units.log" 2>&1 & p4=$!
wait $p1 && wait $p2 && wait $p3 && wait $p4 || { cat "$TMP"/build.*.log | tail -n 20; echo "an emulated build failed"; echo "0 passed, 1 failed"; exit 1; }
echo "(builds: $((SECONDS - t0)) s)"

reference() {   # NAME ARGS...: the PyTorch reference state (test_matrix.sh writes the same ones)
    local name=$1; shift
    [ -f refs/$name/dterm.bin ] || $PY dev/reference/gpt2_ref.py "$@" --out refs/$name >/dev/null || { echo "reference $name failed"; exit 1; }
}
reference tiny --config tiny
reference moe --config tiny --E 4 --k 2
reference moe_dl --config tiny --E 4 --k 2 --F 0 --every 2
reference llama --config tiny --arch llama --KV 2
reference llama_mixtral --config tiny --arch llama --KV 2 --E 4 --k 2 --H 64 --cap 0
reference llama_olmoe --config tiny --arch llama --KV 2 --E 4 --k 2 --H 32 --norm_topk 0 --qk_norm 1 --cap 0 --pad 1
reference llama_hs128 --config tiny --arch llama --L 2 --C 256 --NH 2 --KV 1 --F 96 --rope_scaling llama3 --rope_orig 64
reference muon --config tiny --optimizer muon
reference muon_mixtral --config tiny --optimizer muon --arch llama --KV 2 --E 4 --k 2 --H 64 --cap 0

# run_test BUILD NP ARGS...: one test_gpt run; its "N passed, N failed" added to the totals
run_test() {
    local build=$1 np=$2; shift 2
    local log=$TMP/log t0=$SECONDS
    timeout 900 $MPIRUN -np $np build/$build/test_gpt "$@" >"$log" 2>&1
    local rc=$? line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL  $build np $np $* (exit $rc, no summary)"; tail -n 5 "$log"; failed=$((failed + 1)); failed_names+=("$build np $np $*"); return
    fi
    local p=${line%% passed*} f=${line#*, }; f=${f%% failed*}
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$f" != 0 ] || [ $rc != 0 ]; then
        echo "FAIL  $build np $np $* ($line)"; grep -E "FAIL|error" "$log" | head -n 10
        [ $rc != 0 ] && [ "$f" = 0 ] && failed=$((failed + 1))
        failed_names+=("$build np $np $*")
    else
        echo "ok    $build np $np $* ($line, $((SECONDS - t0)) s)"
    fi
}

# unit LOG NAME: the "N passed, M failed" lines of LOG (one per rank) added to the totals, one FAIL per failing line
unit() {
    local log=$1 name=$2 p f n=0
    while read -r p _ f _; do
        n=$((n + 1)); passed=$((passed + p)); failed=$((failed + f))
        [ "$f" = 0 ] || failed_names+=("$name")
    done < <(grep -oE '[0-9]+ passed, [0-9]+ failed$' "$log" | tr -d ,)
    echo "      $name: $n summaries, $(grep -oE '[0-9]+ passed, [0-9]+ failed$' "$log" | tr -d , | awk '{p += $1; f += $3} END {print p " passed, " f " failed"}')"
}
echo "== 0. the emulation's own parts: cuBLASLt against a double GEMM, NCCL against the ring-order sums"
"$TMP/test_emu_cublas" >"$TMP/cublas.log" 2>&1
say $? "dev/emu/test_emu_cublas: the emulated cuBLASLt/cuBLAS (exit status)"
unit "$TMP/cublas.log" test_emu_cublas
for np in 4 3; do
    timeout 300 $MPIRUN -np $np "$TMP/test_emu_nccl" >"$TMP/nccl.$np.log" 2>&1
    rc=$?
    [ $rc = 0 ] && [ "$(grep -cE '^rank [0-9]+: [0-9]+ passed, 0 failed$' "$TMP/nccl.$np.log")" = $np ]
    say $? "dev/emu/test_emu_nccl at $np ranks: every rank's summary with 0 failed (exit $rc)"
    unit "$TMP/nccl.$np.log" "test_emu_nccl np $np"
done

T=refs/tiny
echo "== 1. fp32 on the emulated device: test_gpt at the CPU build's tolerances, in the checked build (AddressSanitizer + UBSan)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
F=emu-checked
run_test $F 1 --ref $T -b 8 --check-memory --check-comm                     # GPT-2, the chunked cross-entropy
run_test $F 1 --ref refs/llama -b 8 --ce-chunk 0 --recompute full           # Llama, GQA (KV 2 of NH 4); full logits; recompute
run_test $F 2 --ref $T -b 8 --tp 2 --sp --ce-chunk 7 --check-memory --check-comm   # vocab-parallel CE, ragged chunks
run_test $F 2 --ref $T -b 4 --zero 3 --check-memory --check-comm
run_test $F 2 --ref $T -b 1 --pp 2 --pp-schedule zb --recompute mlp --check-comm
run_test $F 2 --ref refs/moe -b 2 --ep 2 --check-memory --check-comm        # capacity 1.25: drops
run_test $F 2 --ref $T -b 4 --cp 2 --cp-kind ulysses --check-comm
EMU_LT_NO_EPILOGUES=1 run_test $F 1 --ref $T -b 8                          # a cuBLASLt without the bias and GELU
                                                                            # epilogues: matmul.h's fallback kernels
run_test $F 2 --ref $T -b 1 --pp 2 --check-comm                             # 1F1B
run_test $F 2 --ref refs/llama_mixtral -b 2 --ep 2 --check-comm             # dropless: the grouped GEMM
run_test $F 2 --ref refs/llama_olmoe -b 2 --ep 2 --check-comm               # QK-norm, top-k not renormalised, padding
run_test $F 2 --ref $T -b 4 --cp 2 --check-comm                             # ring
rm -rf "$TMP/resume"                                                        # resume into another layout
run_test $F 2 --ref $T -b 2 --tp 2 --sp --zero 1 --check-resume "$TMP/resume"
run_test $F 2 --ref $T -b 4 --zero 3 --resume-from "$TMP/resume"
run_test $F 2 --ref refs/muon -b 4 --tp 2 --sp --zero 1 --check-comm         # Muon: its kernels, the owners' all-to-alls
run_test $F 2 --ref refs/muon_mixtral -b 2 --ep 2 --zero 3                  # Muon on each expert's gate, up and down

echo "== 2. bf16 on the emulated device: test_gpt at the bf16 tolerances; train_gpt beside the CPU build"
X=emu-bf16
run_test $X 1 --ref $T -b 8
run_test $X 1 --ref refs/llama_hs128 -b 8 --attention flash                 # the flash kernels (head size 128)
run_test $X 2 --ref $T -b 8 --tp 2 --sp --check-comm
run_test $X 2 --ref refs/muon -b 4 --zero 2 --check-comm --check-memory      # Muon: bf16 parameters, the fp32 master
run_test $X 2 --ref refs/moe -b 2 --ep 2 --check-comm
run_test $X 2 --ref refs/llama_hs128 -b 4 --cp 2 --attention flash --check-comm
TINY="L=2,C=64,NH=4,V=256,maxT=64"
[ -x ./train_gpt ] || make -s BACKEND=cpu >/dev/null
./train_gpt -e "$TINY" -t 32 -b 4 -x 10 -v 0 -s 0 -l 3e-3 >"$TMP/cpu.log" 2>&1
build/$X/train_gpt -e "$TINY" -t 32 -b 4 -x 10 -v 0 -s 0 -l 3e-3 >"$TMP/bf16.log" 2>&1
$PY - "$TMP/cpu.log" "$TMP/bf16.log" <<'PYEOF'
import re, sys
def losses(p): return [float(m.group(1)) for m in re.finditer(r"^step +\d+/\d+ \| loss ([0-9.]+)", open(p).read(), re.M)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) == 10 else float("inf")
print("     (train_gpt bf16 vs CPU, 10 steps: worst relative loss difference %.2e; test_gpt's bf16 LOSS_TOL 5e-2)" % worst)
sys.exit(0 if worst <= 5e-2 else 1)
PYEOF
say $? "train_gpt of the emulated bf16 build: 10 losses within LOSS_TOL (5e-2 relative) of the CPU build's"

echo "== 3. two seeds of the thread, block and stream orders: train_gpt's checkpoints equal byte for byte"
seeds() {   # NAME BUILD NP FLAGS...
    local name=$1 build=$2 np=$3; shift 3
    local ok=0
    for s in 1 2; do
        rm -rf "$TMP/$name.$s"
        EMU_SEED=$s timeout 600 $MPIRUN -np $np build/$build/train_gpt "$@" -t 32 -x 3 -n 3 -v 0 -s 0 -l 3e-3 -o "$TMP/$name.$s" >"$TMP/$name.$s.log" 2>&1 || ok=1
    done
    for f in model_00000003.bin state_00000003.bin; do cmp -s "$TMP/$name.1/$f" "$TMP/$name.2/$f" || ok=1; done
    say $ok "$name: seeds 1 and 2 give the same model and optimizer state after 3 steps ($build, np $np $*)"
}
MOE="$TINY,E=4,k=2"
LLAMA64="arch=llama,L=2,C=128,NH=2,KV=1,V=256,maxT=64"
seeds single emu-fp32 1 -e "$TINY" -b 4
seeds tp2_sp_zero2 emu-fp32 2 -e "$TINY" -b 4 --tp 2 --sp --zero 2
seeds ep2_cp2 emu-fp32 4 -e "$MOE" -b 2 --ep 2 --cp 2 --zero 1
seeds pp2_zb emu-fp32 2 -e "$TINY" -b 1 -d 128 --pp 2 --pp-schedule zb
# Qwen2-MoE's gated shared experts with loss-free balancing; experts of width 36, which cuBLASLt's GELU epilogue
# does not take (its aux's ld is not a multiple of 8): the separate GELU kernels
seeds qwenmoe_bias emu-fp32 2 -e "arch=llama,L=2,C=64,NH=4,KV=2,V=256,maxT=64,E=4,k=2,H=32,S=2,sgate=1,topknorm=0" -b 4 --ep 2 --moe-bias-rate 0.01
seeds moe_gelu_unfused emu-fp32 2 -e "$MOE,H=36" -b 4 --ep 2
# the layouts of section 1's rows besides: ZeRO-3, Ulysses, 1F1B, Mixtral (dropless: the grouped GEMM), OLMoE
# (QK-norm, gates not renormalised, a padding token), a Llama with full recompute and the full logits
LLAMA="arch=llama,L=2,C=64,NH=4,KV=2,V=256,maxT=64"
seeds zero3 emu-fp32 2 -e "$TINY" -b 4 --zero 3
seeds cp2_ulysses emu-fp32 2 -e "$TINY" -b 4 --cp 2 --cp-kind ulysses
seeds pp2_1f1b emu-fp32 2 -e "$TINY" -b 1 -d 128 --pp 2
seeds mixtral_ep2 emu-fp32 2 -e "$LLAMA,E=4,k=2,H=64" -b 4 --ep 2 --capacity-factor 0
seeds olmoe_ep2 emu-fp32 2 -e "$LLAMA,E=4,k=2,H=32,topknorm=0,qknorm=1,pad=1" -b 4 --ep 2 --capacity-factor 0
seeds llama_recompute emu-fp32 1 -e "$LLAMA" -b 4 --recompute full --ce-chunk 0
seeds bf16_flash emu-bf16 1 -e "$LLAMA64" -b 4 --attention flash
seeds bf16_flash_cp2 emu-bf16 2 -e "$LLAMA64" -b 4 --attention flash --cp 2
seeds bf16_tp2_sp emu-bf16 2 -e "$TINY" -b 4 --tp 2 --sp
seeds bf16_moe_ep2 emu-bf16 2 -e "$MOE" -b 2 --ep 2

echo "== 4. it can fail: each mutation caught"
mutation() {   # WHAT EMU_MUTATE BUILD NP TEST_GPT_ARGS...
    local what=$1 m=$2 build=$3 np=$4; shift 4
    local log=$TMP/mutation.log
    EMU_MUTATE=$m timeout 600 $MPIRUN -np $np build/$build/test_gpt "$@" >"$log" 2>&1
    local rc=$? line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    local how=$(grep -m1 -oE 'FAIL .{0,80}|ERROR: AddressSanitizer: [a-z-]+|emulated device: .{0,80}|error: CUDA: .{0,80}' "$log")
    [ $rc != 0 ] || [ "${line#*, }" != "0 failed" ]
    say $? "mutation caught: $what (EMU_MUTATE=$m; $build np $np: ${how:-exit $rc})"
}
mutation "a __syncthreads removed from the global norm's block reduction" barrier:sum_of_squares_partial_kernel:2 emu-fp32 1 --ref $T -b 8
mutation "layernorm's launcher one block short" grid:layernorm_forward_kernel emu-fp32 1 --ref $T -b 8
mutation "the main stream's wait on the communication stream removed" wait:1 emu-fp32 2 --ref $T -b 4 --zero 2
mutation "the parameters' last element past the end of their allocation (AddressSanitizer)" short:1 emu-checked 1 --ref $T -b 8
mutation "the softmax kernel's launch 32 threads past its __launch_bounds__(256)" block:attention_softmax_forward_kernel emu-fp32 1 --ref $T -b 8
mutation "the flash forward kernel's (a template's) launch 32 threads past its __launch_bounds__(128)" block:flash_forward_kernel emu-bf16 1 --ref refs/llama_hs128 -b 8 --attention flash

echo "== 7. a stalled peer under NCCL's semantics: rank 1 stopped (SIGSTOP), rank 0's watchdog diagnoses"
# The emulated NCCL, like NCCL, only queues a collective; rank 0's host then waits behind it wherever it next waits
# for the device (on an H200: the copy of the step's loss to the host, which its watchdog did not watch). The job
# must end within --timeout + 10 s with "diagnosis: rank 1 ... is stopped", rank 0 waiting in a call of the step
# the run had reached.
stopped_rank() {   # BUILD
    local build=$1 log=$TMP/sigstop.log step stop_s line waited
    rm -rf "$TMP/sigstop"
    $MPIRUN -np 2 -x TMPDIR=$TMP build/$build/train_gpt -e "$TINY" -t 32 -b 2 -v 0 -s 0 -x 100000 \
        --timeout 5 -o "$TMP/sigstop" >"$log" 2>&1 &
    stop_rank1 $! "$log"
    line=$(grep -m1 '^diagnosis:' "$log" | cut -c1-400)
    waited=$(grep -oE "rank 0 waits in [a-z]+ [a-z-]+ #[0-9]+ of step [0-9]+" <<<"$line" | awk '{ print $NF }')
    grep -q "^diagnosis: rank 1 .*is stopped" <<<"$line" && [ -n "$waited" ] && [ "$waited" -ge $((${step:-1} - 1)) ] &&
        [ $stop_s -le 15 ]
    say $? "$build: rank 1 stopped at step ${step:-?}, the job ended in $stop_s s: ${line:-no diagnosis line ($(grep -m1 '^error' "$log" | cut -c1-100))}"
}
stopped_rank emu-bf16

echo "== 5. coverage"
$PY - "$EMU_LAUNCH_LOG" <<'PYEOF'
import glob, re, sys
kernels = set()
for p in glob.glob("llmc/*.h"):
    kernels |= set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(", open(p).read()))
ran = set(open(sys.argv[1]).read().split()) if glob.glob(sys.argv[1]) else set()
why = {   # what the program's flags cannot reach (counted as not run)
    "attention_forward_kernel": "the tiled attention (ATT_TILED) is only dev/cuda/attention.cu's third path; --attention offers cublas|flash|cudnn",
    "attention_backward_dkdv_kernel": "the tiled attention's backward, as below",
    "attention_backward_dq_kernel": "the tiled attention's backward, as below",
}
print("kernels run under emulation: %d of %d" % (len(kernels & ran), len(kernels)))
unexplained = 0
for k in sorted(kernels - ran):
    print("     not run: %s (%s)" % (k, why.get(k, "no row launches it")))
    unexplained += k not in why
sys.exit(1 if unexplained else 0)
PYEOF
say $? "every __global__ kernel in llmc/ ran under emulation, or says why it cannot"
echo "(total $((SECONDS - t_start)) s)"
for n in "${failed_names[@]}"; do echo "failed: $n"; done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
