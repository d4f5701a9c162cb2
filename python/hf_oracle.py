#!/usr/bin/env python3
"""Hugging Face transformers oracle for Tessera's executors: random-weight Llama models and their reference logits.

Generate (on the GPU machine, whose python3 has torch + transformers; the HF-oracle hook in scripts/gpu_check.sh):
    python3 python/hf_oracle.py --out /tmp/hf_oracle [--device cuda] [--models smollm2-135m,llama3.2-1b]
                                [--dtypes bf16,f32] [--long] [--seed 0] [--dump-hf DUMP_DIR]
Compare Tessera's logits dumps with it (needs numpy only; prints one verdict line per case, exit 1 on any FAIL):
    python3 python/hf_oracle.py --ref /tmp/hf_oracle --compare DUMP_DIR [--json RESULT.json]
Local test (CPU, hidden 64, 2 layers; torch + transformers from PyPI in a scratch venv), HF's own dump as Tessera's:
    python python/hf_oracle.py --device cpu --tiny --out /tmp/o --dump-hf /tmp/d
    python python/hf_oracle.py --ref /tmp/o --compare /tmp/d          # every case PASSes

Models (random weights, seeded with torch.manual_seed on the CPU, so the same seed gives the same weights whatever
--device is). transformers' own init (every Linear and the embedding ~ N(0, initializer_range=0.02), norms = 1), then
q_proj and k_proj scaled so that attention scores have a standard deviation of about 1.5: with the plain init they
have sigma^2 * hidden = 0.23 for SmolLM2 (attention nearly uniform), and a wrong rope (theta / 10, or interleaved
instead of split-half pairs) or a wrong GQA head mapping then moves the logits by only 6e-2..1.7e-1 of their scale,
next to 2e-2 of bf16 noise; with scores of std 1.5 the same bugs move them by 0.5..0.8, and scores scaled by 1.1 by
0.12 (measured on SmolLM2's shape in f32: transformers' forward with the bug planted in weights or config).
  smollm2-135m  hidden 576, 30 layers, 9 heads, 3 kv heads, ffn 1536, vocab 49152, rope_theta 1e5, tied, eps 1e-5
  llama3.2-1b   hidden 2048, 16 layers, 32 heads, 8 kv heads, ffn 8192, vocab 128256, rope_theta 5e5 with llama3
                scaling (factor 32, low 1, high 4, original 8192), tied, eps 1e-5
  tiny, tiny-llama3 (--tiny)  hidden 64, 2 layers, 4 heads, 2 kv heads, ffn 128, vocab 512; the second with llama3
                rope; initializer_range 0.1 (with 0.02 the token's own embedding dominates so small a model and the
                top-1 is the input token at 99% of positions)
Each case is one model in one dtype (bf16 or f32); the bf16 weights are the f32 weights rounded to bf16.

Oracle directory (--out), one folder per case "<model>-<dtype>", e.g. smollm2-135m-bf16:
  manifest.json              every case: config, prompts, sanity statistics, HF's own error (hf_vs_truth), thresholds
  <case>/config.json, model.safetensors, generation_config.json   save_pretrained output (tied: no lm_head.weight)
  <case>/tokenizer.json      a small byte-level BPE (300 tokens; the model's vocab is padded above it, as real models
                             are), only so that Tessera can open the folder; prompts are token ids, never text
  <case>/prompts.json        {"prompts": [{"name": "len16", "ids": [..]}, ...]}: len16, len64 (len2048 with --long),
                             and batch0..batch7 (8 different prompts, 8..48 tokens, for a batched run)
  <case>/reference.npz       per prompt NAME: NAME.ids int32 [T]; NAME.topk_ids int32 [T, 32] and NAME.topk_logits
                             float32 [T, 32] (descending); NAME.lse float32 [T] (logsumexp over the whole vocab);
                             NAME.full_pos int32 [P] and NAME.full_logits float32 [P, vocab] (positions 0, T/2, T-1);
                             NAME.hf_top1 int32 [T] (the argmax of HF's forward in the case's own dtype)

The reference ("truth") is HF's eager forward of the saved weights in float64 (the bf16 weights upcast exactly), with
the rotary angles computed in float64 from float64 inverse frequencies. HF computes rotary angles in f32, which at
position 2047 is off by up to ~1e-4 rad, and runs RMSNorm and the attention softmax in f32 (relative error ~1e-7,
far below every threshold here). HF's forward in the case's own dtype is measured against the truth with the same
code as Tessera is (manifest: hf_vs_truth), so each verdict line shows what the established peer achieves.

Tessera's dump format (what --compare reads), one file per prompt:
  DUMP_DIR/<case>/<prompt>.npy   float32, little-endian, C order, shape [T, vocab]: row t = the raw logits (no
                                 softmax, temperature or penalty) after feeding ids[0..t] of that prompt from
                                 <case>/prompts.json (no BOS added, positions from 0). The reference ran each prompt
                                 alone, so the batch prompts check a batched run whatever its padding or packing.
  .npy layout: the 6 bytes "\\x93NUMPY", bytes 1 0 (version 1.0), a uint16 little-endian header length H, then H bytes
  of ASCII "{'descr': '<f4', 'fortran_order': False, 'shape': (T, V), }" padded with spaces and ending in "\\n" so
  that 10 + H is a multiple of 64, then T*V float32 values. Missing files are reported as missing, not as failures;
  a case with no dump at all is skipped.

Metrics (per case, over every position of every dumped prompt):
  top1        fraction of positions where Tessera's argmax is the reference top-1
  top1_tie    the same, also counting a different argmax whose reference logit lies within the logit tolerance of
              the reference maximum (random-weight models have near-flat distributions with near ties that a
              correct implementation in bf16 may break either way); the verdict uses this one
  kl          mean exact KL(ref || tessera) over the full-logit positions, in nats; kl_topk: mean over all positions
              of the KL coarse-grained to the reference top-32 plus one "rest" bucket (a lower bound of the true KL)
  rel         max over positions of max_i |tessera_i - ref_i| / max_i |ref_i| (i over the top-32, or the whole vocab
              at full-logit positions): logit error relative to the position's logit scale; rel_mean: its mean
Verdict: PASS when top1_tie >= 99% and rel <= TOL[dtype] (and every value is finite):
  f32   1e-3: f32 has 24-bit significands (u = 6e-8); a forward of L <= 30 layers with dot products of length up to
        8192 accumulates ~1e-6..1e-5 relative error in any summation order (HF f32 measured 1.3e-6 on SmolLM2's shape
        and 4.3e-6 on Llama-3.2-1B's),
        plus up to ~1e-4 rad from f32 rotary angles at long positions; 1e-3 leaves 10x over that and still catches
        every bug tried (rope, GQA mapping, attention scale off by 10%: 1.2e-1 and more).
  bf16  8e-2: bf16 has 8-bit significands (u = 2^-9 = 2e-3); activations are rounded at every op boundary (~10 per
        layer) and independent roundings add as a random walk: sqrt(10 * 30) * 2e-3 = 3.5e-2 for 30 layers, before
        any growth through the layers. HF's own bf16 forward (CPU, 64-token prompts) measured 1.9e-2 on SmolLM2's shape
        and 4.2e-2 on Llama-3.2-1B's (3.7e-2 on the top-32 alone, 3e-2 RMS over the vocab), so the 2e-2 one might
        expect fails the established peer itself. 8e-2 is 2x HF's worst and still 1.5x below the smallest bug tried
        (attention scores x1.1: 0.12) and 6x below a wrong rope, mask or GQA mapping (0.5 and more).
top-1 alone cannot be the criterion in bf16: these random models' distributions are nearly flat (median gap between
the two best logits 3-4% of the logit scale), and HF's own bf16 forward picks the reference top-1 at only 89-97% of
positions, every miss being a near tie; hence the tie-aware rate, with the tie margin equal to the logit tolerance.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

TOPK = 32
TOL = {"f32": 1e-3, "bf16": 8e-2}
ATTN_SCORE_STD = 1.5  # target std of q.k / sqrt(head_dim) at init (see the docstring)
TOP1_MIN = 0.99

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
MODELS = {
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, max_position_embeddings=8192, bos_token_id=1, eos_token_id=2),
    "llama3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                        intermediate_size=8192, vocab_size=128256, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING,
                        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072,
                        bos_token_id=128000, eos_token_id=128001),
    "tiny": dict(initializer_range=0.1, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=512, rope_theta=10000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=True, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
    "tiny-llama3": dict(initializer_range=0.1, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=128, vocab_size=512, rope_theta=500000.0,
                        rope_scaling=dict(LLAMA3_SCALING, original_max_position_embeddings=64), rms_norm_eps=1e-5,
                        tie_word_embeddings=True, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
    # Families beyond Llama ("family" picks the transformers classes; every other key is the config's). Their norm
    # weights are drawn at random (FAMILY_NORM_INIT) so that a wrong norm convention, Gemma's (1 + w) above all, moves
    # the logits; the sliding windows are shorter than the 64-token prompt so that the window drops keys.
    "tiny-gemma3": dict(family="gemma3", initializer_range=0.1, hidden_size=64, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                        vocab_size=512, query_pre_attn_scalar=24, sliding_window=12,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
                        final_logit_softcapping=30.0, tie_word_embeddings=True, max_position_embeddings=4096,
                        bos_token_id=2, eos_token_id=1, pad_token_id=0),
    "tiny-qwen2": dict(family="qwen2", initializer_range=0.1, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
    "tiny-qwen3": dict(family="qwen3", initializer_range=0.1, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=128,
                       vocab_size=512, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                       max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
    "tiny-mistral": dict(family="mistral", initializer_range=0.1, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                         rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=20, tie_word_embeddings=False,
                         max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
    "tiny-phi3": dict(family="phi3", initializer_range=0.1, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                      rope_theta=10000.0, partial_rotary_factor=0.5, rms_norm_eps=1e-5, sliding_window=24,
                      tie_word_embeddings=False, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0),
    # Real shapes (GPU machine): Gemma 3 270M, Qwen2.5 0.5B, Qwen3 0.6B.
    "gemma3-270m": dict(family="gemma3", hidden_size=640, num_hidden_layers=18, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=256, intermediate_size=2048, vocab_size=262144,
                        query_pre_attn_scalar=256, sliding_window=512, rope_theta=1000000.0,
                        rope_local_base_freq=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                        max_position_embeddings=32768, bos_token_id=2, eos_token_id=1, pad_token_id=0),
    "qwen2.5-0.5b": dict(family="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, rope_theta=1000000.0,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768,
                         bos_token_id=151643, eos_token_id=151643),
    "qwen3-0.6b": dict(family="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645),
}
FULL_MODELS = ["smollm2-135m", "llama3.2-1b"]
TINY_MODELS = ["tiny", "tiny-llama3"]
FAMILY_FULL_MODELS = ["gemma3-270m", "qwen2.5-0.5b", "qwen3-0.6b"]
FAMILY_TINY_MODELS = ["tiny-gemma3", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-phi3"]
# transformers classes per family: (config class, model class).
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
            "mistral": ("MistralConfig", "MistralForCausalLM"), "phi3": ("Phi3Config", "Phi3ForCausalLM")}
# Norm weights of the non-Llama families: Gemma's are offsets around 0 (the norm multiplies by 1 + w), the others'
# factors around 1; uniform over +-0.5 around that.
FAMILY_NORM_INIT = 0.5

# Sanity limits for a random model's reference (checked at generation, failing it): a model whose top-1 is (nearly)
# the same token everywhere, or (nearly) always the input token itself, cannot tell a correct forward from a wrong one.
MIN_DISTINCT_TOP1 = 0.15   # distinct top-1 ids / min(positions, vocab), prompts of <= 256 tokens (SmolLM2: 0.38, 1B: 0.99)
MAX_COPY_TOP1 = 0.90       # positions whose top-1 is the token just fed


def fail(msg: str):
    print(f"hf_oracle: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------------------- prompts

def make_prompts(seed: int, vocab: int, long: bool) -> list[dict]:
    rng = np.random.default_rng([seed, vocab])
    lengths = [("len16", 16), ("len64", 64)] + ([("len2048", 2048)] if long else [])
    out = [{"name": n, "ids": rng.integers(0, vocab, size=t).tolist()} for n, t in lengths]
    for b, t in enumerate(rng.integers(8, 49, size=8)):
        out.append({"name": f"batch{b}", "ids": rng.integers(0, vocab, size=int(t)).tolist()})
    return out


def full_positions(t: int) -> list[int]:
    return sorted({0, t // 2, t - 1})


# ------------------------------------------------------------------------------------------------------- comparison

def logsumexp_rows(x: np.ndarray) -> np.ndarray:  # x [R, V] -> [R], in float64
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return (m[:, 0] + np.log(np.exp(x - m).sum(axis=1)))


def compare_prompt(ref: dict, cand: np.ndarray, tol: float) -> dict:
    """ref: one prompt's reference arrays (keys as in reference.npz without the prompt prefix);
    cand [T, V] float32: a candidate's logits. Returns per-position sums and extremes for aggregation."""
    topk_ids, topk_logits, lse = ref["topk_ids"], ref["topk_logits"].astype(np.float64), ref["lse"].astype(np.float64)
    t_len, k = topk_ids.shape
    full_pos = [int(p) for p in ref["full_pos"]]
    full_logits = ref["full_logits"]
    r = {"positions": t_len, "top1": 0, "top1_tie": 0, "kl_topk_sum": 0.0, "kl_full_sum": 0.0, "kl_full_n": 0,
         "kl_full_max": 0.0, "rel_max": 0.0, "rel_sum": 0.0, "rel_argmax": 0, "hf_top1": 0, "nonfinite": 0}
    chunk = 256  # rows at a time: a [2048, 128256] dump is 1 GB, its float64 copy would be 2 GB
    for c0 in range(0, t_len, chunk):
        c = np.asarray(cand[c0:c0 + chunk], dtype=np.float32)
        rows = c.shape[0]
        finite = np.isfinite(c).all(axis=1)
        r["nonfinite"] += int((~finite).sum())
        c = np.where(np.isfinite(c), c, np.float32(0.0))
        c_top1 = c.argmax(axis=1)
        c_lse = logsumexp_rows(c)
        for j in range(rows):
            t = c0 + j
            ids = topk_ids[t]
            scale = max(float(np.abs(topk_logits[t]).max()), 1e-30)
            match = c_top1[j] == ids[0] and finite[j]
            r["top1"] += int(match)
            r["hf_top1"] += int(c_top1[j] == ref["hf_top1"][t])
            tie = match
            if not match and finite[j]:
                where = np.nonzero(ids == c_top1[j])[0]
                tie = where.size > 0 and topk_logits[t, 0] - topk_logits[t, where[0]] <= tol * scale
            r["top1_tie"] += int(tie)
            cl = c[j, ids].astype(np.float64)
            rel = float(np.abs(cl - topk_logits[t]).max()) / scale
            logp = topk_logits[t] - lse[t]
            logq = cl - c_lse[j]
            p, q = np.exp(logp), np.exp(logq)
            kl = float((p * (logp - logq)).sum())
            p_rest, q_rest = 1.0 - p.sum(), 1.0 - q.sum()
            if p_rest > 1e-12:
                kl += p_rest * math.log(p_rest / max(q_rest, 1e-300))
            r["kl_topk_sum"] += max(kl, 0.0)
            if t in full_pos:
                ref_row = full_logits[full_pos.index(t)].astype(np.float64)
                scale_full = max(float(np.abs(ref_row).max()), 1e-30)
                rel = max(rel, float(np.abs(c[j].astype(np.float64) - ref_row).max()) / scale_full)
                logp_all = ref_row - lse[t]
                logq_all = c[j].astype(np.float64) - c_lse[j]
                kl_full = max(float((np.exp(logp_all) * (logp_all - logq_all)).sum()), 0.0)
                r["kl_full_sum"] += kl_full
                r["kl_full_n"] += 1
                r["kl_full_max"] = max(r["kl_full_max"], kl_full)
            if not finite[j]:
                rel = float("inf")
            r["rel_sum"] += rel
            if rel > r["rel_max"]:
                r["rel_max"], r["rel_argmax"] = rel, t
    return r


def aggregate(per_prompt: dict, dtype: str) -> dict:
    n = sum(p["positions"] for p in per_prompt.values())
    if n == 0:
        return {"positions": 0, "verdict": "MISSING"}
    kl_n = sum(p["kl_full_n"] for p in per_prompt.values())
    worst = max(per_prompt, key=lambda k: per_prompt[k]["rel_max"])
    a = {"positions": n, "prompts": len(per_prompt),
         "top1": sum(p["top1"] for p in per_prompt.values()) / n,
         "top1_tie": sum(p["top1_tie"] for p in per_prompt.values()) / n,
         "top1_vs_hf": sum(p["hf_top1"] for p in per_prompt.values()) / n,
         "kl": sum(p["kl_full_sum"] for p in per_prompt.values()) / max(kl_n, 1),
         "kl_max": max(p["kl_full_max"] for p in per_prompt.values()),
         "kl_topk": sum(p["kl_topk_sum"] for p in per_prompt.values()) / n,
         "rel": max(p["rel_max"] for p in per_prompt.values()),
         "rel_mean": sum(p["rel_sum"] for p in per_prompt.values()) / n,
         "worst": f"{worst}@{per_prompt[worst]['rel_argmax']}",
         "nonfinite": sum(p["nonfinite"] for p in per_prompt.values()),
         "tol": TOL[dtype], "top1_min": TOP1_MIN}
    ok = a["nonfinite"] == 0 and a["top1_tie"] >= TOP1_MIN and a["rel"] <= TOL[dtype]
    a["verdict"] = "PASS" if ok else "FAIL"
    return a


def fmt_metrics(a: dict) -> str:
    if a.get("positions", 0) == 0:
        return "no positions"
    s = (f"top1 {100 * a['top1']:.1f}% (tie-aware {100 * a['top1_tie']:.1f}%, need >= {100 * a['top1_min']:.0f}%)"
         f" KL {a['kl']:.2e} (top-k {a['kl_topk']:.2e}) rel {a['rel']:.2e} (mean {a['rel_mean']:.1e},"
         f" limit {a['tol']:.0e}, worst {a['worst']})")
    if a["nonfinite"]:
        s += f" NON-FINITE rows {a['nonfinite']}"
    return s


def load_reference(case_dir: str) -> dict:
    z = np.load(os.path.join(case_dir, "reference.npz"))
    refs: dict[str, dict] = {}
    for key in z.files:
        name, field = key.split(".", 1)
        refs.setdefault(name, {})[field] = z[key]
    return refs


def compare_case(case: dict, case_dir: str, dump_dir: str) -> tuple[dict, list[str]]:
    refs = load_reference(case_dir)
    per_prompt, missing = {}, []
    vocab = case["config"]["vocab_size"]
    for p in case["prompts"]:
        path = os.path.join(dump_dir, p["name"] + ".npy")
        if not os.path.exists(path):
            missing.append(p["name"])
            continue
        cand = np.load(path, mmap_mode="r")
        want = (p["length"], vocab)
        if cand.dtype != np.float32 or cand.ndim != 2 or tuple(cand.shape) != want:
            fail(f"{path}: expected float32 {list(want)}, found {cand.dtype} {list(cand.shape)}")
        per_prompt[p["name"]] = compare_prompt(refs[p["name"]], cand, TOL[case["dtype"]])
    return aggregate(per_prompt, case["dtype"]), missing


def run_compare(args) -> int:
    with open(os.path.join(args.ref, "manifest.json")) as f:
        manifest = json.load(f)
    results, any_fail, any_case = [], False, False
    for case in manifest["cases"]:
        dump_dir = os.path.join(args.compare, case["name"])
        if not os.path.isdir(dump_dir):
            print(f"{case['name']:<22} SKIP (no {dump_dir})")
            continue
        any_case = True
        a, missing = compare_case(case, os.path.join(args.ref, case["dir"]), dump_dir)
        a["case"], a["missing"] = case["name"], missing
        hf = case["hf_vs_truth"]
        miss = f" missing {','.join(missing)}" if missing else ""
        print(f"{case['name']:<22} {a['verdict']} {fmt_metrics(a)}{miss}")
        print(f"{'':<22} (HF {case['dtype']}: top1 {100 * hf['top1']:.1f}% tie-aware {100 * hf['top1_tie']:.1f}%"
              f" KL {hf['kl']:.2e} rel {hf['rel']:.2e}; Tessera vs HF top-1 {100 * a.get('top1_vs_hf', 0):.1f}%)")
        any_fail |= a["verdict"] != "PASS"
        results.append(a)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ref": os.path.abspath(args.ref), "dump": os.path.abspath(args.compare), "cases": results}, f,
                      indent=1)
    if not any_case:
        print("hf_oracle: no case of the manifest has a dump folder", file=sys.stderr)
        return 1
    return 1 if any_fail else 0


def write_npy(path: str, a: np.ndarray):
    np.save(path, np.ascontiguousarray(a, dtype=np.float32))


# ------------------------------------------------------------------------------------------------------- generation

def rope_inv_freq64(spec: dict) -> np.ndarray:
    """Rotary inverse frequencies in float64 ([head_dim/2]), llama3 scaling included (Meta's rule, as HF applies it)."""
    hd = spec["hidden_size"] // spec["num_attention_heads"]
    inv = 1.0 / (spec["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    rs = spec.get("rope_scaling")
    if rs:
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv


def family_of(spec: dict) -> str:
    return spec.get("family", "llama")


def make_config(spec: dict):
    import transformers
    cls = getattr(transformers, FAMILIES[family_of(spec)][0])
    kw = {k: v for k, v in spec.items() if k != "family"}
    if family_of(spec) == "gemma3":
        # transformers 5.x takes Gemma 3's two rope bases as one set per layer type.
        kw["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": kw.pop("rope_theta")},
            "sliding_attention": {"rope_type": "default", "rope_theta": kw.pop("rope_local_base_freq")}}
    return cls(**{"initializer_range": 0.02, **kw}, attn_implementation="eager")


def make_model(spec: dict, cfg):
    import transformers
    return getattr(transformers, FAMILIES[family_of(spec)][1])(cfg)


def write_tokenizer(d: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([__doc__] * 4, trainer=trainer)
    tok.save(os.path.join(d, "tokenizer.json"))


class Rope64:
    """Replaces HF's rotary embedding forward in the truth pass: angles in float64 from float64 frequencies."""

    def __init__(self, torch, inv_freq64: np.ndarray, scaling: float):
        self.torch, self.inv, self.scaling = torch, torch.from_numpy(inv_freq64), scaling

    def __call__(self, x, position_ids):  # x [B, T, hidden], position_ids [B, T] -> cos, sin [B, T, head_dim]
        torch = self.torch
        freqs = position_ids.to(torch.float64)[..., None] * self.inv.to(x.device)[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(x.dtype), (emb.sin() * self.scaling).to(x.dtype)


def shape_init(torch, model, cfg, spec: dict) -> float:
    """The oracle's changes to transformers' init (see the docstring): q/k projections scaled for attention scores of
    std ATTN_SCORE_STD; for the non-Llama families, norm weights and biases drawn at random. Returns the q/k scale."""
    qk_scale = math.sqrt(ATTN_SCORE_STD / (cfg.initializer_range ** 2 * cfg.hidden_size))
    with torch.no_grad():
        for layer in model.model.layers:
            at = layer.self_attn
            if hasattr(at, "qkv_proj"):  # Phi-3: q and k are the first (H + Hkv) * D rows of the fused q|k|v
                qk = (cfg.num_attention_heads + cfg.num_key_value_heads) * at.head_dim
                at.qkv_proj.weight[:qk].mul_(qk_scale)
            else:
                at.q_proj.weight.mul_(qk_scale)
                at.k_proj.weight.mul_(qk_scale)
        if family_of(spec) != "llama":
            # Biases (Qwen2's q/k/v) and norm weights at random: a missing bias or a wrong norm offset shows.
            center = 0.0 if family_of(spec) == "gemma3" else 1.0
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.uniform_(center - FAMILY_NORM_INIT, center + FAMILY_NORM_INIT)
                elif name.endswith(".bias"):
                    p.normal_(0.0, 0.5)
    return qk_scale


def rotary_buffers(model) -> dict:
    """The rotary embedding's inverse-frequency buffers by name (Llama: inv_freq, original_inv_freq; Gemma 3: one
    pair per layer type)."""
    rot = model.model.rotary_emb
    return {n: b for n, b in rot.named_buffers(recurse=False) if "inv_freq" in n}


def set_dtype(torch, model, dtype, inv_freq32):
    """model.to(dtype), keeping the rotary inverse frequencies in f32 as from_pretrained leaves them (Module.to would
    round them to bf16 too, an error a real HF bf16 run does not have). inv_freq32: rotary_buffers() in f32."""
    model.to(dtype)
    rot = model.model.rotary_emb
    for n, b in inv_freq32.items():
        setattr(rot, n, b.clone().to(b.device))


def forward_logits(torch, model, ids: list[int], device: str):  # -> logits [T, V] on device, model dtype
    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long, device=device)
        return model(input_ids=x, use_cache=False).logits[0]


def sanity_stats(torch, logits, ids: list[int]) -> dict:  # logits [T, V] float64
    top2 = logits.topk(2, dim=-1)
    top1 = top2.indices[:, 0]
    p = torch.softmax(logits, dim=-1)
    ent = -(p * torch.log_softmax(logits, dim=-1)).sum(-1)
    gap = (top2.values[:, 0] - top2.values[:, 1]) / logits.abs().max(dim=-1).values
    return {"top1": top1.cpu().tolist(), "copy": int((top1.cpu() == torch.tensor(ids)).sum()),
            "entropy": ent.cpu().tolist(), "gap_rel": gap.cpu().tolist(),
            "logit_std": float(logits.std(dim=-1).mean()), "logit_max": float(logits.max(dim=-1).values.mean())}


def generate_case(torch, model, name: str, dtype: str, spec: dict, prompts: list[dict], args, rope64,
                  inv_freq32) -> dict:
    tdtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    case_dir = os.path.join(args.out, name)
    os.makedirs(case_dir, exist_ok=True)
    set_dtype(torch, model, tdtype, inv_freq32)
    t0 = time.time()
    model.save_pretrained(case_dir, max_shard_size="100GB")
    write_tokenizer(case_dir)
    with open(os.path.join(case_dir, "prompts.json"), "w") as f:
        json.dump({"prompts": prompts}, f)
    print(f"[{name}] saved ({time.time() - t0:.1f}s)", flush=True)

    # HF in the case's dtype, on the device: the peer whose own error is recorded.
    t0 = time.time()
    hf = {}
    for p in prompts:
        hf[p["name"]] = forward_logits(torch, model, p["ids"], args.device).float().cpu().numpy()
    t_hf = time.time() - t0

    # Truth: float64 forward of the very same weights (bf16 -> f64 is exact), float64 rotary angles (Llama's rotary
    # module; the other families' angles are HF's f32 ones, ~1e-7 relative at the prompts' positions).
    set_dtype(torch, model, torch.float64, inv_freq32)
    hf_rope = model.model.rotary_emb.forward
    if rope64 is not None:
        model.model.rotary_emb.forward = rope64
    t0 = time.time()
    arrays, stats = {}, []
    for p in prompts:
        t_len = len(p["ids"])
        logits = forward_logits(torch, model, p["ids"], args.device)  # [T, V] float64
        top = logits.topk(TOPK, dim=-1)
        fp = full_positions(t_len)
        n = p["name"]
        arrays[f"{n}.ids"] = np.asarray(p["ids"], dtype=np.int32)
        arrays[f"{n}.topk_ids"] = top.indices.cpu().numpy().astype(np.int32)
        arrays[f"{n}.topk_logits"] = top.values.float().cpu().numpy()
        arrays[f"{n}.lse"] = torch.logsumexp(logits, dim=-1).float().cpu().numpy()
        arrays[f"{n}.full_pos"] = np.asarray(fp, dtype=np.int32)
        arrays[f"{n}.full_logits"] = logits[fp].float().cpu().numpy()
        arrays[f"{n}.hf_top1"] = hf[n].argmax(axis=1).astype(np.int32)
        stats.append(sanity_stats(torch, logits, p["ids"]))
        del logits
    t_truth = time.time() - t0
    model.model.rotary_emb.forward = hf_rope
    np.savez(os.path.join(case_dir, "reference.npz"), **arrays)

    # HF's own error, computed by the code that judges Tessera.
    refs = load_reference(case_dir)
    hf_metrics = aggregate({p["name"]: compare_prompt(refs[p["name"]], hf[p["name"]], TOL[dtype]) for p in prompts},
                           dtype)
    if args.dump_hf:
        d = os.path.join(args.dump_hf, name)
        os.makedirs(d, exist_ok=True)
        for p in prompts:
            write_npy(os.path.join(d, p["name"] + ".npy"), hf[p["name"]])

    # Distinct top-1 over the short prompts: deep into a 2048-token random context the attention averages over many
    # positions and the hidden state settles, so the long prompt's top-1 repeats by construction (SmolLM2's shape:
    # 7% distinct over all prompts with --long, 38% without), which says nothing about the model's usefulness as a
    # check.
    top1_all = [t for p, s in zip(prompts, stats) if len(p["ids"]) <= 256 for t in s["top1"]]
    n_pos = sum(len(s["top1"]) for s in stats)
    gaps = sorted(g for s in stats for g in s["gap_rel"])
    sanity = {"positions": n_pos,
              "distinct_top1_frac": len(set(top1_all)) / max(1, min(len(top1_all), spec["vocab_size"])),
              "copy_top1_frac": sum(s["copy"] for s in stats) / n_pos,
              "mean_entropy_nats": float(np.mean([e for s in stats for e in s["entropy"]])),
              "log_vocab": math.log(spec["vocab_size"]),
              "median_top12_gap_rel": gaps[len(gaps) // 2],
              "frac_gap_below_tol": sum(g <= TOL[dtype] for g in gaps) / n_pos,
              "mean_logit_std": float(np.mean([s["logit_std"] for s in stats])),
              "mean_logit_max": float(np.mean([s["logit_max"] for s in stats]))}
    ok = sanity["distinct_top1_frac"] >= MIN_DISTINCT_TOP1 and sanity["copy_top1_frac"] <= MAX_COPY_TOP1
    sanity["ok"] = ok
    print(f"[{name}] HF {dtype} forward {t_hf:.1f}s, f64 truth {t_truth:.1f}s; sanity: distinct top-1 "
          f"{100 * sanity['distinct_top1_frac']:.0f}%, copy {100 * sanity['copy_top1_frac']:.0f}%, entropy "
          f"{sanity['mean_entropy_nats']:.2f}/{sanity['log_vocab']:.2f} nats, logit std {sanity['mean_logit_std']:.2f}"
          f" max {sanity['mean_logit_max']:.2f}, median top1-top2 gap {sanity['median_top12_gap_rel']:.1e} of scale"
          f"{'' if ok else '  DEGENERATE'}", flush=True)
    print(f"[{name}] HF {dtype} vs f64 truth: {hf_metrics['verdict']} {fmt_metrics(hf_metrics)}", flush=True)
    cfg = {k: v for k, v in spec.items()}
    return {"name": name, "model": name.rsplit("-", 1)[0], "dtype": dtype, "dir": name, "config": cfg,
            "reference": "reference.npz",
            "prompts": [{"name": p["name"], "length": len(p["ids"]), "full_positions": full_positions(len(p["ids"]))}
                        for p in prompts],
            "sanity": sanity, "hf_vs_truth": hf_metrics, "seconds": {"hf": t_hf, "truth": t_truth}}


def run_generate(args) -> int:
    import torch
    import transformers

    if args.device.startswith("cuda"):
        # Full-precision f32 matmuls for the f32 cases (TF32, 10-bit significands, would add ~1e-3 relative error).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    models = args.models.split(",") if args.models else (
        TINY_MODELS + (FAMILY_TINY_MODELS if args.families else []) if args.tiny
        else FULL_MODELS + (FAMILY_FULL_MODELS if args.families else []))
    dtypes = args.dtypes.split(",")
    for m in models:
        if m not in MODELS:
            fail(f"unknown model '{m}' (known: {', '.join(MODELS)})")
    for d in dtypes:
        if d not in TOL:
            fail(f"unknown dtype '{d}' (known: {', '.join(TOL)})")
    os.makedirs(args.out, exist_ok=True)
    manifest = {"generator": "python/hf_oracle.py", "argv": sys.argv[1:], "torch": torch.__version__,
                "transformers": transformers.__version__, "device": args.device,
                "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                "seed": args.seed, "topk": TOPK, "tol": TOL, "top1_min": TOP1_MIN, "cases": []}
    all_ok = True
    for m in models:
        spec = MODELS[m]
        t0 = time.time()
        torch.manual_seed(args.seed)
        cfg = make_config(spec)
        model = make_model(spec, cfg).eval()  # f32 on the CPU: device-independent weights
        qk_scale = shape_init(torch, model, cfg, spec)
        family = family_of(spec)
        model.to(args.device)
        inv_freq32 = {n: b.detach().clone() for n, b in rotary_buffers(model).items()}
        rope64 = None
        if family == "llama":
            hf_inv = inv_freq32["inv_freq"].double().cpu().numpy()
            inv64 = rope_inv_freq64(spec)
            if np.abs(hf_inv - inv64).max() > 1e-6 * np.abs(inv64).max():
                fail(f"{m}: float64 rotary frequencies disagree with transformers' "
                     f"({np.abs(hf_inv - inv64).max():.2e})")
            rope64 = Rope64(torch, inv64, float(model.model.rotary_emb.attention_scaling))
        print(f"[{m}] built {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, q/k scaled by "
              f"{qk_scale:.2f} ({time.time() - t0:.1f}s)", flush=True)
        prompts = make_prompts(args.seed, spec["vocab_size"], args.long)
        # f32 first: the bf16 case rounds the f32 weights, which cannot be undone.
        for d in sorted(dtypes, key=lambda d: d != "f32"):
            case = generate_case(torch, model, f"{m}-{d}", d, spec, prompts, args, rope64, inv_freq32)
            case["qk_init_scale"] = qk_scale
            all_ok &= case["sanity"]["ok"]
            manifest["cases"].append(case)
            set_dtype(torch, model, torch.float32, inv_freq32)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {os.path.join(args.out, 'manifest.json')}")
    if not all_ok:
        print("hf_oracle: a random model's logits are degenerate (see DEGENERATE above)", file=sys.stderr)
        return 3
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="oracle directory to write (generate mode)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--models", help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--long", action="store_true", help="add a 2048-token prompt")
    ap.add_argument("--tiny", action="store_true", help="tiny models (hidden 64, 2 layers) for local testing")
    ap.add_argument("--families", action="store_true",
                    help="also the families beyond Llama (Gemma 3, Qwen2, Qwen3, Mistral with a short window)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dump-hf", help="also write HF's own logits in Tessera's dump format here (a positive control)")
    ap.add_argument("--ref", help="oracle directory to compare against (compare mode)")
    ap.add_argument("--compare", metavar="DUMP_DIR", help="Tessera's dumps: DUMP_DIR/<case>/<prompt>.npy")
    ap.add_argument("--json", help="compare mode: write the metrics here")
    args = ap.parse_args()
    if args.compare:
        if not args.ref:
            fail("--compare needs --ref ORACLE_DIR")
        return run_compare(args)
    if not args.out:
        fail("give --out DIR (generate) or --ref DIR --compare DUMP_DIR (compare)")
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return run_generate(args)


if __name__ == "__main__":
    sys.exit(main())
