// `tessera profile`: per-node times of prefill and decode on the default model add up to the measured wall time
// (within 10%), the op-class and matmul-role tables cover every node, the work matches `tessera graph`; text output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using nlohmann::json;
using tessera::test::cli_path;
using tessera::test::data_path;
using tessera::test::run_command;

int run_stdout(const std::string& args, std::string* out) { return tessera::test::run_cli_stdout(args, out); }

json run_json(const std::string& args) {
  std::string out;
  const int rc = run_stdout(args, &out);
  EXPECT_EQ(rc, 0) << args << "\n" << out;
  return rc == 0 ? json::parse(out) : json();
}

double sum_of(const json& rows, const char* key) {
  double s = 0;
  for (const json& r : rows) s += r[key].get<double>();
  return s;
}

// |node sum - wall| / wall of a phase: the share of the wall time no node accounts for.
double wall_gap(const json& p) {
  const double wall = p["wall_ms"].get<double>(), node = p["node_ms"].get<double>();
  return wall > 0 ? std::fabs(node - wall) / wall : 1.0;
}

// `tessera profile ... --json`, run again (at most three times in all) while a phase's node times miss its wall time
// by 10% or more: on this shared 2-core machine one descheduling of the process can stretch a 30 ms wall by more than
// that. Work outside the timed nodes shows in every run, so check_phase still catches it.
json run_profile(const std::string& args, const std::vector<std::string>& phases) {
  json j;
  for (int attempt = 0; attempt < 3; ++attempt) {
    j = run_json(args);
    if (j.is_null()) return j;
    bool close = true;
    for (const std::string& ph : phases) close = close && j.contains(ph) && wall_gap(j[ph]) < 0.10;
    if (close) break;
  }
  return j;
}

void check_phase(const json& p, const std::string& what) {
  SCOPED_TRACE(what);
  const double wall = p["wall_ms"].get<double>(), node = p["node_ms"].get<double>();
  ASSERT_GT(wall, 0);
  // The per-node times must account for the measured total: nothing large runs outside the timed nodes.
  EXPECT_LT(std::fabs(node - wall), 0.10 * wall) << "node sum " << node << " ms, wall " << wall << " ms";
  EXPECT_NEAR(sum_of(p["nodes"], "ms"), node, 1e-6 * node + 1e-9);
  EXPECT_NEAR(sum_of(p["classes"], "ms"), node, 1e-6 * node + 1e-9);
  EXPECT_NEAR(sum_of(p["classes"], "share"), 1.0, 1e-9);
  std::set<std::string> classes, roles;
  for (const json& c : p["classes"]) classes.insert(c["name"].get<std::string>());
  for (const json& r : p["matmul_roles"]) roles.insert(r["name"].get<std::string>());
  for (const char* c : {"matmul", "attention", "norm", "rope", "elementwise", "embedding", "kv_cache"})
    EXPECT_TRUE(classes.count(c)) << c;
  EXPECT_EQ(roles, (std::set<std::string>{"attn_q", "attn_k", "attn_v", "attn_o", "ffn_gate", "ffn_up", "ffn_down",
                                          "output"}));
  double matmul_ms = 0;
  for (const json& c : p["classes"])
    if (c["name"] == "matmul") matmul_ms = c["ms"].get<double>();
  EXPECT_NEAR(sum_of(p["matmul_roles"], "ms"), matmul_ms, 1e-6 * matmul_ms + 1e-9);
}

TEST(ProfileCli, NodeTimesAddUpToTheWallTime) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const int n_gen = 8;
  const json j = run_profile("profile -m " + model + " -n " + std::to_string(n_gen) + " -t 2 --json --no-ceilings",
                             {"prefill", "decode"});
  ASSERT_TRUE(j.contains("prefill") && j.contains("decode"));
  check_phase(j["prefill"], "prefill");
  check_phase(j["decode"], "decode");
  const int64_t p = j["prefill"]["tokens"].get<int64_t>();
  ASSERT_GT(p, 1);
  EXPECT_EQ(j["decode"]["tokens"], n_gen);

  // The work matches `tessera graph`: prefill is one chunk at position 0, decode steps at positions p .. p+n-1
  // (attention grows linearly with the position, so the mean of the first and last step is exact).
  const json gp = run_json("graph -m " + model + " --format json --tokens " + std::to_string(p));
  EXPECT_EQ(j["prefill"]["nodes"].size(), gp["nodes"].size());
  EXPECT_NEAR(sum_of(j["prefill"]["nodes"], "flops"), gp["totals"]["flops"].get<double>(), 0.5);
  const json g0 = run_json("graph -m " + model + " --format json --tokens 1 --past " + std::to_string(p));
  const json g1 = run_json("graph -m " + model + " --format json --tokens 1 --past " + std::to_string(p + n_gen - 1));
  EXPECT_EQ(j["decode"]["nodes"].size(), g0["nodes"].size());
  const double expect = n_gen * 0.5 * (g0["totals"]["flops"].get<double>() + g1["totals"]["flops"].get<double>());
  EXPECT_NEAR(sum_of(j["decode"]["nodes"], "flops"), expect, 1e-9 * expect);
}

// With TEAL the decode's matmuls are matmul_sparse nodes: they count under their roles as the dense ones do.
TEST(ProfileCli, SparseDecodeCountsUnderItsRoles) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const json j = run_profile("profile -m " + model + " -n 4 -t 2 --json --no-ceilings --sparsity 0.5", {"decode"});
  ASSERT_TRUE(j.contains("decode"));
  bool sparse = false;
  for (const json& n : j["decode"]["nodes"]) sparse |= n["op"] == "matmul_sparse";
  EXPECT_TRUE(sparse) << "no matmul_sparse node in the decode";
  check_phase(j["decode"], "sparse decode");
}

TEST(ProfileCli, ChunkedPrefillAndText) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  // 40 random ids in chunks of 16, 16 and 8: every chunk's work and time is counted once.
  const json j =
      run_profile("profile -m " + model + " --prompt-tokens 40 -b 16 -n 2 -t 2 --json --no-ceilings", {"prefill"});
  EXPECT_EQ(j["prefill"]["chunks"], (std::vector<int>{16, 16, 8}));
  check_phase(j["prefill"], "chunked prefill");
  double expect = 0;
  for (int past : {0, 16, 32}) {
    const json g = run_json("graph -m " + model + " --format json --tokens " + std::to_string(past == 32 ? 8 : 16) +
                            " --past " + std::to_string(past));
    expect += g["totals"]["flops"].get<double>();
  }
  EXPECT_NEAR(sum_of(j["prefill"]["nodes"], "flops"), expect, 1e-9 * expect);

  std::string out;
  ASSERT_EQ(run_stdout("profile -m " + model + " -n 2 -t 2 --ceiling-mib 64", &out), 0) << out;
  for (const char* s : {"prefill:", "decode:", "node times sum to", "share", "GFLOP/s", "GB/s", "% roof", "matmul",
                        "ffn_down", "attn_q", "attention", "read bandwidth"})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
}

// --trace: the Trace Event Format (chrome://tracing, Perfetto): "X" slices with ts/dur in µs, pid, tid, name and args;
// one slice per step on track 1, one per graph node and step on track 2, named by the graph's nodes; each worker
// thread's part of a node on track 10 + thread (both threads take part in matmuls; in a decode step the part lies
// inside its node's slice); slices on one track never overlap.
TEST(ProfileCli, TraceIsWellFormedAndNamedByTheGraph) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const std::string path = ::testing::TempDir() + "tessera_profile_trace.json";
  // 40 prompt tokens in chunks of 16: chunks of 16, 16 and 8 tokens, then 3 decode steps.
  std::string out;
  ASSERT_EQ(run_stdout("profile -m " + model + " --prompt-tokens 40 -b 16 -n 3 -t 2 --trace " + path, &out), 0) << out;
  std::ifstream f(path);
  const json j = json::parse(f);
  ASSERT_TRUE(j["traceEvents"].is_array());
  std::map<int64_t, size_t> graph_nodes;
  std::set<std::string> names;
  for (int64_t t : {16, 8, 1}) {
    const json g = run_json("graph -m " + model + " --format json --tokens " + std::to_string(t));
    graph_nodes[t] = g["nodes"].size();
    for (const json& n : g["nodes"]) names.insert(n["name"].get<std::string>());
  }
  std::map<int64_t, std::vector<std::pair<double, double>>> tracks;  // tid -> (ts, end)
  std::map<std::string, size_t> per_step;
  std::set<std::string> steps;
  std::set<int64_t> named_threads;
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> node_slice;  // (step, node) -> (ts, end)
  std::vector<json> thread_slices;
  std::set<int64_t> matmul_threads;
  for (const json& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid") && e.contains("name")) << e.dump();
    if (e["ph"] == "M") {
      if (e["name"] == "thread_name") named_threads.insert(e["tid"].get<int64_t>());
      continue;
    }
    ASSERT_EQ(e["ph"], "X") << e.dump();
    ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number() && e["args"].is_object()) << e.dump();
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    EXPECT_GE(ts, 0);
    EXPECT_GE(dur, 0);
    const int64_t tid = e["tid"].get<int64_t>();
    tracks[tid].push_back({ts, ts + dur});
    if (tid == 1) {
      steps.insert(e["name"].get<std::string>());
    } else if (tid >= 10) {
      ASSERT_LE(tid, 11) << "two threads, two tracks";
      EXPECT_TRUE(names.count(e["name"].get<std::string>())) << e["name"];
      EXPECT_EQ(e["args"]["thread"].get<int64_t>(), tid - 10);
      if (e["cat"] == "matmul") matmul_threads.insert(tid);
      thread_slices.push_back(e);
    } else {
      ASSERT_EQ(tid, 2);
      EXPECT_TRUE(names.count(e["name"].get<std::string>())) << e["name"];
      per_step[e["args"]["step"].get<std::string>()]++;
      node_slice[{e["args"]["step"].get<std::string>(), e["name"].get<std::string>()}] = {ts, ts + dur};
    }
  }
  EXPECT_EQ(named_threads, (std::set<int64_t>{1, 2, 10, 11}));
  EXPECT_EQ(matmul_threads, (std::set<int64_t>{10, 11}));
  size_t decode_parts = 0;
  for (const json& e : thread_slices) {
    const std::string step = e["args"]["step"].get<std::string>();
    EXPECT_TRUE(step.rfind("decode", 0) == 0 || step == "prefill chunk 2 (8 tokens at 32)")
        << "threads are drawn only where a node's time is one run's: " << step;
    const auto it = node_slice.find({step, e["name"].get<std::string>()});
    ASSERT_NE(it, node_slice.end()) << e.dump();
    const double ts = e["ts"].get<double>(), end = ts + e["dur"].get<double>();
    EXPECT_GE(ts, it->second.first - 1e-3) << e.dump();
    EXPECT_LE(end, it->second.second + 1e-3) << e.dump();
    ++decode_parts;
  }
  EXPECT_GE(decode_parts, graph_nodes[1]);  // every node of the three steps has at least one thread's part
  EXPECT_EQ(steps, (std::set<std::string>{"prefill (40 tokens)", "decode 0 (position 40)", "decode 1 (position 41)",
                                          "decode 2 (position 42)"}));
  EXPECT_EQ(per_step.size(), 6u);  // three prefill chunks and three decode steps
  EXPECT_EQ(per_step["prefill chunk 0 (16 tokens at 0)"], graph_nodes[16]);
  EXPECT_EQ(per_step["prefill chunk 2 (8 tokens at 32)"], graph_nodes[8]);
  EXPECT_EQ(per_step["decode 2 (position 42)"], graph_nodes[1]);
  for (auto& [tid, v] : tracks) {
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i)
      ASSERT_LE(v[i - 1].second, v[i].first + 1e-3)
          << "track " << tid << ": slice " << i << " overlaps its predecessor";
  }
  std::remove(path.c_str());
}

// --trace with --lora: the CPU runs each adapted matmul and its adapters as one fused step, whose time and threads'
// spans are reported under the base matmul's node (the adapters' own nodes get no time and no thread slice). Every
// thread slice lies inside its node's slice on track 2 and is that node's: the plan's node numbering (fewer nodes) must
// not leak into the builder graph's, where it would hang a matmul's thread slices on other nodes.
TEST(ProfileCli, TraceWithLoraPutsEachThreadSliceOnItsNode) {
  const std::string base = data_path("lora/base"), adapter = data_path("lora/adapter_a");
  const std::string path = ::testing::TempDir() + "tessera_profile_lora_trace.json";
  std::string out;
  // 12 prompt tokens in one chunk, then 3 decode steps; the tiny base's matmuls run on the calling thread.
  ASSERT_EQ(
      run_stdout("profile -m " + base + " --lora " + adapter + " --prompt-tokens 12 -n 3 -t 2 --trace " + path, &out),
      0)
      << out;
  std::ifstream f(path);
  const json j = json::parse(f);
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> node_slice;  // (step, node) -> (ts, end)
  std::vector<json> thread_slices;
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int64_t tid = e["tid"].get<int64_t>();
    const double ts = e["ts"].get<double>();
    if (tid == 2) node_slice[{e["args"]["step"], e["name"]}] = {ts, ts + e["dur"].get<double>()};
    if (tid >= 10) thread_slices.push_back(e);
  }
  std::map<std::string, std::set<std::string>> threaded;  // step -> nodes with a thread slice
  for (const json& e : thread_slices) {
    const std::string step = e["args"]["step"].get<std::string>(), name = e["name"].get<std::string>();
    EXPECT_EQ(name.find(".lora"), std::string::npos) << "an adapter's node runs inside its base matmul: " << e.dump();
    const auto it = node_slice.find({step, name});
    ASSERT_NE(it, node_slice.end()) << e.dump();
    const double ts = e["ts"].get<double>(), end = ts + e["dur"].get<double>();
    EXPECT_GE(ts, it->second.first - 1e-3) << e.dump();
    EXPECT_LE(end, it->second.second + 1e-3) << e.dump();
    threaded[step].insert(name);
  }
  // Each decode step: a thread slice on every node that took time, the fused matmuls' base nodes among them.
  ASSERT_EQ(threaded.count("decode 1 (position 13)"), 1u);
  const std::set<std::string>& d1 = threaded["decode 1 (position 13)"];
  for (const char* n : {"blk.0.attn_q", "blk.1.ffn_down", "blk.0.attn_k"}) EXPECT_TRUE(d1.count(n)) << n;
  size_t timed = 0;
  for (const auto& [key, slice] : node_slice)
    if (key.first == "decode 1 (position 13)" && slice.second > slice.first) ++timed;
  EXPECT_EQ(d1.size(), timed);
  std::remove(path.c_str());
}

TEST(ProfileCli, BadFlags) {
  for (const std::string& args : {std::string("profile --device cuda"), std::string("profile -n -1"),
                                  std::string("profile -p hi --prompt-tokens 4"), std::string("profile -b 0"),
                                  std::string("profile -n 1 --trace /nonexistent/dir/t.json")}) {
    std::string out;
    EXPECT_EQ(run_command(cli_path() + " " + args, &out), 1) << args << "\n" << out;
    EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << args << "\n" << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << args << "\n" << out;
  }
}

}  // namespace
