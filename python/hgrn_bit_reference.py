#!/usr/bin/env python3
"""A numpy forward pass of the MatMul-free LM (Zhu et al. 2024, "Scalable MatMul-free Language Modeling"; model type
hgrn_bit), written from the paper and ridgerchu/matmulfreellm's code (mmfreelm/models/hgrn_bit/modeling_hgrn_bit.py,
mmfreelm/layers/hgrn_bit.py, mmfreelm/ops/fusedbitnet.py, mmfreelm/ops/hgrn/naive.py), whose package is not on PyPI
and needs Triton on a GPU. Everything is f32, as the public code computes it (its Triton kernels load and accumulate
in f32):

  BitLinear(x; W, n) = ActQuant(RMSNorm(x; n, eps=1e-6)) @ WeightQuant(W)^T     (FusedBitLinear: the fused kernel's
      eps default), ActQuant(y) = clip(round(y * s), -128, 127) / s with s = 127 / max(max|y|, 1e-5) per row,
      WeightQuant(W) = clip(round(W * s), -1, 1) / s with s = 1 / max(mean|W|, 1e-5) over the whole matrix
  per layer l (lb_l = cumsum(softmax(lower_bounds, over layers)) - softmax(...)[0], so lb_0 = 0):
      h = RMSNorm(x; attn_norm)
      i, f, g = BitLinear(h; i_proj), BitLinear(h; f_proj), BitLinear(h; g_proj)
      f = lb_l + (1 - lb_l) * sigmoid(f);  i = silu(i) * (1 - f)
      r_t = f_t * r_{t-1} + i_t  (r_{-1} = 0)                           the MLGRU's element-wise recurrence
      x = x + BitLinear(RMSNorm(g; g_norm) * r * sigmoid(r); o_proj)   FusedRMSNormSwishGate(g, r): g normalized,
                                                                        r the swish gate (the code's argument order)
      h = RMSNorm(x; mlp_norm);  gate, up = chunk(BitLinear(h; gate_proj), 2)
      x = x + BitLinear(silu(gate) * up; down_proj)
  logits = BitLinear(RMSNorm(x; norm); lm_head)
Weights are read by their Hugging Face names (model.layers.N.attn.i_proj.weight, ...norm.weight, ...).
"""
from __future__ import annotations

import numpy as np

F32 = np.float32


def rms_norm(x, w, eps):
    x = x.astype(F32)
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps))).astype(F32) * w.astype(F32)


def act_quant(x):
    s = F32(127.0) / np.maximum(np.max(np.abs(x), axis=-1, keepdims=True), F32(1e-5))
    return (np.clip(np.round(x * s), -128, 127) / s).astype(F32)


def weight_quant(w):
    w = w.astype(F32)
    s = F32(1.0) / max(F32(np.mean(np.abs(w.astype(np.float64)))), F32(1e-5))
    return (np.clip(np.round(w * s), -1, 1) / s).astype(F32)


def sigmoid(x):
    return (F32(1) / (F32(1) + np.exp(-x))).astype(F32)


def bit_linear(x, sd, name):
    y = act_quant(rms_norm(x, sd[name + ".norm.weight"], 1e-6))
    return (y @ weight_quant(sd[name + ".weight"]).T).astype(F32)


def lower_bounds(lb):
    p = np.exp(lb.astype(np.float64) - lb.max(axis=0, keepdims=True))
    p /= p.sum(axis=0, keepdims=True)
    return (np.cumsum(p, axis=0) - p[0]).astype(F32)


def forward(sd: dict, cfg: dict, ids) -> np.ndarray:
    """Logits [T, vocab] of ids, every row (teacher forcing from position 0)."""
    eps = cfg.get("rms_norm_eps", 1e-6)
    n_layers = cfg["num_hidden_layers"]
    x = sd["model.embeddings.weight"][np.asarray(ids)].astype(F32)
    lbs = lower_bounds(sd["model.lower_bounds"]) if cfg.get("use_lower_bound", True) else None
    for l in range(n_layers):
        p = f"model.layers.{l}."
        h = rms_norm(x, sd[p + "attn_norm.weight"], eps)
        i = bit_linear(h, sd, p + "attn.i_proj")
        f = sigmoid(bit_linear(h, sd, p + "attn.f_proj"))
        g = bit_linear(h, sd, p + "attn.g_proj")
        if lbs is not None and l > 0:
            f = lbs[l] + (F32(1) - lbs[l]) * f
        i = i * sigmoid(i) * (F32(1) - f)
        r = np.zeros_like(i)
        state = np.zeros(i.shape[1], F32)
        for t in range(i.shape[0]):
            state = f[t] * state + i[t]
            r[t] = state
        y = rms_norm(g, sd[p + "attn.g_norm.weight"], eps) * r * sigmoid(r)
        x = x + bit_linear(y, sd, p + "attn.o_proj")
        h = rms_norm(x, sd[p + "mlp_norm.weight"], eps)
        gu = bit_linear(h, sd, p + "mlp.gate_proj")
        gate, up = np.split(gu, 2, axis=-1)
        x = x + bit_linear(gate * sigmoid(gate) * up, sd, p + "mlp.down_proj")
    x = rms_norm(x, sd["model.norm.weight"], eps)
    return bit_linear(x, sd, "lm_head")
