// Unmerged LoRA adapters on the CUDA backend inside their matmul's node (kernels_lora.h, docs/LORA.md "CUDA"):
// - CudaLoraKernels: lora_b_add and lora_b_swiglu against plain loops (a stack whose middle member has no adapter, a
//   member with two adapters of ranks that are not multiples of 8, one token and several tiles of tokens), and the
//   tensor-core path of prefill chunks from kLoraGemmMinT rows: u by split-K GEMM and lora_sum_parts, the B GEMM over
//   a block-diagonal B into f32 and 16-bit outputs;
// - CudaLoraGraph (no GPU needed): the CUDA passes keep q|k|v and gate|up stacked with every member's adapters, the
//   norm and SwiGLU epilogues and the residual epilogues, for decode and prefill chunks;
// - CudaLoraStacked: a 2-layer random SmolLM2-135M-shaped model in bf16, f16 and q8_0 with two PEFT adapters at once
//   (rank 16 and rank 5, which LoraSet pads to 8 for CUDA sessions) on all seven projections: prefill in chunks of 64
//   and 6 (the rows executor: 16-bit x copies from 5 rows on for bf16/f16, from 41 for q8_0; the tensor-core path
//   from 32 rows), bf16 also in chunks of 512 and 88, and decode steps (the one-token decoder, replayed as a CUDA
//   graph) against the CPU's logits;
// - CudaLoraChain: the matmul-chain rewrite (graph/passes/chain.h) on CUDA: a rank-48 adapter (lora_high_rank.h, the
//   CPU's LoraChain tests' writer) on a 64-wide f32 Llama, folded to x·(B·A)ᵀ by the CUDA passes in 256-row prefill
//   graphs and in none of 64 rows or one token (no GPU needed), and CUDA sessions running it against the CPU's logits,
//   one adapter after another on one model (its folded constants are keyed by content on the device).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "api/model_impl.h"
#include "backends/cuda/cuda_options.h"
#include "backends/cuda/executor_common.h"
#include "backends/cuda/kernels_lora.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "models/lora_high_rank.h"
#include "quant/quant.h"
#include "tessera/graph.h"
#include "tessera/model.h"
#include "tessera/random_model.h"
#include "tessera/session.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using cuda::test::random_floats;
using cuda::test::worst_rel;

// ---- The kernels against loops.

// B [rows, r_pad] of one member, rounded to f16 (the kernels read f16; the reference multiplies the rounded values).
struct MemberB {
  int64_t row0 = 0, rows = 0;
  int r = 0;             // 0: no adapter on this member
  std::vector<float> b;  // [rows, r_pad], rounded to f16
};

// The device layout and f16 buffer of `members` (u's columns in member order), as CudaShared::lora builds them.
cuda::LoraBLayout layout_of(std::vector<MemberB>& members, std::mt19937& rng, std::vector<uint16_t>* b16) {
  cuda::LoraBLayout l;
  l.n_members = static_cast<int>(members.size());
  int u0 = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    MemberB& mb = members[m];
    if (mb.r == 0) continue;
    const int r_pad = (mb.r + 7) / 8 * 8;
    l.row0[m] = mb.row0;
    l.rows[m] = mb.rows;
    l.r[m] = mb.r;
    l.r_pad[m] = r_pad;
    l.u0[m] = u0;
    l.b0[m] = static_cast<int64_t>(b16->size());
    mb.b.assign(static_cast<size_t>(mb.rows * r_pad), 0.0f);
    std::vector<float> v = random_floats(rng, static_cast<size_t>(mb.rows * mb.r), -0.5f, 0.5f);
    b16->resize(b16->size() + mb.b.size(), 0);
    for (int64_t j = 0; j < mb.rows; ++j) {
      std::vector<uint16_t> h(static_cast<size_t>(mb.r));
      quantize_row(DType::F16, v.data() + j * mb.r, h.data(), mb.r);
      dequantize_row(DType::F16, h.data(), mb.b.data() + j * r_pad, mb.r);
      std::copy(h.begin(), h.end(), b16->begin() + l.b0[m] + j * r_pad);
    }
    u0 += mb.r;
  }
  l.r_total = u0;
  return l;
}

// Δ(i, row): the adapters' term of output row `row` for token i.
double delta(const std::vector<MemberB>& members, const cuda::LoraBLayout& l, const std::vector<float>& u, int64_t i,
             int64_t row) {
  for (size_t m = 0; m < members.size(); ++m) {
    const MemberB& mb = members[m];
    if (mb.r == 0 || row < mb.row0 || row >= mb.row0 + mb.rows) continue;
    double s = 0;
    for (int c = 0; c < mb.r; ++c)
      s += double(u[static_cast<size_t>(i * l.r_total + l.u0[m] + c)]) *
           mb.b[static_cast<size_t>((row - mb.row0) * l.r_pad[m] + c)];
    return s;
  }
  return 0;
}

// Three forms: y += Δ (prefill, and the decoder's separate A GEMV), y = base + Δ and y += base + Δ (the decoder's GEMV
// over [W; A_stack] writing base and u into one buffer; into the residual for the second).
TEST(CudaLoraKernels, BAddMatchesLoops) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(cuda::test::test_seed());
  // q|k|v-like: q with two adapters (ranks 13 = 8 + 5, padded to 16), k without, v with rank 8.
  for (const int64_t t : {1, 37})
    for (const int form : {0, 1, 2}) {
      std::vector<MemberB> members{{0, 96, 13, {}}, {96, 32, 0, {}}, {128, 40, 8, {}}};
      std::vector<uint16_t> b16;
      const cuda::LoraBLayout l = layout_of(members, rng, &b16);
      const int64_t n = 168, ld_base = 176;  // base rows with a stride of their own
      const std::vector<float> u = random_floats(rng, static_cast<size_t>(t * l.r_total));
      const std::vector<float> y0 = random_floats(rng, static_cast<size_t>(t * n));
      const std::vector<float> base = random_floats(rng, static_cast<size_t>(t * ld_base));
      cuda::DeviceBuffer db = cuda::test::to_device(b16), du = cuda::test::to_device(u);
      cuda::DeviceBuffer dy = form == 1 ? cuda::test::poisoned(y0.size() * sizeof(float)) : cuda::test::to_device(y0);
      cuda::DeviceBuffer dbase = cuda::test::to_device(base);
      cuda::lora_b_add(db.get(), l, du.as<float>(), dy.as<float>(), n, n, t, nullptr,
                       form == 0 ? nullptr : dbase.as<float>(), ld_base, form != 1);
      const std::vector<float> y = cuda::test::to_host<float>(dy, y0.size());
      double worst = 0;
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double want = delta(members, l, u, i, j);
          if (form != 1) want += y0[static_cast<size_t>(i * n + j)];
          if (form != 0) want += base[static_cast<size_t>(i * ld_base + j)];
          worst = std::max(worst, std::abs(y[static_cast<size_t>(i * n + j)] - want));
        }
      EXPECT_LE(worst, 1e-4) << "t = " << t << ", form " << form;
    }
}

// The decoder's form (f32 [gate; up] in one row, f32 out) and prefill's (lora_b_swiglu_rows: 16-bit gate|up rows as
// matmul_x16_out16 writes them, a row stride of its own, a 16-bit or f32 output).
TEST(CudaLoraKernels, BSwigluMatchesLoops) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(cuda::test::test_seed() + 1);
  struct Form {
    DType in, out;
  };
  for (const int64_t t : {1, 19})
    for (const Form form : {Form{DType::F32, DType::F32}, Form{DType::BF16, DType::BF16}, Form{DType::F16, DType::F32},
                            Form{DType::F32, DType::F16}}) {
      const int64_t f = 200;  // not a multiple of the block's 128 threads
      const int64_t ld = form.in == DType::F32 && t == 1 ? 2 * f : 2 * f + 24;  // a stack's row stride
      std::vector<MemberB> members{{0, f, 5, {}}, {f, f, 16, {}}};
      std::vector<uint16_t> b16;
      const cuda::LoraBLayout l = layout_of(members, rng, &b16);
      const std::vector<float> u = random_floats(rng, static_cast<size_t>(t * l.r_total));
      std::vector<float> gu = random_floats(rng, static_cast<size_t>(t * ld), -3.0f, 3.0f);
      cuda::DeviceBuffer db = cuda::test::to_device(b16), du = cuda::test::to_device(u), dg;
      if (form.in == DType::F32) {
        dg = cuda::test::to_device(gu);
      } else {  // rounded to 16 bits; the reference reads the rounded values
        std::vector<uint16_t> h(gu.size());
        quantize_row(form.in, gu.data(), h.data(), static_cast<int64_t>(gu.size()));
        dequantize_row(form.in, h.data(), gu.data(), static_cast<int64_t>(gu.size()));
        dg = cuda::test::to_device(h);
      }
      const size_t out_bytes = static_cast<size_t>(t * f) * (form.out == DType::F32 ? 4 : 2);
      cuda::DeviceBuffer out = cuda::test::poisoned(out_bytes);
      if (form.in == DType::F32 && form.out == DType::F32 && ld == 2 * f)
        cuda::lora_b_swiglu(db.get(), l, du.as<float>(), dg.as<float>(), out.as<float>(), f, t, nullptr);
      else
        cuda::lora_b_swiglu_rows(db.get(), l, du.as<float>(), dg.get(), form.in, ld, f,
                                 form.out == DType::F32 ? out.as<float>() : nullptr,
                                 form.out == DType::F32 ? nullptr : out.get(), form.out, f, t, nullptr);
      std::vector<float> y(static_cast<size_t>(t * f));
      if (form.out == DType::F32) {
        y = cuda::test::to_host<float>(out, y.size());
      } else {
        const std::vector<uint16_t> h = cuda::test::to_host<uint16_t>(out, y.size());
        dequantize_row(form.out, h.data(), y.data(), static_cast<int64_t>(y.size()));
      }
      const double tol = form.out == DType::F32 ? 1e-4 : 1e-2;  // a 16-bit output: its rounding
      double worst = 0;
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < f; ++j) {
          const double g = gu[static_cast<size_t>(i * ld + j)] + delta(members, l, u, i, j);
          const double up = gu[static_cast<size_t>(i * ld + f + j)] + delta(members, l, u, i, f + j);
          const double want = g / (1 + std::exp(-g)) * up;
          worst = std::max(worst, std::abs(y[static_cast<size_t>(i * f + j)] - want) / (1 + std::abs(want)));
        }
      EXPECT_LE(worst, tol) << "t = " << t << ", in " << dtype_name(form.in) << ", out " << dtype_name(form.out);
    }
}

// The B side of prefill chunks from kLoraGemmMinT rows (executor_rows.cpp): u [t, R] and the members' B placed
// block-diagonally in one [N_total, R] matrix (DeviceLora::b_bd), both bf16, one cuBLASLt GEMM adding u·B_bdᵀ into
// an f32 output (q|k|v's stack, the residual) or a bf16 one (gate|up's 16-bit stack output: C = D in 16 bits), against
// loops over the same rounded values. A narrow K (R = 24) and an N that is no multiple of the GEMM's tiles.
TEST(CudaLoraKernels, BlockDiagonalGemmAddsIntoF32AndBf16) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(cuda::test::test_seed() + 2);
  struct Block {
    int64_t row0, rows, u0, r;
  };
  const std::vector<Block> blocks{{0, 96, 0, 16}, {128, 40, 16, 8}};  // rows 96..127 have no adapter
  const int64_t n = 168, r_total = 24;
  std::vector<float> bd(static_cast<size_t>(n * r_total), 0.0f);
  for (const Block& b : blocks)
    for (int64_t j = 0; j < b.rows; ++j)
      for (int64_t c = 0; c < b.r; ++c)
        bd[static_cast<size_t>((b.row0 + j) * r_total + b.u0 + c)] =
            std::uniform_real_distribution<float>(-.5f, .5f)(rng);
  const auto round16 = [](std::vector<float>& v, DType type) {  // rounded in place; returns the 16-bit values
    std::vector<uint16_t> h(v.size());
    quantize_row(type, v.data(), h.data(), static_cast<int64_t>(v.size()));
    dequantize_row(type, h.data(), v.data(), static_cast<int64_t>(v.size()));
    return h;
  };
  const std::vector<uint16_t> bd16 = round16(bd, DType::BF16);
  const cuda::DeviceWeight w = cuda::upload_weight(DType::BF16, bd16.data(), n, r_total);
  cuda::GemmWorkspace ws(512, 64, 0);
  for (const int64_t t : {32, 37, 512})
    for (const bool out16 : {false, true}) {
      std::vector<float> u = random_floats(rng, static_cast<size_t>(t * r_total), -2.0f, 2.0f);
      std::vector<float> y0 = random_floats(rng, static_cast<size_t>(t * n), -3.0f, 3.0f);
      const std::vector<uint16_t> u16 = round16(u, DType::BF16);
      cuda::DeviceBuffer du = cuda::test::to_device(u16), dy;
      if (out16) {
        dy = cuda::test::to_device(round16(y0, DType::BF16));
        cuda::matmul_x16_out16(w, du.get(), dy.get(), t, ws, nullptr, true);
      } else {
        dy = cuda::test::to_device(y0);
        cuda::matmul_x16(w, du.get(), dy.as<float>(), t, ws, nullptr, true);
      }
      std::vector<float> y(y0.size());
      if (out16) {
        const std::vector<uint16_t> h = cuda::test::to_host<uint16_t>(dy, y.size());
        dequantize_row(DType::BF16, h.data(), y.data(), static_cast<int64_t>(y.size()));
      } else {
        y = cuda::test::to_host<float>(dy, y.size());
      }
      double worst = 0;
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double want = y0[static_cast<size_t>(i * n + j)], mag = std::abs(want);
          for (int64_t c = 0; c < r_total; ++c) {
            const double p = double(u[static_cast<size_t>(i * r_total + c)]) * bd[static_cast<size_t>(j * r_total + c)];
            want += p, mag += std::abs(p);
          }
          worst = std::max(worst, std::abs(y[static_cast<size_t>(i * n + j)] - want) / (1 + mag));
        }
      // Error per (1 + the magnitudes summed). f32 output: f32 accumulation of 24 products. bf16 output: each bf16
      // rounding costs at most 2^-9 of the magnitudes; the H100's cuBLASLt measured 3.3-4.1e-3 (t = 32, 37, 512),
      // about two roundings (the product's and the sum's); 2^-7 leaves twice that, and a misplaced block or a lost
      // beta is O(1).
      std::printf("block-diagonal lora gemm, t = %d, %s output: worst error per magnitude %.3g\n", static_cast<int>(t),
                  out16 ? "bf16" : "f32", worst);
      EXPECT_LE(worst, out16 ? 1.0 / 128 : 1e-5) << "t = " << t << (out16 ? ", bf16 output" : ", f32 output");
    }
}

// The A side of the same path: u = x·A_stackᵀ as partial products over slices of K (matmul_x16_split_k, one
// strided-batched GEMM) summed and rounded to 16 bits by lora_sum_parts, against loops over the rounded inputs; every
// split count that divides K, bf16 and f16, the split counts matmul_split_k_default picks for the shapes at hand.
TEST(CudaLoraKernels, SplitKProductSumsToU) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(cuda::test::test_seed() + 3);
  const int64_t r = 24, k = 1536;
  EXPECT_EQ(cuda::matmul_split_k_default(512, 48, 4096), 16);  // Llama-3-8B q|k|v's A at a 512-token chunk
  EXPECT_EQ(cuda::matmul_split_k_default(2048, 48, 4096), 8);
  EXPECT_EQ(cuda::matmul_split_k_default(512, 4096, 4096), 1);  // not narrow: cuBLASLt's tiles fill the GPU
  cuda::GemmWorkspace ws(512, k, 0);
  for (const DType type : {DType::BF16, DType::F16}) {
    std::vector<float> a = random_floats(rng, static_cast<size_t>(r * k), -0.05f, 0.05f);
    std::vector<uint16_t> a16(a.size());
    quantize_row(type, a.data(), a16.data(), static_cast<int64_t>(a.size()));
    dequantize_row(type, a16.data(), a.data(), static_cast<int64_t>(a.size()));
    const cuda::DeviceWeight w = cuda::upload_weight(type, a16.data(), r, k);
    for (const int64_t t : {33, 512})
      for (const int splits : {1, 2, 4, 8, cuda::matmul_split_k_default(t, r, k)}) {
        std::vector<float> x = random_floats(rng, static_cast<size_t>(t * k), -2.0f, 2.0f);
        std::vector<uint16_t> x16(x.size());
        quantize_row(type, x.data(), x16.data(), static_cast<int64_t>(x.size()));
        dequantize_row(type, x16.data(), x.data(), static_cast<int64_t>(x.size()));
        cuda::DeviceBuffer dx = cuda::test::to_device(x16);
        cuda::DeviceBuffer parts = cuda::test::poisoned(static_cast<size_t>(splits * t * r) * sizeof(float));
        cuda::DeviceBuffer du = cuda::test::poisoned(static_cast<size_t>(t * r) * 2);
        const int written = cuda::matmul_x16_split_k(w, dx.get(), parts.as<float>(), t, splits, ws, nullptr);
        EXPECT_EQ(written, splits) << "cuBLASLt took no algorithm for the batch";
        cuda::lora_sum_parts(parts.as<float>(), written, t * r, du.get(), type, nullptr);
        const std::vector<uint16_t> h = cuda::test::to_host<uint16_t>(du, static_cast<size_t>(t * r));
        std::vector<float> u(h.size());
        dequantize_row(type, h.data(), u.data(), static_cast<int64_t>(u.size()));
        double worst = 0;
        for (int64_t i = 0; i < t; ++i)
          for (int64_t c = 0; c < r; ++c) {
            double want = 0;
            for (int64_t j = 0; j < k; ++j)
              want += double(x[static_cast<size_t>(i * k + j)]) * a[static_cast<size_t>(c * k + j)];
            worst = std::max(worst, std::abs(u[static_cast<size_t>(i * r + c)] - want) / (0.1 + std::abs(want)));
          }
        // f32 sums of 1536 products, rounded once to 16 bits (bf16: 2^-9 relative).
        EXPECT_LE(worst, type == DType::BF16 ? 5e-3 : 1e-3)
            << dtype_name(type) << ", t = " << t << ", " << splits << " slices";
      }
  }
  // 40 / 2 = 20 values a slice: not whole 16-byte rows.
  const cuda::DeviceWeight narrow = cuda::upload_weight(DType::BF16, std::vector<uint16_t>(8 * 40).data(), 8, 40);
  cuda::DeviceBuffer x1(40 * 2), p2(2 * 8 * sizeof(float));
  EXPECT_THROW(cuda::matmul_x16_split_k(narrow, x1.get(), p2.as<float>(), 1, 2, ws, nullptr), Error);
}

// ---- Models and adapters.

constexpr int64_t kLayers = 2;

// A random PEFT adapter of rank r (lora_alpha 2r) on all seven projections of a model with `spec`'s shapes, in a
// fresh directory (removed by the caller).
std::string write_adapter(const ModelSpec& spec, int64_t r, uint32_t seed) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_lora_stack_" + std::to_string(::getpid()) + "_" + std::to_string(seed));
  fs::create_directories(dir);
  cuda::test::write_peft_adapter(dir.string(), spec.n_layers, spec.n_embd, spec.n_head * spec.head_dim,
                                 spec.n_head_kv * spec.head_dim, spec.n_ff, r, 0.1f, seed);
  return dir.string();
}

Model small_model(const std::string& dtype) {
  return make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = 3, .n_layers = kLayers});
}

// The two adapters at once: rank 16 and rank 5 (padded to 8 for CUDA sessions: LoraSet::rank_multiple).
struct Adapters {
  explicit Adapters(const ModelSpec& spec) : a(write_adapter(spec, 16, 21)), b(write_adapter(spec, 5, 22)) {}
  ~Adapters() {
    fs::remove_all(a);
    fs::remove_all(b);
  }
  std::vector<LoraSpec> specs() const { return {LoraSpec{a, 1.0f}, LoraSpec{b, 1.0f}}; }
  std::string a, b;
};

// A prefill of n_prompt tokens (every row's logits; 70 in chunks of 64 and 6 unless the session's n_batch says
// otherwise), then 6 decode steps.
std::vector<float> prefill_and_decode(Session& s, int64_t vocab, int n_prompt = 70) {
  const std::vector<int32_t> ids = cuda::test::random_ids(n_prompt, vocab, 5);
  std::vector<float> out = s.eval_all_logits(ids);
  for (int i = 0; i < 6; ++i) {
    const std::span<const float> x = s.decode(int32_t((i * 53 + 11) % vocab));
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

// ---- The CUDA graph passes (host only).

int count_nodes(const GraphView& v, const std::vector<std::string>& all_of) {
  int c = 0;
  for (const GraphNode& n : v.nodes()) {
    bool all = true;
    for (const std::string& part : all_of) {
      bool found = false;
      for (const std::string& f : n.fused_from) found |= f.find(part) != std::string::npos;
      all &= found;
    }
    c += all;
  }
  return c;
}

TEST(CudaLoraGraph, AdaptersStayInTheStacksAndEpilogues) {
  const Model m = small_model("bf16");
  const Adapters ad(m.spec());
  for (const int64_t t : {1, 64}) {
    SCOPED_TRACE(::testing::Message() << "T = " << t);
    GraphOptions o;
    o.device = "cuda";
    o.lora = ad.specs();
    const GraphView v = build_graph(m, t, 0, o);
    // q|k|v stacked with all six adapters (both adapters on each member).
    EXPECT_EQ(count_nodes(v, {"attn_q", "attn_k", "attn_v", "attn_q.lora0_a", "attn_k.lora1_b", "attn_v.lora1"}),
              kLayers);
    // gate|up stacked with their adapters; at decode with the norm prologue and the SwiGLU epilogue.
    const std::vector<std::string> gu = {"ffn_gate", "ffn_up", "ffn_gate.lora0_b", "ffn_up.lora1_a"};
    EXPECT_EQ(count_nodes(v, gu), kLayers);
    if (t == 1) {
      std::vector<std::string> ffn = gu;
      ffn.insert(ffn.end(), {"ffn_norm", "ffn_act"});
      EXPECT_EQ(count_nodes(v, ffn), kLayers);
      EXPECT_EQ(count_nodes(v, {"attn_norm", "attn_q", "attn_q.lora1_b"}), kLayers);
    }
    // o and down accumulating into the residual with their adapters.
    EXPECT_EQ(count_nodes(v, {"attn_output", "attn_output.lora0", "attn_output.lora1", "attn_residual"}), kLayers);
    EXPECT_EQ(count_nodes(v, {"ffn_down", "ffn_down.lora1_b", "ffn_residual"}), kLayers);
    // No adapter product or add left as a node of its own.
    for (const GraphNode& n : v.nodes())
      EXPECT_TRUE(n.fused_from.size() > 1 || n.name.find(".lora") == std::string::npos) << n.name;
  }
}

// The adapters move the CPU's logits well past the CUDA comparison's tolerance (runs without a GPU), so a CUDA
// session that dropped an adapter, or a member's rows, fails CudaLoraStacked.
TEST(CudaLoraGraph, TheAdaptersMoveTheCpuLogits) {
  const Model m = small_model("bf16");
  const Adapters ad(m.spec());
  SessionOptions base{.n_ctx = 128, .n_batch = 64, .n_threads = 2};
  SessionOptions adapted = base;
  adapted.lora = ad.specs();
  SessionOptions one = base;
  one.lora = {LoraSpec{ad.a, 1.0f}};
  Session a(m, base), b(m, adapted), c(m, one);
  const int64_t vocab = m.spec().n_vocab;
  const std::vector<float> with = prefill_and_decode(b, vocab);
  const double moved = worst_rel(prefill_and_decode(a, vocab), with, static_cast<size_t>(vocab));
  const double moved_second = worst_rel(prefill_and_decode(c, vocab), with, static_cast<size_t>(vocab));
  std::printf("adapters move the cpu logits by %.3g (both), %.3g (the rank-5 one beside the rank-16 one)\n", moved,
              moved_second);
  EXPECT_GT(moved, 0.2);
  EXPECT_GT(moved_second, 0.1);
}

// ---- Sessions on the GPU against the CPU.

void expect_matches_cpu(const std::string& dtype, double tol, int n_prompt = 70, int64_t n_batch = 64) {
  const Model m = small_model(dtype);
  const Adapters ad(m.spec());
  // The prompt, 6 decode steps and room, in whole 64-position blocks (128 for the 70-token prompt, as before).
  SessionOptions co{.n_ctx = (n_prompt + 58 + 63) / 64 * 64, .n_batch = n_batch, .n_threads = 2};
  co.lora = ad.specs();
  SessionOptions go = co;
  go.device = "cuda";
  Session cpu(m, co), gpu(m, go);
  const int64_t vocab = m.spec().n_vocab;
  const double err =
      worst_rel(prefill_and_decode(cpu, vocab, n_prompt), prefill_and_decode(gpu, vocab, n_prompt), size_t(vocab));
  std::printf("stacked lora on cuda, %s, %d-token prompt in chunks of %lld: worst relative L2 error %.3g\n",
              dtype.c_str(), n_prompt, static_cast<long long>(n_batch), err);
  EXPECT_LE(err, tol) << dtype;
}

// bf16 activations into the tensor cores in prefill (both base and A read the 16-bit copy of x), A_stack in bf16:
// 3% as the bf16 model tests allow.
TEST(CudaLoraStacked, Bf16MatchesCpu) {
  TESSERA_REQUIRE_GPU();
  expect_matches_cpu("bf16", 3e-2);
}

// A 512-token chunk and an 88-token one: the B side on the tensor cores (kLoraGemmMinT = 32; the 64-token chunks above
// take it too, the 6-token ones lora_b_add and lora_b_swiglu_rows), u and the block-diagonal B in bf16.
TEST(CudaLoraStacked, Bf16ChunkOf512MatchesCpu) {
  TESSERA_REQUIRE_GPU();
  expect_matches_cpu("bf16", 3e-2, 600, 512);
}

// The A products on the side stream (CudaOptions::lora_side, the default) give the same bits as run in order on the
// executor's stream: the same kernels on the same inputs, the B GEMM after both. A missing fork or join (the B GEMM
// reading u before it is written, or x read before its producer ran) shows as different logits.
TEST(CudaLoraStacked, SideStreamGivesTheSameBits) {
  TESSERA_REQUIRE_GPU();
  const Model m = small_model("bf16");
  const Adapters ad(m.spec());
  SessionOptions go{.n_ctx = 704, .n_batch = 512, .n_threads = 2};
  go.lora = ad.specs();
  go.device = "cuda";
  const int64_t vocab = m.spec().n_vocab;
  std::vector<float> runs[2];
  for (const bool side : {false, true}) {
    // The session's own switch: a session runs with the defaults and its backend options (set_cuda_options before it
    // opened would be replaced when it opens; it was, so until the twenty-fifth session both runs took the side stream).
    go.backend_options = {side ? "lora_side=1" : "lora_side=0"};
    Session gpu(m, go);
    runs[side] = prefill_and_decode(gpu, vocab, 600);
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  size_t differ = 0;
  for (size_t i = 0; i < runs[0].size(); ++i) differ += std::memcmp(&runs[0][i], &runs[1][i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "of " << runs[0].size() << " logits";
}

TEST(CudaLoraStacked, F16MatchesCpu) {
  TESSERA_REQUIRE_GPU();
  expect_matches_cpu("f16", 3e-2);
}

// A quantized base: the decoder's A GEMV reads the f32 x (the base reads its q8 copy); prefill's first chunk (64 rows
// >= 41) reads the bf16 copy, its second (6 rows) the f32 x.
TEST(CudaLoraStacked, Q8_0MatchesCpu) {
  TESSERA_REQUIRE_GPU();
  expect_matches_cpu("q8_0", 3e-2);
}

// ---- The matmul-chain rewrite (graph/passes/chain.h) on CUDA.

// tests/data/lora's 32-wide base has head size 8, which the CUDA attention kernels do not take (64, 128, 256), so
// these tests write its layout at head size 64: hidden 64, one query and one KV head of 64, FFN 128, vocabulary 128,
// two layers, f32 weights ~1/sqrt(K) (config.json and model.safetensors in a fresh directory, removed by the caller).
// Under cuda_chain_cost_model (the f32 path's ceilings) x·(B·A)ᵀ is cheaper than (x·Aᵀ)·Bᵀ at rank 48 from T = 86 for
// the attention projections (64 x 64) and from T = 194 for the FFN ones (64 x 128, 128 x 64).
constexpr int64_t kChainEmbd = 64, kChainFf = 128, kChainVocab = 128, kChainRank = 48;

std::string write_chain_base() {
  const fs::path dir = fs::temp_directory_path() / ("tessera_lora_chain_base_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":" << kChainEmbd
      << ",\"intermediate_size\":" << kChainFf
      << ",\"num_attention_heads\":1,\"num_key_value_heads\":1,\"head_dim\":" << kChainEmbd
      << ",\"num_hidden_layers\":" << kLayers << ",\"vocab_size\":" << kChainVocab
      << ",\"max_position_embeddings\":2048,\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,\"hidden_act\":\"silu\","
         "\"tie_word_embeddings\":false,\"attention_bias\":false}";
  std::mt19937 rng(31);
  std::vector<cuda::test::SafetensorsEntry> e;
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, float center, float half) {
    e.push_back({name, shape,
                 random_floats(rng, static_cast<size_t>(shape[0] * (shape.size() > 1 ? shape[1] : 1)), center - half,
                               center + half)});
  };
  const float w_in = 1.0f / std::sqrt(float(kChainEmbd)), w_ff = 1.0f / std::sqrt(float(kChainFf));
  add("model.embed_tokens.weight", {kChainVocab, kChainEmbd}, 0.0f, 1.0f);
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kChainEmbd}, 1.0f, 0.2f);
    add(p + "post_attention_layernorm.weight", {kChainEmbd}, 1.0f, 0.2f);
    for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"})
      add(p + "self_attn." + m + ".weight", {kChainEmbd, kChainEmbd}, 0.0f, 2 * w_in);
    add(p + "mlp.gate_proj.weight", {kChainFf, kChainEmbd}, 0.0f, 2 * w_in);
    add(p + "mlp.up_proj.weight", {kChainFf, kChainEmbd}, 0.0f, 2 * w_in);
    add(p + "mlp.down_proj.weight", {kChainEmbd, kChainFf}, 0.0f, 2 * w_ff);
  }
  add("model.norm.weight", {kChainEmbd}, 1.0f, 0.2f);
  add("lm_head.weight", {kChainVocab, kChainEmbd}, 0.0f, 2 * w_in);
  cuda::test::write_safetensors((dir / "model.safetensors").string(), e);
  return dir.string();
}

// The base and a rank-48 adapter on it (seed: the adapter's values), removed at the end.
struct ChainCase {
  explicit ChainCase(uint32_t seed = 48)
      : dir(write_chain_base()),
        model(Model::load(dir, {.load_tokenizer = false})),
        adapter(test::write_high_rank_adapter(
            model.impl()->weights, kChainRank,
            "tessera_lora_chain_cuda_" + std::to_string(::getpid()) + "_" + std::to_string(seed) + ".gguf", seed)) {}
  ~ChainCase() {
    fs::remove_all(dir);
    fs::remove(adapter);
  }
  std::string dir;
  Model model;
  std::string adapter;
};

// Nodes of the T-token graph as the CUDA passes rewrite it that multiply by a folded constant ("<nodes>.folded").
int folded_nodes(const Model& m, const std::string& adapter, int64_t t) {
  GraphOptions o;
  o.device = "cuda";
  o.lora = {LoraSpec{adapter, 1.0f}};
  const GraphView v = build_graph(m, t, 0, o);
  int n = 0;
  for (const GraphNode& node : v.nodes()) {
    int folded = 0;
    for (const std::string& in : node.inputs) folded += in.ends_with(".folded");
    EXPECT_LE(folded, 1) << node.name << ": a stack of folded constants";
    n += folded;
  }
  return n;
}

TEST(CudaLoraChain, PassesFoldLongPrefillChunksOnly) {
  const ChainCase c;
  // The rows executor's 256-row graph: all seven projections of both layers; 64 rows and the decoder's one token:
  // none (there the fold's K x N product costs more than the [T, r] intermediate it spares).
  EXPECT_EQ(folded_nodes(c.model, c.adapter, 256), 14);
  EXPECT_EQ(folded_nodes(c.model, c.adapter, 64), 0);
  EXPECT_EQ(folded_nodes(c.model, c.adapter, 1), 0);
}

// The device store's key for a graph-owned constant follows its contents, not its address: equal values in two
// graphs share a key, and one changed value under the same name and shape does not (host code, no GPU).
TEST(CudaLoraChain, ConstantKeysFollowContents) {
  std::vector<float> v(64 * 48);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
  graph::Graph a(1, 0), b(1, 0), c(1, 0);
  const int ta = a.add_constant("blk.0.attn_q.folded", v, {64, 48});
  const int tb = b.add_constant("blk.0.attn_q.folded", v, {64, 48});
  v[1234] += 1e-6f;
  const int tc = c.add_constant("blk.0.attn_q.folded", v, {64, 48});
  ASSERT_NE(a.tensor(ta).data, b.tensor(tb).data);
  EXPECT_EQ(cuda::constant_key(a.tensor(ta)), cuda::constant_key(b.tensor(tb)));
  EXPECT_NE(cuda::constant_key(a.tensor(ta)), cuda::constant_key(c.tensor(tc)));
}

// A prompt of 300 tokens (every row's logits: the 256-row executor runs a chunk of 256 and one of 44, both folded),
// then 6 decode steps (the decoder: the adapters unfolded in its GEMVs).
std::vector<float> chain_logits(const Model& m, const std::string& adapter, const std::string& device) {
  SessionOptions so{.n_ctx = 384, .n_batch = 256, .n_threads = 2, .kv_dtype = "f32"};
  if (!adapter.empty()) so.lora = {LoraSpec{adapter, 1.0f}};
  so.device = device;
  Session s(m, so);
  std::vector<float> out = s.eval_all_logits(cuda::test::random_ids(300, kChainVocab, 5));
  for (int i = 0; i < 6; ++i) {
    const std::span<const float> x = s.decode(int32_t((i * 53 + 11) % kChainVocab));
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

// f32 weights and an f32 cache on both sides, the adapters in the same f16 A and (prefill) f32 B: the folded B·A is
// the same f32 constant on both (the CPU's fast mode folds the attention projections at 256 rows, none at 44; CUDA
// folds all in both chunks), multiplied by the f32 GEMM without TF32 or by the CPU's f32 matmul, and at decode both
// run the adapters unfolded with B in f16. So the two differ by summation order and association alone (~1e-6 relative
// per product), as CudaBackend.F32CacheMatchesCpuOnF32Model's paths do: its 1e-4 relative L2 per row leaves two
// orders of margin (measured on an H100: 3.0e-6 and, for the second adapter, 3.2e-6). The adapter moves the logits by
// ~1 (checked: > 1e-2), so a dropped or stale constant fails.
void expect_chain_matches_cpu(const Model& m, const std::string& adapter) {
  const double tol = 1e-4;
  const std::vector<float> cpu = chain_logits(m, adapter, "cpu");
  const std::vector<float> gpu = chain_logits(m, adapter, "cuda");
  const double moved = worst_rel(chain_logits(m, "", "cpu"), cpu, size_t(kChainVocab));
  const double err = worst_rel(cpu, gpu, size_t(kChainVocab));
  std::printf("%s folded on cuda: worst relative L2 error %.3g against the cpu; the adapter moves the logits by %.3g\n",
              fs::path(adapter).filename().c_str(), err, moved);
  EXPECT_LE(err, tol) << adapter;
  EXPECT_GT(moved, 100 * tol) << adapter;
}

TEST(CudaLoraChain, HighRankAdapterFoldedMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  const ChainCase c;
  ASSERT_EQ(folded_nodes(c.model, c.adapter, 256), 14);
  expect_chain_matches_cpu(c.model, c.adapter);
}

// Folded constants live with their graph, and the next session's may land at the same host addresses: the device
// copies are keyed by content (CudaShared::Impl::weight), so a second adapter of the same names and shapes on the same
// model (one device weight store, kept across sessions) gets its own constants, not the first one's.
TEST(CudaLoraChain, ConstantsAreKeyedByContent) {
  TESSERA_REQUIRE_GPU();
  const ChainCase c(48);
  expect_chain_matches_cpu(c.model, c.adapter);
  const std::string second = test::write_high_rank_adapter(
      c.model.impl()->weights, kChainRank, "tessera_lora_chain_cuda_" + std::to_string(::getpid()) + "_49.gguf", 49);
  expect_chain_matches_cpu(c.model, second);
  fs::remove(second);
}

}  // namespace
}  // namespace tessera
