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
