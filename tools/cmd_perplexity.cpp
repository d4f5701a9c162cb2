// tessera perplexity: perplexity of a model on a text and KL divergence from a reference run, computed as
// llama.cpp's llama-perplexity computes them (include/tessera/perplexity.h has the method; docs/QUALITY.md the
// numbers).
//
//   tessera perplexity -f kjv.txt -c 512 --chunks 40                          # [1]12.3,[2]... PPL = X +/- err
//   tessera perplexity -m q8_0.gguf -f kjv.txt -c 512 --save-logits q8.tplg   # a reference run
//   tessera perplexity -f kjv.txt -c 512 --kl-base q8.tplg                    # KL divergence from it
//
// The running estimate per chunk goes to stdout as llama-perplexity prints it; progress and the ETA go to stderr.
// Ctrl-C stops after the chunk in flight and prints the estimate so far (exit status 130; a second Ctrl-C ends it
// at once).
#include <fmt/core.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "bench_util.h"
#include "command.h"
#include "gen_options.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/perplexity.h"
#include "tessera/session.h"

namespace tessera::cli {
namespace {

struct PplFlags {
  ModelSource src;
  std::string text_path;
  int64_t random_tokens = 0;  // > 0: score this many seeded random ids instead of a text (throughput)
  int64_t n_ctx = 512;
  int64_t n_batch = 0;  // 0: the context (one forward pass per half chunk)
  int64_t n_chunks = -1;
  int n_threads = 0;
  std::string device = "cpu";
  NglFlag ngl;
  BackendFlags backend;
  std::string kv_type;
  bool reference = false;
  bool json = false;
  TealFlags teal;
  LoraFlags lora;  // --lora, --lora-merge
  std::string save_logits;
  std::string kl_base;
  int64_t top_k = 1024;
};

std::atomic<bool> g_stop{false};

extern "C" void on_sigint(int) {
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// The text as llama-perplexity's -f reads it: every byte, less one final newline.
std::string read_text(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(fmt::format("{}: is a directory, not a text file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open the text file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(fmt::format("{}: cannot read the text file", path));
  std::string text = ss.str();
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

std::string clock_text(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02}", t / 60, t % 60);
}

nlohmann::json kl_json(const KlSummary& k) {
  return {{"positions", k.count},
          {"ppl", k.ppl},
          {"ppl_err", k.ppl_err},
          {"ppl_base", k.ppl_base},
          {"ppl_base_err", k.ppl_base_err},
          {"ln_ppl_ratio", k.ln_ppl_ratio},
          {"ln_ppl_ratio_err", k.ln_ppl_ratio_err},
          {"kld_mean", k.kld},
          {"kld_err", k.kld_err},
          {"kld_max", k.kld_max},
          {"kld_p99_9", k.kld_p999},
          {"kld_p99", k.kld_p99},
          {"kld_p95", k.kld_p95},
          {"kld_p90", k.kld_p90},
          {"kld_median", k.kld_median},
          {"kld_p10", k.kld_p10},
          {"kld_p5", k.kld_p5},
          {"kld_p1", k.kld_p1},
          {"kld_p0_1", k.kld_p01},
          {"kld_min", k.kld_min},
          {"dp_mean", k.p_diff_mean},
          {"dp_mean_err", k.p_diff_mean_err},
          {"dp_rms", k.p_diff_rms},
          {"dp_rms_err", k.p_diff_rms_err},
          {"dp_max", k.p_diff_max},
          {"dp_min", k.p_diff_min},
          {"same_top", k.same_top},
          {"same_top_err", k.same_top_err}};
}

void print_kl(const KlSummary& k) {
  fmt::print("\n====== Perplexity statistics ======\n");
  fmt::print("Mean PPL(Q)                   : {:10.6f} ± {:10.6f}\n", k.ppl, k.ppl_err);
  fmt::print("Mean PPL(base)                : {:10.6f} ± {:10.6f}\n", k.ppl_base, k.ppl_base_err);
  fmt::print("Mean ln(PPL(Q)/PPL(base))     : {:10.6f} ± {:10.6f}\n", k.ln_ppl_ratio, k.ln_ppl_ratio_err);
  fmt::print("\n====== KL divergence statistics ======\n");
  fmt::print("Mean    KLD: {:10.6f} ± {:10.6f}\n", k.kld, k.kld_err);
  fmt::print("Maximum KLD: {:10.6f}\n", k.kld_max);
  fmt::print("99.9%   KLD: {:10.6f}\n", k.kld_p999);
  fmt::print("99.0%   KLD: {:10.6f}\n", k.kld_p99);
  fmt::print("95.0%   KLD: {:10.6f}\n", k.kld_p95);
  fmt::print("90.0%   KLD: {:10.6f}\n", k.kld_p90);
  fmt::print("Median  KLD: {:10.6f}\n", k.kld_median);
  fmt::print("10.0%   KLD: {:10.6f}\n", k.kld_p10);
  fmt::print(" 5.0%   KLD: {:10.6f}\n", k.kld_p5);
  fmt::print(" 1.0%   KLD: {:10.6f}\n", k.kld_p1);
  fmt::print(" 0.1%   KLD: {:10.6f}\n", k.kld_p01);
  fmt::print("Minimum KLD: {:10.6f}\n", k.kld_min);
  fmt::print("\n====== Token probability statistics ======\n");
  fmt::print("Mean    Δp: {:6.3f} ± {:5.3f} %\n", 100 * k.p_diff_mean, 100 * k.p_diff_mean_err);
  fmt::print("Maximum Δp: {:6.3f}%\n", 100 * k.p_diff_max);
  fmt::print("Minimum Δp: {:6.3f}%\n", 100 * k.p_diff_min);
  fmt::print("RMS Δp    : {:6.3f} ± {:5.3f} %\n", 100 * k.p_diff_rms, 100 * k.p_diff_rms_err);
  fmt::print("Same top p: {:6.3f} ± {:5.3f} %\n", 100 * k.same_top, 100 * k.same_top_err);
}

int run(PplFlags& f) {
  apply_ngl(f.ngl, f.device);
  if (f.text_path.empty() && f.random_tokens == 0)
    throw Error("give the text to score with -f FILE (or --random-tokens N to time a synthetic model)");
  if (!f.text_path.empty() && f.random_tokens != 0) throw Error("give either -f FILE or --random-tokens N, not both");
  if (f.random_tokens < 0) throw Error(fmt::format("--random-tokens {} must be positive", f.random_tokens));
  if (f.n_ctx < 4) throw Error(fmt::format("-c {}: perplexity needs a context of at least 4 tokens", f.n_ctx));
  if (f.top_k < 1) throw Error(fmt::format("--kl-top-k {}: must be at least 1", f.top_k));
  const std::string text = f.text_path.empty() ? std::string() : read_text(f.text_path);
  check_utf8(text);  // before the model loads: a bad file fails at once

  Model model = load_model_source(f.src, f.random_tokens == 0);
  SessionOptions so;
  so.device = f.device;
  so.backend_options = backend_options(f.backend, f.device);
  so.n_threads = cap_threads(f.n_threads);
  so.reference = f.reference;
  so.kv_dtype = f.kv_type;
  so.n_ctx = f.n_ctx;
  so.n_batch = f.n_batch > 0 ? std::min(f.n_batch, f.n_ctx) : f.n_ctx;
  apply_teal_flags(f.teal, so);
  apply_lora_flags(f.lora, so);
  so.sparsify_prefill = true;  // every scored position sparsified as decode would see it (docs/TEAL.md)
  Session session(model, so);
  announce_adapters(session);

  PerplexityOptions po;
  po.n_chunks = f.n_chunks;
  po.save_logits = f.save_logits;
  po.kl_base = f.kl_base;
  po.top_k = f.top_k;

  // The running estimate goes to stdout as llama-perplexity prints it ([1]x,[2]y,...); a progress line with the ETA
  // goes to stderr, rewritten in place where stderr is a terminal that stdout does not share.
  const bool progress_line = isatty(STDERR_FILENO) && (f.json || !isatty(STDOUT_FILENO));
  double total_s = 0;
  g_stop.store(false);
  std::signal(SIGINT, on_sigint);
  const auto on_chunk = [&](const PerplexityChunk& c) {
    total_s += c.seconds;
    const double eta = total_s / static_cast<double>(c.index + 1) * static_cast<double>(c.n_chunks - c.index - 1);
    if (c.index == 0)
      fmt::print(stderr, "perplexity: {:.2f} seconds per chunk - ETA {} for {}\n", c.seconds,
                 clock_text(eta + c.seconds), count_noun(c.n_chunks, "chunk"));
    if (!f.json) {
      fmt::print("[{}]{:.4f},", c.index + 1, c.nll.ppl());
      std::fflush(stdout);
    }
    if (progress_line)
      fmt::print(stderr, "\rperplexity: chunk {}/{}, {:.2f} s/chunk, ETA {}   ", c.index + 1, c.n_chunks,
                 total_s / static_cast<double>(c.index + 1), clock_text(eta));
    return !g_stop.load();
  };
  PerplexityResult r;
  try {
    if (f.random_tokens > 0) {
      // Seeded ids over the whole vocabulary: the PPL of random ids means nothing, the tokens/s is the point.
      std::mt19937_64 rng(f.src.seed);
      std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(session.n_vocab() - 1));
      std::vector<int32_t> ids(static_cast<size_t>(f.random_tokens));
      for (int32_t& id : ids) id = d(rng);
      r = perplexity_tokens(session, ids, po, on_chunk);
    } else {
      r = perplexity(session, text, po, on_chunk);
    }
  } catch (...) {
    std::signal(SIGINT, SIG_DFL);
    throw;
  }
  std::signal(SIGINT, SIG_DFL);
  if (progress_line) fmt::print(stderr, "\n");
  const double tps = r.eval_seconds > 0 ? static_cast<double>(r.evaluated_tokens) / r.eval_seconds : 0.0;
  // Past the first chunk, which also builds the backend's plans: the rate a long text runs at.
  const double steady_s = r.eval_seconds - r.first_chunk_seconds;
  const double tps_steady = r.n_chunks > 1 && steady_s > 0
                                ? static_cast<double>(r.evaluated_tokens / r.n_chunks * (r.n_chunks - 1)) / steady_s
                                : tps;

  if (f.json) {
    nlohmann::json j = {{"model", f.src.random_weights ? model_label(model) : model.path()},
                        {"text", f.random_tokens > 0 ? fmt::format("{} random ids", f.random_tokens) : f.text_path},
                        {"n_tokens", r.n_tokens},
                        {"n_ctx", r.n_ctx},
                        {"n_chunks", r.n_chunks},
                        {"n_chunks_planned", r.n_chunks_planned},
                        {"interrupted", r.interrupted},
                        {"device", f.device},
                        {"ppl", r.ppl},
                        {"ppl_err", r.ppl_err},
                        {"running", r.running},
                        {"scored_tokens", r.nll.count},
                        {"eval_seconds", r.eval_seconds},
                        {"score_seconds", r.score_seconds},
                        {"tokenize_seconds", r.tokenize_seconds},
                        {"tokens_per_second", tps},
                        {"tokens_per_second_after_first_chunk", tps_steady},
                        {"first_chunk_seconds", r.first_chunk_seconds}};
    if (r.has_kl) j["kl"] = kl_json(r.kl);
    if (!f.save_logits.empty()) j["saved_logits"] = f.save_logits;
    if (f.teal.sparsity > 0 || !f.teal.teal.empty()) j["achieved_sparsity"] = session.achieved_sparsity();
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("\n");
    if (r.interrupted)
      fmt::print("Interrupted after {} of {}: estimate so far\n", count_noun(r.n_chunks, "chunk"), r.n_chunks_planned);
    fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl, r.ppl_err);
    if (r.has_kl) {
      if (r.kl.count >= 100)
        print_kl(r.kl);
      else  // llama-perplexity prints no statistics over so few positions either
        fmt::print("(KL statistics need at least 100 scored positions; {} so far)\n", r.kl.count);
    }
  }
  std::fflush(stdout);  // the result before the summary line, where both go to one file
  fmt::print(stderr,
             "perplexity: {} tokens ({}) in {:.2f} s, {:.1f} tokens/s on {} ({:.1f} after the first chunk; scoring "
             "{:.2f} s; tokenizing {} tokens: {:.2f} s)\n",
             r.evaluated_tokens, count_noun(r.n_chunks, "chunk"), r.eval_seconds, tps, f.device, tps_steady,
             r.score_seconds, r.n_tokens, r.tokenize_seconds);
  if (!f.save_logits.empty()) fmt::print(stderr, "perplexity: base logits written to {}\n", f.save_logits);
  if (const std::string t = teal_line(f.teal, session.achieved_sparsity()); !t.empty())
    fmt::print(stderr, "perplexity: {}\n", t);
  return r.interrupted ? 130 : 0;
}

const int registered = register_command(
    {"perplexity", "Perplexity on a text and KL divergence from a reference run, as llama-perplexity computes them",
     [](CLI::App& app) -> Runner {
       auto f = std::make_shared<PplFlags>();
       add_model_source_flags(app, f->src);
       app.add_option("-f,--file", f->text_path, "UTF-8 text to score (scripts/fetch_eval_text.sh fetches the KJV)");
       app.add_option("--random-tokens", f->random_tokens,
                      "Score this many seeded random token ids instead of a text (with --random-weights: throughput "
                      "of a synthetic model; its PPL means nothing)");
       app.add_option("-c,--ctx-size", f->n_ctx,
                      "Chunk length in tokens; the second half of each is scored (default 512)");
       app.add_option("-b,--batch-size,--ub,--ubatch,--ubatch-size", f->n_batch,
                      "Tokens per forward pass (default: the context)");
       app.add_option("--chunks", f->n_chunks, "Score at most this many chunks (default: all)");
       app.add_option("-t,--threads", f->n_threads, "CPU threads (default: one per hardware thread)");
       add_ngl_option(app, f->ngl, app.add_option("--device", f->device, "cpu (default) or cuda"));
       add_backend_flags(app, f->backend);
       app.add_option("--kv-type", f->kv_type, "KV cache type: f16 (default) or f32");
       app.add_flag("--reference", f->reference, "CPU f32 reference path (scalar kernels, f32 weights and cache)");
       app.add_option("--save-logits", f->save_logits,
                      "Write the base for KL divergence: per scored token the top-k log-probs (a reference run)");
       app.add_option("--kl-base", f->kl_base, "Report KL divergence from a base written by --save-logits");
       app.add_option("--kl-top-k", f->top_k,
                      "Tokens per position the base keeps (default 1024: KL within 1% of whole rows, docs/QUALITY.md)");
       app.add_flag("--json", f->json, "Print the result as JSON on stdout");
       add_teal_flags(app, f->teal);
       add_lora_flags(app, f->lora);
       return [f] { return run(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
