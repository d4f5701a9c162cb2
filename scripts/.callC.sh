scripts/gpu_lora.sh --rounds 1 2>&1 | tail -20
B=build-gpu/bin
M=/tmp/gpu_lora_8b_bf16.gguf; A=/tmp/gpu_lora_8b_r16
pp() { timeout 90 $B/tessera bench -m $M --device cuda -p 512 -n 0 -r 5 --no-ceilings "$@" 2>&1 | grep -E "pp512 |error" | sed "s|^|$* : |"; }
for r in 1 2 3; do pp; pp --lora $A; pp --lora $A --cuda lora_side=0; done
root=$(pwd); . scripts/gpu_env.sh; gpu_build $OUT/ops_build.log test_ops > /dev/null 2>&1; echo "test_ops build $?"
build-gpu/tests/test_ops --gtest_filter='*RESIDUAL_NORM_OUT_q4_0*' 2>&1 | grep -E "^\[ +(OK|FAILED|PASSED)" | head
bench() { timeout 60 $B/tessera bench --device cuda -p 0 -n 128 -r 3 --no-ceilings "$@" 2>&1 | grep -E "tg128 |error" | sed "s|^|$* : |"; }
for d in q8_0 q5_k iq4_xs q5_0; do for qn in auto all; do bench --arch llama3-8b --random-weights --dtype $d --cuda quant_norm=$qn; done; done
