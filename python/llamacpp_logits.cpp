// Peer-side helper for python/make_llamacpp_golden.py: runs llama.cpp (through its public llama.h API) on a token
// sequence and dumps the raw logits of every prompt position, then a greedy (argmax) continuation with the logits
// of every generation step. Compiled by make_llamacpp_golden.py against the cached llama.cpp build; never by CI.
//
// Usage: llamacpp_logits MODEL IDS_FILE N_GEN OUT_FILE [N_THREADS [KV_TYPE [FLASH_ATTN [LORA]]]]
//   KV_TYPE: f16 (llama.cpp's default) or f32; FLASH_ATTN: auto (default), on or off. The non-defaults exist to
//   measure how much llama.cpp's own settings move its logits (docs/CORRECTNESS.md).
//   LORA: a GGUF LoRA adapter applied at scale 1 (docs/LORA.md's check against llama.cpp).
//   IDS_FILE: whitespace-separated token ids (already tokenized by llama-tokenize).
//   OUT_FILE (little-endian): int32 n_prompt, int32 n_vocab, float32 logits[n_prompt][n_vocab],
//             int32 n_gen, then per step: int32 chosen_id, float32 logits[n_vocab] (the logits it was chosen from;
//             step 0's are the last prompt position's).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llamacpp_logits: %s\n", msg.c_str());
  std::exit(1);
}

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

void write_i32(std::ofstream& out, int32_t v) { out.write(reinterpret_cast<const char*>(&v), sizeof v); }

void write_row(std::ofstream& out, const float* row, int32_t n) {
  out.write(reinterpret_cast<const char*>(row), static_cast<std::streamsize>(n) * sizeof(float));
}

int32_t argmax(const float* row, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;  // ties go to the lowest id, as llama.cpp's greedy sampler does
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) die("usage: llamacpp_logits MODEL IDS_FILE N_GEN OUT_FILE [N_THREADS [KV_TYPE [FLASH_ATTN]]]");
  const std::string model_path = argv[1];
  const int n_gen = std::atoi(argv[3]);
  const int n_threads = argc > 5 ? std::atoi(argv[5]) : 2;
  const std::string kv_type = argc > 6 ? argv[6] : "f16";
  const std::string flash_attn = argc > 7 ? argv[7] : "auto";
  if (n_threads < 1) die("N_THREADS must be positive");
  if (kv_type != "f16" && kv_type != "f32") die("KV_TYPE must be f16 or f32");
  if (flash_attn != "auto" && flash_attn != "on" && flash_attn != "off") die("FLASH_ATTN must be auto, on or off");

  std::vector<llama_token> ids;
  {
    std::ifstream in(argv[2]);
    if (!in) die(std::string("cannot open ") + argv[2]);
    long v;
    while (in >> v) ids.push_back(static_cast<llama_token>(v));
  }
  if (ids.empty()) die("no token ids read");

  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.progress_callback = [](float, void*) { return true; };  // no loading dots on stdout
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) die("cannot load " + model_path);
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  // Unless asked otherwise, llama.cpp's defaults (f16 KV cache, flash attention "auto"), so the golden data is what
  // a llama.cpp user gets.
  llama_context_params cp = llama_context_default_params();
  const int n_total = static_cast<int>(ids.size()) + n_gen;
  cp.n_ctx = static_cast<uint32_t>(n_total + 16);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;
  cp.n_threads = n_threads;
  cp.n_threads_batch = n_threads;
  cp.no_perf = true;
  cp.type_k = cp.type_v = kv_type == "f32" ? GGML_TYPE_F32 : GGML_TYPE_F16;
  cp.flash_attn_type = flash_attn == "on"    ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                       : flash_attn == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                             : LLAMA_FLASH_ATTN_TYPE_AUTO;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("cannot create a context");
  if (argc > 8) {
    llama_adapter_lora* ad = llama_adapter_lora_init(model, argv[8]);
    if (ad == nullptr) die("cannot load the adapter");
    float scale = 1.0f;
    if (llama_set_adapters_lora(ctx, &ad, 1, &scale) != 0) die("cannot set the adapter");
  }

  std::ofstream out(argv[4], std::ios::binary);
  if (!out) die(std::string("cannot write ") + argv[4]);

  const int32_t n_prompt = static_cast<int32_t>(ids.size());
  llama_batch batch = llama_batch_init(n_prompt, 0, 1);
  for (int32_t i = 0; i < n_prompt; ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;  // logits for every position, not only the last
  }
  batch.n_tokens = n_prompt;
  if (llama_decode(ctx, batch) != 0) die("llama_decode failed on the prompt");
  write_i32(out, n_prompt);
  write_i32(out, n_vocab);
  for (int32_t i = 0; i < n_prompt; ++i) {
    const float* row = llama_get_logits_ith(ctx, i);
    if (!row) die("no logits for prompt position " + std::to_string(i));
    write_row(out, row, n_vocab);
  }
  llama_batch_free(batch);

  // Greedy continuation, one token per decode as llama-simple does, so the KV-cache (decode) path is exercised.
  write_i32(out, n_gen);
  std::vector<float> last(llama_get_logits_ith(ctx, n_prompt - 1), llama_get_logits_ith(ctx, n_prompt - 1) + n_vocab);
  llama_batch one = llama_batch_init(1, 0, 1);
  for (int step = 0; step < n_gen; ++step) {
    const int32_t tok = argmax(last.data(), n_vocab);
    write_i32(out, tok);
    write_row(out, last.data(), n_vocab);
    if (step + 1 == n_gen) break;
    one.token[0] = tok;
    one.pos[0] = n_prompt + step;
    one.n_seq_id[0] = 1;
    one.seq_id[0][0] = 0;
    one.logits[0] = 1;
    one.n_tokens = 1;
    if (llama_decode(ctx, one) != 0) die("llama_decode failed at generation step " + std::to_string(step));
    const float* row = llama_get_logits_ith(ctx, -1);
    last.assign(row, row + n_vocab);
  }
  llama_batch_free(one);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return out ? 0 : 1;
}
