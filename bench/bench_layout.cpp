// Why prepare_weight repacks quantized weights (WeightLayout::ROWS_X8): the same q4_1 matmul on the file's own row
// layout, read in place, against the interleaved kernels. The in-place version is the straightforward AVX2 GEMV (one
// row at a time: unpack 32 nibbles, vpmaddubsw against the row-ordered int8 activations, horizontal sum per row), run
// once per token for T > 1. Run: tessera_bench_kernels --benchmark_filter='layout/'
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels.h"
#include "bench_util.h"
#include "core/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace tessera::bench {
namespace {

struct ActBlock {  // as the kernels' BlockQ8A
  float d, s;
  int8_t qs[32];
};

void quantize_acts(const float* x, ActBlock* xq, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b) {
    float amax = 0;
    for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[b * 32 + l]));
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int l = 0; l < 32; ++l) sum += xq[b].qs[l] = static_cast<int8_t>(std::nearbyint(x[b * 32 + l] * id));
    xq[b].d = amax / 127.0f;
    xq[b].s = xq[b].d * static_cast<float>(sum);
  }
}

__attribute__((target("avx2,fma,f16c"))) void q4_1_rows_avx2(const BlockQ4_1* w, const ActBlock* xq, float* y,
                                                             int64_t r0, int64_t r1, int64_t kb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t j = r0; j < r1; ++j) {
    __m256 acc = _mm256_setzero_ps();
    float macc = 0.0f;
    for (int64_t b = 0; b < kb; ++b) {
      const BlockQ4_1& blk = w[j * kb + b];
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
      const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), m4);
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[b].qs));
      const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), ones);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(_cvtsh_ss(blk.d) * xq[b].d), acc);
      macc += _cvtsh_ss(blk.m) * xq[b].s;
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_hadd_ps(h, h);
    h = _mm_hadd_ps(h, h);
    y[j] = _mm_cvtss_f32(h) + macc;
  }
}

void bm_layout(benchmark::State& state, bool repacked, int64_t n, int64_t k, int64_t t, int threads) {
  const uint64_t row = *dtype_row_bytes(DType::Q4_1, static_cast<uint64_t>(k));
  std::vector<uint8_t> w(row * static_cast<uint64_t>(n));
  const std::vector<float> src = random_floats(static_cast<size_t>(k), 3);
  for (int64_t j = 0; j < n; ++j) quantize_row(DType::Q4_1, src.data(), w.data() + row * static_cast<uint64_t>(j), k);
  const std::vector<float> x = random_floats(static_cast<size_t>(t * k), 4);
  std::vector<float> y(static_cast<size_t>(t * n));
  ThreadPool& tp = pool(threads);
  const cpu::PackedWeight pw = cpu::prepare_weight(DType::Q4_1, w.data(), n, k);
  std::vector<ActBlock> xq(static_cast<size_t>(t * k / 32));
  const int64_t kb = k / 32;
  for (auto _ : state) {
    if (repacked) {
      cpu::matmul(tp, pw, x.data(), y.data(), t);
    } else {
      for (int64_t i = 0; i < t; ++i) quantize_acts(x.data() + i * k, xq.data() + i * kb, k);
      tp.parallel_range(n, [&](int64_t r0, int64_t r1, int) {
        for (int64_t i = 0; i < t; ++i)
          q4_1_rows_avx2(reinterpret_cast<const BlockQ4_1*>(w.data()), xq.data() + i * kb, y.data() + i * n, r0, r1,
                         kb);
      });
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(n * k * t) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

int register_all() {
  if (cpu::best_isa() < cpu::Isa::AVX2) return 0;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1536, 576}, {2048, 2048}}) {
    for (int64_t t : {1, 8, 64}) {
      for (bool repacked : {false, true}) {
        const std::string name =
            fmt::format("layout/q4_1/{}/{}x{}/t{}/threads:1", repacked ? "rows_x8" : "rows_in_place", n, k, t);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { bm_layout(s, repacked, n, k, t, 1); });
      }
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
}  // namespace tessera::bench
