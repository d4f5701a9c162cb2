// tessera profile: where the time goes. Runs a prefill of the prompt and N greedy decode steps with per-node timing
// on, then reports, for prefill and decode separately, the time per op class and per matmul role (q, k, v, o, gate,
// up, down, output), their share, the achieved GFLOP/s and GB/s, and the fraction of this machine's roofline. The
// wall time of each phase is printed next to the sum of its node times, so the breakdown can be trusted.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "bench_util.h"
#include "command.h"
#include "gen_options.h"
#include "tessera/bench.h"
#include "tessera/error.h"
#include "tessera/session.h"

namespace tessera::cli {
namespace {

// A fixed, ordinary English paragraph (about 100 tokens), so profiles of different runs do the same work.
constexpr const char* kDefaultPrompt =
    "The history of computing is a story of trading one scarce resource for another. Early machines were limited by "
    "the speed of their arithmetic units, so engineers counted every multiplication. Today the arithmetic is cheap "
    "and the bottleneck is moving data: a modern processor can perform hundreds of operations in the time it takes "
    "to fetch a single value from main memory. Understanding where a program spends its time therefore means "
    "measuring both the work it does and the bytes it moves.";

struct ProfileFlags {
  ModelSource src;
  std::string prompt;
  int64_t prompt_tokens = 0;
  int64_t n_gen = 32;
  int threads = 0;
  std::string device = "cpu";
  NglFlag ngl;           // -ngl: llama.cpp's spelling of the device
  BackendFlags backend;  // --cuda KEY=VALUE, --cpu-isa
  TealFlags teal;        // --sparsity, --teal
  LoraFlags lora;        // --lora, --lora-merge
  int64_t batch = 512;
  bool json = false;
  bool no_ceilings = false;  // the default now; kept for scripts that pass it
  bool limits = false;
  int64_t ceiling_mib = 1024;
  CLI::Option* ceiling_mib_opt = nullptr;
  bool all_nodes = false;
  std::string trace;  // --trace FILE: Chrome / Perfetto trace of the profiled run
};

// The profiled run as Chrome's Trace Event Format (chrome://tracing, ui.perfetto.dev): track 1 holds one slice per
// step (prefill, each decode step) with its measured start and end; track 2 the executor's node sequence, one slice
// per node and step named by its graph node. The backends time each node's duration, not its start, so a step's node
// slices are laid end to end from the step's start, in graph order (the order the executor runs them); what the
// executor spends between nodes shows as the gap before the next step. Times are microseconds from the prefill's start.
class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Trace(Clock::time_point origin) : origin_(origin) {}

  // A step's slice on track 1, with its measured start and end.
  void step(const std::string& label, Clock::time_point begin, Clock::time_point end, int64_t tokens) {
    const double b = us(begin), e = us(end);
    events_.push_back({{"name", label},
                       {"cat", "step"},
                       {"ph", "X"},
                       {"ts", b},
                       {"dur", std::max(0.0, e - b)},
                       {"pid", 1},
                       {"tid", 1},
                       {"args", {{"tokens", tokens}}}});
  }
  // The nodes of graph `g` as one run of it took them (`ns` per node), on track 2 from `begin` or the end of the
  // previous run, whichever is later; with `spans` (Session::profile_thread_spans of that run, `threads` per node),
  // each worker thread's part of each node on a track of its own (10 + thread).
  void nodes(const std::string& label, Clock::time_point begin, const GraphView& g, const std::vector<double>& ns,
             const std::vector<uint64_t>& spans = {}, int threads = 0) {
    cursor_ns_ = std::max(cursor_ns_, us(begin) * 1e3);
    for (const GraphNode& n : g.nodes()) {
      const double d = static_cast<size_t>(n.id) < ns.size() ? ns[static_cast<size_t>(n.id)] : 0.0;
      const size_t at = static_cast<size_t>(n.id) * static_cast<size_t>(threads) * 2;
      for (int j = 0; threads > 0 && at + 2 * static_cast<size_t>(threads) <= spans.size() && j < threads; ++j) {
        const uint64_t b = spans[at + 2 * static_cast<size_t>(j)], e = spans[at + 2 * static_cast<size_t>(j) + 1];
        if (b == 0) continue;  // this thread ran none of the node's tasks
        max_thread_ = std::max(max_thread_, j);
        events_.push_back({{"name", n.name},
                           {"cat", n.op_class},
                           {"ph", "X"},
                           {"ts", (cursor_ns_ + double(b - 1)) * 1e-3},
                           {"dur", double(e >= b ? e - b : 0) * 1e-3},
                           {"pid", 1},
                           {"tid", 10 + j},
                           {"args", {{"op", n.op}, {"layer", n.layer}, {"step", label}, {"thread", j}}}});
      }
      events_.push_back(
          {{"name", n.name},
           {"cat", n.op_class},
           {"ph", "X"},
           {"ts", cursor_ns_ * 1e-3},
           {"dur", d * 1e-3},
           {"pid", 1},
           {"tid", 2},
           {"args", {{"op", n.op}, {"layer", n.layer}, {"step", label}, {"flops", n.flops}, {"bytes", n.bytes}}}});
      cursor_ns_ += d;
    }
  }

  void write(const std::string& path, const nlohmann::json& meta, const std::string& device, int threads) const {
    nlohmann::json events = nlohmann::json::array();
    const auto name = [&events](const char* what, int tid, const std::string& v) {
      events.push_back({{"name", what}, {"ph", "M"}, {"pid", 1}, {"tid", tid}, {"args", {{"name", v}}}});
    };
    name("process_name", 0, "tessera profile (" + device + ")");
    name("thread_name", 1, "steps");
    name("thread_name", 2,
         device == "cuda" ? "cuda stream: node sequence"
                          : fmt::format("cpu executor: node sequence ({} threads per node)", threads));
    for (int j = 0; j <= max_thread_; ++j)
      name("thread_name", 10 + j, j == 0 ? "cpu thread 0 (the caller)" : fmt::format("cpu thread {}", j));
    for (const nlohmann::json& e : events_) events.push_back(e);
    const nlohmann::json j = {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", meta}};
    std::ofstream out(path, std::ios::binary);
    const std::string text = j.dump(1);
    if (!out || !out.write(text.data(), static_cast<std::streamsize>(text.size())))
      throw Error(fmt::format("{}: cannot write the trace", path));
  }

 private:
  double us(Clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - origin_).count(); }
  Clock::time_point origin_;
  double cursor_ns_ = 0;  // end of the executor track's last slice
  int max_thread_ = -1;   // highest worker thread with a slice
  std::vector<nlohmann::json> events_;
};

// One node's totals over a phase (summed over prefill chunks or decode steps).
struct NodeAgg {
  std::string name, op, op_class, role, weight_dtype;
  int layer = -1;
  uint64_t ns = 0;
  double flops = 0, bytes = 0;
};

struct Phase {
  std::string name;  // "prefill" or "decode"
  int64_t tokens = 0;
  std::vector<int64_t> chunks;  // prefill chunk sizes, in order
  double wall_s = 0;
  std::vector<NodeAgg> nodes;  // in graph order
};

// Adds graph `g`'s costs (times `weight`) and, when `ns` is non-null, its node times into `agg` (keyed by name).
void accumulate(std::vector<NodeAgg>& agg, std::map<std::string, size_t>& index, const GraphView& g,
                const std::vector<uint64_t>* ns, double weight) {
  for (const GraphNode& n : g.nodes()) {
    auto [it, fresh] = index.emplace(n.name, agg.size());
    if (fresh) {
      NodeAgg a{n.name, n.op, n.op_class, n.role, "", n.layer, 0, 0, 0};
      if (n.op == "matmul" && n.input_dtypes.size() > 1) a.weight_dtype = n.input_dtypes[1];
      agg.push_back(std::move(a));
    }
    NodeAgg& a = agg[it->second];
    a.flops += weight * double(n.flops);
    a.bytes += weight * double(n.bytes);
    if (ns != nullptr && static_cast<size_t>(n.id) < ns->size()) a.ns += (*ns)[static_cast<size_t>(n.id)];
  }
}

struct Row {
  std::string key;  // op class or matmul role
  uint64_t ns = 0;
  double flops = 0, bytes = 0;
  std::string dtype;  // matmul rows: the weight dtype holding most bytes
  std::map<std::string, double> dtype_bytes;
  int count = 0;
};

// Rows by op class and by matmul role, each sorted by time (descending).
std::pair<std::vector<Row>, std::vector<Row>> group(const std::vector<NodeAgg>& nodes) {
  std::map<std::string, Row> classes, roles;
  for (const NodeAgg& n : nodes) {
    // A matmul without a role is a LoRA adapter's product (the only such node a builder makes); the CPU's fused step
    // reports its time under the base matmul's role, so the row shows the unfused paths' (reference, CUDA). Every
    // node of the matmul class counts under its role (TEAL's matmul_sparse too).
    const std::string role = n.role.empty() ? "lora adapters" : n.role;
    for (Row* r : {&classes[n.op_class], n.op_class == "matmul" ? &roles[role] : nullptr}) {
      if (r == nullptr) continue;
      r->ns += n.ns;
      r->flops += n.flops;
      r->bytes += n.bytes;
      r->count++;
      if (!n.weight_dtype.empty()) r->dtype_bytes[n.weight_dtype] += n.bytes;
    }
  }
  const auto finish = [](std::map<std::string, Row>& m) {
    std::vector<Row> v;
    for (auto& [k, r] : m) {
      r.key = k;
      double best = -1;
      for (const auto& [d, b] : r.dtype_bytes)
        if (b > best) best = b, r.dtype = d;
      v.push_back(r);
    }
    std::sort(v.begin(), v.end(), [](const Row& a, const Row& b) { return a.ns > b.ns; });
    return v;
  };
  return {finish(classes), finish(roles)};
}

struct Limits {
  const Ceilings* c = nullptr;
  RoofShare share(const Row& r) const {
    if (c == nullptr) return {};
    const double peak = r.dtype.empty() ? c->fma_peak_tflops() : c->gemm_tflops(cpu_matmul_dtype(r.dtype));
    return roof_share(r.flops, r.bytes, double(r.ns) * 1e-9, peak, c->read_gbps());
  }
};

nlohmann::json row_json(const Row& r, uint64_t total_ns, const Limits& lim) {
  const double s = double(r.ns) * 1e-9;
  const RoofShare rs = lim.share(r);
  nlohmann::json j = {{"name", r.key},
                      {"nodes", r.count},
                      {"ms", double(r.ns) * 1e-6},
                      {"share", total_ns ? double(r.ns) / double(total_ns) : 0.0},
                      {"flops", r.flops},
                      {"bytes", r.bytes},
                      {"gflops", s > 0 ? r.flops / s / 1e9 : 0.0},
                      {"gbps", s > 0 ? r.bytes / s / 1e9 : 0.0},
                      {"bound", rs.bound},
                      {"fraction_of_limit", lim.c ? nlohmann::json(rs.fraction) : nlohmann::json(nullptr)}};
  if (!r.dtype.empty()) j["weight_dtype"] = r.dtype;
  return j;
}

nlohmann::json phase_json(const Phase& p, const Limits& lim) {
  uint64_t total = 0;
  for (const NodeAgg& n : p.nodes) total += n.ns;
  const auto [classes, roles] = group(p.nodes);
  nlohmann::json j = {{"tokens", p.tokens},
                      {"wall_ms", p.wall_s * 1e3},
                      {"node_ms", double(total) * 1e-6},
                      {"tok_s", p.wall_s > 0 ? double(p.tokens) / p.wall_s : 0.0},
                      {"classes", nlohmann::json::array()},
                      {"matmul_roles", nlohmann::json::array()},
                      {"nodes", nlohmann::json::array()}};
  if (!p.chunks.empty()) j["chunks"] = p.chunks;
  for (const Row& r : classes) j["classes"].push_back(row_json(r, total, lim));
  for (const Row& r : roles) j["matmul_roles"].push_back(row_json(r, total, lim));
  for (const NodeAgg& n : p.nodes)
    j["nodes"].push_back({{"name", n.name},
                          {"op", n.op},
                          {"class", n.op_class},
                          {"role", n.role},
                          {"layer", n.layer},
                          {"ms", double(n.ns) * 1e-6},
                          {"flops", n.flops},
                          {"bytes", n.bytes}});
  return j;
}

// Returns whether a row exceeded its roof (printed as ">100").
bool print_phase(const nlohmann::json& j, const std::string& name, bool all_nodes) {
  bool over = false;
  const double wall = j["wall_ms"].get<double>(), node = j["node_ms"].get<double>();
  std::string chunks;
  if (j.contains("chunks"))
    for (const auto& c : j["chunks"]) chunks += (chunks.empty() ? "" : "+") + std::to_string(c.get<int64_t>());
  fmt::print("\n{}: {}{} in {:.2f} ms ({:.2f} tok/s); node times sum to {:.2f} ms ({:.1f}% of the wall time)\n", name,
             count_noun(j["tokens"].get<int64_t>(), "token"), chunks.empty() ? "" : " (chunks " + chunks + ")", wall,
             j["tok_s"].get<double>(), node, wall > 0 ? 100.0 * node / wall : 0.0);
  fmt::print("  {:<16} {:>10} {:>7} {:>10} {:>9} {:>7}  {}\n", "class / role", "time ms", "share", "GFLOP/s", "GB/s",
             "% roof", "bound");
  const auto line = [&over](const nlohmann::json& r, const std::string& indent) {
    std::string pct = "-";
    if (!r["fraction_of_limit"].is_null()) {
      const double p = 100.0 * r["fraction_of_limit"].get<double>();
      over |= p > 100.0;
      pct = p > 100.0 ? ">100" : fmt::format("{:.1f}", p);
    }
    fmt::print("  {:<16} {:>10.3f} {:>6.1f}% {:>10.2f} {:>9.2f} {:>7}  {}\n", indent + r["name"].get<std::string>(),
               r["ms"].get<double>(), 100.0 * r["share"].get<double>(), r["gflops"].get<double>(),
               r["gbps"].get<double>(), pct, r["bound"].get<std::string>());
  };
  for (const auto& c : j["classes"]) {
    line(c, "");
    if (c["name"] == "matmul")
      for (const auto& r : j["matmul_roles"]) line(r, "  ");
  }
  std::vector<nlohmann::json> nodes(j["nodes"].begin(), j["nodes"].end());
  std::stable_sort(nodes.begin(), nodes.end(), [](const auto& a, const auto& b) {
    return a["ms"].template get<double>() > b["ms"].template get<double>();
  });
  const size_t shown = all_nodes ? nodes.size() : std::min<size_t>(nodes.size(), 8);
  fmt::print("  {} nodes{}:\n", all_nodes ? "all" : "slowest",
             all_nodes ? "" : fmt::format(" ({} of {})", shown, nodes.size()));
  for (size_t i = 0; i < shown; ++i)
    fmt::print("    {:<24} {:<10} {:>10.3f} ms\n", nodes[i]["name"].get<std::string>(),
               nodes[i]["op"].get<std::string>(), nodes[i]["ms"].get<double>());
  return over;
}

int32_t argmax(std::span<const float> x) {
  return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

int run(ProfileFlags& f) {
  apply_ngl(f.ngl, f.device);
  check_device(f.device);
  if (f.n_gen < 0) throw Error(fmt::format("-n {} must not be negative", f.n_gen));
  if (f.prompt_tokens < 0) throw Error(fmt::format("--prompt-tokens {} must not be negative", f.prompt_tokens));
  if (f.batch < 1) throw Error(fmt::format("--batch {} must be positive", f.batch));
  f.threads = cap_threads(f.threads);
  if (f.ceiling_mib_opt->count() > 0) f.limits = true;
  if (f.ceiling_mib < 1) throw Error(fmt::format("--ceiling-mib {} must be positive", f.ceiling_mib));
  if (f.prompt_tokens > 0 && !f.prompt.empty())
    throw Error("give the prompt as -p TEXT or --prompt-tokens N, not both");
  // A trace that cannot be written fails before the run, not after it.
  if (!f.trace.empty() && !std::ofstream(f.trace, std::ios::binary))
    throw Error(fmt::format("{}: cannot write the trace", f.trace));

  // Synthetic models have no real vocabulary: they get random ids unless asked otherwise.
  const int64_t n_random = f.prompt_tokens > 0 ? f.prompt_tokens : (f.src.random_weights ? 128 : 0);
  const Model model = load_model_source(f.src, n_random == 0);
  std::vector<int32_t> ids;
  if (n_random > 0) {
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(model.spec().n_vocab - 1));
    for (int64_t i = 0; i < n_random; ++i) ids.push_back(d(rng));
  } else {
    ids = model.tokenizer().encode(f.prompt.empty() ? kDefaultPrompt : f.prompt, true, false);
    if (ids.empty()) throw Error("the prompt has no tokens");
  }
  const int64_t n_prompt = static_cast<int64_t>(ids.size());

  SessionOptions so;
  so.n_ctx = n_prompt + f.n_gen + 1;
  so.n_batch = f.batch;
  so.n_threads = f.threads;
  so.device = f.device;
  so.backend_options = backend_options(f.backend, f.device);
  apply_teal_flags(f.teal, so);
  apply_lora_flags(f.lora, so);
  Session session(model, so);

  // Warm-up (weights paged in, plans compiled), not profiled.
  int32_t next = argmax(session.eval(ids));
  for (int64_t i = 0; i < std::min<int64_t>(f.n_gen, 2); ++i) next = argmax(session.decode(next));
  session.reset();

  session.set_profiling(true);
  Phase pre{"prefill", n_prompt, {}, 0, {}};
  std::map<std::string, size_t> pre_index;
  auto t0 = std::chrono::steady_clock::now();
  Trace trace(t0);
  next = argmax(session.eval(ids));
  const auto pre_end = std::chrono::steady_clock::now();
  pre.wall_s = std::chrono::duration<double>(pre_end - t0).count();
  // Snapshots: a chunk size's times accumulate over every plan run of that size, decode's (1) included.
  std::map<int64_t, std::vector<uint64_t>> after_prefill;
  std::map<int64_t, int> chunks_of_size;
  for (int64_t done = 0; done < n_prompt;) {
    const int64_t chunk = std::min(session.n_batch(), n_prompt - done);
    pre.chunks.push_back(chunk);
    chunks_of_size[chunk]++;
    if (!after_prefill.count(chunk)) after_prefill[chunk] = session.profile_ns(chunk);
    done += chunk;
  }
  if (!f.trace.empty()) trace.step(fmt::format("prefill ({} tokens)", n_prompt), t0, pre_end, n_prompt);
  // Costs per chunk at its position; each chunk size's times are added once.
  std::set<int64_t> timed;
  for (int64_t done = 0, c = 0; done < n_prompt; done += pre.chunks[size_t(c)], ++c) {
    const int64_t chunk = pre.chunks[size_t(c)];
    const bool first = timed.insert(chunk).second;
    const GraphView g = session.graph(chunk, done);
    accumulate(pre.nodes, pre_index, g, first ? &after_prefill[chunk] : nullptr, 1.0);
    if (!f.trace.empty()) {
      // Chunks of one size share their accumulated times (the backend keeps one sum per size): each gets its share.
      std::vector<double> ns;
      for (uint64_t v : after_prefill[chunk]) ns.push_back(double(v) / chunks_of_size[chunk]);
      // Worker threads' spans are kept for the last run of each chunk size; they are drawn where that run is the
      // size's only one, so that the node slices they sit in are that run's own times, not a mean.
      trace.nodes(fmt::format("prefill chunk {} ({} tokens at {})", c, chunk, done), t0, g, ns,
                  chunks_of_size[chunk] == 1 ? session.profile_thread_spans(chunk) : std::vector<uint64_t>{},
                  session.n_threads());
    }
  }

  Phase dec{"decode", f.n_gen, {}, 0, {}};
  std::vector<uint64_t> step_prev;
  if (!f.trace.empty()) step_prev = session.profile_ns(1);
  const GraphView decode_graph = f.trace.empty() || f.n_gen == 0 ? GraphView() : session.graph(1, n_prompt);
  session.reset_achieved_sparsity();  // decode only (prefill stays dense)
  for (int64_t i = 0; i < f.n_gen; ++i) {
    t0 = std::chrono::steady_clock::now();
    std::span<const float> logits = session.decode(next);
    const auto t1 = std::chrono::steady_clock::now();
    dec.wall_s += std::chrono::duration<double>(t1 - t0).count();
    next = argmax(logits);  // outside the timed region: sampling is not part of the graph
    if (!f.trace.empty()) {
      // This step's node times: the accumulated times' growth over the step (outside the timed region).
      std::vector<uint64_t> now = session.profile_ns(1);
      std::vector<double> ns(now.size(), 0.0);
      for (size_t k = 0; k < now.size(); ++k) ns[k] = double(now[k] - (k < step_prev.size() ? step_prev[k] : 0));
      const std::string label = fmt::format("decode {} (position {})", i, n_prompt + i);
      trace.step(label, t0, t1, 1);
      trace.nodes(label, t0, decode_graph, ns, session.profile_thread_spans(1), session.n_threads());
      step_prev = std::move(now);
    }
  }
  session.set_profiling(false);
  if (f.n_gen > 0) {
    std::vector<uint64_t> ns = session.profile_ns(1);
    if (auto it = after_prefill.find(1); it != after_prefill.end())
      for (size_t i = 0; i < ns.size() && i < it->second.size(); ++i) ns[i] -= it->second[i];
    // Only attention's cost depends on the position, and linearly: the mean of the first and last step is exact.
    std::map<std::string, size_t> dec_index;
    const double half = 0.5 * double(f.n_gen);
    accumulate(dec.nodes, dec_index, session.graph(1, n_prompt), &ns, half);
    accumulate(dec.nodes, dec_index, session.graph(1, n_prompt + f.n_gen - 1), nullptr, half);
  }

  Ceilings c;
  Limits lim;
  if (f.limits) {
    std::set<std::string> dtypes;
    for (const NodeAgg& n : pre.nodes)
      if (!n.weight_dtype.empty())
        dtypes.insert(f.device == "cuda" ? n.weight_dtype : cpu_matmul_dtype(n.weight_dtype));
    CeilingOptions co;
    co.device = f.device;
    co.n_threads = session.n_threads();
    co.buffer_bytes = static_cast<uint64_t>(f.ceiling_mib) << 20;
    co.repeats = 3;
    co.gemm_dtypes.assign(dtypes.begin(), dtypes.end());
    fmt::print(stderr, "tessera: measuring ceilings (bandwidth over {}, GEMM rates)...\n",
               human_bytes(co.buffer_bytes));
    c = measure_ceilings(co);
    lim.c = &c;
  }

  nlohmann::json out = {{"model", model_label(model)},
                        {"model_path", model.path()},
                        {"device", f.device},
                        {"n_threads", session.n_threads()},
                        {"n_batch", session.n_batch()},
                        {"prefill", phase_json(pre, lim)},
                        {"ceilings", lim.c ? ceilings_json(c) : nlohmann::json(nullptr)}};
  if (f.n_gen > 0) out["decode"] = phase_json(dec, lim);
  if (!f.trace.empty()) {
    trace.write(f.trace,
                {{"model", model_label(model)},
                 {"device", f.device},
                 {"n_threads", session.n_threads()},
                 {"prompt_tokens", n_prompt},
                 {"decode_steps", f.n_gen},
                 {"note", "node slices are laid end to end from each step's start (the backends time durations)"}},
                f.device, session.n_threads());
    fmt::print(stderr, "tessera: wrote the trace to {} (open it in ui.perfetto.dev or chrome://tracing)\n", f.trace);
  }
  const std::string teal = teal_line(f.teal, session.achieved_sparsity());
  if (f.n_gen > 0 && !teal.empty()) out["decode"]["achieved_sparsity"] = session.achieved_sparsity();
  if (f.json) {
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("model {} ({}); {}, {} threads\n", model_label(model), model.path(), f.device, session.n_threads());
  if (lim.c) {
    fmt::print("limits: read bandwidth {:.2f} GB/s", c.read_gbps());
    for (const GemmCeiling& g : c.gemm)
      if (g.kernel == "tessera") fmt::print("; {} GEMM {:.1f} GFLOP/s", g.dtype, g.tflops.median * 1e3);
    if (c.fma_peak_tflops() > 0) fmt::print("; f32 FMA peak {:.1f} GFLOP/s", c.fma_peak_tflops() * 1e3);
    fmt::print("\n");
  }
  bool over = print_phase(out["prefill"], "prefill", f.all_nodes);
  if (f.n_gen > 0) over |= print_phase(out["decode"], "decode", f.all_nodes);
  if (f.n_gen > 0 && !teal.empty()) fmt::print("decode: {}\n", teal);
  if (!lim.c) fmt::print("\n% roof: measure this machine's limits with --limits\n");
  if (over)
    fmt::print(
        "\n>100 in % roof: the op ran faster than the measured memory bandwidth allows, so its data came from "
        "caches, not memory; its real roof is the cache's bandwidth\n");
  return 0;
}

const int registered = register_command(
    {"profile", "Time every node of prefill and decode; totals per op class and matmul role against the limits",
     [](CLI::App& app) -> Runner {
       auto f = std::make_shared<ProfileFlags>();
       add_model_source_flags(app, f->src);
       app.add_option("-p,--prompt", f->prompt, "Prompt text (default: a fixed English paragraph)");
       app.add_option("--prompt-tokens", f->prompt_tokens, "Use this many random token ids as the prompt instead");
       app.add_option("-n,--n-gen", f->n_gen, "Decode steps (greedy; default 32)");
       app.add_option("-t,--threads", f->threads, "Threads (default: all cores; capped to the hardware threads)");
       add_ngl_option(app, f->ngl, app.add_option("--device", f->device, "cpu (default) or cuda"));
       add_backend_flags(app, f->backend);
       add_teal_flags(app, f->teal);
       add_lora_flags(app, f->lora);
       app.add_option("-b,--batch,--batch-size", f->batch,
                      "Logical batch: prompt tokens per forward pass (default 512)");
       app.add_flag("--json", f->json, "Print one JSON object (prefill and decode: classes, matmul roles, nodes)");
       app.add_flag("--limits", f->limits,
                    "Measure this machine's limits (bandwidth over 1 GiB buffers, GEMM rates) for the % roof column; "
                    "takes seconds and 2 GiB of memory");
       app.add_flag("--no-ceilings", f->no_ceilings, "Do not measure the limits (the default; kept for scripts)");
       f->ceiling_mib_opt =
           app.add_option("--ceiling-mib", f->ceiling_mib,
                          "Buffer size of the bandwidth ceiling in MiB (default 1024); implies --limits");
       app.add_flag("--nodes", f->all_nodes, "List every node's time, not only the slowest");
       app.add_option("--trace", f->trace,
                      "Write the prefill and decode steps as a Chrome/Perfetto trace (JSON) to this file, one slice "
                      "per graph node");
       return [f] { return run(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
