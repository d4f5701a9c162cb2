#include "gen_options.h"

#include <fmt/core.h>

#include "command.h"
#include "tessera/error.h"

namespace tessera::cli {

void add_gen_flags(CLI::App& app, GenFlags& f) {
  add_model_option(app, f.model);
  app.add_option("-c,--ctx", f.session.n_ctx, "Context size in tokens (default: the model's trained context)");
  app.add_option("-b,--batch", f.session.n_batch, "Prompt tokens per forward pass (default 512)");
  app.add_option("-t,--threads", f.session.n_threads, "Threads (default: all cores)");
  app.add_flag("--reference", f.session.reference,
               "Run the scalar f32 reference kernels (slow; for checking against other implementations)");
  app.add_option("--kv-type", f.session.kv_dtype, "KV cache type: f16 (default) or f32");
  app.add_option("--device", f.session.device, "cpu (default) or cuda (decode on the GPU, prompts token by token)");
  app.add_option("-n,--n-predict", f.gen.max_tokens, "Tokens to generate, -1 for no limit (default 256)");
  app.add_option("--temp", f.gen.sampling.temperature, "Temperature; 0 is greedy (default 0.8)");
  app.add_option("--top-k", f.gen.sampling.top_k, "Top-k, 0 = off (default 40)");
  app.add_option("--top-p", f.gen.sampling.top_p, "Top-p, 1 = off (default 0.95)");
  app.add_option("--min-p", f.gen.sampling.min_p, "Min-p, 0 = off (default 0.05)");
  app.add_option("--repeat-penalty", f.gen.sampling.repeat_penalty, "Repetition penalty, 1 = off (default 1)");
  app.add_option("--repeat-last-n", f.gen.sampling.penalty_last_n,
                 "Tokens the penalties look back over, -1 = whole context (default 64)");
  app.add_option("--frequency-penalty", f.gen.sampling.frequency_penalty, "Frequency penalty (default 0)");
  app.add_option("--presence-penalty", f.gen.sampling.presence_penalty, "Presence penalty (default 0)");
  app.add_option("-s,--seed", f.seed, "Random seed (default: random; the seed used is reported with --json)");
  app.add_option("--stop", f.gen.stop, "Stop when the text contains this string (repeatable)");
  app.add_flag("--ignore-eos", f.gen.ignore_eos, "Keep generating past end-of-generation tokens");
  app.add_option("--chat-template", f.chat_template,
                 "Chat template family instead of the model's own (chatml, llama3, llama2, mistral, gemma, phi3)");
  app.add_option("--system", f.system, "System prompt for the chat template");
}

void finish_gen_flags(GenFlags& f) {
  if (f.seed < -1) throw Error(fmt::format("seed {} must be -1 (random) or a non-negative integer", f.seed));
  f.gen.sampling.seed = f.seed < 0 ? kRandomSeed : static_cast<uint64_t>(f.seed);
  if (f.gen.sampling.temperature < 0)
    throw Error(fmt::format("temperature {} must not be negative (0 is greedy)", f.gen.sampling.temperature));
  if (f.gen.max_tokens < -1) throw Error(fmt::format("-n {} must be -1 (no limit) or more", f.gen.max_tokens));
}

std::string stats_line(const Timings& t) {
  return fmt::format("prompt {} tok, {:.1f} tok/s; generated {} tok, {:.1f} tok/s; peak RSS {:.1f} MiB",
                     t.prompt_tokens, t.prompt_tokens_per_s(), t.generated_tokens, t.generated_tokens_per_s(),
                     double(t.peak_rss_bytes) / (1 << 20));
}

}  // namespace tessera::cli
