"""Refusal candidate scoring: batched across candidates (ours) against a naive loop of one forward pass per
candidate per prompt, on the same candidates; checks both give the same scores and reports the speed-up.

    python benchmarks/refusal.py                      # organism + SmolLM2-135M-Instruct (layers 4,8,...,28)
    python benchmarks/refusal.py --models organism
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, table  # noqa: E402

_here = Path(__file__).resolve().parent  # benchmarks/steering.py would otherwise shadow the steering package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

import interp  # noqa: E402
import steering  # noqa: E402
from interp.data import load_prompts  # noqa: E402
from pipelines.refusal import scoring as S  # noqa: E402


def naive(model, prompts, units, vecs, layers, toks):
    """One forward per candidate per prompt, through the steering package's hooks."""
    bypass, induce = torch.zeros(len(units)), torch.zeros(len(units))
    for c in range(len(units)):
        bs, ins = [], []
        for p in prompts["harmful"]:
            enc = S.encode_prompts(model, [p])
            with steering.apply(model, steering.DirectionalAblation(units[c])):
                bs.append(S.refusal_score(S.baseline_logits(model, enc), toks))
        for p in prompts["harmless"]:
            enc = S.encode_prompts(model, [p])
            with steering.apply(model, steering.AddVector(vecs[c], layers=int(layers[c]), sites="resid_pre")):
                ins.append(S.refusal_score(S.baseline_logits(model, enc), toks))
        bypass[c], induce[c] = torch.cat(bs).mean(), torch.cat(ins).mean()
    return bypass, induce


def batched(model, prompts, units, vecs, layers, toks, max_rows):
    eh, es = S.encode_prompts(model, prompts["harmful"]), S.encode_prompts(model, prompts["harmless"])
    b = S.refusal_score(S.score_rows(model, eh, units, "ablate", max_rows=max_rows), toks).mean(1)
    i = S.refusal_score(S.score_rows(model, es, vecs, "add", layers, max_rows=max_rows), toks).mean(1)
    return b, i


def run(name: str, label: str, layers: list[int] | None, n_prompts: int, max_rows: int) -> dict:
    model = interp.load_model(name)
    harm = [r["instruction"] for r in load_prompts("organism_harmful_val")][:n_prompts]
    safe = [r["instruction"] for r in load_prompts("organism_harmless_val")][:n_prompts]
    layers = layers if layers is not None else list(range(model.n_layers))
    kw = dict(sites="resid_pre", layers=layers, positions="post_instruction", progress=False)
    h = interp.capture(model, harm, **kw).tensor
    s = interp.capture(model, safe, **kw).tensor
    P = min(h.shape[2], s.shape[2])
    raw = (h[:, :, -P:].mean(0) - s[:, :, -P:].mean(0)).reshape(-1, model.d_model)
    cand_layers = torch.tensor(layers).repeat_interleave(P)
    keep = raw.norm(dim=-1) > 1e-6  # layer-0 template tokens are identical across prompts: no direction there
    raw, cand_layers = raw[keep], cand_layers[keep]
    units = torch.nn.functional.normalize(raw, dim=-1)
    toks = S.refusal_tokens([model.tokenizer.encode("I", add_special_tokens=False)[0]], [])  # any fixed token set
    prompts = {"harmful": harm, "harmless": safe}
    t0 = time.perf_counter()
    b1, i1 = batched(model, prompts, units, raw, cand_layers, toks, max_rows)
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    b2, i2 = naive(model, prompts, units, raw, cand_layers, toks)
    t_naive = time.perf_counter() - t0
    err = max((b1 - b2).abs().max().item(), (i1 - i2).abs().max().item())
    return {"model": label, "candidates": len(units), "prompts per class": n_prompts, "naive s": t_naive,
            "batched s": t_batched, "speed-up": t_naive / t_batched, "max |score diff|": f"{err:.1e}"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="organism,smollm2")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_refusal.md")))
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        if name == "organism":
            rows.append(run("organism", "organism (aligned)", None, args.prompts, 512))
        else:
            rows.append(run("smollm2-135m-instruct", "SmolLM2-135M-Instruct, layers 4..28 step 4", list(range(4, 29, 4)),
                            args.prompts // 2, 64))
    text = table("Refusal candidate scoring (bypass + induce): batched vs one forward per candidate per prompt", rows,
                 list(rows[0]))
    text += f"\nMachine: {machine()}. Command: `python benchmarks/refusal.py --models {args.models} --prompts {args.prompts}`.\n"
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
