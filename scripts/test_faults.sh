#!/usr/bin/env bash
# Faults, each bounded in time: non-finite values (skipped, then fatal; refused in a model file),
# checksums, kill -9 at random moments then resume (final files bit-identical to an uninterrupted run),
# a stalled rank stopped by the watchdog, SIGUSR1 through mpirun and SIGTERM to the ranks (a checkpoint
# that resumes exactly), the lock on -o, different flags per rank. (The second round: test_reliability.sh.)
# Usage: bash scripts/test_faults.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"
NOMPI=build/cpu-nompi/train_gpt
TINY="L=2,C=64,NH=4,V=256,maxT=64"
COMMON=(-e "$TINY" -t 32 -v 0 -s 0 -l 3e-3 -c 0.1)   # (B: the default 4)
trl() { grep trl "$1/main.log"; }

# 1. non-finite: a NaN gradient at steps 4-5 skips both updates and training goes on; 10 in a row stop
#    the run after --max-skips; no checkpoint holds a NaN (every one resumes)
TRAIN_GPT_INJECT_NAN=3:2 "$BIN/train_gpt" "${COMMON[@]}" -x 10 -n 1 -o "$W/nan2" >"$W/nan2.log" 2>&1
rc=$?
[ $rc = 0 ] && [ "$(grep -c 'skip:' "$W/nan2/main.log")" = 2 ] && grep -q "step    4/10 .*update skipped (1 in a row)" "$W/nan2.log"
say $? "a non-finite gradient norm at steps 4 and 5: both updates skipped and logged, the run finishes (exit $rc)"
TRAIN_GPT_INJECT_NAN=3:2 "$BIN/train_gpt" "${COMMON[@]}" -x 5 -n 5 -o "$W/nan2b" >/dev/null 2>&1
TRAIN_GPT_INJECT_NAN=3:2 "$BIN/train_gpt" "${COMMON[@]}" -x 10 -n 5 -y 1 -o "$W/nan2b" >/dev/null 2>&1
cmp -s "$W/nan2/model_00000010.bin" "$W/nan2b/model_00000010.bin" && cmp -s "$W/nan2/state_00000010.bin" "$W/nan2b/state_00000010.bin"
say $? "with skips: resumed from step 5 (3 updates applied, 2 skipped), the final model and state are bit-identical"
TRAIN_GPT_INJECT_NAN=3:10 "$BIN/train_gpt" "${COMMON[@]}" -x 20 -n 1 --max-skips 5 -o "$W/nan10" >"$W/nan10.log" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "^error: step 8: 5 updates in a row skipped" "$W/nan10.log" && [ -f "$W/nan10/DONE_00000007" ] && [ ! -f "$W/nan10/DONE_00000008" ]
say $? "5 skipped updates in a row stop the run: $(grep -m1 '^error' "$W/nan10.log" | cut -c1-90)..."
"$BIN/train_gpt" "${COMMON[@]}" -x 9 -y 1 -o "$W/nan10" >"$W/nan10r.log" 2>&1
say $? "the newest checkpoint of that run (written while it skipped) holds no NaN: it resumes"

# 2. checksums: slot 255 holds zlib's CRC-32 of the header (slot 255 as 0; slot 254 = 1 says so) and the body; a
#    flipped byte in the body of a model or state file is found
python3 - "$W/nan2/model_00000010.bin" "$W/nan2/state_00000010.bin" <<'PYEOF'
import struct, sys, zlib
def ok(p):
    b = open(p, "rb").read()
    h = struct.unpack("<256i", b[:1024])
    return h[254] == 1 and h[255] & 0xFFFFFFFF == zlib.crc32(b[:1020] + bytes(4) + b[1024:])
sys.exit(0 if all(ok(p) for p in sys.argv[1:]) else 1)
PYEOF
say $? "header slot 255 of the model and state files is zlib.crc32 of the header and body (checked with Python's zlib)"
mkdir -p "$W/crc"; cp "$W/nan2/DONE_00000010" "$W/nan2/model_00000010.bin" "$W/nan2/state_00000010.bin" "$W/crc/"
for f in model state; do
    python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[5000]^=0x10; open(p,'wb').write(b)" "$W/crc/${f}_00000010.bin"
    "$BIN/train_gpt" "${COMMON[@]}" -x 12 -y 1 -o "$W/crc" >"$W/crc_$f.log" 2>&1
    rc=$?; [ $rc = 1 ] && grep -q "cannot be resumed: '.*${f}_00000010.bin' is corrupt" "$W/crc_$f.log" \
        && grep -q "^error: -y 1: nothing to resume" "$W/crc_$f.log"
    say $? "a flipped bit in the $f file: $(grep -m1 '^note' "$W/crc_$f.log" | sed 's/.*cannot/cannot/' | cut -c1-100)"
    cp "$W/nan2/${f}_00000010.bin" "$W/crc/${f}_00000010.bin"
done

# 3. kill -9 at random moments, then resume until done: the final files equal an uninterrupted run's
RANDOM=20261201   # the kill moments: the same in every run of the test
KILL=(-e "$TINY" -t 32 -s 0 -l 3e-3 -c 0.1 -v 4 -m 2)   # validation on: its lines must survive the kills too
"$NOMPI" "${KILL[@]}" -x 30 -n 2 -o "$W/k_ref" >/dev/null 2>&1
ok=0
for trial in 1 2 3; do
    d="$W/k$trial"; rm -rf "$d"; kills=0
    for attempt in $(seq 1 40); do
        "$NOMPI" "${KILL[@]}" -x 30 -n 2 -y 2 -o "$d" >/dev/null 2>&1 &
        pid=$!
        sleep "0.$(( RANDOM % 4 + 1 ))"
        if kill -9 $pid 2>/dev/null; then kills=$((kills + 1)); fi
        wait $pid 2>/dev/null && break   # a run that finished (a kill after the last checkpoint leaves the end's
    done                                 # validation to the next resume, as a user would resume it)
    [ $attempt -lt 40 ] || "$NOMPI" "${KILL[@]}" -x 30 -n 2 -y 2 -o "$d" >/dev/null 2>&1
    cmp -s "$W/k_ref/model_00000030.bin" "$d/model_00000030.bin" && cmp -s "$W/k_ref/state_00000030.bin" "$d/state_00000030.bin" \
        && cmp -s "$W/k_ref/main.log" "$d/main.log" && ok=$((ok + 1))
    echo "     (trial $trial: $kills kills -9)"
done
[ $ok = 3 ]; say $? "kill -9 at random moments (validation on), resumed: final model, state and the whole main.log equal the uninterrupted run's ($ok of 3 trials)"
# and under mpirun, 2 ranks, zero 1: mpirun and its ranks killed -9 together
$MPIRUN -np 2 "$BIN/train_gpt" "${KILL[@]}" -b 2 --zero 1 -x 20 -n 2 -o "$W/km_ref" >/dev/null 2>&1
for attempt in $(seq 1 20); do
    setsid $MPIRUN -np 2 "$BIN/train_gpt" "${KILL[@]}" -b 2 --zero 1 -x 20 -n 2 -y 2 -o "$W/km" >/dev/null 2>&1 &
    pid=$!
    sleep "0.$(( RANDOM % 6 + 3 ))"
    pkill -9 -f "train_gpt.*-o $W/km\$"   # mpirun and its ranks (each rank is in a process group of its own)
    wait $pid 2>/dev/null && break        # a run that finished
done
[ $attempt -lt 20 ] || $MPIRUN -np 2 "$BIN/train_gpt" "${KILL[@]}" -b 2 --zero 1 -x 20 -n 2 -y 2 -o "$W/km" >/dev/null 2>&1
cmp -s "$W/km_ref/model_00000020.bin" "$W/km/model_00000020.bin" && cmp -s "$W/km_ref/state_00000020.bin" "$W/km/state_00000020.bin" \
    && cmp -s "$W/km_ref/main.log" "$W/km/main.log"
say $? "kill -9 of mpirun and its 2 ranks together (zero 1) at random moments, resumed: the final files and main.log are bit-identical"

# 4. a stalled rank (SIGSTOP): the others' watchdog stops the job within its timeout
$MPIRUN -np 2 "$BIN/train_gpt" "${COMMON[@]}" -b 2 -x 100000 --timeout 3 >"$W/stall.log" 2>&1 &
mp=$!
for i in $(seq 1 100); do grep -q "^step    3/" "$W/stall.log" && break; sleep 0.1; done
victim=$(pgrep -f "train_gpt.*--timeout 3" | grep -v "^$mp$" | tail -n 1)
t0=$(date +%s)
kill -STOP "$victim"
for i in $(seq 1 300); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
t1=$(date +%s)
alive=0; kill -0 $mp 2>/dev/null && alive=1
pkill -9 -f "train_gpt.*--timeout 3"; kill -9 $mp 2>/dev/null; wait $mp 2>/dev/null
[ $alive = 0 ] && grep -q "error: rank .: no progress for [0-9]* s in .* on group" "$W/stall.log"
say $? "a rank stopped with SIGSTOP: the job ends in $((t1 - t0)) s (--timeout 3): $(grep -m1 'no progress' "$W/stall.log" | cut -c1-80)..."

# 5. SIGUSR1 through mpirun, and SIGTERM to the ranks themselves: a checkpoint, exit 0, an exact resume
$MPIRUN -np 2 "$BIN/train_gpt" "${COMMON[@]}" -b 2 -x 40 -o "$W/u_ref" >/dev/null 2>&1
# (40 steps take well under a second: a signal sent after the 3rd step's line may land after the run has ended;
# then the run is made again, up to 3 times)
for sig in USR1 TERM; do
    d="$W/u_$sig"
    for attempt in 1 2 3; do
        rm -rf "$d"
        $MPIRUN -np 2 "$BIN/train_gpt" "${COMMON[@]}" -b 2 -x 40 -o "$d" >"$d.log" 2>&1 &
        mp=$!
        for i in $(seq 1 200); do [ "$(grep -c trl "$d/main.log" 2>/dev/null)" -ge 3 ] && break; sleep 0.05; done
        if [ $sig = USR1 ]; then kill -USR1 $mp; else pgrep -f "train_gpt.*-o $d\$" | grep -v "^$mp\$" | xargs -r kill -TERM; fi
        wait $mp
        rc=$?
        grep -q "stopped by SIG$sig after step" "$d.log" && break
    done
    step=$(grep -o "stopped by SIG$sig after step [0-9]*" "$d.log" | awk '{ print $NF }')
    [ $rc = 0 ] && [ -n "$step" ] && [ -f "$d/DONE_$(printf %08d "$step")" ]
    say $? "SIG$sig ($([ $sig = USR1 ] && echo "to mpirun, forwarded" || echo "to the ranks")): exit 0 after step ${step:-?} with a checkpoint"
    $MPIRUN -np 2 "$BIN/train_gpt" "${COMMON[@]}" -b 2 -x 40 -y 1 -o "$d" >/dev/null 2>&1
    diff <(trl "$W/u_ref") <(trl "$d") >/dev/null
    say $? "SIG$sig: the resumed run's main.log equals the uninterrupted one, all 40 steps"
done

# 6. the lock on -o: a second run on the same directory is refused, naming the holder; kill -9 frees it
"$BIN/train_gpt" "${COMMON[@]}" -x 100000 -o "$W/lock" >/dev/null 2>&1 &
holder=$!
for i in $(seq 1 100); do [ -f "$W/lock/main.log" ] && break; sleep 0.05; done
"$BIN/train_gpt" "${COMMON[@]}" -x 2 -o "$W/lock" >"$W/lock2.log" 2>&1
rc=$?
[ $rc = 1 ] && grep -qE "^error: -o '.*lock' is in use by another run \(pid $holder on .* since 20[0-9]{2}-[0-9]{2}-[0-9]{2} [0-9:]{8} UTC\)" "$W/lock2.log"
say $? "a second run on a busy -o: $(grep -m1 '^error' "$W/lock2.log" | cut -c1-100)..."
kill -9 $holder; wait $holder 2>/dev/null
"$BIN/train_gpt" "${COMMON[@]}" -x 2 -o "$W/lock" >/dev/null 2>&1
say $? "after kill -9 of the holder the directory is free again"

# 7. different flags per rank (an MPMD launch): one line on every rank naming the flag, no hang
MP=(-e "$TINY" -t 32 -s 0 -l 3e-3)
mpmd() {   # FLAG "FLAGS OF RANK 0" "FLAGS OF RANK 1"
    local flag=$1 name
    name=$(tr -dc 'a-z' <<<"$flag")
    timeout 60 mpirun --oversubscribe --bind-to none -np 1 "$BIN/train_gpt" "${MP[@]}" $2 : -np 1 "$BIN/train_gpt" "${MP[@]}" $3 \
        >"$W/mpmd_$name.log" 2>&1
    local rc=$?
    [ $rc != 0 ] && [ $rc != 124 ] && [ "$(grep -c "^error: rank [01]: flag $flag " "$W/mpmd_$name.log")" = 2 ]
    say $? "ranks given different $flag: exit $rc, $(grep -m1 "^error" "$W/mpmd_$name.log" | cut -c1-90)..."
}
mpmd -x "-x 3" "-x 5"
mpmd -v "-x 3 -v 0" "-x 3 -v 2"
mpmd --tp "-x 3" "-x 3 --tp 2"
mpmd --seed "-x 3 --seed 1" "-x 3 --seed 2"
mpmd -b "-x 3 -b 4" "-x 3 -b 8"

# 8. a second signal exits at once (no checkpoint); a tokenizer of another vocabulary is not used
"$BIN/train_gpt" -e "L=4,C=256,NH=4,V=4096,maxT=64" -t 64 -b 8 -v 0 -s 0 -x 100000 -o "$W/twice" >"$W/twice.log" 2>&1 &
pid=$!
for i in $(seq 1 200); do grep -q "^step    2/" "$W/twice.log" && break; sleep 0.05; done
kill -TERM $pid; kill -INT $pid   # (two of the same kind could merge while pending: a TERM and an INT cannot)
wait $pid
rc=$?
{ [ $rc = 143 ] || [ $rc = 130 ]; } && ! grep -q "stopped by" "$W/twice.log"
say $? "SIGTERM then SIGINT: the second exits at once (exit $rc = 128 + its number), no checkpoint"
python3 - "$W" <<'PYEOF'
import struct, sys
w = sys.argv[1]
toks = [i % 200 for i in range(3000)]
hdr = [0] * 256; hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
open(w + "/vocab_shard.bin", "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))
th = [0] * 256; th[0], th[1], th[2], th[3] = 20240328, 2, 300, 299
open(w + "/tokenizer.bin", "wb").write(struct.pack("<256i", *th) + b"".join(bytes([1, i % 256]) for i in range(300)))
PYEOF
"$BIN/train_gpt" -e "$TINY" -t 32 -x 2 -v 0 -s 2 -g 4 -i "$W/vocab_shard.bin" >"$W/vocab.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "^warning: .*tokenizer.bin has 300 tokens, the model 256: samples are printed as token ids" "$W/vocab.log"
say $? "a tokenizer of 300 tokens for a model of 256: a warning, and samples as token ids (exit $rc)"
