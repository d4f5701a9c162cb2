// tessera quantize: write a quantized GGUF from an f32/f16/bf16 GGUF or a Hugging Face model, byte for byte what
// llama.cpp's llama-quantize writes for a GGUF input (include/tessera/quantize.h; docs/QUANTIZE.md).
//
//   tessera quantize model-f16.gguf model-q4_k_m.gguf q4_K_M -t 8
//   tessera quantize ./my-hf-model model-q8_0.gguf q8_0
//
// One line per tensor goes to stderr as it is converted ([  12/ 272] name [shape] f16 -> q5_0), then a summary.
#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "tessera/quantize.h"

namespace tessera::cli {
namespace {

struct QuantizeFlags {
  std::string input, output, type;
  int n_threads = 0;
  bool allow_requantize = false;
  bool quiet = false;
  std::string ternary = "absmax";
};

std::string mib(uint64_t b) { return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20)); }

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string types_footer() {
  std::string out =
      "Types (TYPE, case-insensitive; q4_K means q4_K_M, q5_K q5_K_M; llama.cpp's file type numbers work too):\n";
  for (const QuantizeType& t : quantize_types()) out += fmt::format("  {:<8} {}\n", t.name, t.description);
  out +=
      "\nTensor types follow llama-quantize's rules for the type (output and token_embd q6_K or q8_0, the _M mixes' "
      "attn_v/ffn_down layers, a fallback to a 32-block type when a row is not a multiple of 256), and a GGUF input "
      "gives the same file, byte for byte, as llama-quantize without an importance matrix.";
  return out;
}

int run(const QuantizeFlags& f) {
  QuantizeOptions o;
  o.type = f.type;
  o.n_threads = f.n_threads;
  o.allow_requantize = f.allow_requantize;
  o.ternary_absmean = f.ternary == "absmean";
  o.on_warning = [](const std::string& w) { fmt::print(stderr, "tessera: warning: {}\n", w); };
  if (!f.quiet) {
    o.on_tensor = [](const QuantizeTensorInfo& t) {
      const std::string what = t.from == t.to
                                   ? fmt::format("{} (copied)", t.from)
                                   : fmt::format("{} -> {}{}", t.from, t.to, t.fallback ? " (fallback)" : "");
      fmt::print(stderr, "[{:4}/{:4}] {:<36} {:<14} {:<24} {:>11} -> {:>11}\n", t.index, t.count, t.name,
                 shape_text(t.shape), what, mib(t.bytes_in), mib(t.bytes_out));
    };
  }
  const auto t0 = std::chrono::steady_clock::now();
  const QuantizeResult r = quantize_model(f.input, f.output, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(stderr,
             "quantize: {} -> {}: {} tensors ({} quantized, {} fallback, {} requantized), {} -> {} in {:.2f} s\n",
             f.input, f.output, r.n_tensors, r.n_quantized, r.n_fallback, r.n_requantized, mib(r.bytes_in),
             mib(r.bytes_out), s);
  return 0;
}

const int registered = register_command(
    {"quantize", "Quantize a GGUF or Hugging Face model to a GGUF file (the bytes llama-quantize writes)",
     [](CLI::App& app) -> Runner {
       auto f = std::make_shared<QuantizeFlags>();
       app.add_option("input", f->input,
                      "Model to quantize: a GGUF file (f32/f16/bf16 weights) or a Hugging Face model folder "
                      "(config.json and safetensors)")
           ->required();
       app.add_option("output", f->output, "GGUF file to write (replaced atomically when it exists)")->required();
       app.add_option("type", f->type, "Quantization type, e.g. q4_K_M, q8_0 (listed below)")->required();
       app.add_option("nthreads", f->n_threads, "Threads, as llama-quantize's optional last argument (the same as -t)");
       app.add_option("-t,--threads", f->n_threads, "Threads (default: one per hardware thread)");
       app.add_flag("--allow-requantize", f->allow_requantize,
                    "Also quantize tensors that are already quantized (dequantized first; warns: the result is worse "
                    "than from the f16/f32 original)");
       app.add_option("--ternary", f->ternary,
                      "tq1_0 / tq2_0 scales: absmax (max |w| per 256, llama-quantize's bytes) or absmean (BitNet "
                      "b1.58: mean |w| per tensor, weights rounded to {-1, 0, 1} times it)")
           ->check(CLI::IsMember({"absmax", "absmean"}));
       app.add_flag("-q,--quiet", f->quiet, "No per-tensor progress lines (warnings and the summary stay)");
       app.footer(types_footer());
       return [f] { return run(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
