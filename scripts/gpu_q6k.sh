#!/usr/bin/env bash
# A Q6_K file on CUDA (the architecture issue's check): the default model requantized by llama.cpp's llama-quantize
# (--allow-requantize, type Q6_K; attention, gate/up and the embedding overridden to q4_0 so that the file, 84 MB,
# fits two device calls; every ffn_down stays q6_K, which CUDA has no kernel for and converts to bf16 at load).
# Made here:
#   llama-quantize --allow-requantize --token-embedding-type q4_0 --tensor-type attn_q=q4_0 --tensor-type attn_k=q4_0 \
#     --tensor-type attn_v=q4_0 --tensor-type attn_output=q4_0 --tensor-type ffn_gate=q4_0 --tensor-type ffn_up=q4_0 \
#     SmolLM2-135M-Instruct.Q4_1.gguf smollm2-q6k-mix.gguf Q6_K 2
#   split -n 2 -d -a 1 smollm2-q6k-mix.gguf .gpu-q6k/part; sha256sum ... > .gpu-q6k/sha256
# On the GPU machine: a first call carrying .gpu-q6k/part0 runs `scripts/gpu_q6k.sh --stage`; the next call, on the
# still-warm machine, carrying .gpu-q6k/part1 and .gpu-q6k/sha256, runs `scripts/gpu_q6k.sh TESSERA` which assembles the
# file and compares greedy text and logits on cuda against the cpu.
set -uo pipefail
parts="$HOME/.cache/tessera/parts"
if [ "${1:-}" = --stage ]; then mkdir -p "$parts" && cp .gpu-q6k/part0 "$parts/q6k0" && echo "gpu_q6k: staged part 0"; exit; fi
cli=${1:?usage: gpu_q6k.sh --stage | gpu_q6k.sh TESSERA}
f=/tmp/smollm2-q6k-mix.gguf
[ -f "$parts/q6k0" ] || { echo "gpu_q6k: part 0 was not staged on this machine (the machine was not kept warm)"; exit 1; }
cat "$parts/q6k0" .gpu-q6k/part1 > "$f"
[ "$(sha256sum "$f" | cut -d' ' -f1)" = "$(cat .gpu-q6k/sha256)" ] || { echo "gpu_q6k: wrong sha256"; exit 1; }
p="The capital of France is"
for d in cpu cuda; do
  "$cli" run -m "$f" --device "$d" -p "$p" -n 24 --temp 0 --no-stats > "/tmp/q6k.$d.txt" 2> "/tmp/q6k.$d.err"
  echo "gpu_q6k: $d exit $?: $(tr '\n' ' ' < "/tmp/q6k.$d.txt")"; grep -i "convert\|error" "/tmp/q6k.$d.err"
  "$cli" logits -m "$f" --device "$d" --text "$p and the capital of Germany is Berlin" --out "/tmp/q6k.$d.npy" 2>> "/tmp/q6k.$d.err"
done
cmp -s /tmp/q6k.cpu.txt /tmp/q6k.cuda.txt && echo "gpu_q6k: greedy text equal on cpu and cuda" || echo "gpu_q6k: greedy text DIFFERS"
python3 - <<'PY'
import numpy as np
a, b = np.load("/tmp/q6k.cpu.npy"), np.load("/tmp/q6k.cuda.npy")
rel = np.abs(a - b).max() / np.abs(a).max()
top = (a.argmax(-1) == b.argmax(-1)).mean()
print(f"gpu_q6k: logits [{a.shape[0]} positions] max |cpu - cuda| / max |cpu| = {rel:.2e}, top-1 agreement {top:.3f}")
PY
