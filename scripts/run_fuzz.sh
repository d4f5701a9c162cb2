#!/usr/bin/env bash
# Runs each libFuzzer target built in BUILD_DIR (bin/fuzz_gguf, bin/fuzz_safetensors) for SECONDS, starting from its
# corpus in tests/fuzz/<target>/, then merges what it found back into that folder, minimized (only inputs that add
# coverage stay, so the committed corpus stays small). Crash, leak and timeout inputs are written to
# tests/fuzz/<target>/ as crash-*, leak-*, timeout-* (git-ignored). Exits non-zero when any target finds a problem.
#
# Usage: scripts/run_fuzz.sh BUILD_DIR SECONDS [TARGET...]     (`make fuzz FUZZ_SECONDS=N` builds and calls this)
# Log of each run: BUILD_DIR/fuzz-<target>.log
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2; exit 2; }
build=$(cd "$1" && pwd)
seconds=$2
shift 2
targets=("$@")
explicit=1
if [ ${#targets[@]} -eq 0 ]; then
  targets=(fuzz_gguf fuzz_safetensors)
  explicit=0
fi

# The structure of a model header fits in a few KiB (a real vocabulary only repeats it); longer inputs slow the search
# down and grow the corpus. FUZZ_MAX_LEN overrides it.
max_len=${FUZZ_MAX_LEN:-4096}
# UBSan findings must stop the run like ASan's do, or libFuzzer never records them.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

status=0
for t in "${targets[@]}"; do
  exe="$build/bin/$t"
  if [ ! -x "$exe" ]; then
    if [ $explicit -eq 1 ]; then
      echo "run_fuzz: $exe is not built" >&2
      status=1
    else
      echo "run_fuzz: $t is not built in $build, skipped" >&2
    fi
    continue
  fi
  corpus="$root/tests/fuzz/$t"
  mkdir -p "$corpus"
  # The corpus without earlier crash/leak/timeout artifacts (those are reproduced by running the target on them).
  inputs=$(mktemp -d)
  find "$corpus" -maxdepth 1 -type f ! -name 'crash-*' ! -name 'leak-*' ! -name 'timeout-*' -exec cp {} "$inputs"/ \;
  found=$(mktemp -d)
  log="$build/fuzz-$t.log"
  echo "run_fuzz: $t for ${seconds}s from $(find "$inputs" -type f | wc -l) corpus files (log: $log)"
  set +e
  # New inputs go to $found (the first folder); the committed corpus is only read.
  "$exe" -max_total_time="$seconds" -max_len=$max_len -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$corpus/" "$found" "$inputs" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  echo "run_fuzz: $t: ${runs:-?} executions, exit status $rc"
  if [ $rc -ne 0 ]; then
    echo "run_fuzz: $t FOUND A PROBLEM; the input is in $corpus (crash-*/leak-*/timeout-*):" >&2
    grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$log" | head -20 >&2 || true
    status=1
  fi
  # Minimize corpus + new inputs into a fresh folder, then replace the corpus's inputs with it.
  merged=$(mktemp -d)
  if "$exe" -merge=1 -max_len=$max_len -timeout=10 "$merged" "$inputs" "$found" >>"$log" 2>&1; then
    find "$corpus" -maxdepth 1 -type f ! -name 'crash-*' ! -name 'leak-*' ! -name 'timeout-*' -delete
    cp "$merged"/* "$corpus"/ 2>/dev/null || true
    echo "run_fuzz: $t: corpus now $(find "$corpus" -maxdepth 1 -type f ! -name 'crash-*' ! -name 'leak-*' ! -name 'timeout-*' | wc -l) files, $(du -sb "$corpus" | cut -f1) bytes"
  else
    echo "run_fuzz: $t: merging the corpus failed (see $log); corpus left as it was" >&2
    status=1
  fi
  rm -rf "$inputs" "$found" "$merged"
done
exit $status
