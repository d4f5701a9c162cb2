#!/usr/bin/env bash
# The llama.cpp CUDA peer on the GPU machine: llama.cpp's llama-bench (built there from the llama-cpp-python 0.3.36
# source, CUDA, sm_90, flash attention on) beside `tessera bench --device cuda` on the same GGUF files, random weights at
# Llama-3-8B's shape written by `tessera bench --write-model` in each weight format asked for.
#
# Prepare here:   scripts/gpu_llamacpp_peer.sh --pack   (the source, trimmed to what llama-bench needs, into the
#                 git-ignored .gpu-llama/, ~22 MB; needs scripts/build_llamacpp.sh --source)
# GPU machine:    carry [".gpu-deps", ".gpu-llama"];
#                 scripts/gpu_llamacpp_peer.sh [--prebuilt] [--arch A] [--file GGUF]... [FORMAT...]
#                 (default formats q4_k q6_k, none when a --file is given: --file benches that GGUF as it is, e.g. a
#                 real model staged with scripts/gpu_model_parts.sh; writes $OUT/peer_llamacpp.md and the raw logs).
#                 --prebuilt: Tessera from make_gpu_bundle.sh --prebuilt's binaries (gpu_env.sh's gpu_prebuilt)
#                 instead of building it there. The device tool carries 64 MiB with the tree: keep only
#                 .gpu-deps/prebuilt (the rest is for building there) and only bin/tessera in its bin.tar.xz.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ "${1:-}" = "--pack" ]; then
  src=$(scripts/build_llamacpp.sh --source) || exit 1
  d="$root/.gpu-llama"
  rm -rf "$d" && mkdir -p "$d/ggml/src" "$d/tools"
  cp -r "$src"/CMakeLists.txt "$src"/cmake "$src"/common "$src"/include "$src"/src "$src"/vendor "$d/"
  cp -r "$src"/licenses "$d/" 2>/dev/null
  cp -r "$src"/ggml/CMakeLists.txt "$src"/ggml/cmake "$src"/ggml/include "$d/ggml/"
  (cd "$src/ggml/src" && cp -r CMakeLists.txt ./*.c ./*.cpp ./*.h ./*.in ggml-cpu ggml-cuda ggml-blas "$d/ggml/src/")
  cp -r "$src"/tools/llama-bench "$d/tools/"
  echo 'add_subdirectory(llama-bench)' > "$d/tools/CMakeLists.txt"
  echo "gpu_llamacpp_peer: $(du -sh "$d" | cut -f1) in $d"
  exit 0
fi
arch=llama3-8b
files=()
prebuilt=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt=1; shift ;;
    --arch) arch=$2; shift 2 ;;
    --file) files+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
for f in "${files[@]}"; do [ -f "$f" ] || { echo "gpu_llamacpp_peer: no file $f" >&2; exit 2; }; done
formats=${*:-q4_k q6_k}
[ ${#files[@]} -gt 0 ] && [ $# -eq 0 ] && formats=""
OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT"
[ -d .gpu-llama ] || { echo "gpu_llamacpp_peer: no .gpu-llama (run --pack here and carry it)" >&2; exit 1; }
t0=$(date +%s)
# Both builds at once: llama.cpp's CUDA kernels and Tessera's (gpu_check builds build-gpu and runs no phase).
( cmake -S .gpu-llama -B build-llama -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
    -DCMAKE_BUILD_TYPE=Release > "$OUT/llama_build.log" 2>&1 &&
  cmake --build build-llama --target llama-bench -j 10 >> "$OUT/llama_build.log" 2>&1; echo "llama.cpp build exit $?" ) &
lp=$!
. "$root/scripts/gpu_env.sh"
if [ "$prebuilt" = 1 ]; then
  gpu_env
  gpu_prebuilt > "$OUT/tessera_build.log" 2>&1 || { echo "gpu_llamacpp_peer: no prebuilt binaries" >&2; exit 1; }
  cli=build-pre/bin/tessera
else
  scripts/gpu_check.sh --only build > "$OUT/tessera_build.log" 2>&1
  cli=build-gpu/bin/tessera
fi
wait "$lp"
echo "[$(( $(date +%s) - t0 ))s] builds done"
gpu_env
lb=build-llama/bin/llama-bench
md="$OUT/peer_llamacpp.md"
echo "| model | test | llama.cpp tok/s | tessera tok/s | tessera / llama.cpp |" > "$md"
echo "|---|---|---|---|---|" >> "$md"
# compare NAME LLAMA_JSON TESSERA_JSON: one table row per test both ran.
compare() {
  python3 - "$1" "$2" "$3" >> "$md" <<'PY'
import json, sys
name, lj, tj = sys.argv[1:4]
try:
    l = json.load(open(lj)); t = json.load(open(tj)); t = t if isinstance(t, list) else [t]
except Exception as e:
    print(f"| {name} | - | (no result: {e}) | | |"); sys.exit()
lt = {("pp%d" % r["n_prompt"]) if r["n_gen"] == 0 else ("tg%d" % r["n_gen"]): r["avg_ts"] for r in l}
for r in t:
    test = r["test"]
    if test in lt:
        print(f"| {name} | {test} | {lt[test]:.1f} | {r['tok_s']:.1f} | {r['tok_s'] / lt[test]:.2f}x |")
PY
}
# bench_pair NAME GGUF: llama-bench and tessera bench on one file.
bench_pair() {
  timeout 240 "$lb" -m "$2" -p 512 -n 128 -fa 1 -ngl 99 -r 3 -o json > "$OUT/llama-$1.json" 2>> "$OUT/peer.log"
  timeout 240 "$cli" bench -m "$2" --device cuda -p 512 -n 128 -r 3 --no-ceilings --json > "$OUT/tessera-$1.json" 2>> "$OUT/peer.log"
  compare "$1" "$OUT/llama-$1.json" "$OUT/tessera-$1.json"
}
for f in $formats; do
  m=/tmp/peer-$arch-$f.gguf
  timeout 300 "$cli" bench --arch "$arch" --random-weights --dtype "$f" --write-model "$m" > /dev/null 2>> "$OUT/peer.log" ||
    { echo "- $f: could not write the model" | tee -a "$md"; continue; }
  echo "[$(( $(date +%s) - t0 ))s] $f written ($(du -h "$m" | cut -f1))"
  bench_pair "$arch-$f" "$m"
  rm -f "$m"
done
for f in "${files[@]}"; do
  bench_pair "$(basename "$f" .gguf)" "$f"
done
cat "$md"
