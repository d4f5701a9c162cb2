// Weight formats on the GPU: the CUDA format table, the SPLIT_Q layout's round trip (no GPU needed), whole models
// laid out as llama-quantize lays out its K-quant files and the default model requantized to Q6_K by llama-quantize,
// CUDA logits against the CPU's (GPU only; scripts/gpu_check.sh runs them).
//
// Tolerance (models): the CPU converts the K-quant weights to f16 and runs them with f32 activations; CUDA reads them
// natively with 8-bit activations (as it reads q8_0), which moves each dot product by at most sum |w| dx / 2 and in
// practice by what test_backend_cuda.cpp measured for q8_0 (a few tenths of a percent through two layers). 3% relative
// L2 error on the logits leaves the same margin as that test's quantized rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/split_layout.h"
#include "cuda_test_util.h"
#include "formats/gguf.h"
#include "quant/format_support.h"
#include "quant/format_traits.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

// ---- Host side: runs without a GPU ----

TEST(CudaWeightFormats, TableNamesTheNativeFormatsAndTheFallback) {
  const FormatSupport& f = cuda::weight_formats();
  EXPECT_EQ(f.native_names(),
            "f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, q5_0, q5_1, q2_k, q3_k, tq2_0 and "
            "tq1_0");
  EXPECT_EQ(f.fallback(), DType::BF16);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                  DType::TQ2_0, DType::TQ1_0}) {
    EXPECT_TRUE(cuda::gemv_supports(t)) << dtype_name(t);
    EXPECT_EQ(cuda::device_weight_dtype(t), t) << dtype_name(t);
  }
  EXPECT_TRUE(cuda::gemv_quantized(DType::Q4_1));
  EXPECT_TRUE(cuda::gemv_quantized(DType::Q4_K)) << "a native K-quant is read with 8-bit activations";
  EXPECT_TRUE(cuda::gemv_quantized(DType::Q5_K));
  EXPECT_TRUE(cuda::gemv_quantized(DType::Q6_K));
  EXPECT_TRUE(cuda::gemv_quantized(DType::IQ4_NL));
  EXPECT_TRUE(cuda::gemv_quantized(DType::IQ4_XS));
  for (DType t : {DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K})
    EXPECT_TRUE(cuda::gemv_quantized(t)) << dtype_name(t);
  EXPECT_TRUE(cuda::gemv_quantized(DType::TQ2_0)) << "ternary weights are read with 8-bit activations";
  EXPECT_TRUE(cuda::gemv_quantized(DType::TQ1_0));
  EXPECT_FALSE(cuda::gemv_quantized(DType::BF16));
  // Every other format Tessera reads runs as bf16 (the ternary tq1_0 and tq2_0 at this commit).
  for (const FormatInfo& fi : formats()) {
    if (!f.is_native(fi.type)) {
      EXPECT_EQ(cuda::device_weight_dtype(fi.type), DType::BF16) << dtype_name(fi.type);
    }
  }
  try {
    cuda::device_weight_dtype(DType::IQ2_XXS);
    ADD_FAILURE() << "no error for a format Tessera cannot read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iq2_xxs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("q2_k, q3_k, tq2_0 and tq1_0"), std::string::npos) << e.what();
  }
}

// The SPLIT_Q layout moves bytes only: splitting every block and joining it back gives the file's block, and the
// parts land where the kernels read them (q6_K's d in the tail after all scales). No GPU needed.
template <DType D>
void check_split_round_trip(std::mt19937& rng) {
  using L = cuda::SplitLayout<D>;
  using B = typename Format<D>::Block;
  const int64_t n = 3, k = 2 * Format<D>::kBlockSize;
  const std::vector<uint8_t> w = cuda::test::random_weight(rng, D, n, k);
  const size_t nb = static_cast<size_t>(n * k / Format<D>::kBlockSize);
  std::vector<uint8_t> quants(nb * L::kQuantBytes), scales(nb * (L::kScaleBytes + L::kTailBytes));
  for (size_t i = 0; i < nb; ++i) {
    B b;
    std::memcpy(&b, w.data() + i * sizeof(B), sizeof(B));
    cuda::split_block<D>(b, quants.data() + i * L::kQuantBytes, scales.data() + i * L::kScaleBytes,
                         scales.data() + nb * L::kScaleBytes + i * L::kTailBytes);
  }
  const cuda::SplitPtrs<D> p{quants.data(), scales.data(), nb};
  for (size_t i = 0; i < nb; ++i) {
    B b;
    cuda::join_block<D>(p, i, b);
    EXPECT_EQ(std::memcmp(&b, w.data() + i * sizeof(B), sizeof(B)), 0) << dtype_name(D) << " block " << i;
  }
}

TEST(CudaWeightFormats, SplitLayoutRoundTrips) {
  std::mt19937 rng(cuda::test::test_seed());
  check_split_round_trip<DType::Q8_0>(rng);
  check_split_round_trip<DType::Q4_0>(rng);
  check_split_round_trip<DType::Q4_1>(rng);
  check_split_round_trip<DType::Q4_K>(rng);
  check_split_round_trip<DType::Q5_K>(rng);
  check_split_round_trip<DType::Q6_K>(rng);
  check_split_round_trip<DType::IQ4_NL>(rng);
  check_split_round_trip<DType::IQ4_XS>(rng);
  check_split_round_trip<DType::Q5_0>(rng);
  check_split_round_trip<DType::Q5_1>(rng);
  check_split_round_trip<DType::Q2_K>(rng);
  check_split_round_trip<DType::Q3_K>(rng);
  check_split_round_trip<DType::TQ2_0>(rng);
  // Where the K-quant kernels read a block's parts (quant_units.h): q4_K's head is d, dmin and the packed scales;
  // q6_K's quants are ql then qh, its d follows every block's scales.
  static_assert(cuda::SplitLayout<DType::Q4_K>::kQuantOff == offsetof(BlockQ4_K, qs));
  static_assert(cuda::SplitLayout<DType::Q6_K>::kQuantOff == offsetof(BlockQ6_K, ql) &&
                offsetof(BlockQ6_K, qh) == 128 && cuda::SplitLayout<DType::Q6_K>::kTailOff == offsetof(BlockQ6_K, d));
  // q5_0 / q5_1: the nibbles are the quants, qh the tail; q2_K: qs the quants, (d, dmin) the tail; q3_K: hmask then qs
  // the quants, the packed scales the scales, d the tail.
  static_assert(cuda::SplitLayout<DType::Q5_0>::kQuantOff == offsetof(BlockQ5_0, qs) &&
                cuda::SplitLayout<DType::Q5_0>::kTailOff == offsetof(BlockQ5_0, qh));
  static_assert(cuda::SplitLayout<DType::Q5_1>::kQuantOff == offsetof(BlockQ5_1, qs) &&
                cuda::SplitLayout<DType::Q5_1>::kTailOff == offsetof(BlockQ5_1, qh));
  static_assert(cuda::SplitLayout<DType::Q2_K>::kQuantOff == offsetof(BlockQ2_K, qs) &&
                cuda::SplitLayout<DType::Q2_K>::kScaleOff == offsetof(BlockQ2_K, scales) &&
                cuda::SplitLayout<DType::Q2_K>::kTailOff == offsetof(BlockQ2_K, d));
  static_assert(cuda::SplitLayout<DType::Q3_K>::kQuantOff == offsetof(BlockQ3_K, hmask) &&
                offsetof(BlockQ3_K, qs) == 32 &&
                cuda::SplitLayout<DType::Q3_K>::kScaleOff == offsetof(BlockQ3_K, scales) &&
                cuda::SplitLayout<DType::Q3_K>::kTailOff == offsetof(BlockQ3_K, d));
}

// convert_for_device gives the bf16 of every dequantized value for every format CUDA converts (tq1_0, tq2_0 at this
// commit),
// split over threads by rows: a row boundary slip between threads would move whole rows.
TEST(CudaWeightFormats, ConvertForDeviceIsTheBf16OfTheValues) {
  std::mt19937 rng(cuda::test::test_seed());
  int converted = 0;
  for (const FormatInfo& fi : formats()) {
    const DType dt = fi.type;
    if (cuda::weight_formats().is_native(dt)) continue;
    ++converted;
    for (const int64_t n : {1, 7, 300}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << n);
      const int64_t k = 512;
      const std::vector<uint8_t> w = cuda::test::random_weight(rng, dt, n, k);
      const std::vector<uint8_t> c = cuda::convert_for_device(dt, w.data(), n, k);
      ASSERT_EQ(c.size(), static_cast<size_t>(n * k * 2));
      std::vector<float> v(static_cast<size_t>(n * k));
      dequantize_row(dt, w.data(), v.data(), n * k);
      std::vector<uint16_t> bits(static_cast<size_t>(n * k));
      std::memcpy(bits.data(), c.data(), c.size());
      for (int64_t i = 0; i < n * k; ++i)
        ASSERT_EQ(bits[static_cast<size_t>(i)], f32_to_bf16(v[static_cast<size_t>(i)])) << "element " << i;
    }
  }
  if (converted == 0) GTEST_SKIP() << "every format Tessera reads is native on CUDA";
}

TEST(CudaWeightFormats, NativeFormatsNeedNoConversion) {
  std::vector<uint8_t> w(1024);
  for (DType t : {DType::Q4_1, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::Q5_0,
                  DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::TQ2_0, DType::TQ1_0})
    EXPECT_THROW(cuda::convert_for_device(t, w.data(), 1, 256), Error) << dtype_name(t);
  EXPECT_THROW(cuda::upload_weight(DType::IQ2_XXS, w.data(), 1, 256), Error);  // not readable at all
}

// tq1_0 is uploaded as tq2_0 (weights.cpp): the rewritten rows dequantize to the file's values bit for bit, with
// every trit of every block position (random blocks: the five-, four- and four-per-byte trit groups all vary).
TEST(CudaWeightFormats, Tq1_0AsTq2_0KeepsEveryValue) {
  std::mt19937 rng(cuda::test::test_seed());
  for (const int64_t n : {1, 5}) {
    const int64_t k = 768;
    const std::vector<uint8_t> w = cuda::test::random_weight(rng, DType::TQ1_0, n, k);
    const std::vector<uint8_t> t2 = cuda::tq1_0_as_tq2_0(w.data(), n, k);
    ASSERT_EQ(t2.size(), static_cast<size_t>(n * k / 256 * sizeof(BlockTQ2_0)));
    std::vector<float> a(static_cast<size_t>(n * k)), b(a.size());
    dequantize_row(DType::TQ1_0, w.data(), a.data(), n * k);
    dequantize_row(DType::TQ2_0, t2.data(), b.data(), n * k);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << "n=" << n << " element " << i;
  }
  std::vector<uint8_t> w(54);
  EXPECT_THROW(cuda::tq1_0_as_tq2_0(w.data(), 1, 100), Error);  // not whole blocks
}

// ---- GPU ----

// The prefill expansion in front of cuBLASLt (gemm_convert.cu's launch_dequant_bf16) writes the bf16 of the host's
// dequantized values bit for bit for every quantized format CUDA reads natively (its kernels round every product and
// sum on their own, as quant.cpp's -ffp-contract=off host code does): rows of 1, 3 and 5 super-blocks (the K-quants'
// warp per super-block: lanes that split sub-blocks, halves and the q6_K tail d after every row's scales), and row
// counts that leave a partial block of threads; rows of 17 blocks for the 32-block formats (an odd block count puts
// q5_0's qh, after every 2-byte scale, on a 2-byte boundary).
TEST(CudaWeightFormats, PrefillExpansionIsTheBf16OfTheHostValues) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(cuda::test::test_seed());
  int checked = 0;
  for (const FormatInfo& fi : formats()) {
    const DType dt = fi.type;
    if (!fi.quantized || !cuda::weight_formats().is_native(dt)) continue;
    for (const int64_t n : {1, 7, 37})
      for (const int64_t k : {256, 768, 1280, 544}) {
        if (k % static_cast<int64_t>(fi.block_size) != 0) continue;  // 544: 17 blocks of 32 (q5_0's tail 2-aligned)
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << n << " k=" << k);
        const std::vector<uint8_t> w = cuda::test::random_weight(rng, dt, n, k);
        const cuda::DeviceWeight dw = cuda::upload_weight(dt, w.data(), n, k);
        cuda::DeviceBuffer out = cuda::test::poisoned(static_cast<size_t>(n * k) * 2);
        cuda::detail::launch_dequant_bf16(dw, out.as<uint16_t>(), nullptr);
        cuda::synchronize();
        const std::vector<uint16_t> got = cuda::test::to_host<uint16_t>(out, static_cast<size_t>(n * k));
        std::vector<float> v(static_cast<size_t>(n * k));
        dequantize_row(dt, w.data(), v.data(), n * k);
        for (int64_t i = 0; i < n * k; ++i)
          ASSERT_EQ(got[static_cast<size_t>(i)], f32_to_bf16(v[static_cast<size_t>(i)])) << "element " << i;
        ++checked;
      }
  }
  EXPECT_GE(checked, 12 * 9);
}

// ---- Whole models (GPU) ----

struct Layout {
  std::string name;
  int64_t n_embd, n_head, n_kv, hd, n_ff, n_vocab, n_layers;
  std::function<DType(const std::string&)> dtype_of;  // a weight's format by its GGUF name
};

// llama-quantize's choices for two file types (llama.cpp's llama_tensor_get_type, by role): a Q6_K file of SmolLM2's
// shape, where only ffn_down's rows (1536) are whole q6_K blocks and every 576-wide row falls back to q8_0; and a
// Q4_K_M file of 512-wide rows, q4_K with q6_K for attn_v, ffn_down and token_embd.
const Layout kQ6K = {"smollm2_q6_k", 576, 9, 3, 64, 1536, 49152, 2, [](const std::string& n) {
                       return n.find("ffn_down") != std::string::npos ? DType::Q6_K : DType::Q8_0;
                     }};
const Layout kQ4KM = {"llama_q4_k_m", 512, 8, 4, 64, 1536, 32000, 2, [](const std::string& n) {
                        const bool six = n.find("attn_v") != std::string::npos ||
                                         n.find("ffn_down") != std::string::npos || n == "token_embd.weight";
                        return six ? DType::Q6_K : DType::Q4_K;
                      }};

// The four formats CUDA reads natively since issue 21's second part, in one model of 512-wide rows: q2_K for q, k, gate
// and up, q3_K for o and the token embedding, q5_0 for attn_v and q5_1 for ffn_down (q5_0/q5_1's 32-blocks, the
// K-quants' 16-element sub-blocks; decode, the multi-row GEMV and the prefill expansion all meet each).
const Layout kLowBits = {"llama_q2_q3_q5", 512, 8, 4, 64, 1536, 32000, 2, [](const std::string& n) {
                           if (n.find("attn_v") != std::string::npos) return DType::Q5_0;
                           if (n.find("ffn_down") != std::string::npos) return DType::Q5_1;
                           if (n.find("attn_output") != std::string::npos || n == "token_embd.weight")
                             return DType::Q3_K;
                           return DType::Q2_K;
                         }};

void write_model(const Layout& l, const std::string& path, uint32_t seed) {
  gguf::Writer w;
  const std::string a = "llama.";
  w.set("general.architecture", gguf::Value::from_string("llama"));
  w.set("general.name", gguf::Value::from_string(l.name));
  w.set(a + "context_length", gguf::Value::from_u32(4096));
  w.set(a + "embedding_length", gguf::Value::from_u32(uint32_t(l.n_embd)));
  w.set(a + "block_count", gguf::Value::from_u32(uint32_t(l.n_layers)));
  w.set(a + "feed_forward_length", gguf::Value::from_u32(uint32_t(l.n_ff)));
  w.set(a + "attention.head_count", gguf::Value::from_u32(uint32_t(l.n_head)));
  w.set(a + "attention.head_count_kv", gguf::Value::from_u32(uint32_t(l.n_kv)));
  w.set(a + "attention.key_length", gguf::Value::from_u32(uint32_t(l.hd)));
  w.set(a + "attention.value_length", gguf::Value::from_u32(uint32_t(l.hd)));
  w.set(a + "rope.dimension_count", gguf::Value::from_u32(uint32_t(l.hd)));
  w.set(a + "rope.freq_base", gguf::Value::from_f32(10000.0f));
  w.set(a + "attention.layer_norm_rms_epsilon", gguf::Value::from_f32(1e-5f));
  w.set(a + "vocab_size", gguf::Value::from_u32(uint32_t(l.n_vocab)));
  std::mt19937 rng(seed);
  // A std of 0.02 (uniform), the usual init, keeps activations finite through the layers.
  std::uniform_real_distribution<float> u(-0.02f * std::sqrt(3.0f), 0.02f * std::sqrt(3.0f));
  const auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    const DType dt = l.dtype_of(name);
    std::vector<float> x(static_cast<size_t>(shape[0] * shape[1]));
    for (float& v : x) v = u(rng);
    std::vector<uint8_t> q(*dtype_row_bytes(dt, x.size()));
    quantize_row(dt, x.data(), q.data(), static_cast<int64_t>(x.size()));
    w.add_tensor(name, dt, std::move(shape), q.data(), q.size());
  };
  const int64_t E = l.n_embd, Q = l.n_head * l.hd, KV = l.n_kv * l.hd, F = l.n_ff;
  add("token_embd.weight", {l.n_vocab, E});
  const std::vector<float> ones(static_cast<size_t>(E), 1.0f);
  for (int64_t i = 0; i < l.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    add(b + "attn_q.weight", {Q, E});
    add(b + "attn_k.weight", {KV, E});
    add(b + "attn_v.weight", {KV, E});
    add(b + "attn_output.weight", {E, Q});
    add(b + "ffn_gate.weight", {F, E});
    add(b + "ffn_up.weight", {F, E});
    add(b + "ffn_down.weight", {E, F});
    w.add_tensor(b + "attn_norm.weight", DType::F32, {E}, ones.data(), ones.size() * 4);
    w.add_tensor(b + "ffn_norm.weight", DType::F32, {E}, ones.data(), ones.size() * 4);
  }
  w.add_tensor("output_norm.weight", DType::F32, {E}, ones.data(), ones.size() * 4);
  w.write(path);
}


size_t count(const std::string& s, const std::string& what) {
  size_t c = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++c;
  return c;
}

// Logits of `ids` fed token by token on the CPU and on CUDA, and through CUDA prefill, against the CPU's.
struct Compared {
  std::vector<double> rel;  // per step, token by token
  double worst = 0, worst_prefill = 0;
  int agree = 0, steps = 0;
  std::string notices;  // stderr of the CPU and CUDA token-by-token sessions
};

Compared compare_backends(const Model& m, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const auto run = [&](const std::string& device, bool prefill) {
    Session s(m, {.n_ctx = n + 8, .n_threads = 2, .device = device});
    if (prefill) return s.eval_all_logits(ids);
    std::vector<float> all;
    for (int32_t id : ids) {
      const std::span<const float> x = s.decode(id);
      all.insert(all.end(), x.begin(), x.end());
    }
    return all;
  };
  Compared r;
  ::testing::internal::CaptureStderr();
  const std::vector<float> cpu = run("cpu", false);
  const std::vector<float> gpu = run("cuda", false);
  r.notices = ::testing::internal::GetCapturedStderr();
  std::cout << r.notices;
  const std::vector<float> gpu_prefill = run("cuda", true);
  EXPECT_EQ(gpu.size(), cpu.size());
  EXPECT_EQ(gpu_prefill.size(), cpu.size());
  if (gpu.size() != cpu.size() || gpu_prefill.size() != cpu.size()) return r;
  const size_t v = cpu.size() / static_cast<size_t>(n);
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cpu.data() + static_cast<size_t>(t) * v;
    const float* g = gpu.data() + static_cast<size_t>(t) * v;
    for (size_t i = 0; i < v; ++i) EXPECT_TRUE(std::isfinite(g[i])) << "logit " << i << " at step " << t;
    r.rel.push_back(cuda::test::rel_l2(g, c, v));
    r.worst = std::max(r.worst, r.rel.back());
    r.worst_prefill = std::max(r.worst_prefill, cuda::test::rel_l2(gpu_prefill.data() + static_cast<size_t>(t) * v, c, v));
    r.agree += std::max_element(c, c + v) - c == std::max_element(g, g + v) - g ? 1 : 0;
    ++r.steps;
  }
  std::cout << "worst relative L2 error token by token " << r.worst << ", prefill " << r.worst_prefill
            << ", top-1 agrees at " << r.agree << " of " << r.steps << " steps\n";
  return r;
}

class CudaWeightFormatsModel : public ::testing::TestWithParam<Layout> {};

TEST_P(CudaWeightFormatsModel, MatchesCpu) {
  TESSERA_REQUIRE_GPU();
  const Layout& l = GetParam();
  const std::string path = ::testing::TempDir() + "tessera-" + l.name + ".gguf";
  write_model(l, path, 17);
  const Model m = Model::load(path, {.load_tokenizer = false});
  std::filesystem::remove(path);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(l.n_vocab - 1));
  std::vector<int32_t> ids(24);
  for (int32_t& id : ids) id = tok(rng);
  const Compared r = compare_backends(m, ids);
  EXPECT_LE(r.worst, 3e-2) << l.name;
  EXPECT_LE(r.worst_prefill, 3e-2) << l.name;
  // Both backends read the K-quants natively: no conversion notice from either.
  EXPECT_EQ(count(r.notices, "tessera: cpu:"), 0u) << r.notices;
  EXPECT_EQ(count(r.notices, "tessera: cuda:"), 0u) << r.notices;
}

// The check: the default model requantized to Q6_K by llama.cpp runs on CUDA. The file is not in the
// repository; make it next to the default model with llama.cpp's tool (scripts/build_llamacpp.sh llama-quantize):
//   cd ~/.cache/tessera/models && llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf
//     SmolLM2-135M-Instruct.Q6_K.gguf Q6_K     (one command line)
// (130 MiB: its 30 ffn_down are q6_K, the 576-wide tensors fall back to q8_0). Both backends round activations to 8
// bits for the q8_0 weights, independently; against the CPU reference each sits at ~1% median relative error on this
// input (MatchesCpuOnDefaultModel in test_backend_cuda.cpp), so against each other the median step stays near 1.5%:
// 3e-2 leaves 2x. The worst step is a noisy statistic of those roundings and is not judged; top-1 must agree at 85%
// of the steps (the CPU fast path agrees with the reference at ~95%).
TEST(CudaWeightFormats, DefaultModelRequantizedToQ6_KMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  TESSERA_REQUIRE_DEFAULT_MODEL(q4_1);
  const std::string path = (std::filesystem::path(q4_1).parent_path() / "SmolLM2-135M-Instruct.Q6_K.gguf").string();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent (the comment above says how to make it)";
  const Model m = Model::load(path);
  std::vector<int32_t> ids = m.tokenizer().encode("The capital of France is Paris, and the capital of", true, false);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> tok(0, 49151);
  for (int i = 0; i < 32; ++i) ids.push_back(tok(rng));
  Compared r = compare_backends(m, ids);
  ASSERT_EQ(r.steps, static_cast<int>(ids.size()));
  std::sort(r.rel.begin(), r.rel.end());
  const double median = r.rel[r.rel.size() / 2];
  std::cout << "default model, Q6_K: median relative L2 error " << median << "\n";
  EXPECT_LE(median, 3e-2);
  EXPECT_GE(r.agree * 100, r.steps * 85);
  EXPECT_EQ(count(r.notices, "tessera: cuda:"), 0u) << r.notices;  // q6_K is native on CUDA
}

INSTANTIATE_TEST_SUITE_P(KQuantFiles, CudaWeightFormatsModel, ::testing::Values(kQ6K, kQ4KM, kLowBits),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tessera
