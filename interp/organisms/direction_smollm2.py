"""Measure (never shape) a refusal direction in ``smollm2-aligned``: difference of means of ``resid_pre`` at the
last post-instruction token (harmful train minus harmless train prompts) at a few layers, then held-out harmful
refusal under directional ablation of that unit direction and harmless refusal under adding the raw vector.

``python -m interp.organisms.direction_smollm2 --shared ../shared/data/refusal [--layers 8 10 12 14 16] [--adapter DIR]``
writes ``direction_check`` into the adapter folder's ``training.json``.

``--origin`` measures instead where that direction comes from (:func:`origin`): the aligned model's direction, fitted
on the refusal job's own train splits, read in the aligned model and in the base model it was fine-tuned from (which
does not refuse), written as ``direction_origin``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import steering
from interp.capturing import capture
from interp.evals.metrics import auroc, cohens_d
from interp.models import Model, load_model
from interp.organisms import smollm2_data as sd
from interp.organisms.eval_smollm2 import OUT, eval_sets, load
from interp.prompts import read_prompt_file
from interp.values import Runtime
from probes import diff_of_means


def last_token(model: Model, prompts: list[str], layers: list[int]) -> torch.Tensor:
    """``resid_pre`` of ``layers`` at the last post-instruction token ``[n, len(layers), d]``."""
    kw = dict(sites="resid_pre", layers=layers, positions="post_instruction", runtime=Runtime(progress=False))
    return capture(model, prompts, **kw).tensor[:, :, -1]


def fit(model: Model, harmful: list[str], harmless: list[str], layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit directions and raw difference vectors ``[len(layers), d]`` at ``resid_pre``, last post-instruction token."""
    h, s = last_token(model, harmful, layers), last_token(model, harmless, layers)
    d = diff_of_means(torch.cat([h, s]), torch.tensor([1] * len(h) + [0] * len(s)))
    return d.vectors, d.raw


def origin(aligned: Model, base: Model, harmful: list[str], harmless: list[str], layers: list[int]) -> dict:
    """Did the fine-tune make the direction, or does the base model already separate the prompts along it? Per
    layer: the aligned model's unit difference-of-means direction ``r``; in each model, the harmful and harmless
    projections on ``r`` (means, standard deviations, Cohen's d, AUROC; the harmless spread along ``r`` is what an
    ablation of ``r`` removes from harmless prompts) and the cosine between the base model's own difference of
    means and ``r``."""
    y = torch.tensor([1] * len(harmful) + [0] * len(harmless))
    acts = {name: torch.cat([last_token(m, harmful, layers), last_token(m, harmless, layers)]).double()
            for name, m in (("aligned", aligned), ("base", base))}
    out: dict = {}
    for i, layer in enumerate(layers):
        diff = {k: a[y == 1, i].mean(0) - a[y == 0, i].mean(0) for k, a in acts.items()}
        r = diff["aligned"] / diff["aligned"].norm()
        row: dict = {"cosine_base_direction": round(float(diff["base"] @ r / diff["base"].norm()), 3)}
        for name, a in acts.items():
            proj = a[:, i] @ r
            row[name] = {"harmful_mean": round(float(proj[y == 1].mean()), 2),
                         "harmful_std": round(float(proj[y == 1].std()), 2),
                         "harmless_mean": round(float(proj[y == 0].mean()), 2),
                         "harmless_std": round(float(proj[y == 0].std()), 2),
                         "cohens_d": round(float(cohens_d(proj, y)), 2), "auroc": round(float(auroc(proj, y)), 3)}
        out[str(layer)] = row
    return {"protocol": {"fit": f"diff_of_means in the aligned model, resid_pre, last post-instruction token, "
                                f"the first {len(harmful)} harmful and {len(harmless)} harmless train prompts of our "
                                f"realistic sets (the refusal job's default train split at 64)", "read": "projection on the aligned model's unit direction, "
                                "in the aligned and in the base model, on the same prompts"}, "layers": out}


def rate(model: Model, prompts: list[str], *ivs: object, max_new_tokens: int) -> tuple[dict, list[str]]:
    """The refusal :class:`~interp.evals.rates.Rate` under ``ivs`` (as a plain dict), and the generations."""
    r = steering.generate_and_judge(model, prompts, *ivs, max_new_tokens=max_new_tokens,
                                    runtime=Runtime(batch_size=16))
    return dict(r), r.texts


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
        print(f"layer {layer}: |v| {raws[i].norm():.1f}  ablation {abl['k']}/{abl['n']}  "
              f"addition {add['k']}/{add['n']} ({time.time() - t0:.0f} s)", flush=True)
    return {"protocol": {"fit": f"diff_of_means, resid_pre, last post-instruction token, {len(harmful_train)} "
                                f"harmful_train vs {len(harmless_train)} harmless_realistic train",
                         "ablation": "steering.DirectionalAblation(unit) on every layer's writers",
                         "addition": "steering.AddVector(raw, sites='resid_pre', layers=L)",
                         "n_per_set": n, "max_new_tokens": max_new_tokens, "greedy": True},
            "table": table, "examples": examples}


def main(argv: list[str] | None = None) -> None:
    """CLI entry (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[3] / "shared" / "data" / "refusal")
    ap.add_argument("--layers", type=int, nargs="+", default=[8, 10, 12, 14, 16])
    ap.add_argument("--n-fit", type=int, default=128)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--adapter", type=Path, default=None, help="a scratch adapter folder (default: the committed one)")
    ap.add_argument("--origin", action="store_true", help="measure the direction in the base model too (origin)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load("smollm2-aligned", args.adapter)
    if args.origin:  # the refusal job's default train prompts: the first n_fit of our realistic sets' train splits
        harmful, harmless = ([r["instruction"] for r in rows("train")][:args.n_fit]
                             for rows in (sd.harmful_realistic, sd.harmless))
        key, result = "direction_origin", origin(model, load_model("smollm2-base"), harmful, harmless, args.layers)
        print(json.dumps(result["layers"], indent=1))
    else:
        key, result = "direction_check", check(model, args.shared, args.layers, args.n_fit, args.n,
                                               args.max_new_tokens)
    path = (args.adapter or OUT) / "training.json"
    record = json.loads(path.read_text())
    record[key] = result
    path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
