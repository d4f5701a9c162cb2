// `tessera graph`: JSON nodes, edges and totals for the default model, DOT and text output, the model views (SVG parsed
// as XML, the HTML page's data against the JSON, a preset's graph without weights, the profile overlay, --device, the
// headless-browser check), bad flags.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "test_util.h"

namespace {

using nlohmann::json;
using tessera::test::cli_path;
using tessera::test::run_command;

int run_stdout(const std::string& args, std::string* out) { return tessera::test::run_cli_stdout(args, out); }

TEST(GraphCli, JsonNodesEdgesAndTotals) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  for (int t : {1, 512}) {
    std::string out;
    ASSERT_EQ(run_stdout("graph -m " + model + " --format json --tokens " + std::to_string(t), &out), 0) << out;
    const json j = json::parse(out);
    EXPECT_EQ(j["n_tokens"], t);
    // 30 blocks of 17 nodes, embedding, output norm, output (and the last-token selection for a chunk).
    EXPECT_EQ(j["nodes"].size(), size_t(30 * 17 + (t > 1 ? 4 : 3)));
    uint64_t flops = 0, mm = 0;
    for (const auto& n : j["nodes"]) {
      ASSERT_TRUE(n.contains("name") && n.contains("op") && n.contains("shape") && n.contains("dtype") &&
                  n.contains("flops") && n.contains("bytes"));
      flops += n["flops"].get<uint64_t>();
      if (n["op"] == "matmul") mm += n["flops"].get<uint64_t>();
    }
    EXPECT_EQ(j["totals"]["flops"].get<uint64_t>(), flops);
    EXPECT_EQ(j["totals"]["matmul_flops"].get<uint64_t>(), mm);
    EXPECT_GT(j["totals"]["matmul_flop_share"].get<double>(), 0.9);
    EXPECT_GT(j["edges"].size(), j["nodes"].size());
    bool found = false;
    for (const auto& n : j["nodes"])
      if (n["name"] == "blk.3.attn_q") {
        found = true;
        EXPECT_EQ(n["role"], "attn_q");
        EXPECT_EQ(n["layer"], 3);
        EXPECT_EQ(n["shape"], (std::vector<int>{t, 576}));
        EXPECT_EQ(n["flops"].get<uint64_t>(), uint64_t(2) * uint64_t(t) * 576 * 576);
      }
    EXPECT_TRUE(found);
  }
}

// --sparsity: TEAL's rewrite as a session runs it. A decode graph gains one SPARSIFY per block input (q|k|v, o,
// gate|up, down: four a block) and its seven block matmuls become MATMUL_SPARSE; a prefill chunk keeps its matmuls
// dense (prefill is not sparsified). Bad values and --sparsity with --teal are refused with one line and a non-zero
// exit.
TEST(GraphCli, SparsityShowsTealsNodes) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  for (int t : {1, 64}) {
    std::string out;
    ASSERT_EQ(run_stdout("graph -m " + model + " --format json --sparsity 0.5 --tokens " + std::to_string(t), &out), 0)
        << out;
    const json j = json::parse(out);
    int sparsify = 0, sparse_mm = 0, dense_mm = 0;
    for (const auto& n : j["nodes"]) {
      sparsify += n["op"] == "sparsify";
      sparse_mm += n["op"] == "matmul_sparse";
      dense_mm += n["op"] == "matmul";
    }
    if (t == 1) {
      EXPECT_EQ(sparsify, 30 * 4);
      EXPECT_EQ(sparse_mm, 30 * 7);
      EXPECT_EQ(dense_mm, 1);  // the output projection
    } else {
      EXPECT_EQ(sparsify, 0);
      EXPECT_EQ(sparse_mm, 0);
    }
  }
  for (const std::string bad : {"--sparsity 1.5", "--sparsity -0.1", "--sparsity 0.5 --teal /nonexistent.json",
                                "--teal /nonexistent.json"}) {
    std::string out;
    const int rc = run_command("{ " + cli_path() + " graph -m " + model + " " + bad + " 2>&1; }", &out);
    EXPECT_NE(rc, 0) << bad << "\n" << out;
    EXPECT_NE(out.find("error"), std::string::npos) << bad << "\n" << out;
  }
}

TEST(GraphCli, DotAndText) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(run_stdout("graph -m " + model + " --format dot", &out), 0);
  EXPECT_EQ(out.rfind("digraph", 0), 0u);
  EXPECT_NE(out.find("cluster_blk_29"), std::string::npos);
  // Graphviz must accept it (checked where Graphviz is installed).
  std::string ignored;
  if (run_command("command -v dot", &ignored) == 0) {
    EXPECT_EQ(run_command(cli_path() + " graph -m " + model + " --format dot | dot -Tsvg -o /dev/null", &out), 0)
        << out;
  }
  ASSERT_EQ(run_stdout("graph -m " + model, &out), 0);
  EXPECT_NE(out.find("blk.0.ffn_down"), std::string::npos);
  EXPECT_NE(out.find("matmul share"), std::string::npos);
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "tessera_graph_cli_" + std::to_string(::getpid()) + "_" + name;
}

// The JSON the HTML page carries.
json page_data(const std::string& html) {
  const std::string open = "<script id=\"graph-data\" type=\"application/json\">";
  const size_t b = html.find(open), e = html.find("</script>", b);
  if (b == std::string::npos || e == std::string::npos) return json();
  return json::parse(html.substr(b + open.size(), e - b - open.size()));
}

TEST(GraphCli, SvgParsesAsXmlAndHasTheNodes) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string ignored;
  if (run_command("command -v python3", &ignored) != 0) GTEST_SKIP() << "python3 is needed to parse the SVG";
  const std::string path = temp_path("g.svg");
  std::string out;
  for (const std::string& layers : {std::string(""), std::string(" --layers 28-29")}) {
    SCOPED_TRACE(layers);
    const int rc = run_command(cli_path() + " graph -m " + model + " --format svg -o " + path + layers, &out);
    if (rc == 1 && out.find("install") != std::string::npos) GTEST_SKIP() << out;  // no Graphviz here
    ASSERT_EQ(rc, 0) << out;
    // Every node's <title> (Graphviz names each drawn node by its id), read by an XML parser.
    ASSERT_EQ(run_command("python3 -c \"import sys, xml.etree.ElementTree as E\n"
                          "ns = '{http://www.w3.org/2000/svg}'\n"
                          "for g in E.parse(sys.argv[1]).getroot().iter(ns + 'g'):\n"
                          "    t = g.find(ns + 'title')\n"
                          "    print(g.get('class'), t.text if t is not None else '')\" " +
                              path,
                          &out),
              0)
        << out;
    std::set<std::string> nodes;
    std::istringstream lines(out);
    for (std::string cls, title; lines >> cls >> title;)
      if (cls == "node") nodes.insert(title);
    const int first = layers.empty() ? 0 : 28, last = layers.empty() ? 0 : 29;
    for (int l = 0; l < 30; ++l) {
      const bool full = l >= first && l <= last;
      EXPECT_EQ(nodes.count("blk." + std::to_string(l) + ".attn_q"), full ? 1u : 0u) << l;
      EXPECT_EQ(nodes.count("blk." + std::to_string(l) + ".ffn_down"), full ? 1u : 0u) << l;
      EXPECT_EQ(nodes.count("layer:" + std::to_string(l)), full ? 0u : 1u) << l;
    }
    for (const char* n : {"token_embd", "output_norm", "output", "in:tokens", "in:positions"})
      EXPECT_EQ(nodes.count(n), 1u) << n;
  }
  std::remove(path.c_str());
}

TEST(GraphCli, HtmlCarriesEveryNodeOfTheJson) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  for (const std::string& args : {std::string(" --tokens 1"), std::string(" --tokens 64 --past 10")}) {
    std::string html, js;
    ASSERT_EQ(run_stdout("graph -m " + model + " --format html" + args, &html), 0) << html;
    ASSERT_EQ(run_stdout("graph -m " + model + " --format json" + args, &js), 0);
    EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
    EXPECT_EQ(html.find("http://"), std::string::npos);  // nothing fetched (the SVG namespace is implicit in HTML)
    EXPECT_EQ(html.find("https://"), std::string::npos);
    const json d = page_data(html), j = json::parse(js);
    ASSERT_EQ(d["nodes"].size(), j["nodes"].size());
    for (size_t i = 0; i < j["nodes"].size(); ++i) {
      const json &a = d["nodes"][i], &b = j["nodes"][i];
      EXPECT_EQ(a["name"], b["name"]);
      EXPECT_EQ(a["op"], b["op"]);
      EXPECT_EQ(a["layer"], b["layer"]);
      EXPECT_EQ(a["shape"], b["shape"]);
      EXPECT_EQ(a["dtype"], b["dtype"]);
      EXPECT_EQ(a["flops"], b["flops"]);
      EXPECT_EQ(a["bytes"], b["bytes"]);
      ASSERT_EQ(a["inputs"].size(), b["inputs"].size());
      for (size_t k = 0; k < a["inputs"].size(); ++k) EXPECT_EQ(a["inputs"][k]["shape"], b["input_shapes"][k]);
    }
  }
}

TEST(GraphCli, PresetGraphNeedsNoWeights) {
  std::string out;
  ASSERT_EQ(run_stdout("graph --random-weights --arch llama3-8b --format json", &out), 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["nodes"].size(), size_t(32 * 17 + 3));
  for (const auto& n : j["nodes"])
    if (n["name"] == "blk.31.attn_q") {
      EXPECT_EQ(n["input_dtypes"][1], "q4_0");
      EXPECT_EQ(n["flops"].get<uint64_t>(), uint64_t(2) * 4096 * 4096);
    }
  ASSERT_EQ(run_stdout("graph --random-weights --arch llama3-8b --dtype q8_0 --format html", &out), 0);
  EXPECT_EQ(page_data(out)["nodes"].size(), size_t(32 * 17 + 3));
}

TEST(GraphCli, ProfileOverlaysMeasuredTimes) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  for (const std::string& args : {std::string(" -n 2 --prompt-tokens 8"), std::string(" --tokens 16")}) {
    SCOPED_TRACE(args);
    std::string out;
    ASSERT_EQ(run_stdout("graph -m " + model + " --format html --profile -t 2" + args, &out), 0) << out;
    const json d = page_data(out);
    ASSERT_FALSE(d.is_null());
    const double wall = d["wall_ms"].get<double>();
    EXPECT_GT(wall, 0);
    double sum = 0;
    for (const auto& n : d["nodes"]) {
      ASSERT_TRUE(n["ms"].is_number()) << n["name"];
      sum += n["ms"].get<double>();
    }
    // The node times are the measured step's: together they cannot take much longer than it did.
    EXPECT_GT(sum, 0);
    EXPECT_LT(sum, 1.5 * wall);
    EXPECT_NE(d["profile"].get<std::string>().find("measured:"), std::string::npos);
  }
}

TEST(GraphCli, DeviceCudaShowsFusedNodesOrSaysWhy) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  const int rc = run_command(cli_path() + " graph -m " + model + " --format json --device cuda 2>&1", &out);
  if (rc != 0) {
    // A build without CUDA says so in one line (a GPU is not needed, the CUDA backend's code is).
    EXPECT_EQ(rc, 1);
    EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << out;
    EXPECT_NE(out.find("no CUDA backend"), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    return;
  }
  int fused = 0;
  // The parsed document must outlive the loop (a range-for over a member of a temporary dangles before C++23).
  const json cuda = json::parse(out);
  for (const auto& n : cuda["nodes"]) fused += n.contains("fused_from");
  EXPECT_GT(fused, 30) << out.substr(0, 400);
  ASSERT_EQ(run_stdout("graph -m " + model + " --format json --device cpu", &out), 0);
  const json cpu = json::parse(out);
  for (const auto& n : cpu["nodes"]) EXPECT_FALSE(n.contains("fused_from"));
}

TEST(GraphCli, HtmlRendersInHeadlessBrowser) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  const int rc = run_command(std::string(TESSERA_SOURCE_DIR) + "/tests/tools/graph_html_check.sh " + cli_path() + " " +
                                 temp_path("html_check"),
                             &out);
  if (out.find("skipped") != std::string::npos) GTEST_SKIP() << out;
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("llama3-8b: 32 layers, 547 nodes"), std::string::npos) << out;
  std::cout << out;
}

TEST(GraphCli, BadFlags) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const std::string m = "graph -m " + model;
  for (const std::string& args :
       {m + " --format svgz", m + " --tokens 0", m + " --format svg --layers 5-2", m + " --format svg --layers 0-30",
        m + " --format html --layers x", m + " --format svg --layers 1-", m + " --layers 0-1", m + " --profile",
        m + " --format html --limits", m + " --format html --profile -n 0", m + " --format svg --device tpu",
        std::string("graph --arch llama3-8b"), std::string("graph --random-weights --arch nope"),
        std::string("graph --random-weights"), std::string("graph --random-weights --arch llama3-8b --dtype q9"),
        m + " --random-weights --arch llama3-8b", m + " --format svg -o /nonexistent/dir/g.svg"}) {
    SCOPED_TRACE(args);
    std::string out;
    EXPECT_EQ(run_command(cli_path() + " " + args, &out), 1) << out;
    EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
}

}  // namespace
