#!/usr/bin/env bash
# The quantized tile GEMM (kernels/gemm_quant_tile.cu, issue 21: per-tile dequantization for every K-quant and IQ4
# format's prefill) on the GPU machine, from binaries built here (scripts/make_gpu_bundle.sh --prebuilt build with
# TESSERA_PREBUILT_EXTRA="bin/tessera_bench_gemm"):
#   1. tests: test_backends_cuda's CudaGemmQuantTile.* (every tile format against the expansion + cuBLASLt, split-K,
#      outputs, graphs, routing) and the op table's CUDA MATMUL rows of the tile formats;
#   2. tessera_bench_gemm --tile FORMATS: matmul_x16 per Llama-3-8B projection shape, t = 64 .. 2048, expansion
#      against tile (us), and the layer's sum;
#   3. with --e2e "DTYPES": tessera bench --device cuda --arch llama3-8b --random-weights --dtype D -p P -n 0 -r 3 under
#      quant_gemm=expand and auto, P = 128 and 512.
# Outputs in $OUT: quant_tile_tests.log, quant_tile_bench.txt (+ .json), quant_tile_e2e.log.
#
# Through the device tool, with carry [".gpu-deps"]:
#   set -o pipefail; scripts/gpu_quant_tile.sh [--formats q4_k,q5_k] [--e2e "q6_k q5_k"] [--skip-tests] 2>&1 |
#     tee $OUT/quant_tile.log
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-pre/out}
mkdir -p "$OUT"
formats=""
e2e=""
run_tests=1
while [ $# -gt 0 ]; do
  case "$1" in
    --formats) formats="$2"; shift ;;
    --e2e) e2e="$2"; shift ;;
    --skip-tests) run_tests=0 ;;
    *) echo "usage: $0 [--formats F,...] [--e2e \"DTYPES\"] [--skip-tests]" >&2; exit 2 ;;
  esac
  shift
done
# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
gpu_env
gpu_prebuilt || exit 1
bin=$root/build-pre/bin
export TESSERA_SOURCE_DIR=$root
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

if [ "$run_tests" = 1 ]; then
  echo "== tests"
  "$bin/test_backends_cuda" --gtest_filter='CudaGemmQuantTile.*' >"$OUT/quant_tile_tests.log" 2>&1
  echo "test_backends_cuda CudaGemmQuantTile.*: rc $?"
  grep -E "^\[  (PASSED|FAILED)|^\[       OK|Failure|error" "$OUT/quant_tile_tests.log" | head -40
  ops=""
  for f in q4_k q5_k q6_k q2_k q3_k q5_0 q5_1 iq4_nl iq4_xs; do ops="$ops${ops:+:}*MATMUL_${f}_t*cuda"; done
  "$bin/test_ops" --gtest_filter="$ops" >>"$OUT/quant_tile_tests.log" 2>&1
  echo "test_ops tile formats' CUDA MATMUL rows: rc $?"
  grep -E "^\[  (PASSED|FAILED)|^\[  FAILED|Failure" "$OUT/quant_tile_tests.log" | tail -20
fi

echo "== tessera_bench_gemm --tile ${formats:-(all)}"
"$bin/tessera_bench_gemm" --tile ${formats:+"$formats"} --json "$OUT/quant_tile_bench.json" \
  >"$OUT/quant_tile_bench.txt" 2>&1
echo "rc $?"
grep -E "ceilings|layer|device" "$OUT/quant_tile_bench.txt"

if [ -n "$e2e" ]; then
  echo "== end to end (Llama-3-8B random weights, tok/s)"
  for d in $e2e; do
    # One GGUF per format (the random model is quantized once), then pp128 and pp512 under both paths.
    model=$root/build-pre/llama3-8b-$d.gguf
    [ -f "$model" ] || "$bin/tessera" bench --arch llama3-8b --random-weights --dtype "$d" --write-model "$model" \
      >>"$OUT/quant_tile_e2e.log" 2>&1 || { echo "$d: could not write the model"; continue; }
    for p in 128 512; do
      for mode in expand auto; do
        line=$("$bin/tessera" bench --device cuda -m "$model" -p $p -n 0 -r 3 --cuda quant_gemm=$mode \
          2>>"$OUT/quant_tile_e2e.log" | tee -a "$OUT/quant_tile_e2e.log" | grep -E "pp$p" | tail -1)
        echo "$d pp$p $mode: $line"
      done
    done
  done
fi
