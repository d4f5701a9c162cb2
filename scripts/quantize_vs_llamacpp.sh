#!/usr/bin/env bash
# Quantizes one f16/f32 GGUF to every type with llama-quantize and with `tessera quantize`, compares the outputs'
# sha256 and times both (same thread count; wall and user CPU seconds, since a shared machine makes wall time noisy).
# Then the same for the Hugging Face models of tests/data/hf: llama.cpp has no safetensors input, so each is first
# written losslessly as GGUF by Tessera (its own dtype: f32, f16 or bf16) and llama-quantize's output for that GGUF is
# compared with `tessera quantize` run on the safetensors folder directly. Exits 1 when any pair differs.
# Usage: scripts/quantize_vs_llamacpp.sh [IN.gguf] [THREADS] [TYPE...]
#   IN.gguf defaults to the default model's f16, made from the cached Q4_1 file with llama-quantize --allow-requantize.
# Needs build/bin/tessera and llama-quantize (scripts/build_llamacpp.sh llama-quantize builds it).
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
[ ${#types[@]} -gt 0 ] || types=(q8_0 q4_0 q4_1 q5_0 q5_1 q4_K_M q5_K_M q6_K iq4_nl tq1_0 tq2_0)
if [ -z "$in" ]; then
  in=$tmp/smol-f16.gguf
  "$llq" --allow-requantize "$models/SmolLM2-135M-Instruct.Q4_1.gguf" "$in" F16 >/dev/null 2>&1
fi
fail=0
timed() { /usr/bin/time -f "%e %U" -o "$tmp/time" "$@" >/dev/null 2>&1; cat "$tmp/time"; }
compare() {  # compare LABEL TYPE LLAMA_IN TESSERA_IN
  local l t ha hb same
  l=$(timed "$llq" "$3" "$tmp/llama.gguf" "$2" "$threads")
  t=$(timed "$tessera" quantize -q -t "$threads" "$4" "$tmp/tessera.gguf" "$2")
  ha=$(sha256sum "$tmp/llama.gguf" | cut -c1-16); hb=$(sha256sum "$tmp/tessera.gguf" | cut -c1-16)
  same=yes; [ "$ha" = "$hb" ] || { same=NO; fail=1; }
  printf '%-24s %-8s %-9s %8s %8s %8s %8s  %s\n' "$1" "$2" "$same" $l $t "$ha"
}
printf '%-24s %-8s %-9s %8s %8s %8s %8s  %s\n' input type identical llama_s llama_cpu tess_s tess_cpu sha256
for t in "${types[@]}"; do compare "$(basename "$in")" "$t" "$in" "$in"; done
for d in "$root"/tests/data/hf/*/; do
  d=${d%/}
  # The folder's own float dtype, so the GGUF written from it holds the same values.
  dt=$(python3 - "$d" <<'PY'
import glob, json, struct, sys
f = open(sorted(glob.glob(sys.argv[1] + "/*.safetensors"))[0], "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
print({"F32": "f32", "F16": "f16", "BF16": "bf16"}[next(v["dtype"] for k, v in h.items() if k != "__metadata__")])
PY
)
  "$tessera" quantize -q "$d" "$tmp/hf.gguf" "$dt" 2>/dev/null
  for t in q8_0 q4_K_M iq4_nl; do compare "hf/$(basename "$d")" "$t" "$tmp/hf.gguf" "$d"; done
done
exit $fail
