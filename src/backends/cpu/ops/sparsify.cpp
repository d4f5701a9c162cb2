// SPARSIFY (graph.h; TEAL, graph/passes/sparsify.h): each row of x with its smallest-magnitude entries zeroed. Its own
// node rather than folded into the producer (norm, SwiGLU, attention): one pass over a row of 576-1536 floats costs
// about a microsecond against the matmuls it feeds, and keeps every producer's kernel unchanged.
#include "graph/passes/sparsify.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "backends/cpu/kernels/matmul_sparse.h"
#include "backends/cpu/op_kernel.h"

namespace tessera::cpu {
namespace {

std::atomic<uint64_t> g_zeros{0}, g_total{0}, g_zero_blocks{0}, g_blocks{0};
std::atomic<bool> g_record{false};
std::mutex g_hist_mu;
std::map<int, std::vector<uint64_t>> g_hist;

void record(const graph::Node& n, const float* x, int64_t count) {
  const graph::SparseInput which = graph::sparse_input_of(n.role);
  if (n.layer < 0 || which == graph::SparseInput::COUNT) return;
  std::lock_guard<std::mutex> lock(g_hist_mu);
  std::vector<uint64_t>& h = g_hist[n.layer * 4 + static_cast<int>(which)];
  h.resize(1 << 16);
  for (int64_t i = 0; i < count; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    ++h[(u & 0x7fffffffu) >> 16];
  }
}

// Zeroes |x| <= threshold, or (threshold < 0) the floor(sparsity * k) smallest |x| (ties: the first ones in index
// order), so each row keeps exactly its top k - floor(sparsity * k) magnitudes. Returns the zeros written.
int64_t sparsify_row(const float* x, float* y, int64_t k, float sparsity, float threshold) {
  int64_t zeros = 0;
  if (threshold >= 0) {
    for (int64_t c = 0; c < k; ++c) {
      const bool z = std::fabs(x[c]) <= threshold;
      y[c] = z ? 0.0f : x[c];
      zeros += z;
    }
    return zeros;
  }
  const auto drop = static_cast<int64_t>(std::floor(static_cast<double>(sparsity) * static_cast<double>(k)));
  if (drop <= 0) {
    if (y != x) std::copy(x, x + k, y);
    for (int64_t c = 0; c < k; ++c) zeros += x[c] == 0.0f;
    return zeros;
  }
  // The drop-th smallest magnitude by a radix select on |x|'s bits (non-negative floats order as their bit
  // patterns): a histogram of the top 12 bits finds the bucket holding it, then only that bucket's keys are ordered.
  // Two linear passes; std::nth_element over the whole row cost 10% of a decode step (perf, SmolLM2 at 50%). The
  // histogram (2048 used buckets, 8 KiB) is left zeroed by clearing only the buckets the row touched, and the walk to
  // the cut starts at the row's smallest bucket: a row of 576 floats touches ~100 buckets, so clearing and scanning
  // all of them cost more than the row.
  constexpr int kShift = 20;
  thread_local std::vector<uint32_t> keys, bucket;
  thread_local std::vector<int32_t> hist(1 << (31 - kShift));  // |x|'s bit 31 is 0
  keys.resize(static_cast<size_t>(k));
  uint32_t lowest = ~0u;
  for (int64_t c = 0; c < k; ++c) {
    uint32_t u;
    std::memcpy(&u, &x[c], 4);
    u &= 0x7fffffffu;
    keys[static_cast<size_t>(c)] = u;
    ++hist[u >> kShift];
    lowest = std::min(lowest, u);
  }
  int64_t seen = 0;
  uint32_t hb = lowest >> kShift;
  while (seen + hist[hb] < drop) seen += hist[hb++];
  for (int64_t c = 0; c < k; ++c) hist[keys[static_cast<size_t>(c)] >> kShift] = 0;
  bucket.clear();
  for (int64_t c = 0; c < k; ++c)
    if ((keys[static_cast<size_t>(c)] >> kShift) == hb) bucket.push_back(keys[static_cast<size_t>(c)]);
  const auto nth = bucket.begin() + (drop - 1 - seen);
  std::nth_element(bucket.begin(), nth, bucket.end());
  float cut;  // the drop-th smallest magnitude
  std::memcpy(&cut, &*nth, 4);
  int64_t below = 0;
  for (int64_t c = 0; c < k; ++c) below += std::fabs(x[c]) < cut;
  // Branch-free pass for the entries below the cut (a per-entry branch mispredicts half the time at 50%: it was most
  // of this op's time), then the entries equal to the cut that go too, first ones first (rarely any).
  for (int64_t c = 0; c < k; ++c) {
    const bool z = std::fabs(x[c]) < cut;
    y[c] = z ? 0.0f : x[c];
    zeros += z || x[c] == 0.0f;
  }
  for (int64_t c = 0, ties = drop - below; c < k && ties > 0; ++c)
    if (std::fabs(x[c]) == cut) {
      zeros += x[c] != 0.0f;  // a zero was counted above
      y[c] = 0.0f;
      --ties;
    }
  return zeros;
}

void sparsify(const OpCall& call, int64_t /*n_past*/, ThreadPool& /*pool*/) {
  const auto* x = static_cast<const float*>(call.in[0]);
  auto* y = static_cast<float*>(call.out);
  const graph::OpParams& p = call.node->params;
  const int64_t t = call.out_tensor->shape[0], k = call.out_tensor->shape[1];
  if (g_record.load(std::memory_order_relaxed)) record(*call.node, x, t * k);  // before x may be overwritten
  int64_t zeros = 0;
  int64_t zero_blocks = 0;
  for (int64_t i = 0; i < t; ++i) {
    const float* row = y + i * k;
    zeros += sparsify_row(x + i * k, y + i * k, k, p.sparsity, p.sparse_threshold);
    // Blocks a block-skipping kernel on the file's quantized layout could skip (matmul_sparse.h says why it doesn't).
    if (k % 32 == 0)
      for (int64_t b = 0; b < k; b += 32)
        zero_blocks += std::all_of(row + b, row + b + 32, [](float v) { return v == 0.0f; });
  }
  if (k % 32 == 0) {
    g_zero_blocks.fetch_add(static_cast<uint64_t>(zero_blocks), std::memory_order_relaxed);
    g_blocks.fetch_add(static_cast<uint64_t>(t * k / 32), std::memory_order_relaxed);
  }
  g_zeros.fetch_add(static_cast<uint64_t>(zeros), std::memory_order_relaxed);
  g_total.fetch_add(static_cast<uint64_t>(t * k), std::memory_order_relaxed);
}

[[maybe_unused]] const bool kRegistered = register_op_kernel(graph::Op::SPARSIFY, {.run = sparsify});

}  // namespace

SparsityCounts sparsity_counts() {
  return {g_zeros.load(std::memory_order_relaxed), g_total.load(std::memory_order_relaxed),
          g_zero_blocks.load(std::memory_order_relaxed), g_blocks.load(std::memory_order_relaxed)};
}
void record_activation_histograms(bool on) { g_record.store(on); }

std::map<int, std::vector<uint64_t>> take_activation_histograms() {
  std::lock_guard<std::mutex> lock(g_hist_mu);
  return std::exchange(g_hist, {});
}

void reset_sparsity_counts() {
  g_zeros.store(0, std::memory_order_relaxed);
  g_total.store(0, std::memory_order_relaxed);
  g_zero_blocks.store(0, std::memory_order_relaxed);
  g_blocks.store(0, std::memory_order_relaxed);
}

}  // namespace tessera::cpu
