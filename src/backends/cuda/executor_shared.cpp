// CudaShared (weights, stacks, caches, stream, matmul workspace), per-node profiling and CUDA graph capture.
#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/executor_common.h"
#include "core/error.h"
#include "quant/format_support.h"
#include "quant/quant.h"

namespace tessera::cuda {

// Of a graph weight's format: whether its device copy is quantized (read with 8-bit activations). False for a format
// converted at upload (q6_K -> bf16): the executors then feed it f32 activations, as any bf16 weight.
bool is_quantized_dtype(DType t) { return gemv_quantized(t); }

int64_t state_only_ctx(const CudaBackendOptions& o) { return o.n_ctx > 0 ? o.n_ctx : 4096; }

KvCacheView attention_cache_view(const graph::Node& n, const graph::Tensor& kt, void* k, void* v, int64_t n_seq) {
  KvCacheView cache;
  cache.dtype = kt.dtype;
  cache.k = k;
  cache.v = v;
  cache.n_kv = kt.shape[0];
  cache.n_ctx = kt.shape[1];
  cache.hd = kt.shape[2];
  cache.n_seq = n_seq;
  cache.window = n.params.window;  // the attention kernels mask keys outside it
  if (n.params.head_dim != cache.hd || n.params.n_head_kv != cache.n_kv)
    CudaShared::Impl::unsupported(n, "its head sizes disagree with its cache");
  return cache;
}

graph::MemoryPlanOptions cuda_memory_plan_options(bool decoder) {
  graph::MemoryPlanOptions o;
  o.alignment = kArenaAlignment;
  o.inputs = false;
  o.write_over_input = [decoder](const graph::Node& n, size_t j) {
    if (j != 0) return false;
    if (n.op == graph::Op::ADD) return n.inputs.size() == 2 && n.inputs[0] != n.inputs[1];
    // The decoder's SPARSIFY over its input (its kernel stages the row in shared memory, or reads each entry before
    // the lane that owns it writes it): with calibrated thresholds its launch is then skipped where every reader
    // thresholds x itself (the bf16/f16 sparse GEMVs, a quantized GEMV's q8 input; backend_cuda.cpp). Without this
    // the output had a block of its own and the launch always ran (until the twenty-fourth session).
    if (decoder && n.op == graph::Op::SPARSIFY) return true;
    return decoder && n.op == graph::Op::LAST_ROW;  // T = 1: the last row is the row, no launch
  };
  return o;
}

graph::MemoryPlan plan_cuda_memory(const graph::Graph& g, bool decoder, const std::vector<graph::ExtraBuffer>& extras) {
  return graph::plan_memory(g, cuda_memory_plan_options(decoder), extras);
}

bool fuse_attention_enabled() { return cuda_options().fuse_attn; }

void CudaShared::Impl::unsupported(const graph::Node& n, const std::string& why) {
  fail("cuda backend: node '{}' ({}) cannot run on the GPU: {}", n.name, graph::op_name(n.op), why);
}

namespace {

// MurmurHash3's 64-bit mixing over 8-byte words (one lane), then its finalizer: every input bit reaches every output
// bit. Not cryptographic: the keys it makes are compared only with other weights' (constant_key).
uint64_t hash_bytes(const uint8_t* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  const auto mix = [&h](uint64_t w) {
    w *= 0x87C37B91114253D5ull;
    w = std::rotl(w, 31) * 0x4CF5AD432745937Full;
    h = std::rotl(h ^ w, 27) * 5 + 0x52DCE729;
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, 8);
    mix(w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  mix(tail);
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 33);
}

}  // namespace

std::string constant_key(const graph::Tensor& t) {
  return fmt::format("{} {} {} {:016x}", t.name, dtype_name(t.dtype), graph::shape_string(t.shape),
                     hash_bytes(static_cast<const uint8_t*>(t.data), static_cast<size_t>(t.nbytes())));
}

graph::ChainCostModel cuda_chain_cost_model() { return graph::ChainCostModel{5e13, 3e12, 4}; }

std::vector<float> cuda_weight_values(const graph::Tensor& w) {
  return w.shape.size() == 2 ? dequantize_matrix(w.dtype, w.data, w.shape[0], w.shape[1]) : std::vector<float>{};
}

const DeviceWeight& CudaShared::Impl::weight(const graph::Graph& g, const graph::Node& n, const graph::Tensor& t) {
  if (t.kind != graph::TensorKind::WEIGHT || t.data == nullptr || t.shape.size() != 2)
    unsupported(n, "its weight '" + t.name + "' is not a 2-D weight with data");
  if (g.owns(t.data)) {  // a folded constant: by content, never by its address (DeviceWeights)
    std::string key = constant_key(t);
    if (auto it = constants.find(key); it != constants.end()) return it->second;
    DeviceWeight w = upload_any(n, t, t.data, t.shape[0], t.shape[1]);
    bytes += w.bytes();
    return constants.emplace(std::move(key), std::move(w)).first->second;
  }
  auto it = weights.find(t.data);
  if (it != weights.end()) return it->second;
  DeviceWeight w = upload_any(n, t, t.data, t.shape[0], t.shape[1]);
  bytes += w.bytes();
  return weights.emplace(t.data, std::move(w)).first->second;
}

DeviceWeight CudaShared::Impl::upload_any(const graph::Node& n, const graph::Tensor& t, const void* host, int64_t rows,
                                          int64_t k) {
  const FormatSupport& formats = weight_formats();
  const std::optional<DType> as = formats.runs_as(t.dtype);
  if (!as)
    unsupported(n, "weight '" + t.name + "' is " + std::string(dtype_name(t.dtype)) + ", which Tessera cannot read; " +
                       formats.summary());
  if (*as == t.dtype) return upload_weight(t.dtype, host, rows, k);
  // No kernel for this format: converted on the host once per weight (the device copy replaces it for good).
  const std::vector<uint8_t> converted = convert_for_device(t.dtype, host, rows, k);
  notices.note(formats, t.name, t.dtype);
  return upload_weight(*as, converted.data(), rows, k);
}

const SparseWeight& CudaShared::Impl::sparse_columns(const DeviceWeight& w) {
  std::unique_ptr<SparseWeight>& sw = store->sparse_columns[&w];
  if (!sw) {
    sw = std::make_unique<SparseWeight>(make_sparse_columns(w, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));  // complete before another session's stream may read it
    bytes += sw->data.bytes();
  }
  return *sw;
}

const DeviceWeight& CudaShared::Impl::stack(const graph::Graph& g, const graph::Node& n,
                                            const std::vector<const graph::Tensor*>& members) {
  std::vector<const void*> key;
  for (const graph::Tensor* t : members) {
    if (g.owns(t->data)) unsupported(n, "it stacks '" + t->name + "', a constant of the graph (never stacked)");
    key.push_back(t->data);
  }
  auto it = stacks.find(key);
  if (it != stacks.end()) return *it->second;
  const graph::Tensor& w0 = *members.front();
  const FormatSupport& formats = weight_formats();
  const std::optional<DType> as0 = formats.runs_as(w0.dtype);
  bool mixed = false;  // members in different formats that run as one (q4_K and q6_K, both converted to bf16)
  int64_t rows = 0;
  uint64_t total = 0;
  for (const graph::Tensor* t : members) {
    if (formats.runs_as(t->dtype) != as0 || t->shape.size() != 2 || t->shape[1] != w0.shape[1])
      unsupported(n, "the weights stacked with '" + w0.name + "' differ in format or width");
    mixed |= t->dtype != w0.dtype;
    rows += t->shape[0];
    total += t->nbytes();
  }
  if (mixed) {  // each member converted to the device format on the host, then the rows appended
    std::vector<uint8_t> stacked;
    for (const graph::Tensor* t : members) {
      std::vector<uint8_t> part;
      if (t->dtype == *as0) {
        part.assign(static_cast<const uint8_t*>(t->data), static_cast<const uint8_t*>(t->data) + t->nbytes());
      } else {
        part = convert_for_device(t->dtype, t->data, t->shape[0], t->shape[1]);
        notices.note(formats, t->name, t->dtype);
      }
      stacked.insert(stacked.end(), part.begin(), part.end());
    }
    auto w = std::make_unique<DeviceWeight>(upload_weight(*as0, stacked.data(), rows, w0.shape[1]));
    bytes += w->bytes();
    return *stacks.emplace(std::move(key), std::move(w)).first->second;
  }
  std::vector<uint8_t> stacked(total);  // row-major [N, K] in any format: stacking rows appends bytes
  uint64_t at = 0;
  for (const graph::Tensor* t : members) {
    std::memcpy(stacked.data() + at, t->data, t->nbytes());
    at += t->nbytes();
  }
  auto w = std::make_unique<DeviceWeight>(upload_any(n, w0, stacked.data(), rows, w0.shape[1]));
  bytes += w->bytes();
  return *stacks.emplace(std::move(key), std::move(w)).first->second;
}

namespace {

// The adapters grouped by member (stable: a member's adapters keep the graph's order), so that each member's A
// products are one run of u's columns and its B's one matrix side by side. lora() and augmented() both stack A so.
std::vector<size_t> lora_order(const std::vector<graph::LoraTerm>& terms) {
  std::vector<size_t> order(terms.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return terms[x].member < terms[y].member; });
  return order;
}

bool float_format(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Appends A_stack [R, k] in `type` to *out: every adapter's A rows in `order` (lora_order), each row read from its
// format and written in `type`. lora() and augmented() both stack A so, so that u's columns line up in both.
void append_a_stack(const graph::Graph& g, const std::vector<graph::LoraTerm>& terms, const std::vector<size_t>& order,
                    int64_t k, DType type, std::vector<uint8_t>* out) {
  const size_t row_bytes = static_cast<size_t>(*dtype_row_bytes(type, static_cast<uint64_t>(k)));
  std::vector<float> row(static_cast<size_t>(k));
  for (size_t i : order) {
    const graph::Tensor& a = g.tensor(terms[i].a);
    const size_t a_in = static_cast<size_t>(*dtype_row_bytes(a.dtype, static_cast<uint64_t>(k)));
    for (int64_t j = 0; j < a.shape[0]; ++j) {
      dequantize_row(a.dtype, static_cast<const uint8_t*>(a.data) + static_cast<size_t>(j) * a_in, row.data(), k);
      out->resize(out->size() + row_bytes);
      quantize_row(type, row.data(), out->data() + out->size() - row_bytes, k);
    }
  }
}

}  // namespace

const DeviceAugmented* CudaShared::Impl::augmented(const graph::Graph& g, const graph::Node& n) {
  const std::vector<graph::LoraTerm> terms = graph::lora_terms(g, n);
  if (terms.empty()) return nullptr;
  const graph::Tensor& w0 = g.tensor(n.inputs.at(1));
  const DType type = w0.dtype;
  if (!float_format(type) || weight_formats().runs_as(type) != type || w0.shape.size() != 2) return nullptr;
  const int64_t k = w0.shape[1];
  std::vector<const graph::Tensor*> members;
  std::string key = fmt::format("{} {}:", dtype_name(type), k);
  int64_t rows = 0;
  for (int i = 0; i < n.fusion.n_weights; ++i) {
    const graph::Tensor& t = g.tensor(n.inputs.at(static_cast<size_t>(1 + i)));
    if (t.dtype != type || t.data == nullptr || t.shape.size() != 2 || t.shape[1] != k) return nullptr;
    members.push_back(&t);
    rows += t.shape[0];
    key += fmt::format(" {}", t.data);
  }
  const std::vector<size_t> order = lora_order(terms);
  int64_t r_total = 0;
  key += " A";
  for (size_t i : order) {
    const graph::Tensor& a = g.tensor(terms[i].a);
    if (a.data == nullptr || a.shape.size() != 2 || a.shape[1] != k || !can_dequantize(a.dtype)) return nullptr;
    r_total += a.shape[0];
    key += fmt::format(" {}", a.data);
  }
  if (auto it = augmented_weights.find(key); it != augmented_weights.end()) return it->second.get();
  const size_t row_bytes = static_cast<size_t>(*dtype_row_bytes(type, static_cast<uint64_t>(k)));
  std::vector<uint8_t> host;
  host.reserve(static_cast<size_t>(rows + r_total) * row_bytes);
  for (const graph::Tensor* t : members)
    host.insert(host.end(), static_cast<const uint8_t*>(t->data),
                static_cast<const uint8_t*>(t->data) + static_cast<size_t>(t->shape[0]) * row_bytes);
  append_a_stack(g, terms, order, k, type, &host);
  auto d = std::make_unique<DeviceAugmented>();
  d->aug = upload_weight(type, host.data(), rows + r_total, k);
  bytes += d->aug.bytes();
  const auto view = [&](int64_t row0, int64_t n_rows) {
    DeviceWeight v;
    v.dtype = type;
    v.n = n_rows;
    v.k = k;
    v.layout = d->aug.layout;
    v.quants = DeviceBuffer::view(d->aug.quants.as<uint8_t>() + static_cast<size_t>(row0) * row_bytes,
                                  static_cast<size_t>(n_rows) * row_bytes);
    return v;
  };
  d->head = view(0, rows);
  d->tail = view(rows, r_total);
  return augmented_weights.emplace(std::move(key), std::move(d)).first->second.get();
}

DType lora_a_dtype(DType base) {
  const DType x16 = matmul_x16_type(base);
  return x16 == DType::BF16 ? DType::BF16 : DType::F16;
}

namespace {

// d's b_bd (executor_common.h) from the graph's B tensors: member m's adapters, in lora_order within the member, at
// columns u0_m, u0_m + r_0, ... of its rows, as d's layout placed them; rounded once from B's format to a_type.
DeviceWeight block_diagonal_b(const graph::Graph& g, const graph::Node& n, const std::vector<graph::LoraTerm>& terms,
                              const LoraBLayout& l, DType a_type) {
  int64_t n_total = 0;
  for (int i = 0; i < n.fusion.n_weights; ++i) n_total += g.tensor(n.inputs.at(static_cast<size_t>(1 + i))).shape.at(0);
  const int64_t r_total = l.r_total;
  std::vector<float> bd(static_cast<size_t>(n_total * r_total), 0.0f);  // [N_total, r_total]
  std::vector<int> c0(kLoraMaxMembers, 0);                              // next column of each member's run
  for (size_t i : lora_order(terms)) {
    const graph::Tensor& b = g.tensor(terms[i].b);
    const int m = terms[i].member;
    const int64_t ra = b.shape[1];
    const size_t b_in = static_cast<size_t>(*dtype_row_bytes(b.dtype, static_cast<uint64_t>(ra)));
    TESSERA_CHECK(terms[i].row0 + terms[i].rows <= n_total && l.u0[m] + c0[static_cast<size_t>(m)] + ra <= r_total,
                  "cuda backend: adapter '{}' falls outside its node's stacked output", b.name);
    std::vector<float> brow(static_cast<size_t>(ra));
    for (int64_t j = 0; j < terms[i].rows; ++j) {
      dequantize_row(b.dtype, static_cast<const uint8_t*>(b.data) + static_cast<size_t>(j) * b_in, brow.data(), ra);
      std::copy(brow.begin(), brow.end(),
                bd.begin() + (terms[i].row0 + j) * r_total + l.u0[m] + c0[static_cast<size_t>(m)]);
    }
    c0[static_cast<size_t>(m)] += static_cast<int>(ra);
  }
  const size_t row_bytes = static_cast<size_t>(r_total) * 2;
  std::vector<uint8_t> host(static_cast<size_t>(n_total) * row_bytes);
  for (int64_t j = 0; j < n_total; ++j)
    quantize_row(a_type, bd.data() + j * r_total, host.data() + static_cast<size_t>(j) * row_bytes, r_total);
  return upload_weight(a_type, host.data(), n_total, r_total);
}

}  // namespace

const DeviceLora& CudaShared::Impl::lora(const graph::Graph& g, const graph::Node& n, DType base, bool gemm_b) {
  const std::vector<graph::LoraTerm> terms = graph::lora_terms(g, n);
  if (terms.empty()) unsupported(n, "it has no adapters");
  if (n.fusion.n_weights > kLoraMaxMembers)
    unsupported(n, "its stack of " + std::to_string(n.fusion.n_weights) + " weights has more members than " +
                       std::to_string(kLoraMaxMembers) + " with adapters");
  const DType a_type = lora_a_dtype(base);
  const int64_t k = g.tensor(n.inputs.at(1)).shape.at(1);
  const std::vector<size_t> order = lora_order(terms);
  std::string key = fmt::format("{} {} {}:", dtype_name(a_type), k, n.fusion.n_weights);
  for (size_t i : order) {
    const graph::Tensor& a = g.tensor(terms[i].a);
    const graph::Tensor& b = g.tensor(terms[i].b);
    if (a.data == nullptr || b.data == nullptr || a.shape.size() != 2 || b.shape.size() != 2 || a.shape[1] != k ||
        b.shape[0] != terms[i].rows || b.shape[1] != a.shape[0] || !can_dequantize(a.dtype) || !can_dequantize(b.dtype))
      unsupported(n, "its adapter '" + a.name + "' is not A [r, K] and B [N, r] with data in a readable format");
    key += fmt::format(" {}/{}@{}+{}", a.data, b.data, terms[i].member, terms[i].row0);
  }
  // b_bd where asked for and possible (16-bit A: not beside an f32 base, whose matmuls take no 16-bit x).
  const auto with_bd = [&](DeviceLora& d) -> const DeviceLora& {
    if (gemm_b && d.b_bd.quants.empty() && d.layout.r_total % 8 == 0 && a_type == matmul_x16_type(base)) {
      d.b_bd = block_diagonal_b(g, n, terms, d.layout, a_type);
      bytes += d.b_bd.bytes();
    }
    return d;
  };
  if (auto it = loras.find(key); it != loras.end()) return with_bd(*it->second);

  auto d = std::make_unique<DeviceLora>();
  LoraBLayout& l = d->layout;
  l.n_members = n.fusion.n_weights;
  std::vector<uint8_t> a_host;  // A_stack [R, K] in a_type
  append_a_stack(g, terms, order, k, a_type, &a_host);
  std::vector<uint16_t> b_host;  // the members' B blocks, f16
  int r_total = 0;
  for (int m = 0; m < l.n_members; ++m) {
    std::vector<size_t> mine;
    for (size_t i : order)
      if (terms[i].member == m) mine.push_back(i);
    if (mine.empty()) continue;
    l.row0[m] = terms[mine[0]].row0;
    l.rows[m] = terms[mine[0]].rows;
    l.u0[m] = r_total;
    int r = 0;
    for (size_t i : mine) r += static_cast<int>(g.tensor(terms[i].a).shape[0]);
    l.r[m] = r;
    l.r_pad[m] = (r + 7) / 8 * 8;
    l.b0[m] = static_cast<int64_t>(b_host.size());
    b_host.resize(b_host.size() + static_cast<size_t>(l.rows[m] * l.r_pad[m]), 0);
    int c0 = 0;  // this adapter's first column in the member's B block
    for (size_t i : mine) {
      const graph::Tensor& b = g.tensor(terms[i].b);
      const int64_t ra = g.tensor(terms[i].a).shape[0];
      const size_t b_in = static_cast<size_t>(*dtype_row_bytes(b.dtype, static_cast<uint64_t>(ra)));
      std::vector<float> brow(static_cast<size_t>(ra));
      std::vector<uint16_t> bh(static_cast<size_t>(ra));
      for (int64_t j = 0; j < l.rows[m]; ++j) {
        dequantize_row(b.dtype, static_cast<const uint8_t*>(b.data) + static_cast<size_t>(j) * b_in, brow.data(), ra);
        quantize_row(DType::F16, brow.data(), bh.data(), ra);
        std::copy(bh.begin(), bh.end(), b_host.begin() + l.b0[m] + j * l.r_pad[m] + c0);
      }
      c0 += static_cast<int>(ra);
    }
    r_total += r;
  }
  l.r_total = r_total;
  if (r_total > kLoraMaxRank)
    unsupported(n, "its adapters' ranks sum to " + std::to_string(r_total) + ", more than the " +
                       std::to_string(kLoraMaxRank) + " one launch takes");
  // Beside a bf16 or f16 base, A_stack in a_type is already on the device: the rows after the base's in its augmented
  // weight (the decoder's GEMV over [W; A_stack]), stacked by the same append_a_stack in the same order. Both
  // executors ask for the augmented weight before this, so this finds it uploaded: a view of its rows, not a second
  // copy (~40 MB at Llama-3-8B's shape with rank 16 on all seven projections). f32 bases keep their own f16 A.
  if (const DeviceAugmented* ag = augmented(g, n);
      ag != nullptr && ag->tail.dtype == a_type && ag->tail.n == r_total && ag->tail.k == k) {
    d->a.dtype = a_type;
    d->a.n = r_total;
    d->a.k = k;
    d->a.layout = ag->tail.layout;
    d->a.quants = DeviceBuffer::view(ag->tail.quants.get(), ag->tail.quants.bytes());
  } else {
    d->a = upload_weight(a_type, a_host.data(), r_total, k);
    bytes += d->a.bytes();
  }
  d->b = DeviceBuffer(b_host.size() * sizeof(uint16_t));
  d->b.upload(b_host.data(), d->b.bytes());
  bytes += d->b.bytes();
  return with_bd(*loras.emplace(std::move(key), std::move(d)).first->second);
}

void* CudaShared::Impl::cache(const graph::Tensor& t) {
  if (t.io == graph::IoRole::STATE) {  // the MLGRU's recurrent state: f32 [D + 1] per slot
    TESSERA_CHECK(t.dtype == DType::F32 && t.shape.size() == 1 && t.shape[0] >= 2,
                  "cuda backend: recurrent state '{}' must be f32 [D + 1]", t.name);
    const std::pair<graph::IoRole, int> key{t.io, t.io_layer};
    if (auto it = caches.find(key); it != caches.end()) {
      TESSERA_CHECK(it->second.dtype == t.dtype && it->second.hd == t.shape[0],
                    "cuda backend: recurrent state '{}' has another shape than the graph that created it", t.name);
      return it->second.data.get();
    }
    Cache c;
    c.dtype = t.dtype;
    c.n_kv = c.n_ctx = 1;
    c.hd = t.shape[0];
    const size_t n = static_cast<size_t>(t.nbytes()) * static_cast<size_t>(n_seq);
    c.data = DeviceBuffer(n);
    TESSERA_CUDA_CHECK(cudaMemset(c.data.get(), 0, n));
    bytes += n;
    return caches.emplace(key, std::move(c)).first->second.data.get();
  }
  TESSERA_CHECK(t.dtype == DType::F16 || t.dtype == DType::BF16 || t.dtype == DType::F32,
                "cuda backend: KV cache '{}' is {}; the GPU cache is f16, bf16 or f32", t.name, dtype_name(t.dtype));
  TESSERA_CHECK(t.shape.size() == 3, "cuda backend: KV cache '{}' must be [n_kv, n_ctx, head_dim]", t.name);
  TESSERA_CHECK(t.io == graph::IoRole::CACHE_K || t.io == graph::IoRole::CACHE_V,
                "cuda backend: KV cache '{}' has no cache role (CACHE_K or CACHE_V)", t.name);
  const std::pair<graph::IoRole, int> key{t.io, t.io_layer};
  auto it = caches.find(key);
  if (it != caches.end()) {
    const Cache& c = it->second;
    TESSERA_CHECK(c.dtype == t.dtype && c.n_kv == t.shape[0] && c.n_ctx == t.shape[1] && c.hd == t.shape[2],
                  "cuda backend: KV cache '{}' has another shape or type than the graph that created it", t.name);
    return c.data.get();
  }
  Cache c;
  c.dtype = t.dtype;
  c.n_kv = t.shape[0];
  c.n_ctx = t.shape[1];
  c.hd = t.shape[2];
  const size_t n = static_cast<size_t>(t.nbytes()) * static_cast<size_t>(n_seq);
  c.data = DeviceBuffer(n);
  TESSERA_CUDA_CHECK(cudaMemset(c.data.get(), 0, n));
  bytes += n;
  return caches.emplace(key, std::move(c)).first->second.data.get();
}

GemmWorkspace& CudaShared::Impl::gemm_workspace(int64_t max_k, int64_t max_quant_nk) {
  if (!gemm || max_k > gemm_k || max_quant_nk > gemm_nk) {
    gemm_k = std::max(gemm_k, max_k);
    gemm_nk = std::max(gemm_nk, max_quant_nk);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old workspace may still be in use
    gemm.reset();
    gemm = std::make_unique<GemmWorkspace>(max_rows, gemm_k, gemm_nk);
    ++gemm_generation;
  }
  return *gemm;
}

CudaShared::Impl& shared_impl(std::shared_ptr<CudaShared>& shared, const CudaBackendOptions& options) {
  if (!shared) shared = std::make_shared<CudaShared>(1, 1, options);
  return shared->impl();
}

CudaShared::CudaShared(int64_t n_seq, int64_t max_rows, const CudaBackendOptions& options,
                       std::shared_ptr<DeviceWeights> weights)
    : impl_(std::make_unique<Impl>(std::move(weights))) {
  TESSERA_CHECK(n_seq >= 1, "cuda backend: the sequence count {} must be positive", n_seq);
  TESSERA_CHECK(max_rows >= 1, "cuda backend: the row count {} must be positive", max_rows);
  std::string why;
  TESSERA_CHECK(cuda_available(&why), "device 'cuda' is not available: {}", why);
  set_device(options.device);
  impl_->n_seq = n_seq;
  impl_->max_rows = max_rows;
  impl_->options = options;
  if (!cuda_options().graph) impl_->options.use_graph = false;
  impl_->fuse = cuda_options().fuse;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
}

CudaShared::~CudaShared() {
  if (!impl_ || impl_->stream == nullptr) return;
  (void)cudaStreamSynchronize(impl_->stream);
  impl_->gemm.reset();
  (void)cudaStreamDestroy(impl_->stream);
}

int64_t CudaShared::n_seq() const { return impl_->n_seq; }
int64_t CudaShared::max_rows() const { return impl_->max_rows; }
const CudaBackendOptions& CudaShared::options() const { return impl_->options; }
uint64_t CudaShared::device_bytes() const { return impl_->bytes; }

LaunchRunner::~LaunchRunner() {
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
}

void LaunchRunner::run(const std::vector<Launch>& launches, cudaStream_t stream, const RunArgs& args,
                       std::vector<uint64_t>* profile) {
  if (profile == nullptr) {
    for (const Launch& l : launches) l.fn(stream, args);
    return;
  }
  while (events_.size() < launches.size() + 1) {
    cudaEvent_t e = nullptr;
    TESSERA_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  TESSERA_CUDA_CHECK(cudaEventRecord(events_[0], stream));
  for (size_t i = 0; i < launches.size(); ++i) {
    launches[i].fn(stream, args);
    TESSERA_CUDA_CHECK(cudaEventRecord(events_[i + 1], stream));
  }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < launches.size(); ++i) {
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    const size_t node = static_cast<size_t>(launches[i].node);
    if (node < profile->size()) (*profile)[node] += static_cast<uint64_t>(double(ms) * 1e6);
  }
}

bool capture_graph(const std::vector<Launch>& launches, cudaStream_t stream, const RunArgs& args, cudaGraph_t* graph,
                   cudaGraphExec_t* exec) {
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  bool ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    try {
      for (const Launch& l : launches) l.fn(stream, args);
    } catch (const Error&) {
      ok = false;
    }
    cudaGraph_t gr = nullptr;
    ok = cudaStreamEndCapture(stream, &gr) == cudaSuccess && ok;
    if (ok) ok = cudaGraphInstantiate(exec, gr, 0) == cudaSuccess;
    if (gr != nullptr) {
      if (ok)
        *graph = gr;
      else
        (void)cudaGraphDestroy(gr);
    }
  }
  if (!ok) (void)cudaGetLastError();
  return ok;
}

}  // namespace tessera::cuda
