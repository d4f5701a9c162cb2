dt=q8_0; f=/tmp/m_$dt.gguf
timeout 120 $B/tessera bench --arch llama3-8b --random-weights --dtype $dt --write-model $f >/dev/null 2>&1 || { echo "$dt: write failed"; exit 1; }
timeout 90 $B/tessera calibrate -m $f -f README.md --sparsity 0.5 -c 32 --tokens 32 -t 16 -o /tmp/t_$dt.json >/dev/null 2>&1 || echo "$dt: calibrate failed"
run() { echo "== $dt $*: $(timeout 60 $B/tessera bench --device cuda -m $f -p 0 -n 128 -r 3 "$@" 2>&1 | grep -E 'tg|error' | tr -s ' ' | tail -2 | tr '\n' ' ')"; }
run
for w in auto q8_0 none; do run --teal /tmp/t_$dt.json --cuda teal_walk=$w; done
for w in auto q8_0 none; do run --sparsity 0.5 --cuda teal_walk=$w; done
