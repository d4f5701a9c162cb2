#include "cuda_test_util.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <utility>

#include "quant/format_traits.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cuda::test {

std::string gpu_skip_reason() {
  static const std::string reason = [] {
    std::string why;
    const auto devices = list_devices(&why);
    if (devices.empty()) return "no CUDA GPU here (" + why + ")";
    if (devices[0].cc_major < 9)
      return "GPU 0 (" + devices[0].name + ") is older than compute capability 9.0, which the kernels are built for";
    set_device(0);
    return std::string();
  }();
  return reason;
}

uint32_t test_seed() {
  if (const char* s = std::getenv("TESSERA_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  const uint32_t seed = std::random_device{}();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("[ seed     ] TESSERA_TEST_SEED=%u\n", seed);
  return seed;
}

std::vector<float> random_floats(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> random_ids(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& x : ids) x = u(rng);
  return ids;
}

float cache_to_float(DType dtype, uint16_t bits) { return dtype == DType::F16 ? fp16_to_f32(bits) : bf16_to_f32(bits); }
uint16_t float_to_cache(DType dtype, float v) { return dtype == DType::F16 ? f32_to_fp16(v) : f32_to_bf16(v); }

std::vector<float> llama_inv_freq(int64_t rope_dim, double base) {
  std::vector<float> f(rope_dim / 2);
  for (int64_t i = 0; i < rope_dim / 2; ++i)
    f[i] = static_cast<float>(std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim)));
  return f;
}

void quantize_q8_ref(const float* x, int8_t* q8, float2* ds, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(std::roundf(x[b * 32 + j] * id));
      q8[b * 32 + j] = static_cast<int8_t>(q);
      sum += q;
    }
    ds[b] = float2{d, d * static_cast<float>(sum)};
  }
}

std::vector<uint8_t> random_weight(std::mt19937& rng, DType dtype, int64_t n, int64_t k) {
  const uint64_t row_bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
  std::vector<uint8_t> w(row_bytes * n);
  // Rows of different scales (as trained weights have), so per-block scales vary.
  std::uniform_real_distribution<float> row_scale(0.05f, 2.0f);
  for (int64_t i = 0; i < n; ++i) {
    auto row = random_floats(rng, static_cast<size_t>(k));
    const float s = row_scale(rng);
    for (auto& x : row) x *= s;
    quantize_row(dtype, row.data(), w.data() + i * row_bytes, k);
  }
  return w;
}

void gemv_ref(DType dtype, const std::vector<uint8_t>& w, int64_t n, int64_t k, const float* x, std::vector<double>& y,
              std::vector<double>& mag, const float* dx, std::vector<double>* absw_dx) {
  const uint64_t row_bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
  y.assign(n, 0.0);
  mag.assign(n, 0.0);
  if (absw_dx) absw_dx->assign(n, 0.0);
  std::vector<float> row(k);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = w.data() + i * row_bytes;
    dequantize_row(dtype, src, row.data(), k);
    double acc = 0, m = 0, e = 0;
    for (int64_t j = 0; j < k; ++j) {
      const double wx = static_cast<double>(row[j]) * x[j];
      acc += wx;
      double term = std::fabs(wx);
      const int64_t b = j / 32, jj = j % 32;
      if (dtype == DType::Q4_0) {
        const uint8_t* blk = src + b * 18;
        const double d = fp16_to_f32(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
        const int q = jj < 16 ? (blk[2 + jj] & 15) : (blk[2 + jj - 16] >> 4);
        term = std::fabs(d) * (q + 8) * std::fabs(x[j]);
      } else if (dtype == DType::Q4_1) {
        const uint8_t* blk = src + b * 20;
        const double d = fp16_to_f32(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
        const double mn = fp16_to_f32(static_cast<uint16_t>(blk[2] | (blk[3] << 8)));
        const int q = jj < 16 ? (blk[4 + jj] & 15) : (blk[4 + jj - 16] >> 4);
        term = (std::fabs(d) * q + std::fabs(mn)) * std::fabs(x[j]);
      } else if (dtype == DType::Q4_K) {
        // w = d sc q - dmin m: the kernel rounds both terms (and their difference), as q4_1's.
        BlockQ4_K blk;
        std::memcpy(&blk, src + (j / kQKK) * sizeof(BlockQ4_K), sizeof(blk));
        const int e = static_cast<int>(j % kQKK), sub = e / 32, l = e % 32;
        int sc = 0, mn = 0;
        format_detail::q4_k_scale_min(sub, blk.scales, &sc, &mn);
        const int q = (blk.qs[32 * (sub / 2) + l] >> (4 * (sub & 1))) & 0xF;
        term = (std::fabs(fp16_to_f32(blk.d)) * sc * q + std::fabs(fp16_to_f32(blk.dmin)) * mn) * std::fabs(x[j]);
      } else if (dtype == DType::TQ2_0 || dtype == DType::TQ1_0) {
        // w = d (q - 1): the kernel sums d_x q q_x and subtracts d_x sum q_x apart, |d| (q + 1) |x| <= (|w| + 2 |d|)
        // |x|.
        const uint8_t* blk = src + (j / kQKK) * (dtype == DType::TQ2_0 ? 66 : 54);
        const int at = dtype == DType::TQ2_0 ? 64 : 52;
        const double d = fp16_to_f32(static_cast<uint16_t>(blk[at] | (blk[at + 1] << 8)));
        term = (std::fabs(static_cast<double>(row[j])) + 2 * std::fabs(d)) * std::fabs(x[j]);
      } else if (dtype == DType::Q5_K) {  // as q4_K, with the fifth bit
        BlockQ5_K blk;
        std::memcpy(&blk, src + (j / kQKK) * sizeof(BlockQ5_K), sizeof(blk));
        const int e = static_cast<int>(j % kQKK), sub = e / 32, l = e % 32;
        int sc = 0, mn = 0;
        format_detail::q4_k_scale_min(sub, blk.scales, &sc, &mn);
        const int q = Format<DType::Q5_K>::code(blk, sub, l);
        term = (std::fabs(fp16_to_f32(blk.d)) * sc * q + std::fabs(fp16_to_f32(blk.dmin)) * mn) * std::fabs(x[j]);
      } else if (dtype == DType::Q5_0) {  // as q4_0, with the offset 16: d (dx sum(q qx) - 16 dx sum(qx))
        BlockQ5_0 blk;
        std::memcpy(&blk, src + b * sizeof(blk), sizeof(blk));
        const int q = format_detail::q5_code(blk.qs, blk.qh, static_cast<int>(jj));
        term = std::fabs(fp16_to_f32(blk.d)) * (q + 16) * std::fabs(x[j]);
      } else if (dtype == DType::Q5_1) {  // as q4_1
        BlockQ5_1 blk;
        std::memcpy(&blk, src + b * sizeof(blk), sizeof(blk));
        const int q = format_detail::q5_code(blk.qs, blk.qh, static_cast<int>(jj));
        term = (std::fabs(fp16_to_f32(blk.d)) * q + std::fabs(fp16_to_f32(blk.m))) * std::fabs(x[j]);
      } else if (dtype == DType::Q2_K) {  // w = d sc q - dmin m per 16 elements: both terms rounded, as q4_K's
        BlockQ2_K blk;
        std::memcpy(&blk, src + (j / kQKK) * sizeof(BlockQ2_K), sizeof(blk));
        const int e = static_cast<int>(j % kQKK), s = blk.scales[e / 16];
        const int q = format_detail::k_quant_2bit(blk.qs, e);
        term = (std::fabs(fp16_to_f32(blk.d)) * (s & 0xF) * q + std::fabs(fp16_to_f32(blk.dmin)) * (s >> 4)) *
               std::fabs(x[j]);
      }
      m += term;
      if (dx) e += std::fabs(row[j]) * dx[b] * 0.5;
    }
    y[i] = acc;
    mag[i] = m;
    if (absw_dx) (*absw_dx)[i] = e;
  }
}

void rmsnorm_ref(const float* x, const float* w, double* y, int64_t t, int64_t d, float eps) {
  for (int64_t i = 0; i < t; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[i * d + j]) * x[i * d + j];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t j = 0; j < d; ++j) y[i * d + j] = x[i * d + j] * r * w[j];
  }
}

void rope_head_ref(const float* x, double* out, int64_t hd, int64_t rope_dim, int32_t pos, const float* inv_freq,
                   bool neox) {
  for (int64_t e = 0; e < hd; ++e) out[e] = x[e];
  const int64_t half = rope_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float theta = static_cast<float>(pos) * inv_freq[i];
    const double c = std::cos(static_cast<double>(theta)), s = std::sin(static_cast<double>(theta));
    const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    out[a] = x[a] * c - x[b] * s;
    out[b] = x[a] * s + x[b] * c;
  }
}

void attn_decode_ref(const float* q, const std::vector<float>& k, const std::vector<float>& v, int64_t n_ctx,
                     int64_t n_head, int64_t n_kv, int64_t hd, int32_t pos, float scale, std::vector<double>& out) {
  out.assign(n_head * hd, 0.0);
  const int64_t group = n_head / n_kv;
  std::vector<double> s(pos + 1);
  for (int64_t h = 0; h < n_head; ++h) {
    const int64_t kvh = h / group;
    double m = -INFINITY;
    for (int64_t p = 0; p <= pos; ++p) {
      double dot = 0;
      for (int64_t i = 0; i < hd; ++i) dot += static_cast<double>(q[h * hd + i]) * k[(kvh * n_ctx + p) * hd + i];
      s[p] = dot * scale;
      m = std::fmax(m, s[p]);
    }
    double l = 0;
    for (int64_t p = 0; p <= pos; ++p) l += (s[p] = std::exp(s[p] - m));
    for (int64_t p = 0; p <= pos; ++p)
      for (int64_t i = 0; i < hd; ++i) out[h * hd + i] += s[p] / l * v[(kvh * n_ctx + p) * hd + i];
  }
}

double worst_rel(const std::vector<float>& a, const std::vector<float>& b, size_t width) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t r = 0; r + width <= std::min(a.size(), b.size()); r += width) {
    for (size_t i = r; i < r + width; ++i) EXPECT_TRUE(std::isfinite(b[i])) << "logit " << i;
    worst = std::max(worst, rel_l2(b.data() + r, a.data() + r, width));
  }
  return worst;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t at = 0;
  for (const SafetensorsEntry& e : entries) {
    std::string shape;
    for (int64_t d : e.shape) {
      if (!shape.empty()) shape += ',';
      shape += std::to_string(d);
    }
    const uint64_t end = at + e.data.size() * sizeof(float);
    header += ",\"" + e.name + "\":{\"dtype\":\"F32\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(at) + "," + std::to_string(end) + "]}";
    at = end;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const SafetensorsEntry& e : entries)
    f.write(reinterpret_cast<const char*>(e.data.data()), static_cast<std::streamsize>(e.data.size() * sizeof(float)));
  if (!f) throw std::runtime_error("cannot write " + path);
}

void write_peft_adapter(const std::string& dir, int64_t n_layers, int64_t n_embd, int64_t q_dim, int64_t kv_dim,
                        int64_t n_ff, int64_t r, float b_range, uint32_t seed) {
  const std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> targets = {
      {"self_attn.q_proj", {q_dim, n_embd}}, {"self_attn.k_proj", {kv_dim, n_embd}},
      {"self_attn.v_proj", {kv_dim, n_embd}}, {"self_attn.o_proj", {n_embd, q_dim}},
      {"mlp.gate_proj", {n_ff, n_embd}},      {"mlp.up_proj", {n_ff, n_embd}},
      {"mlp.down_proj", {n_embd, n_ff}}};
  std::mt19937 rng(seed);
  std::vector<SafetensorsEntry> entries;
  for (int64_t l = 0; l < n_layers; ++l)
    for (const auto& [mod, nk] : targets) {
      const auto [n, k] = nk;
      const std::string p = "base_model.model.model.layers." + std::to_string(l) + "." + mod;
      std::uniform_real_distribution<float> ua(-1.0f / std::sqrt(float(k)), 1.0f / std::sqrt(float(k)));
      std::uniform_real_distribution<float> ub(-b_range, b_range);
      SafetensorsEntry a{p + ".lora_A.weight", {r, k}, std::vector<float>(static_cast<size_t>(r * k))};
      SafetensorsEntry b{p + ".lora_B.weight", {n, r}, std::vector<float>(static_cast<size_t>(n * r))};
      for (float& x : a.data) x = ua(rng);
      for (float& x : b.data) x = ub(rng);
      entries.push_back(std::move(a));
      entries.push_back(std::move(b));
    }
  write_safetensors(dir + "/adapter_model.safetensors", entries);
  std::ofstream(dir + "/adapter_config.json")
      << "{\"peft_type\":\"LORA\",\"r\":" << r << ",\"lora_alpha\":" << 2 * r
      << ",\"bias\":\"none\",\"target_modules\":[\"q_proj\",\"k_proj\",\"v_proj\",\"o_proj\",\"gate_proj\","
         "\"up_proj\",\"down_proj\"]}";
}

}  // namespace tessera::cuda::test
