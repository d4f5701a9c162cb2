// tessera graph: the model's computation graph (every node with its op, shapes, dtype, FLOPs and bytes, the edges,
// totals per op class and the matmul share) as text, JSON or Graphviz DOT.
#include <fmt/core.h>

#include <cstdio>
#include <fstream>

#include "command.h"
#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/model.h"

namespace tessera::cli {
namespace {

struct GraphFlags {
  std::string model;
  std::string format = "text";
  int64_t tokens = 1;
  int64_t past = 0;
  int64_t ctx = 0;
  bool all_logits = false;
  std::string kv_type = "f16";
  std::string output;
};

int run(const GraphFlags& f) {
  if (f.format != "text" && f.format != "json" && f.format != "dot")
    throw Error(fmt::format("unknown format '{}' (expected text, json or dot)", f.format));
  if (f.tokens <= 0) throw Error(fmt::format("--tokens {} must be positive", f.tokens));
  if (f.past < 0) throw Error(fmt::format("--past {} must not be negative", f.past));
  ModelOptions mo;
  mo.load_tokenizer = false;
  const Model model = Model::load(f.model, mo);
  // The graph of a position the model cannot reach is no graph of this model (its attention cost would be made up).
  const int64_t limit = model.spec().n_ctx_train > 0 ? model.spec().n_ctx_train : int64_t{1} << 24;
  if (f.past + f.tokens > limit)
    throw Error(
        fmt::format("--past {} + --tokens {} is beyond the model's context of {} tokens", f.past, f.tokens, limit));
  if (f.ctx < 0) throw Error(fmt::format("-c {} must not be negative", f.ctx));
  if (f.ctx > 0 && f.ctx < f.past + f.tokens)
    throw Error(fmt::format("-c {} is shorter than --past + --tokens ({})", f.ctx, f.past + f.tokens));
  const GraphView g = build_graph(model, f.tokens, f.past, GraphOptions{f.ctx, f.kv_type, f.all_logits});
  const std::string text = g.format(f.format);
  if (f.output.empty() || f.output == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::ofstream out(f.output, std::ios::binary);
  if (!out || !out.write(text.data(), static_cast<std::streamsize>(text.size())))
    throw Error(fmt::format("{}: cannot write the graph", f.output));
  return 0;
}

const int registered = register_command(
    {"graph", "Print the model's computation graph: nodes, shapes, FLOPs, bytes, edges", [](CLI::App& app) -> Runner {
       auto f = std::make_shared<GraphFlags>();
       add_model_option(app, f->model);
       app.add_option("--format", f->format, "text (default), json or dot");
       app.add_option("-T,--tokens", f->tokens, "Tokens per forward pass: 1 is a decode step, more a prefill chunk");
       app.add_option("-P,--past", f->past, "Tokens already in the KV cache (changes the attention cost)");
       app.add_option("-c,--ctx", f->ctx, "KV cache length shown (default: past + tokens)");
       app.add_flag("--all-logits", f->all_logits, "Output logits for every token, not only the last");
       app.add_option("--kv-type", f->kv_type, "KV cache type: f16 (default) or f32");
       app.add_option("-o,--output", f->output, "Write to this file instead of stdout");
       return [f] { return run(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
