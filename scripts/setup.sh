#!/usr/bin/env bash
# Installs what Tessera needs to build and test: Debian packages (apt-get) and a project-local Python venv (.venv).
# Idempotent and silent when everything is already there. Usage: scripts/setup.sh [--no-python]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

debs=(cmake ninja-build g++ make clang libclang-rt-dev ccache pkg-config
      libcli11-dev nlohmann-json3-dev libfmt-dev libpcre2-dev libgtest-dev libgmock-dev libbenchmark-dev
      libopenblas-dev libedit-dev python3-venv python3-pip unzip tmux
      libgraphviz-dev graphviz)
# libgraphviz-dev: `tessera graph --format svg` lays out through libgvc (graphviz: the dot program and its layout
# plugins' configuration). Chromium, which tests/tools/graph_html_check.sh drives, is ~350 MB and left out: the check
# skips without it (apt-get install chromium to run it).
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1
fi

[ "${1:-}" = "--no-python" ] && exit 0
venv="$root/.venv"
py_reqs="$root/python/requirements.txt"
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$py_reqs" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating Python environment in .venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$py_reqs"
  echo "$want" > "$stamp"
fi
# The llama.cpp source (no build): tests/runtime/test_tokenizer_llamacpp_vocab.cpp reads its vocabulary tests.
"$root/scripts/build_llamacpp.sh" --source >/dev/null
