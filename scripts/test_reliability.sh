#!/usr/bin/env bash
# Reliability, second round: no hang the watchdog misses (a hung or stalled checkpoint write, a rank stalled
# before MPI_Init or after its last step), no healthy run killed (a write longer than --timeout that
# progresses), every checkpoint byte checked (header and body; the state names its model file; an
# unusable newest checkpoint is passed over), no torn main.log, no link followed, no debris, the inputs
# really compared, the optimizer state validated, divergence to finite losses caught, the final
# validation line never lost. Slow writes and stalls through the test hooks (llmc/test_hooks.h).
# Third round (R4): one run per -o (a new run refuses an earlier run's checkpoints, --overwrite deletes them,
# a resume continues only the run main.log records), retention counting only this run's intact checkpoints.
# Usage: bash scripts/test_reliability.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
TINY="L=2,C=64,NH=4,V=256,maxT=64"
BASE=(-t 32 -s 0 -c 0.1)                        # without -e, -v, -l: the checks that set them
COMMON=(-e "$TINY" "${BASE[@]}" -v 0 -l 3e-3)
TG="$BIN/train_gpt"
NOMPI=build/cpu-nompi/train_gpt                 # under RLIMIT_FSIZE (Open MPI's start-up writes files of its own)
logged() { cat "$1/main.log" 2>/dev/null | grep -c trl; }   # training lines in DIR/main.log (0 before it exists)
trl() { grep -v "^s:[0-9]* skip" "$1/main.log"; }
elapsed() { echo $(( $(date +%s) - $1 )); }
rank_pid() {   # PATTERN RANK: the pid of that MPI rank among the processes matching PATTERN
    for p in $(pgrep -f "$1"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return; }
    done
}
PY=python3

# ---------------------------------------------------------------- R1: hangs and false kills
# 2. a checkpoint write longer than --timeout that progresses (a slow disk) is not a stall: sync and async
for mode in sync async; do
    extra=(); [ $mode = async ] && extra=(--async-checkpoint)
    t0=$(date +%s)
    $MPIRUN -np 2 -x TRAIN_GPT_SLOW_CHECKPOINT=5 "$TG" "${COMMON[@]}" -b 2 -x 6 -n 3 --timeout 2 "${extra[@]}" -o "$W/slow_$mode" \
        >"$W/slow_$mode.log" 2>&1
    rc=$?
    [ $rc = 0 ] && [ -f "$W/slow_$mode/DONE_00000003" ] && [ -f "$W/slow_$mode/DONE_00000006" ]
    say $? "a $mode checkpoint write of 5 s more (progressing) under --timeout 2: exit $rc in $(elapsed $t0) s, both checkpoints DONE"
done
# 1. a write that makes no progress (a hung disk), sync and async: every rank stops, naming it
for mode in sync async; do
    extra=(); [ $mode = async ] && extra=(--async-checkpoint)
    t0=$(date +%s)
    timeout 60 $MPIRUN -np 2 -x TRAIN_GPT_HUNG_CHECKPOINT=60 "$TG" "${COMMON[@]}" -b 2 -x 6 -n 3 --timeout 2 "${extra[@]}" -o "$W/hung_$mode" \
        >"$W/hung_$mode.log" 2>&1
    rc=$?; t=$(elapsed $t0)
    [ $rc != 0 ] && [ $rc != 124 ] && [ $t -le 20 ] && grep -q "^error: the checkpoint write of step 3: no progress for" "$W/hung_$mode.log"
    say $? "a hung $mode checkpoint write: the job ends in $t s (--timeout 2): $(grep -m1 '^error' "$W/hung_$mode.log" | cut -c1-80)"
done
# 1. rank 0 stalled (SIGSTOP) while its asynchronous write is in flight: the others stop within --timeout
$MPIRUN -np 2 -x TRAIN_GPT_SLOW_CHECKPOINT=20 "$TG" "${COMMON[@]}" -b 2 -x 100000 -n 3 --async-checkpoint --timeout 2 -o "$W/stall0" \
    >"$W/stall0.log" 2>&1 &
mp=$!
for i in $(seq 1 200); do [ -f "$W/stall0/model_00000003.bin" ] && break; sleep 0.05; done
r0=$(rank_pid "train_gpt.*-o $W/stall0\$" 0)
t0=$(date +%s); kill -STOP "$r0"
for i in $(seq 1 300); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
t=$(elapsed $t0); alive=0; kill -0 $mp 2>/dev/null && alive=1
kill -9 $mp "$r0" 2>/dev/null; pkill -9 -f "train_gpt.*-o $W/stall0\$"; wait $mp 2>/dev/null
[ $alive = 0 ] && grep -q "error: rank 1: no progress for [0-9]* s in .*" "$W/stall0.log"
say $? "rank 0 stopped (SIGSTOP) during an asynchronous checkpoint write: the job ends in $t s: $(grep -m1 'no progress' "$W/stall0.log" | cut -c1-70)..."
# 3. a rank stalled before MPI_Init, or after its last step: the others do not wait forever
for where in init end; do
    t0=$(date +%s)
    timeout 60 $MPIRUN -np 2 -x TRAIN_GPT_STALL=$where:1 "$TG" "${COMMON[@]}" -b 2 -x 3 --timeout 2 -o "$W/stall_$where" >"$W/stall_$where.log" 2>&1
    rc=$?; t=$(elapsed $t0)
    op=$([ $where = init ] && echo MPI_Init || echo MPI_Finalize)
    [ $rc != 0 ] && [ $rc != 124 ] && grep -q "^error: rank 0: no progress for [0-9]* s in $op" "$W/stall_$where.log" \
        && { [ $where = init ] || [ -f "$W/stall_$where/DONE_00000003" ]; }
    say $? "rank 1 stalled at $where: exit $rc in $t s, rank 0 names $op$([ $where = end ] && echo ", the run's files complete")"
done
# 12. signals to mpirun (TERM, INT, HUP: it forwards SIGTERM): a checkpoint of the step the ranks stop at;
#     mpirun's own status is Open MPI's (1 after a signal); SIGHUP to a rank is a stop request like the others
for sig in TERM INT HUP; do
    d="$W/sig_$sig"
    $MPIRUN -np 2 "$TG" "${COMMON[@]}" -b 2 -x 100000 -o "$d" >"$d.log" 2>&1 &
    mp=$!
    for i in $(seq 1 200); do [ "$(logged "$d")" -ge 3 ] && break; sleep 0.05; done
    kill -$sig $mp; wait $mp; rc=$?
    # which signal the ranks see is the launcher's (Open MPI forwards SIGTERM), and whether their last lines reach
    # the log is too (mpirun may stop forwarding their output first): the proof is on disk, the checkpoint of
    # the step after the last one in main.log (s:N is step N + 1's loss), whole, and nothing torn beside it
    last=$(sed -n 's/^s:\([0-9]*\) trl.*/\1/p' "$d/main.log" | tail -n 1)
    step=$((${last:--1} + 1)); n=$(printf %08d "$step")
    [ -n "$last" ] && [ -f "$d/DONE_$n" ] && [ -f "$d/model_$n.bin" ] && [ -f "$d/state_$n.bin" ] \
        && [ -z "$(ls "$d" | grep -v -e '^DONE_' -e '^model_' -e '^state_' -e '^main.log$' -e '^flight$')" ] \
        && ! grep -q "exited on signal" "$d.log"
    say $? "SIG$sig to mpirun: the ranks write the checkpoint of step $step, the last in main.log ($(grep -o -m1 "stopped by SIG[A-Z]*" "$d.log" || echo "their stop line not forwarded by mpirun"); mpirun's status: $rc, Open MPI's choice)"
done
"$TG" "${COMMON[@]}" -x 100000 -o "$W/hup" >"$W/hup.log" 2>&1 &
pid=$!
for i in $(seq 1 200); do [ "$(logged "$W/hup")" -ge 3 ] && break; sleep 0.05; done
kill -HUP $pid; wait $pid; rc=$?
[ $rc = 0 ] && grep -q "stopped by SIGHUP" "$W/hup.log"
say $? "SIGHUP to a rank: a stop request (checkpoint, exit $rc)"

# ---------------------------------------------------------------- R2: files
"$TG" "${COMMON[@]}" -x 6 -n 3 -o "$W/ref" >/dev/null 2>&1   # the reference: checkpoints at 3 and 6
"$TG" "${COMMON[@]}" -x 9 -n 3 -o "$W/ref9" >/dev/null 2>&1  # and its uninterrupted continuation to 9
copy_ref() { rm -rf "$1"; cp -r "$W/ref" "$1"; rm -f "$1/.lock"; }
poke() {   # FILE OFFSET XOR: flip bits of one byte
    $PY -c "import sys; p, o, x = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); b = bytearray(open(p, 'rb').read()); b[o] ^= x; open(p, 'wb').write(b)" "$@"
}
set_int() {   # FILE SLOT VALUE: one int32 of the header
    $PY -c "import sys, struct; p, s, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); b = bytearray(open(p, 'rb').read()); b[4*s:4*s+4] = struct.pack('<i', v); open(p, 'wb').write(b)" "$@"
}
# 4. the header is covered: one header field changed in the newest model file (V) or state file (the step
#    counters); the newest checkpoint is passed over, named, and the run resumes from the one before and ends
#    where the uninterrupted run ends
for f in model state; do
    d="$W/hdr_$f"; copy_ref "$d"
    if [ $f = model ]; then set_int "$d/model_00000006.bin" 3 250; else set_int "$d/state_00000006.bin" 3 5; fi
    "$TG" "${COMMON[@]}" -x 9 -n 3 -y 1 -o "$d" >"$d.log" 2>&1
    rc=$?
    [ $rc = 0 ] && grep -q "note: the checkpoint of step 6 cannot be resumed: '.*${f}_00000006.bin' is corrupt" "$d.log" \
        && grep -q "resumed from step 3" "$d.log" && cmp -s "$d/model_00000009.bin" "$W/ref9/model_00000009.bin"
    say $? "a changed header field in the $f file of step 6: passed over with a note, resumed from step 3, the same model at step 9"
done
# a zeroed CRC slot plus a body flip must not pass as an llm.c file without a CRC: model file, state file
for f in model state; do
    d="$W/zcrc_$f"; copy_ref "$d"; rm -f "$d"/*00000003* "$d/DONE_00000003"
    set_int "$d/${f}_00000006.bin" 255 0; poke "$d/${f}_00000006.bin" 3000 1
    "$TG" "${COMMON[@]}" -x 9 -y 1 -o "$d" >"$d.log" 2>&1
    rc=$?
    [ $rc = 1 ] && grep -q "cannot be resumed: '.*${f}_00000006.bin' is corrupt" "$d.log" && grep -q "^error: -y 1: nothing to resume" "$d.log"
    say $? "the $f file's CRC slot zeroed and a body bit flipped: refused ($(grep -m1 '^error' "$d.log" | cut -c1-50)...)"
done
# random mutations of the only checkpoint (fixed seed): every one refused, none resumed silently
d="$W/mut"; accepted=0; n=0
for k in $(seq 1 24); do
    copy_ref "$d"; rm -f "$d"/*00000003* "$d/DONE_00000003"
    f=$([ $((k % 2)) = 0 ] && echo model || echo state)
    size=$(stat -c %s "$d/${f}_00000006.bin")
    off=$(( (k * 7919 * 104729) % size )); [ $((k % 3)) = 0 ] && off=$(( (k * 131) % 1024 ))   # a third in the header
    poke "$d/${f}_00000006.bin" $off $(( 1 << (k % 8) ))
    "$TG" "${COMMON[@]}" -x 9 -y 1 -o "$d" >"$d.log" 2>&1 && grep -q "resumed from step 6" "$d.log" && accepted=$((accepted + 1))
    n=$((n + 1))
done
[ $accepted = 0 ]
say $? "$n single-bit mutations of the only checkpoint (header and body, model and state files): $accepted resumed silently"
# an llm.c model file without a CRC still loads with -e; a state file of an older version is refused by name
cp "$W/ref/model_00000006.bin" "$W/nocrc.bin"; set_int "$W/nocrc.bin" 255 0; set_int "$W/nocrc.bin" 254 0
"$TG" -e "$W/nocrc.bin" -t 32 -v 0 -s 0 -x 1 >"$W/nocrc.log" 2>&1
say $? "an llm.c model file without a CRC (slots 254, 255 zero) loads with -e"
d="$W/oldver"; copy_ref "$d"; rm -f "$d"/*00000003* "$d/DONE_00000003"; set_int "$d/state_00000006.bin" 1 2
"$TG" "${COMMON[@]}" -x 9 -y 1 -o "$d" >"$d.log" 2>&1
[ $? = 1 ] && grep -q "^error: state file '.*' has version 2, expected 3: a checkpoint of an older version" "$d.log"
say $? "a state file of an older version: $(grep -m1 '^error' "$d.log" | cut -c1-90)..."
# 6. main.log: a write cut by a full disk (RLIMIT_FSIZE, SIGXFSZ ignored) leaves only whole lines; a fragment
#    left by a kill is dropped on resume, never glued to the next line
d="$W/flog"; rm -rf "$d"; mkdir -p "$d"
( trap '' XFSZ; ulimit -f 1; exec "$NOMPI" "${COMMON[@]}" -x 200 -o "$d" ) 2>&1 | cat >"$d.log"   # (a pipe: not limited)
rc=${PIPESTATUS[0]}
[ $rc = 1 ] && grep -q "^error: cannot write to main.log" "$d.log" && [ "$(tail -c 1 "$d/main.log" | od -An -c | tr -d ' ')" = '\n' ] \
    && ! grep -qvE '^(s:[0-9]+ trl:[0-9.]+|run:[0-9a-f]{16})$' "$d/main.log"
say $? "main.log on a full disk: the run stops (exit $rc), $(wc -l <"$d/main.log") whole lines kept, no torn one"
d="$W/frag"; copy_ref "$d"; printf 's:3' >>"$d/main.log"
"$TG" "${COMMON[@]}" -x 9 -n 3 -y 1 -o "$d" >/dev/null 2>&1
diff <(trl "$W/ref9") <(trl "$d") >/dev/null
say $? "a fragment 's:3' at the end of main.log: dropped on resume, the log equals the uninterrupted run's"
# a main.log without its run:ID line (cut, or an older version's) records no run: the checkpoints' own identity
# decides, said in a note (it used to block the resume, blaming "another run")
d="$W/norun"; copy_ref "$d"; sed -i '/^run:/d' "$d/main.log"
"$TG" "${COMMON[@]}" -x 9 -n 3 -y 1 -o "$d" >"$d.log" 2>&1
[ $? = 0 ] && grep -q "^note: .*main.log' has no run:ID line" "$d.log" && diff <(trl "$W/ref9" | grep -v '^run:') <(trl "$d") >/dev/null
say $? "main.log without its run: line: the resume continues (the checkpoints' identity decides), the log the uninterrupted run's: $(grep -m1 '^note: .*run:ID' "$d.log" | cut -c1-80)..."
# a main.log that is a directory: a resume refuses it in one line and leaves no main.log.tmp behind
d="$W/logdir"; copy_ref "$d"; rm -f "$d/main.log"; mkdir "$d/main.log"
"$TG" "${COMMON[@]}" -x 9 -n 3 -y 1 -o "$d" >"$d.log" 2>&1
[ $? = 1 ] && grep -q "^error: '.*main.log' is not a regular file" "$d.log" && [ ! -e "$d/main.log.tmp" ]
say $? "a main.log that is a directory: refused in one line, no main.log.tmp left: $(grep -m1 '^error' "$d.log" | cut -c1-100)"
# 7. links planted in -o are never followed: .lock refused; main.log, temporary files and DONE replaced
echo "precious" >"$W/victim"
d="$W/links"; rm -rf "$d"; mkdir -p "$d"; ln -s "$W/victim" "$d/.lock"
"$TG" "${COMMON[@]}" -x 2 -o "$d" >"$d.log" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "^error: cannot open '.*/.lock': it is a symbolic link" "$d.log" && [ "$(cat "$W/victim")" = precious ]
say $? "a .lock that is a symbolic link: refused (exit $rc), its target untouched"
rm -f "$d/.lock"
for n in main.log model_00000002.bin.tmp state_00000002.bin.tmp DONE_00000002 .write_test_0; do ln -sf "$W/victim" "$d/$n"; done
"$TG" "${COMMON[@]}" -x 2 -o "$d" >"$d.log" 2>&1
rc=$?
[ $rc = 0 ] && [ "$(cat "$W/victim")" = precious ] && [ -f "$d/DONE_00000002" ] && [ ! -L "$d/main.log" ]
say $? "links named main.log, the temporary files, DONE_ and the write test: replaced, never followed (exit $rc; target untouched)"
"$TG" "${COMMON[@]}" -x 2 -o "$d" >/dev/null 2>&1; ln -sf "$W/victim" "$d/main.log"
"$TG" "${COMMON[@]}" -x 4 -y 1 -o "$d" >"$d.log" 2>&1
[ $? = 1 ] && grep -q "main.log': it is a symbolic link" "$d.log" && [ "$(cat "$W/victim")" = precious ]
say $? "a resume whose main.log is a symbolic link: refused, its target untouched"
# 8. debris: a checkpoint write failing on a full disk leaves no temporary file and no model file without
#    its state; what an interrupted run left is removed at the next start; a missing model file or a
#    corrupt DONE_ falls back to the checkpoint before
d="$W/fdisk"; rm -rf "$d"; mkdir -p "$d"
( trap '' XFSZ; ulimit -f 300; exec "$NOMPI" "${COMMON[@]}" -x 4 -n 2 -o "$d" ) 2>&1 | cat >"$d.log"
rc=${PIPESTATUS[0]}
[ $rc = 1 ] && grep -q "^error: checkpoint of step 2: cannot write '.*model_00000002.bin.tmp'" "$d.log" && [ -z "$(ls "$d" | grep -v -e '^main.log$' -e '^flight$')" ]
say $? "a checkpoint write on a full disk: the run stops (exit $rc) and leaves only main.log (and flight/): $(ls "$d" | tr '\n' ' ')"
d="$W/debris"; copy_ref "$d"; touch "$d/model_00000009.bin.tmp" "$d/state_00000004.bin" "$d/main.log.tmp"; cp "$d/model_00000006.bin" "$d/model_00000008.bin"
"$TG" "${COMMON[@]}" -x 9 -n 3 -y 1 -o "$d" >"$d.log" 2>&1
[ $? = 0 ] && grep -q "removed 4 unfinished checkpoint file(s)" "$d.log" && ! ls "$d" | grep -qE 'tmp|_00000004|_00000008'
say $? "what an interrupted run left (temporary files, a model and a state file without DONE_): removed at the next start"
d="$W/nomodel"; copy_ref "$d"; rm "$d/model_00000006.bin"
"$TG" "${COMMON[@]}" -x 9 -n 3 -y 1 -o "$d" >"$d.log" 2>&1
[ $? = 0 ] && grep -q "note: the checkpoint of step 6 cannot be resumed: '.*model_00000006.bin' is missing" "$d.log" \
    && cmp -s "$d/model_00000009.bin" "$W/ref9/model_00000009.bin"
say $? "DONE_00000006 without its model file: the checkpoint of step 3 resumes instead, the same model at step 9"
# 10. the inputs really compared: ranks reading files of the same names and sizes but other tokens;
#     a resume with another -e shape, other -i data, or an -x before the checkpoint
$PY - "$W" <<'PYEOF'
import os, struct, sys
w = sys.argv[1]
for sub, seed in (("dA", 1), ("dB", 2)):
    os.makedirs(os.path.join(w, sub), exist_ok=True)
    toks = [(i * 7 + seed * (i % 5 == 0)) % 256 for i in range(20000)]
    hdr = [0] * 256; hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    open(os.path.join(w, sub, "data.bin"), "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))
PYEOF
timeout 60 mpirun --oversubscribe --bind-to none -np 1 --wdir "$W/dA" "$(readlink -f "$TG")" "${COMMON[@]}" -i data.bin -x 2 : \
    -np 1 --wdir "$W/dB" "$(readlink -f "$TG")" "${COMMON[@]}" -i data.bin -x 2 >"$W/data2.log" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] && grep -q "^error: rank 1: the training data (-i: file names, token counts or first tokens) on rank 1 differs" "$W/data2.log"
say $? "two ranks reading data.bin of the same size but other tokens: $(grep -m1 '^error' "$W/data2.log" | cut -c1-80)..."
d="$W/inputs"; rm -rf "$d"; "$TG" "${COMMON[@]}" -i "$W/dA/data.bin" -x 3 -o "$d" >/dev/null 2>&1
"$TG" "${COMMON[@]}" -i "$W/dB/data.bin" -x 6 -y 1 -o "$d" >"$W/inputs_i.log" 2>&1
[ $? = 1 ] && grep -q "^error: -i: the training data differs from the data of the run that wrote" "$W/inputs_i.log"
say $? "a resume reading other data: $(grep -m1 '^error' "$W/inputs_i.log" | cut -c1-80)..."
"$TG" -e "L=4,C=64,NH=4,V=256,maxT=64" "${BASE[@]}" -v 0 -l 3e-3 -i "$W/dA/data.bin" -x 6 -y 1 -o "$d" >"$W/inputs_e.log" 2>&1
[ $? = 1 ] && grep -q "^error: -e 'L=4,C=64,NH=4,V=256,maxT=64' (L 4 .*) is not the model of the checkpoint" "$W/inputs_e.log"
say $? "a resume given -e of another shape: $(grep -m1 '^error' "$W/inputs_e.log" | cut -c1-80)..."
"$TG" "${COMMON[@]}" -i "$W/dA/data.bin" -x 2 -y 1 -o "$d" >"$W/inputs_x.log" 2>&1
[ $? = 1 ] && grep -q "^error: -x 2: the checkpoint in '.*' is of step 3, past it: nothing to run" "$W/inputs_x.log"
say $? "a resume with -x below the checkpoint's step: $(grep -m1 '^error' "$W/inputs_x.log" | cut -c1-80)..."
# 11. the optimizer state validated: a negative AdamW v (finite, with a valid CRC) is refused, naming it
d="$W/negv"; copy_ref "$d"; rm -f "$d"/*00000003* "$d/DONE_00000003"
$PY - "$d/state_00000006.bin" <<'PYEOF'
import struct, sys, zlib
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
h = list(struct.unpack("<256i", b[:1024])); P = (h[11] & 0xFFFFFFFF) | (h[12] << 32)   # SH_PARAMS_LO, _HI
struct.pack_into("<f", b, 1024 + 4 * P + 4 * 10, -1.0)   # v of parameter 10
h[255] = 0; crc = zlib.crc32(bytes(b[1024:]), zlib.crc32(struct.pack("<256i", *h))) or 1
b[1020:1024] = struct.pack("<I", crc); open(p, "wb").write(b)
PYEOF
"$TG" "${COMMON[@]}" -x 9 -y 1 -o "$d" >"$d.log" 2>&1
[ $? = 1 ] && grep -q "^error: .*state_00000006.bin: the optimizer's second moment (v) of wte\[10\] is -1" "$d.log"
say $? "a negative v in the state (valid CRC): $(grep -m1 '^error' "$d.log" | cut -c1-90)..."
# 12. smaller: -d bounded; -e '' named; -h on one MPMD rank only
"$TG" "${COMMON[@]}" -x 1 -d 1073741824 -b 1 >"$W/bigd.log" 2>&1
[ $? = 1 ] && grep -q "^error: -d 1073741824 is .* micro-batches .* more than 65536" "$W/bigd.log"
say $? "-d 1073741824: $(grep -m1 '^error' "$W/bigd.log" | cut -c1-80)..."
"$TG" -e '' -x 1 >"$W/emptye.log" 2>&1
[ $? = 1 ] && grep -q "^error: -e '': expected a model file" "$W/emptye.log"
say $? "-e '': $(grep -m1 '^error' "$W/emptye.log")"
timeout 60 mpirun --oversubscribe --bind-to none -np 1 "$TG" -h : -np 1 "$TG" -x 1 -v 0 -s 0 >"$W/mpmdh.log" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] && grep -q "^error: rank 0: -h is given here, not on every rank" "$W/mpmdh.log"
say $? "-h on one rank of an MPMD launch: exit $rc, $(grep -m1 '^error' "$W/mpmdh.log" | cut -c1-70)..."

# ---------------------------------------------------------------- R3: the final validation, divergence
# 5. the final val line: a run killed after its last checkpoint but before the end's validation line resumes
#    at -x and writes it; a kill of rank 1 during the last checkpoint's write resumes and writes it too
VAL=(-e "$TINY" "${BASE[@]}" -l 3e-3 -v 3)
"$TG" "${VAL[@]}" -x 6 -n 3 -o "$W/val_ref" >/dev/null 2>&1
d="$W/val_lost"; rm -rf "$d"; cp -r "$W/val_ref" "$d"; rm -f "$d/.lock"; grep -v "^s:6 tel" "$W/val_ref/main.log" >"$d/main.log"
"$TG" "${VAL[@]}" -x 6 -n 3 -y 1 -o "$d" >/dev/null 2>&1
grep -q "^s:6 tel" "$W/val_ref/main.log" && cmp -s "$W/val_ref/main.log" "$d/main.log"
say $? "the final 's:6 tel:' line lost after the last checkpoint: the resume at step 6 writes it (main.log identical)"
$MPIRUN -np 2 "$TG" "${VAL[@]}" -b 2 -x 6 -n 3 -o "$W/val2_ref" >/dev/null 2>&1
d="$W/val_kill"; rm -rf "$d"
$MPIRUN -np 2 -x TRAIN_GPT_SLOW_CHECKPOINT=3 "$TG" "${VAL[@]}" -b 2 -x 6 -n 3 -o "$d" >/dev/null 2>&1 &
mp=$!
for i in $(seq 1 400); do [ -f "$d/model_00000006.bin" ] && break; sleep 0.05; done
kill -9 "$(rank_pid "train_gpt.*-o $d\$" 1)" 2>/dev/null; wait $mp 2>/dev/null
$MPIRUN -np 2 "$TG" "${VAL[@]}" -b 2 -x 6 -n 3 -y 1 -o "$d" >/dev/null 2>&1
cmp -s "$W/val2_ref/main.log" "$d/main.log" && [ -f "$d/DONE_00000006" ]
say $? "rank 1 killed -9 during the last checkpoint's write (validation on): resumed, main.log identical"
# 9. divergence to finite losses: -l 10 (the fixed bound 2 ln V), a model whose (tied) embedding is x1e12: skipped,
#    said, then stopped after --max-skips; -sg's window catches norms above it; a healthy run never trips the bound
"$TG" -e "$TINY" "${BASE[@]}" -v 0 -x 30 -l 10 -o "$W/div" >"$W/div.log" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "loss above its limit 11.09[0-9]*: update skipped (1 in a row)" "$W/div.log" \
    && grep -q "^error: step [0-9]*: 5 updates in a row skipped for a non-finite or diverging loss" "$W/div.log" \
    && grep -q "skip:loss .* (loss above its limit" "$W/div/main.log"
say $? "-l 10: the loss leaves 2 ln V = 11.09, every update after is skipped, said, and the run stops (exit $rc)"
$PY - "$W/ref/model_00000006.bin" "$W/huge.bin" <<'PYEOF'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read()); h = list(struct.unpack("<256i", b[:1024])); h[254] = h[255] = 0
import array; a = array.array("f", bytes(b[1024:])); n = h[7] * h[6]   # wte: Vp x C, first in the file
a = array.array("f", [x * 1e12 for x in a[:n]] + list(a[n:]))
open(sys.argv[2], "wb").write(struct.pack("<256i", *h) + a.tobytes())
PYEOF
"$TG" -e "$W/huge.bin" -t 32 -v 0 -s 0 -x 10 >"$W/huge.log" 2>&1
[ $? = 1 ] && grep -q "^step    1/10 .*loss above its limit" "$W/huge.log" && grep -q "^error: step 5: 5 updates in a row skipped" "$W/huge.log"
say $? "a model whose finite embedding is x 1e12 (loss $(grep -m1 '^step    1' "$W/huge.log" | awk '{ print $5 }')): no update applied, stopped at step 5"
"$TG" "${COMMON[@]}" -x 160 -sg 0.000001 --max-skips 1000 -o "$W/sg" >"$W/sg.log" 2>&1
first=$(grep -m1 "norm above its limit" "$W/sg.log" | awk '{ print $2 }' | cut -d/ -f1)
[ -n "$first" ] && [ "$first" -gt 128 ] && ! grep -q "loss above" "$W/sg.log"
say $? "-sg: nothing skipped before the window of 128 applied updates is full; after it a norm above mean + z std is skipped (first at step ${first:-none})"
"$TG" "${COMMON[@]}" -x 300 -o "$W/healthy" >"$W/healthy.log" 2>&1
[ $? = 0 ] && ! grep -q "skip" "$W/healthy/main.log"
say $? "a healthy 300-step run: the fixed bound never fires (no update skipped; the loss starts near ln V and falls)"

# ---------------------------------------------------------------- R4: one run per directory; retention
steps_in() { ls "$1" | sed -n 's/^DONE_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tr '\n' ' '; }
run_of() {   # STATE_FILE: the run identity in its header (slots 28, 29), as main.log's first line writes it
    $PY -c "import struct, sys; h = struct.unpack('<256i', open(sys.argv[1], 'rb').read(1024)); print('run:%016x' % ((h[28] & 0xFFFFFFFF) | (h[29] & 0xFFFFFFFF) << 32))" "$1"
}
# 2. a resume passing over a corrupt newest checkpoint (step 10): -nk 1 counts only this run's intact
#    checkpoints and never deletes the one just marked; step 10 goes to unusable/ and is never the newest again
d="$W/pass10"; rm -rf "$d"
"$TG" "${COMMON[@]}" -x 10 -n 5 -o "$d" >/dev/null 2>&1; poke "$d/state_00000010.bin" 5000 1
"$TG" "${COMMON[@]}" -x 9 -n 1 -nk 1 -y 1 -o "$d" >"$d.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "resumed from step 5" "$d.log" && [ "$(steps_in "$d")" = "9 " ] \
    && [ "$(ls "$d/unusable" | tr '\n' ' ')" = "DONE_00000010 model_00000010.bin state_00000010.bin " ] \
    && cmp -s "$d/model_00000009.bin" "$W/ref9/model_00000009.bin" && cmp -s "$d/state_00000009.bin" "$W/ref9/state_00000009.bin"
say $? "a corrupt step 10 passed over, -x 9 -n 1 -nk 1 -y 1 (exit $rc): keeps its own step 9 ($(steps_in "$d")), = the uninterrupted run's; step 10 moved to unusable/"
"$TG" "${COMMON[@]}" -x 10 -y 1 -o "$d" >"$d.2.log" 2>&1
[ $? = 0 ] && grep -q "resumed from step 9" "$d.2.log" && ! grep -q "cannot be resumed" "$d.2.log"
say $? "the next -y 1 continues step 9: the unusable step 10 no longer counts as the newest"
d="$W/y2bad"; rm -rf "$d"
"$TG" "${COMMON[@]}" -x 4 -n 4 -o "$d" >/dev/null 2>&1; poke "$d/model_00000004.bin" 3000 1
"$TG" "${COMMON[@]}" -x 3 -y 2 -o "$d" >"$d.log" 2>&1
[ $? = 0 ] && grep -q "moved the checkpoint(s) of step 4, which cannot be resumed, to .*unusable (this run starts afresh)" "$d.log" \
    && [ "$(steps_in "$d")" = "3 " ] && [ "$(ls "$d/unusable" | tr '\n' ' ')" = "DONE_00000004 main.log model_00000004.bin state_00000004.bin " ]
say $? "-y 2 over an unusable checkpoint only: it and its main.log moved to unusable/, the run starts afresh"
# 3, 4. a new run in a used -o (a -nk that deleted its own final checkpoint; a later -y 1 that stitched two
#    runs): refused, naming the checkpoints and -y 1 / --overwrite, nothing written
"$TG" "${COMMON[@]}" -x 4 -o "$W/ref4" >/dev/null 2>&1   # the uninterrupted run of 4 steps
d="$W/reuse"; rm -rf "$d"
"$TG" "${COMMON[@]}" -x 10 -n 5 -o "$d" >/dev/null 2>&1; cp "$d/main.log" "$W/reuse.main.log"
"$TG" "${COMMON[@]}" -x 4 -n 2 -nk 1 -o "$d" >"$d.log" 2>&1
rc=$?
[ $rc = 1 ] && [ "$(grep -c '^error' "$d.log")" = 1 ] \
    && grep -q "^error: -o '.*reuse' holds the checkpoints of an earlier run (steps 5, 10): -y 1 continues that run, --overwrite deletes them" "$d.log" \
    && [ "$(steps_in "$d")" = "5 10 " ] && cmp -s "$d/main.log" "$W/reuse.main.log"
say $? "-x 4 -n 2 -nk 1 in an -o holding steps 5, 10: refused (exit $rc), nothing written: $(grep -m1 '^error' "$d.log" | cut -c1-70)..."
"$TG" "${COMMON[@]}" -x 12 -y 1 -o "$d" >"$d.2.log" 2>&1
[ $? = 0 ] && grep -q "resumed from step 10" "$d.2.log" && [ "$(grep -o '^s:[0-9]*' "$d/main.log" | tr '\n' ' ')" = "s:0 s:1 s:2 s:3 s:4 s:5 s:6 s:7 s:8 s:9 s:10 s:11 " ] \
    && [ "$(head -n 1 "$d/main.log")" = "$(run_of "$d/state_00000012.bin")" ] && [ "$(run_of "$d/state_00000005.bin")" = "$(run_of "$d/state_00000012.bin")" ]
say $? "then -y 1 continues that run alone: main.log s:0..s:11, its first line '$(head -n 1 "$d/main.log")' = every state file's identity"
"$TG" "${COMMON[@]}" -x 4 -n 2 -nk 1 --overwrite -o "$d" >"$d.3.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "^--overwrite: deleted the 3 checkpoint(s) of an earlier run" "$d.3.log" && [ "$(steps_in "$d")" = "4 " ] \
    && [ "$(grep -o '^s:[0-9]*' "$d/main.log" | tr '\n' ' ')" = "s:0 s:1 s:2 s:3 " ] && cmp -s "$d/model_00000004.bin" "$W/ref4/model_00000004.bin"
say $? "with --overwrite: the earlier checkpoints deleted, -nk 1 keeps the run's own last step ($(steps_in "$d")), main.log its 4 steps"
"$TG" "${COMMON[@]}" -x 6 -y 1 --overwrite -o "$d" >"$d.4.log" 2>&1
[ $? = 1 ] && grep -q "^error: --overwrite starts a new run in -o, deleting an earlier run's checkpoints: it needs -o and -y 0" "$d.4.log" \
    && [ "$(steps_in "$d")" = "4 " ]
say $? "--overwrite with -y 1: refused before anything is touched: $(grep -m1 '^error' "$d.4.log" | cut -c1-80)..."
# 4. the identity checked: another run's checkpoint (-l 1e-3: another identity) as the newest is refused by
#    -y 1, naming both runs; another run's older checkpoint is neither counted nor deleted by -nk
d="$W/ident"; rm -rf "$d"
"$TG" "${COMMON[@]}" -x 6 -n 3 -o "$d" >/dev/null 2>&1
"$TG" -e "$TINY" "${BASE[@]}" -v 0 -l 1e-3 -x 8 -n 2 -o "$W/other" >/dev/null 2>&1
mine=$(head -n 1 "$d/main.log"); theirs=$(run_of "$W/other/state_00000008.bin")
cp "$W/other/"*00000008* "$d/"
"$TG" "${COMMON[@]}" -x 10 -y 1 -o "$d" >"$d.log" 2>&1
rc=$?
[ $rc = 1 ] && [ "$mine" != "$theirs" ] \
    && grep -q "^error: -y: the checkpoint of step 8 in '.*' is of run ${theirs#run:}, not of run ${mine#run:} that its main.log records" "$d.log"
say $? "another run's checkpoint as the newest: -y 1 refuses it (exit $rc): $(grep -m1 '^error' "$d.log" | cut -c1-90)..."
rm "$d/"*00000008*; cp "$W/other/"*00000002* "$d/"
"$TG" "${COMMON[@]}" -x 10 -n 1 -nk 1 -y 1 -o "$d" >"$d.2.log" 2>&1
[ $? = 0 ] && grep -q "resumed from step 6" "$d.2.log" && [ "$(steps_in "$d")" = "2 10 " ] && cmp -s "$d/state_00000002.bin" "$W/other/state_00000002.bin"
say $? "another run's older checkpoint (step 2) beside this run's: -nk 1 neither counts nor deletes it ($(steps_in "$d")left)"
# kill -9 at random moments of a run with -n 1 -nk 3 -nm 25, resumed until done: the directory (the kept
# steps, main.log, the last model and state) ends as the uninterrupted run's; retention after each resume
# counts the checkpoints before it only once their CRCs are checked
KILL=(-e "$TINY" "${BASE[@]}" -v 0 -l 3e-3 -x 60 -n 1 -nk 3 -nm 25)
"$NOMPI" "${KILL[@]}" -o "$W/rk_ref" >/dev/null 2>&1
RANDOM=20261207
d="$W/rk"; rm -rf "$d"; kills=0
for attempt in $(seq 1 30); do
    "$NOMPI" "${KILL[@]}" -y 2 -o "$d" >/dev/null 2>&1 &
    pid=$!
    sleep "0.$(( RANDOM % 4 ))$(( RANDOM % 10 ))"
    kill -9 $pid 2>/dev/null && kills=$((kills + 1))
    wait $pid 2>/dev/null && break
done
[ $attempt -lt 30 ] || "$NOMPI" "${KILL[@]}" -y 2 -o "$d" >/dev/null 2>&1
[ "$(steps_in "$d")" = "25 50 58 59 60 " ] && [ "$(ls "$d" | tr '\n' ' ')" = "$(ls "$W/rk_ref" | tr '\n' ' ')" ] \
    && cmp -s "$W/rk_ref/main.log" "$d/main.log" && cmp -s "$W/rk_ref/model_00000060.bin" "$d/model_00000060.bin" \
    && cmp -s "$W/rk_ref/state_00000060.bin" "$d/state_00000060.bin"
say $? "-n 1 -nk 3 -nm 25 killed -9 $kills times and resumed: kept steps $(steps_in "$d")and every file as the uninterrupted run's"
