#include "models/ternary_weights.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "graph/graph.h"
#include "quant/quant.h"

namespace tessera {
namespace {

// BitNet's and Llama's linears, and the MatMul-free LM's MLGRU projections (i, f, g).
constexpr std::array<std::string_view, 10> kLinears = {"attn_q", "attn_k",   "attn_v", "attn_output", "ffn_gate",
                                                       "ffn_up", "ffn_down", "attn_i", "attn_f",      "attn_g"};

bool is_block_linear(std::string_view name, std::string_view suffix, std::string* prefix) {
  if (!name.starts_with("blk.") || !name.ends_with(suffix)) return false;
  if (name.size() <= suffix.size() + 4) return false;
  const std::string_view stem = name.substr(0, name.size() - suffix.size());  // "blk.N.attn_q"
  const size_t dot = stem.rfind('.');
  if (dot == std::string_view::npos) return false;
  if (std::find(kLinears.begin(), kLinears.end(), stem.substr(dot + 1)) == kLinears.end()) return false;
  *prefix = std::string(stem);
  return true;
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Whether w (n elements) is whole blocks of 256, each holding only 0 and ±m for one m in fp16's normal range: what
// TQ2_0's absmax quantizer stores exactly, up to m's rounding to fp16.
bool ternary_blocks(const float* w, int64_t n) {
  if (n % 256 != 0) return false;
  for (int64_t b = 0; b < n; b += 256) {
    float m = 0;
    for (int64_t i = b; i < b + 256; ++i) m = std::max(m, std::fabs(w[i]));
    if (m == 0) continue;
    if (m < 6.2e-5f || m > 65000.0f) return false;
    for (int64_t i = b; i < b + 256; ++i)
      if (w[i] != 0 && std::fabs(w[i]) != m) return false;
  }
  return true;
}

}  // namespace

void unpack_ternary_rows(const uint8_t* packed, int64_t rows, int64_t k, int8_t* out) {
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < k; ++j) {
        const int code = (packed[r * k + j] >> (2 * i)) & 3;
        TESSERA_CHECK(code != 3, "packed ternary weight: code 3 at row {} column {} is not -1, 0 or 1", r, j);
        out[(i * rows + r) * k + j] = static_cast<int8_t>(code - 1);
      }
}

void load_ternary_weights(const ModelConfig& c, const std::string& path, std::vector<TensorView>& tensors,
                          std::vector<std::shared_ptr<std::vector<uint8_t>>>& owned) {
  std::unordered_map<std::string, size_t> scales;  // "blk.N.attn_q" -> index of blk.N.attn_q.scale
  std::string prefix;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (is_block_linear(tensors[i].name, ".scale", &prefix)) scales.emplace(prefix, i);
  if (c.ternary == "none") {
    TESSERA_CHECK(scales.empty(), "{}: tensor '{}.scale' found, but the configuration names no ternary weights", path,
                  scales.empty() ? "" : scales.begin()->first);
    return;
  }
  bool warned = false;  // one line for all the weights that stay float
  for (TensorView& t : tensors) {
    const bool output = c.ternary_output && t.name == "output.weight";
    if (output) prefix = "output";
    if (!output && !is_block_linear(t.name, ".weight", &prefix)) continue;
    TESSERA_CHECK(t.shape.size() == 2, "{}: tensor '{}' has shape {}, expected a matrix", path, t.name,
                  graph::shape_string(t.shape));
    const auto sit = scales.find(prefix);
    const TensorView* scale_t = sit == scales.end() ? nullptr : &tensors[sit->second];
    const bool packed = t.dtype == DType::I8;
    const int64_t k = t.shape[1], n = packed ? 4 * t.shape[0] : t.shape[0];
    float scale = 1;
    if (scale_t != nullptr) {
      TESSERA_CHECK(scale_t->numel() == 1 && can_dequantize(scale_t->dtype) && scale_t->data != nullptr,
                    "{}: tensor '{}' must hold one number", path, scale_t->name);
      dequantize_row(scale_t->dtype, scale_t->data, &scale, 1);
      TESSERA_CHECK(std::isfinite(scale) && scale > 0, "{}: tensor '{}' = {} is not a positive scale", path,
                    scale_t->name, scale);
    }
    // transformers' BitLinear always has a weight_scale buffer; its weights are packed. AutoBitLinear offline has
    // one too; llama.cpp's scales are optional.
    if (c.ternary == "div" || (c.ternary == "mul" && packed))
      TESSERA_CHECK(scale_t != nullptr, "{}: tensor '{}.scale' (weight_scale) is missing", path, prefix);
    TESSERA_CHECK(packed || is_float(t.dtype) || (c.ternary == "mul" && scale_t == nullptr),
                  "{}: tensor '{}' is {}: ternary weights must be packed (uint8) or float", path, t.name,
                  dtype_name(t.dtype));
    if (!packed && !is_float(t.dtype)) continue;  // a ternary format (TQ1_0, TQ2_0) read as stored
    if (t.data == nullptr) {                      // display-only tables: shapes only
      t.shape = {n, k};
      continue;
    }

    // W [n, k] = ternary * scale or / scale, or absmean-ternarized float, in f32 first.
    std::vector<float> w(static_cast<size_t>(n * k));
    if (packed) {
      TESSERA_CHECK(c.ternary != "online", "{}: tensor '{}' is packed, and online quantization reads float weights",
                    path, t.name);
      std::vector<int8_t> q(w.size());
      unpack_ternary_rows(t.data, t.shape[0], k, q.data());
      for (size_t i = 0; i < w.size(); ++i) w[i] = c.ternary == "div" ? float(q[i]) / scale : float(q[i]) * scale;
    } else {
      dequantize_row(t.dtype, t.data, w.data(), n * k);
      if (c.ternary == "online") {
        // BitNet's WeightQuant in f32: s = 1 / max(mean|w|, 1e-5); w = clamp(round(w * s), -1, 1) / s.
        double sum = 0;
        for (float v : w) sum += std::fabs(v);
        const float s = 1.0f / std::max(static_cast<float>(sum / double(w.size())), 1e-5f);
        for (float& v : w) v = std::clamp(std::nearbyint(v * s), -1.0f, 1.0f) / s;
      } else {
        TESSERA_CHECK(c.ternary != "div", "{}: tensor '{}' is not packed, and BitLinear weights are", path, t.name);
        for (float& v : w) v *= scale;
      }
    }
    // TQ2_0 (the CPU's native ternary kernels; CUDA converts it to bf16 at load) where every row is whole blocks of
    // 256 and each block is ternary with its scale in fp16's normal range, so the only change is that scale rounded
    // to fp16 (exact for a bf16 scale; 2^-11 relative for an f32 one, far below the int8 activations' 1/254).
    // Otherwise the narrowest float format that holds the values exactly as the reference computes them: ±scale of a
    // 16-bit scale is exact in that format; online weights take their file's format (WeightQuant casts back).
    DType out = DType::F32;
    if (packed && c.ternary == "mul" && scale_t != nullptr &&
        (scale_t->dtype == DType::BF16 || scale_t->dtype == DType::F16))
      out = scale_t->dtype;
    if (!packed && c.ternary == "online") out = t.dtype;
    if (k % 256 == 0 && ternary_blocks(w.data(), n * k)) {
      out = DType::TQ2_0;
    } else if (!warned) {
      warned = true;
      fmt::print(stderr, "tessera: {}: ternary weight '{}' [{}, {}] stays {} (and so may others): {}\n", path, t.name,
                 n, k, dtype_name(out),
                 k % 256 != 0 ? "its rows are not whole blocks of 256, as TQ2_0 needs"
                              : "a block of 256 is not 0 and ±one scale within fp16's range");
    }
    const uint64_t row = *dtype_row_bytes(out, static_cast<uint64_t>(k));
    auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(row * static_cast<uint64_t>(n)));
    quantize_row(out, w.data(), buf->data(), n * k);
    t.dtype = out;
    t.shape = {n, k};
    t.data = buf->data();
    t.nbytes = buf->size();
    owned.push_back(std::move(buf));
  }
  std::erase_if(tensors, [&](const TensorView& v) { return is_block_linear(v.name, ".scale", &prefix); });
}

}  // namespace tessera
