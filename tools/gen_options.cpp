#include "gen_options.h"

#include <fmt/core.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "command.h"
#include "tessera/bench.h"
#include "tessera/error.h"

namespace tessera::cli {

void add_gen_flags(CLI::App& app, GenFlags& f) {
  add_model_option(app, f.model);
  app.add_option("-c,--ctx,--ctx-size", f.session.n_ctx,
                 "Context size in tokens (default: the model's trained context)");
  app.add_option("-b,--batch,--batch-size", f.session.n_batch,
                 "Logical batch: prompt tokens per forward pass (default 512)");
  app.add_option("-t,--threads", f.session.n_threads, "Threads (default: all cores; capped to the hardware threads)");
  app.add_flag("--reference", f.session.reference,
               "Run the scalar f32 reference kernels (slow; for checking against other implementations)");
  app.add_option("--kv-type", f.session.kv_dtype, "KV cache type: f16 (default) or f32");
  CLI::Option* device =
      app.add_option("--device", f.session.device,
                     "cpu (default) or cuda (the whole model on the GPU: prompts in chunks, then decode)");
  add_ngl_option(app, f.ngl, device);
  add_backend_flags(app, f.backend);
  add_teal_flags(app, f.teal);
  add_lora_flags(app, f.lora);
  app.add_option("-n,--n-predict", f.gen.max_tokens, "Tokens to generate, -1 for no limit (default 256)");
  app.add_option("--temp", f.gen.sampling.temperature, "Temperature; 0 is greedy (default 0.8)");
  app.add_option("--top-k", f.gen.sampling.top_k, "Top-k, 0 = off (default 40)");
  app.add_option("--top-p", f.gen.sampling.top_p, "Top-p in (0, 1], 1 = off (default 0.95)");
  app.add_option("--min-p", f.gen.sampling.min_p, "Min-p in [0, 1], 0 = off (default 0.05)");
  app.add_option("--repeat-penalty", f.gen.sampling.repeat_penalty, "Repetition penalty, 1 = off (default 1)");
  app.add_option("--repeat-last-n", f.gen.sampling.penalty_last_n,
                 "Tokens the penalties look back over, -1 = whole context (default 64)");
  app.add_option("--frequency-penalty", f.gen.sampling.frequency_penalty, "Frequency penalty (default 0)");
  app.add_option("--presence-penalty", f.gen.sampling.presence_penalty, "Presence penalty (default 0)");
  app.add_option("-s,--seed", f.seed,
                 "Random seed, 0 to 2^64-2 (default -1: random; the seed used is reported with --json)");
  app.add_option("--stop", f.gen.stop, "Stop when the text contains this string (repeatable)");
  app.add_flag("--ignore-eos", f.gen.ignore_eos, "Keep generating past end-of-generation tokens");
  app.add_option("--chat-template", f.chat_template,
                 "Chat template family instead of the model's own (chatml, llama3, llama2, mistral, mistral-v3, "
                 "mistral-v3-tekken, gemma, phi3)");
  app.add_option("--system", f.system, "System prompt for the chat template");
  app.add_flag("-e,--escape")
      ->description("Process escapes (\\n, \\t, \\xNN, ...) in the prompt, --system and --stop (the default)");
  app.add_flag("--no-escape", f.no_escape, "Take backslashes in the prompt, --system and --stop literally");
}

namespace {

uint64_t parse_seed(const std::string& s) {
  if (s == "-1") return kRandomSeed;
  uint64_t v = 0;
  const char* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc() || p != end || v == kRandomSeed)
    throw Error(fmt::format("seed '{}' must be -1 (random) or an integer from 0 to 2^64-2", s));
  return v;
}

}  // namespace

void finish_gen_flags(GenFlags& f) {
  apply_teal_flags(f.teal, f.session);
  apply_lora_flags(f.lora, f.session);
  f.gen.sampling.seed = parse_seed(f.seed);
  const SamplingOptions& s = f.gen.sampling;
  if (s.temperature < 0) throw Error(fmt::format("temperature {} must not be negative (0 is greedy)", s.temperature));
  if (!(s.top_p > 0 && s.top_p <= 1)) throw Error(fmt::format("--top-p {} must be in (0, 1] (1 is off)", s.top_p));
  if (!(s.min_p >= 0 && s.min_p <= 1)) throw Error(fmt::format("--min-p {} must be in [0, 1] (0 is off)", s.min_p));
  if (s.top_k < 0) throw Error(fmt::format("--top-k {} must not be negative (0 is off)", s.top_k));
  if (f.gen.max_tokens < -1) throw Error(fmt::format("-n {} must be -1 (no limit) or more", f.gen.max_tokens));
  if (f.session.n_ctx < 0)
    throw Error(fmt::format("-c {} must not be negative (0: the model's context)", f.session.n_ctx));
  if (f.session.n_batch < 1) throw Error(fmt::format("-b {} must be positive", f.session.n_batch));
  f.session.n_threads = cap_threads(f.session.n_threads);
  apply_ngl(f.ngl, f.session.device);
  f.session.backend_options = backend_options(f.backend, f.session.device);
  if (!f.no_escape) {
    f.system = process_escapes(f.system);
    for (std::string& s : f.gen.stop) s = process_escapes(s);
  }
}

void add_teal_flags(CLI::App& app, TealFlags& f) {
  app.add_option("--sparsity", f.sparsity,
                 "TEAL activation sparsity: zero this share of every matmul input in the blocks by magnitude, per "
                 "token (top-k), so decode skips their weights (0 = dense, the default; docs/TEAL.md)");
  app.add_option("--teal", f.teal, "TEAL thresholds file from `tessera calibrate` (instead of --sparsity)");
}

void apply_teal_flags(const TealFlags& f, SessionOptions& so) {
  so.sparsity = f.sparsity;
  so.teal = f.teal;
}

void add_lora_flags(CLI::App& app, LoraFlags& f) {
  app.add_option("--lora", f.specs,
                 "LoRA adapter FILE[:SCALE] (repeatable; a PEFT folder, its adapter_model.safetensors, or a GGUF "
                 "LoRA; SCALE multiplies the adapter's alpha/r, default 1)");
  app.add_flag("--lora-merge", f.merge,
               "Merge the --lora adapters into the weights at load (base speed, a copy of each adapted weight) "
               "instead of running them beside the base matmuls");
}

void announce_adapters(const Session& s) {
  for (const AdapterInfo& a : s.adapters())
    fmt::print(stderr, "tessera: LoRA {} ({}, {} matmuls, rank up to {}, scale {:g}), {}\n", a.path, a.format,
               a.matmuls, a.max_rank, a.scale, a.merged ? "merged" : "unmerged");
}

void apply_lora_flags(const LoraFlags& f, SessionOptions& so) {
  if (f.merge && f.specs.empty()) throw Error("--lora-merge needs at least one --lora adapter");
  for (const std::string& s : f.specs) so.lora.push_back(LoraSpec::parse(s));
  so.lora_merge = f.merge;
}

std::string teal_line(const TealFlags& f, double achieved) {
  if (f.sparsity <= 0 && f.teal.empty()) return "";
  return fmt::format(
      "achieved activation sparsity {:.1f}% ({})", 100.0 * achieved,
      f.teal.empty() ? fmt::format("asked {:g}%, top-k per token", 100.0 * f.sparsity) : "thresholds of " + f.teal);
}

void add_backend_flags(CLI::App& app, BackendFlags& f) {
  app.add_option("--cuda", f.cuda,
                 "KEY=VALUE: a CUDA backend option (repeatable; e.g. graph=0, sample=0, attn_tma=0, "
                 "quant_gemm=auto|tile|expand; every key with its default in docs/ENVIRONMENT.md)");
  app.add_option("--cpu-isa", f.cpu_isa,
                 "CPU kernels' instruction set: scalar, avx2, avx2_vnni or avx512_vnni "
                 "(default: the best this CPU runs)");
  app.add_option("--cpu-teal-walk", f.cpu_teal_walk,
                 "TEAL on the CPU (--sparsity, --teal): all walks the kept channels with the sparse kernels; none (the "
                 "default) runs the dense kernels on the zeroed input, which measured faster (docs/TEAL.md)")
      ->check(CLI::IsMember({"all", "none"}));
}

std::vector<std::string> backend_options(const BackendFlags& f, const std::string& device) {
  if (!f.cuda.empty() && device != "cuda")
    throw Error(
        fmt::format("--cuda {} sets a CUDA option, but the device is {} (add --device cuda)", f.cuda[0], device));
  if (!f.cpu_isa.empty() && device != "cpu")
    throw Error(fmt::format("--cpu-isa {} sets the CPU's kernels, but the device is {}", f.cpu_isa, device));
  if (!f.cpu_teal_walk.empty() && device != "cpu")
    throw Error(fmt::format("--cpu-teal-walk {} sets the CPU's kernels, but the device is {}", f.cpu_teal_walk, device));
  std::vector<std::string> out = f.cuda;
  if (!f.cpu_isa.empty()) out.push_back("isa=" + f.cpu_isa);
  if (!f.cpu_teal_walk.empty()) out.push_back("teal_walk=" + f.cpu_teal_walk);
  return out;
}

void add_ngl_option(CLI::App& app, NglFlag& ngl, CLI::Option* device_opt) {
  ngl.device_opt = device_opt;
  app.add_option("--n-gpu-layers", ngl.layers,
                 "(-ngl) llama.cpp's spelling: Tessera runs every layer on one device; a positive count means "
                 "--device cuda, 0 means --device cpu");
}

void apply_ngl(const NglFlag& ngl, std::string& device) {
  if (ngl.layers < 0) return;
  const std::string want = ngl.layers > 0 ? "cuda" : "cpu";
  if (ngl.device_opt != nullptr && ngl.device_opt->count() > 0) {
    if (device != want)
      throw Error(fmt::format("-ngl {} asks for {} but --device says {}; give one of them", ngl.layers, want, device));
    return;
  }
  device = want;
  if (ngl.layers > 0)
    fmt::print(stderr, "tessera: -ngl {}: Tessera runs every layer on one device; using --device cuda\n", ngl.layers);
}

int cap_threads(int requested) {
  if (requested < 0) throw Error(fmt::format("-t {} must not be negative (0: all cores)", requested));
  const int hw = hardware_threads();
  if (requested <= hw) return requested;
  fmt::print(stderr, "tessera: -t {}: this machine has {} hardware threads; using {}\n", requested, hw, hw);
  return hw;
}

std::string process_escapes(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  const auto hex = [](char c) {
    return (c >= '0' && c <= '9')   ? c - '0'
           : (c >= 'a' && c <= 'f') ? c - 'a' + 10
           : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                    : -1;
  };
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 == in.size()) {
      out.push_back(in[i]);
      continue;
    }
    const char c = in[++i];
    switch (c) {
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case 'x':
        if (i + 2 < in.size() && hex(in[i + 1]) >= 0 && hex(in[i + 2]) >= 0) {
          out.push_back(static_cast<char>(hex(in[i + 1]) * 16 + hex(in[i + 2])));
          i += 2;
          break;
        }
        [[fallthrough]];
      default:
        out.push_back('\\');
        out.push_back(c);
    }
  }
  return out;
}

std::string read_prompt_file(const std::string& path) {
  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      throw Error(fmt::format("{}: is a directory, not a prompt file", path));
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(fmt::format("{}: cannot open the prompt file", path));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw Error(fmt::format("{}: cannot read the prompt file", path));
    text = ss.str();
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();  // as llama.cpp's -f: an editor's final newline
  return text;
}

std::string count_noun(int64_t n, const std::string& singular) {
  return fmt::format("{} {}{}", n, singular, n == 1 ? "" : "s");
}

std::string stats_line(const Timings& t) {
  return fmt::format("prompt {} tok, {:.1f} tok/s; generated {} tok, {:.1f} tok/s; peak RSS {:.1f} MiB",
                     t.prompt_tokens, t.prompt_tokens_per_s(), t.generated_tokens, t.generated_tokens_per_s(),
                     double(t.peak_rss_bytes) / (1 << 20));
}

}  // namespace tessera::cli
