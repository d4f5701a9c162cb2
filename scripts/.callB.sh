B=build-gpu/bin
bench() { timeout 60 $B/tessera bench --device cuda -p 0 -n 128 -r 3 --no-ceilings "$@" 2>&1 | grep -E "tg128 |error" | sed "s|^|$* : |"; }
scripts/gpu_probe.sh tessera_cli test_ops test_backends_cuda -- \
  "build-gpu/tests/test_ops --gtest_filter='*RESIDUAL_NORM_OUT*:*MATMUL_SPARSE_q4_K*' 2>&1 | grep -E '^\[  (     OK|FAILED|  PASSED)' | head -20" \
  "build-gpu/tests/test_backends_cuda --gtest_filter='CudaFusionSupport.*:CudaOptions.*:CudaLora*:CudaTernary*:CudaKquant*' 2>&1 | tail -4" > /dev/null 2>&1
cat $OUT/probe.log | tail -30
for r in 1 2; do for qn in auto q4_1; do bench --arch llama3-8b --random-weights --dtype q6_k --cuda quant_norm=$qn; done; done
for qn in auto all; do bench --arch llama3-8b --random-weights --dtype q4_0 --cuda quant_norm=$qn; done
for d in tq2_0 bf16; do bench --arch bitnet-2b4t-llama --random-weights --dtype $d; done
for d in q4_k tq2_0; do bench --arch llama3-8b --random-weights --dtype $d; done
