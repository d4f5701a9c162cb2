#!/usr/bin/env bash
# Splits the default model (98 MB; one device call carries at most 64 MiB with the tree) into two git-ignored
# folders for scripts/gpu_check.sh: call 1 carries [".gpu-deps", ".gpu-model-0"] and runs `scripts/gpu_check.sh
# --stage-model`; call 2, right after on the still-warm machine, carries [".gpu-deps", ".gpu-model-1"] and assembles
# the file there (sha256-checked) before its phases run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
m="${TESSERA_HOME:-$HOME/.cache/tessera}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$m" ] || "$root/scripts/fetch_model.sh"
rm -rf "$root/.gpu-model-0" "$root/.gpu-model-1"
mkdir -p "$root/.gpu-model-0" "$root/.gpu-model-1"
size=$(stat -c %s "$m")
half=$(( (size + 1) / 2 ))
head -c "$half" "$m" > "$root/.gpu-model-0/part"
tail -c +"$((half + 1))" "$m" > "$root/.gpu-model-1/part"
sha256sum "$m" | cut -d' ' -f1 > "$root/.gpu-model-1/sha256"
echo "split $m into .gpu-model-0/part ($half bytes) and .gpu-model-1/part ($((size - half)) bytes)"
