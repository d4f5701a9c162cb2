// tessera logits: evaluate token-id prompts and write every position's raw logits as .npy files, the dump format of
// python/hf_oracle.py (end-to-end checks against HF transformers and llama.cpp on any device).
//
//   tessera logits -m MODEL --prompts prompts.json --out DIR   # DIR/<name>.npy per prompt, float32 [T, n_vocab]
//   tessera logits -m MODEL --ids 1,2,3 --out x.npy
//   tessera logits -m MODEL --text "Hello" --out x.npy         # tokenized as `run` does (BOS as the model asks)
//
// Row t of a prompt's array is the logits after feeding ids[0..t] (no softmax, temperature or penalty; positions
// from 0; no BOS added to id prompts). By default each prompt is evaluated alone (prefill in chunks of --ubatch);
// --batched feeds all prompts together, one token per prompt per step, through the batched-decode path (every
// prompt in its own sequence slot), to check that path against the same references.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.h"
#include "gen_options.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/session.h"

namespace tessera::cli {
namespace {

struct LogitsFlags {
  std::string model;
  std::string prompts_path;
  std::string ids;
  std::string text;
  std::string out;
  std::string device = "cpu";
  NglFlag ngl;           // -ngl: llama.cpp's spelling of the device
  BackendFlags backend;  // --cuda KEY=VALUE, --cpu-isa
  TealFlags teal;        // --sparsity, --teal: every prompt row sparsified, as perplexity does
  LoraFlags lora;        // --lora, --lora-merge
  std::string kv_type;
  int64_t n_ctx = 0;
  int64_t n_ubatch = 512;
  int n_threads = 0;
  bool reference = false;
  bool batched = false;
  bool quiet = false;
};

struct Prompt {
  std::string name;
  std::vector<int32_t> ids;
};

// .npy version 1.0, little-endian float32, C order, shape (rows, cols); the header is padded so that the data starts
// at a multiple of 64 bytes, as numpy writes it.
void write_npy(const std::string& path, const float* data, int64_t rows, int64_t cols) {
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(fmt::format("{}: cannot create the output file", path));
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(magic, 8);
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  const char hl[2] = {static_cast<char>(hlen & 0xff), static_cast<char>(hlen >> 8)};
  f.write(hl, 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(rows * cols * sizeof(float)));
  if (!f) throw Error(fmt::format("{}: writing the logits failed (disk full?)", path));
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t at = 0;
  while (at < s.size()) {
    size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size();
    const std::string tok = s.substr(at, end - at);
    try {
      size_t used = 0;
      const long long v = std::stoll(tok, &used);
      if (used != tok.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(tok);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      throw Error(fmt::format("--ids: '{}' is not a token id (comma-separated non-negative integers)", tok));
    }
    at = end + 1;
  }
  return ids;
}

std::vector<Prompt> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("{}: cannot open the prompts file", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  const nlohmann::json* list = j.is_object() && j.contains("prompts") ? &j["prompts"] : &j;
  if (!list->is_array())
    throw Error(fmt::format("{}: expected {{\"prompts\": [{{\"name\": ..., \"ids\": [...]}}, ...]}}", path));
  std::vector<Prompt> out;
  for (const auto& p : *list) {
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string() || !p.contains("ids") || !p["ids"].is_array())
      throw Error(fmt::format("{}: prompt {} needs a string \"name\" and an \"ids\" array", path, out.size()));
    Prompt q;
    q.name = p["name"].get<std::string>();
    if (q.name.empty() || q.name.find_first_of("/\\") != std::string::npos || q.name[0] == '.')
      throw Error(fmt::format("{}: prompt name '{}' is not a plain file name", path, q.name));
    for (const auto& v : p["ids"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
        throw Error(fmt::format("{}: prompt '{}' has an id that is not a non-negative integer", path, q.name));
      q.ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    if (q.ids.empty()) throw Error(fmt::format("{}: prompt '{}' has no ids", path, q.name));
    out.push_back(std::move(q));
  }
  if (out.empty()) throw Error(fmt::format("{}: no prompts", path));
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(LogitsFlags& f) {
  apply_ngl(f.ngl, f.device);
  const int sources = !f.prompts_path.empty() + !f.ids.empty() + !f.text.empty();
  if (sources != 1) throw Error("give exactly one of --prompts FILE, --ids LIST or --text TEXT");
  if (f.out.empty()) throw Error("--out is required (a directory with --prompts, a .npy file otherwise)");
  if (f.batched && f.prompts_path.empty()) throw Error("--batched needs several prompts: use --prompts FILE");

  // Token ids need no tokenizer: a model folder without one (a test base, a bare safetensors export) still runs.
  Model model = Model::load(f.model, {.load_tokenizer = !f.text.empty()});
  std::vector<Prompt> prompts;
  if (!f.prompts_path.empty()) {
    prompts = read_prompts(f.prompts_path);
  } else if (!f.ids.empty()) {
    prompts.push_back({"", parse_ids(f.ids)});
    if (prompts[0].ids.empty()) throw Error("--ids: no ids given");
  } else {
    prompts.push_back({"", model.tokenizer().encode(f.text, true)});
    if (prompts[0].ids.empty()) throw Error("--text: the text has no tokens");
  }
  int64_t longest = 0;
  for (const Prompt& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.ids.size()));

  SessionOptions so;
  so.device = f.device;
  so.backend_options = backend_options(f.backend, f.device);
  so.n_threads = cap_threads(f.n_threads);
  so.reference = f.reference;
  so.kv_dtype = f.kv_type;
  so.n_batch = f.n_ubatch;
  so.n_ctx = f.n_ctx > 0 ? f.n_ctx : longest;
  if (f.batched) so.n_seq = static_cast<int64_t>(prompts.size());
  apply_teal_flags(f.teal, so);
  apply_lora_flags(f.lora, so);
  so.sparsify_prefill = true;
  Session session(model, so);
  if (!f.quiet) announce_adapters(session);
  const int64_t vocab = session.n_vocab();
  for (const Prompt& p : prompts)
    if (static_cast<int64_t>(p.ids.size()) > session.n_ctx())
      throw Error(fmt::format("prompt '{}' has {} tokens, more than the context of {} (raise it with -c)", p.name,
                              p.ids.size(), session.n_ctx()));

  const bool to_dir = !f.prompts_path.empty();
  if (to_dir) {
    std::error_code ec;
    std::filesystem::create_directories(f.out, ec);
    if (ec) throw Error(fmt::format("{}: cannot create the output directory ({})", f.out, ec.message()));
  }
  const auto path_of = [&](const Prompt& p) {
    return to_dir ? (std::filesystem::path(f.out) / (p.name + ".npy")).string() : f.out;
  };

  const auto t0 = std::chrono::steady_clock::now();
  int64_t total = 0;
  if (!f.batched) {
    for (const Prompt& p : prompts) {
      const auto tp = std::chrono::steady_clock::now();
      session.reset();
      const std::vector<float> all = session.eval_all_logits(p.ids);
      write_npy(path_of(p), all.data(), static_cast<int64_t>(p.ids.size()), vocab);
      total += static_cast<int64_t>(p.ids.size());
      if (!f.quiet)
        fmt::print(stderr, "{}: {} tokens, {:.1f} ms -> {}\n", p.name.empty() ? "prompt" : p.name, p.ids.size(),
                   seconds_since(tp) * 1e3, path_of(p));
    }
  } else {
    // Teacher forcing in lockstep: step s feeds token s of every prompt that is longer than s, each into its slot.
    std::vector<std::vector<float>> out(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      session.truncate(static_cast<int64_t>(i), 0);
      out[i].resize(prompts[i].ids.size() * static_cast<size_t>(vocab));
    }
    std::vector<int32_t> tokens, seqs;
    for (int64_t s = 0; s < longest; ++s) {
      tokens.clear();
      seqs.clear();
      for (size_t i = 0; i < prompts.size(); ++i)
        if (static_cast<int64_t>(prompts[i].ids.size()) > s) {
          tokens.push_back(prompts[i].ids[static_cast<size_t>(s)]);
          seqs.push_back(static_cast<int32_t>(i));
        }
      const std::span<const float> logits = session.decode_batch(tokens, seqs);
      for (size_t r = 0; r < seqs.size(); ++r)
        std::copy_n(logits.data() + r * static_cast<size_t>(vocab), vocab,
                    out[static_cast<size_t>(seqs[r])].data() + static_cast<size_t>(s * vocab));
      total += static_cast<int64_t>(seqs.size());
    }
    for (size_t i = 0; i < prompts.size(); ++i)
      write_npy(path_of(prompts[i]), out[i].data(), static_cast<int64_t>(prompts[i].ids.size()), vocab);
    if (!f.quiet) fmt::print(stderr, "{} prompts decoded together ({} steps) -> {}\n", prompts.size(), longest, f.out);
  }
  if (!f.quiet)
    fmt::print(stderr, "{} tokens in {:.2f} s on {} ({} vocab)\n", total, seconds_since(t0), f.device, vocab);
  return 0;
}

const int registered = register_command(
    {"logits", "Write every position's raw logits of token prompts as .npy (for end-to-end checks)",
     [](CLI::App& app) -> Runner {
       auto f = std::make_shared<LogitsFlags>();
       add_model_option(app, f->model);
       app.add_option("--prompts", f->prompts_path,
                      "JSON file {\"prompts\": [{\"name\": N, \"ids\": [...]}, ...]}: writes OUT/N.npy per prompt");
       app.add_option("--ids", f->ids, "One prompt as comma-separated token ids (no BOS added)");
       app.add_option("--text", f->text, "One prompt as text, tokenized with the model's tokenizer (BOS as it asks)");
       app.add_option("-o,--out", f->out, "Output directory (--prompts) or .npy file (--ids, --text)");
       add_ngl_option(app, f->ngl, app.add_option("--device", f->device, "cpu (default) or cuda"));
       add_backend_flags(app, f->backend);
       add_teal_flags(app, f->teal);
       add_lora_flags(app, f->lora);
       app.add_option("-c,--ctx-size", f->n_ctx, "Context size (default: the longest prompt)");
       app.add_option("-b,--batch-size,--ub,--ubatch,--ubatch-size", f->n_ubatch,
                      "Logical batch: prompt tokens per forward pass (default 512)");
       app.add_option("-t,--threads", f->n_threads, "CPU threads (default: one per hardware thread)");
       app.add_option("--kv-type", f->kv_type, "KV cache type: f16 (default) or f32");
       app.add_flag("--reference", f->reference, "CPU f32 reference path (scalar kernels, f32 weights and cache)");
       app.add_flag("--batched", f->batched,
                    "Feed all prompts together, one token per prompt per step (batched decode, a slot each)");
       app.add_flag("-q,--quiet", f->quiet, "No progress lines on stderr");
       return [f] { return run(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
