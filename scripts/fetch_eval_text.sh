#!/usr/bin/env bash
# Puts the evaluation text of `tessera perplexity` (docs/QUALITY.md), the King James Bible, into the cache
# ($XDG_CACHE_HOME/tessera/eval, else ~/.cache/tessera/eval) from Debian's bible-kjv package, and checks its size and
# sha256, so every machine scores the same bytes. Installs bible-kjv with apt-get when `bible` is missing.
# Usage: scripts/fetch_eval_text.sh   (prints the text's path; does nothing when it is already there and valid)
set -euo pipefail
name=kjv.txt
size=4404412
sha=cd45f0c9cedab8e4439bd6486c8952c77cc8b0ecc5d1f6ae3513f2039f47229d
dir=${XDG_CACHE_HOME:-$HOME/.cache}/tessera/eval
dst="$dir/$name"
mkdir -p "$dir"
valid() { [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$size" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha" ]; }
if valid "$dst"; then
  echo "$dst"; exit 0
fi
if ! command -v bible >/dev/null 2>&1; then
  echo "fetch_eval_text: installing Debian's bible-kjv (needs apt-get and root)" >&2
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  $sudo_cmd apt-get install -y -q bible-kjv >&2
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# -f: plain text, the whole book from the first verse to the last, one verse per line.
bible -f 'gen1:1-rev22:21' > "$tmp/$name"
if ! valid "$tmp/$name"; then
  echo "fetch_eval_text: $name is $(stat -c %s "$tmp/$name") bytes, sha256 $(sha256sum "$tmp/$name" | cut -d' ' -f1);" \
    "expected $size bytes, sha256 $sha (another bible-kjv version?); refusing to install it" >&2
  exit 1
fi
mv "$tmp/$name" "$dst"
echo "fetch_eval_text: text stored at $dst" >&2
echo "$dst"
