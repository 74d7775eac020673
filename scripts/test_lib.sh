# Sourced by the scripts/test_*.sh checks (. "$(dirname "$0")/test_lib.sh"): their two arguments BIN_DIR
# WORK_DIR, MPI as root on oversubscribed cores, and say STATUS TEXT, which prints "ok ..." or "FAIL ...".
set -u
BIN=$1
W=$2
mkdir -p "$W"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN="mpirun --oversubscribe --bind-to none"
say() { if [ "$1" = 0 ]; then echo "ok   $2"; else echo "FAIL $2"; fi; }
