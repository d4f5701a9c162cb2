// Perplexity and KL divergence as llama-perplexity computes them (include/tessera/perplexity.h has the method and the
// logits file format). The model runs through the public Session: each chunk's first half is evaluated for its cache
// only (one logits row), the second half with every row's logits, so the output projection runs for the scored half
// alone, as llama.cpp asks only those rows.
#include "tessera/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <thread>

#include "core/error.h"

namespace tessera {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

// max and log(sum exp(l - max)) of a row: expf of float differences summed in double, llama.cpp's recipe.
struct RowLse {
  float max = 0;
  int32_t argmax = 0;  // the first maximum
  double lse = 0;      // max + log(sum)
};
RowLse row_lse(std::span<const float> l) {
  RowLse r;
  r.max = l[0];
  for (size_t i = 1; i < l.size(); ++i)
    if (l[i] > r.max) r.max = l[i], r.argmax = static_cast<int32_t>(i);
  double sum = 0;
  for (const float v : l) sum += std::exp(v - r.max);
  r.lse = static_cast<double>(r.max) + std::log(sum);
  return r;
}

// The stored log-probability of one token: the same rounding on both sides of a comparison, so a model compared with
// its own logits gives exactly zero.
float logp_of(float logit, double lse) { return static_cast<float>(static_cast<double>(logit) - lse); }

// The mass outside `ids` (a sorted copy in `marks`), summed directly rather than as 1 - the top-k's (no cancellation
// when it is tiny); log of it, -inf when nothing is left.
float log_rest(std::span<const float> l, const RowLse& r, const std::vector<int32_t>& ids, std::vector<char>& marks) {
  marks.assign(l.size(), 0);
  for (const int32_t id : ids) marks[static_cast<size_t>(id)] = 1;
  double rest = 0;
  for (size_t i = 0; i < l.size(); ++i)
    if (!marks[i]) rest += std::exp(static_cast<double>(l[i]) - r.lse);
  return rest > 0 ? static_cast<float>(std::log(rest)) : -std::numeric_limits<float>::infinity();
}

// Runs f(i) for i in [0, n) on `threads` threads, each a contiguous range (the results go to per-index slots, so the
// sums over them stay in order and the run is deterministic).
template <typename F>
void parallel_rows(int64_t n, int threads, F&& f) {
  threads = std::max(1, std::min<int>(threads, static_cast<int>(n)));
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (n + threads - 1) / threads;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int64_t i = t * per; i < std::min(n, (t + 1) * per); ++i) f(i);
    });
  for (int64_t i = 0; i < std::min(n, per); ++i) f(i);
  for (auto& th : pool) th.join();
}

std::pair<double, double> mean_and_uncertainty(double sum, double sum2, int64_t count) {
  if (count < 1) return {0., 0.};
  const double f = sum / static_cast<double>(count);
  double df = sum2 / static_cast<double>(count) - f * f;
  df = df > 0 && count > 10 ? std::sqrt(df / static_cast<double>(count - 1)) : 0.;
  return {f, df};
}

double covariance(double suma, double sumb, double sumab, int64_t count) {
  if (count < 10) return 0.0;
  const double n = static_cast<double>(count);
  return (sumab / n - (suma / n) * (sumb / n)) / (n - 1);
}

// Linear interpolation between the two nearest ranks of a sorted list (llama-perplexity's percentile).
double percentile(const std::vector<float>& v, double fraction) {
  if (fraction <= 0) return v.front();
  if (fraction >= 1) return v.back();
  const float p = static_cast<float>(fraction) * static_cast<float>(v.size() - 1);
  const size_t ip = static_cast<size_t>(p);
  const float w = p - static_cast<float>(ip);
  return (1 - w) * v[ip] + w * v[std::min(ip + 1, v.size() - 1)];
}

double median(const std::vector<float>& v) {
  const size_t n = v.size();
  return n % 2 == 0 ? 0.5f * (v[n / 2] + v[n / 2 - 1]) : v[n / 2];
}

template <typename T>
void put(std::ofstream& f, const T& v) {
  f.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
bool get(std::ifstream& f, T& v) {
  return static_cast<bool>(f.read(reinterpret_cast<char*>(&v), sizeof(T)));
}

void write_header(std::ofstream& f, const LogitsHeader& h) {
  f.write(kLogitsMagic, 8);
  put(f, h.n_ctx), put(f, h.n_vocab), put(f, h.top_k), put(f, h.n_chunks);
  put(f, h.text_hash), put(f, h.tokens_hash), put(f, h.vocab_hash);
}

LogitsHeader read_header(std::ifstream& f, const std::string& path) {
  char magic[8];
  LogitsHeader h;
  if (!f.read(magic, 8) || std::memcmp(magic, kLogitsMagic, 8) != 0)
    fail("{}: not a tessera logits file (written by tessera perplexity --save-logits)", path);
  if (!get(f, h.n_ctx) || !get(f, h.n_vocab) || !get(f, h.top_k) || !get(f, h.n_chunks) || !get(f, h.text_hash) ||
      !get(f, h.tokens_hash) || !get(f, h.vocab_hash))
    fail("{}: the logits file ends inside its header", path);
  if (h.top_k == 0 || h.top_k > h.n_vocab || h.n_chunks == 0)
    fail("{}: the logits file's header is invalid (top-k {}, vocabulary {}, chunks {})", path, h.top_k, h.n_vocab,
         h.n_chunks);
  return h;
}

void write_row(std::ofstream& f, const BaseRow& r) {
  put(f, r.logp_target), put(f, r.logp_rest);
  for (size_t k = 0; k < r.ids.size(); ++k) put(f, r.ids[k]), put(f, r.logp[k]);
}

bool read_row(std::ifstream& f, BaseRow& r, uint32_t top_k, uint32_t n_vocab) {
  r.ids.resize(top_k), r.logp.resize(top_k);
  if (!get(f, r.logp_target) || !get(f, r.logp_rest)) return false;
  for (uint32_t k = 0; k < top_k; ++k) {
    if (!get(f, r.ids[k]) || !get(f, r.logp[k])) return false;
    if (r.ids[k] < 0 || static_cast<uint32_t>(r.ids[k]) >= n_vocab) return false;
  }
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double token_nll(std::span<const float> logits, int32_t target) {
  TESSERA_CHECK(!logits.empty() && target >= 0 && static_cast<size_t>(target) < logits.size(),
                "token {} is outside the vocabulary of {}", target, logits.size());
  const RowLse r = row_lse(logits);
  return r.lse - static_cast<double>(logits[static_cast<size_t>(target)]);
}

double NllStats::ppl() const { return count > 0 ? std::exp(sum / static_cast<double>(count)) : 0.0; }

double NllStats::ppl_err() const {
  if (count < 2) return 0.0;
  const double n = static_cast<double>(count);
  const double mean = sum / n;
  const double var = sum2 / n - mean * mean;
  return var > 0 ? std::sqrt(var / (n - 1)) * std::exp(mean) : 0.0;
}

int64_t perplexity_chunk_count(int64_t n_tokens, int64_t n_ctx, int64_t n_chunks) {
  const int64_t max = n_ctx > 0 ? n_tokens / n_ctx : 0;
  return n_chunks <= 0 ? max : std::min(n_chunks, max);
}

std::vector<int32_t> perplexity_chunk(std::span<const int32_t> tokens, int64_t i, int64_t n_ctx, int32_t bos) {
  TESSERA_CHECK(i >= 0 && n_ctx > 0 && static_cast<size_t>((i + 1) * n_ctx) <= tokens.size(),
                "chunk {} of {} tokens is past the {} tokens of the text", i, n_ctx, tokens.size());
  std::vector<int32_t> c(tokens.begin() + i * n_ctx, tokens.begin() + (i + 1) * n_ctx);
  if (bos >= 0) c[0] = bos;
  return c;
}

BaseRow make_base_row(std::span<const float> logits, int32_t target, int64_t top_k) {
  const int64_t n = static_cast<int64_t>(logits.size());
  TESSERA_CHECK(top_k >= 1 && top_k <= n, "top-k {} is outside [1, {}]", top_k, n);
  TESSERA_CHECK(target >= 0 && target < n, "token {} is outside the vocabulary of {}", target, n);
  const RowLse r = row_lse(logits);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  const auto before = [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  };
  std::nth_element(idx.begin(), idx.begin() + (top_k - 1), idx.end(), before);
  std::sort(idx.begin(), idx.begin() + top_k, before);
  BaseRow b;
  b.ids.assign(idx.begin(), idx.begin() + top_k);
  b.logp.resize(static_cast<size_t>(top_k));
  for (int64_t k = 0; k < top_k; ++k)
    b.logp[static_cast<size_t>(k)] = logp_of(logits[static_cast<size_t>(b.ids[k])], r.lse);
  b.logp_target = logp_of(logits[static_cast<size_t>(target)], r.lse);
  std::vector<char> marks;
  b.logp_rest = log_rest(logits, r, b.ids, marks);
  return b;
}

KlRow kl_row(std::span<const float> logits, int32_t target, const BaseRow& base) {
  TESSERA_CHECK(target >= 0 && static_cast<size_t>(target) < logits.size(), "token {} is outside the vocabulary of {}",
                target, logits.size());
  const RowLse r = row_lse(logits);
  KlRow k;
  const float lq_target = logp_of(logits[static_cast<size_t>(target)], r.lse);
  k.nll =
      r.lse - static_cast<double>(logits[static_cast<size_t>(target)]);  // as token_nll: the same PPL as a plain run
  k.nll_base = -static_cast<double>(base.logp_target);
  k.p_diff = std::exp(static_cast<double>(lq_target)) - std::exp(static_cast<double>(base.logp_target));
  k.same_top = !base.ids.empty() && r.argmax == base.ids[0];
  double kld = 0;
  for (size_t i = 0; i < base.ids.size(); ++i) {
    const double lp = base.logp[i];
    const double lq = logp_of(logits[static_cast<size_t>(base.ids[i])], r.lse);
    kld += std::exp(lp) * (lp - lq);
  }
  if (std::isfinite(base.logp_rest)) {
    std::vector<char> marks;
    const double lr_q = log_rest(logits, r, base.ids, marks);
    const double lr_p = base.logp_rest;
    // Q may leave nothing outside the base's top-k where P leaves some mass: the term is then unbounded; the
    // smallest positive double stands in for r_q, so the row reports a large but finite divergence.
    kld += std::exp(lr_p) * (lr_p - (std::isfinite(lr_q) ? lr_q : std::log(std::numeric_limits<double>::denorm_min())));
  }
  k.kld = kld;
  return k;
}

void KlStats::add(const KlRow& r) {
  sum_nll += r.nll, sum_nll2 += r.nll * r.nll;
  sum_nll_base += r.nll_base, sum_nll_base2 += r.nll_base * r.nll_base;
  sum_nll_nll_base += r.nll * r.nll_base;
  sum_kld += r.kld, sum_kld2 += r.kld * r.kld;
  sum_p_diff += r.p_diff;
  const double d2 = r.p_diff * r.p_diff;
  sum_p_diff2 += d2, sum_p_diff4 += d2 * d2;
  max_p_diff = std::max(max_p_diff, std::fabs(r.p_diff));
  n_same_top += r.same_top ? 1 : 0;
  ++count;
  kld_values.push_back(static_cast<float>(r.kld));
  p_diff_values.push_back(static_cast<float>(r.p_diff));
}

KlSummary summarize(const KlStats& s) {
  KlSummary o;
  o.count = s.count;
  if (s.count == 0) return o;
  const auto lp = mean_and_uncertainty(s.sum_nll, s.sum_nll2, s.count);
  o.ppl = std::exp(lp.first), o.ppl_err = o.ppl * lp.second;
  const auto lb = mean_and_uncertainty(s.sum_nll_base, s.sum_nll_base2, s.count);
  o.ppl_base = std::exp(lb.first), o.ppl_base_err = o.ppl_base * lb.second;
  const double cov = covariance(s.sum_nll, s.sum_nll_base, s.sum_nll_nll_base, s.count);
  o.ln_ppl_ratio = lp.first - lb.first;
  // Identical runs make the variance below exactly 0 in theory and slightly negative in rounding.
  o.ln_ppl_ratio_err = std::sqrt(std::max(0.0, lp.second * lp.second + lb.second * lb.second - 2.0 * cov));
  const auto kl = mean_and_uncertainty(s.sum_kld, s.sum_kld2, s.count);
  o.kld = kl.first, o.kld_err = kl.second;
  std::vector<float> kv = s.kld_values, pv = s.p_diff_values;
  std::sort(kv.begin(), kv.end());
  std::sort(pv.begin(), pv.end());
  o.kld_max = kv.back(), o.kld_min = kv.front(), o.kld_median = median(kv);
  o.kld_p999 = percentile(kv, 0.999), o.kld_p99 = percentile(kv, 0.99), o.kld_p95 = percentile(kv, 0.95);
  o.kld_p90 = percentile(kv, 0.90), o.kld_p10 = percentile(kv, 0.10), o.kld_p5 = percentile(kv, 0.05);
  o.kld_p1 = percentile(kv, 0.01), o.kld_p01 = percentile(kv, 0.001);
  const auto pd = mean_and_uncertainty(s.sum_p_diff, s.sum_p_diff2, s.count);
  o.p_diff_mean = pd.first, o.p_diff_mean_err = pd.second;
  o.p_diff_max = pv.back(), o.p_diff_min = pv.front();
  const auto mse = mean_and_uncertainty(s.sum_p_diff2, s.sum_p_diff4, s.count);
  o.p_diff_rms = std::sqrt(mse.first);
  o.p_diff_rms_err = o.p_diff_rms > 0 ? 0.5 / o.p_diff_rms * mse.second : 0.0;
  const double n = static_cast<double>(s.count);
  o.same_top = static_cast<double>(s.n_same_top) / n;
  o.same_top_err = s.count > 1 ? std::sqrt(o.same_top * (1.0 - o.same_top) / (n - 1)) : 0.0;
  return o;
}

void check_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    size_t len = 0;
    uint32_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (no overlongs, surrogates, > U+10FFFF)
    if (c < 0x80)
      len = 1;
    else if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c == 0xE0)
      len = 3, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
      len = 3;
    else if (c == 0xED)
      len = 3, hi = 0x9F;
    else if (c == 0xF0)
      len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
      len = 4;
    else if (c == 0xF4)
      len = 4, hi = 0x8F;
    else
      fail("the text is not valid UTF-8: byte {} (0x{:02x}) starts no character", i, c);
    if (i + len > n) fail("the text is not valid UTF-8: the character at byte {} is cut off by the end", i);
    for (size_t k = 1; k < len; ++k) {
      const unsigned char b = s[i + k];
      const uint32_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (b < l || b > h) fail("the text is not valid UTF-8: the character at byte {} is malformed", i);
    }
    i += len;
  }
}

namespace {

// The run over tokenized input (perplexity and perplexity_tokens): `h` holds the text's and vocabulary's hashes, bos
// the id that starts each chunk (-1: the tokens as they are).
PerplexityResult run_chunks(Session& session, const std::vector<int32_t>& tokens, LogitsHeader h, int32_t bos,
                            PerplexityResult res, const PerplexityOptions& options,
                            const std::function<bool(const PerplexityChunk&)>& on_chunk) {
  const int64_t n_ctx = res.n_ctx;
  res.n_tokens = static_cast<int64_t>(tokens.size());
  TESSERA_CHECK(res.n_tokens >= 2 * n_ctx,
                "the text has {} tokens, but perplexity at a context of {} needs at least {} (2 x the context): give a "
                "longer text or a smaller -c",
                res.n_tokens, n_ctx, 2 * n_ctx);
  const int64_t n_vocab = session.n_vocab();
  const int64_t first = n_ctx / 2;
  const int64_t n_scored = n_ctx - first - 1;  // rows first .. n_ctx-2 of each chunk
  int64_t n_chunks = perplexity_chunk_count(res.n_tokens, n_ctx, options.n_chunks);
  h.n_ctx = static_cast<uint32_t>(n_ctx);
  h.n_vocab = static_cast<uint32_t>(n_vocab);
  const auto tokens_hash = [&](int64_t chunks) {
    return fnv1a(kFnvOffset, tokens.data(), static_cast<size_t>(chunks * n_ctx) * sizeof(int32_t));
  };

  std::ifstream base_in;
  std::ofstream save_out;
  LogitsHeader base;
  if (!options.kl_base.empty()) {
    const std::string& p = options.kl_base;
    base_in.open(p, std::ios::binary);
    if (!base_in) fail("{}: cannot open the base logits file", p);
    base = read_header(base_in, p);
    if (base.n_ctx != h.n_ctx)
      fail("{}: the base was computed at a context of {}, this run's is {} (use -c {})", p, base.n_ctx, h.n_ctx,
           base.n_ctx);
    if (base.n_vocab != h.n_vocab || base.vocab_hash != h.vocab_hash)
      fail("{}: the base was computed with another vocabulary ({} tokens; this model has {})", p, base.n_vocab,
           h.n_vocab);
    if (base.text_hash != h.text_hash) fail("{}: the base was computed on another text", p);
    if (options.n_chunks > 0 && options.n_chunks != static_cast<int64_t>(base.n_chunks))
      fail("{}: the base holds {} chunks, not the {} asked for (leave out --chunks to use the base's)", p,
           base.n_chunks, options.n_chunks);
    if (static_cast<int64_t>(base.n_chunks) > perplexity_chunk_count(res.n_tokens, n_ctx, 0))
      fail("{}: the base holds {} chunks, more than this text has", p, base.n_chunks);
    n_chunks = base.n_chunks;
    if (base.tokens_hash != tokens_hash(n_chunks))
      fail("{}: the base was computed on other tokens of this text (another tokenizer)", p);
  }
  if (!options.save_logits.empty()) {
    save_out.open(options.save_logits, std::ios::binary | std::ios::trunc);
    if (!save_out) fail("{}: cannot create the logits file", options.save_logits);
    h.top_k = static_cast<uint32_t>(std::clamp<int64_t>(options.top_k, 1, n_vocab));
    h.n_chunks = static_cast<uint32_t>(n_chunks);
    h.tokens_hash = tokens_hash(n_chunks);
    write_header(save_out, h);
  }
  res.n_chunks_planned = n_chunks;
  res.has_kl = base_in.is_open();

  // Plain perplexity on a backend that reduces rows where it computes them (CUDA) scores there; KL and the logits file
  // need whole rows on the host.
  const bool device_scores = session.scores_on_device() && !base_in.is_open() && !save_out.is_open();
  KlStats kl;
  std::vector<double> nll(static_cast<size_t>(n_scored));
  std::vector<BaseRow> rows(static_cast<size_t>(n_scored));
  std::vector<KlRow> kl_rows(static_cast<size_t>(n_scored));
  const int threads = session.n_threads() > 0 ? session.n_threads() : 1;
  const auto t_eval = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n_chunks; ++c) {
    const auto t_chunk = std::chrono::steady_clock::now();
    const std::vector<int32_t> chunk = perplexity_chunk(tokens, c, n_ctx, bos);
    const std::span<const int32_t> ids(chunk);
    session.reset();
    const int32_t* targets = tokens.data() + c * n_ctx + first + 1;
    if (device_scores) {
      // The chunk in one pass as llama-perplexity evaluates it (the first half's rows unscored: target -1; the last
      // token predicts nothing scored), each row reduced where its logits are: [n_ctx, n_vocab] never reaches the host.
      const auto t_score = std::chrono::steady_clock::now();
      std::vector<int32_t> want(static_cast<size_t>(n_ctx - 1), -1);
      std::copy(targets, targets + n_scored, want.begin() + first);
      const std::vector<double> lp = session.eval_target_logprobs(ids.first(static_cast<size_t>(n_ctx - 1)), want);
      for (int64_t r = first; r < n_ctx - 1; ++r) res.nll.add(-lp[static_cast<size_t>(r)]);
      res.score_seconds += seconds_since(t_score);
    } else {
      session.eval(ids.first(static_cast<size_t>(first)));
      // [n_ctx - first, n_vocab]: row r holds the logits at position first + r, which predict token first + r + 1.
      const std::vector<float> logits = session.eval_all_logits(ids.subspan(static_cast<size_t>(first)));
      const auto row = [&](int64_t r) {
        return std::span<const float>(logits.data() + r * n_vocab, static_cast<size_t>(n_vocab));
      };
      const auto t_score = std::chrono::steady_clock::now();
      if (base_in.is_open())
        for (int64_t r = 0; r < n_scored; ++r)
          if (!read_row(base_in, rows[static_cast<size_t>(r)], base.top_k, base.n_vocab))
            fail("{}: the base logits file ends or is corrupt in chunk {}", options.kl_base, c + 1);
      parallel_rows(n_scored, threads, [&](int64_t r) {
        const size_t i = static_cast<size_t>(r);
        if (base_in.is_open()) {
          kl_rows[i] = kl_row(row(r), targets[r], rows[i]);
          nll[i] = kl_rows[i].nll;
        } else {
          nll[i] = token_nll(row(r), targets[r]);
          if (save_out.is_open()) rows[i] = make_base_row(row(r), targets[r], h.top_k);
        }
      });
      for (int64_t r = 0; r < n_scored; ++r) {
        res.nll.add(nll[static_cast<size_t>(r)]);
        if (base_in.is_open()) kl.add(kl_rows[static_cast<size_t>(r)]);
        if (save_out.is_open()) write_row(save_out, rows[static_cast<size_t>(r)]);
      }
      if (save_out.is_open() && !save_out) fail("{}: writing the logits failed (disk full?)", options.save_logits);
      res.score_seconds += seconds_since(t_score);
    }
    res.n_chunks = c + 1;
    if (c == 0) res.first_chunk_seconds = seconds_since(t_chunk);
    res.running.push_back(res.nll.ppl());
    if (on_chunk) {
      PerplexityChunk pc;
      pc.index = c, pc.n_chunks = n_chunks, pc.seconds = seconds_since(t_chunk), pc.nll = res.nll;
      pc.kl = base_in.is_open() ? &kl : nullptr;
      if (!on_chunk(pc)) {
        res.interrupted = c + 1 < n_chunks;
        break;
      }
    }
  }
  res.eval_seconds = seconds_since(t_eval);
  res.evaluated_tokens = res.n_chunks * n_ctx;
  res.ppl = res.nll.ppl();
  res.ppl_err = res.nll.ppl_err();
  if (res.has_kl) res.kl = summarize(kl);
  if (save_out.is_open() && res.interrupted) {
    // A base must hold the chunks its header promises: rewrite the count to those written.
    save_out.seekp(8 + 3 * sizeof(uint32_t));
    const uint32_t done = static_cast<uint32_t>(res.n_chunks);
    put(save_out, done);
    save_out.seekp(8 + 4 * sizeof(uint32_t) + sizeof(uint64_t));
    put(save_out, tokens_hash(res.n_chunks));
  }
  if (save_out.is_open()) {
    save_out.close();
    if (!save_out) fail("{}: writing the logits failed (disk full?)", options.save_logits);
  }
  return res;
}

void check_common(const Session& session, const PerplexityOptions& options) {
  TESSERA_CHECK(options.save_logits.empty() || options.kl_base.empty(),
                "give either --save-logits (a reference run) or --kl-base (a compared run), not both");
  TESSERA_CHECK(session.n_ctx() >= 4, "perplexity needs a context of at least 4 tokens, not {}", session.n_ctx());
}

}  // namespace

PerplexityResult perplexity(Session& session, std::string_view text, const PerplexityOptions& options,
                            const std::function<bool(const PerplexityChunk&)>& on_chunk) {
  check_utf8(text);
  TESSERA_CHECK(!text.empty(), "the text is empty: perplexity needs at least 2 x the context in tokens");
  check_common(session, options);
  const Tokenizer& tok = session.model().tokenizer();
  PerplexityResult res;
  res.n_ctx = session.n_ctx();
  const auto t_tok = std::chrono::steady_clock::now();
  const std::vector<int32_t> tokens = tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
  res.tokenize_seconds = seconds_since(t_tok);
  LogitsHeader h;
  h.text_hash = fnv1a(kFnvOffset, text.data(), text.size());
  h.vocab_hash = kFnvOffset;
  for (int32_t i = 0; i < tok.n_vocab(); ++i) {
    const std::string& t = tok.token_text(i);
    h.vocab_hash = fnv1a(h.vocab_hash, t.data(), t.size() + 1);  // with its terminating 0: "ab","c" != "a","bc"
  }
  return run_chunks(session, tokens, h, tok.add_bos() ? tok.bos_id() : -1, res, options, on_chunk);
}

PerplexityResult perplexity_tokens(Session& session, std::span<const int32_t> tokens, const PerplexityOptions& options,
                                   const std::function<bool(const PerplexityChunk&)>& on_chunk) {
  check_common(session, options);
  PerplexityResult res;
  res.n_ctx = session.n_ctx();
  LogitsHeader h;
  // The "text" is the ids themselves; the vocabulary is known only by its size.
  h.text_hash = fnv1a(kFnvOffset, tokens.data(), tokens.size_bytes());
  const uint64_t v = static_cast<uint64_t>(session.n_vocab());
  h.vocab_hash = fnv1a(kFnvOffset, &v, sizeof(v));
  return run_chunks(session, std::vector<int32_t>(tokens.begin(), tokens.end()), h, -1, res, options, on_chunk);
}

}  // namespace tessera
