for dt in bf16 q4_1; do
  f=/tmp/m_$dt.gguf
  timeout 150 $B/tessera bench --arch llama3-8b --random-weights --dtype $dt --write-model $f >/dev/null 2>&1 || { echo "$dt: write failed"; continue; }
  timeout 120 $B/tessera calibrate -m $f -f README.md --sparsity 0.5 -c 32 --tokens 32 -t 16 -o /tmp/t_$dt.json >/dev/null 2>&1 || echo "$dt: calibrate failed"
  run() { echo "== $dt $*: $(timeout 60 $B/tessera bench --device cuda -m $f -p 0 -n 128 -r 3 "$@" 2>&1 | grep -E 'tg|error' | tr -s ' ' | tail -2 | tr '\n' ' ')"; }
  run
  run --teal /tmp/t_$dt.json
  prof() { echo "== profile $dt $*"; timeout 90 $B/tessera profile --device cuda -m $f --prompt-tokens 16 -n 16 "$@" 2>&1 | sed -n '/^decode/,$p' | head -40; }
  prof
  prof --teal /tmp/t_$dt.json
  rm -f $f
done
