#!/usr/bin/env bash
# Splits a model file (default: the default model, 98 MB; one device call carries at most 64 MiB with the tree and
# .gpu-deps) into N git-ignored folders .gpu-model-0 .. .gpu-model-(N-1) (default N = 3: ~33 MB each) for the GPU
# scripts. Each call, back to back on the still-warm machine, carries [".gpu-model-K"] (and .gpu-deps when it builds):
# scripts/gpu_check.sh --stage-model, or any script that runs stage_model_parts (scripts/gpu_env.sh), stores the part
# there, and the call that holds the last missing part assembles the file (sha256-checked) into the model cache under
# its own name.
# Usage: scripts/gpu_model_parts.sh [N] [MODEL_FILE]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-3}
case "$n" in ''|*[!0-9]*) echo "gpu_model_parts: the part count '$n' is not a number" >&2; exit 2 ;; esac
[ "$n" -ge 1 ] && [ "$n" -le 9 ] || { echo "gpu_model_parts: the part count must be 1..9, not $n" >&2; exit 2; }
m=${2:-"${TESSERA_HOME:-$HOME/.cache/tessera}/models/SmolLM2-135M-Instruct.Q4_1.gguf"}
[ -f "$m" ] || [ -n "${2:-}" ] || "$root/scripts/fetch_model.sh"
[ -f "$m" ] || { echo "gpu_model_parts: no file $m" >&2; exit 2; }
rm -rf "$root"/.gpu-model-*
size=$(stat -c %s "$m")
per=$(( (size + n - 1) / n ))
sum=$(sha256sum "$m" | cut -d' ' -f1)
for ((i = 0; i < n; i++)); do
  d="$root/.gpu-model-$i"
  mkdir -p "$d"
  dd if="$m" of="$d/part" bs="$per" skip="$i" count=1 status=none
  echo "$i $n $sum $(basename "$m")" > "$d/index"  # part, parts, sha256 of the whole, its name
done
echo "split $m into $n parts of at most $per bytes: .gpu-model-0 .. .gpu-model-$((n - 1))"
