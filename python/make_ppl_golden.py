#!/usr/bin/env python3
"""Golden data for the perplexity and KL-divergence scoring (tests/tools/test_perplexity.cpp), computed in numpy
float64 independently of the C++ code, following llama-perplexity's definitions (tools/perplexity/perplexity.cpp):

- tokens are cut into chunks of n_ctx; chunk c is tokens[c*n_ctx:(c+1)*n_ctx] with its first token replaced by BOS
  when the model adds BOS; rows first = n_ctx//2 .. n_ctx-2 are scored against the token after them;
- PPL = exp(mean nll); error = PPL * sqrt((mean nll^2 - mean nll ^ 2) / (count - 1));
- KL statistics as llama-perplexity --kl-divergence reports them (mean_and_uncertainty, covariance, percentile).

Synthetic case: a vocabulary of V tokens, random token ids, random logits for the scored half of each chunk (the
"model" is the table of logits), and a second table (the compared model) = the first plus noise. KL is given for the
base's top-k with the rest lumped (the logits file's form: sum_topk p log(p/q) + r_p log(r_p/r_q)) and for k = V, where
it must equal the exact KL.

Usage: python3 python/make_ppl_golden.py tests/data/golden/ppl_synthetic.json
"""
import json
import sys

import numpy as np

SEED = 22
V = 50
N_CTX = 32
N_CHUNKS = 3
TOP_K = 5
BOS = 1


def log_softmax(row):
    m = row.max()
    return row - (m + np.log(np.exp(row - m).sum()))


def mean_and_uncertainty(x):
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    f = x.mean()
    df = (x * x).mean() - f * f
    return f, (np.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)


def kl_topk(lp, lq, k):
    """KL(P || Q) from P's k most probable tokens (ties: smaller id first) and the lumped rest."""
    order = sorted(range(len(lp)), key=lambda i: (-lp[i], i))[:k]
    p, q = np.exp(lp), np.exp(lq)
    kl = float(sum(p[i] * (lp[i] - lq[i]) for i in order))
    rest = np.ones(len(lp), dtype=bool)
    rest[order] = False
    rp, rq = p[rest].sum(), q[rest].sum()
    if rp > 0:
        kl += rp * (np.log(rp) - np.log(rq))
    return kl, order


def main(out):
    rng = np.random.default_rng(SEED)
    first = N_CTX // 2
    n_scored = N_CTX - first - 1
    tokens = rng.integers(0, V, size=N_CHUNKS * N_CTX + 7).tolist()  # a tail that fills no chunk: dropped
    # Scale 3: peaked enough that the top-k hold most but not all of the mass (the lumped term matters).
    base = (rng.standard_normal((N_CHUNKS, N_CTX - first, V)) * 3).astype(np.float32)
    comp = (base + rng.standard_normal(base.shape) * 0.5).astype(np.float32)

    nll, running, nll_b = [], [], []
    kld_k, kld_full, kld_exact, p_diff, same = [], [], [], [], []
    for c in range(N_CHUNKS):
        for r in range(n_scored):
            t = tokens[c * N_CTX + first + r + 1]
            lq = log_softmax(comp[c, r].astype(np.float64))
            lp = log_softmax(base[c, r].astype(np.float64))
            nll.append(-lq[t])
            nll_b.append(-lp[t])
            k5, order = kl_topk(lp, lq, TOP_K)
            kld_k.append(k5)
            kld_full.append(kl_topk(lp, lq, V)[0])
            kld_exact.append(float((np.exp(lp) * (lp - lq)).sum()))
            p_diff.append(np.exp(lq[t]) - np.exp(lp[t]))
            same.append(int(np.argmax(comp[c, r])) == order[0])
        running.append(float(np.exp(np.mean(nll))))
    nll = np.array(nll)
    ppl = float(np.exp(nll.mean()))
    ppl_err = float(ppl * np.sqrt(((nll ** 2).mean() - nll.mean() ** 2) / (len(nll) - 1)))

    def kl_stats(kv):
        kv = np.array(kv)
        m, e = mean_and_uncertainty(kv)
        pct = {f: float(np.percentile(kv, 100 * f)) for f in (0.999, 0.99, 0.95, 0.90, 0.10, 0.05, 0.01, 0.001)}
        return {"kld": m, "kld_err": e, "kld_max": float(kv.max()), "kld_min": float(kv.min()),
                "kld_median": float(np.median(kv)), "kld_p999": pct[0.999], "kld_p99": pct[0.99],
                "kld_p95": pct[0.95], "kld_p90": pct[0.90], "kld_p10": pct[0.10], "kld_p5": pct[0.05],
                "kld_p1": pct[0.01], "kld_p01": pct[0.001]}

    lq_m, lq_e = mean_and_uncertainty(nll)
    lb_m, lb_e = mean_and_uncertainty(nll_b)
    n = len(nll)
    cov = ((nll * np.array(nll_b)).mean() - nll.mean() * np.mean(nll_b)) / (n - 1)
    pd = np.array(p_diff)
    mse_m, mse_e = mean_and_uncertainty(pd ** 2)
    rms = float(np.sqrt(mse_m))
    same_top = float(np.mean(same))
    common = {
        "ppl": float(np.exp(lq_m)), "ppl_err": float(np.exp(lq_m) * lq_e),
        "ppl_base": float(np.exp(lb_m)), "ppl_base_err": float(np.exp(lb_m) * lb_e),
        "ln_ppl_ratio": float(lq_m - lb_m), "ln_ppl_ratio_err": float(np.sqrt(lq_e ** 2 + lb_e ** 2 - 2 * cov)),
        "p_diff_mean": float(pd.mean()), "p_diff_mean_err": float(mean_and_uncertainty(pd)[1]),
        "p_diff_rms": rms, "p_diff_rms_err": float(0.5 / rms * mse_e),
        "p_diff_max": float(pd.max()), "p_diff_min": float(pd.min()),
        "same_top": same_top, "same_top_err": float(np.sqrt(same_top * (1 - same_top) / (n - 1))),
    }
    golden = {
        "command": "python3 python/make_ppl_golden.py tests/data/golden/ppl_synthetic.json",
        "n_vocab": V, "n_ctx": N_CTX, "n_chunks": N_CHUNKS, "bos": BOS, "top_k": TOP_K,
        "tokens": tokens,
        # [chunk][row][vocab], rows first .. n_ctx-1 (the last is not scored), float32 values written exactly
        "base_logits": [[[float(x) for x in row] for row in ch] for ch in base],
        "compared_logits": [[[float(x) for x in row] for row in ch] for ch in comp],
        "ppl": ppl, "ppl_err": ppl_err, "running": running, "count": int(n),
        "kl_top_k": {**common, **kl_stats(kld_k)},
        "kl_full": {**common, **kl_stats(kld_full)},
        "kld_exact_mean": float(np.mean(kld_exact)),
    }
    with open(out, "w") as f:
        json.dump(golden, f)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden/ppl_synthetic.json")
