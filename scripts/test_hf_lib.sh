# Sourced by scripts/test_hf_llama.sh and test_hf_moe.sh (after test_lib.sh, with W, HF, REF, B, T, IDS, N, CASES,
# TRAINED set; MOE: the flags of our side, empty for a dense family): the comparisons both make against transformers.
model() { case $1 in trained_*) echo "$W/run_${1#trained_}/model_00000020.bin" ;; *) echo "$W/$1.bin" ;; esac; }
our_loss() { "$BIN/train_gpt" -e "$1" -x 0 -j "$W/val.bin" -m 1 -b $B -t $T -s 0 ${MOE:-} 2>&1 | awk '/^val loss/ { print $3 }'; }
ref() { awk -v k="$1" -v m="$2" -v c="$3" '$1 == k && $2 == m { print $c }' "$W/ref.log"; }   # KEY MODEL COLUMN
absdiff() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; printf "%.1e", d < 0 ? -d : d }'; }
# float32 against float64 in both programs: 1e-5 of the loss (the summation orders' rounding) and 5e-7 absolute
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-5 * (b < 0 ? -b : b) + 5e-7) }'; }

# MODEL's val loss, ours against transformers' (ref.log)
check_loss() {   # MODEL
    local a b b64
    a=$(our_loss "$(model $1)"); b=$(ref loss $1 3); b64=$(ref loss $1 4)
    close "$a" "$b"
    say $? "$1: our val loss $a = transformers' $b (1e-5): |diff| $(absdiff "$a" "$b"), transformers' fp32 against float64 $(absdiff "$b" "$b64")"
}

# MODEL's greedy continuation of N tokens after IDS (--sample-temperature 0), ours against transformers', compared up
# to ref.log's margin step (the first past which an fp32 rounding may flip an argmax, or for MoE an expert)
check_greedy() {   # MODEL
    local m=$1 cut h o
    cut=$(ref margin $m 3)
    h=$(awk -v m=$m '$1 == "greedy" && $2 == m { $1 = $2 = ""; print }' "$W/ref.log" | xargs | cut -d' ' -f1-$((cut > 0 ? cut : 1)))
    o=$("$BIN/train_gpt" -e "$(model $m)" -x 0 -v 0 -s 0 ${MOE:-} -g $N --prompt-ids $IDS --sample-temperature 0 2>&1 \
        | awk -F: '/^sample ids:/ { print $2 }' | xargs | cut -d' ' -f1-$((cut > 0 ? cut : 1)))
    [ -n "$cut" ] && [ "$cut" -gt 0 ] && [ "$h" = "$o" ]
    say $? "$m: greedy after $IDS in transformers = ours, $cut of $N tokens compared (the rest past a near tie): $o"
}

# each random model imported and exported again; each model trained here exported
import_export_all() {
    local m
    for m in $CASES; do
        $HF import "$W/$m" "$W/$m.bin" >"$W/import_$m.log" 2>&1 && $HF export "$W/$m.bin" "$W/${m}_out" >"$W/export_$m.log" 2>&1
        say $? "$m: $(head -n 1 "$W/import_$m.log")"
    done
    for m in $TRAINED; do
        $HF export "$(model $m)" "$W/$m" >"$W/export_$m.log" 2>&1
        say $? "$m: $(head -n 1 "$W/export_$m.log")"
    done
}

# --bf16 of directory NAME: version 35 (a MoE's routing bias stays fp32), every value the fp32 import's (NAME.bin)
# rounded to nearest even; bf16 -> export -> import --bf16 is exact, and train_gpt reads it
check_bf16_import() {   # NAME
    $HF import "$W/$1" "$W/${1}_16.bin" --bf16 >/dev/null 2>&1
    $PY - "$W/$1.bin" "$W/${1}_16.bin" <<'PYEOF'
import struct, sys
import numpy as np
sys.path.insert(0, "dev")
from hf import read_model, to_bf16_bits
_, x = read_model(sys.argv[1]); _, y = read_model(sys.argv[2])
v = struct.unpack("<2i", open(sys.argv[2], "rb").read(8))[1]
rne = lambda t: (to_bf16_bits(t).astype(np.uint32) << 16).view(np.float32)
same = all(np.array_equal(x[k], y[k]) if k == "bias" else np.array_equal(rne(x[k]), y[k]) for k in x)
sys.exit(not (v == 35 and same))
PYEOF
    local rc=$?
    $HF export "$W/${1}_16.bin" "$W/${1}_16_out" >/dev/null 2>&1 && $HF import "$W/${1}_16_out" "$W/${1}_16_back.bin" --bf16 >/dev/null 2>&1 \
        && cmp -s "$W/${1}_16.bin" "$W/${1}_16_back.bin" && [ -n "$(our_loss "$W/${1}_16.bin")" ] && [ $rc = 0 ]
    say $? "import --bf16 of $1 writes version 35, each fp32 value rounded to nearest even; it exports and imports back byte for byte, and train_gpt reads it"
}

# the import of directory DIR refused, naming the field: one line, a non-zero exit, nothing written
refused() {   # DIR FIELD
    $HF import "$W/$1" "$W/refused.bin" >"$W/refused.log" 2>&1
    local rc=$?
    [ $rc != 0 ] && [ "$(wc -l <"$W/refused.log")" = 1 ] && grep -q "^error: .*config.json: $2 = " "$W/refused.log" \
        && [ ! -e "$W/refused.bin" ] && [ ! -e "$W/refused.bin.tmp" ]
    say $? "import refuses $1: $(cat "$W/refused.log")"
}

# the round trips: each random model exported then imported gives back its model file byte for byte, imported then
# exported transformers' weights bit for bit; each model trained here, exported, imports back byte for byte
check_round_trips() {
    local m
    for m in $CASES; do
        $HF import "$W/${m}_out" "$W/${m}_back.bin" >/dev/null 2>&1 && cmp -s "$W/$m.bin" "$W/${m}_back.bin"
        say $? "$m: export then import gives back the model file byte for byte (exported as $(awk -F'"' '/"model_type"/ { print $4 }' "$W/${m}_out/config.json"))"
        $REF same "$W/$m" "$W/${m}_out" >"$W/same_$m.log" 2>&1
        say $? "$m: import then export gives back transformers' weights bit for bit: $(cat "$W/same_$m.log")"
    done
    for m in $TRAINED; do
        $HF import "$W/$m" "$W/$m.bin" >/dev/null 2>&1 && cmp -s "$(model $m)" "$W/$m.bin"
        say $? "$m: exported as $(awk -F'"' '/"model_type"/ { print $4 }' "$W/$m/config.json"), imported back byte for byte"
    done
}
