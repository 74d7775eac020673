#!/usr/bin/env bash
# Every header of llmc/ includes what it uses: each compiles by itself (a file that is only that #include), with
# the CPU build's flags, with MPI and without (NO_MPI=1), warnings as errors. (llmc/emu/ is the emulated device's,
# compiled only inside the CUDA build's host compile: scripts/test_emu.sh.)
# Usage: bash scripts/test_headers.sh BIN_DIR WORK_DIR (as the other scripts; BIN_DIR unused)
. "$(dirname "$0")/test_lib.sh"
FLAGS="-fsyntax-only -fopenmp -Wall -Wextra -Wno-unused-function -Wno-missing-field-initializers -Werror -I. -x c++"
MPI_FLAGS="$(mpicxx --showme:compile 2>/dev/null) -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX"
check() {   # HEADER: "ok" or "FAIL" with the first error of each build
    local h=$1 out=$W/$(basename "$h").log rc=0
    { echo "#include \"$h\"" | g++ $FLAGS $MPI_FLAGS - && echo "#include \"$h\"" | g++ $FLAGS -DNO_MPI -; } >"$out" 2>&1 || rc=1
    local why=""
    [ $rc = 0 ] || why=": $(grep -m1 -E 'error|warning' "$out")"
    say $rc "$h compiles by itself (the CPU build's flags, with MPI and NO_MPI)$why"
}
export -f check say
export W FLAGS MPI_FLAGS
ls llmc/*.h | xargs -P 2 -I{} bash -c 'check {}'
