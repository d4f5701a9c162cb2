#!/usr/bin/env bash
# Side-by-side tokenizer speed on one core: tessera's encoder vs llama.cpp's llama_tokenize, same model (the
# default SmolLM2 GGUF), same text, vocabulary-only load, special parsing off, both pinned to CPU 0; rates from
# thread CPU time on both sides (Google Benchmark's default), so other load on a shared machine skews neither.
# Usage: bench/compare_tokenizer.sh [BUILD_DIR] [TEXT_FILE]
#   BUILD_DIR holds bin/tessera_bench_kernels (default: build). TEXT_FILE defaults to the license texts of
#   /usr/share/common-licenses concatenated (real English prose, about 240 KB). Results go in docs/PERFORMANCE.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
model=${TESSERA_MODEL:-${TESSERA_HOME:-$HOME/.cache/tessera/models}/SmolLM2-135M-Instruct.Q4_1.gguf}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
text=${2:-}
if [ -z "$text" ]; then
  text=$tmp/prose.txt
  find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort | xargs cat > "$text"
fi
[ -x "$build/bin/tessera_bench_kernels" ] || { echo "compare_tokenizer: build tessera_bench_kernels in $build first" >&2; exit 1; }

bin=$("$root/scripts/build_llamacpp.sh" llama-tokenize | tail -1)
lbuild=$(dirname "$bin")
lsrc=$(dirname "$lbuild")/src
openmp=""
grep -q "GGML_OPENMP:BOOL=ON" "$lbuild/CMakeCache.txt" && openmp=-fopenmp
g++ -O2 -std=c++17 -I "$lsrc/include" -I "$lsrc/ggml/include" "$root/bench/peer/llamacpp_tokenize_speed.cpp" \
  "$lbuild/src/libllama.a" "$lbuild/ggml/src/libggml.a" "$lbuild/ggml/src/libggml-cpu.a" \
  "$lbuild/ggml/src/libggml-base.a" $openmp -lpthread -ldl -o "$tmp/peer"

pin=""
command -v taskset > /dev/null && pin="taskset -c 0"
read -r bytes peer_tokens peer_best peer_median < <($pin "$tmp/peer" "$model" "$text" 10)
TESSERA_BENCH_TEXT=$text $pin "$build/bin/tessera_bench_kernels" --benchmark_filter='BM_TokenizerEncodeProse' \
  --benchmark_repetitions=5 --benchmark_format=json > "$tmp/ours.json" 2> /dev/null

python3 - "$tmp/ours.json" "$bytes" "$peer_tokens" "$peer_best" "$peer_median" "$text" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1]))
bytes_, peer_tokens, peer_best, peer_median = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
runs = [b for b in ours["benchmarks"] if b.get("run_type") == "iteration"]
med = sorted(r["bytes_per_second"] for r in runs)[len(runs) // 2] / 1e6
tokens = int(runs[0]["tokens"])
peer = bytes_ / peer_median / 1e6
print(f"text: {sys.argv[6]} ({bytes_} bytes); tokens: tessera {tokens}, llama.cpp {peer_tokens}"
      + ("" if tokens == peer_tokens else "  (COUNTS DIFFER)"))
print(f"tessera   encode: {med:8.1f} MB/s (median of {len(runs)})")
print(f"llama.cpp encode: {peer:8.1f} MB/s (median of 10; best {bytes_ / peer_best / 1e6:.1f} MB/s)")
print(f"ratio tessera / llama.cpp: {med / peer:.2f}x")
PY
