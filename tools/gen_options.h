// Flags shared by `run` and `chat`: session (context, batch, threads, reference mode) and sampling, with llama.cpp's
// spellings where they mean the same thing; and the small helpers every command uses (thread cap, plurals).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "tessera/session.h"

namespace tessera::cli {

// llama.cpp's -ngl/--n-gpu-layers (main.cpp rewrites -ngl): Tessera runs every layer on one device, so a positive
// count means --device cuda and 0 means --device cpu. add_ngl_option adds the flag; apply_ngl maps it (with a notice)
// unless --device was given too, and refuses a contradiction by name.
struct NglFlag {
  int layers = -1;  // -1: not given
  CLI::Option* device_opt = nullptr;
};
// The device backend's own switches: --cuda KEY=VALUE (repeatable; the fields of cuda::CudaOptions,
// docs/ENVIRONMENT.md) and --cpu-isa NAME. backend_options() turns them into SessionOptions::backend_options for
// `device`, refusing a switch of the other device by name.
struct BackendFlags {
  std::vector<std::string> cuda;
  std::string cpu_isa;
  std::string cpu_teal_walk;  // --cpu-teal-walk all|none
};
void add_backend_flags(CLI::App& app, BackendFlags& f);
std::vector<std::string> backend_options(const BackendFlags& f, const std::string& device);

// TEAL activation sparsity (docs/TEAL.md): --sparsity S (uniform top-k per token) or --teal FILE (thresholds from
// `tessera calibrate`). add_teal_flags adds both; they go into SessionOptions as they are (the session checks them).
struct TealFlags {
  float sparsity = 0;
  std::string teal;
};
void add_teal_flags(CLI::App& app, TealFlags& f);
void apply_teal_flags(const TealFlags& f, SessionOptions& so);
// "achieved activation sparsity 49.9% (asked 50%)"; "" when TEAL is off.
std::string teal_line(const TealFlags& f, double achieved);

// LoRA adapters (docs/LORA.md): --lora FILE[:SCALE] (repeatable: a PEFT folder, its adapter_model.safetensors, or a
// GGUF LoRA) and --lora-merge (merge into the weights at load instead of running the adapters beside them).
struct LoraFlags {
  std::vector<std::string> specs;
  bool merge = false;
};
void add_lora_flags(CLI::App& app, LoraFlags& f);
void apply_lora_flags(const LoraFlags& f, SessionOptions& so);

struct GenFlags {
  std::string model;
  SessionOptions session;
  GenerateOptions gen;
  std::string seed = "-1";    // -1: random; parsed by finish_gen_flags (CLI11 saturates out-of-range integers)
  std::string chat_template;  // override of the model's template family
  std::string system;         // system prompt for chat
  bool no_escape = false;     // --no-escape: take \n in -p, --system and --stop literally
  NglFlag ngl;                // -ngl: llama.cpp's; maps onto --device
  BackendFlags backend;       // --cuda KEY=VALUE, --cpu-isa
  TealFlags teal;             // --sparsity, --teal
  LoraFlags lora;             // --lora, --lora-merge
};

// Adds -m, -c/--ctx-size, -b/--batch-size, -t, --reference, --kv-type, --device, -ngl, -n, --temp, --top-k, --top-p,
// --min-p, penalties, --seed, --stop, --ignore-eos, --chat-template, --system, -e/--no-escape.
void add_gen_flags(CLI::App& app, GenFlags& f);
// Applies --seed, -ngl, the thread cap and escapes; checks ranges CLI11 cannot (Error with one sentence).
void finish_gen_flags(GenFlags& f);
// "prompt 12 tok, 230.1 tok/s; generated 64 tok, 95.2 tok/s; peak RSS 181.2 MiB"
std::string stats_line(const Timings& t);
// One stderr line per LoRA adapter the session runs (path, format, rank, matmuls, scale, merged or not).
void announce_adapters(const Session& s);

// More threads than the machine has only slow everything down (and used to hang it): caps `requested` to the
// hardware threads with a one-line notice on stderr. Error for a negative count; 0 stays 0 (all cores).
int cap_threads(int requested);
// llama.cpp's escape processing of prompts (common's string_process_escapes): \n \r \t \' \" \\ and \xNN; any other
// backslash is kept as it is.
std::string process_escapes(const std::string& s);
// A prompt file as llama.cpp reads it: "-" is stdin; one final newline is dropped. Error naming the path when it
// cannot be read (a directory included).
std::string read_prompt_file(const std::string& path);
void add_ngl_option(CLI::App& app, NglFlag& ngl, CLI::Option* device_opt);
void apply_ngl(const NglFlag& ngl, std::string& device);
// "1 token", "2 tokens"
std::string count_noun(int64_t n, const std::string& singular);

}  // namespace tessera::cli
