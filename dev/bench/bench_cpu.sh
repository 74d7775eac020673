#!/usr/bin/env bash
# CPU benchmarks (not tests: timings on a 2-core machine are noisy, so what matters are the ratios
# measured side by side in one run). Prints five tables:
#   1. tokens/s of train_gpt vs PyTorch (same model, same threads) at B4 T64, B16 T64, B4 T256, B1 T1024,
#      the ratios, OpenBLAS's sgemm rate on this machine and each side's share of the sgemm bound
#   2. peak logits memory at T=1024: --ce-chunk 0 (full logits) vs the chunked default
#   3. data parallel d4 at dp 2: tokens/s and bytes per step for each ZeRO stage
#   4. peak memory per rank for T = 1024, 4096, 16384 (V=50304) at tp 1/2/4, with and without chunked CE
#   5. table 1 for a Llama (L4 C256 NH4 KV2 F768 V50257, untied) against transformers' LlamaForCausalLM
#      (dev/bench/torch_llama.py, eager, run by .venv/bin/python or $VENV_PY) at B16 T64, B4 T256, B1 T1024
# usage: bash dev/bench/bench_cpu.sh [threads] [tables, e.g. 1 or 12345]   (from the repo root after make)
# env: ROUNDS=N runs tables 1 and 5 N times, ours and PyTorch alternating, and keeps each side's best (table 5
#      also prints each side's median); STEPS (20)
#      timed steps per run; CPUTIME=1 times table 1 (and the sgemm rate) in process CPU seconds instead of wall
#      seconds: with 1 thread on a machine others load, what an unloaded run would take (with more threads it
#      also counts the threads' spin-waits); OPENBLAS_CORETYPE reaches both sides (OpenBLAS 0.3.21 runs its Prescott kernels
#      on CPUs it does not know, e.g. family 6 model 207, where SkylakeX is ~4x faster; table 1 says what ran)
set -u
cd "$(dirname "$0")/../.."
TH=${1:-2}
TABLES=${2:-12345}
ROUNDS=${ROUNDS:-1}
STEPS=${STEPS:-20}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
PY=/usr/bin/python3
VENV_PY=${VENV_PY:-.venv/bin/python}
MODEL="L=4,C=128,NH=4,V=50257,maxT=1024"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# "GFLOP/s kernels": OpenBLAS's sgemm (the library train_gpt links) at M N K on $TH threads, row-major
# A (M, K) times B (N, K) transposed, as the linear layers call it
BLAS_LIB=$(ldd ./train_gpt | awk '/libopenblas/ { print $3; exit }')
SGEMM_PY='
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.openblas_get_corename.restype = ctypes.c_char_p
M, N, K = (int(x) for x in sys.argv[2:5])
A, B, C = (ctypes.c_float * (M * K))(), (ctypes.c_float * (N * K))(), (ctypes.c_float * (M * N))()
ctypes.memset(A, 0x3e, M * K * 4); ctypes.memset(B, 0x3d, N * K * 4)   # 0.19, 0.046: no denormals
run = lambda: lib.cblas_sgemm(101, 111, 112, M, N, K, ctypes.c_float(1.0), A, K, B, K, ctypes.c_float(0.0), C, N)
run()
clock = time.process_time if sys.argv[5] == "1" else time.perf_counter
reps, t0 = 0, clock()
while clock() - t0 < 1.0:
    run(); reps += 1
print("%.0f %s" % (2.0 * M * N * K * reps / (clock() - t0) / 1e9, lib.openblas_get_corename().decode()))'
sgemm_rate() { OMP_NUM_THREADS=$TH $PY -c "$SGEMM_PY" "$BLAS_LIB" "$@" "${CPUTIME:-0}"; }
# tok/s of train_gpt at B T: its average step (wall), or with CPUTIME=1 the CPU seconds of a run of STEPS + 1
# steps less those of a run of 1 (start-up and the untimed first step cancel)
cpu_seconds() { /usr/bin/time -f "%U %S" "$@" 2>&1 >/dev/null | tail -n 1 | awk '{ print $1 + $2 }'; }
ours_tok() {
    local run=(env OMP_NUM_THREADS=$TH ./train_gpt -e "${OURS_MODEL:-$MODEL}" -b $1 -t $2 -s 0 -v 0)
    if [ "${CPUTIME:-0}" = 1 ]; then
        awk -v a="$(cpu_seconds "${run[@]}" -x 1)" -v b="$(cpu_seconds "${run[@]}" -x $((STEPS + 1)))" -v n=$(($1 * $2 * STEPS)) \
            'BEGIN { printf "%.0f", n / (b - a) }'
    else "${run[@]}" -x $((STEPS + 1)) | awk '/average step/ { print $(NF-1) }'; fi
}
# ... of PyTorch (dev/bench/torch_gpt2.py, or the command in TORCH_CMD; its OpenBLAS on the same threads) into
# t, its line into torch_line: wall, or from its CPU ms per step
torch_tok() {
    local cmd=(${TORCH_CMD:-$PY dev/bench/torch_gpt2.py})
    torch_line=$(OPENBLAS_NUM_THREADS=$TH "${cmd[@]}" --threads "$TH" --steps "$STEPS" --B $1 --T $2)
    if [ "${CPUTIME:-0}" = 1 ]; then t=$(awk -v n=$(($1 * $2)) '{ printf "%.0f", n / ($10 / 1000) }' <<<"$torch_line")
    else t=$(awk '{ print $4 }' <<<"$torch_line"); fi
}

SHAPES=("4 64" "16 64" "4 256" "1 1024")
if [[ $TABLES == *1* ]]; then
echo "== 1. throughput: L4 C128 NH4 V50257 (Vp 50304), $TH threads, $STEPS steps after warm-up, best of $ROUNDS round(s)$(
      [ "${CPUTIME:-0}" = 1 ] && echo ", in CPU time")"
read -r sq core < <(sgemm_rate 2048 2048 2048)
read -r head _ < <(sgemm_rate 1024 50304 128)
echo "OpenBLAS sgemm, $core kernels${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}: $sq GFLOP/s at 2048^3," \
     "$head GFLOP/s at the LM head's M1024 N50304 K128"
# training FLOPs per token: 6 (the layers' 12 L C^2 + the head's C Vp) + the causal attention's 6 L C T
flops() { awk -v T="$1" 'BEGIN { L = 4; C = 128; Vp = 50304; print 6 * (12 * L * C * C + C * Vp) + 6 * L * C * T }'; }
declare -A ours torch
for r in $(seq 1 "$ROUNDS"); do
    for bt in "${SHAPES[@]}"; do
        set -- $bt
        o=$(ours_tok $1 $2)
        torch_tok $1 $2
        awk -v a="$o" -v b="${ours[$bt]:-0}" 'BEGIN { exit !(a > b) }' && ours[$bt]=$o
        awk -v a="$t" -v b="${torch[$bt]:-0}" 'BEGIN { exit !(a > b) }' && torch[$bt]=$t
    done
done
echo "PyTorch: $torch_line"
printf "%-9s %7s %15s %15s %7s %11s %11s\n" "shape" tokens train_gpt PyTorch ratio "ours/bound" "torch/bound"
for bt in "${SHAPES[@]}"; do
    set -- $bt
    awk -v B=$1 -v T=$2 -v a="${ours[$bt]}" -v b="${torch[$bt]}" -v f="$(flops $2)" -v sq="$sq" 'BEGIN {
        bound = sq * 1e9 / f   # tok/s if every FLOP ran at the 2048^3 sgemm rate
        printf "B%-2d T%-4d %7d %9.0f tok/s %9.0f tok/s %6.2fx %10.0f%% %10.0f%%\n", B, T, B * T, a, b, a / b, 100 * a / bound, 100 * b / bound }'
done
awk -v a="${ours[1 1024]}" -v b="${ours[16 64]}" -v c="${torch[1 1024]}" -v d="${torch[16 64]}" 'BEGIN {
    printf "B1 T1024 / B16 T64 (1024 tokens per step both): train_gpt %.2f, PyTorch %.2f\n", a / b, c / d }'
echo "(bound: the 2048^3 sgemm rate over the training FLOPs per token, 6 (12 L C^2 + C Vp) + 6 L C T)"
fi

if [[ $TABLES == *2* ]]; then
echo
echo "== 2. peak logits/loss memory, B4 T1024, one rank (from --memory-report)"
for chunk in 0 256; do
    peak=$(OMP_NUM_THREADS=$TH ./train_gpt -e "$MODEL" -b 4 -t 1024 -x 1 -s 0 -v 0 --ce-chunk $chunk --memory-report | awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == "logits" { print $5 }')
    echo "--ce-chunk $chunk: $(mib "$peak") MiB"
    [ $chunk = 0 ] && full=$peak || chunked=$peak
done
awk -v a="$chunked" -v b="$full" 'BEGIN { printf "chunked / full = %.4f (target < 0.1)\n", a / b }'

fi

if [[ $TABLES == *3* ]]; then
echo
echo "== 3. data parallel: d4 (V50257) at dp 2, B4 T64, 1 thread per rank, 6 steps"
printf "%-6s %10s %16s %16s %16s %16s\n" zero tok/s "dp bytes/step" "params B/rank" "grads B/rank" "optim B/rank"
for z in 0 1 2 3; do
    out=$(OMP_NUM_THREADS=1 $MPIRUN -np 2 ./train_gpt -e d4 -b 4 -t 64 -x 6 -s 0 -v 0 --zero $z --comm-report --memory-report)
    tok=$(awk '/average step/ { print $(NF-1) }' <<<"$out")
    dpb=$(awk '$1 == "comm" && $2 == 0 && $3 == "dp" { print $4 }' <<<"$out")
    get() { awk -v c="$1" '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == c { print $5 }' <<<"$out"; }
    printf "%-6s %10s %16s %16s %16s %16s\n" $z "$tok" "$dpb" "$(get parameters)" "$(get gradients)" "$(get optimizer)"
done
echo "(ring all-reduce of all gradients = 2(p-1)/p * 4P = 4P bytes at dp 2; zero 3 gathers each layer twice: ~1.5x)"

fi

if [[ $TABLES == *4* ]]; then
echo
echo "== 4. peak memory per rank (MiB), L4 C128 NH4 V50257 (Vp 50304), B1, set-up only (-x 0): every buffer is preallocated"
printf "%-6s %-3s %-4s %-9s %12s %12s %12s\n" T tp sp ce activations logits total
for T in 1024 4096 16384; do
    for tp in 1 2 4; do
        for chunk in 0 256; do
            sp=""; [ $tp -gt 1 ] && sp="--sp"
            out=$(OMP_NUM_THREADS=1 $MPIRUN -np $tp ./train_gpt -e "L=4,C=128,NH=4,V=50257,maxT=16384" -b 1 -t $T -x 0 -s 0 -v 0 \
                  --tp $tp $sp --ce-chunk $chunk --memory-report)
            act=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == "activations" { print $5 }' <<<"$out")
            lg=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 == "logits" { print $5 }' <<<"$out")
            tot=$(awk '/at the end of the run/ { exit } $1 == "mem" && $2 == 0 && $3 != "total" { s += $5 } END { print s }' <<<"$out")
            printf "%-6s %-3s %-4s %-9s %12s %12s %12s\n" $T $tp "${sp:+yes}" "$([ $chunk = 0 ] && echo full || echo chunk256)" \
                   "$(mib "$act")" "$(mib "$lg")" "$(mib "$tot")"
        done
    done
done
fi

if [[ $TABLES == *5* ]]; then
echo
# L4 C256 NH4 KV2 (head size 64) F768 = 256 ceil(8C/3/256), V50257 (Vp 50304), untied, RoPE theta 500000, eps 1e-5
LLAMA="arch=llama,L=4,C=256,NH=4,KV=2,V=50257,maxT=1024"
echo "== 5. Llama throughput: L4 C256 NH4 KV2 F768 V50257 (Vp 50304) untied, $TH threads, $STEPS steps after" \
     "warm-up, best and median of $ROUNDS round(s)$([ "${CPUTIME:-0}" = 1 ] && echo ", in CPU time")"
read -r sq core < <(sgemm_rate 2048 2048 2048)
read -r head _ < <(sgemm_rate 1024 50304 256)
echo "OpenBLAS sgemm, $core kernels${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}: $sq GFLOP/s at 2048^3," \
     "$head GFLOP/s at the LM head's M1024 N50304 K256"
# training FLOPs per token: 6 (the layers' L (2 C^2 + 2 C KV hs + 3 C F) + the untied head's C Vp) + attention's 6 L C T
lflops() { awk -v T="$1" 'BEGIN { L = 4; C = 256; kv = 128; F = 768; Vp = 50304
    print 6 * (L * (2 * C * C + 2 * C * kv + 3 * C * F) + C * Vp) + 6 * L * C * T }'; }
LSHAPES=("16 64" "4 256" "1 1024")
declare -A lours ltorch
for r in $(seq 1 "$ROUNDS"); do
    for bt in "${LSHAPES[@]}"; do
        set -- $bt
        lours[$bt]+=" $(OURS_MODEL=$LLAMA ours_tok $1 $2)"
        TORCH_CMD="$VENV_PY dev/bench/torch_llama.py --L 4 --C 256 --NH 4 --KV 2 --F 768 --V 50257 --maxT 1024" torch_tok $1 $2
        ltorch[$bt]+=" $t"
    done
done
echo "transformers: $torch_line"
best() { tr ' ' '\n' <<<"$1" | awk 'NF' | sort -g | tail -n 1; }
median() { tr ' ' '\n' <<<"$1" | awk 'NF' | sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf "%-9s %7s %11s %11s %7s %11s %11s %7s %11s %11s\n" "shape" tokens "ours best" "torch best" ratio \
       "ours med" "torch med" ratio "ours/bound" "torch/bound"
for bt in "${LSHAPES[@]}"; do
    set -- $bt
    awk -v B=$1 -v T=$2 -v a="$(best "${lours[$bt]}")" -v b="$(best "${ltorch[$bt]}")" -v c="$(median "${lours[$bt]}")" \
        -v d="$(median "${ltorch[$bt]}")" -v f="$(lflops $2)" -v sq="$sq" 'BEGIN {
        bound = sq * 1e9 / f   # tok/s if every FLOP ran at the 2048^3 sgemm rate
        printf "B%-2d T%-4d %7d %11.0f %11.0f %6.2fx %11.0f %11.0f %6.2fx %10.0f%% %10.0f%%\n", B, T, B * T, a, b, a / b,
               c, d, c / d, 100 * a / bound, 100 * b / bound }'
done
awk -v a="$(best "${lours[1 1024]}")" -v b="$(best "${lours[16 64]}")" -v c="$(best "${ltorch[1 1024]}")" \
    -v d="$(best "${ltorch[16 64]}")" 'BEGIN {
    printf "B1 T1024 / B16 T64 (1024 tokens per step both, best): ours %.2f, transformers %.2f\n", a / b, c / d }'
echo "(tok/s; bound: the 2048^3 sgemm rate over the training FLOPs per token, 6 (L (2C^2 + 2C KV hs + 3C F) + C Vp) + 6 L C T)"
fi
