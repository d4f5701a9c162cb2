// Plan execution: one switch per step over resolved pointers. Ops whose kernels are single-threaded (norms, rope,
// elementwise, cache stores, and every reference kernel) are split over the pool by token when a chunk has enough
// tokens to pay for a dispatch; a decode step runs them inline on the calling thread.
#include <chrono>
#include <cstring>

#include "backends/cpu/backend.h"
#include "backends/cpu/kernels/lora.h"
#include "backends/cpu/op_kernel.h"
#include "backends/cpu/plan_step.h"
#include "core/error.h"

namespace tessera::cpu {

using graph::Op;

namespace {

// Below this many rows an elementwise op costs less than waking the other threads (~1-5 us).
constexpr int64_t kMinParallelRows = 4;
// An elementwise op over few rows is split by elements only past this many (decode rows are 576-1536 long).
constexpr int64_t kMinParallelElems = 1 << 16;

}  // namespace

void CpuBackend::run_step(const Plan::Step& s, int64_t n_past) {
  const bool ref = options_.reference;
  const bool split = s.t >= kMinParallelRows && pool_.n_threads() > 1;
  // fn(first_row, n_rows) over [0, s.t): split by rows over the pool when worth it.
  const auto by_rows = [&](auto&& fn) {
    if (split)
      pool_.parallel_range(s.t, [&](int64_t b, int64_t e, int) {
        if (e > b) fn(b, e - b);
      });
    else
      fn(int64_t{0}, s.t);
  };
  // fn(first, count) over [0, total) elements.
  const auto by_elems = [&](int64_t total, auto&& fn) {
    if (total >= kMinParallelElems && pool_.n_threads() > 1)
      pool_.parallel_range(total, [&](int64_t b, int64_t e, int) {
        if (e > b) fn(b, e - b);
      });
    else
      fn(int64_t{0}, total);
  };
  const graph::OpParams& p = s.p;
  switch (s.op) {
    case Op::EMBED:
      by_rows([&](int64_t r0, int64_t nr) {
        (ref ? embedding_ref : embedding)(s.w_dtype, s.w_raw, s.n, s.ids + r0, s.y + r0 * s.k, nr, s.k);
      });
      return;
    case Op::RMSNORM:
      by_rows([&](int64_t r0, int64_t nr) {
        (ref ? rmsnorm_ref : rmsnorm)(s.a + r0 * s.k, s.wf, s.y + r0 * s.k, nr, s.k, p.eps);
      });
      return;
    case Op::MATMUL_SPARSE:
      if (s.sw != nullptr) {
        matmul_sparse(pool_, *s.sw, s.a, s.y, s.t);
        return;
      }
      [[fallthrough]];
    case Op::MATMUL:
      if (!ref) {
        if (s.lora != nullptr)
          lora_matmul(pool_, *s.w, *s.lora->weights, s.a, s.y, s.lora->u.data(), s.t);
        else
          matmul(pool_, *s.w, s.a, s.y, s.t);
      } else {
        by_rows([&](int64_t r0, int64_t nr) {
          matmul_ref(s.w_dtype, s.w_raw, s.a + r0 * s.k, s.y + r0 * s.n, nr, s.n, s.k);
        });
      }
      return;
    case Op::ROPE:
      if (s.copy_a) std::memcpy(s.y, s.a, static_cast<size_t>(s.t * s.k) * sizeof(float));
      by_rows([&](int64_t r0, int64_t nr) {
        (ref ? rope_ref : rope)(s.y + r0 * s.k, nr, p.n_head, p.head_dim, p.rope_dim, s.ids + r0, s.wf, p.rope_neox);
      });
      return;
    case Op::KV_STORE:
      by_rows([&](int64_t r0, int64_t nr) {
        (ref ? kv_store_ref : kv_store)(s.kv_k, s.a + r0 * p.n_head_kv * p.head_dim, nr, p.n_head_kv, p.head_dim,
                                        n_past + r0);
      });
      return;
    case Op::ATTENTION: {
      const int64_t w = p.n_head * p.head_dim;
      if (!ref) {
        attention(pool_, s.a, s.kv_k, s.kv_v, s.y, s.t, p.n_head, p.n_head_kv, p.head_dim, n_past, p.attn_scale,
                  p.window);
      } else {
        // Token i of the chunk attends to [0, n_past + i] whichever thread computes it.
        by_rows([&](int64_t r0, int64_t nr) {
          attention_ref(s.a + r0 * w, s.kv_k, s.kv_v, s.y + r0 * w, nr, p.n_head, p.n_head_kv, p.head_dim, n_past + r0,
                        p.attn_scale, p.window);
        });
      }
      return;
    }
    case Op::ADD: {
      const int64_t total = s.t * s.n;
      by_elems(total, [&](int64_t e0, int64_t ne) {
        if (s.copy_a) std::memcpy(s.y + e0, s.a + e0, static_cast<size_t>(ne) * sizeof(float));
        (ref ? add_ref : add)(s.y + e0, s.b + e0, ne);
      });
      return;
    }
    case Op::SWIGLU:
      by_elems(s.t * s.n,
               [&](int64_t e0, int64_t ne) { (ref ? swiglu_ref : swiglu)(s.a + e0, s.b + e0, s.y + e0, ne); });
      return;
    case Op::LAST_ROW:
      std::memmove(s.y, s.a + (s.t - 1) * s.k, static_cast<size_t>(s.k) * sizeof(float));
      return;
    default:  // no dedicated step: the op's registered kernel (compile bound it; supports() checked there is one)
      s.kernel(*s.call, n_past, pool_);
      return;
  }
}

void CpuBackend::execute(Plan& plan, int64_t n_past) {
  const graph::Graph& g = plan.graph();
  const int64_t t = g.n_tokens();
  TESSERA_CHECK(n_past >= 0, "cpu backend: position {} is negative", n_past);
  // Positions are always n_past + i: written here so a caller cannot make rope and the cache disagree.
  if (g.find_role(graph::IoRole::POSITIONS) >= 0) {
    auto* pos = static_cast<int32_t*>(plan.input(graph::IoRole::POSITIONS));
    for (int64_t i = 0; i < t; ++i) pos[i] = static_cast<int32_t>(n_past + i);
  }
  // Everything a kernel would reject is checked before the first dispatch (exceptions must not leave pool tasks).
  for (const Plan::Step& s : plan.steps_) {
    if (s.op == Op::EMBED)
      for (int64_t i = 0; i < s.t; ++i)
        TESSERA_CHECK(s.ids[i] >= 0 && s.ids[i] < s.n, "token id {} is outside the vocabulary of {} tokens", s.ids[i],
                      s.n);
    if (s.op == Op::KV_STORE)
      TESSERA_CHECK(n_past + s.t <= s.kv_k.n_ctx, "the context is full: {} tokens at position {} exceed {}", s.t,
                    n_past, s.kv_k.n_ctx);
  }
  if (plan.tap != nullptr) {
    for (const Plan::Step& s : plan.steps_) {
      run_step(s, n_past);
      if (s.call != nullptr)  // a registered kernel's step: its pointers are in its binding
        (*plan.tap)(s.node, s.call->out_tensor->shape.empty() ? 0 : s.call->out_tensor->shape[0], n_past,
                    s.call->in.empty() ? nullptr : static_cast<const float*>(s.call->in[0]),
                    static_cast<float*>(s.call->out));
      else
        (*plan.tap)(s.node, s.t, n_past, s.a, s.y);
    }
    return;
  }
  if (plan.node_ns == nullptr) {
    for (const Plan::Step& s : plan.steps_) run_step(s, n_past);
    return;
  }
  plan.node_ns->resize(plan.steps_.size());
  const size_t threads = static_cast<size_t>(pool_.n_threads());
  std::vector<uint64_t> spans(2 * threads);
  if (plan.thread_spans != nullptr) plan.thread_spans->assign(g.nodes().size() * threads * 2, 0);
  for (const Plan::Step& s : plan.steps_) {
    if (plan.thread_spans != nullptr) {
      std::fill(spans.begin(), spans.end(), 0);
      pool_.set_task_spans(spans.data());
    }
    const auto t0 = std::chrono::steady_clock::now();
    run_step(s, n_past);
    const auto t1 = std::chrono::steady_clock::now();
    const auto ns = [](std::chrono::steady_clock::duration d) {
      return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
    };
    (*plan.node_ns)[static_cast<size_t>(s.node)] += ns(t1 - t0);
    if (plan.thread_spans != nullptr) {
      pool_.set_task_spans(nullptr);
      const uint64_t base = ns(t0.time_since_epoch());  // the pool's spans are steady-clock ns too
      uint64_t* out = plan.thread_spans->data() + static_cast<size_t>(s.node) * threads * 2;
      bool pooled = false;
      for (size_t th = 0; th < threads; ++th)
        if (spans[2 * th] != 0) {
          pooled = true;
          out[2 * th] = (spans[2 * th] > base ? spans[2 * th] - base : 0) + 1;
          out[2 * th + 1] = (spans[2 * th + 1] > base ? spans[2 * th + 1] - base : 0) + 1;
        }
      if (!pooled) {  // a step that ran inline on the calling thread (too small to split)
        out[0] = 1;
        out[1] = ns(t1 - t0) + 1;
      }
    }
  }
}

}  // namespace tessera::cpu
