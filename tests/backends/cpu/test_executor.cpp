// The CPU backend's plan compiler and executor on hand-built graphs: activation memory is reused (the arena is
// smaller than the sum of the activations) without ever overwriting a value that is still to be read, in-place ops
// copy their input when it lives on, and results equal the kernels called directly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backends/cpu/backend.h"
#include "backends/cpu/op_kernel.h"
#include "graph/graph.h"
#include "tessera/error.h"

namespace tessera::cpu {
namespace {

using graph::Op;
using graph::Role;

std::vector<float> rnd(std::mt19937& g, size_t n) {
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// x -> a = x W1ᵀ -> b = a + x -> c = swiglu(b, a) -> d = c W2ᵀ -> e = d + b (b and a are read after the ops that
// could have overwritten them in place).
TEST(Executor, ReusesMemoryWithoutClobberingLiveValues) {
  std::mt19937 g(5);
  const int64_t t = 6, k = 64;
  const auto w1 = rnd(g, size_t(k * k)), w2 = rnd(g, size_t(k * k)), xin = rnd(g, size_t(t * k));
  graph::Graph gr(t, 0);
  const int ids = gr.add_input("tokens", DType::I32, {t});
  const int table = gr.add_weight("table", DType::F32, {t, k}, xin.data());
  const int x = gr.add_node("x", Op::EMBED, Role::TOKEN_EMBD, -1, "embd", {table, ids});
  const int a = gr.add_node("a", Op::MATMUL, Role::ATTN_Q, 0, "attn", {x, gr.add_weight("w1", DType::F32, {k, k}, w1.data())});
  const int b = gr.add_node("b", Op::ADD, Role::ATTN_RESIDUAL, 0, "attn", {a, x});
  const int c = gr.add_node("c", Op::SWIGLU, Role::FFN_ACT, 0, "ffn", {b, a});
  const int d = gr.add_node("d", Op::MATMUL, Role::FFN_DOWN, 0, "ffn", {c, gr.add_weight("w2", DType::F32, {k, k}, w2.data())});
  gr.mark_output(gr.add_node("e", Op::ADD, Role::FFN_RESIDUAL, 0, "ffn", {d, b}));

  for (bool reference : {false, true}) {
    CpuBackend be({.n_threads = 2, .reference = reference}, nullptr);
    auto plan = be.compile(gr, {});
    auto* tok = static_cast<int32_t*>(plan->input("tokens"));
    for (int64_t i = 0; i < t; ++i) tok[i] = int32_t(t - 1 - i);  // reversed rows
    be.execute(*plan, 0);
    // Expected, with the kernels called directly on separate buffers.
    std::vector<float> ex(size_t(t * k)), ea(size_t(t * k)), eb, ec(size_t(t * k)), ed(size_t(t * k)), ee;
    for (int64_t i = 0; i < t; ++i) std::memcpy(&ex[size_t(i * k)], &xin[size_t((t - 1 - i) * k)], size_t(k) * 4);
    matmul_ref(DType::F32, w1.data(), ex.data(), ea.data(), t, k, k);
    eb = ea;
    add_ref(eb.data(), ex.data(), t * k);
    swiglu_ref(eb.data(), ea.data(), ec.data(), t * k);
    matmul_ref(DType::F32, w2.data(), ec.data(), ed.data(), t, k, k);
    ee = ed;
    add_ref(ee.data(), eb.data(), t * k);
    const float* out = plan->output("e");
    for (size_t i = 0; i < ee.size(); ++i) ASSERT_NEAR(out[i], ee[i], 1e-4 * (1 + std::fabs(ee[i]))) << i;
    // Six [t, k] activations and one input: reuse must keep the arena well below their sum.
    EXPECT_LT(plan->arena_bytes(), uint64_t(6 * t * k * 4));
  }
}

TEST(Executor, RejectsBadTokensAndUnboundCaches) {
  const int64_t k = 32;
  std::vector<float> table(size_t(4 * k), 0.5f);
  graph::Graph gr(2, 0);
  const int ids = gr.add_input("tokens", DType::I32, {2});
  gr.mark_output(gr.add_node("x", Op::EMBED, Role::TOKEN_EMBD, -1, "embd",
                             {gr.add_weight("table", DType::F32, {4, k}, table.data()), ids}));
  CpuBackend be({.n_threads = 2}, nullptr);
  auto plan = be.compile(gr, {});
  auto* tok = static_cast<int32_t*>(plan->input("tokens"));
  tok[0] = 1;
  tok[1] = 4;  // outside the 4-row table
  EXPECT_THROW(be.execute(*plan, 0), Error);
  tok[1] = 3;
  EXPECT_NO_THROW(be.execute(*plan, 0));
  EXPECT_THROW(plan->input("nope"), Error);

  graph::Graph gc(1, 0);
  const int x = gc.add_input("x", DType::F32, {1, 2 * 16});
  const int cache = gc.add_kv_cache("cache", DType::F16, {2, 8, 16});
  gc.set_io_role(cache, graph::IoRole::CACHE_K, 0);
  gc.add_node("store", Op::KV_STORE, Role::CACHE_K, 0, "attn", {x, cache}, {.n_head_kv = 2, .head_dim = 16});
  EXPECT_THROW(be.compile(gc, {}), Error);
  std::vector<uint16_t> storage(2 * 8 * 16);
  EXPECT_THROW(be.compile(gc, {{graph::IoRole::CACHE_K, 1, storage.data()}}), Error);  // another layer's cache
  auto p2 = be.compile(gc, {{graph::IoRole::CACHE_K, 0, storage.data()}});
  EXPECT_NO_THROW(be.execute(*p2, 7));
  EXPECT_THROW(be.execute(*p2, 8), Error);  // position 8 is past the cache
}

// An op with no dedicated step and no registered kernel (op_kernel.h) is unsupported, and compile() then fails with
// one sentence naming the node; the ops a model runs every token keep their dedicated steps and never go through the
// registry.
TEST(Executor, AnOpWithoutACpuKernelIsUnsupported) {
  graph::Graph g(2, 0);
  const int x = g.add_input("x", DType::F32, {2, 8});
  std::vector<graph::Tensor> ts = g.tensors();
  graph::Node n;  // a slice as the passes make it (the CPU declares no fusion, so it never gets one)
  n.name = "cols";
  n.op = Op::SLICE;
  n.inputs = {x};
  n.output = 1;
  n.params.slice_begin = 2;
  graph::Tensor out;
  out.name = "cols";
  out.shape = {2, 4};
  out.producer = 0;
  ts.push_back(out);
  g.replace_contents(ts, {n});
  CpuBackend be({.n_threads = 1}, nullptr);
  EXPECT_FALSE(be.supports(g.node(0), g));
  for (Op op : {Op::EMBED, Op::RMSNORM, Op::MATMUL, Op::ROPE, Op::KV_STORE, Op::ATTENTION, Op::ADD, Op::SWIGLU,
                Op::LAST_ROW, Op::SLICE})
    EXPECT_EQ(find_op_kernel(op), nullptr) << graph::op_name(op);
}

}  // namespace
}  // namespace tessera::cpu
