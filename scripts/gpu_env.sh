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
