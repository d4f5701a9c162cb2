#!/usr/bin/env python3
"""Independent numpy forward pass of a Llama-family GGUF model: the oracle for Tessera's f32 reference path.

Usage (prints the top-5 next tokens at the last position; used as a library by make_forward_golden.py):
  .venv/bin/python python/reference_forward.py [--model PATH] [--dtype float64|float32] TOKEN_ID [TOKEN_ID ...]

Weights come from the GGUF file through gguf-py only (GGUFReader + gguf.quants.dequantize, which is bit-exact with
ggml's dequantization); no Tessera code is used. Quantized weights are dequantized to float32 (exact: every q4_1 /
q8_0 value is representable in float32) and all arithmetic runs in float64 by default, so the reference's own
rounding error (~1e-15 relative) is far below the 1e-4 tolerance the C++ f32 path is held to, and the comparison
measures Tessera's error alone. --dtype float32 runs the same code in float32 for experiments.

The model, as llama.cpp defines it for LLM_ARCH_LLAMA:
  x = token_embd[ids]                                       [T, n_embd]
  per layer: h = rms_norm(x) * attn_norm; q,k,v = h Wq^T, h Wk^T, h Wv^T; rope(q, k); causal GQA softmax attention;
             x += attn Wo^T; h = rms_norm(x) * ffn_norm; x += (silu(h Wg^T) * (h Wu^T)) Wd^T
  logits = (rms_norm(x) * output_norm) Wout^T, Wout = output.weight, or token_embd.weight when tied.
RoPE: "normal" mode rotates pairs (2i, 2i+1) of each head (GGUF's llama q/k weights are permuted for it); "neox"
mode rotates pairs (i, i + rope_dim/2). Frequencies theta_i = base^(-2i/rope_dim), optionally divided by llama3
per-dimension factors (the GGUF's rope_freqs.weight tensor, or computed from the HF llama3 rule) or with positions
divided by a linear scaling factor.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np
try:  # gguf-py loads the weights; the helpers below (log_sum_exp, ...) need numpy only (the GPU machine has no gguf-py)
    from gguf import GGUFReader
    from gguf import quants as gguf_quants
except ImportError:  # pragma: no cover - only where gguf-py is absent
    GGUFReader = gguf_quants = None

DEFAULT_MODEL = os.path.join(os.path.expanduser(os.environ.get("TESSERA_HOME", "~/.cache/tessera/models")),
                             "SmolLM2-135M-Instruct.Q4_1.gguf")

# Architectures whose GGUF q/k weights are stored for "normal" (adjacent pairs) rope, as in llama.cpp's
# llama_model_rope_type(); every other family listed uses neox (split halves).
NORMAL_ROPE_ARCHS = {"llama", "mistral", "baichuan", "granite"}
NEOX_ROPE_ARCHS = {"qwen2", "qwen3", "phi3", "gemma", "gemma2", "falcon", "stablelm", "olmo2"}


@dataclass
class Config:
    arch: str
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_base: float
    rope_dim: int
    rope_neox: bool
    norm_eps: float
    rope_scaling: str = "none"          # "none", "linear", "llama3"
    rope_factor: float = 1.0
    llama3_low_freq_factor: float = 1.0
    llama3_high_freq_factor: float = 4.0
    llama3_original_ctx: int = 8192
    rope_freq_factors: np.ndarray | None = field(default=None, repr=False)  # [rope_dim/2] divisors of theta_i


def llama3_freq_factors(rope_dim: int, base: float, factor: float, low_freq_factor: float, high_freq_factor: float,
                        original_ctx: int) -> np.ndarray:
    """Per-dimension divisors of theta_i by the Llama 3.1 rule (as HF's _compute_llama3_parameters): wavelengths
    shorter than original_ctx/high_freq_factor keep their frequency, longer than original_ctx/low_freq_factor are
    divided by `factor`, and the band between is interpolated smoothly. Returns [rope_dim/2] float64."""
    inv_freq = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    wavelen = 2.0 * math.pi / inv_freq
    low_wavelen = original_ctx / low_freq_factor
    high_wavelen = original_ctx / high_freq_factor
    smooth = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    scaled = np.where(mid, (1.0 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    return inv_freq / scaled


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class Model:
    """Dequantized weights (float32 arrays, row-major [out, in] as stored) plus the config, from one GGUF file."""

    def __init__(self, path: str = DEFAULT_MODEL, cache_casts: bool = False):
        self.path = path
        # cache_casts keeps the float64 copies of the weights (about 1.1 GB for 135M parameters) so that repeated
        # forwards (greedy loops) do not re-cast them each time.
        self._casts: dict[tuple[str, str], np.ndarray] | None = {} if cache_casts else None
        reader = GGUFReader(path)
        arch = _field(reader, "general.architecture")
        if arch is None:
            raise ValueError(f"{path}: no general.architecture key; not a model GGUF")
        g = lambda k, d=None: _field(reader, f"{arch}.{k}", d)  # noqa: E731
        n_embd = int(g("embedding_length"))
        n_head = int(g("attention.head_count"))
        head_dim = int(g("attention.key_length", n_embd // n_head))
        self.tensors: dict[str, np.ndarray] = {}
        for t in reader.tensors:
            w = gguf_quants.dequantize(t.data, t.tensor_type)
            # GGUF lists dims innermost first; numpy's shape is outermost first: [out_features, in_features].
            self.tensors[t.name] = np.asarray(w, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        if arch in NORMAL_ROPE_ARCHS:
            neox = False
        elif arch in NEOX_ROPE_ARCHS:
            neox = True
        else:
            raise ValueError(f"{path}: architecture '{arch}' has no known rope mode in reference_forward.py")
        scaling = str(g("rope.scaling.type", "none"))
        vocab = self.tensors["token_embd.weight"].shape[0]
        self.config = Config(
            arch=arch, n_layers=int(g("block_count")), n_embd=n_embd, n_head=n_head,
            n_head_kv=int(g("attention.head_count_kv", n_head)), head_dim=head_dim,
            n_ff=int(g("feed_forward_length")), n_vocab=int(g("vocab_size", vocab)),
            rope_base=float(g("rope.freq_base", 10000.0)), rope_dim=int(g("rope.dimension_count", head_dim)),
            rope_neox=neox, norm_eps=float(g("attention.layer_norm_rms_epsilon")),
            rope_scaling=scaling, rope_factor=float(g("rope.scaling.factor", 1.0)),
            llama3_original_ctx=int(g("rope.scaling.original_context_length", 8192)),
        )
        if "rope_freqs.weight" in self.tensors:
            # Llama 3.1 GGUFs carry the llama3 factors precomputed; llama.cpp divides theta_i by them.
            self.config.rope_scaling = "llama3"
            self.config.rope_freq_factors = self.tensors["rope_freqs.weight"].astype(np.float64).reshape(-1)

    def weight(self, name: str) -> np.ndarray:
        w = self.tensors.get(name)
        if w is None:
            raise KeyError(f"{self.path}: tensor {name} missing")
        return w

    def output_weight(self) -> np.ndarray:
        # Tied embeddings (SmolLM2): no output.weight, the token embedding doubles as the output projection.
        return self.tensors.get("output.weight", self.tensors["token_embd.weight"])

    def weight_as(self, name: str, dtype) -> np.ndarray:
        if name == "output":
            w = self.output_weight()
        else:
            w = self.weight(name)
        if self._casts is None:
            return w.astype(dtype)
        key = (name, np.dtype(dtype).name)
        if key not in self._casts:
            self._casts[key] = w.astype(dtype)
        return self._casts[key]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    # x: [T, n_embd], w: [n_embd]
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * w.astype(x.dtype)


def rope_angles(cfg: Config, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape [T, rope_dim/2], computed in float64 whatever the forward dtype."""
    half = cfg.rope_dim // 2
    theta = cfg.rope_base ** (-2.0 * np.arange(half, dtype=np.float64) / cfg.rope_dim)
    pos = positions.astype(np.float64)
    if cfg.rope_scaling == "linear":
        pos = pos / cfg.rope_factor
    elif cfg.rope_scaling == "llama3":
        ff = cfg.rope_freq_factors
        if ff is None:
            ff = llama3_freq_factors(cfg.rope_dim, cfg.rope_base, cfg.rope_factor, cfg.llama3_low_freq_factor,
                                     cfg.llama3_high_freq_factor, cfg.llama3_original_ctx)
        theta = theta / ff
    elif cfg.rope_scaling not in ("none", ""):
        raise ValueError(f"rope scaling '{cfg.rope_scaling}' is not implemented in reference_forward.py")
    ang = pos[:, None] * theta[None, :]
    return np.cos(ang), np.sin(ang)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rope_dim: int, neox: bool) -> np.ndarray:
    # x: [T, n_heads, head_dim]; cos, sin: [T, rope_dim/2]. Dimensions past rope_dim pass through.
    out = x.copy()
    c = cos[:, None, :].astype(x.dtype)
    s = sin[:, None, :].astype(x.dtype)
    if neox:
        a, b = x[..., : rope_dim // 2], x[..., rope_dim // 2: rope_dim]
        out[..., : rope_dim // 2] = a * c - b * s
        out[..., rope_dim // 2: rope_dim] = a * s + b * c
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = a * c - b * s
        out[..., 1:rope_dim:2] = a * s + b * c
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal scaled-dot-product attention with grouped KV heads; the T queries are the last T of the S keys.
    q: [T, n_head, d]; k, v: [S, n_head_kv, d] (S >= T) -> [T, n_head * d]. Query head h reads KV head
    h // (n_head/n_head_kv), as ggml's broadcasting mul_mat does."""
    t, n_head, d = q.shape
    s = k.shape[0]
    group = n_head // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) / np.asarray(math.sqrt(d), dtype=q.dtype)  # [n_head, T, S]
    mask = np.triu(np.ones((t, s), dtype=bool), k=s - t + 1)
    scores = np.where(mask[None], -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p = p / p.sum(axis=-1, keepdims=True)
    out = np.einsum("hts,shd->thd", p, v)
    return out.reshape(t, n_head * d)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def forward(model: Model, token_ids, dtype=np.float64, last_only: bool = False,
            cache: list | None = None) -> np.ndarray:
    """Logits [T, n_vocab] (in `dtype`) for every position of token_ids, attending causally from position 0;
    [1, n_vocab] for the last position only when last_only. With `cache` (a list, initially empty, kept by the
    caller) the ids continue the tokens of earlier calls: their roped keys and values are read from and appended
    to it, so a greedy loop costs one token per step."""
    cfg = model.config
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError("token_ids must be a non-empty 1-D sequence")
    if ids.min() < 0 or ids.max() >= model.weight("token_embd.weight").shape[0]:
        raise ValueError("token id out of range of token_embd.weight")
    t = ids.size
    past = cache[0][0].shape[0] if cache else 0
    W = lambda name: model.weight_as(name, dtype)  # noqa: E731
    x = model.weight("token_embd.weight")[ids].astype(dtype)  # [T, n_embd]
    cos, sin = rope_angles(cfg, np.arange(past, past + t))
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        h = rms_norm(x, model.weight(p + "attn_norm.weight"), cfg.norm_eps)
        q = (h @ W(p + "attn_q.weight").T).reshape(t, cfg.n_head, cfg.head_dim)     # [T, n_head, d]
        k = (h @ W(p + "attn_k.weight").T).reshape(t, cfg.n_head_kv, cfg.head_dim)  # [T, n_head_kv, d]
        v = (h @ W(p + "attn_v.weight").T).reshape(t, cfg.n_head_kv, cfg.head_dim)  # [T, n_head_kv, d]
        q = apply_rope(q, cos, sin, cfg.rope_dim, cfg.rope_neox)
        k = apply_rope(k, cos, sin, cfg.rope_dim, cfg.rope_neox)
        if cache is not None:
            if len(cache) <= il:
                cache.append((k, v))
            else:
                cache[il] = (np.concatenate([cache[il][0], k]), np.concatenate([cache[il][1], v]))
                k, v = cache[il]
        x = x + attention(q, k, v) @ W(p + "attn_output.weight").T
        h = rms_norm(x, model.weight(p + "ffn_norm.weight"), cfg.norm_eps)
        g = h @ W(p + "ffn_gate.weight").T  # [T, n_ff]
        u = h @ W(p + "ffn_up.weight").T    # [T, n_ff]
        x = x + (silu(g) * u) @ W(p + "ffn_down.weight").T
    h = rms_norm(x[-1:] if last_only else x, model.weight("output_norm.weight"), cfg.norm_eps)
    return h @ W("output").T  # [T, n_vocab]


def greedy(model: Model, token_ids, n_gen: int, dtype=np.float64) -> tuple[list[int], list[float]]:
    """Greedy continuation: n_gen argmax ids (ties to the lowest id) and the top-2 logit gap at each step."""
    cache: list = []
    row = forward(model, token_ids, dtype, last_only=True, cache=cache)[0]
    out, gaps = [], []
    for step in range(n_gen):
        best = int(np.argmax(row))
        out.append(best)
        gaps.append(float(row[best] - np.partition(row, -2)[-2]))
        if step + 1 < n_gen:
            row = forward(model, [best], dtype, last_only=True, cache=cache)[0]
    return out, gaps


def log_sum_exp(logits: np.ndarray) -> np.ndarray:
    # logits: [..., n_vocab] -> [...], in float64
    l64 = logits.astype(np.float64)
    m = l64.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(l64 - m).sum(axis=-1, keepdims=True)))[..., 0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("ids", type=int, nargs="+")
    a = ap.parse_args(argv)
    model = Model(a.model)
    logits = forward(model, a.ids, dtype=np.dtype(a.dtype))
    last = logits[-1]
    top = np.argsort(-last)[:5]
    print(model.config)
    print("top-5 at last position:", [(int(i), float(last[i])) for i in top], "lse", float(log_sum_exp(last)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
