// tessera dump: the TEAL workload of a prompt's decode steps (include/tessera/dump.h, docs/TEAL.md): each chosen block
// matmul's input after sparsification and its output as .npy, with manifest.json and the weights by reference (or
// dequantized with --weights). python/load_dump.py reads it back and reproduces every output.
//
//   tessera dump -p "The capital of France is" --sparsity 0.5 --layers 0-3 --ops q,down --tokens 8 -o dump/
#include <fmt/core.h>

#include <cstdio>
#include <string>

#include "command.h"
#include "gen_options.h"
#include "tessera/dump.h"
#include "tessera/error.h"
#include "tessera/model.h"

namespace tessera::cli {
namespace {

struct DumpFlags {
  std::string model;
  std::string layers;
  std::string ops;
  std::string max_bytes = "1G";
  DumpOptions o;
};

int64_t parse_int(const std::string& s, const std::string& what) {
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used == s.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("{}: '{}' is not a non-negative integer", what, s));
}

// "3" or "2-5" (inclusive).
void parse_layers(const std::string& s, DumpOptions& o) {
  if (s.empty()) return;
  const size_t dash = s.find('-');
  o.layer_first = parse_int(s.substr(0, dash), "--layers");
  o.layer_last = dash == std::string::npos ? o.layer_first : parse_int(s.substr(dash + 1), "--layers");
  if (o.layer_last < o.layer_first) throw Error(fmt::format("--layers {}: the last layer is before the first", s));
}

// "512M", "1G", "65536" (K, M, G: powers of 1024).
uint64_t parse_bytes(const std::string& s) {
  if (s.empty()) throw Error("--max-bytes: give a size such as 512M or 1G");
  uint64_t mul = 1;
  std::string digits = s;
  switch (s.back()) {
    case 'K':
    case 'k':
      mul = uint64_t{1} << 10;
      break;
    case 'M':
    case 'm':
      mul = uint64_t{1} << 20;
      break;
    case 'G':
    case 'g':
      mul = uint64_t{1} << 30;
      break;
    default:
      break;
  }
  if (mul != 1) digits.pop_back();
  return static_cast<uint64_t>(parse_int(digits, "--max-bytes")) * mul;
}

// "812 bytes", "17.3 KiB", "9.7 MiB"
std::string size_text(uint64_t b) {
  if (b < 1024) return fmt::format("{} bytes", b);
  if (b < (uint64_t{1} << 20)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
  if (b < (uint64_t{1} << 30)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30));
}

int run_dump(DumpFlags& f) {
  parse_layers(f.layers, f.o);
  if (!f.ops.empty()) {
    f.o.ops.clear();
    size_t at = 0;
    while (at <= f.ops.size()) {
      size_t end = f.ops.find(',', at);
      if (end == std::string::npos) end = f.ops.size();
      f.o.ops.push_back(f.ops.substr(at, end - at));
      at = end + 1;
    }
  }
  f.o.max_bytes = parse_bytes(f.max_bytes);
  f.o.n_threads = cap_threads(f.o.n_threads);
  if (f.o.out_dir.empty()) throw Error("give the dump's directory with -o DIR");
  if (f.o.prompt.empty()) throw Error("give the prompt with -p PROMPT");
  const Model model = Model::load(f.model);
  const uint64_t estimate = estimate_dump_bytes(model, f.o);
  fmt::print(stderr, "dump: about {} to write (--max-bytes {})\n", size_text(estimate), size_text(f.o.max_bytes));
  f.o.progress = [](std::string_view line) { fmt::print(stderr, "{}\n", line); };
  const DumpResult r = dump_workload(model, f.o);
  fmt::print(stderr, "dump: {} matmuls x {} tokens, {} files, {}, achieved activation sparsity {:.1f}%: {}\n",
             r.matmuls, f.o.tokens, r.files, size_text(r.bytes), 100.0 * r.achieved_sparsity, f.o.out_dir);
  return 0;
}

const int registered = register_command(
    {"dump", "Write the TEAL workload (each block matmul's sparsified input and output per decoded token) as .npy",
     [](CLI::App& app) -> Runner {
       auto f = std::make_shared<DumpFlags>();
       add_model_option(app, f->model);
       app.add_option("-p,--prompt", f->o.prompt, "Prompt text; its last token and the greedy continuation are dumped");
       app.add_option("--sparsity", f->o.sparsity, "TEAL top-k per token: zero this share of every matmul input");
       app.add_option("--teal", f->o.teal, "TEAL thresholds file from `tessera calibrate` (instead of --sparsity)");
       app.add_option("--layers", f->layers, "Layers A-B (inclusive) or A (default: all)");
       app.add_option("--ops", f->ops, "Matmuls, comma-separated: q,k,v,o,gate,up,down (default: all)");
       app.add_option("--tokens", f->o.tokens, "Decode steps to dump (default 4)");
       app.add_flag("--weights", f->o.weights, "Write the dequantized f32 weights too (else a reference to the file)");
       app.add_option("--max-bytes", f->max_bytes, "Refuse a dump estimated larger than this (default 1G; K, M, G)");
       app.add_option("-o,--output", f->o.out_dir, "Directory to write (created if missing)");
       app.add_option("-t,--threads", f->o.n_threads, "Threads (default: all cores)");
       app.add_flag("--reference", f->o.reference, "CPU f32 reference path (outputs exact to reproduce)");
       return [f] { return run_dump(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
