#!/usr/bin/env bash
# Packs what a CUDA build needs on the GPU machine into .gpu-deps/ (git-ignored), to be named in the device tool's
# `carry`. That machine has nvcc 13.0, CMake, ninja, g++ and python3 with torch, but none of Debian's -dev packages.
#
# Usage (here, in the repository root):
#   scripts/make_gpu_bundle.sh                    # build dependencies only (scripts/gpu_check.sh builds there)
#   scripts/make_gpu_bundle.sh --prebuilt DIR     # also tessera, test_backends_cuda, test_ops and tessera_bench_cuda
#                                                 # built here in DIR (sm_90a, e.g. build/), so no device time goes
#                                                 # to building; TESSERA_PREBUILT_EXTRA="bin/experiments/exp_X ..." adds
#                                                 # more. On the device: . scripts/gpu_env.sh; gpu_prebuilt
#   scripts/make_gpu_bundle.sh --cudnn-only DIR   # only the cuDNN headers (below), into DIR/cudnn/include
#
# cuDNN attention (src/backends/cuda/attn_cudnn.cpp) needs headers only: the cuDNN frontend (header-only, PyPI
# nvidia-cudnn-frontend: the wheel's include/ folder, 3 MB) and cudnn*.h (0.4 MB). They go to .gpu-deps/cudnn/include,
# which gpu_check.sh passes as TESSERA_CUDNN_ROOT. Sources, first found: $TESSERA_CUDNN_FRONTEND (an include folder
# or a nvidia_cudnn_frontend wheel), else the wheel nvidia-cudnn-frontend==1.32.0 (downloaded once into
# ~/.cache/tessera/cudnn); cudnn*.h from $TESSERA_CUDNN_INCLUDE, else
# the CUDA toolkit's include folder. libcudnn itself is not bundled: the GPU machine's PyTorch wheel has it.
#
# Two ways to run on the GPU machine, both prepared here:
#  1. Build there (the default of gpu_check.sh): the Debian packages' own files, copied with their layout under
#     .gpu-deps/ (usr/ stripped): headers, CMake package configs (they compute their prefix relative to themselves, so
#     CMAKE_PREFIX_PATH=.gpu-deps finds them), libgtest.a, libfmt.so, libpcre2-8.so, and pkgconf for
#     pkg_check_modules (with .pc files rewritten to a relocatable prefix). Robust to the GPU machine's newer g++/glibc.
#  2. Prebuilt (--prebuilt): binaries built here for sm_90a plus the shared libraries they need that the GPU machine
#     lacks (everything but glibc, libstdc++, libgcc and the driver). glibc and libstdc++ there are newer than here, so
#     binaries built here run there; no compile time is spent on the device. cuBLASLt (opened at run time) comes from the
#     CUDA toolkit there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.gpu-deps"
prebuilt=""
cudnn_only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt="$2"; shift 2 ;;
    --cudnn-only) cudnn_only="$2"; shift 2 ;;
    *) echo "usage: $0 [--prebuilt BUILD_DIR | --cudnn-only DIR]" >&2; exit 2 ;;
  esac
done

# Copies the cuDNN frontend and cudnn*.h headers into $1/cudnn/include; says why not when either is missing.
bundle_cudnn() {
  local to="$1/cudnn/include" fe="${TESSERA_CUDNN_FRONTEND:-}" inc="${TESSERA_CUDNN_INCLUDE:-/usr/local/cuda/include}"
  if [ -z "$fe" ]; then
    # The pinned frontend wheel, fetched once into the cache (PyPI; only its headers are used).
    local cache="$HOME/.cache/tessera/cudnn"
    # compgen lists what matches and nothing else: `ls` of a missing folder fails, which pipefail made fatal.
    fe=$(compgen -G "$cache/nvidia_cudnn_frontend-1.32.0-*.whl" | head -1 || true)
    if [ -z "$fe" ]; then
      mkdir -p "$cache" && python3 -m pip download -q --no-deps nvidia-cudnn-frontend==1.32.0 -d "$cache" >&2 || true
      fe=$(compgen -G "$cache/nvidia_cudnn_frontend-1.32.0-*.whl" | head -1 || true)
    fi
  fi
  if [ -z "$fe" ] || ! ls "$inc"/cudnn_version.h > /dev/null 2>&1; then
    echo "make_gpu_bundle: no cuDNN frontend or cudnn.h found: cuDNN attention stays off there" >&2
    return 0
  fi
  rm -rf "$1/cudnn" && mkdir -p "$to"
  if [ -d "$fe" ]; then
    cp -r "$fe"/. "$to"/
  else  # a wheel: its include/ folder
    local tmp; tmp=$(mktemp -d)
    unzip -q -o "$fe" 'include/*' -d "$tmp" && cp -r "$tmp"/include/. "$to"/
    rm -rf "$tmp"
  fi
  cp "$inc"/cudnn*.h "$to"/
  echo "make_gpu_bundle: cuDNN headers ($(grep -E 'define CUDNN_(MAJOR|MINOR) ' "$to"/cudnn_version.h | awk '{print $3}' | paste -sd.)) in $to"
}
if [ -n "$cudnn_only" ]; then
  bundle_cudnn "$cudnn_only"
  exit 0
fi

rm -rf "$dest"
mkdir -p "$dest"
pkgs=(libfmt-dev libfmt9 libgtest-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libpcre2-8-0 pkgconf-bin libpkgconf3)
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    echo "make_gpu_bundle: Debian package $p is not installed here (run scripts/setup.sh)" >&2
    exit 1
  fi
  dpkg -L "$p" | grep -v -E '^/usr/share/(doc|man|lintian|info)/' | while read -r f; do
    if [ -f "$f" ] || [ -L "$f" ]; then
      rel="${f#/usr/}"
      mkdir -p "$dest/$(dirname "$rel")"
      cp -a "$f" "$dest/$rel"
    fi
  done
done

# pkg-config files: make the prefix relative to the .pc file (lib/x86_64-linux-gnu/pkgconfig -> three levels up).
for pc in "$dest"/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
  sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../../..|' "$pc"
done
# pkgconf needs its own library next to it.
mkdir -p "$dest/bin"
cat > "$dest/bin/pkg-config" <<'EOF'
#!/bin/sh
here=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$here/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
PKG_CONFIG_LIBDIR="$here/lib/x86_64-linux-gnu/pkgconfig" exec "$here/bin/pkgconf" "$@"
EOF
chmod +x "$dest/bin/pkg-config"

bundle_cudnn "$dest"

# The evaluation text (scripts/fetch_eval_text.sh) for gpu_check's ppl phase: the GPU machine has no Debian archive.
kjv="${XDG_CACHE_HOME:-$HOME/.cache}/tessera/eval/kjv.txt"
if [ -f "$kjv" ]; then
  mkdir -p "$dest/eval" && cp "$kjv" "$dest/eval/kjv.txt"
else
  echo "make_gpu_bundle: no $kjv (scripts/fetch_eval_text.sh): gpu_check's ppl phase will skip the KJV rows" >&2
fi

if [ -n "$prebuilt" ]; then
  # The binaries, stripped, in one tar.xz whose 256 MiB dictionary spans them all: each links the whole backend, so
  # the four 40 MB binaries pack into 25 MB (the device tool carries 64 MiB at most). gpu_env.sh's gpu_prebuilt
  # unpacks them.
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib" "$dest/prebuilt"
  for t in bin/tessera tests/test_backends_cuda tests/test_ops bin/tessera_bench_cuda ${TESSERA_PREBUILT_EXTRA:-}; do
    if [ ! -x "$prebuilt/$t" ]; then
      case "$t" in
        bin/tessera | tests/test_backends_cuda)
          echo "make_gpu_bundle: $prebuilt/$t is missing" \
            "(cmake --build $prebuilt --target tessera_cli test_backends_cuda)" >&2
          exit 1 ;;
        *) echo "make_gpu_bundle: $prebuilt/$t is not built; left out" >&2; continue ;;
      esac
    fi
    cp "$prebuilt/$t" "$stage/bin/" && strip "$stage/bin/$(basename "$t")"
  done
  tar -C "$stage/bin" -cf - . | xz -T1 --lzma2=preset=6,dict=256MiB > "$dest/prebuilt/bin.tar.xz"
  # Shared libraries the binaries load that the GPU machine lacks: everything ldd resolves but glibc, libstdc++ and
  # libgcc (newer there than here) and the CUDA driver (Graphviz, OpenBLAS, libedit, fmt, PCRE2, ... are not there).
  for so in $(ldd "$stage"/bin/* | awk '/=> \//{print $3}' | sort -u); do
    case "$(basename "$so")" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libstdc++.so* | libgcc_s.so* | \
        libcuda.so*) ;;
      *) cp -L "$so" "$stage/lib/" ;;
    esac
  done
  tar -C "$stage/lib" -cf - . | xz -T1 -6 > "$dest/prebuilt/lib.tar.xz"  # OpenBLAS alone is 36 MB unpacked
  { echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $prebuilt at commit $(git -C "$root" rev-parse --short HEAD)"
    (cd "$stage/bin" && sha256sum ./*); } > "$dest/prebuilt/INFO"
  rm -rf "$stage"
fi
echo "make_gpu_bundle: $(du -sh "$dest" | cut -f1) in $dest"
