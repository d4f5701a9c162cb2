// Real-size synthetic models: true hyperparameters, seeded random weights, written as GGUF and mapped.
//
// Quantizing billions of random values with the scalar reference quantizer would take minutes, so the weights come
// from one pool of quantized blocks a little larger than the largest tensor, and each tensor is a window of it at a
// seeded random block offset. Every tensor is still written to its own place in the file (the engine reads distinct
// memory, as with a real model); only the values repeat across tensors, which no speed measurement can see.
#include "tessera/random_model.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numbers>
#include <thread>

#include "api/model_impl.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "models/hgrn_bit.h"
#include "quant/quant.h"

namespace tessera {

namespace {

struct Preset {
  const char* name;
  const char* description;
  int64_t n_layers, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
  float rope_base;
  float norm_eps;
  bool tied_output;
  float llama3_factor;  // 0: no rope scaling; else Llama 3.1-style scaling (low 1, high 4, original context 8192)
};

// Hyperparameters as published in each model's config.json (Hugging Face).
constexpr Preset kPresets[] = {
    {"llama3-8b", "Meta Llama 3 8B", 32, 4096, 32, 8, 128, 14336, 128256, 8192, 500000.0f, 1e-5f, false, 0},
    {"llama3.1-8b", "Meta Llama 3.1 8B", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 500000.0f, 1e-5f, false, 8},
    {"llama3.2-1b", "Meta Llama 3.2 1B", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f, true, 32},
    {"llama3.2-3b", "Meta Llama 3.2 3B", 28, 3072, 24, 8, 128, 8192, 128256, 131072, 500000.0f, 1e-5f, true, 32},
    {"llama2-7b", "Meta Llama 2 7B", 32, 4096, 32, 32, 128, 11008, 32000, 4096, 10000.0f, 1e-5f, false, 0},
    {"llama2-13b", "Meta Llama 2 13B", 40, 5120, 40, 40, 128, 13824, 32000, 4096, 10000.0f, 1e-5f, false, 0},
    {"mistral-7b", "Mistral 7B v0.2", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 1000000.0f, 1e-5f, false, 0},
    {"tinyllama-1.1b", "TinyLlama 1.1B", 22, 2048, 32, 4, 64, 5632, 32000, 2048, 10000.0f, 1e-5f, false, 0},
    {"smollm2-135m", "SmolLM2 135M", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 1e-5f, true, 0},
    {"smollm2-360m", "SmolLM2 360M", 32, 960, 15, 5, 64, 2560, 49152, 8192, 100000.0f, 1e-5f, true, 0},
    {"smollm2-1.7b", "SmolLM2 1.7B", 24, 2048, 32, 32, 64, 8192, 49152, 8192, 130000.0f, 1e-5f, true, 0},
    // The ternary families' shapes as Llamas (SwiGLU, no sub-norms, no activation quantizer), so `--dtype tq2_0`
    // measures a Llama-shaped ternary model beside the BitNet and MatMul-free LM files of the same matrices.
    {"bitnet-2b4t-llama", "BitNet b1.58 2B4T shape as a Llama", 30, 2560, 20, 5, 128, 6912, 128256, 4096, 500000.0f,
     1e-5f, true, 0},
    {"mmfreelm-370m-llama", "MatMul-free LM 370M shape as a Llama", 24, 1024, 16, 16, 64, 2816, 32000, 2048, 10000.0f,
     1e-6f, false, 0},
};

const Preset& find_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p;
  std::string all;
  for (const Preset& p : kPresets) all += std::string(all.empty() ? "" : ", ") + p.name;
  for (const std::string& h : hgrn_bit_preset_names()) all += ", " + h;
  fail("unknown architecture preset '{}' (known: {})", name, all);
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Llama 3.1 rope scaling as per-dimension divisors of the inverse frequencies (the rope_freqs.weight tensor that GGUF
// converters write): long wavelengths are divided by the factor, short ones kept, the band between blended.
std::vector<float> llama3_rope_factors(const Preset& p) {
  constexpr double kLow = 1.0, kHigh = 4.0, kOriginalContext = 8192.0;
  const int64_t half = p.head_dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const double freq = 1.0 / std::pow(double(p.rope_base), double(2 * i) / double(p.head_dim));
    const double wavelen = 2 * std::numbers::pi / freq;
    double f = 1.0;
    if (wavelen > kOriginalContext / kLow) {
      f = p.llama3_factor;
    } else if (wavelen >= kOriginalContext / kHigh) {
      const double smooth = (kOriginalContext / wavelen - kLow) / (kHigh - kLow);
      f = 1.0 / ((1 - smooth) / p.llama3_factor + smooth);
    }
    out[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return out;
}

// A vocabulary that loads in llama.cpp's SentencePiece path (which needs the 256 byte tokens) and in Tessera's, so
// the same synthetic file can be measured by both. The pieces mean nothing; benchmarks feed token ids.
void add_placeholder_vocab(gguf::Writer& w, int64_t n_vocab) {
  constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  tokens.reserve(static_cast<size_t>(n_vocab));
  tokens.push_back("<unk>");
  types.push_back(kUnknown);
  tokens.push_back("<s>");
  types.push_back(kControl);
  tokens.push_back("</s>");
  types.push_back(kControl);
  static const char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
    types.push_back(kByte);
  }
  for (int64_t i = static_cast<int64_t>(tokens.size()); i < n_vocab; ++i) {
    tokens.push_back("<t" + std::to_string(i) + ">");
    types.push_back(kNormal);
  }
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  w.set("tokenizer.ggml.model", gguf::Value::from_string("llama"));
  w.set("tokenizer.ggml.tokens", gguf::Value::from_strings(tokens));
  w.set("tokenizer.ggml.scores", gguf::Value::from_f32s(scores));
  w.set("tokenizer.ggml.token_type", gguf::Value::from_i32s(types));
  w.set("tokenizer.ggml.unknown_token_id", gguf::Value::from_u32(0));
  w.set("tokenizer.ggml.bos_token_id", gguf::Value::from_u32(1));
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::from_u32(2));
  w.set("tokenizer.ggml.add_bos_token", gguf::Value::from_bool(true));
}

// llama.cpp's general.file_type for the dtypes that have one (it only labels the model in its reports).
int file_type_of(DType t) {
  switch (t) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::Q4_0:
      return 2;
    case DType::Q4_1:
      return 3;
    case DType::Q8_0:
      return 7;
    case DType::BF16:
      return 32;
    default:
      return -1;
  }
}

struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;  // [N, K]
};

std::vector<WeightSpec> weight_specs(const Preset& p, int64_t n_layers) {
  const int64_t E = p.n_embd, Q = p.n_head * p.head_dim, KV = p.n_head_kv * p.head_dim, F = p.n_ff;
  std::vector<WeightSpec> w;
  w.push_back({"token_embd.weight", {p.n_vocab, E}});
  for (int64_t l = 0; l < n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.push_back({b + "attn_q.weight", {Q, E}});
    w.push_back({b + "attn_k.weight", {KV, E}});
    w.push_back({b + "attn_v.weight", {KV, E}});
    w.push_back({b + "attn_output.weight", {E, Q}});
    w.push_back({b + "ffn_gate.weight", {F, E}});
    w.push_back({b + "ffn_up.weight", {F, E}});
    w.push_back({b + "ffn_down.weight", {E, F}});
  }
  if (!p.tied_output) w.push_back({"output.weight", {p.n_vocab, E}});
  return w;
}

// `blocks` quantized blocks of seeded random values, uniform with the standard deviation of the usual 0.02 init
// (a std of 0.02 keeps activations finite through every layer), or with `ternary` the values -s, 0, s equally likely
// (the same standard deviation: s = 0.02 sqrt(3/2)), which TQ1_0, TQ2_0 and the float formats hold exactly. Chunks
// are seeded by index, so the pool is the same whatever the thread count.
std::vector<uint8_t> make_pool(DType dt, uint64_t blocks, uint64_t seed, bool ternary = false) {
  const DTypeInfo& info = dtype_info(dt);
  std::vector<uint8_t> pool(blocks * info.type_size);
  constexpr uint64_t kChunkBlocks = 1 << 14;
  const uint64_t chunks = (blocks + kChunkBlocks - 1) / kChunkBlocks;
  const float a = 0.02f * std::sqrt(3.0f), s = 0.02f * std::sqrt(1.5f);
  const unsigned n_threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n_threads; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> buf(kChunkBlocks * info.block_size);
      for (uint64_t c = t; c < chunks; c += n_threads) {
        const uint64_t b0 = c * kChunkBlocks, nb = std::min(kChunkBlocks, blocks - b0);
        uint64_t state = seed * 0x2545F4914F6CDD1Dull + c;
        const size_t n = static_cast<size_t>(nb * info.block_size);
        for (size_t i = 0; i < n; ++i)
          buf[i] = ternary ? s * static_cast<float>(static_cast<int>(splitmix64(state) % 3) - 1)
                           : a * (2.0f * static_cast<float>(splitmix64(state) >> 40) * (1.0f / 16777216.0f) - 1.0f);
        quantize_row(dt, buf.data(), pool.data() + b0 * info.type_size, static_cast<int64_t>(n));
      }
    });
  for (std::thread& th : threads) th.join();
  return pool;
}

void check_free_space(const std::string& path, uint64_t need) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return;  // the writer reports a real I/O failure with the path
  const uint64_t avail = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  TESSERA_CHECK(avail > need + (64ull << 20), "{}: the synthetic model needs {:.2f} GiB but only {:.2f} GiB are free",
                dir.string(), double(need) / double(1ull << 30), double(avail) / double(1ull << 30));
}

// The weights `specs` as windows of one seeded pool of `dt` blocks at seeded offsets (distinct memory for the
// engine to read, values that repeat): checks the disk for them plus `other_bytes` of the file's other tensors, adds
// each weight as a reference into the pool and returns the pool, which must outlive w.write.
std::vector<uint8_t> add_pooled_weights(gguf::Writer& w, const std::vector<WeightSpec>& specs, DType dt, uint64_t seed,
                                        bool ternary, const std::string& path, uint64_t other_bytes) {
  const DTypeInfo& info = dtype_info(dt);
  uint64_t max_blocks = 0, total_bytes = other_bytes;
  for (const WeightSpec& s : specs) {
    const uint64_t blocks = static_cast<uint64_t>(s.shape[0] * s.shape[1]) / info.block_size;
    max_blocks = std::max(max_blocks, blocks);
    total_bytes += blocks * info.type_size;
  }
  // A few extra blocks, so that same-sized tensors start at different offsets.
  const uint64_t pool_blocks = max_blocks + std::max<uint64_t>(max_blocks / 8, 1 << 12);
  check_free_space(path, total_bytes);
  std::vector<uint8_t> pool = make_pool(dt, pool_blocks, seed, ternary);
  uint64_t state = seed;
  for (const WeightSpec& s : specs) {
    const uint64_t blocks = static_cast<uint64_t>(s.shape[0] * s.shape[1]) / info.block_size;
    const uint64_t offset = splitmix64(state) % (pool_blocks - blocks + 1);
    w.add_tensor_ref(s.name, dt, s.shape, pool.data() + offset * info.type_size, blocks * info.type_size);
  }
  return pool;
}

// ---- The MatMul-free LM (hgrn_bit) in its own graph's layout (src/models/hgrn_bit.cpp) ----

// "mmfreelm-1.3b" -> "MatMul-free LM 1.3B"
std::string hgrn_bit_description(const std::string& name) {
  std::string size = name.substr(name.find('-') + 1);
  for (char& ch : size) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return "MatMul-free LM " + size;
}

bool is_hgrn_bit_preset(const std::string& name) {
  const std::vector<std::string> names = hgrn_bit_preset_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Formats that hold ternary x scale exactly: the ternary ones and the float ones. Any other would store a model that
// is not the MatMul-free LM (q8_0 rounds the scale to 127 steps of an fp16 d, q4_0 cannot hold both -s and s, q4_1
// not 0), so it is refused.
bool holds_ternary(DType t) {
  return t == DType::TQ2_0 || t == DType::TQ1_0 || t == DType::BF16 || t == DType::F16 || t == DType::F32;
}

// The tensors the hgrn_bit graph reads, under the names config_from_gguf's "hgrn_bit" expects: every linear (attn_i,
// attn_f, attn_g, attn_output, ffn_gate, ffn_up, ffn_down, output) ternary in `dt` from one pool, each with its own
// input norm (gate and up share ffn_gate's); the embedding bf16 for the ternary formats (the checkpoints' float
// embedding, which Tessera keeps as it is) and `dt` otherwise; norms ones; the lower bounds [L, E] seeded in [-1, 1].
void write_hgrn_bit_model(const RandomModelOptions& o, ModelConfig c, DType dt, const std::string& path) {
  TESSERA_CHECK(holds_ternary(dt),
                "{} (the MatMul-free LM) has ternary weights, which dtype '{}' does not hold exactly (use tq2_0, "
                "tq1_0, bf16, f16 or f32)",
                o.arch, dtype_name(dt));
  TESSERA_CHECK(o.n_layers >= 0, "layer count {} must not be negative", o.n_layers);
  TESSERA_CHECK(o.n_layers <= c.n_layers, "{} has {} layers; {} were asked for", o.arch, c.n_layers, o.n_layers);
  if (o.n_layers > 0) c.n_layers = o.n_layers;
  const int64_t E = c.n_embd, F = c.n_ff, V = c.n_vocab, L = c.n_layers;
  const DType embd_dt = dt == DType::TQ1_0 || dt == DType::TQ2_0 ? DType::BF16 : dt;

  gguf::Writer w;
  const std::string a = "hgrn_bit.";
  w.set("general.architecture", gguf::Value::from_string("hgrn_bit"));
  w.set("general.name",
        gguf::Value::from_string(hgrn_bit_description(o.arch) + " (random " + std::string(dtype_name(dt)) + ", seed " +
                                 std::to_string(o.seed) + ")"));
  w.set(a + "context_length", gguf::Value::from_u32(uint32_t(c.n_ctx_train)));
  w.set(a + "embedding_length", gguf::Value::from_u32(uint32_t(E)));
  w.set(a + "block_count", gguf::Value::from_u32(uint32_t(L)));
  w.set(a + "feed_forward_length", gguf::Value::from_u32(uint32_t(F)));
  w.set(a + "attention.head_count", gguf::Value::from_u32(uint32_t(c.n_head)));
  w.set(a + "attention.head_count_kv", gguf::Value::from_u32(uint32_t(c.n_head_kv)));
  w.set(a + "attention.layer_norm_rms_epsilon", gguf::Value::from_f32(c.norm_eps));
  w.set(a + "vocab_size", gguf::Value::from_u32(uint32_t(V)));
  add_placeholder_vocab(w, V);

  std::vector<WeightSpec> linears;  // [N, K]
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (const char* m : {"attn_i", "attn_f", "attn_g", "attn_output"}) linears.push_back({b + m + ".weight", {E, E}});
    linears.push_back({b + "ffn_gate.weight", {F, E}});
    linears.push_back({b + "ffn_up.weight", {F, E}});
    linears.push_back({b + "ffn_down.weight", {E, F}});
  }
  linears.push_back({"output.weight", {V, E}});
  const DTypeInfo& embd_info = dtype_info(embd_dt);
  const uint64_t embd_blocks = static_cast<uint64_t>(V * E) / embd_info.block_size;
  const std::vector<uint8_t> embd = make_pool(embd_dt, embd_blocks, o.seed + 1);
  w.add_tensor_ref("token_embd.weight", embd_dt, {V, E}, embd.data(), embd.size());
  const std::vector<uint8_t> pool =
      add_pooled_weights(w, linears, dt, o.seed, /*ternary=*/true, path, embd_blocks * embd_info.type_size);
  const std::vector<float> ones(static_cast<size_t>(std::max(E, F)), 1.0f);
  const auto norm = [&](const std::string& name, int64_t n) {
    w.add_tensor(name, DType::F32, {n}, ones.data(), static_cast<uint64_t>(n) * sizeof(float));
  };
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (const char* m : {"attn_norm", "attn_i_in_norm", "attn_f_in_norm", "attn_g_in_norm", "attn_g_norm",
                          "attn_output_in_norm", "ffn_norm", "ffn_gate_in_norm"})
      norm(b + m + ".weight", E);
    norm(b + "ffn_down_in_norm.weight", F);
  }
  norm("output_norm.weight", E);
  norm("output_in_norm.weight", E);
  std::vector<float> lb(static_cast<size_t>(L * E));
  uint64_t lb_state = o.seed ^ 0x6C62ull;
  for (float& v : lb) v = 2.0f * static_cast<float>(splitmix64(lb_state) >> 40) * (1.0f / 16777216.0f) - 1.0f;
  w.add_tensor("lower_bounds", DType::F32, {L, E}, lb.data(), lb.size() * sizeof(float));
  w.write(path);
}

}  // namespace

const std::vector<RandomModelPreset>& random_model_hgrn_bit_presets() {
  static const std::vector<RandomModelPreset> all = [] {
    std::vector<RandomModelPreset> v;
    for (const std::string& name : hgrn_bit_preset_names()) {
      const ModelConfig c = hgrn_bit_preset(name);
      ModelSpec s = spec_of(c);
      s.name = hgrn_bit_description(name);
      v.push_back({name, s.name, s});
    }
    return v;
  }();
  return all;
}

std::string random_model_default_dtype(const std::string& arch) { return is_hgrn_bit_preset(arch) ? "tq2_0" : "q4_0"; }

const std::vector<RandomModelPreset>& random_model_presets() {
  static const std::vector<RandomModelPreset> all = [] {
    std::vector<RandomModelPreset> v;
    for (const Preset& p : kPresets) {
      ModelSpec s;
      s.architecture = "llama";
      s.name = p.description;
      s.n_layers = p.n_layers;
      s.n_embd = p.n_embd;
      s.n_head = p.n_head;
      s.n_head_kv = p.n_head_kv;
      s.head_dim = p.head_dim;
      s.n_ff = p.n_ff;
      s.n_vocab = p.n_vocab;
      s.n_ctx_train = p.n_ctx_train;
      s.tied_output = p.tied_output;
      s.rope_scaling = p.llama3_factor > 0 ? "freqs" : "none";
      v.push_back({p.name, p.description, s});
    }
    return v;
  }();
  return all;
}

std::vector<std::string> random_model_archs() {
  std::vector<std::string> v;
  for (const Preset& p : kPresets) v.emplace_back(p.name);
  for (const std::string& name : hgrn_bit_preset_names()) v.push_back(name);
  return v;
}

void write_random_model(const RandomModelOptions& o, const std::string& path) {
  const std::string dtype = o.dtype.empty() ? random_model_default_dtype(o.arch) : o.dtype;
  const std::optional<DType> dt = dtype_from_name(dtype);
  TESSERA_CHECK(dt.has_value(), "unknown dtype '{}' for the random weights", dtype);
  if (!can_quantize(*dt)) {
    std::string can;
    for (const FormatInfo& f : formats())
      if (f.from_float != nullptr) can += std::string(can.empty() ? "" : ", ") + f.name;
    fail("random weights cannot be made in dtype '{}' (supported: {})", dtype, can);
  }
  if (is_hgrn_bit_preset(o.arch)) return write_hgrn_bit_model(o, hgrn_bit_preset(o.arch), *dt, path);
  const Preset& p = find_preset(o.arch);
  TESSERA_CHECK(o.n_layers >= 0, "layer count {} must not be negative", o.n_layers);
  const int64_t n_layers = o.n_layers == 0 ? p.n_layers : o.n_layers;
  TESSERA_CHECK(n_layers <= p.n_layers, "{} has {} layers; {} were asked for", p.name, p.n_layers, n_layers);

  gguf::Writer w;
  const std::string a = "llama.";
  w.set("general.architecture", gguf::Value::from_string("llama"));
  w.set("general.name", gguf::Value::from_string(std::string(p.description) + " (random " + dtype + ", seed " +
                                                 std::to_string(o.seed) + ")"));
  if (const int ft = file_type_of(*dt); ft >= 0) w.set("general.file_type", gguf::Value::from_u32(uint32_t(ft)));
  w.set(a + "context_length", gguf::Value::from_u32(uint32_t(p.n_ctx_train)));
  w.set(a + "embedding_length", gguf::Value::from_u32(uint32_t(p.n_embd)));
  w.set(a + "block_count", gguf::Value::from_u32(uint32_t(n_layers)));
  w.set(a + "feed_forward_length", gguf::Value::from_u32(uint32_t(p.n_ff)));
  w.set(a + "attention.head_count", gguf::Value::from_u32(uint32_t(p.n_head)));
  w.set(a + "attention.head_count_kv", gguf::Value::from_u32(uint32_t(p.n_head_kv)));
  w.set(a + "attention.key_length", gguf::Value::from_u32(uint32_t(p.head_dim)));
  w.set(a + "attention.value_length", gguf::Value::from_u32(uint32_t(p.head_dim)));
  w.set(a + "rope.dimension_count", gguf::Value::from_u32(uint32_t(p.head_dim)));
  w.set(a + "rope.freq_base", gguf::Value::from_f32(p.rope_base));
  w.set(a + "attention.layer_norm_rms_epsilon", gguf::Value::from_f32(p.norm_eps));
  w.set(a + "vocab_size", gguf::Value::from_u32(uint32_t(p.n_vocab)));
  add_placeholder_vocab(w, p.n_vocab);

  const std::vector<uint8_t> pool =
      add_pooled_weights(w, weight_specs(p, n_layers), *dt, o.seed, /*ternary=*/false, path, 0);
  const std::vector<float> ones(static_cast<size_t>(p.n_embd), 1.0f);
  for (int64_t l = 0; l < n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.add_tensor(b + "attn_norm.weight", DType::F32, {p.n_embd}, ones.data(), ones.size() * sizeof(float));
    w.add_tensor(b + "ffn_norm.weight", DType::F32, {p.n_embd}, ones.data(), ones.size() * sizeof(float));
  }
  w.add_tensor("output_norm.weight", DType::F32, {p.n_embd}, ones.data(), ones.size() * sizeof(float));
  if (p.llama3_factor > 0) {
    const std::vector<float> f = llama3_rope_factors(p);
    w.add_tensor("rope_freqs.weight", DType::F32, {int64_t(f.size())}, f.data(), f.size() * sizeof(float));
  }
  w.write(path);
}

Model make_random_model(const RandomModelOptions& o, const ModelOptions& model_options) {
  std::string dir = o.dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string path = dir + "/tessera-random-XXXXXX";
  // mkstemp reserves a unique name (two benchmarks may run at once); the writer replaces it atomically.
  std::vector<char> name(path.begin(), path.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  TESSERA_CHECK(fd >= 0, "{}: cannot create a temporary file for the synthetic model", dir);
  close(fd);
  path = name.data();
  try {
    write_random_model(o, path);
    Model m = Model::load(path, model_options);
    std::filesystem::remove(path);  // the mapping keeps the data alive; the name goes now so nothing is left behind
    return m;
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    throw;
  }
}

}  // namespace tessera
