// tessera bench: llama-bench-like throughput. pp<P> evaluates P random token ids on a fresh context (one forward
// pass per -b/-ub chunk, llama-bench's batch sizes); tg<N> decodes N tokens one at a time from an empty context, or
// with --parallel/-np B > 1 advances B sequences together (B tokens per step, rows named tg<N>xB, B·N tokens per run);
// with -d D, tg decodes after D tokens already in every sequence's cache (positions D .. D+N-1, rows named tg<N>@dD),
// as after a D-token prompt (the depth is prefilled once, untimed, and each repeat truncates back to it; a recurrent
// model, whose state cannot go back, evaluates it again before each run, untimed). Each test runs once to warm up, then
// -r times; rows report the median tok/s and its spread, the achieved GB/s of weight bytes and TFLOP/s, peak memory,
// and, with --limits, the measured limit next to them (1 GiB buffers: seconds and memory, so only when asked).
// --ceilings measures only the limits. On CUDA, tg decodes greedily with the argmax on the device, as a generation loop
// and the PyTorch peers do: at batch 1 each token is the previous step's argmax and the steps are chained on the device
// (Session::decode_greedy_chain: no host round trip per token; --cuda chain=0 waits for every token), batched steps
// return B ids (decode_batch_greedy); --host-logits copies every step's logits to the host instead (what decode /
// decode_batch return; B * n_vocab floats per step, random token ids). --sample measures a sampled generation loop
// instead (Session::generate_tokens with the default sampler chain; on CUDA the draw runs on the device).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>

#include "bench_util.h"
#include "command.h"
#include "gen_options.h"
#include "tessera/bench.h"
#include "tessera/error.h"
#include "tessera/random_model.h"
#include "tessera/session.h"

namespace tessera::cli {
namespace {

struct BenchFlags {
  ModelSource src;
  TealFlags teal;
  LoraFlags lora;  // --lora, --lora-merge
  int64_t n_prompt = 512;
  int64_t n_gen = 128;
  int repeats = 5;
  int threads = 0;
  std::string device = "cpu";
  NglFlag ngl;               // -ngl: llama.cpp's spelling of the device
  BackendFlags backend;      // --cuda KEY=VALUE, --cpu-isa
  int64_t n_batch = 2048;    // -b: logical batch (llama-bench's default 2048), capped by -ub
  int64_t ubatch = 512;      // -ub: physical batch; Tessera evaluates min(-b, -ub) tokens per pass
  int64_t batch = 1;         // --parallel/-np: sequences decoded together by tg
  int64_t depth = 0;         // tokens already in each sequence's cache when tg starts
  bool host_logits = false;  // CUDA tg: copy the logits to the host every step instead of the device argmax
  bool sample = false;       // tg: a sampled generation loop (Session::generate_tokens, default sampler chain)
  std::string kv_type = "f16";
  bool json = false;
  bool ceilings_only = false;
  bool no_ceilings = false;  // the default now; kept for scripts that pass it
  bool limits = false;
  int64_t ceiling_mib = 1024;
  CLI::Option* ceiling_mib_opt = nullptr;
  std::string write_model;
  bool list_archs = false;
};

// How tg picks its tokens (the table's header and the JSON rows' tg_logits).
std::string tg_mode(const BenchFlags& f) {
  const bool cuda = f.device == "cuda";
  if (f.sample) {
    bool host = false;  // --cuda sample=0 draws on the host
    for (const std::string& kv : f.backend.cuda) host = kv == "sample=0" || kv == "sample=off" || kv == "sample=false";
    const bool device = cuda && !host;
    return device ? "sampled on the device" : "sampled on the host";
  }
  return cuda && !f.host_logits ? "greedy argmax on the device" : "host logits";
}

struct Row {
  std::string test;  // "pp512", "tg128"
  int64_t n_prompt = 0, n_gen = 0;
  std::vector<double> seconds;  // per repeat
  double flops = 0;             // per run
  double weight_bytes = 0;      // per run
  uint64_t peak_host = 0;       // after this test
  int64_t batch = 1;            // sequences per decode step (tg); tokens per run = n_prompt + n_gen * batch
};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<int32_t> random_ids(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(n_vocab - 1));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = d(rng);
  return v;
}

// One warm-up run (weights paged in, plans compiled, caches warm), then `repeats` timed runs.
// `setup` (untimed) runs before each run, the warm-up's included.
std::vector<double> time_runs(int repeats, const std::function<void()>& run,
                              const std::function<void()>& setup = nullptr) {
  std::vector<double> s;
  for (int r = -1; r < repeats; ++r) {
    if (setup) setup();
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r >= 0) s.push_back(dt);
  }
  return s;
}

void validate(const BenchFlags& f) {
  check_device(f.device);
  if (f.repeats < 1 || f.repeats > 1000) throw Error(fmt::format("-r {} must be between 1 and 1000", f.repeats));
  if (f.ceiling_mib < 1) throw Error(fmt::format("--ceiling-mib {} must be positive", f.ceiling_mib));
  if (f.ceilings_only) return;
  if (f.n_prompt < 0 || f.n_gen < 0) throw Error("-p and -n must not be negative");
  if (f.n_prompt == 0 && f.n_gen == 0) throw Error("nothing to measure: -p and -n are both 0");
  if (f.n_batch < 1) throw Error(fmt::format("-b {} must be positive", f.n_batch));
  if (f.ubatch < 1) throw Error(fmt::format("-ub {} must be positive", f.ubatch));
  if (f.batch < 1 || f.batch > 1024) throw Error(fmt::format("--parallel {} must be between 1 and 1024", f.batch));
  if (f.depth < 0) throw Error(fmt::format("-d {} must not be negative", f.depth));
  if (f.depth > 0 && f.n_gen == 0) throw Error("-d sets where tg starts, but -n is 0: there is no tg test");
  if (f.sample && f.batch != 1) throw Error("--sample measures one sequence's generation loop: it needs --parallel 1");
  if (f.sample && f.host_logits)
    throw Error(
        "--sample and --host-logits exclude each other (--cuda sample=0 "
        "makes the sampled loop draw on the host)");
  if (f.sample && f.n_gen < 2) throw Error("--sample needs -n 2 or more (the first token is the prompt)");
}

Ceilings measure_limits(const BenchFlags& f, const std::vector<std::string>& dtypes) {
  CeilingOptions co;
  co.device = f.device;
  co.n_threads = f.threads;
  co.buffer_bytes = static_cast<uint64_t>(f.ceiling_mib) << 20;
  co.repeats = f.repeats;
  co.gemm_dtypes = dtypes;
  fmt::print(stderr, "tessera: measuring ceilings (bandwidth over {}, GEMM rates)...\n", human_bytes(co.buffer_bytes));
  return measure_ceilings(co);
}

int run_ceilings(const BenchFlags& f) {
  const Ceilings c = measure_limits(f, {});
  if (f.json) {
    fmt::print("{}\n", ceilings_json(c).dump(2));
  } else {
    print_ceilings(c);
  }
  return 0;
}

int run(BenchFlags& f) {
  if (f.list_archs) {
    for (const auto* presets : {&random_model_presets(), &random_model_hgrn_bit_presets()})
      for (const RandomModelPreset& p : *presets)
        fmt::print("{:<16} {:<20} layers {:>3}  width {:>5}  heads {:>3}/{:<3} ffn {:>6}  vocab {:>6}{}{}\n", p.name,
                   p.description, p.spec.n_layers, p.spec.n_embd, p.spec.n_head, p.spec.n_head_kv, p.spec.n_ff,
                   p.spec.n_vocab, p.spec.tied_output ? "  tied" : "",
                   p.spec.recurrent ? "  hgrn_bit (MLGRU, no KV cache; ternary: tq2_0 default)" : "");
    return 0;
  }
  apply_ngl(f.ngl, f.device);
  validate(f);
  f.threads = cap_threads(f.threads);
  if (f.ceiling_mib_opt->count() > 0) f.limits = true;
  if (f.ceilings_only) return run_ceilings(f);
  if (!f.write_model.empty()) {
    if (!f.src.random_weights || f.src.arch.empty())
      throw Error("--write-model writes a synthetic model: it needs --arch NAME --random-weights");
    write_random_model({f.src.arch, f.src.dtype, f.src.seed, f.src.layers, ""}, f.write_model);
    fmt::print("{}\n", f.write_model);
    return 0;
  }

  const Model model = load_model_source(f.src, false);
  if (f.src.random_weights) reset_peak_host_bytes();  // the pool of random weights is gone; it is no part of a run
  SessionOptions so;
  so.n_ctx = std::max<int64_t>(std::max(f.n_prompt, f.depth + f.n_gen), 1);
  so.n_batch = std::min(f.n_batch, f.ubatch);
  so.n_seq = f.batch;
  so.n_threads = f.threads;
  so.kv_dtype = f.kv_type;
  so.device = f.device;
  so.backend_options = backend_options(f.backend, f.device);
  apply_teal_flags(f.teal, so);
  apply_lora_flags(f.lora, so);
  Session session(model, so);
  announce_adapters(session);
  double tg_sparsity = 0;  // measured over the tg runs (prefill stays dense)
  const int64_t n_vocab = session.n_vocab();
  const WorkCost decode0 = work_cost(session.graph(1, 0));
  const uint64_t model_bytes = session.graph(1, 0).totals().weight_bytes;

  std::vector<Row> rows;
  if (f.n_prompt > 0) {
    Row r{"pp" + std::to_string(f.n_prompt), f.n_prompt, 0, {}, 0, 0, 0};
    for (int64_t done = 0; done < f.n_prompt;) {
      const int64_t chunk = std::min(session.n_batch(), f.n_prompt - done);
      const WorkCost w = work_cost(session.graph(chunk, done));
      r.flops += double(w.flops);
      r.weight_bytes += double(w.weight_bytes);
      done += chunk;
    }
    const std::vector<int32_t> ids = random_ids(f.n_prompt, n_vocab, 1234);
    fmt::print(stderr, "tessera: {} (1 warm-up + {} repeats)\n", r.test, f.repeats);
    r.seconds = time_runs(f.repeats, [&] {
      session.reset();
      session.eval(ids);
    });
    r.peak_host = peak_host_bytes();
    rows.push_back(std::move(r));
  }
  if (f.n_gen > 0) {
    const int64_t b = f.batch;
    Row r{"tg" + std::to_string(f.n_gen) + (b > 1 ? "x" + std::to_string(b) : "") +
              (f.depth > 0 ? "@d" + std::to_string(f.depth) : ""),
          0,
          f.n_gen,
          {},
          0,
          0,
          0,
          b};
    // Only attention depends on the position, and linearly: the mean of the first and last step is exact. A batched
    // step reads the weights once for all B rows.
    const WorkCost first = work_cost(session.graph(1, f.depth));
    const WorkCost last = work_cost(session.graph(1, f.depth + f.n_gen - 1));
    r.flops = double(b) * double(f.n_gen) * 0.5 * double(first.flops + last.flops);
    r.weight_bytes = double(f.n_gen) * double(decode0.weight_bytes);
    const std::vector<int32_t> ids = random_ids(f.n_gen * b, n_vocab, 4321);
    std::vector<int32_t> seqs(static_cast<size_t>(b));
    for (int64_t s = 0; s < b; ++s) seqs[static_cast<size_t>(s)] = static_cast<int32_t>(s);
    // The depth's cache rows, written once (untimed) and kept by every repeat's truncate. A recurrent model's state
    // cannot be cut back to the depth: it is cleared and the depth evaluated again before each run, untimed.
    const std::vector<int32_t> ctx = random_ids(f.depth, n_vocab, 999);
    const auto fill_depth = [&] {
      for (int64_t s = 0; s < b; ++s) session.truncate(s, 0);  // every sequence (reset() clears the first only)
      for (int64_t s = 0; s < b; ++s) session.eval_seq(s, ctx, false);
    };
    const bool refill = f.depth > 0 && model.spec().recurrent;
    if (f.depth > 0 && !refill) fill_depth();
    fmt::print(stderr, "tessera: {} (1 warm-up + {} repeats)\n", r.test, f.repeats);
    session.reset_achieved_sparsity();
    const auto setup = [&] {
      if (refill) {
        fill_depth();
      } else {
        for (int64_t s = 0; s < b; ++s) session.truncate(s, f.depth);
      }
    };
    r.seconds = time_runs(
        f.repeats,
        [&] {
          const bool greedy = f.device == "cuda" && !f.host_logits;
          if (f.sample) {  // evaluates ids[0], then n_gen - 1 sampled tokens: n_gen steps, as the greedy loop
            GenerateOptions g;
            g.max_tokens = f.n_gen - 1;
            g.ignore_eos = true;
            g.sampling.seed = 1;
            const GenerateResult res = session.generate_tokens(std::span<const int32_t>(ids.data(), 1), g);
            if (static_cast<int64_t>(res.tokens.size()) != f.n_gen - 1)
              throw Error(fmt::format("tg sampled {} of {} tokens", res.tokens.size(), f.n_gen - 1));
            return;
          }
          if (b == 1 && greedy) {  // a generation loop: each token is the previous step's argmax, chained on the device
            const int64_t done = session.decode_greedy_chain(ids[0], f.n_gen, [](int32_t) { return true; });
            if (done != f.n_gen) throw Error(fmt::format("tg decoded {} of {} tokens", done, f.n_gen));
            return;
          }
          if (b == 1) {
            for (int32_t id : ids) (void)session.decode(id);
            return;
          }
          for (int64_t i = 0; i < f.n_gen; ++i) {
            const auto step = std::span<const int32_t>(ids).subspan(static_cast<size_t>(i * b), static_cast<size_t>(b));
            if (greedy)
              session.decode_batch_greedy(step, seqs);
            else
              session.decode_batch(step, seqs);
          }
        },
        setup);
    r.peak_host = peak_host_bytes();
    tg_sparsity = session.achieved_sparsity();
    rows.push_back(std::move(r));
  }

  // After the model runs: the ceiling buffers would otherwise count in the peak memory reported above.
  Ceilings c;
  const std::string mm_dtype = decode0.matmul_dtype.empty() ? "f32" : cpu_matmul_dtype(decode0.matmul_dtype);
  if (f.limits && f.device != "cuda") c = measure_limits(f, {mm_dtype});
  const double limit_gbps = c.read_gbps(), limit_tflops = c.gemm_tflops(mm_dtype);

  const std::string date = utc_now();
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    const int64_t tokens = r.n_prompt + r.n_gen * r.batch;
    std::vector<double> tps;
    for (double s : r.seconds) tps.push_back(double(tokens) / s);
    const Stats st = summarize(tps);
    const Stats ms = summarize(r.seconds);
    const double runs_per_s = st.median / double(tokens);
    const double gbps = r.weight_bytes * runs_per_s / 1e9, tflops = r.flops * runs_per_s / 1e12;
    const bool is_pp = r.n_prompt > 0;
    const double limit = is_pp ? limit_tflops : limit_gbps;
    nlohmann::json j = {
        {"test", r.test},
        {"model", model_label(model)},
        {"model_path", model.path()},
        {"random_weights", f.src.random_weights},
        {"arch", f.src.random_weights ? f.src.arch : model.spec().architecture},
        {"weight_dtype", decode0.matmul_dtype},
        {"model_bytes", model_bytes},
        {"device", f.device},
        {"n_threads", session.n_threads()},
        {"n_batch", session.n_batch()},
        {"batch", r.batch},
        {"depth", r.n_gen > 0 ? f.depth : 0},
        {"tg_logits", tg_mode(f)},
        {"kv_type", session.kv_dtype()},
        {"n_prompt", r.n_prompt},
        {"n_gen", r.n_gen},
        {"repeats", st.n},
        {"tok_s", st.median},
        {"tok_s_stddev", st.stddev},
        {"tok_s_min", st.min},
        {"tok_s_max", st.max},
        {"samples_tok_s", tps},
        {"ms_median", ms.median * 1e3},
        {"flops_per_run", r.flops},
        {"weight_bytes_per_run", r.weight_bytes},
        {"gbps", gbps},
        {"tflops", tflops},
        {"peak_host_bytes", r.peak_host},
        {"peak_device_bytes", nullptr},
        {"limit_kind", is_pp ? "gemm" : "read_bandwidth"},
        {"limit", limit > 0 ? nlohmann::json(limit) : nlohmann::json(nullptr)},
        {"limit_unit", is_pp ? "tflops" : "gbps"},
        {"sparsity", f.teal.sparsity},
        {"achieved_sparsity", is_pp ? 0.0 : tg_sparsity},
        {"fraction_of_limit", limit > 0 ? nlohmann::json((is_pp ? tflops : gbps) / limit) : nlohmann::json(nullptr)},
        {"date", date}};
    out.push_back(std::move(j));
  }

  if (f.json) {
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("model   {} ({}), {} of weights, {} matmuls\n", model_label(model), model.path(), human_bytes(model_bytes),
             decode0.matmul_dtype);
  fmt::print("device  {}, {} threads, batch {}, parallel {}, kv {}{}; {} repeats after 1 warm-up\n\n", f.device,
             session.n_threads(), session.n_batch(), f.batch, session.kv_dtype(), ", tg: " + tg_mode(f), f.repeats);
  fmt::print("| {:<7} | {:>20} | {:>9} | {:>8} | {:>8} | {:>10} |\n", "test", "tok/s (median ± sd)", "ms/run", "GB/s",
             "TFLOP/s", "% of limit");
  fmt::print("| {:-<7} | {:->20} | {:->9} | {:->8} | {:->8} | {:->10} |\n", "", "", "", "", "", "");
  bool over = false;
  for (const nlohmann::json& j : out) {
    std::string pct = "-";
    if (!j["fraction_of_limit"].is_null()) {
      const double p = 100.0 * j["fraction_of_limit"].get<double>();
      over |= p > 100.0;
      pct = p > 100.0 ? ">100" : fmt::format("{:.1f}", p);
    }
    fmt::print("| {:<7} | {:>10.2f} ± {:<7.2f} | {:>9.1f} | {:>8.2f} | {:>8.4f} | {:>10} |\n",
               j["test"].get<std::string>(), j["tok_s"].get<double>(), j["tok_s_stddev"].get<double>(),
               j["ms_median"].get<double>(), j["gbps"].get<double>(), j["tflops"].get<double>(), pct);
  }
  uint64_t peak = 0;
  for (const Row& r : rows) peak = std::max(peak, r.peak_host);
  fmt::print("\npeak host memory {}; device memory n/a ({})\n", human_bytes(peak), f.device);
  if (const std::string t = teal_line(f.teal, tg_sparsity); !t.empty()) fmt::print("tg: {}\n", t);
  if (!f.limits && f.device != "cuda") fmt::print("% of limit: measure this machine's limits with --limits\n");
  if (f.limits && f.device == "cuda")
    fmt::print("% of limit: --limits measures the CPU's; the GPU's: `tessera bench --ceilings --device cuda`\n");
  if (over)
    fmt::print(">100% of limit: faster than the measured memory bandwidth allows, so the weights came from caches\n");
  if (f.limits && f.device != "cuda") {
    fmt::print("(measuring the limits then took the process to {}: their buffers, not the model)\n",
               human_bytes(peak_host_bytes()));
    fmt::print("limits: tg <- read bandwidth {:.2f} GB/s; pp <- tessera {} GEMM {:.1f} GFLOP/s", limit_gbps, mm_dtype,
               limit_tflops * 1e3);
    if (c.fma_peak_tflops() > 0) fmt::print(" (f32 FMA peak {:.1f} GFLOP/s)", c.fma_peak_tflops() * 1e3);
    fmt::print("\n");
  }
  return 0;
}

const int registered = register_command(
    {"bench", "Measure prefill (pp) and decode (tg) speed with GB/s, TFLOP/s and the machine's limits",
     [](CLI::App& app) -> Runner {
       auto f = std::make_shared<BenchFlags>();
       add_model_source_flags(app, f->src);
       app.add_option("-p,--n-prompt", f->n_prompt, "Prompt tokens of the pp test (0: skip it; default 512)");
       app.add_option("-n,--n-gen", f->n_gen, "Generated tokens of the tg test (0: skip it; default 128)");
       app.add_option("-r,--repeats", f->repeats, "Timed repeats of each test after one warm-up (default 5)");
       app.add_option("-t,--threads", f->threads, "Threads (default: all cores; capped to the hardware threads)");
       add_ngl_option(app, f->ngl, app.add_option("--device", f->device, "cpu (default) or cuda"));
       add_backend_flags(app, f->backend);
       app.add_option("-b,--batch-size", f->n_batch,
                      "Logical batch of pp (default 2048, as llama-bench's -b); a pass evaluates min(-b, -ub) tokens");
       app.add_option("--ub,--ubatch,--ubatch-size", f->ubatch,
                      "(-ub) Physical batch (default 512); a pass evaluates min(-b, -ub) tokens");
       app.add_option("--parallel", f->batch,
                      "(-np) Sequences decoded together by tg (default 1): rows tg<N>xB report B*N tokens/s");
       app.add_option("-d,--depth", f->depth,
                      "tg starts with this many tokens already in each sequence's cache (default 0: an empty "
                      "context, as llama-bench's tg); e.g. -d 128 -n 256 decodes positions 128..383, as after a "
                      "128-token prompt");
       app.add_option("--kv-type", f->kv_type, "KV cache type: f16 (default) or f32");
       add_teal_flags(app, f->teal);
       add_lora_flags(app, f->lora);
       app.add_flag("--host-logits", f->host_logits,
                    "CUDA tg: copy every step's logits to the host (decode / decode_batch, random token ids) "
                    "instead of taking the greedy argmax on the device (the default there, as a generation loop "
                    "does; at batch 1 the steps are chained on the device: --cuda chain=0 waits for each)");
       app.add_flag("--sample", f->sample,
                    "tg as a sampled generation loop (batch 1): evaluates one token, then samples and evaluates N-1 "
                    "more with the default sampler chain (T 0.8, top-k 40, top-p 0.95, min-p 0.05; seed 1). On CUDA "
                    "the draw runs on the device and one token comes back per step (--cuda sample=0: the "
                    "logits come back and the host draws)");
       app.add_flag("--json", f->json, "Print a JSON array of rows (test, tok_s, tok_s_stddev, gbps, tflops, ...)");
       app.add_flag("--ceilings", f->ceilings_only,
                    "Measure only this machine's limits: memory bandwidth and GEMM rate per dtype");
       app.add_flag("--limits", f->limits,
                    "Also measure this machine's limits (memory bandwidth over 1 GiB buffers, GEMM rate) and show "
                    "each row's share of them; takes seconds and 2 GiB of memory");
       app.add_flag("--no-ceilings", f->no_ceilings, "Do not measure the limits (the default; kept for scripts)");
       f->ceiling_mib_opt = app.add_option(
           "--ceiling-mib", f->ceiling_mib,
           "Buffer size of the bandwidth ceiling in MiB (default 1024; smaller ones fit in caches); implies --limits");
       app.add_option("--write-model", f->write_model,
                      "Write the synthetic model (--arch, --random-weights) to this GGUF file and exit");
       app.add_flag("--list-archs", f->list_archs, "List the synthetic model presets and exit");
       return [f] { return run(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
