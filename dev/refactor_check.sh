#!/usr/bin/env bash
# A refactoring changes no behaviour: the same fixed runs of train_gpt built from a base commit and from
# the working tree give byte-identical main.log, model and state files, and the same screen output (less
# the timings). CPU build; MPI as root on oversubscribed cores.
# Usage: bash dev/refactor_check.sh BASE_REV   (e.g. HEAD~1; prints "identical" or the files that differ)
set -u
cd "$(dirname "$0")/.."
BASE=${1:?usage: $0 BASE_REV}
W=$(mktemp -d)
trap 'git worktree remove --force "$W/base" >/dev/null 2>&1; rm -rf "$W"' EXIT
git worktree add -q --detach "$W/base" "$BASE" || exit 1
make -s -C "$W/base" BACKEND=cpu >/dev/null || { echo "base build failed"; exit 1; }
make -s BACKEND=cpu >/dev/null || { echo "build failed"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
M="L=4,C=64,NH=4,V=256,maxT=64"
common=(-t 32 -n 3 -v 3 -m 2 -l 3e-3 -c 0.1 -s 3 -g 8 --memory-report --comm-report)
runs() {   # BIN OUT
    local bin=$1 out=$2 mpi="mpirun --oversubscribe --bind-to none -np"
    $mpi 1 $bin -e $M "${common[@]}" -x 6 -b 4 -o $out/single
    $mpi 4 $bin -e $M "${common[@]}" -x 6 -b 2 --tp 2 --sp --zero 3 -o $out/tp2sp_dp2z3
    $mpi 2 $bin -e $M "${common[@]}" -x 6 -b 1 -d 128 --pp 2 --vpp 2 -o $out/pp2vpp2
    $mpi 2 $bin -e $M "${common[@]}" -x 6 -b 4 --cp 2 -o $out/cp2
    $mpi 4 $bin -e $M,E=4,k=2 "${common[@]}" -x 6 -b 4 --ep 2 --tp 2 --sp -o $out/moe_ep2tp2sp
    $mpi 4 $bin -e $M,E=4,k=2,every=2 "${common[@]}" -b 2 -d 256 --pp 2 --ep 2 -x 3 -o $out/moe_pp2ep2__ep2z1
    $mpi 2 $bin -e $M,E=4,k=2,every=2 "${common[@]}" -x 6 -b 4 -d 256 --ep 2 --zero 1 -y 1 -o $out/moe_pp2ep2__ep2z1
    $mpi 2 $bin -e $M "${common[@]}" -x 6 -b 1 -d 128 --pp 2 --pp-schedule zb --pp-layers auto -o $out/pp2zb_auto
    $mpi 2 $bin -e $M,E=8,k=2,every=2,H=64,S=1 "${common[@]}" -x 6 -b 4 --ep 2 --router-score sigmoid --moe-bias-rate 0.01 \
        --z-coeff 0 -o $out/moe_sig_bias_shared
}
plans() {   # BIN: the plan and the cost model print no measurement: compared whole
    local bin=$1
    $bin -e $M -b 4 -t 32 --plan-search 8
    $bin -e $M,E=4,k=2 -b 4 -t 32 -d 512 --plan 8 --tp 2 --pp 2 --ep 2 --memory-limit 1M
    $bin -e d12 -b 8 -t 1024 --plan 16 --tp 2 --pp 2 --zero 1 --memory-limit 4G
}
mkdir -p "$W/a" "$W/b"
# (a run that fails fails in both: its error lines are compared like the rest)
# (timings left out: the lines with ms, tok/s, the exposed-communication table, the stage pace lines)
timed=" ms|tok/s|^  stage|MoE all-to-all|Process name|^exposed |^ +[0-9]+ \\| "
runs "$W/base/train_gpt" "$W/a" 2>&1 | grep -vE "$timed" | sed "s|$W/a|OUT|g" >"$W/a.out"
runs ./train_gpt "$W/b" 2>&1 | grep -vE "$timed" | sed "s|$W/b|OUT|g" >"$W/b.out"
plans "$W/base/train_gpt" 2>&1 | grep -v "searched in" >>"$W/a.out"
plans ./train_gpt 2>&1 | grep -v "searched in" >>"$W/b.out"
bad=0
# (.lock holds the pid; flight/ the flight recorder's rings: times and pids, and a base before it has none)
files() { (cd "$1" && find . -type f ! -name .lock ! -path './*/flight/*' | sort); }
for f in $(files "$W/a"); do
    if [ "${f##*/}" = pipeline_costs.txt ]; then   # (measured seconds: the lines' names and order compared)
        cmp -s <(awk '{ $NF = ""; print }' "$W/a/$f" | sed "s|$W/a|OUT|g") \
               <(awk '{ $NF = ""; print }' "$W/b/$f" | sed "s|$W/b|OUT|g") || { echo "differs: $f"; bad=1; }
        continue
    fi
    cmp -s "$W/a/$f" "$W/b/$f" || { echo "differs: $f"; bad=1; }
done
[ "$(files "$W/a")" = "$(files "$W/b")" ] || { echo "differs: the set of files"; bad=1; }
cmp -s "$W/a.out" "$W/b.out" || { echo "differs: the screen output"; diff "$W/a.out" "$W/b.out" | head -20; bad=1; }
n=$(files "$W/a" | wc -l)
[ $bad = 0 ] && echo "identical: $n files and the screen output of 9 runs and 3 plans (base $(git rev-parse --short "$BASE"))"
exit $bad
