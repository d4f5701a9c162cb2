#!/usr/bin/env bash
# Shows Tessera working on the default model: a generated answer when `tessera run` exists, else `tessera inspect`.
# Usage: scripts/demo.sh [path/to/tessera]
set -euo pipefail
bin=${1:-build/bin/tessera}
[ -x "$bin" ] || { echo "demo: $bin not built (run make)" >&2; exit 1; }
if "$bin" run --help >/dev/null 2>&1; then
  prompt="What is the capital of France? Answer in one sentence."
  echo "\$ tessera run --chat -n 48 --temp 0 -p \"$prompt\""
  "$bin" run --chat -n 48 --temp 0 -p "$prompt"
else
  echo "\$ tessera inspect"
  "$bin" inspect
fi
