#!/usr/bin/env bash
# Quantizes one f16/f32 GGUF to every type with llama-quantize and with `tessera quantize`, compares the outputs'
# sha256 and times both (same thread count). Prints one line per type and exits 1 when any pair differs.
# Usage: scripts/quantize_vs_llamacpp.sh [IN.gguf] [THREADS] [TYPE...]
#   IN.gguf defaults to the default model's f16, made from the cached Q4_1 file with llama-quantize --allow-requantize.
# Needs build/bin/tessera and llama-quantize (scripts/build_llamacpp.sh llama-quantize).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tessera=${TESSERA_BIN:-$root/build/bin/tessera}
llq="$("$root/scripts/build_llamacpp.sh" llama-quantize)/llama-quantize"
models=${TESSERA_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/models}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
in=${1:-}
threads=${2:-2}
shift $(( $# > 2 ? 2 : $# ))
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(q8_0 q4_0 q4_1 q5_0 q5_1 q4_K_M q5_K_M q6_K iq4_nl)
if [ -z "$in" ]; then
  in=$tmp/smol-f16.gguf
  "$llq" --allow-requantize "$models/SmolLM2-135M-Instruct.Q4_1.gguf" "$in" F16 >/dev/null 2>&1
fi
now() { date +%s.%N; }
fail=0
printf '%-8s %-9s %9s %9s  %s\n' type identical llama_s tessera_s sha256
for t in "${types[@]}"; do
  a=$(now); "$llq" "$in" "$tmp/llama.gguf" "$t" "$threads" >/dev/null 2>&1; b=$(now)
  "$tessera" quantize -q -t "$threads" "$in" "$tmp/tessera.gguf" "$t" 2>/dev/null; c=$(now)
  ha=$(sha256sum "$tmp/llama.gguf" | cut -c1-16); hb=$(sha256sum "$tmp/tessera.gguf" | cut -c1-16)
  same=yes; [ "$ha" = "$hb" ] || { same=NO; fail=1; }
  printf '%-8s %-9s %9.2f %9.2f  %s %s\n' "$t" "$same" "$(echo "$b - $a" | bc)" "$(echo "$c - $b" | bc)" "$ha" \
    "$([ $same = yes ] || echo "(tessera $hb)")"
done
exit $fail
