// Shared pieces of the CUDA kernel tests: GPU detection (skip cleanly where there is none: CI builds these tests and
// runs them on a machine without a GPU), fresh random inputs, NaN-poisoned device buffers, and the plain-loop CPU
// references every kernel is compared with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/device_info.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"
#include "core/dtype.h"

namespace tessera::cuda::test {

// "" when a usable GPU (compute capability >= 9.0, what the kernels are built for) is present, else why not.
std::string gpu_skip_reason();

// Seed for this test's random inputs: fresh each run (TESSERA_TEST_SEED pins it to reproduce a failure).
uint32_t test_seed();

}  // namespace tessera::cuda::test

// Skips the test when there is no GPU; prints the seed so a failure can be replayed.
#define TESSERA_REQUIRE_GPU()                                          \
  do {                                                                 \
    const std::string why_ = ::tessera::cuda::test::gpu_skip_reason(); \
    if (!why_.empty()) GTEST_SKIP() << why_;                           \
  } while (0)

namespace tessera::cuda::test {

std::vector<float> random_floats(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f);
// ||a - ref|| / ||ref|| over n values, summed in double (a NaN in a gives NaN, which fails any bound; a zero ref
// counts as 1e-30). a and ref may be float or double.
template <typename A, typename R>
double rel_l2(const A* a, const R* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}
// Largest relative L2 error of b against a over rows of `width` values (logits); a non-finite value of b, or sizes
// that differ, fail the calling test.
double worst_rel(const std::vector<float>& a, const std::vector<float>& b, size_t width);
// n token ids uniform in [0, vocab), seeded (the session tests' prompts).
std::vector<int32_t> random_ids(int n, int64_t vocab, uint32_t seed);

// A device buffer filled with `host`, or of `count` elements poisoned with NaN bytes (0xFF in every byte is a NaN
// float), so an element the kernel fails to write shows up as NaN and fails every tolerance check.
template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer b(host.size() * sizeof(T));
  b.upload(host.data(), host.size() * sizeof(T));
  return b;
}
inline DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer b(bytes);
  b.fill_bytes(0xFF);
  return b;
}
template <typename T>
std::vector<T> to_host(const DeviceBuffer& b, size_t count) {
  std::vector<T> out(count);
  b.download(out.data(), count * sizeof(T));
  return out;
}

// 16-bit element bits (f16 or bf16: KV-cache entries, 16-bit activations) <-> float, rounding to nearest even as the
// kernels do.
float cache_to_float(DType dtype, uint16_t bits);
uint16_t float_to_cache(DType dtype, float v);

// RoPE frequencies base^(-2i / rope_dim), i < rope_dim / 2 (Llama's).
std::vector<float> llama_inv_freq(int64_t rope_dim, double base);

// Per-row relative error ||o_r - ref_r|| / ||ref_r|| over t rows of `width` floats (a masking error at one position of
// one row would vanish in a norm over all rows); row r's reference is ref_row(r), indexable by [i]. The first row over
// `limit` fails the test, naming its position p0 + r, and is returned; otherwise the worst row.
template <typename Ref>
double check_rows_rel(const std::vector<float>& o, int64_t t, int64_t width, int64_t p0, Ref ref_row, double limit) {
  double worst = 0;
  for (int64_t r = 0; r < t; ++r) {
    const auto& ref = ref_row(r);
    const double rel = rel_l2(o.data() + r * width, &ref[0], static_cast<size_t>(width));
    EXPECT_TRUE(rel <= limit) << "row " << r << " (position " << p0 + r << "): relative error " << rel;
    if (!(rel <= limit)) return rel;
    worst = std::max(worst, rel);
  }
  return worst;
}

// ---- References (plain loops, double accumulation) ----

// Host twin of the device q8 activation quantizer: same IEEE operations in the same order, so the result is
// bit-identical (the tests check that).
void quantize_q8_ref(const float* x, int8_t* q8, float2* ds, int64_t k);

// A random weight [n, k] in `dtype` (GGUF layout), made by quantizing random floats with quant/quant.h.
std::vector<uint8_t> random_weight(std::mt19937& rng, DType dtype, int64_t n, int64_t k);

// y[i] = sum_j w[i, j] * x[j] over the dequantized weight (quant/quant.h), in double. mag[i] = sum_j |terms| that the
// kernel's float arithmetic rounds: for q4_0 |d| (|q| + 8) |x| (its -8 offset is applied after the integer dot), for
// q4_1, q4_K and q5_K (|d q| + |m|) |x| (K-quants: their d sc and dmin m), else |w x|. absw_dx[i] = sum_j |w[i, j]| *
// dx(j) / 2, the most that x's q8 rounding (half a step dx of its block) can move y[i]; pass dx = nullptr to skip it.
void gemv_ref(DType dtype, const std::vector<uint8_t>& w, int64_t n, int64_t k, const float* x, std::vector<double>& y,
              std::vector<double>& mag, const float* dx = nullptr, std::vector<double>* absw_dx = nullptr);

void rmsnorm_ref(const float* x, const float* w, double* y, int64_t t, int64_t d, float eps);

// Rotates one head [hd] as rope_store_kv does (theta = float(pos) * inv_freq[i], rotation in double).
void rope_head_ref(const float* x, double* out, int64_t hd, int64_t rope_dim, int32_t pos, const float* inv_freq,
                   bool neox);

// out[h, :] for one query token over cache positions [0, pos]; k and v are the cache's values as floats
// [n_kv, n_ctx, hd].
void attn_decode_ref(const float* q, const std::vector<float>& k, const std::vector<float>& v, int64_t n_ctx,
                     int64_t n_head, int64_t n_kv, int64_t hd, int32_t pos, float scale, std::vector<double>& out);

// One f32 tensor of a safetensors file.
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Writes `entries` as one f32 safetensors file (8-byte header length, JSON header, data); std::runtime_error when it
// cannot.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries);

// A random PEFT adapter (adapter_config.json and adapter_model.safetensors in `dir`, which exists) of rank r and
// lora_alpha 2r on all seven projections of n_layers Llama layers with these widths (q_dim = heads x head size,
// kv_dim = KV heads x head size): A uniform in +-1/sqrt(K), B uniform in +-b_range, drawn from `seed`.
void write_peft_adapter(const std::string& dir, int64_t n_layers, int64_t n_embd, int64_t q_dim, int64_t kv_dim,
                        int64_t n_ff, int64_t r, float b_range, uint32_t seed);

}  // namespace tessera::cuda::test
