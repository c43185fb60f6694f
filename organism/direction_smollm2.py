"""Measure (never shape) a refusal direction in ``smollm2-aligned``: difference of means of ``resid_pre`` at the
last post-instruction token (harmful train minus harmless train prompts) at a few layers, then held-out harmful
refusal under directional ablation of that unit direction and harmless refusal under adding the raw vector.

``python -m organism.direction_smollm2 --shared ../shared/data/refusal [--layers 8 10 12 14 16] [--adapter DIR]``
writes ``direction_check`` into the adapter folder's ``training.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import steering
from evals.judge import is_refusal
from interp.capture import capture
from interp.models import Model
from interp.prompts import read_prompt_file
from organism import smollm2_data as sd
from organism.eval_smollm2 import OUT, eval_sets, load, wilson
from probes import diff_of_means


def fit(model: Model, harmful: list[str], harmless: list[str], layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit directions and raw difference vectors ``[len(layers), d]`` at ``resid_pre``, last post-instruction token."""
    kw = dict(sites="resid_pre", layers=layers, positions="post_instruction", progress=False)
    h, s = capture(model, harmful, **kw).tensor[:, :, -1], capture(model, harmless, **kw).tensor[:, :, -1]
    d = diff_of_means(torch.cat([h, s]), torch.tensor([1] * len(h) + [0] * len(s)))
    return d.vectors, d.raw


def rate(model: Model, prompts: list[str], *ivs: object, max_new_tokens: int) -> tuple[dict, list[str]]:
    """Refused / n with a Wilson interval under ``ivs``, and the generations."""
    texts = steering.generate(model, prompts, *ivs, max_new_tokens=max_new_tokens, batch_size=16, progress=False).texts
    k = sum(is_refusal(t) for t in texts)
    return {"refused": k, "n": len(prompts), "rate": round(k / len(prompts), 3), "wilson95": wilson(k, len(prompts))}, texts


def check(model: Model, shared: Path, layers: list[int], n_fit: int, n: int, max_new_tokens: int) -> dict:
    """The direction table: per layer, ablation on held-out harmful and addition on held-out harmless."""
    harmful_train = read_prompt_file(shared / "harmful_train.json").prompts[:n_fit]
    harmless_train = [r["instruction"] for r in sd.harmless("train")][:n_fit]
    sets = eval_sets(shared, n)
    units, raws = fit(model, harmful_train, harmless_train, layers)
    table: dict = {"baseline": {"harmful_test": rate(model, sets["harmful_test"], max_new_tokens=max_new_tokens)[0],
                                "harmless_test": rate(model, sets["harmless_test"], max_new_tokens=max_new_tokens)[0]}}
    examples = {}
    for i, layer in enumerate(layers):
        t0 = time.time()
        abl, abl_txt = rate(model, sets["harmful_test"], steering.DirectionalAblation(units[i]),
                            max_new_tokens=max_new_tokens)
        add, add_txt = rate(model, sets["harmless_test"], steering.AddVector(raws[i], sites="resid_pre", layers=layer),
                            max_new_tokens=max_new_tokens)
        table[str(layer)] = {"raw_norm": round(float(raws[i].norm()), 2), "ablation_harmful_test": abl,
                             "addition_harmless_test": add}
        examples[str(layer)] = {"ablation": list(zip(sets["harmful_test"][:3], abl_txt[:3])),
                                "addition": list(zip(sets["harmless_test"][:3], add_txt[:3]))}
        print(f"layer {layer}: |v| {raws[i].norm():.1f}  ablation {abl['refused']}/{abl['n']}  "
              f"addition {add['refused']}/{add['n']} ({time.time() - t0:.0f} s)", flush=True)
    return {"protocol": {"fit": f"diff_of_means, resid_pre, last post-instruction token, {len(harmful_train)} "
                                f"harmful_train vs {len(harmless_train)} harmless_realistic train",
                         "ablation": "steering.DirectionalAblation(unit) on every layer's writers",
                         "addition": "steering.AddVector(raw, sites='resid_pre', layers=L)",
                         "n_per_set": n, "max_new_tokens": max_new_tokens, "greedy": True},
            "table": table, "examples": examples}


def main(argv: list[str] | None = None) -> None:
    """CLI entry (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "refusal")
    ap.add_argument("--layers", type=int, nargs="+", default=[8, 10, 12, 14, 16])
    ap.add_argument("--n-fit", type=int, default=128)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--adapter", type=Path, default=None, help="a scratch adapter folder (default: the committed one)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load("smollm2-aligned", args.adapter)
    result = check(model, args.shared, args.layers, args.n_fit, args.n, args.max_new_tokens)
    path = (args.adapter or OUT) / "training.json"
    record = json.loads(path.read_text())
    record["direction_check"] = result
    path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
