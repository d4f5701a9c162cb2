// TEAL's sparse GEMV against our dense GEMV (issue 23), at Llama-3-8B's shapes, batch 1: per shape and sparsity, the
// median µs over --reps calls with L2 flushed before each (a memset of 2x the L2 between calls, each call timed by
// its own pair of events: the method of the TEAL table, triton's do_bench), the dense GEMV's time on the same
// x, the GB/s on the bytes each reads (sparse: the surviving channels' lines, the list and y), the share of the
// measured copy bandwidth, and sparse / dense. Also the SPARSIFY kernel's time (top-k form), and a correctness line
// per case: the sparse GEMV against the dense GEMV on the zeroed x (max |diff| / max |y|; quantized formats: the dense
// GEMV reads x rounded to 8 bits, the sparse one f32 x, so they differ by that rounding, ~1e-2). bf16 also times the
// 128- and 256-row tiles (gemv_sparse.h) on the next line. Ends with the bars.
//
// Usage: tessera_bench_sparse [--reps N] [--splits-sweep]   (the sweep over split counts runs at 50% always; the flag
// adds every sparsity)
#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_sparse.h"
#include "backends/cuda/memory.h"
#include "bench_util.h"
#include "core/error.h"

namespace tessera::cuda::bench {
namespace {

struct Options {
  int reps = 200;
  bool splits_sweep = false;
  bool fast = false;
  bool bf16_only =
      false;  // no taller tiles, splits sweeps for the channel-major bf16 form only (one device call's budget)
};

class SparseBench {
 public:
  explicit SparseBench(const Options& opt) : opt_(opt) {
    set_device(0);
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cudaDeviceProp p{};
    TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    l2_bytes_ = static_cast<size_t>(p.l2CacheSize);
    flush_ = DeviceBuffer(2 * l2_bytes_);
    ev0_.resize(static_cast<size_t>(opt_.reps));
    ev1_.resize(static_cast<size_t>(opt_.reps));
    for (int i = 0; i < opt_.reps; ++i) {
      TESSERA_CUDA_CHECK(cudaEventCreate(&ev0_[static_cast<size_t>(i)]));
      TESSERA_CUDA_CHECK(cudaEventCreate(&ev1_[static_cast<size_t>(i)]));
    }
    fmt::print("device: {} ({} SMs, L2 {} MB), {} calls per case, L2 flushed before each\n", p.name,
               p.multiProcessorCount, l2_bytes_ >> 20, opt_.reps);
  }
  ~SparseBench() {
    for (auto e : ev0_) cudaEventDestroy(e);
    for (auto e : ev1_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  void ceilings();
  void run();

 private:
  // Median µs of op over reps calls, L2 flushed (memset 2x L2) before each.
  double time_flushed(const std::function<void()>& op) {
    op();
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int i = 0; i < opt_.reps; ++i) {
      TESSERA_CUDA_CHECK(cudaMemsetAsync(flush_.get(), i & 0xff, flush_.bytes(), stream_));
      TESSERA_CUDA_CHECK(cudaEventRecord(ev0_[static_cast<size_t>(i)], stream_));
      op();
      TESSERA_CUDA_CHECK(cudaEventRecord(ev1_[static_cast<size_t>(i)], stream_));
    }
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<double> us;
    for (int i = 0; i < opt_.reps; ++i) {
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev0_[static_cast<size_t>(i)], ev1_[static_cast<size_t>(i)]));
      us.push_back(ms * 1e3);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }

  Options opt_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> ev0_, ev1_;
  size_t l2_bytes_ = 0;
  DeviceBuffer flush_;
  double copy_gbps_ = 0;
  uint64_t seed_ = 1;
  // (dtype, shape, sparsity) -> sparse µs, dense µs: the bars at the end.
  std::map<std::string, std::pair<double, double>> results_;
};

void SparseBench::ceilings() {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer a(bytes), b(bytes);
  fill_random(FillKind::BYTES, a.get(), bytes, 0, 0, seed_++, stream_);
  std::vector<float> ms;
  cudaEvent_t e0 = ev0_[0], e1 = ev1_[0];
  for (int r = 0; r < 11; ++r) {
    TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream_));
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream_));
    TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream_));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  copy_gbps_ = 2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e9;
  fmt::print("copy bandwidth (device-to-device, read + write): {:.0f} GB/s\n", copy_gbps_);
}

void SparseBench::run() {
  struct Shape {
    int64_t n, k;
    const char* what;
  };
  // y[N] = W[N, K] x[K]: K -> N.
  const Shape shapes[] = {{4096, 4096, "4096x4096 (q, o)"},
                          {1024, 4096, "4096->1024 (k, v)"},
                          {14336, 4096, "4096->14336 (gate, up)"},
                          {4096, 14336, "14336->4096 (down)"}};
  const float sparsities[] = {0.0f, 0.25f, 0.40f, 0.50f, 0.65f, 0.80f};
  const DType formats[] = {DType::BF16, DType::F16, DType::Q8_0, DType::Q4_1, DType::Q4_0};
  fmt::print("\n{:<5} {:<23} {:>5} {:>7} {:>9} {:>9} {:>7} {:>6} {:>9} {:>7} {:>6} {:>8} {:>9}\n", "fmt", "shape",
             "sp%", "achvd%", "sparse us", "dense us", "ratio", "splits", "sparse GB/s", "%copy", "dense GB/s",
             "topk/thr us", "max rel");
  for (DType dtype : formats) {
    if (opt_.bf16_only && dtype != DType::BF16) continue;
    for (const Shape& s : shapes) {
      const bool quant = gemv_quantized(dtype);
      DeviceWeight w;
      w.dtype = dtype;
      w.n = s.n;
      w.k = s.k;
      w.layout = quant ? GemvLayout::SPLIT_Q : GemvLayout::ROWS;
      if (quant) {
        // The SPLIT_Q arrays (kernels.h): random quant bytes, small random fp16 scales (q4_1: (d, m) pairs).
        const size_t qbytes = static_cast<size_t>(s.n * s.k) / (dtype == DType::Q8_0 ? 1 : 2);
        const size_t sbytes = static_cast<size_t>(s.n * s.k / 32) * (dtype == DType::Q4_1 ? 4 : 2);
        w.quants = DeviceBuffer(qbytes);
        w.scales = DeviceBuffer(sbytes);
        fill_random(FillKind::BYTES, w.quants.get(), qbytes, 0, 0, seed_++, stream_);
        fill_random(FillKind::F16, w.scales.get(), sbytes / 2, -0.01f, 0.01f, seed_++, stream_);
      } else {
        w.quants = DeviceBuffer(static_cast<size_t>(s.n * s.k) * 2);
        fill_random(dtype == DType::BF16 ? FillKind::BF16 : FillKind::F16, w.quants.get(),
                    static_cast<size_t>(s.n * s.k), -0.05f, 0.05f, seed_++, stream_);
      }
      DeviceBuffer q8(static_cast<size_t>(s.k)), ds(sizeof(float2) * static_cast<size_t>(s.k / 32));
      const SparseWeight sw = make_sparse_weight(w, stream_);
      // The taller tiles (longer contiguous runs per channel, fewer tiles, more splits): bf16 only, timed beside.
      // The channel-major form (gemv_sparse_x: no list, x thresholded in the GEMV), bf16 and f16.
      std::optional<SparseWeight> cols;
      if (!quant) cols.emplace(make_sparse_columns(w, stream_));
      std::vector<float> xh(static_cast<size_t>(s.k));
      std::vector<SparseWeight> tall;
      if (dtype == DType::BF16 && !opt_.fast)
        for (const int tile : {128, 256}) tall.push_back(make_sparse_weight(w, stream_, tile));
      SparseGemvWorkspace ws(s.n);
      DeviceBuffer x(sizeof(float) * s.k), xz(sizeof(float) * s.k), list(sizeof(SparseEntry) * s.k),
          count(sizeof(int32_t)), zeros(2 * sizeof(unsigned long long));
      DeviceBuffer yd(sizeof(float) * s.n), ys(sizeof(float) * s.n);
      DeviceBuffer list_thr(sizeof(SparseEntry) * s.k), count_thr(sizeof(int32_t));
      fill_random(FillKind::F32, x.get(), static_cast<size_t>(s.k), -1.0f, 1.0f, seed_++, stream_);
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
      x.download(xh.data(), sizeof(float) * s.k);
      std::vector<float> mags(xh.size());
      for (size_t i = 0; i < xh.size(); ++i) mags[i] = std::fabs(xh[i]);
      std::sort(mags.begin(), mags.end());
      for (float sp : sparsities) {
        // f16: the 0% and 50% points only; quantized formats also 40%.
        if (dtype != DType::BF16 && sp != 0.0f && sp != 0.5f && !(quant && sp == 0.4f)) continue;
        TESSERA_CUDA_CHECK(cudaMemsetAsync(zeros.get(), 0, zeros.bytes(), stream_));
        sparsify(x.as<float>(), xz.as<float>(), 1, s.k, sp, -1.0f, list.as<SparseEntry>(), count.as<int32_t>(),
                 zeros.as<unsigned long long>(), stream_);
        int32_t cnt = 0;
        unsigned long long z[2] = {};
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
        count.download(&cnt, sizeof(cnt));
        zeros.download(z, sizeof(z));
        GemvInput in;
        in.f32 = xz.as<float>();
        if (quant) {  // the dense quantized GEMV reads 8-bit x (its quantize_q8 is not timed: the decoder folds it)
          quantize_q8(xz.as<float>(), q8.as<int8_t>(), ds.as<float2>(), s.k, stream_);
          in.q8 = q8.as<int8_t>();
          in.q8_ds = ds.as<float2>();
        }
        gemv(w, in, yd.as<float>(), stream_);
        // Blocks of 32 channels with a survivor: the quantized layout reads their row scales once per tile.
        int64_t blocks_touched = 0;
        if (quant) {
          std::vector<SparseEntry> hl(static_cast<size_t>(cnt));
          list.download(hl.data(), hl.size() * sizeof(SparseEntry));
          int last = -1;
          for (const SparseEntry& e : hl)
            if (e.x / 32 != last) last = e.x / 32, ++blocks_touched;
        }
        gemv_sparse(sw, list.as<SparseEntry>(), count.as<int32_t>(), ys.as<float>(), false, ws, stream_);
        std::vector<float> hd(static_cast<size_t>(s.n)), hs(static_cast<size_t>(s.n));
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
        yd.download(hd.data(), sizeof(float) * s.n);
        ys.download(hs.data(), sizeof(float) * s.n);
        double maxd = 0, maxy = 0;
        for (int64_t i = 0; i < s.n; ++i) {
          maxd =
              std::max(maxd, std::fabs(static_cast<double>(hd[static_cast<size_t>(i)]) - hs[static_cast<size_t>(i)]));
          maxy = std::max(maxy, std::fabs(static_cast<double>(hd[static_cast<size_t>(i)])));
        }
        double rel = maxy > 0 ? maxd / maxy : maxd;
        std::string tall_us;
        for (const SparseWeight& tw : tall) {
          gemv_sparse(tw, list.as<SparseEntry>(), count.as<int32_t>(), ys.as<float>(), false, ws, stream_);
          TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
          ys.download(hs.data(), sizeof(float) * s.n);
          double md = 0;
          for (int64_t i = 0; i < s.n; ++i)
            md = std::max(md, std::fabs(static_cast<double>(hd[static_cast<size_t>(i)]) - hs[static_cast<size_t>(i)]));
          rel = std::max(rel, maxy > 0 ? md / maxy : md);
          const double us = time_flushed([&] {
            gemv_sparse(tw, list.as<SparseEntry>(), count.as<int32_t>(), ys.as<float>(), false, ws, stream_);
          });
          tall_us += fmt::format(" t{}:{:.2f}/{}", tw.tile, us, gemv_sparse_default_splits(tw));
        }
        const int splits = gemv_sparse_default_splits(sw);
        const double sparse_us = time_flushed(
            [&] { gemv_sparse(sw, list.as<SparseEntry>(), count.as<int32_t>(), ys.as<float>(), false, ws, stream_); });
        const double dense_us = time_flushed([&] { gemv(w, in, yd.as<float>(), stream_); });
        const double spfy_us = time_flushed([&] {
          sparsify(x.as<float>(), xz.as<float>(), 1, s.k, sp, -1.0f, list.as<SparseEntry>(), count.as<int32_t>(),
                   nullptr, stream_);
        });
        // The calibrated form (--teal: one compare per entry, no selection) at a fixed threshold of 0.5 (x uniform in
        // [-1, 1]: about half zeroed), into its own list so the top-k list stays for the sweep below.
        const double thr_us = time_flushed([&] {
          sparsify(x.as<float>(), nullptr, 1, s.k, 0.0f, 0.5f, list_thr.as<SparseEntry>(), count_thr.as<int32_t>(),
                   nullptr, stream_);
        });
        const double sparse_bytes =
            static_cast<double>(cnt) * static_cast<double>(sw.bytes_per_channel() + sizeof(SparseEntry)) +
            static_cast<double>(blocks_touched) * static_cast<double>(sw.tiles()) *
                (quant ? sparse_quant_header(dtype) : 0) +
            4.0 * static_cast<double>(s.n);
        const double dense_bytes = static_cast<double>(w.bytes()) + 4.0 * static_cast<double>(s.k + s.n);
        const double sgbps = sparse_bytes / (sparse_us * 1e3), dgbps = dense_bytes / (dense_us * 1e3);
        fmt::print(
            "{:<5} {:<23} {:>5.0f} {:>7.1f} {:>9.2f} {:>9.2f} {:>7.3f} {:>6} {:>9.0f} {:>6.1f}% {:>9.0f} "
            "{:>5.2f}/{:<5.2f} "
            "{:>9.1e}{}\n",
            dtype_name(dtype), s.what, 100.0 * sp, 100.0 * static_cast<double>(z[0]) / static_cast<double>(z[1]),
            sparse_us, dense_us, sparse_us / dense_us, splits, sgbps, 100.0 * sgbps / copy_gbps_, dgbps, spfy_us,
            thr_us, rel, rel > (quant ? 5e-2 : 1e-4) ? "  MISMATCH" : "");
        results_[fmt::format("{} {} {}", dtype_name(dtype), s.what, static_cast<int>(std::lround(100 * sp)))] = {
            sparse_us, dense_us};
        if (cols) {
          // The calibrated-threshold form on the raw x (the threshold: the drop-th smallest magnitude, so the same
          // entries go as top-k's on these tie-free values), and threshold 0 on top-k's zeroed x (--sparsity).
          const auto drop = static_cast<size_t>(std::floor(static_cast<double>(sp) * static_cast<double>(s.k)));
          const float th = drop > 0 ? mags[drop - 1] : 0.0f;
          gemv_sparse_x(*cols, x.as<float>(), th, ys.as<float>(), false, ws, stream_);
          TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
          ys.download(hs.data(), sizeof(float) * s.n);
          double md = 0;
          for (int64_t i = 0; i < s.n; ++i)
            md = std::max(md, std::fabs(static_cast<double>(hd[static_cast<size_t>(i)]) - hs[static_cast<size_t>(i)]));
          const double crel = maxy > 0 ? md / maxy : md;
          const double cus =
              time_flushed([&] { gemv_sparse_x(*cols, x.as<float>(), th, ys.as<float>(), false, ws, stream_); });
          const double zus =
              time_flushed([&] { gemv_sparse_x(*cols, xz.as<float>(), 0.0f, ys.as<float>(), false, ws, stream_); });
          // The default form: the stripe form where it runs (no partials), else the split form.
          const auto [srows, sslices] = gemv_sparse_x_stripe_shape(*cols, x.as<float>());
          const int csplits = srows > 0 ? 1 : gemv_sparse_x_default_splits(*cols);
          const std::string form = srows > 0 ? fmt::format("stripes of {} rows x {} slices", srows, sslices)
                                             : fmt::format("splits {}", csplits);
          const double cbytes = static_cast<double>(cnt) * static_cast<double>(cols->tile) * 2.0 +
                                4.0 * static_cast<double>(s.k) + (csplits > 1 ? 8.0 * csplits * cols->tile : 0.0) +
                                4.0 * static_cast<double>(s.n);
          const double cg = cbytes / (cus * 1e3);
          fmt::print(
              "      cols (channel-major, x thresholded in the GEMV): {:.2f} us ({:.2f} on the zeroed x), "
              "{}, {:.0f} GB/s = {:.1f}% copy, / dense = {:.3f}, max rel {:.1e}{}\n",
              cus, zus, form, cg, 100.0 * cg / copy_gbps_, cus / dense_us, crel, crel > 1e-4 ? "  MISMATCH" : "");
          results_[fmt::format("cols {} {} {}", dtype_name(dtype), s.what, static_cast<int>(std::lround(100 * sp)))] = {
              cus, dense_us};
          if (opt_.splits_sweep || (sp == 0.5f && (!opt_.fast || dtype == DType::BF16))) {
            std::string line;
            for (int sp2 : {1, 2, 4, 8, 12, 16, 24, 32, 48, 64}) {
              if (sp2 < (s.k + 2047) / 2048) continue;
              const double us = time_flushed(
                  [&] { gemv_sparse_x(*cols, x.as<float>(), th, ys.as<float>(), false, ws, stream_, nullptr, sp2); });
              line += fmt::format(" {}:{:.2f}", sp2, us);
            }
            fmt::print("      cols, the split form by splits (splits:us):{}\n", line);
          }
        }
        if (opt_.splits_sweep || (sp == 0.5f && !opt_.fast)) {  // every split count at 50%, all with the flag
          std::string line;
          for (int sp2 : {1, 2, 4, 8, 12, 16, 24, 32, 48, 64}) {
            const double us = time_flushed([&] {
              gemv_sparse(sw, list.as<SparseEntry>(), count.as<int32_t>(), ys.as<float>(), false, ws, stream_, sp2);
            });
            line += fmt::format(" {}:{:.2f}", sp2, us);
          }
          fmt::print("      splits sweep (splits:us):{}\n", line);
        }
      }
    }
  }
  // The bars (TEAL's kernel at 50%: 30.7 us at 4096->14336, 30.9 us at 14336->4096).
  fmt::print("\nbars (issue 23):\n");
  const std::pair<const char*, double> teal50[] = {{"4096->14336 (gate, up)", 30.7}, {"14336->4096 (down)", 30.9}};
  for (const auto& [what, teal] : teal50) {
    for (const char* form : {"bf16", "cols bf16"}) {
      const auto [sp, de] = results_[fmt::format("{} {} 50", form, what)];
      fmt::print("  {} {} 50%: {:.2f} us (<= 22: {}), TEAL {:.1f} / ours = {:.2f}x (>= 1.35: {})\n", form, what, sp,
                 sp <= 22 ? "PASS" : "FAIL", teal, teal / sp, teal / sp >= 1.35 ? "PASS" : "FAIL");
    }
  }
  for (const char* what : {"4096x4096 (q, o)", "4096->1024 (k, v)", "4096->14336 (gate, up)", "14336->4096 (down)"})
    for (const char* form : {"bf16", "cols bf16"}) {
      const auto [sp, de] = results_[fmt::format("{} {} 40", form, what)];
      fmt::print("  {} {} 40%: sparse / dense = {:.3f} (<= 0.62: {})\n", form, what, sp / de,
                 sp / de <= 0.62 ? "PASS" : "FAIL");
    }
  // Quantized (end-to-end goal: q8_0 and q4_1 >= 1.3x dense tok/s at 50%): the kernel's share of the dense time.
  for (const char* f : {"q8_0", "q4_1", "q4_0"})
    for (const char* what : {"4096->14336 (gate, up)", "14336->4096 (down)"}) {
      const auto [sp, de] = results_[fmt::format("{} {} 50", f, what)];
      fmt::print("  {} {} 50%: sparse / dense = {:.3f}\n", f, what, sp / de);
    }
}

int run_main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      opt.reps = std::max(3, std::atoi(argv[++i]));
    } else if (a == "--splits-sweep") {
      opt.splits_sweep = true;
    } else if (a == "--fast") {
      opt.fast = true;
    } else if (a == "--bf16-only") {
      opt.bf16_only = true;
    } else {
      fmt::print(stderr, "usage: tessera_bench_sparse [--reps N] [--splits-sweep] [--fast] [--bf16-only]\n");
      return 2;
    }
  }
  std::string why;
  if (list_devices(&why).empty()) {
    fmt::print(stderr, "tessera_bench_sparse: no CUDA GPU ({})\n", why);
    return 1;
  }
  SparseBench b(opt);
  b.ceilings();
  b.run();
  return 0;
}

}  // namespace
}  // namespace tessera::cuda::bench

int main(int argc, char** argv) {
  try {
    return tessera::cuda::bench::run_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera_bench_sparse: %s\n", e.what());
    return 1;
  }
}
