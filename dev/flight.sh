#!/usr/bin/env bash
# The flight recorder's diagnosis from a run directory, after the job: the line train_gpt prints at a hang (the same
# code, llmc/flight_diagnosis.h), for a job where no rank could print it (a kill -9 that made mpirun end the job at
# once) or whose ranks did not share a file system (copy each node's DIR/flight/rank_*.ring into one folder).
# --list adds each rank's state and its last N calls (12).
# Usage: bash dev/flight.sh DIR [--list [N]]   (DIR: a run directory (-o), its flight/ folder, or a job's temporary
#        folder $TMPDIR/llmc-flight-JOB, where the rings of a run without -o stay after an abnormal end)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/build/flight
if [ ! -x "$BIN" ] || [ "$ROOT/dev/flight.c" -nt "$BIN" ] || [ "$ROOT/llmc/flight_diagnosis.h" -nt "$BIN" ] \
    || [ "$ROOT/llmc/flight_recorder.h" -nt "$BIN" ]; then
    mkdir -p "$ROOT/build" && ${CXX:-g++} -O1 -Wall -Wextra -Wno-unused-function -o "$BIN" -x c++ "$ROOT/dev/flight.c" || exit 1
fi
exec "$BIN" "$@"
