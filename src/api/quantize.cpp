// quantize_model: llama-quantize's file, written by Tessera (include/tessera/quantize.h has the contract).
//
// What makes the bytes equal to llama-quantize's (llama.cpp src/llama-quant.cpp, read for its rules):
// - metadata: the input's pairs in order, then general.quantization_version = 2 and general.file_type (both u32,
//   removed from their old place: gguf_set_val removes a key before appending it), split.* dropped;
// - tensors ordered as llama_model_loader's weights_map (layer number from "blk.%d.", -1 for other names, then name),
//   n_dims without trailing ne of 1 (ggml_n_dims), data aligned to 32 and padded after every tensor;
// - the type of each tensor from llama_tensor_get_type (tensor_allows_quantization, the category rules with the
//   attn_v / ffn_down counters taken in that order, tensor_type_fallback);
// - GGML's reference quantizers (quant/quantize_ggml.h); rows are independent, so the thread count changes nothing.
#include "tessera/quantize.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/model_format.h"
#include "formats/safetensors.h"
#include "models/config.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "quant/quantize_ggml.h"
#include "runtime/tokenizer_vocab.h"

namespace tessera {
namespace {

// llama.cpp's LLAMA_FTYPE values (include/llama.h) for the mixes Tessera writes.
enum FileType : uint32_t {
  FT_F32 = 0,
  FT_F16 = 1,
  FT_Q4_0 = 2,
  FT_Q4_1 = 3,
  FT_Q8_0 = 7,
  FT_Q5_0 = 8,
  FT_Q5_1 = 9,
  FT_Q4_K_M = 15,
  FT_Q5_K_M = 17,
  FT_Q6_K = 18,
  FT_IQ4_NL = 25,
  FT_BF16 = 32,
  FT_TQ1_0 = 36,
  FT_TQ2_0 = 37,
};

struct Mix {
  const char* name;
  FileType ftype;
  DType base;  // llama_ftype_get_default_type
  const char* description;
};

constexpr Mix kMixes[] = {
    {"q4_0", FT_Q4_0, DType::Q4_0, "4.5 bits per weight, scale per 32; output q6_K"},
    {"q4_1", FT_Q4_1, DType::Q4_1, "5 bits per weight, scale and minimum per 32; output q6_K"},
    {"q5_0", FT_Q5_0, DType::Q5_0, "5.5 bits per weight, scale per 32; output q6_K"},
    {"q5_1", FT_Q5_1, DType::Q5_1, "6 bits per weight, scale and minimum per 32; output q6_K"},
    {"iq4_nl", FT_IQ4_NL, DType::IQ4_NL,
     "4.5 bits per weight, non-linear levels per 32; ffn_down of the first 1/8 of the layers (and attn_v with 4+ "
     "query heads per kv head) q5_K; output q6_K"},
    {"q4_K_M", FT_Q4_K_M, DType::Q4_K, "q4_K; attn_v and ffn_down of about half the layers q6_K; output q6_K"},
    {"q5_K_M", FT_Q5_K_M, DType::Q5_K, "q5_K; attn_v and ffn_down of about half the layers q6_K; output q6_K"},
    {"q6_K", FT_Q6_K, DType::Q6_K, "6.56 bits per weight, super-blocks of 256"},
    {"q8_0", FT_Q8_0, DType::Q8_0, "8.5 bits per weight, scale per 32"},
    {"tq1_0", FT_TQ1_0, DType::TQ1_0,
     "1.69 bits per weight, ternary {-1, 0, 1} times a scale per 256 (for models trained ternary); token_embd q4_K; "
     "output q6_K; rows not a multiple of 256 q4_0"},
    {"tq2_0", FT_TQ2_0, DType::TQ2_0,
     "2.06 bits per weight, ternary as tq1_0 in 2-bit fields (faster to read); token_embd q4_K; output q6_K; rows not "
     "a multiple of 256 q4_0"},
    {"f16", FT_F16, DType::F16, "IEEE half"},
    {"bf16", FT_BF16, DType::BF16, "bfloat16"},
    {"f32", FT_F32, DType::F32, "IEEE single"},
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

const Mix& find_mix(const std::string& type) {
  std::string t = lower(type);
  if (t == "q4_k") t = "q4_k_m";  // llama-quantize's aliases
  if (t == "q5_k") t = "q5_k_m";
  for (const Mix& m : kMixes)
    if (lower(m.name) == t || t == std::to_string(m.ftype)) return m;  // llama-quantize also takes the ftype number
  std::string names;
  for (const Mix& m : kMixes) names += std::string(names.empty() ? "" : ", ") + m.name;
  fail("unknown quantization type '{}' (types: {})", type, names);
}

// GGML's spelling of a dtype ("q4_K"), as llama-quantize prints it.
std::string ggml_name(DType t) {
  std::string s(dtype_name(t));
  if (s.size() > 2 && s.ends_with("_k")) s.back() = 'K';
  return s;
}

bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// A tensor of the input, with the row order it is written in.
struct Source {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // row-major; leading 1s dropped (ggml_n_dims)
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  int64_t permute_heads = 0;  // > 0: a Hugging Face q/k projection whose rows are reordered for GGUF's rope pairs
  int layer = -1;             // from "blk.%d.", as llama_model_loader's weights_map orders tensors
  bool vector_f32 = false;    // Hugging Face 1-D tensors (norms, biases) are stored f32, as convert_hf_to_gguf does
};

int64_t row_len(const Source& s) { return s.shape.back(); }
int64_t row_count(const Source& s) {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < s.shape.size(); ++i) n *= s.shape[i];
  return n;
}

// The source row (element of a 1-D bias) written as output row `o`. convert_hf_to_gguf's permute: rows of head h are
// (pair j, index i) in Hugging Face's rotate-half order and (index i, pair j) in GGUF's interleaved one.
int64_t source_row(const Source& s, int64_t o) {
  if (s.permute_heads <= 0) return o;
  const int64_t half = s.shape[0] / s.permute_heads / 2;  // q/k are 2-D weights or 1-D biases: permute dim 0
  const int64_t h = o / (2 * half), rem = o % (2 * half);
  return h * 2 * half + (rem % 2) * half + rem / 2;
}

// ---- llama_tensor_get_type

enum class Category {
  TOKEN_EMBD,
  ATTN_Q,
  ATTN_V,
  ATTN_K,
  ATTN_QKV,
  ATTN_KV_B,
  ATTN_OUTPUT,
  FFN_UP,
  FFN_GATE,
  FFN_DOWN,
  OUTPUT,
  OTHER
};

bool has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

Category category_of(const std::string& n) {
  if (n == "output.weight") return Category::OUTPUT;
  if (n == "token_embd.weight" || n == "per_layer_token_embd.weight") return Category::TOKEN_EMBD;
  if (has(n, "attn_qkv.weight")) return Category::ATTN_QKV;
  if (has(n, "attn_kv_b.weight")) return Category::ATTN_KV_B;
  if (has(n, "attn_v.weight")) return Category::ATTN_V;
  if (has(n, "attn_k.weight")) return Category::ATTN_K;
  if (has(n, "attn_q.weight")) return Category::ATTN_Q;
  if (has(n, "attn_output.weight")) return Category::ATTN_OUTPUT;
  if (has(n, "ffn_up")) return Category::FFN_UP;
  if (has(n, "ffn_gate")) return Category::FFN_GATE;
  if (has(n, "ffn_down")) return Category::FFN_DOWN;
  return Category::OTHER;
}

bool is_attn_v_like(Category c) { return c == Category::ATTN_V || c == Category::ATTN_QKV || c == Category::ATTN_KV_B; }

// tensor_allows_quantization: 2-D or larger weights, except norms, routers, positional tables and the small
// architecture-specific ones llama.cpp lists.
bool allows_quantization(const Source& s, const std::string& arch) {
  if (s.shape.size() < 2) return false;
  const std::string& n = s.name;
  if (!n.ends_with("weight")) return false;
  static const char* const kNever[] = {"_norm.weight",
                                       "ffn_gate_inp.weight",
                                       "ffn_gate_tid2eid.weight",
                                       "altup",
                                       "laurel",
                                       "per_layer_model_proj",
                                       "ssm_conv1d",
                                       "shortconv.conv.weight",
                                       "indexer.k_proj.weight",
                                       "indexer.q_proj.weight",
                                       "time_mix_first.weight",
                                       "time_mix_w0.weight",
                                       "time_mix_w1.weight",
                                       "time_mix_w2.weight",
                                       "time_mix_v0.weight",
                                       "time_mix_v1.weight",
                                       "time_mix_v2.weight",
                                       "time_mix_a0.weight",
                                       "time_mix_a1.weight",
                                       "time_mix_a2.weight",
                                       "time_mix_g1.weight",
                                       "time_mix_g2.weight",
                                       "time_mix_decay_w1.weight",
                                       "time_mix_decay_w2.weight",
                                       "time_mix_lerp_fused.weight",
                                       "attn_rel_b.weight",
                                       ".position_embd",
                                       "sam.pos_embd",
                                       "sam.neck.",
                                       "sam.net_",
                                       ".rel_pos",
                                       ".patch_embd",
                                       ".patch_merger",
                                       "a.rvq.codebook",
                                       "mm.a.code_embd"};
  for (const char* p : kNever)
    if (has(n, p)) return false;
  if (n == "position_embd.weight" || n == "token_types.weight") return false;
  if (arch == "glm5-next") {
    static const char* const kGlm[] = {"hc_",
                                       "indexer.attn_q_b",
                                       "indexer.attn_k",
                                       "indexer.proj",
                                       "indexer_compressor_gate",
                                       "indexer_compressor_ape",
                                       "ssm_f_a.weight",
                                       "ssm_f_b.weight",
                                       "ssm_g_a.weight",
                                       "ssm_g_b.weight",
                                       "ssm_beta.weight",
                                       "attn_kv_a_mqa.weight",
                                       "attn_k_b.weight",
                                       "attn_v_b.weight"};
    for (const char* p : kGlm)
      if (has(n, p)) return false;
  }
  return true;
}

struct Hparams {
  std::string arch;
  int64_t n_layer = 0, n_head = 0, n_head_kv = 0, n_expert = 0;
  int64_t n_gqa() const { return n_head_kv > 0 ? n_head / n_head_kv : 0; }
  bool is_70b() const { return arch == "llama" && n_layer == 80 && n_head != n_head_kv; }
};

struct TypeChooser {
  const Mix& mix;
  const Hparams& hp;
  int n_attention_wv = 0, i_attention_wv = 0, i_ffn_down = 0, i_ffn_gate = 0, i_ffn_up = 0;
  bool tied = true;  // no output.weight: token_embd takes the output's type
  std::function<void(const std::string&)> warn;
  int64_t n_fallback = 0;

  static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

  std::pair<int, int> layer_info(int counter, const std::string& name) const {
    int i_layer = counter;
    const int n_layer = static_cast<int>(hp.n_layer);
    if (std::max<int64_t>(1, hp.n_expert) > 1) {
      // Experts are not stored layer by layer in every file, so the layer comes from the name (as llama.cpp does).
      if (std::sscanf(name.c_str(), "blk.%d.", &i_layer) != 1) fail("cannot tell the layer of tensor '{}'", name);
      if (i_layer < 0 || i_layer >= n_layer) fail("tensor '{}' names layer {} of {}", name, i_layer, n_layer);
    }
    return {i_layer, n_layer};
  }

  // llama_tensor_get_type_impl for this mix (the rules of other mixes never fire and are left out).
  DType mixed_type(DType t, const Source& s, Category cat) {
    const FileType ft = mix.ftype;
    const bool falcon = hp.arch == "falcon";
    if (cat == Category::OUTPUT || (tied && cat == Category::TOKEN_EMBD)) {
      const int64_t nx = row_len(s);
      if (falcon || nx % dtype_info(t).block_size != 0) {
        t = DType::Q8_0;
      } else if (t != DType::Q8_0) {
        t = DType::Q6_K;
      }
    } else if (cat == Category::TOKEN_EMBD) {
      if (ft == FT_TQ1_0 || ft == FT_TQ2_0) t = DType::Q4_K;
    } else if (is_attn_v_like(cat)) {
      if (ft == FT_IQ4_NL && hp.n_gqa() >= 4) {
        t = DType::Q5_K;
      } else if ((ft == FT_Q4_K_M || ft == FT_Q5_K_M) && use_more_bits(i_attention_wv, n_attention_wv)) {
        t = DType::Q6_K;
      }
      if (hp.is_70b() && (t == DType::Q3_K || t == DType::Q4_K)) t = DType::Q5_K;
      if (hp.n_expert == 8) t = DType::Q8_0;
      ++i_attention_wv;
    } else if (cat == Category::ATTN_K) {
      if (hp.n_expert == 8) t = DType::Q8_0;
    } else if (cat == Category::ATTN_Q) {
      // no rule for these mixes
    } else if (cat == Category::FFN_DOWN) {
      const auto [i_layer, n_layer] = layer_info(i_ffn_down, s.name);
      if (ft == FT_Q4_K_M) {
        if (falcon) {
          t = i_layer < n_layer / 16 ? DType::Q6_K : use_more_bits(i_layer, n_layer) ? DType::Q5_K : DType::Q4_K;
        } else if (use_more_bits(i_layer, n_layer)) {
          t = DType::Q6_K;
        }
      } else if (i_layer < n_layer / 8 && ft == FT_IQ4_NL) {  // no importance matrix
        t = DType::Q5_K;
      } else if (ft == FT_Q5_K_M && use_more_bits(i_layer, n_layer)) {
        t = DType::Q6_K;
      }
      ++i_ffn_down;
    } else if (cat == Category::ATTN_OUTPUT) {
      if (!falcon && hp.n_expert == 8 && (ft == FT_IQ4_NL || ft == FT_Q4_K_M)) t = DType::Q5_K;
    } else if (cat == Category::ATTN_QKV) {
      if (ft == FT_Q4_K_M) t = DType::Q5_K;
      if (ft == FT_Q5_K_M) t = DType::Q6_K;
    } else if (cat == Category::FFN_GATE) {
      layer_info(i_ffn_gate, s.name);
      ++i_ffn_gate;
    } else if (cat == Category::FFN_UP) {
      layer_info(i_ffn_up, s.name);
      ++i_ffn_up;
    }
    return t;
  }

  // tensor_type_fallback: a row that is not a whole number of the type's blocks.
  DType fallback(DType t, const Source& s, bool* fell_back) {
    const int64_t ncols = row_len(s);
    const int64_t block = dtype_info(t).block_size;
    if (ncols % block == 0) return t;
    ++n_fallback;
    *fell_back = true;
    DType r = t;
    switch (t) {
      case DType::IQ4_XS:
        r = DType::IQ4_NL;
        break;
      case DType::Q2_K:
      case DType::Q3_K:
      case DType::TQ1_0:
      case DType::TQ2_0:
        r = DType::Q4_0;
        break;
      case DType::Q4_K:
        r = DType::Q5_0;
        break;
      case DType::Q5_K:
        r = DType::Q5_1;
        break;
      case DType::Q6_K:
        r = DType::Q8_0;
        break;
      default:
        break;  // a 32-block type: only f16 is left
    }
    if (ncols % dtype_info(r).block_size != 0) r = DType::F16;
    if (warn) {
      warn(fmt::format("{}: {} columns are not a multiple of {} (required by {}); falling back to {}", s.name, ncols,
                       block, ggml_name(t), ggml_name(r)));
    }
    return r;
  }

  DType choose(const Source& s, bool* fell_back) {
    *fell_back = false;
    if (!allows_quantization(s, hp.arch)) return s.vector_f32 && is_float_dtype(s.dtype) ? DType::F32 : s.dtype;
    DType t = mix.base;
    if (dtype_info(t).is_quantized) {
      t = mixed_type(t, s, category_of(s.name));
      t = fallback(t, s, fell_back);
    }
    return t;
  }
};

// ---- inputs

struct Input {
  std::vector<gguf::KeyValue> metadata;  // in file order
  std::vector<Source> tensors;
  Hparams hp;
  std::shared_ptr<void> keep;                // the mapped file(s) the metadata and tensors point into
  std::vector<float> rope_freqs;             // Hugging Face llama3 rope scaling, written as rope_freqs.weight
  std::vector<float> rope_short, rope_long;  // Phi-3's longrope, written as rope_factors_{short,long}.weight
  std::vector<std::vector<float>> shifted;   // Gemma 3's norm weights plus one, as its GGUF form stores them
};

void row_to_float(const Source& s, int64_t r, uint64_t row_bytes, float* out);

std::vector<int64_t> ggml_dims(std::vector<int64_t> shape) {
  while (shape.size() > 1 && shape.front() == 1) shape.erase(shape.begin());
  return shape;
}

int64_t first_int(const gguf::File& f, const std::string& key, int64_t dflt) {
  const gguf::Value* v = f.find(key);
  if (v == nullptr) return dflt;
  if (v->is_array()) return v->len > 0 ? v->int_at(0) : dflt;  // per-layer head counts: llama.cpp reads layer 0
  TESSERA_CHECK(v->is_integer(), "{}: metadata key {} is a {}, not an integer", f.path(), key,
                gguf::value_type_name(v->type));
  return v->i;
}

Input open_gguf(const std::string& path) {
  auto file = std::make_shared<gguf::File>(gguf::File::open(path));
  Input in;
  in.keep = file;
  in.metadata = file->metadata();
  const std::optional<std::string_view> arch = file->get_string("general.architecture");
  TESSERA_CHECK(arch.has_value(), "{}: no general.architecture in the metadata", path);
  in.hp.arch = std::string(*arch);
  const int64_t splits = first_int(*file, "split.count", 1);
  TESSERA_CHECK(splits <= 1, "{}: one shard of {} (split.count); tessera quantize reads single-file GGUF models only",
                path, splits);
  const std::string a = in.hp.arch + ".";
  in.hp.n_layer = first_int(*file, a + "block_count", 0);
  TESSERA_CHECK(in.hp.n_layer > 0, "{}: no {}block_count in the metadata", path, a);
  in.hp.n_head = first_int(*file, a + "attention.head_count", 0);
  in.hp.n_head_kv = first_int(*file, a + "attention.head_count_kv", in.hp.n_head);
  in.hp.n_expert = first_int(*file, a + "expert_count", 0);
  for (const TensorView& t : file->tensors())
    in.tensors.push_back({t.name, t.dtype, ggml_dims(t.shape), t.data, t.nbytes, 0, -1, false});
  return in;
}

// Llama 3 rope scaling as convert_hf_to_gguf.py writes it: per-dimension divisors of the inverse frequencies
// (rope_freqs.weight): long wavelengths divided by the factor, short ones kept, the band between blended.
std::vector<float> llama3_rope_freqs(const ModelConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  const int64_t dim = c.rope_dim > 0 ? c.rope_dim : c.head_dim;
  const double old_ctx = static_cast<double>(r.original_context);
  const double low_wavelen = old_ctx / r.low_freq_factor, high_wavelen = old_ctx / r.high_freq_factor;
  std::vector<float> out;
  for (int64_t i = 0; i < dim; i += 2) {
    const double freq = 1.0 / std::pow(double(c.rope_base), double(i) / double(dim));
    const double wavelen = 2 * 3.14159265358979323846 / freq;
    double f = 1.0;
    if (wavelen > low_wavelen) {
      f = r.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      f = 1.0 / ((1 - smooth) / r.factor + smooth);
    }
    out.push_back(static_cast<float>(f));
  }
  return out;
}

// tokenizer.json as GGUF tokenizer.ggml.* keys (convert_hf_to_gguf.py's gpt2 vocabulary: tokens by id, their types,
// merges "a b"); tokenizer.ggml.pre is left out, so readers use their default pre-tokenizer.
void add_tokenizer(tok::VocabData v, int64_t n_vocab, Input& in) {
  using V = gguf::Value;
  // The embedding may have more rows than tokenizer.json has tokens: convert_hf_to_gguf.py pads with unused
  // "[PAD<id>]" tokens, and llama.cpp refuses a vocabulary shorter than token_embd.
  for (auto i = static_cast<int64_t>(v.tokens.size()); i < n_vocab; ++i) {
    v.tokens.push_back("[PAD" + std::to_string(i) + "]");
    v.types.push_back(tok::TokenType::UNUSED);
    if (!v.scores.empty()) v.scores.push_back(0.0f);
  }
  auto set = [&in](std::string key, V val) { in.metadata.push_back({std::move(key), std::move(val)}); };
  set("tokenizer.ggml.model", V::from_string(v.kind == tok::VocabKind::SPM ? "llama" : "gpt2"));
  set("tokenizer.ggml.tokens", V::from_strings(v.tokens));
  if (!v.scores.empty()) set("tokenizer.ggml.scores", V::from_f32s(v.scores));
  std::vector<int32_t> types;
  for (tok::TokenType t : v.types) types.push_back(static_cast<int32_t>(t));
  set("tokenizer.ggml.token_type", V::from_i32s(types));
  if (!v.merges.empty()) {
    std::vector<std::string> merges;
    for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
    set("tokenizer.ggml.merges", V::from_strings(merges));
  }
  const std::pair<const char*, TokenId> ids[] = {{"tokenizer.ggml.bos_token_id", v.bos},
                                                 {"tokenizer.ggml.eos_token_id", v.eos},
                                                 {"tokenizer.ggml.unknown_token_id", v.unk},
                                                 {"tokenizer.ggml.padding_token_id", v.pad}};
  for (const auto& [key, id] : ids)
    if (id >= 0) set(key, V::from_u32(static_cast<uint32_t>(id)));
  set("tokenizer.ggml.add_bos_token", V::from_bool(v.add_bos));
  set("tokenizer.ggml.add_eos_token", V::from_bool(v.add_eos));
  if (!v.chat_template.empty()) set("tokenizer.chat_template", V::from_string(v.chat_template));
}

// A Hugging Face model as the GGUF file Tessera reads: llama.* hyperparameters from config.json and the weights under
// their GGUF names, q/k rows permuted (convert_hf_to_gguf.py's layout, which llama.cpp expects).
Input open_hf(const std::string& path, const std::function<void(const std::string&)>& warn) {
  auto model = std::make_shared<safetensors::Model>(safetensors::Model::open(path));
  const ModelConfig c = config_from_hf(model->config_json(), model->config_path());
  c.validate(model->config_path());
  if (c.architecture != "llama" && c.architecture != "qwen2" && c.architecture != "qwen3" && c.architecture != "phi3" &&
      c.architecture != "gemma3")
    fail(
        "{}: converting a Hugging Face {} model to GGUF is not supported yet (llama, mistral, qwen2, qwen3, phi3 and "
        "gemma3 are; llama.cpp's convert_hf_to_gguf.py writes the others)",
        model->config_path(), c.architecture);
  const bool gemma = c.architecture == "gemma3";
  if (gemma) {
    // llama.cpp's gemma3 reads no query_pre_attn_scalar: it takes head_dim (n_embd / n_head for the 62-layer 27B).
    const double derived = 1.0 / std::sqrt(c.n_layers == 62 ? double(c.n_embd) / double(c.n_head) : double(c.head_dim));
    if (c.attn_scale > 0 && std::fabs(c.attn_scale / derived - 1) > 1e-6)
      fail(
          "{}: query_pre_attn_scalar gives an attention scale of {}, and Gemma 3's GGUF form implies {} (head_dim): "
          "such a file would run differently",
          model->config_path(), c.attn_scale, derived);
  }
  // convert_hf_to_gguf.py reorders q/k rows into rope's adjacent pairs for llama only; the others keep HF's order
  // (their GGUF readers rotate NeoX pairs).
  const bool permute = c.architecture == "llama";
  Input in;
  in.keep = model;
  in.hp = {c.architecture, c.n_layers, c.n_head, c.n_head_kv, 0};
  const std::string a = c.architecture + ".";
  auto set = [&in](std::string key, gguf::Value v) { in.metadata.push_back({std::move(key), std::move(v)}); };
  using V = gguf::Value;
  set("general.architecture", V::from_string(c.architecture));
  if (!c.name.empty()) set("general.name", V::from_string(c.name));
  if (c.n_ctx_train > 0) set(a + "context_length", V::from_u32(uint32_t(c.n_ctx_train)));
  set(a + "embedding_length", V::from_u32(uint32_t(c.n_embd)));
  set(a + "block_count", V::from_u32(uint32_t(c.n_layers)));
  set(a + "feed_forward_length", V::from_u32(uint32_t(c.n_ff)));
  set(a + "attention.head_count", V::from_u32(uint32_t(c.n_head)));
  set(a + "attention.head_count_kv", V::from_u32(uint32_t(c.n_head_kv)));
  set(a + "attention.key_length", V::from_u32(uint32_t(c.head_dim)));
  set(a + "attention.value_length", V::from_u32(uint32_t(c.head_dim)));
  set(a + "rope.dimension_count", V::from_u32(uint32_t(c.rope_dim > 0 ? c.rope_dim : c.head_dim)));
  set(a + "rope.freq_base", V::from_f32(c.rope_base));
  set(a + "attention.layer_norm_rms_epsilon", V::from_f32(c.norm_eps));
  set(a + "vocab_size", V::from_u32(uint32_t(c.n_vocab)));
  if (c.sliding_window > 0) set(a + "attention.sliding_window", V::from_u32(uint32_t(c.sliding_window)));
  if (gemma) {  // which layers slide (one bool each, as llama.cpp reads it), their rope base, the final softcap
    if (c.sliding_window > 0) {
      std::vector<uint8_t> local(static_cast<size_t>(c.n_layers));
      for (int64_t l = 0; l < c.n_layers; ++l) local[static_cast<size_t>(l)] = c.is_local_layer(l) ? 1 : 0;
      set(a + "attention.sliding_window_pattern", V::from_array(gguf::ValueType::BOOL, local.data(), local.size()));
    }
    if (c.rope_base_local > 0) set(a + "rope.freq_base_swa", V::from_f32(c.rope_base_local));
    if (c.final_softcap > 0) set(a + "final_logit_softcapping", V::from_f32(c.final_softcap));
  }
  if (c.rope_scaling.type == "linear") {
    set(a + "rope.scaling.type", V::from_string("linear"));
    set(a + "rope.scaling.factor", V::from_f32(c.rope_scaling.factor));
  } else if (c.rope_scaling.type == "llama3") {
    in.rope_freqs = llama3_rope_freqs(c);
  } else if (c.rope_scaling.type == "longrope") {  // as convert_hf_to_gguf.py writes Phi-3's
    in.rope_short = c.rope_scaling.short_factor;
    in.rope_long = c.rope_scaling.long_factor;
    set(a + "rope.scaling.attn_factor", V::from_f32(c.rope_scaling.attn_factor));
    set(a + "rope.scaling.original_context_length", V::from_u32(uint32_t(c.rope_scaling.original_context)));
  } else if (c.rope_scaling.type == "yarn" && c.rope_scaling.truncate) {  // as llama.cpp reads it back
    const RopeScaling& y = c.rope_scaling;
    set(a + "rope.scaling.type", V::from_string("yarn"));
    set(a + "rope.scaling.factor", V::from_f32(y.factor));
    set(a + "rope.scaling.original_context_length", V::from_u32(uint32_t(y.original_context)));
    if (y.beta_fast != 32.0f) set(a + "rope.scaling.yarn_beta_fast", V::from_f32(y.beta_fast));
    if (y.beta_slow != 1.0f) set(a + "rope.scaling.yarn_beta_slow", V::from_f32(y.beta_slow));
    // llama.cpp multiplies its own 0.1 ln(factor) + 1 by attn_factor: only a different factor needs the key.
    const double mscale = y.factor <= 1 ? 1.0 : 0.1 * std::log(double(y.factor)) + 1.0;
    if (std::fabs(y.attn_factor / mscale - 1) > 1e-6)
      set(a + "rope.scaling.attn_factor", V::from_f32(static_cast<float>(y.attn_factor / mscale)));
  } else if (c.rope_scaling.type != "none") {
    fail("{}: rope scaling '{}' is not written to GGUF by tessera quantize yet", model->config_path(),
         c.rope_scaling.type);
  }
  if (!model->tokenizer_path().empty())
    add_tokenizer(tok::vocab_from_tokenizer_json(model->tokenizer_path()), c.n_vocab, in);
  for (const TensorView& t : model->tensors()) {
    std::string name = safetensors::hf_to_gguf_name(t.name);
    // Gemma 3's post_attention_layernorm is its attention post-norm and pre_feedforward_layernorm its FFN norm (the
    // name map gives them Llama's meanings), as models/model_weights.cpp renames them on load.
    if (gemma && name.ends_with(".ffn_norm.weight"))
      name.replace(name.size() - std::string_view("ffn_norm.weight").size(), std::string::npos,
                   "post_attention_norm.weight");
    else if (gemma && name.ends_with(".pre_ffw_norm.weight"))
      name.replace(name.size() - std::string_view("pre_ffw_norm.weight").size(), std::string::npos, "ffn_norm.weight");
    if (name.empty()) {
      if (warn) warn(fmt::format("{}: tensor '{}' has no GGUF name; left out", path, t.name));
      continue;
    }
    Source s{name, t.dtype, ggml_dims(t.shape), t.data, t.nbytes, 0, -1, false};
    s.vector_f32 = s.shape.size() == 1;
    if (gemma && s.vector_f32 && name.ends_with("norm.weight")) {
      // Gemma's RMSNorm multiplies by (1 + w); its GGUF form stores 1 + w (convert_hf_to_gguf.py's norm_shift).
      std::vector<float>& v = in.shifted.emplace_back(static_cast<size_t>(s.shape[0]));
      row_to_float(s, 0, s.nbytes, v.data());
      for (float& x : v) x += 1.0f;
      s.dtype = DType::F32;
      s.data = reinterpret_cast<const uint8_t*>(v.data());
      s.nbytes = v.size() * sizeof(float);
    }
    if (permute && (name.ends_with("attn_q.weight") || name.ends_with("attn_q.bias"))) s.permute_heads = c.n_head;
    if (permute && (name.ends_with("attn_k.weight") || name.ends_with("attn_k.bias"))) s.permute_heads = c.n_head_kv;
    if (s.permute_heads > 0 && s.shape[0] % (2 * s.permute_heads) != 0) {
      fail("{}: tensor '{}' has {} rows, not a whole number of pairs for {} heads", path, t.name, s.shape[0],
           s.permute_heads);
    }
    in.tensors.push_back(std::move(s));
  }
  const auto add_f32 = [&](const char* name, const std::vector<float>& v) {
    if (v.empty()) return;
    in.tensors.push_back({name,
                          DType::F32,
                          {static_cast<int64_t>(v.size())},
                          reinterpret_cast<const uint8_t*>(v.data()),
                          v.size() * 4,
                          0,
                          -1,
                          false});
  };
  add_f32("rope_freqs.weight", in.rope_freqs);
  add_f32("rope_factors_long.weight", in.rope_long);
  add_f32("rope_factors_short.weight", in.rope_short);
  return in;
}

// ---- conversion

// Row `r` of `s` (row_len elements) as float. Error on a dtype Tessera cannot read or on a non-finite value
// (llama.cpp's loader refuses those too: a quantized NaN is silent garbage).
void row_to_float(const Source& s, int64_t r, uint64_t row_bytes, float* out) {
  const int64_t n = row_len(s);
  if (s.shape.size() == 1 && s.permute_heads > 0) {  // a q/k bias: its elements are permuted (f32/f16/bf16 only)
    TESSERA_CHECK(is_float_dtype(s.dtype), "tensor '{}' is {}, which cannot be converted", s.name, ggml_name(s.dtype));
    const uint64_t es = dtype_info(s.dtype).type_size;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* p = s.data + static_cast<uint64_t>(source_row(s, i)) * es;
      uint16_t h = 0;
      if (s.dtype != DType::F32) std::memcpy(&h, p, 2);
      if (s.dtype == DType::F32) std::memcpy(out + i, p, 4);
      if (s.dtype == DType::F16) out[i] = fp16_to_f32(h);
      if (s.dtype == DType::BF16) out[i] = bf16_to_f32(h);
    }
    return;
  }
  const uint8_t* src = s.data + static_cast<uint64_t>(source_row(s, r)) * row_bytes;
  switch (s.dtype) {
    case DType::F32:
      std::memcpy(out, src, static_cast<size_t>(n) * 4);
      break;
    case DType::F16:
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = s.dtype == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
      }
      break;
    default:
      dequantize_row(s.dtype, src, out, n);
  }
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(out[i])) fail("tensor '{}' holds a NaN or infinite value (row {}, column {})", s.name, r, i);
}

bool is_ternary(DType t) { return t == DType::TQ1_0 || t == DType::TQ2_0; }

// BitNet b1.58's absmean ternarization of a whole tensor: s = mean |W| (at least 1e-5, as BitNet's weight_quant
// clamps it), every weight rounded (to nearest even, torch.round) to W / s and clipped to {-1, 0, 1}, times s. The
// tq quantizers then store these values exactly (d = s in every block with a nonzero weight).
float absmean_scale(const Source& s, uint64_t row_bytes, std::vector<float>& row) {
  const int64_t cols = row_len(s), rows = row_count(s);
  row.resize(static_cast<size_t>(cols));
  double sum = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    row_to_float(s, r, row_bytes, row.data());
    for (float v : row) sum += std::fabs(v);
  }
  return std::max(static_cast<float>(sum / static_cast<double>(cols * rows)), 1e-5f);
}

void ternarize(float* x, int64_t n, float scale) {
  const float id = 1.0f / scale;
  for (int64_t i = 0; i < n; ++i) x[i] = std::clamp(std::nearbyint(x[i] * id), -1.0f, 1.0f) * scale;
}

void quantize_rows(DType to, const float* x, uint8_t* y, int64_t n) {
  if (can_quantize_ggml(to)) {
    quantize_row_ggml(to, x, y, n);
  } else {
    quantize_row(to, x, y, n);  // f32, f16, bf16: GGML's conversions are the plain round-to-nearest-even ones
  }
}

}  // namespace

const std::vector<QuantizeType>& quantize_types() {
  static const std::vector<QuantizeType> types = [] {
    std::vector<QuantizeType> v;
    for (const Mix& m : kMixes) v.push_back({m.name, m.description});
    return v;
  }();
  return types;
}

QuantizeResult quantize_model(const std::string& input, const std::string& output, const QuantizeOptions& o) {
  const Mix& mix = find_mix(o.type);
  {
    // Before any work: a missing output folder would otherwise be found only after quantizing everything.
    const std::filesystem::path dir = std::filesystem::path(output).parent_path();
    std::error_code ec;
    TESSERA_CHECK(dir.empty() || std::filesystem::is_directory(dir, ec), "{}: the folder {} does not exist", output,
                  dir.string());
    TESSERA_CHECK(!std::filesystem::is_directory(output, ec), "{}: is a folder, not a file to write", output);
  }
  Input in = detect_model_format(input) == ModelFormat::GGUF ? open_gguf(input) : open_hf(input, o.on_warning);

  // llama_model_loader's order: layer (-1 outside blk.N), then name.
  for (Source& s : in.tensors) std::sscanf(s.name.c_str(), "blk.%d.", &s.layer);
  std::stable_sort(in.tensors.begin(), in.tensors.end(), [](const Source& a, const Source& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.name < b.name;
  });

  // Warnings wait until every tensor has passed its checks, so a refused input prints its one error line only.
  std::vector<std::string> warnings;
  TypeChooser chooser{mix, in.hp};
  chooser.warn = [&warnings](const std::string& w) { warnings.push_back(w); };
  for (const Source& s : in.tensors) {
    if (is_attn_v_like(category_of(s.name))) ++chooser.n_attention_wv;
    if (category_of(s.name) == Category::OUTPUT) chooser.tied = false;
  }
  const size_t n = in.tensors.size();
  std::vector<DType> to(n);
  std::vector<bool> fell_back(n);
  QuantizeResult result;
  result.file_type = mix.ftype;
  result.n_tensors = static_cast<int64_t>(n);
  bool warned_requantize = false;
  for (size_t i = 0; i < n; ++i) {
    const Source& s = in.tensors[i];
    bool fb = false;
    to[i] = chooser.choose(s, &fb);
    fell_back[i] = fb;
    if (to[i] == s.dtype) continue;
    if (!can_quantize_ggml(to[i]) && !is_float_dtype(to[i]))
      fail("tensor '{}' would need {}, which tessera quantize cannot write yet", s.name, ggml_name(to[i]));
    if (dtype_info(s.dtype).is_quantized) {
      TESSERA_CHECK(o.allow_requantize,
                    "{}: tensor '{}' is already quantized ({}); requantizing loses quality, pass --allow-requantize to "
                    "do it anyway",
                    input, s.name, ggml_name(s.dtype));
      TESSERA_CHECK(can_dequantize(s.dtype), "tensor '{}' is {}, which Tessera cannot dequantize yet", s.name,
                    ggml_name(s.dtype));
      ++result.n_requantized;
      if (!warned_requantize) {
        warnings.push_back(
            fmt::format("requantizing already quantized tensors (first: {} in {}): the result is worse than "
                        "quantizing the f16/f32 original",
                        s.name, ggml_name(s.dtype)));
        warned_requantize = true;
      }
    } else if (!is_float_dtype(s.dtype)) {
      fail("tensor '{}' is {}, which cannot be quantized", s.name, ggml_name(s.dtype));
    }
  }
  result.n_fallback = chooser.n_fallback;
  TESSERA_CHECK(!o.ternary_absmean || is_ternary(mix.base),
                "absmean ternarization applies to tq1_0 and tq2_0 only, not to {}", mix.name);
  if (is_ternary(mix.base)) {
    warnings.push_back(fmt::format(
        "{} keeps every weight in {{-1, 0, 1}} times a scale: a model trained in full precision loses nearly all its "
        "quality ({}); the type is meant for models trained ternary (BitNet b1.58, TriLM)",
        mix.name,
        o.ternary_absmean ? "absmean scale per tensor, as BitNet" : "absmax scale per 256, as llama-quantize"));
  }
  if (o.on_warning)
    for (const std::string& w : warnings) o.on_warning(w);

  gguf::Writer w;
  for (const gguf::KeyValue& kv : in.metadata) {
    if (kv.key == "general.quantization_version" || kv.key == "general.file_type" || kv.key == "split.no" ||
        kv.key == "split.count" || kv.key == "split.tensors.count")
      continue;
    w.set(kv.key, kv.value);
  }
  w.set("general.quantization_version", gguf::Value::from_u32(2));  // GGML_QNT_VERSION
  w.set("general.file_type", gguf::Value::from_u32(mix.ftype));

  ThreadPool pool(o.n_threads);
  std::vector<std::vector<uint8_t>> owned;  // the converted tensors' bytes; moving a vector keeps its buffer
  owned.reserve(n);
  std::vector<std::vector<float>> scratch(static_cast<size_t>(pool.n_threads()));
  for (size_t i = 0; i < n; ++i) {
    const Source& s = in.tensors[i];
    const int64_t cols = row_len(s), rows = row_count(s);
    const uint64_t row_in = *dtype_row_bytes(s.dtype, static_cast<uint64_t>(cols));
    const std::optional<uint64_t> row_out = dtype_row_bytes(to[i], static_cast<uint64_t>(cols));
    TESSERA_CHECK(row_out.has_value(), "tensor '{}': rows of {} are not a whole number of {} blocks", s.name, cols,
                  ggml_name(to[i]));
    const uint64_t bytes_out = *row_out * static_cast<uint64_t>(rows);
    if (o.on_tensor) {
      o.on_tensor({static_cast<int64_t>(i) + 1, static_cast<int64_t>(n), s.name, s.shape, ggml_name(s.dtype),
                   ggml_name(to[i]), s.nbytes, bytes_out, fell_back[i]});
    }
    result.bytes_in += s.nbytes;
    result.bytes_out += bytes_out;
    if (to[i] == s.dtype && s.permute_heads == 0) {
      w.add_tensor_ref(s.name, s.dtype, s.shape, s.data, s.nbytes);
      continue;
    }
    std::vector<uint8_t>& out = owned.emplace_back(bytes_out);
    if (to[i] == s.dtype) {  // a permuted copy, by units of dim 0
      const uint64_t unit = s.nbytes / static_cast<uint64_t>(s.shape[0]);
      for (int64_t r = 0; r < s.shape[0]; ++r)
        std::memcpy(out.data() + static_cast<uint64_t>(r) * unit,
                    s.data + static_cast<uint64_t>(source_row(s, r)) * unit, unit);
    } else {
      const float ternary_scale = o.ternary_absmean && is_ternary(to[i]) ? absmean_scale(s, row_in, scratch[0]) : 0.0f;
      // Tasks of at least 16k elements, as llama-quantize's chunks: a few microseconds of work each.
      const int64_t rows_per_task = std::max<int64_t>(1, (16384 + cols - 1) / cols);
      const int64_t tasks = (rows + rows_per_task - 1) / rows_per_task;
      pool.parallel_for(tasks, [&](int64_t task, int thread) {
        const int64_t r0 = task * rows_per_task, r1 = std::min(rows, r0 + rows_per_task);
        std::vector<float>& x = scratch[static_cast<size_t>(thread)];
        x.resize(static_cast<size_t>((r1 - r0) * cols));
        for (int64_t r = r0; r < r1; ++r) row_to_float(s, r, row_in, x.data() + (r - r0) * cols);
        if (ternary_scale > 0.0f) ternarize(x.data(), (r1 - r0) * cols, ternary_scale);
        quantize_rows(to[i], x.data(), out.data() + static_cast<uint64_t>(r0) * *row_out, (r1 - r0) * cols);
      });
    }
    if (to[i] != s.dtype) ++result.n_quantized;
    w.add_tensor_ref(s.name, to[i], s.shape, out.data(), out.size());
  }
  w.write(output);
  return result;
}

}  // namespace tessera
