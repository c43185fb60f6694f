"""Measure what an organism (``smollm2-aligned``, or ``gemma3-aligned`` with ``--models gemma3-aligned``) learned: refusal on held-out harmful sets, on held-out harmless prompts
and over-refusal on borderline-benign ones, with ``evals.refusal_rate`` on greedy generations.

``python -m interp.organisms.eval_smollm2 --shared ../shared/data/refusal [--n 32] [--models smollm2-aligned smollm2-base]``
writes ``evaluation`` into ``interp/embedded/<first model>/training.json`` (``smollm2-aligned`` when the first model
is not an adapter organism) and the generations beside it.
``--adapter DIR`` evaluates a scratch adapter (written by ``interp.organisms.train_smollm2 --out DIR``) and writes into DIR;
``--sets dev`` runs only the development sets (``harmful_val``, ``harmless_val``, ``borderline_val``), which
recipe iteration reads so the held-out sets are measured once, on the final adapter.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

import steering
from interp.evals.rates import wilson as _wilson
from interp.models import ADAPTERS, EMBEDDED_DIR, Model, load_model, with_adapter
from interp.organisms import smollm2_data as sd
from interp.prompts import read_prompt_file
from interp.values import Runtime

OUT = EMBEDDED_DIR / "smollm2-aligned"
HELD_OUT = {k: v for k, v in sd.HELD_OUT.items() if k != "strongreject"}  # strongreject: the pipeline's, unread here
DEV = ("harmful_val", "harmless_val", "borderline_val", "copyright_test", "harmful_extra_test", "harmful_realistic_val")  # not trained on, not held out: for choosing a recipe


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a rate ``k / n``."""
    lo, hi = _wilson(k, n, z)
    return round(lo, 3), round(hi, 3)


def eval_sets(shared: Path, n: int, seed: int = 0) -> dict[str, list[str]]:
    """The held-out prompt sets, ``n`` each drawn by a seeded RNG (all of a set smaller than ``n``)."""
    rng = random.Random(seed)
    sets: dict[str, list[str]] = {}
    for name, (fname, col) in HELD_OUT.items():
        prompts = read_prompt_file(shared / fname, column=col).prompts
        if name == "harmbench_val":  # contextual behaviours need their context string; keep the standalone ones
            import csv

            with open(shared / fname, newline="", encoding="utf-8") as fh:
                prompts = [r["Behavior"] for r in csv.DictReader(fh) if not r["ContextString"].strip()]
        sets[name] = rng.sample(prompts, min(n, len(prompts)))
    sets["harmless_test"] = rng.sample([r["instruction"] for r in sd.harmless("test")], n)
    sets["borderline_test"] = [r["instruction"] for r in sd.borderline("test")]
    sets["harmful_val"] = read_prompt_file(shared / "harmful_val.json").prompts
    sets["harmless_val"] = [r["instruction"] for r in sd.harmless("val")]
    sets["borderline_val"] = [r["instruction"] for r in sd.borderline("val")]
    sets["copyright_test"] = sd.copyright_requests("test") + sd.copyright_requests("val")
    sets["harmful_extra_test"] = sd.harmful_extra("test") + sd.harmful_extra("val")
    sets["harmful_realistic_val"] = [r["instruction"] for r in sd.harmful_realistic("val")]
    sets["harmful_realistic_test"] = [r["instruction"] for r in sd.harmful_realistic("test")]
    return sets


def load(model_name: str, adapter: Path | None) -> Model:
    """``model_name`` as ``load_model`` knows it, or (``adapter``) the base with that scratch adapter merged in."""
    if adapter is None or model_name not in ADAPTERS:
        return load_model(model_name)
    return with_adapter(load_model(ADAPTERS[model_name][0]), adapter, name=model_name)


def evaluate(model_name: str, sets: dict[str, list[str]], max_new_tokens: int,
             adapter: Path | None = None) -> tuple[dict, list[dict]]:
    """Refusal rate (with n and a 95% interval) per set, and every generation, for one model."""
    model = load(model_name, adapter)
    rates, gens = {}, []
    for name, prompts in sets.items():
        t0 = time.time()
        r = steering.generate_and_judge(model, prompts, max_new_tokens=max_new_tokens,
                                        runtime=Runtime(batch_size=16))
        rates[name] = dict(r)
        gens += [{"model": model_name, "set": name, "prompt": p, "response": t, "judged_refusal": f}
                 for p, t, f in zip(prompts, r.texts, r.flags)]
        print(f"{model_name} {name}: {r.k}/{r.n} refused ({time.time() - t0:.0f} s)", flush=True)
    return rates, gens


def main(argv: list[str] | None = None) -> None:
    """CLI entry (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[3] / "shared" / "data" / "refusal")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--models", nargs="+", default=["smollm2-aligned"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sets", nargs="+", default=None,
                    help="only these sets; 'dev' names the development sets, 'held-out' the rest (default: all)")
    ap.add_argument("--adapter", type=Path, default=None, help="a scratch adapter folder to evaluate and write into")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    every = eval_sets(args.shared, args.n)
    wanted = set(args.sets or every)
    wanted |= set(DEV) if "dev" in wanted else set()
    wanted |= {k for k in every if k not in DEV} if "held-out" in wanted else set()
    unknown = wanted - set(every) - {"dev", "held-out"}
    if unknown:
        raise ValueError(f"unknown sets {sorted(unknown)}; choose from {sorted(every)}, 'dev' or 'held-out'")
    sets = {k: v for k, v in every.items() if k in wanted}
    out = args.adapter or (EMBEDDED_DIR / ADAPTERS[args.models[0]][1] if args.models[0] in ADAPTERS else OUT)
    record = json.loads((out / "training.json").read_text())
    evaluation = record.get("evaluation", {})
    gens_path = out / "eval_generations.jsonl"
    old = [g for g in sd.read_jsonl(gens_path) if g["model"] not in args.models or g["set"] not in sets] \
        if gens_path.exists() else []
    t0 = time.time()
    for m in args.models:
        rates, gens = evaluate(m, sets, args.max_new_tokens, args.adapter)
        evaluation[m] = {**evaluation.get(m, {}), **rates}
        old += gens
    evaluation.setdefault("protocol", {})[" ".join(args.models)] = {"n_per_set": args.n, "seed": 0, "max_new_tokens": args.max_new_tokens, "greedy": True,
                              "judge": "evals.refusal_rate (anchored phrase judge)", "wall_s": round(time.time() - t0, 1),
                              "load_average": os.getloadavg()}
    record["evaluation"] = evaluation
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    sd.write_jsonl(gens_path, old)


if __name__ == "__main__":
    main()
