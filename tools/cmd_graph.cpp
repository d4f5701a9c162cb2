// tessera graph: the model's computation graph (every node with its op, shapes, dtype, FLOPs and bytes, the edges,
// totals per op class and the matmul share) as text, JSON or Graphviz DOT, or as the model views: SVG (through
// Graphviz) and a self-contained HTML page. --device shows the graph as that backend's passes rewrite it (fused
// nodes); --profile runs the model and colours every node by its measured time.
#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>

#include "bench_util.h"
#include "command.h"
#include "gen_options.h"
#include "tessera/bench.h"
#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/model.h"
#include "tessera/random_model.h"
#include "tessera/session.h"

namespace tessera::cli {
namespace {

struct GraphFlags {
  std::string model;
  std::string arch;
  bool random_weights = false;
  std::string dtype = "q4_0";
  std::string format = "text";
  int64_t tokens = 1;
  int64_t past = 0;
  int64_t ctx = 0;
  bool all_logits = false;
  std::string kv_type = "f16";
  std::string output;
  std::string layers;  // "A-B" or "A": layers drawn in full
  std::string device;
  bool profile = false;
  bool limits = false;
  int64_t n_gen = 16;
  int64_t prompt_tokens = 64;
  int threads = 0;
  bool chains = false;  // --chains: the matmul chains and their orders (graph/passes/chain.h) instead of the graph
  LoraFlags lora;       // --lora, --lora-merge: the adapters' nodes in the graph
  TealFlags teal;       // --sparsity, --teal: TEAL's SPARSIFY and MATMUL_SPARSE nodes
};

int64_t layer_count(const GraphView& g) {
  int64_t n = 0;
  for (const GraphNode& x : g.nodes()) n = std::max<int64_t>(n, x.layer + 1);
  return n;
}

// "A-B" or "A" -> the inclusive range, checked against the model's layers.
std::pair<int, int> parse_layers(const std::string& s, int64_t n_layers) {
  const std::string bad =
      fmt::format("--layers '{}' must be A-B or A with 0 <= A <= B < {} (the model's layers)", s, n_layers);
  const size_t dash = s.find('-');
  const auto num = [&](const std::string& t) {
    if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string::npos) throw Error(bad);
    return std::stoi(t);
  };
  const int a = num(s.substr(0, dash));
  const int b = dash == std::string::npos ? a : num(s.substr(dash + 1));
  if (a > b || b >= n_layers) throw Error(bad);
  return {a, b};
}

// Runs the model as `tessera profile` does (a prefill, then greedy decode steps, timed per node after a warm-up) and
// returns the time of every node of `shown` in the measured step: the prefill of T tokens for a T-token graph, the mean
// decode step for a one-token graph.
GraphRender measure(const GraphFlags& f, const Model& model, const GraphView& shown, bool rewritten) {
  const std::string device = f.device.empty() ? "cpu" : f.device;
  const bool decode = f.tokens == 1;
  const int64_t n_prompt = decode ? f.prompt_tokens : f.tokens;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(model.spec().n_vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n_prompt));
  for (int32_t& x : ids) x = d(rng);

  SessionOptions so;
  so.n_ctx = n_prompt + f.n_gen + 4;
  so.n_batch = n_prompt;
  so.n_threads = cap_threads(f.threads);
  so.device = device;
  apply_lora_flags(f.lora, so);
  apply_teal_flags(f.teal, so);
  Session session(model, so);
  const auto argmax = [](std::span<const float> x) {
    return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  };
  // Warm-up (weights paged in, plans compiled), not profiled.
  int32_t next = argmax(session.eval(ids));
  for (int i = 0; i < 2; ++i) next = argmax(session.decode(next));
  session.reset();

  using Clock = std::chrono::steady_clock;
  double wall_s = 0;
  std::vector<uint64_t> ns;
  if (!decode) {
    session.set_profiling(true);
    const auto t0 = Clock::now();
    session.eval(ids);
    wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    session.set_profiling(false);
    ns = session.profile_ns(f.tokens);
  } else {
    next = argmax(session.eval(ids));
    session.set_profiling(true);
    for (int64_t i = 0; i < f.n_gen; ++i) {
      const auto t0 = Clock::now();
      std::span<const float> logits = session.decode(next);
      wall_s += std::chrono::duration<double>(Clock::now() - t0).count();
      next = argmax(logits);
    }
    session.set_profiling(false);
    ns = session.profile_ns(1);
  }
  const double steps = decode ? double(f.n_gen) : 1.0;
  const GraphView source = session.graph(f.tokens, decode ? n_prompt : 0);
  if (ns.size() != source.nodes().size())
    throw Error(fmt::format("the profile has {} node times for a graph of {} nodes", ns.size(), source.nodes().size()));

  GraphRender r;
  r.wall_ms = wall_s * 1e3 / steps;
  for (const GraphNode& n : shown.nodes()) {
    // A rewritten graph's node carries the time of the builder's node it is reported under (its source).
    const int src = rewritten ? n.source : n.id;
    r.node_ms.push_back(src >= 0 && static_cast<size_t>(src) < ns.size() ? double(ns[size_t(src)]) * 1e-6 / steps
                                                                         : 0.0);
  }
  double sum = 0;
  for (double ms : r.node_ms) sum += ms;
  r.profile = decode ? fmt::format("measured: decode, mean of {} steps after a {}-token prompt", f.n_gen, n_prompt)
                     : fmt::format("measured: prefill of {} tokens", n_prompt);
  r.profile += fmt::format(" on {}, {} threads: {:.3f} ms per step, node times sum to {:.1f}% of it", device,
                           session.n_threads(), r.wall_ms, r.wall_ms > 0 ? 100.0 * sum / r.wall_ms : 0.0);

  if (f.limits) {
    std::set<std::string> dtypes;
    for (const GraphNode& n : shown.nodes())
      if (n.op == "matmul" && n.input_dtypes.size() > 1)
        dtypes.insert(device == "cuda" ? n.input_dtypes[1] : cpu_matmul_dtype(n.input_dtypes[1]));
    CeilingOptions co;
    co.device = device;
    co.n_threads = session.n_threads();
    co.repeats = 3;
    co.gemm_dtypes.assign(dtypes.begin(), dtypes.end());
    fmt::print(stderr, "tessera: measuring ceilings (bandwidth over {}, GEMM rates)...\n",
               human_bytes(co.buffer_bytes));
    const Ceilings c = measure_ceilings(co);
    for (size_t i = 0; i < shown.nodes().size(); ++i) {
      const GraphNode& n = shown.nodes()[i];
      const std::string wd = n.op == "matmul" && n.input_dtypes.size() > 1 ? n.input_dtypes[1] : "";
      const double peak =
          wd.empty() ? c.fma_peak_tflops() : c.gemm_tflops(device == "cuda" ? wd : cpu_matmul_dtype(wd));
      const double s = r.node_ms[i] * 1e-3;
      r.node_roof.push_back(s > 0 ? roof_share(double(n.flops), double(n.bytes), s, peak, c.read_gbps()).fraction
                                  : -1.0);
    }
    r.profile += fmt::format("; limits: read {:.1f} GB/s", c.read_gbps());
  }
  return r;
}

int run(GraphFlags f) {
  if (f.chains) {
    if (f.format != "text") throw Error("--chains prints text: leave out --format");
    if (f.profile) throw Error("--chains prints the chain orders' modelled cost: leave out --profile");
    f.format = "chains";
  }
  if (!f.lora.specs.empty() && f.random_weights)
    throw Error("--lora adapts a model file: give -m MODEL instead of --random-weights");
  if (f.format != "chains" && f.format != "text" && f.format != "json" && f.format != "dot" && f.format != "svg" &&
      f.format != "html")
    throw Error(fmt::format("unknown format '{}' (expected text, json, dot, svg or html)", f.format));
  if (f.tokens <= 0) throw Error(fmt::format("--tokens {} must be positive", f.tokens));
  if (f.past < 0) throw Error(fmt::format("--past {} must not be negative", f.past));
  if (f.ctx < 0) throw Error(fmt::format("-c {} must not be negative", f.ctx));
  if (f.ctx > 0 && f.ctx < f.past + f.tokens)
    throw Error(fmt::format("-c {} is shorter than --past + --tokens ({})", f.ctx, f.past + f.tokens));
  const bool view = f.format == "svg" || f.format == "html";
  if (f.profile && !view) throw Error("--profile colours the model views: use it with --format svg or html");
  if (!f.layers.empty() && !view)
    throw Error("--layers picks the layers drawn in full: use it with --format svg or html");
  if (f.limits && !f.profile) throw Error("--limits measures the roofline for --profile: add --profile");
  if (f.n_gen < 1) throw Error(fmt::format("-n {} must be positive", f.n_gen));
  if (f.prompt_tokens < 1) throw Error(fmt::format("--prompt-tokens {} must be positive", f.prompt_tokens));
  if (!f.device.empty() && f.device != "cpu" && f.device != "cuda")
    throw Error(fmt::format("unknown device '{}' (expected cpu or cuda)", f.device));
  if (!f.random_weights && !f.arch.empty()) throw Error("--arch builds a synthetic model and needs --random-weights");
  if (f.random_weights && f.arch.empty()) throw Error("--random-weights needs --arch NAME (the preset to show)");
  if (f.random_weights && !f.model.empty())
    throw Error("give either -m MODEL or --arch NAME --random-weights, not both");

  SessionOptions lora;
  apply_lora_flags(f.lora, lora);
  // --chains: the builder's chains (a device's view has them rewritten already), weighed by the device's ceilings.
  const GraphOptions go{f.ctx,     f.kv_type,       f.all_logits,    f.chains ? std::string() : f.device,
                        lora.lora, lora.lora_merge, f.teal.sparsity, f.teal.teal};
  Model model;
  GraphView g;
  if (f.random_weights && !f.profile) {
    // Nothing to run: the preset's graph needs no weights.
    g = build_preset_graph(f.arch, f.dtype, f.tokens, f.past, go);
  } else {
    if (f.random_weights) {
      ModelSource src;
      src.arch = f.arch;
      src.random_weights = true;
      src.dtype = f.dtype;
      model = load_model_source(src, false);
    } else {
      ModelOptions mo;
      mo.load_tokenizer = false;
      model = Model::load(f.model, mo);
    }
    // The graph of a position the model cannot reach is no graph of this model (its attention cost would be made up).
    const int64_t limit = model.spec().n_ctx_train > 0 ? model.spec().n_ctx_train : int64_t{1} << 24;
    if (f.past + f.tokens > limit)
      throw Error(
          fmt::format("--past {} + --tokens {} is beyond the model's context of {} tokens", f.past, f.tokens, limit));
    g = build_graph(model, f.tokens, f.past, go);
  }

  GraphRender r;
  const int64_t n_layers = layer_count(g);
  if (!f.layers.empty()) {
    std::tie(r.full_first, r.full_last) = parse_layers(f.layers, n_layers);
    r.collapse_others = true;
  }
  if (!f.device.empty() && f.device != "cpu")
    r.note = fmt::format(
        "as the {} backend's graph passes rewrite it for {} ({} nodes; fused nodes list what they "
        "compute)",
        f.device, f.tokens == 1 ? "decode" : "a prefill chunk", g.nodes().size());
  if (f.profile) {
    const GraphRender m = measure(f, model, g, !f.device.empty() && f.device != "cpu");
    r.node_ms = m.node_ms;
    r.node_roof = m.node_roof;
    r.wall_ms = m.wall_ms;
    r.profile = m.profile;
  }
  const std::string text = f.chains ? g.format_chains(f.device) : g.format(f.format, r);
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
    {"graph", "Print or draw the model's computation graph: nodes, shapes, FLOPs, bytes, edges, measured time",
     [](CLI::App& app) -> Runner {
       auto f = std::make_shared<GraphFlags>();
       add_model_option(app, f->model);
       std::string archs;
       for (const std::string& a : random_model_archs()) archs += (archs.empty() ? "" : ", ") + a;
       app.add_option("--arch", f->arch, "Show this preset's graph (with --random-weights): " + archs);
       app.add_flag(
           "--random-weights", f->random_weights,
           "A synthetic model of the --arch preset (made only for --profile; the graph alone needs no weights)");
       app.add_option("--dtype", f->dtype, "Weight dtype of the synthetic model (default q4_0)");
       app.add_option("--format", f->format,
                      "text (default), json, dot, svg (laid out by Graphviz) or html (one self-contained page)");
       app.add_option("-T,--tokens", f->tokens, "Tokens per forward pass: 1 is a decode step, more a prefill chunk");
       app.add_option("-P,--past", f->past, "Tokens already in the KV cache (changes the attention cost)");
       app.add_option("-c,--ctx", f->ctx, "KV cache length shown (default: past + tokens)");
       app.add_flag("--all-logits", f->all_logits, "Output logits for every token, not only the last");
       app.add_option("--kv-type", f->kv_type, "KV cache type: f16 (default) or f32");
       app.add_option("-o,--output", f->output, "Write to this file instead of stdout");
       app.add_flag("--chains", f->chains,
                    "Print the matmul chains (a LoRA adapter's x·Aᵀ·Bᵀ), every order considered with its FLOPs, "
                    "bytes and modelled cost, and the order chosen (with --device, under that backend's ceilings)");
       add_lora_flags(app, f->lora);
       add_teal_flags(app, f->teal);
       app.add_option("--layers", f->layers,
                      "svg/html: draw layers A-B (or A) in full, the others as one box each (svg default: 0)");
       app.add_option("--device", f->device,
                      "Show the graph as this backend's passes rewrite it (cpu: unfused; cuda: fused nodes, needs a "
                      "build with CUDA, not a GPU); with --profile, run there");
       app.add_flag("--profile", f->profile,
                    "svg/html: run a short prefill and decode and colour every node by its measured time");
       app.add_flag("--limits", f->limits, "With --profile: measure this machine's limits for each node's % of roof");
       app.add_option("-n,--n-gen", f->n_gen, "With --profile on a one-token graph: decode steps timed (default 16)");
       app.add_option("--prompt-tokens", f->prompt_tokens,
                      "With --profile on a one-token graph: prompt before the decode steps (default 64)");
       app.add_option("-t,--threads", f->threads, "With --profile: threads (default: all cores)");
       return [f] { return run(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
