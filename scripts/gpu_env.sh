# Sourced by the scripts/gpu_*.sh (after they set $root, the repository): the one Release sm_90a build in build-gpu
# against the bundle scripts/make_gpu_bundle.sh puts in .gpu-deps/, and the environment its binaries run in.

# source_id: a hash of the source the GPU machine runs (src, tests, bench, python, CMake files, as the copy of the
# working tree has them), to quote beside a measurement. The copy's git metadata is not the session's HEAD (the device
# tool copies the working tree, not the repository), so a commit printed there would be misleading; the same command
# here gives the hash of the tree that ran (uncommitted changes included).
source_id() {
  (cd "$root" && find src tests bench python CMakeLists.txt -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \
    -o -name '*.cuh' -o -name '*.py' -o -name 'CMakeLists.txt' \) 2>/dev/null | LC_ALL=C sort | xargs cat |
    sha256sum | cut -c1-12 | sed 's/^/source /')
}

# gpu_build LOG TARGET...: configures build-gpu and builds the targets, appending cmake's output to LOG; its status is
# cmake's.
gpu_build() {
  local log=$1
  shift
  local deps="$root/.gpu-deps"
  local arch_lib="$deps/lib/x86_64-linux-gnu"
  cmake -S "$root" -B "$root/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA_ARCHS=90a-real \
    -DCMAKE_PREFIX_PATH="$deps" -Dfmt_DIR="$arch_lib/cmake/fmt" -DGTest_DIR="$arch_lib/cmake/GTest" \
    -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" -DCLI11_DIR="$deps/share/cmake/CLI11" \
    -DPKG_CONFIG_EXECUTABLE="$deps/bin/pkg-config" -DTESSERA_FUZZ=OFF -DTESSERA_CUDNN_ROOT="$deps/cudnn" >> "$log" 2>&1 &&
    cmake --build "$root/build-gpu" --target "$@" -j "$(nproc)" >> "$log" 2>&1
}

# gpu_env: the bundle's libraries first; libcudnn for the cuDNN attention path (dlopen'ed) from PyTorch's wheel, last,
# so it shadows nothing; the source directory the tests read their data from.
gpu_env() {
  export LD_LIBRARY_PATH="$root/.gpu-deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local cudnn_lib
  cudnn_lib=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0] + "/lib")' 2>/dev/null) &&
    [ -d "$cudnn_lib" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cudnn_lib"
  export TESSERA_SOURCE_DIR="$root"
}

# gpu_prebuilt: unpacks make_gpu_bundle.sh --prebuilt's binaries into $root/build-pre/bin (tessera, test_backends_cuda,
# test_ops, tessera_bench_cuda and any extras) and puts their libraries on LD_LIBRARY_PATH (after gpu_env's); status 1
# when the bundle has none. Binaries built here run there (glibc and libstdc++ are newer there).
gpu_prebuilt() {
  local pre="$root/.gpu-deps/prebuilt"
  if [ ! -f "$pre/bin.tar.xz" ]; then
    echo "gpu_prebuilt: no $pre/bin.tar.xz (make_gpu_bundle.sh --prebuilt DIR)" >&2
    return 1
  fi
  mkdir -p "$root/build-pre/bin" "$root/build-pre/lib" && tar -C "$root/build-pre/bin" -xJf "$pre/bin.tar.xz" &&
    tar -C "$root/build-pre/lib" -xJf "$pre/lib.tar.xz" || return 1
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$root/build-pre/lib"
  head -1 "$pre/INFO"
}

# stage_model_parts: the model parts carried in .gpu-model-K (scripts/gpu_model_parts.sh: index "K N SHA256 NAME")
# are copied to ~/.cache/tessera/parts/NAME/ (kept while the machine stays warm); once all N are there they are
# joined into ~/.cache/tessera/models/NAME, checked against the sha256 (a mismatch is said and nothing is kept).
stage_model_parts() {
  local d k n sum name parts model have
  for d in "$root"/.gpu-model-*; do
    [ -f "$d/part" ] && [ -f "$d/index" ] || continue
    read -r k n sum name < "$d/index"
    name=${name:-SmolLM2-135M-Instruct.Q4_1.gguf}  # indexes written before the name was recorded
    parts="$HOME/.cache/tessera/parts/$name"
    mkdir -p "$parts" && cp "$d/part" "$parts/part$k" && echo "$n $sum" > "$parts/index" &&
      echo "staged part $k of $n of $name"
  done
  for parts in "$HOME"/.cache/tessera/parts/*/; do
    [ -f "$parts/index" ] || continue
    name=$(basename "$parts")
    model="$HOME/.cache/tessera/models/$name"
    [ -f "$model" ] && continue
    read -r n sum < "$parts/index"
    have=0
    for ((k = 0; k < n; k++)); do [ -f "$parts/part$k" ] && have=$((have + 1)); done
    if [ "$have" != "$n" ]; then
      echo "stage_model_parts: $have of $n parts of $name staged so far"
      continue
    fi
    mkdir -p "$(dirname "$model")"
    for ((k = 0; k < n; k++)); do cat "$parts/part$k"; done > "$model.tmp"
    if [ "$(sha256sum "$model.tmp" | cut -d' ' -f1)" = "$sum" ]; then
      mv "$model.tmp" "$model" && echo "assembled $name from $n parts"
    else
      echo "stage_model_parts: the assembled $name has the wrong sha256; not used" >&2
      rm -f "$model.tmp"
    fi
  done
}

# hf_oracle_dump ORACLE DUMP MODE CLI LOG [DEVICE]: `tessera logits` on every case of a python/hf_oracle.py oracle
# folder into DUMP (cleared first), one prompt at a time (MODE single) or the batch0..7 prompts decoded together
# (MODE batched); f32 cases with the f32 KV cache (the default f16 cache alone costs ~2.5e-3 relative logit error on
# an f32 model, limit 1e-3, so with it the oracle would judge the cache type, not the f32 path). Output to LOG; DEVICE
# defaults to cuda. Compare afterwards with `python3 python/hf_oracle.py --ref ORACLE --compare DUMP`.
hf_oracle_dump() {
  local oracle=$1 dump=$2 mode=$3 cli=$4 log=$5 device=${6:-cuda} case_dir case_name pf
  rm -rf "$dump"
  for case_dir in "$oracle"/*/; do
    [ -f "$case_dir/prompts.json" ] || continue
    case_name=$(basename "$case_dir")
    local extra=()
    [ "$mode" = batched ] && extra=(--batched)
    case "$case_name" in *-f32) extra+=(--kv-type f32) ;; esac
    pf="$case_dir/prompts.json"
    if [ "$mode" = batched ]; then
      pf="$dump.batch_prompts.json"
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['prompts']=[p for p in d['prompts'] if p['name'].startswith('batch')]; json.dump(d, open(sys.argv[2],'w'))" \
        "$case_dir/prompts.json" "$pf"
    fi
    echo "== $mode $case_name" >> "$log"
    timeout 300 "$cli" logits -m "$case_dir" --prompts "$pf" --out "$dump/$case_name" --device "$device" -c 4096 \
      "${extra[@]}" >> "$log" 2>&1
    echo "tessera logits exit $?" >> "$log"
  done
}
