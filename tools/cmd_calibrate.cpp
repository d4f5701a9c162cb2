// tessera calibrate: TEAL thresholds per layer and matmul input from a calibration text (docs/TEAL.md), written as a
// JSON sidecar that run, chat, bench, perplexity, logits and profile read with --teal FILE.
#include <fmt/core.h>

#include <cstdio>

#include "command.h"
#include "gen_options.h"
#include "tessera/calibrate.h"
#include "tessera/error.h"
#include "tessera/model.h"

namespace tessera::cli {
namespace {

struct CalibrateFlags {
  std::string model;
  std::string out;
  CalibrateOptions o;
};

int run_calibrate(CalibrateFlags& f) {
  if (f.out.empty()) throw Error("give the thresholds file to write with -o FILE");
  if (f.o.text_path.empty()) throw Error("give the calibration text with -f FILE");
  f.o.n_threads = cap_threads(f.o.n_threads);
  const Model model = Model::load(f.model);
  f.o.progress = [](std::string_view line) { fmt::print(stderr, "{}\n", line); };
  if (f.o.greedy && f.o.greedy_tokens < 2) throw Error("--greedy-tokens must be at least 2");
  const TealThresholds t = calibrate(model, f.o);
  save_teal_thresholds(t, f.out);
  fmt::print(stderr, "calibrate: {} layers x 4 inputs over {} tokens of {}, {} at {:g}%: {}\n", t.thresholds.size(),
             t.tokens, t.text_name, t.greedy ? "greedy" : "uniform", 100.0 * t.sparsity, f.out);
  return 0;
}

const int registered = register_command(
    {"calibrate", "TEAL activation-sparsity thresholds per layer and matmul input from a calibration text",
     [](CLI::App& app) -> Runner {
       auto f = std::make_shared<CalibrateFlags>();
       add_model_option(app, f->model);
       app.add_option("-f,--file", f->o.text_path, "Calibration text (UTF-8); evaluate on another text");
       app.add_option("--sparsity", f->o.sparsity, "Target share of zeros of every input (default 0.5)");
       app.add_flag("--greedy", f->o.greedy,
                    "TEAL's block-wise greedy allocation: --sparsity is then the share of the blocks' weights skipped");
       app.add_option("--greedy-tokens", f->o.greedy_tokens,
                      "Greedy: tokens whose block outputs measure each step's error (default 128)");
       app.add_option("--greedy-step", f->o.greedy_step,
                      "Greedy: weighted sparsity one step adds (default 0.0125; one forward pass per input a step)");
       app.add_option("-o,--output", f->out, "Thresholds file to write (JSON)");
       app.add_option("-c,--ctx-size", f->o.n_ctx, "Tokens per calibration chunk (default 512)");
       app.add_option("--tokens", f->o.max_tokens, "Calibration tokens: the text's first ones (default 16384)");
       app.add_option("-t,--threads", f->o.n_threads, "Threads (default: all cores)");
       return [f] { return run_calibrate(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
