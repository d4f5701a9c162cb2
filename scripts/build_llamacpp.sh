#!/usr/bin/env bash
# Builds the peer/oracle llama.cpp from the source vendored in the PyPI sdist llama-cpp-python==0.3.36, CPU only,
# cached under ~/.cache/tessera/llama.cpp-0.3.36 (about 7 minutes on 2 cores the first time, instant after).
# Usage: scripts/build_llamacpp.sh [TARGET...]   prints the bin/ directory holding the tools.
#        scripts/build_llamacpp.sh --source       only unpacks the source (its models/ggml-vocab-* files are the
#                                                 tokenizer tests' data); prints the source directory.
set -euo pipefail
ver=0.3.36
cache=${TESSERA_LLAMACPP_CACHE:-$HOME/.cache/tessera/llama.cpp-$ver}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(llama-tokenize llama-bench llama-simple llama-completion llama-perplexity)
mkdir -p "$cache"
if [ ! -f "$cache/src/CMakeLists.txt" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  echo "build_llamacpp: downloading llama-cpp-python==$ver sdist" >&2
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary=:all: -d "$tmp" "llama-cpp-python==$ver" >&2
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  rm -rf "$cache/src"; mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$cache/src"
fi
if [ "${targets[0]}" = "--source" ]; then echo "$cache/src"; exit 0; fi
need=0
for t in "${targets[@]}"; do [ -x "$cache/build/bin/$t" ] || need=1; done
if [ $need = 1 ]; then
  echo "build_llamacpp: building ${targets[*]} (Release, native)" >&2
  cmake -S "$cache/src" -B "$cache/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
  cmake --build "$cache/build" -j "$(nproc)" --target "${targets[@]}" >&2
fi
echo "$cache/build/bin"
