#!/usr/bin/env bash
# The flight recorder (llmc/flight_recorder.h, llmc/flight_diagnosis.h): eight faults injected on CPU ranks through
# the test hooks (llmc/test_hooks.h), each at --timeout 3. Each job must end within --timeout + 10 s, exit non-zero,
# with a "diagnosis:" line printed by train_gpt (for the kill -9, by dev/flight.sh from the run directory) that names
# the rank, the group, the call's number and what the other ranks were doing. Then --check-collectives must stop
# (1) and (2) at the faulty call, before any timeout; a run without -o diagnoses from the job's temporary folder.
# Usage: bash scripts/test_flight.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines, then the table's rows)
. "$(dirname "$0")/test_lib.sh"
TINY="L=2,C=64,NH=4,V=256,maxT=64"
COMMON=(-e "$TINY" -t 32 -v 0 -s 0 --timeout 3)
LIMIT=13            # seconds: --timeout + 10
mkdir -p "$W/tmp"
RANKS="-x TMPDIR=$W/tmp"   # (the ranks' temporary folder: the rings of a job that never owned a run directory stay here)
TABLE=()
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
diag() { grep -m1 '^diagnosis:' "$1" | cut -c1-1000; }
rank_pid() {   # MPIRUN_PID RANK: the pid of that rank among mpirun's children's children (the ranks)
    local p
    for p in $(pgrep -P "$1" 2>/dev/null) $(for c in $(pgrep -P "$1" 2>/dev/null); do pgrep -P "$c"; done); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return; }
    done
}

# job NAME NP "MPIRUN OPTIONS" ARGS...: a job that ends by itself, timed from its launch (rc, t, $W/NAME.log)
job() {
    local name=$1 np=$2 opts=$3; shift 3
    rm -rf "$W/$name"
    local t0; t0=$(now)
    timeout 60 $MPIRUN -np "$np" $RANKS $opts "$BIN/train_gpt" "${COMMON[@]}" "$@" >"$W/$name.log" 2>&1
    rc=$?; t=$(since "$t0")
}

# verdict LABEL LOG REGEX: the job ended in time, non-zero, with a diagnosis matching REGEX (a table row)
verdict() {
    local label=$1 log=$2 re=$3 line
    line=$(diag "$log")
    [ $rc != 0 ] && [ $rc != 124 ] && awk -v t="$t" -v l=$LIMIT 'BEGIN { exit !(t <= l) }' && grep -qE -- "$re" <<<"$line"
    say $? "$label: exit $rc in $t s: ${line:-no diagnosis line}"
    TABLE+=("| $label | \`${line:-none}\` | $t |")
}

# (1) a rank skips one dp all-reduce: the step's last (the embedding's, #8 of step 1), so that it goes on to the
#     optimizer's world all-reduce, which the others never reach
job skip 3 "-x TRAIN_GPT_COMM_FAULT=skip:dp:all-reduce:8:1" -b 2 -x 4 -o "$W/skip"
verdict "(1) rank 1 skips dp all-reduce #8 (dp 3)" "$W/skip.log" \
    "^diagnosis: rank 1 never entered dp all-reduce #8 of step 1 \(micro-batch 0, the embedding backward\): it waits in world all-reduce #16 of step 1 \(optimizer\), which ranks 0,2 never entered: a deadlock.*; ranks 0,2 wait in dp all-reduce #8 of step 1"

# (2) a rank calls a tp all-gather with another count (half: the others' receive buffers are not overrun)
job count 4 "-x TRAIN_GPT_COMM_FAULT=count:tp:all-gather:33:2" -b 2 --tp 4 --sp -x 4 -o "$W/count"
verdict "(2) rank 2 calls tp all-gather #33 with half its count (tp 4, sp)" "$W/count.log" \
    "^diagnosis: ranks disagree on tp all-gather #33 of step 1 \(micro-batch 0, layer 0 forward\): ranks 0-1,3 4 KiB, rank 2 2 KiB; ranks? [0-9,-]+ waits? in tp "

# (3) a rank runs another pipeline schedule: rank 0 GPipe (every forward first), rank 1 1F1B: each sends what the
#     other does not receive
job schedule 2 "-x TRAIN_GPT_PP_SCHEDULE=gpipe:0" -b 1 -d 128 --pp 2 -x 3 -o "$W/schedule"
verdict "(3) rank 0 runs GPipe, rank 1 1F1B (pp 2, 4 micro-batches)" "$W/schedule.log" \
    "^diagnosis: rank 1 waits in pp send #1 to rank 0 of step 0 \(micro-batch 0, layer 1 backward\), which received 0: rank 0 waits in pp send #3 to rank 1 of step 0 \(micro-batch 2, layer 0 forward\), which received 2: a deadlock"

# (4) a rank swaps two collectives on different groups: its last dp all-reduce of step 1 after the world's
job swap 2 "-x TRAIN_GPT_COMM_FAULT=swap:dp:all-reduce:8:1" -b 2 -x 4 -o "$W/swap"
verdict "(4) rank 1 makes dp all-reduce #8 after world all-reduce #16" "$W/swap.log" \
    "^diagnosis: rank 1 never entered dp all-reduce #8 of step 1 .*: it waits in world all-reduce #16 of step 1 \(optimizer\), which rank 0 never entered: a deadlock.*; rank 0 waits in dp all-reduce #8 of step 1"

# (5) a rank stopped (SIGSTOP) mid-step: the call rank 0 waits in must be one its ring holds as pending
rm -rf "$W/stop"
$MPIRUN -np 2 $RANKS "$BIN/train_gpt" "${COMMON[@]}" -b 2 -x 100000 -o "$W/stop" >"$W/stop.log" 2>&1 &
mp=$!
for i in $(seq 1 200); do grep -q "^step    3/" "$W/stop.log" && break; sleep 0.05; done
for i in $(seq 1 20); do victim=$(rank_pid $mp 1); [ -n "$victim" ] && break; sleep 0.05; done
t0=$(now); kill -STOP "$victim"
for i in $(seq 1 300); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
t=$(since "$t0"); kill -0 $mp 2>/dev/null && { kill -9 $mp; rc=124; } || { wait $mp; rc=$?; }
kill -9 "$victim" 2>/dev/null
waited=$(diag "$W/stop.log" | grep -oE "rank 0 waits in [a-z]+ [a-z-]+ #[0-9]+" | sed 's/rank 0 waits in //')
pending=$(bash dev/flight.sh "$W/stop" --list 256 | awk '/^rank 0 /{ r = 1; next } /^rank /{ r = 0 } r && /pending/')
verdict "(5) rank 1 stopped (SIGSTOP) at step 3 or later" "$W/stop.log" \
    "^diagnosis: rank 1 (never entered [a-z]+ [a-z-]+ #[0-9]+ .*: it )?is stopped \(process state T"
[ -n "$waited" ] && grep -q "pending $waited " <<<"$pending"
say $? "(5) what rank 0 waits in, as the diagnosis names it ($waited), is pending in its ring"
# afterwards the launcher has ended rank 1 (SIGTERM) and the rings alone would blame MPI: dev/flight.sh prints the
# line the job printed first (kept in the diagnosing rank's ring), so both name the stopped rank
bash dev/flight.sh "$W/stop" >"$W/stop.offline" 2>&1
[ -n "$(diag "$W/stop.log")" ] && [ "$(diag "$W/stop.offline")" = "$(diag "$W/stop.log")" ]
say $? "(5) dev/flight.sh on the run directory afterwards names the same culprit: $(diag "$W/stop.offline" | cut -c1-120)"

# (6) a rank killed (kill -9) inside an exchange: mpirun ends the job at once, so dev/flight.sh diagnoses from -o
rm -rf "$W/kill"
$MPIRUN -np 2 $RANKS -x TRAIN_GPT_STALL=exchange:1 "$BIN/train_gpt" "${COMMON[@]}" -b 1 -d 128 --pp 2 -x 3 -o "$W/kill" \
    >"$W/kill.log" 2>&1 &
mp=$!
for i in $(seq 1 200); do grep -q "test hook: rank 1 .* stalls at exchange" "$W/kill.log" && break; sleep 0.05; done
victim=$(grep -m1 -o "test hook: rank 1 (pid [0-9]*)" "$W/kill.log" | grep -o "[0-9]*)" | tr -d ')')
t0=$(now); kill -9 "$victim"
for i in $(seq 1 300); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
t=$(since "$t0"); kill -0 $mp 2>/dev/null && { kill -9 $mp; rc=124; } || { wait $mp; rc=$?; }
bash dev/flight.sh "$W/kill" >"$W/kill.diag" 2>&1
verdict "(6) rank 1 killed (kill -9) in its first exchange (pp 2); dev/flight.sh" "$W/kill.diag" \
    "^diagnosis: rank 1 is gone \(its process ended without a mark: killed -9, or crashed\) in pp (recv|send) #1 (from|to) rank 0 of step 0 .*; rank 0 was ended by SIGTERM \(the launcher\?\) in pp (send|recv) #1 (to|from) rank 1"

# (7) rank 0's checkpoint write stalls (a hung disk: no progress)
job ckpt 2 "-x TRAIN_GPT_HUNG_CHECKPOINT=60" -b 2 -x 6 -n 3 -o "$W/ckpt"
n=$(diag "$W/ckpt.log" | grep -oE "never entered world broadcast #[0-9]+" | grep -oE "[0-9]+$")
verdict "(7) rank 0's checkpoint write of step 3 stalls" "$W/ckpt.log" \
    "^diagnosis: rank 0 never entered world broadcast #${n:-X} of step 2 \(checkpoint\): it runs, outside any call \(the checkpoint write of step 3 has made no progress for [0-9.]+ s\).*; rank 1 waits in world broadcast #${n:-X} of step 2 \(checkpoint\)"

# (8) a rank stalls before MPI_Init
job init 2 "-x TRAIN_GPT_STALL=init:1" -b 2 -x 3 -o "$W/init"
verdict "(8) rank 1 stalls before MPI_Init" "$W/init.log" \
    "^diagnosis: rank 1 never entered MPI_Init: it runs, outside any call, and has made none yet \(set-up\); rank 0 waits in MPI_Init$"

# --check-collectives: (1) (a skip the rank's next dp call shows: the head's #5, then layer 1's) and (2) stop at the
# faulty call, before any timeout
for c in "skip:dp:all-reduce:5:1|3|-b 2 -x 4|(1) rank 1 skips dp all-reduce #5|ranks disagree on dp all-reduce #5 of step 1: ranks 0,2 [0-9]+ B \(micro-batch 0, the head backward\), rank 1 [0-9.]+ KiB \(micro-batch 0, layer 1 backward\)" \
         "count:tp:all-gather:33:2|4|-b 2 --tp 4 --sp -x 4|(2) rank 2 halves tp all-gather #33|ranks disagree on tp all-gather #33 of step 1 \(micro-batch 0, layer 0 forward\): ranks 0-1,3 4 KiB, rank 2 2 KiB"; do
    IFS='|' read -r fault np args label re <<<"$c"
    job checked $np "-x TRAIN_GPT_COMM_FAULT=$fault" $args --check-collectives -o "$W/checked"
    verdict "$label, --check-collectives" "$W/checked.log" "^diagnosis: $re"
    ! grep -q "no progress" "$W/checked.log" && grep -q "^error: rank 0: --check-collectives: the ranks of group" "$W/checked.log"
    say $? "    ... stopped by the check before the call, no rank timed out"
done

# without -o: the rings stay in the job's temporary folder (here in $W/tmp), where the first rank to time out reads
# them, and after this abnormal end dev/flight.sh too
rm -rf "$W"/tmp/llmc-flight-*
job noout 2 "-x TRAIN_GPT_COMM_FAULT=swap:dp:all-reduce:8:1" -b 2 -x 4
verdict "(4) without -o (the rings in \$TMPDIR/llmc-flight-JOB)" "$W/noout.log" \
    "^diagnosis: rank 1 never entered dp all-reduce #8 of step 1 .*: it waits in world all-reduce #[0-9]+ of step 1 \(optimizer\), which rank 0 never entered"
[ "$(ls "$W"/tmp/llmc-flight-*/rank_*.ring 2>/dev/null | wc -l)" = 2 ] \
    && [ "$(bash dev/flight.sh "$W"/tmp/llmc-flight-* | head -n 1 | cut -c1-80)" = "$(diag "$W/noout.log" | cut -c1-80)" ]
say $? "    ... its 2 rings kept in \$TMPDIR/llmc-flight-JOB, where dev/flight.sh prints the same line"

echo "the table (dev/notes/reliability.md):"
printf '%s\n' "${TABLE[@]}"
