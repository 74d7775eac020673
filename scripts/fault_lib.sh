# Sourced by scripts/gpu_layouts.sh and scripts/test_emu.sh: the injected fault both check, a rank stopped.
# stop_rank1 PID LOG: once the dp 2 job PID (mpirun in the background, its output in LOG) has printed step 5 (at
# most 120 s), stops its rank 1 (SIGSTOP) and waits for the job to end (at most 30 s), then kills what is left.
# Sets step (the last step LOG showed before the stop) and stop_s (seconds from the stop to the job's end).
stop_rank1() {
    local mp=$1 log=$2 i p victim="" t0
    for i in $(seq 1 1200); do grep -q "^step    5/" "$log" && break; sleep 0.1; done
    for p in $(pgrep -P $mp) $(for c in $(pgrep -P $mp); do pgrep -P "$c"; done); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && victim=$p
    done
    step=$(grep -o "^step *[0-9]*" "$log" | tail -n 1 | awk '{ print $2 }')
    t0=$SECONDS
    [ -n "$victim" ] && kill -STOP "$victim"
    for i in $(seq 1 300); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    stop_s=$((SECONDS - t0))
    kill -0 $mp 2>/dev/null && kill -9 $mp
    [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null
    wait $mp 2>/dev/null
}
