#include "backends/cuda/cuda_options.h"

#include <charconv>
#include <functional>
#include <utility>

#include "core/error.h"

namespace tessera::cuda {
namespace {

CudaOptions& slot() {
  static CudaOptions o;
  return o;
}
uint64_t generation = 0;

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (size_t at = 0;;) {
    const size_t next = s.find(sep, at);
    out.push_back(s.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at));
    if (next == std::string_view::npos) return out;
    at = next + 1;
  }
}

template <typename I>
bool parse_int(std::string_view s, I& v) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc{} && end == s.data() + s.size() && !s.empty();
}

bool same_shape(const GemvConfig& a, const GemvConfig& b) {
  return a.threads == b.threads && a.rows == b.rows && a.unroll == b.unroll && a.prefetch == b.prefetch;
}

// One key of parse_cuda_option: its setter and the value as parse_cuda_option takes it back.
struct Key {
  const char* name;
  std::function<void(CudaOptions&, std::string_view key, std::string_view value)> set;
  std::function<std::string(const CudaOptions&)> get;
};

bool parse_bool(std::string_view key, std::string_view v) {
  if (v == "1" || v == "on" || v == "true") return true;
  if (v == "0" || v == "off" || v == "false") return false;
  fail("cuda option {}: '{}' is not 0/1, on/off or true/false", key, v);
}

int parse_int_value(std::string_view key, std::string_view v) {
  int x = 0;
  TESSERA_CHECK(parse_int(v, x), "cuda option {}: '{}' is not an integer", key, v);
  return x;
}

Key flag(const char* name, bool CudaOptions::*field) {
  return {name, [field](CudaOptions& o, std::string_view k, std::string_view v) { o.*field = parse_bool(k, v); },
          [field](const CudaOptions& o) { return std::string(o.*field ? "1" : "0"); }};
}
Key integer(const char* name, int CudaOptions::*field) {
  return {name, [field](CudaOptions& o, std::string_view k, std::string_view v) { o.*field = parse_int_value(k, v); },
          [field](const CudaOptions& o) { return std::to_string(o.*field); }};
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

// A key whose value is one of a few names, each naming one value of an enum field (the error lists them in order).
template <typename E>
Key choice(const char* name, E CudaOptions::*field, std::vector<std::pair<const char*, E>> values) {
  return {name,
          [field, values](CudaOptions& o, std::string_view k, std::string_view v) {
            std::vector<std::string> names;
            for (const auto& [n, e] : values) {
              if (v == n) {
                o.*field = e;
                return;
              }
              names.emplace_back(n);
            }
            const std::string last = names.back();
            names.pop_back();
            fail("cuda option {}: '{}' is not {} or {}", k, v, join(names, ", "), last);
          },
          [field, values](const CudaOptions& o) {
            for (const auto& [n, e] : values)
              if (o.*field == e) return std::string(n);
            return std::string("?");
          }};
}

std::vector<GemvShapeOverride> parse_gemv_shapes(std::string_view v) {
  std::vector<GemvShapeOverride> out;
  if (v.empty()) return out;
  for (std::string_view entry : split(v, ',')) {
    const size_t x = entry.find('x'), eq = entry.find('=');
    const std::vector<std::string_view> cfg =
        eq == std::string_view::npos ? std::vector<std::string_view>{} : split(entry.substr(eq + 1), '/');
    GemvShapeOverride s;
    const bool ok = x != std::string_view::npos && eq != std::string_view::npos && x < eq && cfg.size() == 4 &&
                    parse_int(entry.substr(0, x), s.n) && parse_int(entry.substr(x + 1, eq - x - 1), s.k) &&
                    parse_int(cfg[0], s.config.threads) && parse_int(cfg[1], s.config.rows) &&
                    parse_int(cfg[2], s.config.unroll) && parse_int(cfg[3], s.config.prefetch);
    TESSERA_CHECK(ok, "cuda option gemv_shapes: cannot read '{}' (NxK=threads/rows/unroll/prefetch)", entry);
    out.push_back(s);
  }
  return out;
}

EarlyL2Options parse_early_l2(std::string_view v) {
  const std::vector<std::string_view> p = split(v, '/');
  EarlyL2Options e;
  unsigned bulk = 0;
  const bool ok = (p.size() == 2 || p.size() == 3) && parse_int(p[0], e.blocks) && parse_int(p[1], e.bytes) &&
                  (p.size() == 2 || (parse_int(p[2], bulk) && bulk <= 1));
  TESSERA_CHECK(ok, "cuda option early_l2: cannot read '{}' (blocks/bytes[/bulk], bulk 0 or 1)", v);
  e.bulk = bulk == 1;
  return e;
}

const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      flag("pdl", &CudaOptions::pdl),
      flag("cudnn", &CudaOptions::cudnn),
      choice("quant_gemm", &CudaOptions::quant_gemm,
             {{"auto", QuantGemm::AUTO}, {"tile", QuantGemm::TILE}, {"expand", QuantGemm::EXPAND}}),
      integer("attn_short", &CudaOptions::attn_short),
      integer("attn_compact", &CudaOptions::attn_compact),
      integer("attn_chunk", &CudaOptions::attn_chunk),
      {"gemv_shapes",
       [](CudaOptions& o, std::string_view, std::string_view v) { o.gemv_shapes = parse_gemv_shapes(v); },
       [](const CudaOptions& o) {
         std::vector<std::string> v;
         for (const GemvShapeOverride& s : o.gemv_shapes)
           v.push_back(std::to_string(s.n) + "x" + std::to_string(s.k) + "=" + std::to_string(s.config.threads) + "/" +
                       std::to_string(s.config.rows) + "/" + std::to_string(s.config.unroll) + "/" +
                       std::to_string(s.config.prefetch));
         return join(v, ",");
       }},
      {"early_l2", [](CudaOptions& o, std::string_view, std::string_view v) { o.early_l2 = parse_early_l2(v); },
       [](const CudaOptions& o) {
         return std::to_string(o.early_l2.blocks) + "/" + std::to_string(o.early_l2.bytes) + "/" +
                (o.early_l2.bulk ? "1" : "0");
       }},
      flag("graph", &CudaOptions::graph),
      flag("fuse", &CudaOptions::fuse),
      flag("fuse_attn", &CudaOptions::fuse_attn),
      flag("fold_norm", &CudaOptions::fold_norm),
      flag("fold_swiglu", &CudaOptions::fold_swiglu),
      flag("attn_q8", &CudaOptions::attn_q8),
      choice("quant_norm", &CudaOptions::quant_norm,
             {{"auto", QuantNorm::AUTO},
              {"q4_1", QuantNorm::Q4_1_ONLY},
              {"all", QuantNorm::ALL},
              {"none", QuantNorm::NONE}}),
      choice("teal_walk", &CudaOptions::teal_walk,
             {{"q8_0", TealWalk::Q8_0}, {"auto", TealWalk::AUTO}, {"all", TealWalk::ALL}, {"none", TealWalk::NONE}}),
      flag("chain", &CudaOptions::chain),
      integer("chain_steps", &CudaOptions::chain_steps),
      flag("chain_embed", &CudaOptions::chain_embed),
      flag("sample", &CudaOptions::sample),
      {"drop_ops",
       [](CudaOptions& o, std::string_view, std::string_view v) {
         o.drop_ops.clear();
         if (v.empty()) return;
         for (std::string_view op : split(v, ',')) {
           TESSERA_CHECK(!op.empty(), "cuda option drop_ops: '{}' has an empty op name", v);
           o.drop_ops.emplace_back(op);
         }
       },
       [](const CudaOptions& o) { return join(o.drop_ops, ","); }},
      flag("attn_tma", &CudaOptions::attn_tma),
      flag("x16", &CudaOptions::x16),
      flag("out16", &CudaOptions::out16),
      flag("merge_gate_up", &CudaOptions::merge_gate_up),
      flag("lora_side", &CudaOptions::lora_side),
      flag("teal_union", &CudaOptions::teal_union),
  };
  return k;
}

}  // namespace

const CudaOptions& cuda_options() { return slot(); }

void set_cuda_options(const CudaOptions& o) {
  for (const GemvShapeOverride& s : o.gemv_shapes) {
    bool compiled = false;
    for (const GemvConfig& c : gemv_configs()) compiled = compiled || same_shape(c, s.config);
    TESSERA_CHECK(compiled, "cuda option gemv_shapes: {}/{}/{}/{} (for {}x{}) is not a compiled launch shape",
                  s.config.threads, s.config.rows, s.config.unroll, s.config.prefetch, s.n, s.k);
    TESSERA_CHECK(s.n > 0 && s.k > 0, "cuda option gemv_shapes: {}x{} is not a matrix shape", s.n, s.k);
  }
  TESSERA_CHECK(o.attn_chunk == 0 || (o.attn_chunk >= 64 && o.attn_chunk % 64 == 0 && o.attn_chunk <= (1 << 24)),
                "cuda option attn_chunk: {} is not 0 or a multiple of 64 in 64..2^24", o.attn_chunk);
  TESSERA_CHECK(o.attn_short >= -1, "cuda option attn_short: {} is not -1 (auto), 0 (off) or a position count",
                o.attn_short);
  TESSERA_CHECK(o.attn_compact >= -1, "cuda option attn_compact: {} is not -1 (all windows), 0 (off) or a count",
                o.attn_compact);
  TESSERA_CHECK(o.chain_steps >= 1 && o.chain_steps <= 16, "cuda option chain_steps: {} is outside 1-16",
                o.chain_steps);
  slot() = o;
  ++generation;
}

uint64_t cuda_options_generation() { return generation; }

void parse_cuda_option(CudaOptions& o, std::string_view key_value) {
  const size_t eq = key_value.find('=');
  TESSERA_CHECK(eq != std::string_view::npos, "cuda option '{}' is not key=value", key_value);
  const std::string_view key = key_value.substr(0, eq), value = key_value.substr(eq + 1);
  for (const Key& k : keys())
    if (key == k.name) return k.set(o, key, value);
  fail("cuda option '{}' is unknown (known: {})", key, join(cuda_option_keys(), ", "));
}

std::string format_cuda_options(const CudaOptions& o) {
  std::vector<std::string> v;
  for (const Key& k : keys()) v.push_back(std::string(k.name) + "=" + k.get(o));
  return join(v, " ");
}

const std::vector<std::string>& cuda_option_keys() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Key& k : keys()) v.emplace_back(k.name);
    return v;
  }();
  return names;
}

}  // namespace tessera::cuda
