"""Logit lens vs tuned lens on SmolLM2-135M-Instruct: held-out KL(final || lens) by layer, and the logit lens's
agreement with TransformerLens (``accumulated_resid(apply_ln=True)`` + ``unembed``) in float32 and float64.

    python benchmarks/bench_lens.py [n_texts] [steps]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

import interp
from interp.look.lens import logit_lens
from interp.look.tuned_lens import train_tuned_lens
from interp.testing.oracles import transformer_lens_model

QUIET = interp.Runtime(progress=False)


def texts(n: int) -> list[str]:
    path = Path(interp.__file__).parent / "data" / "prompts" / "harmless_realistic.jsonl"
    return [json.loads(line)["instruction"] for line in path.read_text().splitlines() if line.strip()][:n]


def tl_agreement(dtype: str) -> float:
    m = interp.load_model("smollm2-135m-instruct", dtype=dtype)
    tl = transformer_lens_model(m)
    worst = 0.0
    for text in ("The capital of France is", "I like to read books about"):
        p = interp.Prompts((text,), chat=False)
        ids = p.encode(m)[1][0].ids
        with torch.no_grad():
            _, cache = tl.run_with_cache(torch.tensor([ids]))
            stack, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)
            theirs = tl.unembed(stack).log_softmax(-1)[:, 0]
        ours = logit_lens(m, p, ["resid_pre", f"resid_post.{m.n_layers - 1}"], positions="all", keep_logprobs=True,
                          runtime=interp.Runtime(progress=False, dtype=m.dtype))
        worst = max(worst, float((ours.logprobs[0, :-1] - theirs).abs().max()))  # less our model-output row
    return worst


def main() -> None:
    n, steps = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (160, 40)
    torch.set_num_threads(2)
    for dt in ("float32", "float64"):
        print(f"TL agreement {dt}: max |log-prob diff| = {tl_agreement(dt):.3g}", flush=True)
    m = interp.load_model("smollm2-135m-instruct")
    t0 = time.perf_counter()
    tuned = train_tuned_lens(m, interp.Prompts(tuple(texts(n)), chat=False), steps=steps, lr=1e-3, batch_tokens=32,
                             runtime=QUIET)
    print(f"texts {n}, train tokens {tuned.meta['train_tokens']}, held-out tokens {tuned.meta['heldout_tokens']}, "
          f"steps {steps}, batch 32 tokens, lr 1e-3, capture+train {tuned.meta['seconds']} s, "
          f"total with held-out eval {time.perf_counter() - t0:.1f} s")
    print("| layer | logit lens KL | tuned lens KL |\n| --- | --- | --- |")
    for i, (a, b) in enumerate(zip(tuned.meta["heldout_kl_logit"], tuned.meta["heldout_kl_tuned"])):
        print(f"| {i} | {a:.3f} | {b:.3f} |")


if __name__ == "__main__":
    main()
