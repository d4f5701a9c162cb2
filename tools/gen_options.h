// Flags shared by `run` and `chat`: session (context, batch, threads, reference mode) and sampling.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "tessera/session.h"

namespace tessera::cli {

struct GenFlags {
  std::string model;
  SessionOptions session;
  GenerateOptions gen;
  int64_t seed = -1;  // -1: random
  std::string chat_template;  // override of the model's template family
  std::string system;         // system prompt for chat
};

// Adds -m, -c, --batch, -t, --reference, --kv-type, -n, --temp, --top-k, --top-p, --min-p, penalties, --seed,
// --stop, --ignore-eos, --chat-template, --system.
void add_gen_flags(CLI::App& app, GenFlags& f);
// Applies --seed and checks ranges CLI11 cannot (Error with one sentence).
void finish_gen_flags(GenFlags& f);
// "prompt 12 tok, 230.1 tok/s; generated 64 tok, 95.2 tok/s; peak RSS 181.2 MiB"
std::string stats_line(const Timings& t);

}  // namespace tessera::cli
