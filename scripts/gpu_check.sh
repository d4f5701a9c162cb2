#!/usr/bin/env bash
# One command for the GPU machine: build (Release, sm_90a) or take the carried build, run every GPU test (also under
# compute-sanitizer), run the kernel benchmarks and the PyTorch peer, and write a summary under $OUT.
#
# Prepare here first: scripts/make_gpu_bundle.sh [--prebuilt build-cuda]   (fills the git-ignored .gpu-deps/)
# Then, through the device tool, with carry [".gpu-deps"]:
#   set -o pipefail; scripts/gpu_check.sh 2>&1 | tee $OUT/log
# Options: --build (build there, the default; falls back to the prebuilt binaries if the build fails)
#          --prebuilt (skip the build, use .gpu-deps/prebuilt)   --quick (fewer benchmark shapes)
#          --all-configs (time every GEMV launch shape)          --no-sanitizer   --no-peer
# Outputs in $OUT (at most 8 files come back): summary.md, build.log, tests.log, sanitizer.log, bench.log,
# bench.json, peer.json (GEMV peer; decode peers under "decode") and the caller's log.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT"
mode=build
bench_args=()
sanitizer=1
peer=1
quick=0
for a in "$@"; do
  case "$a" in
    --build) mode=build ;;
    --prebuilt) mode=prebuilt ;;
    --quick) bench_args+=(--quick); quick=1 ;;
    --all-configs) bench_args+=(--all-configs) ;;
    --no-sanitizer) sanitizer=0 ;;
    --no-peer) peer=0 ;;
    *) echo "gpu_check: unknown option $a" >&2; exit 2 ;;
  esac
done
summary="$OUT/summary.md"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
status=0

say "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say ""
say "## Environment"
{
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
    --format=csv 2>&1 | head -3
  nvcc --version 2>&1 | tail -2
  cmake --version 2>&1 | head -1
  (g++ --version 2>&1 || echo "no g++") | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
  uname -r
  echo '```'
} >> "$summary"
cat "$summary"

deps="$root/.gpu-deps"
test_bin=""
bench_bin=""
cli_bin=""
lib_path=""
if [ "$mode" = build ]; then
  stamp "building (Release, sm_90a) in build-gpu"
  arch_lib="$deps/lib/x86_64-linux-gnu"
  if [ -d "$deps" ] && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA_ARCHS=90a-real \
      -DCMAKE_PREFIX_PATH="$deps" -Dfmt_DIR="$arch_lib/cmake/fmt" -DGTest_DIR="$arch_lib/cmake/GTest" \
      -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" -DCLI11_DIR="$deps/share/cmake/CLI11" \
      -DPKG_CONFIG_EXECUTABLE="$deps/bin/pkg-config" -DTESSERA_FUZZ=OFF > "$OUT/build.log" 2>&1 &&
     cmake --build build-gpu --target test_backends_cuda tessera_bench_cuda tessera_cli -j "$(nproc)" >> "$OUT/build.log" 2>&1; then
    test_bin=build-gpu/tests/test_backends_cuda
    bench_bin=build-gpu/bin/tessera_bench_cuda
    cli_bin=build-gpu/bin/tessera
    lib_path="$arch_lib"
    say "- build: built here ($(( $(date +%s) - t0 ))s since start)"
  else
    say "- build: FAILED here (see build.log); falling back to the prebuilt binaries"
    tail -30 "$OUT/build.log"
    mode=prebuilt
  fi
fi
if [ "$mode" = prebuilt ]; then
  if [ -x "$deps/prebuilt/bin/test_backends_cuda" ]; then
    test_bin="$deps/prebuilt/bin/test_backends_cuda"
    bench_bin="$deps/prebuilt/bin/tessera_bench_cuda"
    [ -x "$deps/prebuilt/bin/tessera" ] && cli_bin="$deps/prebuilt/bin/tessera"
    lib_path="$deps/prebuilt/lib"
    say "- build: prebuilt binaries ($(head -1 "$deps/prebuilt/INFO" 2>/dev/null))"
  else
    say "- build: no binaries (no .gpu-deps/prebuilt either); nothing to run"
    exit 1
  fi
fi
export LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TESSERA_SOURCE_DIR="$root"

stamp "GPU tests"
timeout 240 "$test_bin" --gtest_color=no > "$OUT/tests.log" 2>&1
rc=$?
passed=$(grep -c '^\[       OK \]' "$OUT/tests.log")
failed=$(grep -c '^\[  FAILED  \] .*([0-9]* ms)$' "$OUT/tests.log")
skipped=$(grep -c '^\[  SKIPPED \] .*([0-9]* ms)$' "$OUT/tests.log")
say "- tests: exit $rc, $passed passed, $failed failed, $skipped skipped (tests.log)"
[ "$rc" -ne 0 ] && status=1 && grep -E '^\[  FAILED  \]|Failure|error' "$OUT/tests.log" | head -20

stamp "kernel benchmarks"
"$bench_bin" --json "$OUT/bench.json" "${bench_args[@]}" > "$OUT/bench.log" 2>&1
rc=$?
say "- bench: exit $rc (bench.log, bench.json)"
[ "$rc" -ne 0 ] && status=1 && tail -20 "$OUT/bench.log"

if [ "$peer" = 1 ]; then
  stamp "PyTorch peer (F.linear, one token)"
  peer_args=(--json "$OUT/peer.json")
  [ "$quick" = 1 ] && peer_args+=(--quick)
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/cuda/torch_peer.py "${peer_args[@]}" >> "$OUT/bench.log" 2>&1
  say "- PyTorch peer: exit $? (end of bench.log, peer.json)"
fi

if [ "$sanitizer" = 1 ] && command -v compute-sanitizer > /dev/null; then
  stamp "compute-sanitizer (memcheck on all tests; racecheck on the shared-memory kernels)"
  {
    echo "== memcheck"
    timeout 180 compute-sanitizer --tool memcheck --error-exitcode 99 "$test_bin" --gtest_color=no \
      --gtest_brief=1
    echo "memcheck exit $?"
    echo "== racecheck"
    timeout 90 compute-sanitizer --tool racecheck --error-exitcode 99 "$test_bin" --gtest_color=no --gtest_brief=1 \
      --gtest_filter='CudaAttention.Decode*:CudaOps.Argmax*:CudaOps.Rmsnorm*:CudaGemv.DefaultConfig*'
    echo "racecheck exit $?"
  } > "$OUT/sanitizer.log" 2>&1
  say "- sanitizer: $(grep -E '^(memcheck|racecheck) exit' "$OUT/sanitizer.log" | tr '\n' ' ')$(grep -m1 'ERROR SUMMARY' "$OUT/sanitizer.log")"
  grep -q -E '^(memcheck|racecheck) exit [^0]' "$OUT/sanitizer.log" && status=1
fi

# PyTorch decode peers (HF transformers eager generate, gpt-fast-style static cache + torch.compile) on bf16 Llama
# shapes; ~3.5 min for the three models (--quick: Llama-3-8B shape only). Rows go under "decode" in peer.json (at most
# 8 files come back from $OUT), the table to bench.log.
if [ "$peer" = 1 ]; then
  stamp "PyTorch decode peers (HF eager, torch.compile)"
  decode_args=(--json "$OUT/peer.json" --json-key decode)
  [ "$quick" = 1 ] && decode_args+=(--models llama3-8b)
  PYTHONUNBUFFERED=1 timeout 420 python3 bench/peer/torch_decode.py "${decode_args[@]}" >> "$OUT/bench.log" 2>&1
  say "- PyTorch decode peers: exit $? (end of bench.log, \"decode\" in peer.json)"
fi

# Later steps of the CUDA backend issue plug in here; each prints nothing until it exists.
# TODO(cuda-executor): HF oracle — logits of a random-weight Llama (save_pretrained) vs `tessera run --device cuda`.
#   python3 python/hf_oracle.py --out /tmp/hf_oracle writes the models and references; Tessera dumps
#   <dump>/<case>/<prompt>.npy; python3 python/hf_oracle.py --ref /tmp/hf_oracle --compare <dump> gives the verdicts.
# Whole-model decode on the CUDA backend: `tessera bench --device cuda` (prompt token by token through the decode
# graph, then generation, one captured CUDA graph per step) on synthetic models and the default model when present.
# Rows go under "tessera_decode" in peer.json (no new file: at most 8 come back), a table to bench.log.
decode_specs=${TESSERA_DECODE_SPECS:-"llama3-8b:bf16 llama3-8b:q8_0 llama3-8b:q4_0 llama3.2-1b:bf16 smollm2-135m:bf16 smollm2-135m:q4_1"}
if [ -n "$cli_bin" ]; then
  stamp "decode benchmarks (tessera bench --device cuda)"
  dec_dir=$(mktemp -d)
  i=0
  for spec in $decode_specs; do
    i=$((i + 1))
    timeout 240 "$cli_bin" bench --device cuda --arch "${spec%%:*}" --random-weights --dtype "${spec##*:}" \
      -p 128 -n 256 -r 3 --no-ceilings --json > "$dec_dir/$i.json" 2>> "$OUT/bench.log"
    say "- decode bench $spec: exit $?"
  done
  default_model="$HOME/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ -f "$default_model" ]; then
    i=$((i + 1))
    timeout 120 "$cli_bin" bench --device cuda -m "$default_model" -p 128 -n 256 -r 3 --no-ceilings --json \
      > "$dec_dir/$i.json" 2>> "$OUT/bench.log"
    say "- decode bench default model: exit $?"
  else
    say "- decode bench default model: skipped (not on this machine)"
  fi
  python3 - "$OUT/peer.json" "$dec_dir" >> "$OUT/bench.log" 2>&1 <<'PY'
import json, os, sys
path, d = sys.argv[1], sys.argv[2]
rows = []
for f in sorted(os.listdir(d), key=lambda n: int(n.split(".")[0])):
    try:
        rows += json.load(open(os.path.join(d, f)))
    except Exception as e:
        print(f"decode bench {f}: no JSON ({e})")
doc = json.load(open(path)) if os.path.exists(path) else {}
if not isinstance(doc, dict):
    doc = {"gemv": doc}
doc["tessera_decode"] = rows
json.dump(doc, open(path, "w"), indent=1)
print("tessera decode (--device cuda)")
for r in rows:
    print(f"tessera {r.get('arch')} {r.get('weight_dtype')} {r.get('test')}: {r.get('tok_s', 0):.1f} tok/s, "
          f"{r.get('gbps', 0):.0f} GB/s of weights")
PY
  rm -rf "$dec_dir"
else
  say "- decode bench: no tessera CLI binary"
fi
say ""
say "## Benchmarks"
say '```'
sed -n '1,400p' "$OUT/bench.log" | grep -v '^$' >> "$summary"
say '```'
stamp "done, status $status"
echo
grep -E '^tessera |ceilings|^(bf16|f16|f32|q8_0|q4_0|q4_1) .*(4096x14336|14336x4096)|^llama3|^smollm|^rmsnorm|decode step|projected|tok/s|^torch|copy' "$OUT/bench.log"
exit $status
