#!/usr/bin/env bash
# One device call that builds the named targets in build-gpu (gpu_check.sh's configuration) and runs the commands
# given after `--`, each line's output teed into $OUT/probe.log. For short measurements that have no script of their
# own yet. Usage (device tool, carry [".gpu-deps"]):
#   scripts/gpu_probe.sh TARGET... -- 'CMD1' 'CMD2' ...
# Inside the commands, $B is build-gpu/bin.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT"
targets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do targets+=("$1"); shift; done
[ $# -gt 0 ] && shift
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
. "$root/scripts/gpu_env.sh"
echo "# gpu_probe $(date -u +%Y-%m-%dT%H:%M:%SZ) $(source_id)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader 2>&1 | head -1
stamp "building ${targets[*]}"
gpu_build "$OUT/probe_build.log" "${targets[@]}" || { tail -40 "$OUT/probe_build.log"; exit 1; }
gpu_env
export B="$root/build-gpu/bin"
status=0
for c in "$@"; do
  stamp "$c"
  bash -c "$c" 2>&1 | tee -a "$OUT/probe.log" || status=1
done
stamp "done (status $status)"
exit $status
