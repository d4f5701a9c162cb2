set -o pipefail
t0=$(date +%s)
scripts/gpu_check.sh --quick --only tests --no-sanitizer > $OUT/check.log 2>&1; echo "gpu_check rc $?"
tail -25 $OUT/check.log
grep -E "FAILED|tests passed|PASSED|Failed" $OUT/check.log | head -30
B=build-gpu/bin
el() { echo $(( $(date +%s) - t0 )); }
bench() { timeout 60 $B/tessera bench --device cuda -p 0 -n 128 -r 3 --no-ceilings "$@" 2>&1 | grep -E "tg128 |error" | sed "s|^|$* : |"; }
if [ "$(el)" -lt 420 ]; then
  for d in tq2_0 iq4_nl q6_k q4_0; do
    for qn in auto all q4_1; do
      [ "$(el)" -lt 560 ] || break 2
      bench --arch llama3-8b --random-weights --dtype $d --cuda quant_norm=$qn
    done
  done | tee $OUT/qn3.log
fi
echo "elapsed $(el)"
