"""Where the safety adapter's gain sits: token attribution of ``smollm2-aligned`` over its base on held-out harmful
prompts it refuses, with its own greedy refusals as responses (one model in memory: the base is the adapter
disabled).

``python -m interp.organisms.attribution_smollm2 [--n 32] [--shared ../shared/data/refusal] [--html page.html]``
prints the concentration (top 1/5/10% shares, Gini), gain by token class, the top words and class enrichment
among the top 10% of tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import steering
from interp.evals.judge import is_refusal
from interp.models import load_model
from interp.prompts import read_prompt_file
from interp.tune import token_attribution
from interp.values import Runtime

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "refusal"


def refused_pairs(model, prompts: list[str], n: int, max_new_tokens: int) -> tuple[list[str], list[str]]:
    """The first ``n`` prompts the model refuses (greedy), with its responses; a response that ended on its own
    keeps the end-of-turn token (the adapter taught it to stop)."""
    eos = model.tokenizer.eos_token or ""
    keep_p, keep_r = [], []
    for k in range(0, len(prompts), 16):
        chunk = prompts[k:k + 16]
        out = steering.generate(model, chunk, max_new_tokens=max_new_tokens,
                                runtime=Runtime(batch_size=16, progress=False))
        for p, t, ids in zip(chunk, out.texts, out.token_ids):
            if is_refusal(t) and len(keep_p) < n:
                keep_p.append(p)
                keep_r.append(t + (eos if len(ids) < max_new_tokens else ""))
        if len(keep_p) >= n:
            break
    return keep_p, keep_r


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--html", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    model = load_model("smollm2-aligned", merge=False)
    prompts = read_prompt_file(args.shared / "harmful_test.json").prompts
    ps, rs = refused_pairs(model, prompts, args.n, args.max_new_tokens)
    a = token_attribution(None, model, ps, rs)
    summary = {"n_examples": len(ps), "concentration": a.concentration(), "by_class": a.by_class(),
               "top_words": a.by_word(top=12), "enrichment_top10%": a.enrichment(q=0.1),
               "wall_s": round(time.time() - t0, 1)}
    print(json.dumps(summary, indent=1, default=float))
    if args.html is not None:
        args.html.write_text(a.plot(title="smollm2-aligned over its base: refusals to held-out harmful prompts"))


if __name__ == "__main__":
    main()
