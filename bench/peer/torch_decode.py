#!/usr/bin/env python3
"""PyTorch decode-speed peers for Tessera's CUDA decode, on random-weight bf16 Llama shapes.

Speed only: the values of the weights do not change the work, and the greedy length is forced (min_new_tokens).

Run on the GPU machine (scripts/gpu_check.sh does; python3 there has torch 2.11 + transformers 5.x):
    python3 bench/peer/torch_decode.py [--models llama3-8b,llama3.2-1b,smollm2-135m] [--batch 1,8,32]
        [--impls hf-eager,gptfast-compile[,hf-static-compile]] [--prompt 128] [--gen 256] [--repeats 3]
        [--prefill] [--sdpa] [--json FILE [--json-key KEY]]
Local test (CPU, tiny shapes, a few seconds apart from torch.compile's C++ build):
    python bench/peer/torch_decode.py --device cpu --tiny [--no-compile] --prefill --sdpa

Implementations (rows' "impl"):
  hf-eager           transformers' model.generate: greedy, DynamicCache, SDPA attention, no compile (disable_compile);
                     the decode time is (t(gen tokens) - t(1 token)) / (gen - 1), so the 128-token prefill cancels out.
  gptfast-compile    gpt-fast's recipe, written here in ~80 lines: static KV cache [B, n_kv, prompt+gen, head_dim] as
                     module buffers, fused wqkv and w1|w3 weights, one decode step (forward + argmax) compiled with
                     torch.compile(mode="reduce-overhead", fullgraph=True) (Inductor kernels replayed as CUDA graphs).
                     The prefill runs uncompiled and is not timed; each decode step is. Its prefill logits are
                     checked against transformers' forward on the same weights before it is timed (row "check").
                     If compiling fails, the same loop runs uncompiled as "gptfast-nocompile", with the error printed.
  hf-static-compile  transformers' own path to the same idea, off by default to keep the run short: generate with
                     cache_implementation="static", which compiles the decoding forward with
                     CompileConfig(mode="reduce-overhead") during the warm-up; generate's per-step Python stays.
--hf-dir DIR (repeatable) times a saved transformers folder of any family (e.g. python/hf_oracle.py's random
gemma3-270m case): the hf-* impls only, and with --prefill its eager forward over the --prompt tokens ("hf-forward").
Extras for the prefill issue: --prefill (transformers' forward of 2048 tokens at Llama-3-8B shape, batch 1, SDPA,
only the last position's logits: tok/s and TFLOP/s) and --sdpa (torch's scaled_dot_product_attention, causal, 32
query heads, 8 kv heads, head 128, bf16, at 2k/8k/16k tokens, per backend: TFLOP/s counting the causal half).

Every decode row: {model, impl, batch, prompt, gen, tok_s, ms_per_token, compile_s, check, agree_hf, ...}; tok_s
counts all sequences of the batch, ms_per_token is one decode step; agree_hf is the share of greedy tokens equal to
hf-eager's (bf16 near ties make long greedy runs drift apart: informative, not a check). Prefill and SDPA rows have
tok_s (prompt tokens per second), ms and tflops instead.
Timings: warm-up first, then the median of --repeats runs (CUDA synchronised wall clock). The JSON file is rewritten
after every row, so a run cut short keeps what it measured. Default run (3 models, batch 1, hf-eager +
gptfast-compile) is estimated at ~3.5 minutes on an H100, most of it torch.compile (~30-60 s a model).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
MODELS = {
    "llama3-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=14336, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, max_position_embeddings=8192),
    "llama3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                        intermediate_size=8192, vocab_size=128256, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING,
                        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072),
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, max_position_embeddings=8192),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=512, rope_theta=10000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=True, max_position_embeddings=1024),
    "tiny-untied": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                        intermediate_size=96, vocab_size=384, rope_theta=500000.0,
                        rope_scaling=dict(LLAMA3_SCALING, original_max_position_embeddings=64), rms_norm_eps=1e-5,
                        tie_word_embeddings=False, max_position_embeddings=1024),
}
FULL_MODELS = ["llama3-8b", "llama3.2-1b", "smollm2-135m"]
TINY_MODELS = ["tiny", "tiny-untied"]
IMPLS = ["hf-eager", "gptfast-compile", "hf-static-compile"]
DEFAULT_IMPLS = ["hf-eager", "gptfast-compile"]
# Prefill logits of the gpt-fast model vs transformers' forward, max |diff| / max |logit|: two bf16 forwards whose
# kernels round differently (fused vs separate GEMMs) each sit up to ~4e-2 from the exact result on these shapes
# (python/hf_oracle.py measured HF bf16 at 4.2e-2 on Llama-3.2-1B's), so up to ~8e-2 apart; a wrong rope sign, no
# rope or no causal mask gave 0.48..0.93 on the tiny shape.
CHECK_TOL = 0.15


class Timer:
    """Wall-clock seconds of fn(), synchronising the device around it (CUDA work is asynchronous)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn):
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t0, out


# --------------------------------------------------------------------------------------------------- HF model

def build_hf(spec: dict, device: str, dtype, attn: str = "sdpa"):
    """Random-weight LlamaForCausalLM built directly on the device in dtype (transformers' init, N(0, 0.02)), with
    q_proj and k_proj scaled as python/hf_oracle.py scales them (attention scores of std ~1.5 rather than nearly
    uniform attention), so that the prefill check below notices a wrong rope or mask. Speed does not depend on it."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(**spec, attn_implementation=attn, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: 8B of normal_() on the host would take minutes
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.to(device).eval().requires_grad_(False)
    qk_scale = (1.5 / (cfg.initializer_range ** 2 * cfg.hidden_size)) ** 0.5
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(qk_scale)
            layer.self_attn.k_proj.weight.mul_(qk_scale)
    model.generation_config.pad_token_id = 0
    return model


def load_hf_dir(path: str, device: str):
    """A saved transformers model folder (--hf-dir) in bf16 on the device; returns (model, {"vocab_size": ...})."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval().requires_grad_(False)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = 0
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return model, {"vocab_size": cfg.vocab_size}


def bench_forward(model, name: str, ids, repeats: int, timer: Timer) -> dict:
    """transformers' forward over the prompt (the prefill, eager, no cache kept), last position's logits only."""
    def fwd():
        return model(ids, use_cache=False, logits_to_keep=1)
    with torch.no_grad():
        timer(fwd)  # warm-up
        ts = [timer(fwd)[0] for _ in range(repeats)]
    t = statistics.median(ts)
    return {"model": name, "impl": "hf-forward", "batch": int(ids.shape[0]), "prompt": int(ids.shape[1]),
            "tok_s": ids.numel() / t, "ms": t * 1e3}


def hf_generate_timed(model, timer: Timer, ids, n: int, static_cc=None):
    """One greedy generate of exactly n new tokens; returns (seconds, output ids [B, P + n])."""
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(ids))
    if static_cc is None:
        kw["disable_compile"] = True
    else:
        kw["cache_implementation"] = "static"
        kw["compile_config"] = static_cc
    with torch.no_grad():
        return timer(lambda: model.generate(ids, **kw))


def bench_hf(model, impl: str, ids, gen: int, repeats: int, timer: Timer, device: str) -> dict:
    static_cc = None
    if impl == "hf-static-compile":
        from transformers import CompileConfig
        static_cc = CompileConfig(mode="reduce-overhead", fullgraph=False)
        if not device.startswith("cuda"):
            static_cc._compile_all_devices = True  # transformers compiles on CUDA only unless told so
    # Warm-up; with a static cache at full length: it compiles, and the cache it sizes (P + gen) is reused after.
    t_first, out = hf_generate_timed(model, timer, ids, gen if static_cc else min(gen, 16), static_cc)
    steps = []
    for _ in range(repeats):
        t_one, _ = hf_generate_timed(model, timer, ids, 1, static_cc)
        t_all, out = hf_generate_timed(model, timer, ids, gen, static_cc)
        steps.append((t_all - t_one) / (gen - 1))
    step = statistics.median(steps)
    return {"step_s": step, "first_s": t_first, "compile_s": max(t_first - t_one - step * (gen - 1), 0.0)
            if static_cc else None, "tokens": out[:, ids.shape[1]:]}


# ---------------------------------------------------------------------------------------- gpt-fast-style model

def rms_norm(x, w, eps: float):  # x [B, S, D], w [D]; f32 statistics as transformers computes them
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Block(nn.Module):
    def __init__(self, layer, n_head: int, n_kv: int, head_dim: int, eps: float, kv_shape, dtype):
        super().__init__()
        a, m = layer.self_attn, layer.mlp
        self.n_head, self.n_kv, self.head_dim, self.eps = n_head, n_kv, head_dim, eps
        # Fused as gpt-fast fuses them: one GEMV for q|k|v and one for gate|up (copies; the rest share storage).
        self.wqkv = nn.Parameter(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), False)
        # wqkv [(H + 2 KV) * hd, D]
        self.wo = nn.Parameter(a.o_proj.weight, False)                                     # [D, H * hd]
        self.w13 = nn.Parameter(torch.cat([m.gate_proj.weight, m.up_proj.weight]), False)  # [2F, D]
        self.w2 = nn.Parameter(m.down_proj.weight, False)                                  # [D, F]
        self.ln1 = nn.Parameter(layer.input_layernorm.weight, False)                       # [D]
        self.ln2 = nn.Parameter(layer.post_attention_layernorm.weight, False)              # [D]
        dev = a.q_proj.weight.device
        self.register_buffer("k_cache", torch.zeros(kv_shape, dtype=dtype, device=dev))  # [B, KV, max_seq, hd]
        self.register_buffer("v_cache", torch.zeros(kv_shape, dtype=dtype, device=dev))  # [B, KV, max_seq, hd]

    def forward(self, x, cos, sin, mask, input_pos):  # x [B, S, D]; cos, sin [S, hd]; mask [1, 1, S, max_seq]
        b, s, _ = x.shape
        hq, hkv, hd = self.n_head * self.head_dim, self.n_kv * self.head_dim, self.head_dim
        q, k, v = F.linear(rms_norm(x, self.ln1, self.eps), self.wqkv).split([hq, hkv, hkv], dim=-1)
        q = q.view(b, s, self.n_head, hd).transpose(1, 2)   # [B, H, S, hd]
        k = k.view(b, s, self.n_kv, hd).transpose(1, 2)     # [B, KV, S, hd]
        v = v.view(b, s, self.n_kv, hd).transpose(1, 2)     # [B, KV, S, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        rep = self.n_head // self.n_kv
        kk = self.k_cache.repeat_interleave(rep, dim=1)     # [B, H, max_seq, hd]
        vv = self.v_cache.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)  # [B, H, S, hd]
        x = x + F.linear(y.transpose(1, 2).reshape(b, s, hq), self.wo)
        gate, up = F.linear(rms_norm(x, self.ln2, self.eps), self.w13).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.w2)


class GptFast(nn.Module):
    """The decode model of gpt-fast (pytorch-labs), rebuilt over a transformers Llama's weights."""

    def __init__(self, hf, batch: int, max_seq: int):
        super().__init__()
        c = hf.config
        hd = c.hidden_size // c.num_attention_heads
        dtype = hf.model.embed_tokens.weight.dtype
        kv_shape = (batch, c.num_key_value_heads, max_seq, hd)
        self.layers = nn.ModuleList(Block(l, c.num_attention_heads, c.num_key_value_heads, hd, c.rms_norm_eps,
                                          kv_shape, dtype) for l in hf.model.layers)
        self.embed = nn.Parameter(hf.model.embed_tokens.weight, False)  # [V, D]
        self.norm = nn.Parameter(hf.model.norm.weight, False)           # [D]
        self.lm_head = nn.Parameter(hf.lm_head.weight, False)           # [V, D] (the embedding when tied)
        self.eps = c.rms_norm_eps
        rot = hf.model.rotary_emb  # transformers' f32 inverse frequencies (llama3 scaling applied) and scale
        pos = torch.arange(max_seq, device=rot.inv_freq.device, dtype=torch.float32)
        freqs = torch.outer(pos, rot.inv_freq.float())
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", (emb.cos() * rot.attention_scaling).to(dtype))  # [max_seq, hd]
        self.register_buffer("sin", (emb.sin() * rot.attention_scaling).to(dtype))  # [max_seq, hd]
        self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool,
                                                             device=rot.inv_freq.device)))  # [max_seq, max_seq]

    def forward(self, idx, input_pos):  # idx [B, S] int64, input_pos [S] int64 -> logits [B, S, V]
        x = F.embedding(idx, self.embed)
        cos, sin = self.cos[input_pos], self.sin[input_pos]
        mask = self.causal[input_pos][None, None]
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos)
        return F.linear(rms_norm(x, self.norm, self.eps), self.lm_head)


def decode_one(model, cur, input_pos):  # cur [B, 1], input_pos [1] -> next token [B, 1]
    return model(cur, input_pos)[:, -1].argmax(dim=-1, keepdim=True)


SAMPLE_TEMPERATURE, SAMPLE_TOP_K = 0.8, 40
SAMPLE = False  # --sample


def decode_one_sampled(model, cur, input_pos):
    """gpt-fast's sampling on the device: logits / temperature, top-k, softmax, and its sync-free draw (the argmax
    of p / q with q ~ Exp(1), which picks token i with probability p_i)."""
    logits = model(cur, input_pos)[:, -1].float() / SAMPLE_TEMPERATURE
    v, _ = torch.topk(logits, SAMPLE_TOP_K)
    logits = torch.where(logits < v[:, -1:], torch.full_like(logits, -float("inf")), logits)
    probs = torch.softmax(logits, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True)


def gptfast_generate(model, step, ids, gen: int, timer: Timer):
    """Prefill (uncompiled), then gen - 1 timed decode steps. Returns (seconds per step, tokens [B, gen])."""
    p = ids.shape[1]
    with torch.no_grad():
        nxt = model(ids, torch.arange(p, device=ids.device))[:, -1].argmax(dim=-1, keepdim=True)
        pos = torch.tensor([p], device=ids.device)
        toks = [nxt]

        def loop():
            cur = nxt
            for _ in range(gen - 1):
                cur = step(model, cur, pos).clone()  # a CUDA-graph output is overwritten by the next replay
                pos.add_(1)
                toks.append(cur)
        secs, _ = timer(loop)
    return secs / (gen - 1), torch.cat(toks, dim=1)


def check_gptfast(model, hf, ids) -> float:
    """Prefill logits of the gpt-fast model vs transformers' forward: max |diff| / max |ref| over all positions."""
    with torch.no_grad():
        ref = hf(input_ids=ids, use_cache=False).logits.float()                                  # [B, P, V]
        got = model(ids, torch.arange(ids.shape[1], device=ids.device)).float()                  # [B, P, V]
    return float((got - ref).abs().max() / ref.abs().max())


def release_compiled():
    """Drops compiled code and (torch._dynamo.reset does both) the CUDA-graph memory pool, which would otherwise
    keep the last model's buffers alive."""
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench_gptfast(hf, impl: str, ids, gen: int, repeats: int, timer: Timer, compile_ok: bool) -> dict:
    b, p = ids.shape
    model = GptFast(hf, b, -(-(p + gen) // 16) * 16)  # cache length a multiple of 16, as the SDPA kernels prefer
    rel = check_gptfast(model, hf, ids)
    check = f"{'ok' if rel <= CHECK_TOL else 'MISMATCH'} rel {rel:.1e}"
    one = decode_one_sampled if SAMPLE else decode_one
    step, used, note = one, "gptfast-nocompile", ""
    if compile_ok:
        torch._dynamo.reset()  # fresh caches per model: the compiled-code cache limit would otherwise be reached
        step = torch.compile(one, mode="reduce-overhead", fullgraph=True)
        used = "gptfast-compile"
    t0 = time.perf_counter()
    try:
        first, _ = gptfast_generate(model, step, ids, gen, timer)
    except Exception as e:  # noqa: BLE001 - any compiler failure: say so and measure the uncompiled loop instead
        if not compile_ok:
            raise
        note = f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); ran uncompiled"
        print(f"  {note}", flush=True)
        torch._dynamo.reset()
        step, used = one, "gptfast-nocompile"
        t0 = time.perf_counter()
        first, _ = gptfast_generate(model, step, ids, gen, timer)
    first_total = time.perf_counter() - t0
    steps, toks = [], None
    for _ in range(repeats):
        s, toks = gptfast_generate(model, step, ids, gen, timer)
        steps.append(s)
    st = statistics.median(steps)
    del model
    release_compiled()
    return {"step_s": st, "first_s": first_total, "compile_s": max(first_total - st * (gen - 1), 0.0)
            if used == "gptfast-compile" else None, "tokens": toks, "impl": used, "check": check, "note": note}


# ------------------------------------------------------------------------------------------ prefill and SDPA

def n_params(spec: dict, with_embed: bool) -> int:
    d, f, l = spec["hidden_size"], spec["intermediate_size"], spec["num_hidden_layers"]
    hd = d // spec["num_attention_heads"]
    per = d * hd * (2 * spec["num_attention_heads"] + 2 * spec["num_key_value_heads"]) + 3 * d * f
    return l * per + (spec["vocab_size"] * d if with_embed else 0)


def bench_prefill(spec: dict, name: str, device: str, t_len: int, repeats: int, timer: Timer) -> dict:
    model = build_hf(spec, device, torch.bfloat16)
    ids = torch.randint(0, spec["vocab_size"], (1, t_len), device=device)
    with torch.no_grad():
        fwd = lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1)  # noqa: E731
        timer(fwd)
        secs = statistics.median(timer(fwd)[0] for _ in range(repeats))
    d, l = spec["hidden_size"], spec["num_hidden_layers"]
    flops = 2 * n_params(spec, False) * t_len + 2 * spec["vocab_size"] * d + 2 * l * t_len * t_len * d  # causal attn
    return {"model": name, "impl": "hf-prefill-sdpa", "batch": 1, "prompt": t_len, "gen": 0,
            "tok_s": t_len / secs, "ms": secs * 1e3, "tflops": flops / secs / 1e12}


def bench_sdpa(lens: list[int], heads: tuple, device: str, repeats: int, timer: Timer) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    hq, hkv, hd = heads
    rows = []
    backends = [("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)] if device.startswith("cuda") else [("default", None)]
    for t in lens:
        q = torch.randn(1, hq, t, hd, device=device, dtype=torch.bfloat16)
        k = torch.randn(1, hkv, t, hd, device=device, dtype=torch.bfloat16)
        v = torch.randn(1, hkv, t, hd, device=device, dtype=torch.bfloat16)
        kx, vx = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
        flops = 4 * hq * t * t * hd / 2  # QK^T and PV, causal half
        for bname, backend in backends:
            for gqa in (True, False):
                fn = (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)) if gqa \
                    else (lambda: F.scaled_dot_product_attention(q, kx, vx, is_causal=True))
                label = f"sdpa-{bname}-{'gqa' if gqa else 'expanded'}"
                try:
                    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                        # Enough calls per timing that the synchronisation (~20 us) is noise next to the kernels.
                        inner = int(min(100, max(1, 5e-3 / max(timer(fn)[0], 1e-6))))
                        many = lambda: [fn() for _ in range(inner)]  # noqa: E731
                        secs = statistics.median(timer(many)[0] for _ in range(max(repeats, 5))) / inner
                except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is reported, not fatal
                    print(f"  {label} T={t}: not available ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
                    continue
                rows.append({"model": f"attn-{hq}q{hkv}kv-hd{hd}", "impl": label, "batch": 1, "prompt": t, "gen": 0,
                             "tok_s": t / secs, "ms": secs * 1e3, "tflops": flops / secs / 1e12})
                print(f"  {label:<24} T={t:<6} {secs * 1e3:8.3f} ms {flops / secs / 1e12:7.1f} TFLOP/s", flush=True)
    return rows


# ----------------------------------------------------------------------------------------------------- driver

class Report:
    def __init__(self, args, device: str):
        import transformers
        self.path, self.key = args.json, args.json_key
        name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
        self.doc = {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
                    "argv": sys.argv[1:], "rows": [], "errors": []}

    def add(self, row: dict):
        self.doc["rows"].append(row)
        self.write()

    def error(self, what: str):
        print(f"  ERROR {what}", flush=True)
        self.doc["errors"].append(what)
        self.write()

    def write(self):
        if not self.path:
            return
        doc = self.doc
        if self.key:  # merge into an existing JSON object (gpu_check.sh: at most 8 files come back from $OUT)
            try:
                with open(self.path) as f:
                    outer = json.load(f)
                if not isinstance(outer, dict):
                    outer = {"previous": outer}
            except (OSError, ValueError):
                outer = {}
            outer[self.key] = self.doc
            doc = outer
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, self.path)


def print_row(r: dict):
    extra = ""
    if r.get("compile_s") is not None:
        extra += f" compile {r['compile_s']:.0f}s"
    if r.get("check"):
        extra += f" check {r['check']}"
    if r.get("agree_hf") is not None:
        extra += f" greedy=hf {100 * r['agree_hf']:.0f}%"
    print(f"{r['model']:<14} {r['impl']:<19} {r['batch']:>5} {r['prompt']:>6} {r['gen']:>5} {r['tok_s']:>10.1f}"
          f" {r['ms_per_token']:>9.3f}{extra}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes for local testing")
    ap.add_argument("--models", help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--impls", default=",".join(DEFAULT_IMPLS), help=f"comma list of {', '.join(IMPLS)}")
    ap.add_argument("--batch", default="1", help="comma list of batch sizes, e.g. 1,8,32")
    ap.add_argument("--prompt", type=int, help="prompt tokens (default 128; 16 with --tiny)")
    ap.add_argument("--gen", type=int, help="generated tokens (default 256; 16 with --tiny)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sample", action="store_true",
                    help=f"gptfast rows sample each token on the device as gpt-fast does (temperature "
                         f"{SAMPLE_TEMPERATURE}, top-k {SAMPLE_TOP_K}) instead of the greedy argmax; impl names get "
                         f"'-sample'")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (gptfast runs uncompiled)")
    ap.add_argument("--prefill", action="store_true", help="also time HF prefill of 2048 tokens at Llama-3-8B shape")
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--sdpa", action="store_true", help="also time causal SDPA at 2k/8k/16k tokens")
    ap.add_argument("--sdpa-lens", default="2048,8192,16384")
    ap.add_argument("--hf-dir", action="append", default=[], metavar="DIR",
                    help="also time a saved transformers model folder (any family it reads, in bf16; repeatable): "
                         "the hf-* impls, and with --prefill its forward over --prompt tokens")
    ap.add_argument("--json", help="write the rows here (rewritten after every row)")
    ap.add_argument("--json-key", help="store the result under this key of the existing JSON object in --json")
    args = ap.parse_args()
    global SAMPLE
    SAMPLE = args.sample
    models = (args.models.split(",") if args.models else
              [] if args.hf_dir else TINY_MODELS if args.tiny else FULL_MODELS)  # --hf-dir alone: those folders only
    impls = args.impls.split(",") if args.impls else []
    for m in models:
        if m not in MODELS:
            print(f"torch_decode: unknown model '{m}' (known: {', '.join(MODELS)})", file=sys.stderr)
            return 2
    for i in impls:
        if i not in IMPLS:
            print(f"torch_decode: unknown impl '{i}' (known: {', '.join(IMPLS)})", file=sys.stderr)
            return 2
    batches = [int(b) for b in args.batch.split(",")]
    prompt = args.prompt or (16 if args.tiny else 128)
    gen = args.gen or (16 if args.tiny else 256)
    if gen < 2 or prompt < 1 or min(batches) < 1:
        print("torch_decode: --gen must be at least 2, --prompt and every --batch at least 1", file=sys.stderr)
        return 2
    device = args.device
    timer = Timer(device)
    report = Report(args, device)
    if "gptfast-compile" in impls and not args.no_compile:
        # Inductor says here when it cannot use CUDA graphs ("skipping cudagraphs due to ..."), which would make
        # the compiled peer launch-bound; the line lands in the log next to the row.
        torch._logging.set_logs(perf_hints=True)
    print(f"torch {torch.__version__} on {report.doc['device']}; prompt {prompt}, gen {gen}, repeats {args.repeats}")
    print(f"{'model':<14} {'impl':<19} {'batch':>5} {'prompt':>6} {'gen':>5} {'tok/s':>10} {'ms/step':>9}", flush=True)
    t_start = time.perf_counter()
    runs = [(m, None) for m in (models if impls else [])] + [(os.path.basename(d.rstrip("/")), d) for d in args.hf_dir]
    for m, hf_dir in runs:
        try:
            if hf_dir is None:
                spec = MODELS[m]
                hf = build_hf(spec, device, torch.bfloat16)
            else:
                hf, spec = load_hf_dir(hf_dir, device)
        except Exception as e:  # noqa: BLE001
            report.error(f"{m}: building the model failed: {type(e).__name__}: {e}")
            continue
        for b in batches:
            g = torch.Generator(device="cpu").manual_seed(b)
            ids = torch.randint(0, spec["vocab_size"], (b, prompt), generator=g).to(device)
            hf_tokens = None
            if hf_dir is not None and args.prefill:
                try:
                    r = bench_forward(hf, m, ids, args.repeats, timer)
                    report.add(r)
                    print(f"{r['model']:<14} {r['impl']:<19} {b:>5} {prompt:>6} {0:>5} {r['tok_s']:>10.1f}"
                          f" {r['ms']:>9.3f} ms/prefill", flush=True)
                except Exception as e:  # noqa: BLE001
                    report.error(f"{m} prefill batch {b}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            for impl in impls:
                if hf_dir is not None and not impl.startswith("hf-"):
                    continue  # the gpt-fast model is written for Llama's modules
                try:
                    if impl.startswith("hf-"):
                        r = bench_hf(hf, impl, ids, gen, args.repeats, timer, device)
                        r["impl"], r["check"], r["note"] = impl, "", ""
                        if impl == "hf-eager":
                            hf_tokens = r["tokens"]
                    else:
                        r = bench_gptfast(hf, impl, ids, gen, args.repeats, timer, not args.no_compile)
                        if SAMPLE:
                            r["impl"] += "-sample"
                except Exception as e:  # noqa: BLE001 - one failing peer must not lose the others' rows
                    report.error(f"{m} {impl} batch {b}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
                    continue
                row = {"model": m, "impl": r["impl"], "batch": b, "prompt": prompt, "gen": gen,
                       "tok_s": b / r["step_s"], "ms_per_token": r["step_s"] * 1e3,
                       "first_run_s": r["first_s"], "compile_s": r["compile_s"], "check": r["check"],
                       "note": r["note"], "agree_hf": None}
                if hf_tokens is not None and r["impl"] != "hf-eager" and not SAMPLE:
                    n = min(hf_tokens.shape[1], r["tokens"].shape[1])
                    row["agree_hf"] = float((hf_tokens[:, :n] == r["tokens"][:, :n]).float().mean())
                report.add(row)
                print_row(row)
        del hf
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.prefill and (args.models or not args.hf_dir):  # with --hf-dir alone, --prefill times those folders only
        spec = MODELS["tiny-untied" if args.tiny else "llama3-8b"]
        t_len = min(args.prefill_len, 256) if args.tiny else args.prefill_len
        try:
            r = bench_prefill(spec, "tiny-untied" if args.tiny else "llama3-8b", device, t_len, args.repeats, timer)
            report.add(r)
            print(f"{r['model']:<14} {r['impl']:<19} {1:>5} {t_len:>6} {0:>5} {r['tok_s']:>10.1f}"
                  f" {r['ms']:>9.3f} ms/prefill, {r['tflops']:.1f} TFLOP/s", flush=True)
        except Exception as e:  # noqa: BLE001
            report.error(f"prefill: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.sdpa:
        lens = [128, 256] if args.tiny else [int(x) for x in args.sdpa_lens.split(",")]
        heads = (4, 2, 16) if args.tiny else (32, 8, 128)
        try:
            for r in bench_sdpa(lens, heads, device, args.repeats, timer):
                report.add(r)
        except Exception as e:  # noqa: BLE001
            report.error(f"sdpa: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    report.doc["total_s"] = time.perf_counter() - t_start
    report.write()
    print(f"total {report.doc['total_s']:.0f}s; {len(report.doc['rows'])} rows, {len(report.doc['errors'])} errors")
    return 1 if report.doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
