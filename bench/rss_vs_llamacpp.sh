#!/usr/bin/env bash
# Peak resident memory of `tessera run` next to llama.cpp's `llama-simple`, same prompt, same number of generated
# tokens, on the default model (SmolLM2-135M-Instruct Q4_1) and on a Q8_0 file made from it with llama-quantize
# (--allow-requantize: the weights' quality does not matter for memory). Peak RSS is /usr/bin/time's maximum resident
# set size, the median of 3 runs. llama.cpp comes from scripts/build_llamacpp.sh (cached under ~/.cache).
# Usage: bench/rss_vs_llamacpp.sh [TESSERA_BINARY] [THREADS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tessera=${1:-$root/build/bin/tessera}
threads=${2:-$(nproc)}
[ -x "$tessera" ] || { echo "rss_vs_llamacpp: no tessera binary at $tessera (build tessera_cli first)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "rss_vs_llamacpp: /usr/bin/time is needed (Debian package time)" >&2; exit 1; }
q4=$("$root/scripts/fetch_model.sh")
bin=$("$root/scripts/build_llamacpp.sh" llama-simple llama-quantize | tail -1)
q8="$(dirname "$q4")/SmolLM2-135M-Instruct.Q8_0-from-Q4_1.gguf"
if [ ! -f "$q8" ]; then
  "$bin/llama-quantize" --allow-requantize "$q4" "$q8.tmp" Q8_0 >/dev/null 2>&1
  mv "$q8.tmp" "$q8"
fi
prompt="The capital of France is"
n=32

# Median over 3 runs of the command's peak RSS in KiB; /usr/bin/time writes to its own file (the command's stderr
# is discarded).
peak_kib() {
  local runs=() f
  f=$(mktemp)
  for _ in 1 2 3; do
    /usr/bin/time -o "$f" -f '%M' "$@" >/dev/null 2>&1
    runs+=("$(tail -1 "$f")")
  done
  rm -f "$f"
  printf '%s\n' "${runs[@]}" | sort -n | sed -n 2p
}

echo "peak RSS, median of 3 runs: '$prompt', $n tokens generated, $threads threads ($(date -u +%Y-%m-%d), $(git -C "$root" rev-parse --short HEAD))"
printf '| %-36s | %14s | %18s | %6s |\n' "model" "tessera run" "llama-simple" "ratio"
printf '| %-36s | %14s | %18s | %6s |\n' "------------------------------------" "-------------:" "-----------------:" "-----:"
for m in "$q4" "$q8"; do
  t=$(peak_kib "$tessera" run -m "$m" -p "$prompt" -n $n --temp 0 -t "$threads" --no-stats)
  l=$(peak_kib "$bin/llama-simple" -m "$m" -n $n "$prompt")
  printf '| %-36s | %10.1f MiB | %14.1f MiB | %5.2fx |\n' "$(basename "$m" .gguf)" "$(echo "$t / 1024" | bc -l)" \
    "$(echo "$l / 1024" | bc -l)" "$(echo "$t / $l" | bc -l)"
done
