# Sourced by the scripts/test_*.sh checks (. "$(dirname "$0")/test_lib.sh"): their two arguments BIN_DIR
# WORK_DIR, MPI as root on oversubscribed cores, and say STATUS TEXT, which prints "ok ..." or "FAIL ...".
set -u
BIN=$1
W=$2
mkdir -p "$W"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN="mpirun --oversubscribe --bind-to none"
say() { if [ "$1" = 0 ]; then echo "ok   $2"; else echo "FAIL $2"; fi; }
# need_py MODULES...: the venv's python (PY) when it imports them; otherwise say so and end the script (a check
# that needs PyPI packages passes as skipped where scripts/setup.sh could not install them)
need_py() {
    local mods="$*"
    PY=.venv/bin/python
    [ -x "$PY" ] || PY=python3
    if ! $PY -c "import ${mods// /, }" 2>/dev/null; then
        say 1 "$* not installed for $PY: scripts/setup.sh installs them into .venv"
        exit 0
    fi
}
