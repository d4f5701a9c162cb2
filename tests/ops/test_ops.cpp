// The op test table: every graph op (and, later, every fused node) on every backend against the CPU reference, over
// shapes and dtypes, in one parameterized suite (ops/op_case.h says how a case runs). Each run builds fresh random
// inputs (seed printed; TESSERA_TEST_SEED replays one). CUDA rows skip without a GPU; scripts/gpu_check.sh runs them.
// Adding a case is adding one line to kRows.
//
// Tolerances are normalized MSE against the reference (CpuBackend in reference mode: scalar kernels, double sums,
// f32 activations), chosen from what each path rounds:
//   exact      1e-12  the same arithmetic (EMBED of a native format, ADD, LAST_ROW, KV_STORE's rounding): any
//                     nonzero error is a wrong element (a copy off by one row is O(1));
//   f32        1e-10  f32 sums in another order: relative ~sqrt(K) 2^-24 per output, nMSE ~1e-12 at K = 4096;
//   f16w       1e-6   weights of a format without a CPU kernel, converted to f16 by the weight cache (x stays
//                     f32): 2^-11 relative per weight, nMSE ~2^-22 / 3 = 8e-8 (bf16 instead would show 1.3e-6);
//   x16        1e-5   a 16-bit rounding of the operands (CUDA's cuBLASLt path rounds x to the weight's 16-bit type;
//                     converted K-quant weights are bf16): bf16 keeps 2^-9 relative, nMSE ~2^-18 / 3 = 1.3e-6 per
//                     rounded operand, two of them 2.6e-6;
//   q8         1e-4   8-bit activations per block of 32 (CPU and CUDA quantized kernels): measured 1.5e-5 against f64
//                     on uniform data, model (d^2 / 12) / E[x^2] = 1.6e-5 (backends/cpu/kernels/matmul.cpp); ggml's
//                     test-backend-ops accepts 5e-4 for this scheme;
//   attn16     1e-5   CUDA prefill attention on a 16-bit cache: q and the probabilities rounded to 16 bits for the
//                     tensor cores (per-row relative error limit 3e-3 in tests/backends/cuda/test_attn_prefill.cpp).
// A wrong element (a masking or indexing slip) moves the nMSE by ~1/n of O(1), far above every limit here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels/matmul_sparse.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/op_case.h"

namespace tessera::ops_test {
namespace {

constexpr double kExact = 1e-12, kF32 = 1e-10, kF16W = 1e-6, kX16 = 1e-5, kQ8 = 1e-4, kAttn16 = 1e-5;

// Quantized formats with kernels of their own (8-bit activations): on both backends q8_0, q4_0 and q4_1; on the CPU
// its table's quantized formats; on CUDA also the formats below (others, the ternary ones at this commit, are converted
// to bf16 there).
bool native_quantized(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1; }
bool cpu_native_quantized(DType t) { return cpu::matmul_formats().is_native_quantized(t); }
// The CUDA kernels read the K-quants, q5_0, q5_1, iq4_nl, iq4_xs and the ternary formats natively too (8-bit
// activations, dequantized to bf16 for cuBLASLt; tq1_0 uploaded as tq2_0).
bool cuda_quantized(DType t) {
  return native_quantized(t) || t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K ||
         t == DType::Q6_K || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::IQ4_NL || t == DType::IQ4_XS ||
         t == DType::TQ1_0 || t == DType::TQ2_0;
}
bool float_format(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
std::string dn(DType t) { return std::string(dtype_name(t)); }

// MATMUL limits by weight format and path. CPU: native quantized formats (the K-quants and i-quants included) take
// 8-bit activations; float formats and converted ones (f16 in the CPU's weight cache: 2^-11 relative, nMSE ~1e-7 at
// most) take f32 x. CUDA: t <= 4 reads f32 x (quantized, K-quants included: q8), larger t goes to cuBLASLt with x in
// 16 bits (quantized weights dequantized to bf16 there), except f32 weights (plain f32 GEMM); formats CUDA converts at
// load are bf16 weights.
Row matmul_row(DType w, int64_t t, int64_t n, int64_t k) {
  Row r;
  r.name = "MATMUL_" + dn(w) + "_t" + std::to_string(t) + "_n" + std::to_string(n) + "_k" + std::to_string(k);
  r.build = [=](std::mt19937& rng) { return matmul(rng, w, t, n, k); };
  r.max_nmse_cpu = cpu_native_quantized(w) ? kQ8 : !float_format(w) ? kF16W : kF32;
  const bool cuda_converted = !float_format(w) && !cuda_quantized(w);
  r.max_nmse_cuda = cuda_quantized(w) ? kQ8 : (w == DType::F32 ? kF32 : (t <= 4 && !cuda_converted ? kF32 : kX16));
  return r;
}

// TEAL's sparse GEMV: against the dense reference on the same zeroed x, with MATMUL's limits (quantized formats
// quantize x to 8 bits per block as the dense kernels do; zeros stay zero). CUDA: the sparse GEMV for one row of bf16,
// f16, q8_0, q4_0, q4_1 or q4_K (a q4_1 copy) weights (f32 x; converted formats: bf16), else the dense matmul on the
// zeroed x, as the executors run it.
Row matmul_sparse_row(DType w, int64_t t, int64_t n, int64_t k, float sparsity) {
  Row r = matmul_row(w, t, n, k);
  r.name = "MATMUL_SPARSE_" + dn(w) + "_t" + std::to_string(t) + "_n" + std::to_string(n) + "_k" + std::to_string(k) +
           "_s" + std::to_string(static_cast<int>(sparsity * 100));
  r.build = [=](std::mt19937& rng) { return matmul_sparse(rng, w, t, n, k, sparsity); };
  return r;
}

Row embed_row(DType w, int64_t n_vocab, int64_t d, int64_t t) {
  Row r;
  r.name = "EMBED_" + dn(w) + "_v" + std::to_string(n_vocab) + "_d" + std::to_string(d) + "_t" + std::to_string(t);
  r.build = [=](std::mt19937& rng) { return embed(rng, w, n_vocab, d, t); };
  r.max_nmse_cpu = kExact;
  // CUDA: native formats dequantize as the reference does (a device FMA may move q4_1's last bit); converted formats
  // are the table rounded to bf16.
  r.max_nmse_cuda = float_format(w) || cuda_quantized(w) ? kExact : kX16;
  return r;
}

Row rmsnorm_row(int64_t t, int64_t d) {
  return {"RMSNORM_t" + std::to_string(t) + "_d" + std::to_string(d),
          [=](std::mt19937& rng) { return rmsnorm(rng, t, d); }, kF32, kF32};
}

// CUDA forms the angle pos * inv_freq in float (the CPU in double): at most half an ulp of the angle, which at the
// position-1000 row below is nMSE 2.5e-11 (numpy, over that row's pairs): under kF32 up to positions of about 2000.
Row rope_row(int64_t t, int64_t heads, int64_t hd, int64_t rope_dim, bool neox, int64_t p0) {
  return {"ROPE_t" + std::to_string(t) + "_h" + std::to_string(heads) + "_hd" + std::to_string(hd) + "_r" +
              std::to_string(rope_dim) + (neox ? "_neox" : "_norm") + "_p" + std::to_string(p0),
          [=](std::mt19937& rng) { return rope(rng, t, heads, hd, rope_dim, neox, p0); }, kF32, kF32};
}

Row kv_store_row(DType cache, int64_t t, int64_t n_kv, int64_t hd, int64_t n_ctx, int64_t p0) {
  return {"KV_STORE_" + dn(cache) + "_t" + std::to_string(t) + "_kv" + std::to_string(n_kv) + "_hd" +
              std::to_string(hd) + "_p" + std::to_string(p0),
          [=](std::mt19937& rng) { return kv_store(rng, cache, t, n_kv, hd, n_ctx, p0); }, kExact, kExact};
}

Row attention_row(DType cache, int64_t t, int64_t n_head, int64_t n_kv, int64_t hd, int64_t n_ctx, int64_t p0,
                  int64_t window = 0) {
  Row r;
  r.name = "ATTENTION_" + dn(cache) + "_t" + std::to_string(t) + "_h" + std::to_string(n_head) + "_kv" +
           std::to_string(n_kv) + "_hd" + std::to_string(hd) + "_p" + std::to_string(p0) +
           (window > 0 ? "_w" + std::to_string(window) : "");
  r.build = [=](std::mt19937& rng) { return attention(rng, cache, t, n_head, n_kv, hd, n_ctx, p0, window); };
  r.max_nmse_cpu = kF32;
  r.max_nmse_cuda = t > 1 && cache != DType::F32 ? kAttn16 : kF32;
  return r;
}

Row add_row(int64_t t, int64_t d) {
  return {"ADD_t" + std::to_string(t) + "_d" + std::to_string(d), [=](std::mt19937& rng) { return add(rng, t, d); },
          kExact, kExact};
}

Row swiglu_row(int64_t t, int64_t f) {
  return {"SWIGLU_t" + std::to_string(t) + "_f" + std::to_string(f),
          [=](std::mt19937& rng) { return swiglu(rng, t, f); }, kF32, kF32};
}

Row last_row_row(int64_t t, int64_t d) {
  return {"LAST_ROW_t" + std::to_string(t) + "_d" + std::to_string(d),
          [=](std::mt19937& rng) { return last_row(rng, t, d); }, kExact, kExact};
}

const std::vector<Row>& rows() {
  static const std::vector<Row> kRows = [] {
    std::vector<Row> v = {
        // op               shape and dtype
        embed_row(DType::F32, 300, 576, 5), embed_row(DType::F16, 300, 576, 5), embed_row(DType::BF16, 300, 576, 5),
        embed_row(DType::Q8_0, 300, 576, 5), embed_row(DType::Q4_0, 300, 576, 5), embed_row(DType::Q4_1, 300, 576, 5),
        embed_row(DType::Q2_K, 300, 512, 5), embed_row(DType::Q3_K, 300, 512, 5), embed_row(DType::Q4_K, 300, 512, 5),
        embed_row(DType::Q5_K, 300, 512, 5), embed_row(DType::Q6_K, 300, 512, 5), embed_row(DType::Q5_0, 300, 576, 5),
        embed_row(DType::Q5_1, 300, 576, 5), embed_row(DType::IQ4_NL, 300, 576, 5),
        embed_row(DType::IQ4_XS, 300, 512, 5), embed_row(DType::TQ1_0, 300, 512, 5),
        embed_row(DType::TQ2_0, 300, 512, 5), rmsnorm_row(1, 576), rmsnorm_row(7, 4096), rmsnorm_row(3, 6),
        rope_row(1, 9, 64, 64, false, 37), rope_row(5, 8, 128, 128, true, 1000), rope_row(3, 4, 64, 32, false, 0),
        kv_store_row(DType::F16, 1, 3, 64, 64, 17), kv_store_row(DType::F16, 9, 8, 128, 64, 40),
        kv_store_row(DType::F32, 4, 2, 64, 32, 0), attention_row(DType::F16, 1, 9, 3, 64, 128, 70),
        attention_row(DType::F32, 1, 8, 8, 128, 64, 33), attention_row(DType::F16, 40, 8, 2, 64, 128, 20),
        attention_row(DType::F16, 64, 4, 4, 128, 128, 0), attention_row(DType::F32, 17, 8, 2, 64, 64, 5),
        // Sliding windows (Mistral, Gemma 3's local layers): decode, a prefill chunk whose queries' windows start in
        // different key blocks, and one with a window shorter than a key block.
        attention_row(DType::F16, 1, 8, 2, 64, 256, 150, 100), attention_row(DType::F16, 40, 8, 2, 64, 256, 90, 70),
        attention_row(DType::F32, 17, 4, 1, 32, 64, 20, 5),
        // Head size 256 (Gemma 3: 4 heads over 1 kv head): decode, prefill chunks over 16-bit and f32 caches (key
        // tiles of 32 and 16), a windowed chunk as its local layers run, and a windowed decode step.
        attention_row(DType::F16, 1, 4, 1, 256, 128, 45), attention_row(DType::F16, 70, 4, 1, 256, 128, 30),
        attention_row(DType::F32, 37, 4, 1, 256, 64, 11), attention_row(DType::F16, 50, 4, 1, 256, 128, 60, 40),
        attention_row(DType::F16, 1, 4, 1, 256, 768, 600, 512),  // decode past Gemma 3's 512-token window
        add_row(1, 576), add_row(7, 1000), swiglu_row(1, 1536),
        swiglu_row(5, 1000), last_row_row(1, 576), last_row_row(9, 576),
        simple_row(graph::Op::SCALE, {{7, 1000}}, {.scale = -0.75f}, kExact, kExact),
        // The families' ops: their registered kernels are both CPU modes (so exact); their values are checked
        // against the test's own arithmetic below.
        simple_row(graph::Op::GEGLU, {{5, 1000}, {5, 1000}}, {}, kExact, kExact),
        simple_row(graph::Op::HEAD_RMSNORM, {{3, 64}, {16}}, {.eps = 1e-6f, .head_dim = 16}, kExact, kExact),
        simple_row(graph::Op::BIAS_ADD, {{5, 96}, {96}}, {}, kExact, kExact),
        simple_row(graph::Op::SOFTCAP, {{3, 1000}}, {.scale = 1.5f}, kExact, kExact),
        // Ternary models (tests/ops/test_ops_ternary.cpp checks their values).
        simple_row(graph::Op::ACT_QUANT_I8, {{5, 1000}}, {}, kExact, kExact),
        simple_row(graph::Op::ACT_QUANT_I8, {{1, 2560}}, {}, kExact, kExact),
        simple_row(graph::Op::RELU2_GLU, {{5, 1000}, {5, 1000}}, {}, kExact, kExact),
        // MLGRU on CUDA: expf within 2 ulp of the host's, carried through the steps.
        Row{"MLGRU_t1_d1024_p7", [](std::mt19937& rng) { return mlgru(rng, 1, 1024, 7); }, kExact, kF32},
        Row{"MLGRU_t9_d2048_p0", [](std::mt19937& rng) { return mlgru(rng, 9, 2048, 0); }, kExact, kF32},
        // Fused nodes (graph passes: matmul + epilogue, stacked matmuls, rope + cache store + attention) add their
        // rows here when the passes emit them, each against the reference of the nodes it replaces.
    };
    // MATMUL: every format Tessera reads (native and converted at load) at the three CUDA paths' row counts: one row
    // (GEMV), a few rows (multi-row GEMV for quantized, cuBLASLt for float weights), and a prefill chunk (cuBLASLt).
    for (const DType w : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                          DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL,
                          DType::IQ4_XS, DType::TQ1_0, DType::TQ2_0})
      for (const int64_t t : {1, 7, 64}) v.push_back(matmul_row(w, t, 96, dtype_info(w).block_size == 256 ? 512 : 576));
    v.push_back(matmul_row(DType::Q4_1, 3, 1000, 1536));  // N not a multiple of the CPU's 8-row groups
    v.push_back(matmul_row(DType::Q6_K, 1, 256, 1536));
    v.push_back(matmul_row(DType::Q4_K, 9, 1001, 768));  // N odd: a partial 8-row group and 16-row AVX-512 pass
    // CUDA's tile GEMM (GemmPath::TILE, quant_gemm=auto up to 512 rows; the t = 64 rows above take it too, for every
    // format with a tile kernel): 128-token tiles with K split in 4 (520 rows: a partial last W tile), and for q4_K
    // 256-token tiles over two token tiles without a split (the partial sums would not fit the op's scratch), 264 rows:
    // 8 past the last full W tile.
    for (const DType w : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q2_K, DType::Q3_K, DType::Q5_0, DType::Q5_1,
                          DType::IQ4_NL, DType::IQ4_XS})
      v.push_back(matmul_row(w, 128, 520, 2048));
    v.push_back(matmul_row(DType::Q4_K, 512, 264, 1536));
    v.push_back(matmul_row(DType::Q5_K, 67, 200, 256));
    // q2_K and q3_K as q4_K's and q5_K's rows: an odd N over several 4-row warps, a lone super-block per row, and the
    // decode GEMV at a longer row; q5_0 / q5_1's decode GEMV with an odd number of 32-blocks in the matrix (97 x 17:
    // q5_0's qh tail on a 2-byte boundary; enough rows for a steady nMSE).
    for (const DType w : {DType::Q2_K, DType::Q3_K}) {
      v.push_back(matmul_row(w, 9, 1001, 768));
      v.push_back(matmul_row(w, 67, 200, 256));
      v.push_back(matmul_row(w, 1, 256, 1536));
    }
    for (const DType w : {DType::Q5_0, DType::Q5_1}) v.push_back(matmul_row(w, 1, 97, 544));
    for (const DType w : {DType::TQ1_0, DType::TQ2_0})  // ternary: a partial 8-row group and 16-row AVX-512 pass
      for (const int64_t t : {3, 67}) v.push_back(matmul_row(w, t, 1001, 768));
    // Ternary on CUDA's paths at decode and prefill shapes: the GEMV over 4096- and 14336-wide rows (32 and 112 of its
    // 128-element units: a thread's last step part full), the multi-row GEMV past one chunk of 8 rows, and a prefill
    // chunk (expanded to bf16 for cuBLASLt).
    for (const DType w : {DType::TQ1_0, DType::TQ2_0}) {
      v.push_back(matmul_row(w, 1, 1024, 4096));
      v.push_back(matmul_row(w, 1, 256, 14336));
      v.push_back(matmul_row(w, 12, 200, 1024));
      v.push_back(matmul_row(w, 130, 300, 1024));
    }
    // iq4_nl's decode GEMV where CUDA takes its x-stationary kernel (K = 4096, N >= 14336), N leaving the last block
    // of four rows partial.
    v.push_back(matmul_row(DType::IQ4_NL, 1, 14338, 4096));
    for (const DType w : {DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS})  // partial CPU row groups
      for (const int64_t t : {3, 67}) v.push_back(matmul_row(w, t, 1000, 1536));
    // TEAL: SPARSIFY by top-k per row and by threshold; MATMUL_SPARSE per format at 50% (and 90%, 0%: whole blocks
    // skipped, none skipped), N not a multiple of the 32-row tiles, several rows.
    v.push_back(simple_row(graph::Op::SPARSIFY, {{7, 1000}}, {.sparsity = 0.5f}, kExact, kExact));
    v.push_back(simple_row(graph::Op::SPARSIFY, {{3, 576}}, {.sparse_threshold = 0.7f}, kExact, kExact));
    for (const DType w : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1})
      v.push_back(matmul_sparse_row(w, 1, 96, 576, 0.5f));
    v.push_back(matmul_sparse_row(DType::Q4_1, 1, 1000, 1536, 0.9f));
    v.push_back(matmul_sparse_row(DType::Q8_0, 1, 200, 576, 0.0f));
    v.push_back(matmul_sparse_row(DType::F16, 3, 1000, 576, 0.65f));
    v.push_back(matmul_sparse_row(DType::Q4_0, 2, 40, 64, 0.5f));
    v.push_back(matmul_sparse_row(DType::Q6_K, 1, 64, 512, 0.5f));   // converted to f16 at load: the f16 sparse kernel
    v.push_back(matmul_sparse_row(DType::Q4_K, 1, 96, 512, 0.5f));   // the q4_1 sparse kernel on a q4_1 copy
    v.push_back(matmul_sparse_row(DType::TQ2_0, 1, 96, 512, 0.5f));  // no sparse path: the dense kernel on the zeroed x
    // CUDA's sparse GEMV at a Llama-3-8B width: 64-row tiles, the split form over a long list.
    v.push_back(matmul_sparse_row(DType::BF16, 1, 1000, 4096, 0.5f));
    v.push_back(matmul_sparse_row(DType::F16, 1, 4096, 1024, 0.97f));
    return v;
  }();
  return kRows;
}

using Param = std::tuple<size_t, Backend>;

class OpTable : public ::testing::TestWithParam<Param> {};

TEST_P(OpTable, MatchesReference) {
  const Row& row = rows()[std::get<0>(GetParam())];
  const Backend be = std::get<1>(GetParam());
  if (be == Backend::CUDA) {
    const std::string why = cuda_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    if (!row.cuda) GTEST_SKIP() << row.why;
  }
  const uint32_t s = seed();
  SCOPED_TRACE(::testing::Message() << "TESSERA_TEST_SEED=" << s);
  std::mt19937 rng(s);
  const OpGraph og = row.build(rng);
  const std::vector<float> ref = run_cpu(og, true);
  std::vector<float> out;
  if (be == Backend::CPU) {
    out = run_cpu(og, false);
  } else {
    std::optional<std::vector<float>> y = run_cuda(og);
    if (!y) {
      GTEST_SKIP() << graph::op_name(og.node().op) << " has no CUDA kernel";
    }
    out = std::move(*y);
  }
  ASSERT_EQ(out.size(), ref.size());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(std::isfinite(out[i])) << "element " << i << " is " << out[i];
  const double e = nmse(out, ref);
  const double limit = be == Backend::CPU ? row.max_nmse_cpu : row.max_nmse_cuda;
  std::printf("[ nmse     ] %s on %s: %.3e (limit %.0e)\n", row.name.c_str(), backend_name(be), e, limit);
  EXPECT_LE(e, limit) << row.name << " on " << backend_name(be);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable,
                         ::testing::Combine(::testing::Range<size_t>(0, rows().size()),
                                            ::testing::Values(Backend::CPU, Backend::CUDA)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return rows()[std::get<0>(info.param)].name + "_" + backend_name(std::get<1>(info.param));
                         });

TEST(OpTable, NamesAreUnique) {
  std::set<std::string> seen;
  for (const Row& r : rows()) EXPECT_TRUE(seen.insert(r.name).second) << r.name;
}

// Every graph op a builder can make has at least one row (a new op in graph.h fails here until the table covers it);
// ops made by the passes only come with the fused nodes' rows.
TEST(OpTable, EveryOpHasARow) {
  std::set<graph::Op> ops;
  std::mt19937 rng(1);
  for (const Row& r : rows()) ops.insert(r.build(rng).node().op);
  for (size_t i = 0; i < static_cast<size_t>(graph::Op::COUNT); ++i) {
    const graph::OpInfo& op = graph::op_info(static_cast<graph::Op>(i));
    EXPECT_TRUE(op.traits.pass_only || ops.count(op.op)) << op.name << " has no row";
  }
}

// SCALE, the test-only op the recipe for adding an op was proven with (docs/ARCHITECTURE.md, "Recipes"): its shape
// check and cost model, and its CPU kernel against x * s computed here (the table's row compares the kernel with
// itself, as the registry's kernel is both modes' reference).
TEST(OpScale, ShapeCostAndTraits) {
  graph::Graph g(7, 0);
  const int x = g.add_input("x", DType::F32, {7, 1000});
  const int y = g.add_node("y", graph::Op::SCALE, graph::Role::NONE, 0, "test", {x}, {.scale = 2.0f});
  EXPECT_EQ(g.tensor(y).shape, (std::vector<int64_t>{7, 1000}));
  EXPECT_EQ(g.tensor(y).dtype, DType::F32);
  EXPECT_EQ(g.node(0).flops, 7000u);          // one multiply per element
  EXPECT_EQ(g.node(0).bytes, 2u * 7000 * 4);  // x read, y written
  EXPECT_EQ(graph::op_name(graph::Op::SCALE), "scale");
  EXPECT_EQ(graph::op_class(graph::Op::SCALE), "elementwise");
  EXPECT_FALSE(graph::op_info(graph::Op::SCALE).traits.test_only);  // Gemma's embedding scale since
  EXPECT_TRUE(graph::may_write_over_input(graph::Op::SCALE, 0));
  EXPECT_FALSE(graph::is_view(graph::Op::SCALE));
  const int ids = g.add_input("ids", DType::I32, {7});
  EXPECT_THROW(g.add_node("ints", graph::Op::SCALE, graph::Role::NONE, 0, "test", {ids}), Error);
  EXPECT_THROW(g.add_node("two", graph::Op::SCALE, graph::Role::NONE, 0, "test", {x, x}), Error);
}

TEST(OpScale, CpuKernelMultipliesEveryElement) {
  std::mt19937 rng(3);
  const OpGraph og = simple(rng, graph::Op::SCALE, {{5, 33}}, {.scale = -0.75f});
  const std::vector<uint8_t>& bytes = og.inputs.at("x0");
  std::vector<float> x(bytes.size() / sizeof(float));
  std::memcpy(x.data(), bytes.data(), bytes.size());
  for (const bool reference : {true, false}) {
    const std::vector<float> y = run_cpu(og, reference);
    ASSERT_EQ(y.size(), x.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i] * -0.75f) << "element " << i;
  }
}

// The families' ops: shape checks, costs, and the CPU kernels (both modes) against values computed here.
std::vector<float> floats_of(const std::vector<uint8_t>& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

// Runs both CPU modes and checks each output element against want(i) within a relative 1e-5 (float rounding).
template <typename F>
void expect_kernel(const OpGraph& og, F&& want) {
  for (const bool reference : {true, false}) {
    const std::vector<float> y = run_cpu(og, reference);
    for (size_t i = 0; i < y.size(); ++i) {
      const double w = want(i);
      ASSERT_NEAR(y[i], w, 1e-5 * std::max(1.0, std::abs(w))) << "element " << i << (reference ? " (reference)" : "");
    }
  }
}

TEST(OpFamilies, Geglu) {
  std::mt19937 rng(5);
  OpGraph og = simple(rng, graph::Op::GEGLU, {{3, 77}, {3, 77}});
  // Gates over [-12, 12], not only the random [-1, 1]: the AVX2 loop's e^(-2z) saturates at both ends (geglu_avx2.cpp).
  std::vector<float> gate(3 * 77);
  for (size_t i = 0; i < gate.size(); ++i)
    gate[i] = -12.0f + 24.0f * static_cast<float>(i) / static_cast<float>(gate.size() - 1);
  std::memcpy(og.inputs.at("x0").data(), gate.data(), gate.size() * sizeof(float));
  const auto g = floats_of(og.inputs.at("x0")), u = floats_of(og.inputs.at("x1"));
  expect_kernel(og, [&](size_t i) {
    const double x = g[i];
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
  });
  EXPECT_EQ(og.g.node(0).flops, 10u * 3 * 77);
  graph::Graph bad(3, 0);
  const int a = bad.add_input("a", DType::F32, {3, 4}), b = bad.add_input("b", DType::F32, {3, 5});
  EXPECT_THROW(bad.add_node("act", graph::Op::GEGLU, graph::Role::FFN_ACT, 0, "ffn", {a, b}), Error);
}

TEST(OpFamilies, HeadRmsnorm) {
  std::mt19937 rng(6);
  const int64_t d = 8;
  const OpGraph og = simple(rng, graph::Op::HEAD_RMSNORM, {{2, 3 * d}, {d}}, {.eps = 1e-6f, .head_dim = d});
  const auto x = floats_of(og.inputs.at("x0")), w = floats_of(og.inputs.at("x1"));
  expect_kernel(og, [&](size_t i) {
    const size_t head = i / d;  // each head of each row is normalized on its own
    double ss = 0;
    for (size_t j = head * d; j < head * d + d; ++j) ss += double(x[j]) * x[j];
    return x[i] / std::sqrt(ss / d + 1e-6) * w[i % d];
  });
  graph::Graph bad(2, 0);
  const int xi = bad.add_input("x", DType::F32, {2, 24}), w9 = bad.add_input("w", DType::F32, {9});
  const int w8 = bad.add_input("w8", DType::F32, {8});
  EXPECT_THROW(bad.add_node("n", graph::Op::HEAD_RMSNORM, graph::Role::ATTN_Q_NORM, 0, "attn", {xi, w9},
                            {.eps = 1e-6f, .head_dim = 9}),
               Error);  // 9 does not divide 24
  EXPECT_THROW(bad.add_node("n2", graph::Op::HEAD_RMSNORM, graph::Role::ATTN_Q_NORM, 0, "attn", {xi, w9},
                            {.eps = 1e-6f, .head_dim = 8}),
               Error);  // weight is not [8]
  EXPECT_NO_THROW(bad.add_node("n3", graph::Op::HEAD_RMSNORM, graph::Role::ATTN_Q_NORM, 0, "attn", {xi, w8},
                               {.eps = 1e-6f, .head_dim = 8}));
}

TEST(OpFamilies, BiasAdd) {
  std::mt19937 rng(7);
  const OpGraph og = simple(rng, graph::Op::BIAS_ADD, {{4, 40}, {40}});
  const auto x = floats_of(og.inputs.at("x0")), b = floats_of(og.inputs.at("x1"));
  expect_kernel(og, [&](size_t i) { return double(x[i]) + b[i % 40]; });
  graph::Graph bad(4, 0);
  const int xi = bad.add_input("x", DType::F32, {4, 40}), bi = bad.add_input("b", DType::F32, {41});
  EXPECT_THROW(bad.add_node("y", graph::Op::BIAS_ADD, graph::Role::ATTN_Q_BIAS, 0, "attn", {xi, bi}), Error);
}

TEST(OpFamilies, Softcap) {
  std::mt19937 rng(8);
  const OpGraph og = simple(rng, graph::Op::SOFTCAP, {{2, 50}}, {.scale = 1.5f});
  const auto x = floats_of(og.inputs.at("x0"));
  expect_kernel(og, [&](size_t i) { return 1.5 * std::tanh(x[i] / 1.5); });
  graph::Graph bad(2, 0);
  const int xi = bad.add_input("x", DType::F32, {2, 50});
  EXPECT_THROW(bad.add_node("y", graph::Op::SOFTCAP, graph::Role::OUTPUT_SOFTCAP, -1, "output", {xi}), Error);  // cap 0
}

// A sliding window of w is attention over the last w keys only: the same kernel without a window, run on a view of
// the cache that starts w - 1 positions before the query, must give the same row (both CPU paths, decode and chunk).
TEST(OpFamilies, SlidingWindowAttendsToTheLastKeysOnly) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t n_head = 4, n_kv = 2, hd = 64, n_ctx = 200, t = 30, p0 = 100, window = 37;
  std::vector<float> kc(n_kv * n_ctx * hd), vc(kc.size()), q(t * n_head * hd);
  for (float* v : {kc.data(), vc.data()})
    for (size_t i = 0; i < kc.size(); ++i) v[i] = dist(rng);
  for (float& v : q) v = dist(rng);
  const cpu::KvView k = cpu::kv_head_major(DType::F32, kc.data(), n_ctx, n_kv, hd);
  const cpu::KvView v = cpu::kv_head_major(DType::F32, vc.data(), n_ctx, n_kv, hd);
  ThreadPool pool(2);
  std::vector<float> fast(q.size()), ref(q.size()), want(n_head * hd);
  cpu::attention(pool, q.data(), k, v, fast.data(), t, n_head, n_kv, hd, p0, 0.125f, window);
  cpu::attention_ref(q.data(), k, v, ref.data(), t, n_head, n_kv, hd, p0, 0.125f, window);
  std::vector<float> dec(n_head * hd);
  cpu::attention(pool, q.data() + (t - 1) * n_head * hd, k, v, dec.data(), 1, n_head, n_kv, hd, p0 + t - 1, 0.125f,
                 window);
  for (int64_t i = 0; i < t; ++i) {
    const int64_t pos = p0 + i, first = pos - window + 1;
    cpu::KvView ks = k, vs = v;  // positions [first, pos] as positions [0, window)
    ks.data = kc.data() + first * hd;
    vs.data = vc.data() + first * hd;
    ks.n_ctx = vs.n_ctx = window;
    cpu::attention_ref(q.data() + i * n_head * hd, ks, vs, want.data(), 1, n_head, n_kv, hd, window - 1, 0.125f);
    for (int64_t j = 0; j < n_head * hd; ++j) {
      ASSERT_NEAR(ref[i * n_head * hd + j], want[j], 1e-5) << "reference, token " << i;
      ASSERT_NEAR(fast[i * n_head * hd + j], want[j], 1e-5) << "fast, token " << i;
      if (i == t - 1) {
        ASSERT_NEAR(dec[j], want[j], 1e-5) << "decode";
      }
    }
  }
}

// SPARSIFY (TEAL): shape check and cost, and the kernel against the rule computed here: top-k keeps exactly
// K - floor(s K) entries per row, the largest magnitudes, unchanged; a threshold zeroes |x| <= t and keeps the rest.
TEST(OpSparsify, ShapeCostAndKernel) {
  graph::Graph g(2, 0);
  const int x = g.add_input("x", DType::F32, {2, 100});
  const int y = g.add_node("y", graph::Op::SPARSIFY, graph::Role::NONE, 0, "ffn", {x}, {.sparsity = 0.4f});
  EXPECT_EQ(g.tensor(y).shape, (std::vector<int64_t>{2, 100}));
  EXPECT_EQ(g.node(0).bytes, 2u * 200 * 4);
  EXPECT_TRUE(graph::may_write_over_input(graph::Op::SPARSIFY, 0));
  EXPECT_THROW(g.add_node("bad", graph::Op::SPARSIFY, graph::Role::NONE, 0, "ffn", {x}, {.sparsity = 1.0f}), Error);
  EXPECT_TRUE(graph::is_matmul_like(graph::Op::MATMUL_SPARSE));

  std::mt19937 rng(5);
  for (const float s : {0.0f, 0.25f, 0.5f, 0.65f}) {
    const OpGraph og = simple(rng, graph::Op::SPARSIFY, {{4, 577}}, {.sparsity = s});
    std::vector<float> in(4 * 577);
    std::memcpy(in.data(), og.inputs.at("x0").data(), in.size() * sizeof(float));
    const std::vector<float> out = run_cpu(og, false);
    for (int r = 0; r < 4; ++r) {
      std::vector<float> mag(577);
      for (int c = 0; c < 577; ++c) mag[c] = std::fabs(in[r * 577 + c]);
      std::sort(mag.begin(), mag.end());
      const int drop = static_cast<int>(std::floor(s * 577.0));
      const float cut = drop > 0 ? mag[drop - 1] : -1.0f;  // random floats: no ties
      int zeros = 0;
      for (int c = 0; c < 577; ++c) {
        const float v = in[r * 577 + c], o = out[r * 577 + c];
        if (std::fabs(v) <= cut) {
          ASSERT_EQ(o, 0.0f) << "row " << r << " col " << c;
          ++zeros;
        } else {
          ASSERT_EQ(o, v);
        }
      }
      EXPECT_EQ(zeros, drop);
    }
  }
  const OpGraph og = simple(rng, graph::Op::SPARSIFY, {{3, 64}}, {.sparse_threshold = 0.5f});
  std::vector<float> in(3 * 64);
  std::memcpy(in.data(), og.inputs.at("x0").data(), in.size() * sizeof(float));
  const std::vector<float> out = run_cpu(og, true);
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], std::fabs(in[i]) <= 0.5f ? 0.0f : in[i]);
}

// Top-k with ties at the cut and zeros already in the row: exactly floor(s k) entries go, the tied ones first in
// index order, and the count of zeros written includes the row's own zeros once.
TEST(OpSparsify, TopKDropsTiesFirstInIndexOrder) {
  std::mt19937 rng(6);
  OpGraph og = simple(rng, graph::Op::SPARSIFY, {{1, 10}}, {.sparsity = 0.5f});
  const std::vector<float> in = {0.5f, -0.5f, 0.1f, 0.5f, 0.0f, -0.0f, 2.0f, -0.5f, 3.0f, 0.5f};
  std::memcpy(og.inputs.at("x0").data(), in.data(), in.size() * sizeof(float));
  // drop 5: the two zeros, 0.1 and the first two of the five |x| = 0.5 (columns 0 and 1)
  const std::vector<float> want = {0.0f, 0.0f, 0.0f, 0.5f, 0.0f, 0.0f, 2.0f, -0.5f, 3.0f, 0.5f};
  for (const bool reference : {false, true}) {
    cpu::reset_sparsity_counts();
    const std::vector<float> out = run_cpu(og, reference);
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], want[i]) << "column " << i << " reference " << reference;
    EXPECT_EQ(cpu::sparsity_counts().zeros, 5u);
    EXPECT_EQ(cpu::sparsity_counts().total, 10u);
  }
}

}  // namespace
}  // namespace tessera::ops_test
