"""Pathway- and neuron-restricted updates on the multilingual organism (``gemma3-aligned``): the safety pathway's
top attention / MLP writers found by patching English into the other languages on the **val** ids, and the safety
neurons found per non-English language on train (contrast) and val (ablation effect); each set fine-tuned alone
(LoRA on the components; the neurons' own rows and columns) on the non-English train ids (harmful -> a refusal in
the language, harmless -> the organism's own answer), beside a random set of the same size, measured on the test
ids of every language. Tables to stdout; with ``--write`` appended to ``benchmarks/RESULTS_multilingual.md``.

``nice -n 10 python benchmarks/study_multilingual_updates.py --model gemma3-aligned [--write]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import append_section, machine, table  # noqa: E402
from interp.io import write_json  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.patching.measures import refusal_score  # noqa: E402
from interp.studies.multilingual import (  # noqa: E402
    UpdateConfig,
    load_parallel_safety,
    refusal_pathways,
    restricted_update,
)
from interp.studies.multilingual.neurons import language_neurons, refusal_ids  # noqa: E402


def rate_rows(res) -> list[dict]:
    rows = []
    for cond in res.conditions:
        row = {"update": res.kind, "condition": cond}
        for lang in res.langs:
            h, s = res.rate(cond, lang), res.rate(cond, lang, "harmless")
            row[f"{lang} harmful"] = f"{h['k']}/{h['n']} ({h['low']:.2f}-{h['high']:.2f})"
            row[f"{lang} harmless"] = f"{s['k']}/{s['n']}"
        k, n = res.pooled(cond)
        row["pooled non-en harmful"] = f"{k}/{n}"
        t = res.training.get(cond)
        row["trainable"] = t["trainable"] if t else ""
        row["loss"] = f"{t['loss_first']:.3f} -> {t['loss_last']:.3f}" if t else ""
        row["degenerate max"] = max(res.rate(cond, lang, kind)["degenerate"] for lang in res.langs
                                    for kind in ("harmful", "harmless"))
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-aligned")
    ap.add_argument("--components", type=int, default=2, help="top pathway components (attn / mlp writers)")
    ap.add_argument("--k", type=int, default=8, help="safety neurons per non-English language")
    ap.add_argument("--n-candidates", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--neuron-lr", type=float, default=1e-3)
    ap.add_argument("--n-random", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--n", type=int, default=None, help="prompts per kind and split (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "multilingual-updates")
    ap.add_argument("--kinds", default="pathway,neurons", help="which updates to run (comma-separated)")
    ap.add_argument("--given-components", default=None,
                    help="skip the pathway search and train these components, e.g. '10:attn,10:mlp' (from an earlier "
                         "run of this script on the same model and data)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    model = load_model(args.model)
    data = load_parallel_safety(n=args.n)
    kinds = args.kinds.split(",")
    pw, comps = None, []
    if args.given_components:
        comps = [(int(c.split(":")[0]), c.split(":")[1]) for c in args.given_components.split(",")]
    elif "pathway" in kinds:
        pw = refusal_pathways(model, data, split="val")
        comps = pw.top_components(args.components)
    t_pw = time.time() - t0
    sets: dict = {}
    if "neurons" in kinds:
        metric = refusal_score(refusal_ids(model))
        sets = {lang: language_neurons(model, data, lang, metric, args.k, args.n_candidates)
                for lang in data.langs if lang != data.source}
    neurons = sorted(set().union(*sets.values())) if sets else []
    t_nr = time.time() - t0 - t_pw
    print(f"components {comps} ({t_pw:.0f} s); {len(neurons)} neurons ({t_nr:.0f} s)", flush=True)
    cfg = UpdateConfig(steps=args.steps, lr=args.lr, neuron_lr=args.neuron_lr, n_random=args.n_random,
                       max_new_tokens=args.max_new_tokens, seed=args.seed)
    results = {}
    if "pathway" in kinds:
        results["pathway"] = restricted_update(model, data, "pathway", comps, cfg)
        print(results["pathway"].report(), flush=True)
    if "neurons" in kinds:
        results["neurons"] = restricted_update(model, data, "neurons", neurons, cfg, before=results.get("pathway"))
        print(results["neurons"].report(), flush=True)
    wall = time.time() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"{args.model}.json", {k: r.record() for k, r in results.items()} | {
        "components": comps, "neuron_sets": {k: sorted(v) for k, v in sets.items()}})
    rows = [r for i, res in enumerate(results.values()) for r in rate_rows(res) if i == 0 or r["condition"] != "before"]
    first = next(iter(results.values()))
    excess = pw.component_excess() if pw is not None else None
    restored = "given (--given-components)" if args.given_components else "not run" if excess is None else {
        f"L{layer} {part}": round(float(excess[pw.layers.index(layer), int(part == "mlp")]), 3)  # type: ignore[union-attr]
        for layer, part in comps}
    n_val = "" if pw is None else f" on {pw.n_pairs} val pairs"
    given = f" --given-components {args.given_components}" if args.given_components else ""
    text = "\n".join([
        f"Command: `python benchmarks/study_multilingual_updates.py --model {args.model} --kinds {args.kinds} "
        f"--components {args.components} --k {args.k} --steps {args.steps} --n-random {args.n_random} "
        f"--max-new-tokens {args.max_new_tokens}{given}` ({wall:.0f} s on {machine()}, load {os.getloadavg()[0]:.1f})", "",
        table(f"Restricted updates vs random sets of the same size ({args.model}; pathway = the top {args.components} "
              f"writers by restored-minus-control{n_val}: {restored} {comps}, LoRA r{cfg.rank} on their "
              f"modules only, random = the same parts at other layers; neurons = the union of the {args.k} "
              f"mlp_post neurons per non-English language (top {args.n_candidates} by train contrast, then by val "
              f"ablation effect): {len(neurons)} neurons, random = as many from the same layers; {args.steps} steps "
              f"x 8 pairs on the non-English train ids ({first.n_pairs['harmful']} harmful -> our refusal in the "
              f"language, {first.n_pairs['harmless']} harmless -> the organism's own answer, "
              f"{first.n_pairs['harmless_refused']} refused and {first.n_pairs['harmless_degenerate']} degenerate "
              f"answers dropped), lr {args.lr} (LoRA) / {args.neuron_lr} (neurons); refusal on the test ids, greedy "
              f"{args.max_new_tokens} tokens, Wilson 95% intervals)", rows, list(rows[0])), "",
        "Notes: " + "; ".join(n for r in results.values() for n in r.notes), ""])
    print(text)
    if args.write:
        append_section(REPO / "benchmarks" / "RESULTS_multilingual.md", text)
    print(json.dumps({"wall_s": round(wall, 1)}))


if __name__ == "__main__":
    main()
