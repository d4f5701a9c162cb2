#!/usr/bin/env bash
# Side-by-side speed of two tessera binaries on the GPU machine: the build under test (A) and a baseline (B, e.g. the
# previous commit's build), each `tessera bench` run alternately A B A B ... per shape, so that the card's clock drift
# falls on both. Prints per shape the median tok/s of each and the ratio A/B of the medians; JSON rows to $OUT.
#
# Usage: scripts/gpu_ab.sh [--rounds N] [--device cuda|cpu] [--decode "SPECS"] [--prefill "SPECS"] A_TESSERA B_TESSERA
#   SPECS: space-separated arch:dtype (tessera bench --list-archs); defaults are the architecture issue's figures:
#   decode (-p 128 -d 128 -n 256, greedy, batch 1) llama3-8b:bf16 llama3-8b:q8_0 llama3-8b:q4_1 llama3.2-1b:bf16
#   smollm2-135m:bf16; prefill (-p 2048 --ubatch 2048) llama3-8b:bf16. An empty string skips that part.
set -uo pipefail
rounds=2
device=cuda
decode="llama3-8b:bf16 llama3-8b:q8_0 llama3-8b:q4_1 llama3.2-1b:bf16 smollm2-135m:bf16"
prefill="llama3-8b:bf16"
while [ $# -gt 2 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --decode) decode="$2"; shift 2 ;;
    --prefill) prefill="$2"; shift 2 ;;
    *) echo "gpu_ab: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -eq 2 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
a=$1 b=$2
for x in "$a" "$b"; do [ -x "$x" ] || { echo "gpu_ab: $x is not an executable" >&2; exit 2; }; done
out=${OUT:-/tmp}/ab
mkdir -p "$out"
run() {  # run LABEL BIN SPEC MODE -> one tok/s figure on stdout (the bench's median over its repeats)
  local label=$1 bin=$2 spec=$3 mode=$4 args
  if [ "$mode" = decode ]; then args=(-p 128 -d 128 -n 256 -r 3); else args=(-p 2048 -n 0 --ubatch 2048 -r 3); fi
  local f="$out/$label.${spec/:/_}.$mode.$RANDOM.json"
  timeout 300 "$bin" bench --device "$device" --arch "${spec%%:*}" --random-weights --dtype "${spec##*:}" "${args[@]}" \
    --no-ceilings --json > "$f" 2> "$f.log" || { echo "gpu_ab: $label $spec $mode failed: $(tail -1 "$f.log")" >&2; echo 0; return; }
  # The row of this mode: tg for decode, pp for prefill (a decode run also prints its pp128 row).
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); r=r if isinstance(r,list) else [r]; p='tg' if sys.argv[2]=='decode' else 'pp'; print(max([x.get('tok_s',0) for x in r if str(x.get('test','')).startswith(p)] or [0]))" "$f" "$mode"
}
printf '%-22s %-8s %12s %12s %8s\n' shape mode A_tok_s B_tok_s A/B
for mode in decode prefill; do
  specs=$decode; [ "$mode" = prefill ] && specs=$prefill
  for spec in $specs; do
    as=() bs=()
    for r in $(seq "$rounds"); do
      as+=("$(run A "$a" "$spec" "$mode")")
      bs+=("$(run B "$b" "$spec" "$mode")")
    done
    python3 - "$spec" "$mode" "${as[*]}" "${bs[*]}" <<'PY'
import statistics, sys
spec, mode, a, b = sys.argv[1], sys.argv[2], [float(x) for x in sys.argv[3].split()], [float(x) for x in sys.argv[4].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"{spec:<22} {mode:<8} {ma:12.1f} {mb:12.1f} {ma / mb if mb else 0:8.3f}   A {a} B {b}")
PY
  done
done
