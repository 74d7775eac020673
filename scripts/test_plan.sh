#!/usr/bin/env bash
# The memory plan (--plan N, --memory-limit) end to end:
#   1. plan = measurement: `train_gpt --plan N` (one process, no weights) predicts, for every pipeline
#      stage, the peak bytes per category and in total that `mpirun -np N train_gpt --memory-report` then
#      measures at the end of a run (sampling included), byte for byte, for several layouts
#   2. the advice: for constructed out-of-memory cases the first lever that fits is the one that cuts the
#      dominating tensor, and a run of that configuration measures exactly the predicted peak
#   3. a run over --memory-limit stops before allocating, on every rank, with the plan and the levers
#   (then --pp-layers auto, the advisor's levers, the layout search, node warnings, --calibrate: 4-9 below)
# Usage: bash scripts/test_plan.sh BIN_DIR WORK_DIR   (prints "ok ..." / "FAIL ..." lines)
. "$(dirname "$0")/test_lib.sh"

# measured peaks at the end of the run: "mem RANK CAT current peak" after the "at the end of the run" header
measured() { awk '/at the end of the run/ { on = 1 } on && $1 == "mem" && $3 != "total" { print $2, $3, $5 }' "$1"; }
# planned peaks of each stage as the rank (stage * tp * cp) that holds it: "RANK CAT peak"
planned() { awk -v tc="$2" '$1 == "plan" && $3 != "total" { print $2 * tc, $3, $4 }' "$1"; }

# 1. plan = measurement
plan_case() {   # NAME NP TPCP FLAGS...
    local name=$1 np=$2 tc=$3; shift 3
    "$BIN/train_gpt" "$@" --plan $np >"$W/$name.plan" 2>&1
    $MPIRUN -np $np "$BIN/train_gpt" "$@" -x 2 -v 1 -m 1 -s 2 -g 4 --memory-report >"$W/$name.run" 2>&1
    local ok=1 n
    n=$(planned "$W/$name.plan" $tc | wc -l)
    [ "$n" -gt 0 ] && diff <(planned "$W/$name.plan" $tc | sort) <(measured "$W/$name.run" | awk -v tc=$tc '$1 % tc == 0' | grep -f <(planned "$W/$name.plan" $tc | awk '{print "^" $1 " "}' | sort -u) | sort) >"$W/$name.diff" && ok=0
    say $ok "$name: --plan $np = the measured peaks of every stage, $n categories, byte for byte (sampling and validation included)"
}
D="L=4,C=64,NH=4,V=256,maxT=64"
plan_case single     1 1 -e "$D" -b 4 -t 32
plan_case dp2_zero3  2 1 -e "$D" -b 4 -t 32 --zero 3
plan_case tp2sp_pp2  4 2 -e "$D" -b 2 -t 32 -d 256 --tp 2 --sp --pp 2 --zero 1
plan_case pp2_layers13 2 1 -e "$D" -b 2 -t 32 -d 256 --pp 2 --pp-layers 1,3
plan_case pp4_gpipe  4 1 -e "$D" -b 1 -t 32 -d 256 --pp 4 --pp-schedule gpipe
plan_case vpp2_cp2   4 2 -e "$D" -b 1 -t 32 -d 128 --pp 2 --vpp 2 --cp 2 --zero 2
plan_case moe_ep2    4 1 -e "$D,E=4,k=2" -b 2 -t 32 --ep 2 --zero 1 --recompute mlp
plan_case ce_full    1 1 -e "$D" -b 4 -t 32 --ce-chunk 0 --recompute full
plan_case pp4_zb     4 1 -e "$D" -b 1 -t 32 -d 256 --pp 4 --pp-schedule zb               # pending W sets, waiting input
plan_case zb_moe_tp2sp 4 2 -e "$D,E=4,k=2,every=2" -b 2 -t 32 -d 256 --tp 2 --sp --pp 2 --pp-schedule zb --recompute full
LL="arch=llama,L=4,C=64,NH=4,KV=2,V=256,maxT=64"   # (Llama: no wpe, RMSNorm's stats, kv heads, SwiGLU, an untied head)
plan_case llama_tp2sp_pp2 4 2 -e "$LL" -b 2 -t 32 -d 256 --tp 2 --sp --pp 2 --zero 3 --pp-schedule zb
plan_case llama_cp2_tied  2 1 -e "arch=llama,L=4,C=64,NH=4,KV=1,V=256,maxT=64,tied=1" -b 2 -t 32 --cp 2 --recompute mlp
plan_case llama_cp4_hybrid 4 4 -e "arch=llama,L=4,C=64,NH=4,KV=1,V=256,maxT=64" -b 2 -t 32 --cp 4 --cp-kind hybrid --cp-ulysses 2   # all-to-all buffers, the kv head replicated

# 2. the advice: the first lever that fits, and a run of it (the lever's flags replacing the same flags of
#    the case) measures the predicted peak total on its worst rank, byte for byte
with_lever() {   # LEVER FLAGS... -> FLAGS (in the array LEVERED) with each flag of LEVER replaced
    local lever=($1); shift
    local skip=0 a
    LEVERED=()
    for a in "$@"; do
        if [ $skip = 1 ]; then skip=0; continue; fi
        case " ${lever[*]} " in *" $a "*) [[ $a == -* ]] && { skip=1; continue; } ;; esac
        LEVERED+=("$a")
    done
    LEVERED+=("${lever[@]}")
}
advice_case() {   # NAME NP LIMIT EXPECTED_LEVER FLAGS...
    local name=$1 np=$2 limit=$3 expect=$4; shift 4
    "$BIN/train_gpt" "$@" -v 0 -s 0 --plan $np --memory-limit $limit >"$W/$name.plan" 2>&1
    local top peak fits
    top=$(awk '$1 == "lever" && $2 == 0 { for (i = 6; i <= NF; i++) printf "%s%s", $i, (i < NF ? " " : ""); exit }' "$W/$name.plan")
    fits=$(awk '$1 == "lever" && $2 == 0 { print $3 }' "$W/$name.plan")
    peak=$(awk '$1 == "lever" && $2 == 0 { print $4 }' "$W/$name.plan")
    local ok=1 got=""
    if grep -q "does NOT fit" "$W/$name.plan" && [ "$fits" = 1 ] && [ "$top" = "$expect" ]; then
        with_lever "${top%% (*}" "$@"   # ("-b 2 (twice the accumulation)" -> "-b 2")
        $MPIRUN -np $np "$BIN/train_gpt" "${LEVERED[@]}" -x 1 -v 0 -s 0 --memory-report >"$W/$name.run" 2>&1
        got=$(awk '/at the end of the run/ { on = 1 } on && $1 == "mem" && $3 == "total" && $5 > m { m = $5 } END { printf "%.0f", m }' "$W/$name.run")
        [ "$got" = "$peak" ] && ok=0
    fi
    say $ok "$name: over $limit, the first lever that fits is '$top' (expected '$expect'), predicted peak $peak B, measured ${got:-?} B"
}
# the logits of every token (--ce-chunk 0) at a 16k vocabulary dominate -> chunk the cross-entropy
advice_case logits_full 1 60M "--ce-chunk 256" -e "L=2,C=64,NH=4,V=16384,maxT=512" -b 4 -t 512 --ce-chunk 0
# AdamW state of a deep narrow model at ZeRO 0 on dp 2 dominates -> ZeRO 1
advice_case optimizer_zero0 2 65M "--zero 1" -e "L=24,C=128,NH=4,V=256,maxT=64" -b 1 -t 16
# long-T activations with tp 2 without SP -> --sp (on a machine whose collectives cost their bytes alone: at this
# tiny width the default's latency per call would rank SP's 2.5x the calls behind --recompute mlp)
printf 'node_lat=0\np2p_lat=0\nnet_lat=0\n' >"$W/no_latency.txt"
advice_case activations_nosp 2 95M "--sp" -e "L=4,C=128,NH=4,V=256,maxT=1024" -b 4 -t 1024 --tp 2 --machine "$W/no_latency.txt"
# GPipe keeps all 8 micro-batches alive -> 1F1B
advice_case gpipe_inflight 2 50M "--pp-schedule 1f1b" -e "L=4,C=128,NH=4,V=256,maxT=256" -b 4 -t 256 -d 8192 --pp 2 --pp-schedule gpipe

# 3. a run over --memory-limit stops before allocating, on every rank, with the plan
$MPIRUN -np 2 "$BIN/train_gpt" -e "L=2,C=64,NH=4,V=16384,maxT=512" -b 4 -t 512 --ce-chunk 0 --memory-limit 60M -x 1 -v 0 -s 0 >"$W/stop.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "^error: the planned peak of a rank exceeds --memory-limit" "$W/stop.log" && grep -q "^lever 0 1 " "$W/stop.log" && ! grep -q "^step" "$W/stop.log"
say $? "a run over --memory-limit 60M stops before its first step (exit $rc) with the plan and the levers"

# 4. --pp-layers auto: the split whose costliest stage costs least (layer = 6 (12 C^2 + 13 C) + 6 C T per token,
#    the head 6 C Vp, the embedding nothing; by hand below, in dense layers at T 64)
auto_case() {   # WANT NP MODEL FLAGS...
    local want=$1 np=$2 model=$3; shift 3
    $MPIRUN -np $np "$BIN/train_gpt" -e "$model" -t 64 -b 1 -x 0 -v 0 -s 0 --pp-layers auto "$@" >"$W/auto.log" 2>&1
    local got
    got=$(sed -n 's/^pipeline stages.*(auto): layers \([0-9,]*\);.*/\1/p' "$W/auto.log")
    [ "$got" = "$want" ]
    say $? "--pp-layers auto, $model $*: layers ${got:-none} (expected $want)"
}
auto_case 3,1 2 "L=4,C=64,NH=4,V=50257,maxT=64" --pp 2              # the head is 60.5 layers: all but one layer to stage 0
auto_case 2,2,2,2 4 "L=8,C=64,NH=4,V=256,maxT=64" --pp 4            # head 0.3: even
auto_case 2,2,2,2 2 "L=8,C=64,NH=4,V=256,maxT=64" --pp 2 --vpp 2 -d 128   # even over the virtual stages
auto_case 8,4 2 "L=12,C=64,NH=4,V=4096,maxT=64" --pp 2              # GPT-2 124M's head/layer ratio (4.85): 8 | 4 + 4.85
auto_case 3,4,4,1 4 "L=12,C=64,NH=4,V=4096,maxT=64" --pp 4          # 1 + 4.85 bounds it; the earliest cuts of 4 | 4 | 4

# 4b. --comm-report measures what each layer and the head cost per micro-batch and prints the split balancing those
#    measured costs: on a head-heavy model (V 50257: the head costs about 60 of these layers, whatever the machine's
#    noise) all layers but one go to stage 0, and the counts sum to L
rm -rf "$W/costs"
$MPIRUN -np 2 "$BIN/train_gpt" -e "L=4,C=64,NH=4,V=50257,maxT=64" -t 64 -b 1 -d 256 -x 3 -v 0 -s 0 --pp 2 --comm-report -o "$W/costs" >"$W/costs.log" 2>&1
got=$(sed -n 's/^  the split balancing them: --pp-layers \([0-9,]*\) .*/\1/p' "$W/costs.log")
grep -q "^pipeline costs measured per micro-batch" "$W/costs.log" && [ "$got" = "3,1" ]
say $? "--comm-report: the split balancing the measured costs of a head-heavy model is ${got:-none} (expected 3,1)"
# ... written to -o/pipeline_costs.txt, which --pp-layers auto:FILE splits by (the same split, the measured costs printed)
$MPIRUN -np 2 "$BIN/train_gpt" -e "L=4,C=64,NH=4,V=50257,maxT=64" -t 64 -b 1 -d 256 -x 1 -v 0 -s 0 --pp 2 \
    --pp-layers "auto:$W/costs/pipeline_costs.txt" >"$W/costs2.log" 2>&1
grep -q "^pipeline stages (auto:$W/costs/pipeline_costs.txt): layers 3,1; measured cost per micro-batch" "$W/costs2.log" \
    && grep -q "^step *1/1" "$W/costs2.log"
say $? "--pp-layers auto:FILE with the costs the run above measured: layers 3,1, trained"

# 5. the advisor offers --pp-layers auto where the stages are unbalanced: its time model runs a pipeline at its
#    costliest stage's pace, so on a head-heavy model (V 50257, pp 4) the auto split is ranked faster than the
#    even split it replaces; on an even model (head 0.3 layers) auto changes nothing and predicts the same time
split_case() {   # NAME FASTER(1|0) LIMIT MODEL: LIMIT under the layout's peak, with a single lever that fits
    local name=$1 faster=$2 limit=$3 model=$4; shift 4
    "$BIN/train_gpt" --plan 8 -e "$model" -t 256 -b 4 -d 8192 --pp 4 --memory-limit $limit "$@" >"$W/$name.plan" 2>&1
    local base auto
    base=$(sed -n 's/^  (this layout: \([0-9.]*\) ms\/step)$/\1/p' "$W/$name.plan")
    auto=$(awk '$1 == "lever" && $6 == "--pp-layers" && $7 == "auto" && NF == 7 { printf "%.4f", $5 * 1e3 }' "$W/$name.plan")
    if [ "$faster" = 1 ]; then
        [ -n "$auto" ] && [ -n "$base" ] && awk -v a="$auto" -v b="$base" 'BEGIN { exit !(a < b - 0.005) }'
    else
        [ -n "$auto" ] && [ -n "$base" ] && awk -v a="$auto" -v b="$base" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.01) }'
    fi
    say $? "$name: the advisor's --pp-layers auto lever predicts ${auto:-none} ms/step against this layout's ${base:-?} (faster: $faster)"
}
split_case split_headheavy 1 290M "L=8,C=256,NH=4,V=50257,maxT=256"
split_case split_even 0 150M "L=8,C=256,NH=4,V=256,maxT=256"

# 6. the advisor offers --pp-schedule zb on a 1F1B pipeline: faster (its bubble from ZB's own step lists, about a
#    third of 1F1B's with F = B = W), never smaller (the pending W passes keep their micro-batches' slots and their
#    layers' output gradients): its predicted peak is above this layout's, its time below
"$BIN/train_gpt" --plan 8 -e "L=8,C=256,NH=4,V=256,maxT=256" -t 256 -b 4 -d 8192 --pp 4 --memory-limit 150M >"$W/zb.plan" 2>&1
base=$(sed -n 's/^  (this layout: \([0-9.]*\) ms\/step)$/\1/p' "$W/zb.plan")
zb=$(awk '$1 == "lever" && $6 == "--pp-schedule" && $7 == "zb" && NF == 7 { printf "%.4f %s", $5 * 1e3, $4 }' "$W/zb.plan")
peak=$(awk '$1 == "plan" && $3 == "total" && $4 > m { m = $4 } END { print m }' "$W/zb.plan")
[ -n "$zb" ] && [ -n "$base" ] && awk -v t="${zb% *}" -v p="${zb#* }" -v b="$base" -v q="$peak" 'BEGIN { exit !(t < b - 0.005 && p > q) }'
say $? "the advisor's --pp-schedule zb lever: ${zb% *} ms/step against 1F1B's ${base:-?}, peak ${zb#* } B against ${peak:-?} B"

# 7. the layout search (--plan-search N): the 5 fastest layouts that fit, launched: each run's peak is the
#    search's planned peak, byte for byte, and each stage's first rank sent in every group the bytes the search
#    put down for it (comm_bytes.h; where exact: ZeRO-3's gathers with a pipeline and MoE's counted dispatch are
#    bounds or even-routing estimates). The limit leaves the plain data-parallel layouts out, so the five mix
#    tp, SP, pp, ZeRO and recompute.
S=(-e "$D" -t 64 -d 2048 -v 0 -s 0)
"$BIN/train_gpt" "${S[@]}" --plan-search 4 --memory-limit 3M >"$W/search.txt" 2>&1
n=$(grep -c "^search " "$W/search.txt")
[ "$n" -ge 5 ] && grep -q "^invalid: " "$W/search.txt" && grep -q "^over the limit: " "$W/search.txt"
say $? "--plan-search 4 within 3M: $n layouts shown, with the counts of those over the limit and the invalid ones"
for i in 1 2 3 4 5; do
    flags=$(awk -v i=$i '$1 == "search" && $2 == i { for (k = 5; k <= NF; k++) printf "%s ", $k }' "$W/search.txt")
    peak=$(awk -v i=$i '$1 == "search" && $2 == i { print $3 }' "$W/search.txt")
    [ -z "$flags" ] && { say 1 "search layout $i: not printed"; continue; }
    $MPIRUN -np 4 "$BIN/train_gpt" "${S[@]}" $flags -x 1 --memory-report --comm-report >"$W/search$i.log" 2>&1 </dev/null
    got=$(awk '$1 == "mem" && $3 == "total" && $5 > m { m = $5 } END { print m }' "$W/search$i.log")
    tc=$(echo " $flags " | awk '{ tp = 1; cp = 1; for (k = 1; k < NF; k++) { if ($k == "--tp") tp = $(k+1); if ($k == "--cp") cp = $(k+1) } print tp * cp }')
    # predicted "rank group bytes" of each stage's first rank, against the run's "comm rank group bytes" (the
    # gradients' group is dpcp under cp)
    awk -v i=$i -v tc=$tc '$1 == "search-comm" && $2 == i {
        r = $3 * tc; split("tp cp pp dp ep edp emb", g, " ");
        for (k = 1; k <= 7; k++) if ($4 == 1 || (g[k] != "dp" && g[k] != "edp" && g[k] != "ep")) print r, g[k], $(4 + k) }' \
        "$W/search.txt" | sort >"$W/search$i.want"
    awk '$1 == "comm" && NF == 4 { b[$2 " " $3] = $4 } END {
        for (k in b) { split(k, a, " "); if (a[2] == "dpcp") { b[a[1] " dp"] = b[k] } }
        for (k in b) if (k !~ /dpcp/) print k, b[k] }' "$W/search$i.log" | sort >"$W/search$i.all"
    join -j1 <(awk '{ print $1 "_" $2, $3 }' "$W/search$i.want" | sort) <(awk '{ print $1 "_" $2, $3 }' "$W/search$i.all" | sort) \
        | awk '$2 != $3 { bad++ } END { print NR, bad + 0 }' >"$W/search$i.cmp"
    read -r ncmp nbad <"$W/search$i.cmp"
    wantn=$(wc -l <"$W/search$i.want")
    [ "$got" = "$peak" ] && [ "$ncmp" -eq "$wantn" ] && [ "$ncmp" -gt 0 ] && [ "$nbad" -eq 0 ]
    say $? "search layout $i ($flags): measured peak ${got:-?} B = planned $peak B; $ncmp group byte counts of the stages' first ranks = the search's ($nbad differ)"
done

# 8. a run whose tp or ep group spans nodes says so (TRAIN_GPT_RANKS_PER_NODE pretends nodes of N ranks); within
#    a node it says nothing
$MPIRUN -x TRAIN_GPT_RANKS_PER_NODE=1 -np 2 "$BIN/train_gpt" -e "$D" -t 32 -b 2 -x 1 -s 0 -v 0 --tp 2 >"$W/nodes_tp.log" 2>&1 </dev/null
grep -q "^warning: tp groups span nodes" "$W/nodes_tp.log" && ! grep -q "^warning: ep groups" "$W/nodes_tp.log"
say $? "--tp 2 on nodes of 1 rank: $(grep -m1 -o '^warning: tp groups span nodes' "$W/nodes_tp.log" || echo 'no warning')"
$MPIRUN -x TRAIN_GPT_RANKS_PER_NODE=2 -np 4 "$BIN/train_gpt" -e "$D,E=4,k=2" -t 32 -b 2 -x 1 -s 0 -v 0 --tp 2 --ep 2 >"$W/nodes_ep.log" 2>&1 </dev/null
grep -q "^warning: ep groups span nodes" "$W/nodes_ep.log" && ! grep -q "^warning: tp groups" "$W/nodes_ep.log"
say $? "--tp 2 --ep 2 on nodes of 2 ranks: the ep group (ranks 0, 2) spans nodes, tp (0, 1) does not"
$MPIRUN -x TRAIN_GPT_RANKS_PER_NODE=4 -np 4 "$BIN/train_gpt" -e "$D,E=4,k=2" -t 32 -b 2 -x 1 -s 0 -v 0 --tp 2 --ep 2 >"$W/nodes_one.log" 2>&1 </dev/null
! grep -q "^warning: .* groups span nodes" "$W/nodes_one.log" && grep -q "^step" "$W/nodes_one.log"
say $? "--tp 2 --ep 2 on one node of 4 ranks: no warning, and it trains"

# 9. --calibrate: at 4 ranks it writes every rate, each collective kind per group size (2 and 4) among them, in
#    a file --machine reads; and the cost model times each group at its kind's rate for its size: a slow
#    exchange between 2 ranks slows a pipeline of 2 stages, not tp 2; a slow ring of 2 ranks slows tp 2
$MPIRUN -np 4 "$BIN/train_gpt" -e "$D" -b 4 -t 32 --calibrate "$W/machine4.txt" >"$W/calibrate.log" 2>&1 </dev/null
keys="flops flops_32 flops_64 flops_128 attn_flops mem_bw layer_cost adamw node_bw_2 a2a_bw_2 p2p_bw_2 node_bw_4 a2a_bw_4 p2p_bw_4 node_bw a2a_bw p2p_bw cores"
keys="$keys node_lat_2 a2a_lat_2 p2p_lat_2 node_lat_4 a2a_lat_4 p2p_lat_4 node_lat a2a_lat p2p_lat"
missing=$(for k in $keys; do awk -F= -v k=$k '$1 == k && $2 > 0 { f = 1 } END { exit !f }' "$W/machine4.txt" || echo -n "$k "; done)
awk -F= '$1 == "overlap" && $2 >= 0 && $2 <= 1 { f = 1 } END { exit !f }' "$W/machine4.txt" || missing="$missing overlap"
"$BIN/train_gpt" -e "$D" -b 4 -t 32 -s 0 -v 0 --plan 4 --machine "$W/machine4.txt" >"$W/calibrated_plan.log" 2>&1
[ -z "$missing" ] && grep -q "^predicted step" "$W/calibrated_plan.log"
say $? "--calibrate at 4 ranks: every key positive, overlap within 0-1 (missing: ${missing:-none}), and --machine reads the file"
predict() { "$BIN/train_gpt" -e "$D" -b 2 -t 32 -d 128 -s 0 -v 0 --plan 2 "$@" | sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p'; }
printf 'node_bw=1e9\n' >"$W/kinds_base.txt"
printf 'node_bw=1e9\np2p_bw_2=1e6\n' >"$W/kinds_p2p.txt"
printf 'node_bw=1e9\nnode_bw_2=1e6\n' >"$W/kinds_ring.txt"
pp_base=$(predict --pp 2 --machine "$W/kinds_base.txt"); pp_p2p=$(predict --pp 2 --machine "$W/kinds_p2p.txt")
tp_base=$(predict --tp 2 --machine "$W/kinds_base.txt"); tp_p2p=$(predict --tp 2 --machine "$W/kinds_p2p.txt")
tp_ring=$(predict --tp 2 --machine "$W/kinds_ring.txt")
awk -v a="$pp_base" -v b="$pp_p2p" -v d="$tp_base" -v e="$tp_p2p" -v f="$tp_ring" \
    'BEGIN { exit !(a > 0 && b > 2 * a && d > 0 && e == d && f > 2 * d) }'
say $? "the model's rate per collective kind and size: pp 2 ${pp_base:-?} ms, with exchanges of 2 at 1 MB/s ${pp_p2p:-?}; tp 2 ${tp_base:-?}, with those exchanges ${tp_p2p:-?}, with rings of 2 at 1 MB/s ${tp_ring:-?}"
# a latency per call (comm_step_calls: the calls test_gpt asserts a run makes): at 1 ms a ring call between 2 ranks,
# tp 2's step and pp 2's (whose first and last stage sum the tied embedding's gradient) take 1 ms more per ring
# call a run of them makes (tp, emb, dp), whatever the exchanges
printf 'node_bw=1e9\nnode_lat=0\np2p_lat=0\n' >"$W/kinds_nolat.txt"
printf 'node_bw=1e9\nnode_lat=0\np2p_lat=0\nnode_lat_2=1e-3\n' >"$W/kinds_lat.txt"
for l in tp pp; do
    nolat=$(predict --$l 2 --machine "$W/kinds_nolat.txt"); lat=$(predict --$l 2 --machine "$W/kinds_lat.txt")
    $MPIRUN -np 2 "$BIN/train_gpt" -e "$D" -b 2 -t 32 -d 128 -s 0 -v 0 -x 1 --$l 2 --comm-report >"$W/${l}_calls.log" 2>&1 </dev/null
    calls=$(awk '$1 == "comm-calls" && $2 == 0 && ($3 == "tp" || $3 == "emb" || $3 == "dp") { n += $4 } END { print n + 0 }' "$W/${l}_calls.log")
    awk -v a="$nolat" -v b="$lat" -v n="$calls" 'BEGIN { exit !(n > 0 && a > 0 && b - a > n - 0.01 && b - a < n + 0.01) }'
    say $? "the model's latency per call: $l 2 ${nolat:-?} ms, at 1 ms a ring call ${lat:-?} (a run of it makes ${calls:-?} ring calls a step)"
done
# the machine's overlap: at 100 MB/s dp 2's all-reduce (0.9 MB) is shorter than the backward at 1 GFLOP/s;
# overlap 1 hides it all (the step of free links), overlap 0 none of it; a pipeline of one micro-batch runs its stages one after another, each its own length
# (free links and optimizer: the step of one rank holding every layer); flops_R: the GEMMs of a 64-row
# micro-batch at flops_64 when given
printf 'flops=1e9\nnode_bw=1e8\noverlap=1\n' >"$W/ov1.txt"; printf 'flops=1e9\nnode_bw=1e8\noverlap=0\n' >"$W/ov0.txt"
printf 'flops=1e9\nnode_bw=1e30\n' >"$W/ov_free.txt"
ov1=$(predict --machine "$W/ov1.txt"); ov0=$(predict --machine "$W/ov0.txt"); ovf=$(predict --machine "$W/ov_free.txt")
printf 'flops=1e9\nnode_bw=1e30\np2p_bw=1e30\nnode_lat=0\np2p_lat=0\nadamw=1e30\n' >"$W/free.txt"
one() { "$BIN/train_gpt" -e "$D" -b 2 -t 32 -d 64 -s 0 -v 0 --plan $1 ${2:-} --machine "$W/free.txt" | sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p'; }
pipe1=$(one 2 "--pp 2"); rank1=$(one 1)
printf 'flops=1e12\n' >"$W/flat.txt"; printf 'flops=1e12\nflops_64=1e9\n' >"$W/rows.txt"
flat=$(predict --machine "$W/flat.txt"); rows=$(predict --machine "$W/rows.txt")
awk -v a="$ov1" -v b="$ov0" -v z="$ovf" -v p="$pipe1" -v r="$rank1" -v f="$flat" -v g="$rows" \
    'BEGIN { exit !(a > 0 && a < z * 1.001 && a > z * 0.999 && b > a * 1.05 && r > 0 && p > r * 0.999 && p < r * 1.001 && f > 0 && g > 10 * f) }'
say $? "the model: dp 2 at 100 MB/s ${ov1:-?} ms with overlap 1, ${ov0:-?} with 0, ${ovf:-?} with free links; one micro-batch through pp 2 ${pipe1:-?} ms, one rank ${rank1:-?}; flops 1e12 ${flat:-?} ms, flops_64 1e9 ${rows:-?}"
# more ranks than cores: bound round-robin, the two stage-0 ranks of --pp 2 at 4 ranks (0 and 2) share core 0 of
# 2, and compute together: the step (free links and optimizer) twice that on 4 cores
printf 'flops=1e9\nnode_bw=1e30\np2p_bw=1e30\nnode_lat=0\np2p_lat=0\nadamw=1e30\ncores=2\n' >"$W/cores2.txt"
printf 'flops=1e9\nnode_bw=1e30\np2p_bw=1e30\nnode_lat=0\np2p_lat=0\nadamw=1e30\ncores=4\n' >"$W/cores4.txt"
c2=$("$BIN/train_gpt" -e "$D" -b 2 -t 32 -d 128 -s 0 -v 0 --plan 4 --pp 2 --machine "$W/cores2.txt" | sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p')
c4=$("$BIN/train_gpt" -e "$D" -b 2 -t 32 -d 128 -s 0 -v 0 --plan 4 --pp 2 --machine "$W/cores4.txt" | sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p')
awk -v a="$c2" -v b="$c4" 'BEGIN { exit !(b > 0 && a > 1.999 * b && a < 2.001 * b) }'
say $? "the model on shared cores: --pp 2 at 4 ranks ${c4:-?} ms on 4 cores, ${c2:-?} on 2 (its two stage-0 ranks on one core)"
