"""Refusal retention across languages on the multilingual organism (``gemma3-aligned``: Gemma 3 270M with an
English-only safety LoRA) and, for comparison, on any other model: refusal per language on the parallel test split,
the English direction's projection ratio and cosine drift by layer, the languages' own directions, language identity
and LEACE erasure, and ablation of the English direction per language beside a random direction. Tables to stdout,
the report to ``--out``, and with ``--write`` the tables to ``benchmarks/RESULTS_multilingual.md``.

``nice -n 10 python benchmarks/study_multilingual.py --model gemma3-aligned --out runs/multilingual [--write]``

The neuron, pathway and SAE-feature studies alone (the retention already written, its layer given), each section
written to the results file as soon as it is measured, in place of the section with the same heading:
``python benchmarks/study_multilingual.py --no-retention --layer 11 --neurons --pathways --features --write``
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

from benchmarks._common import append_section, machine, replace_section, table  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.studies.multilingual import (  # noqa: E402
    RetentionConfig,
    load_parallel_safety,
    refusal_retention,
    safety_neurons,
    write_retention,
)
from interp.values import Runtime  # noqa: E402


def sections(res, model_name: str, wall: float, args) -> list[str]:
    tr = res.transfer()
    rows = []
    for lang in res.langs:
        h, s = res.rate(lang, "harmful"), res.rate(lang, "harmless")
        a, ra = res.rate(lang, "harmful", "ablation"), res.rate(lang, "harmful", "random ablation")
        rows.append({"lang": lang, "harmful": f"{h['k']}/{h['n']}", "rate": h["rate"],
                     "95% CI": f"{h['low']:.2f}-{h['high']:.2f}", "harmless": f"{s['k']}/{s['n']}",
                     "transfer": tr[lang], "ablation": f"{a['k']}/{a['n']}", "ablation CI": f"{a['low']:.2f}-{a['high']:.2f}",
                     "random ablation": f"{ra['k']}/{ra['n']}", "degenerate (abl / random)":
                     f"{a['degenerate']:.2f} / {ra['degenerate']:.2f}"})
    g = res.to_frame()
    geo_rows = [{"layer": int(r.layer), "lang": r.lang, "ratio": r.projection_ratio,
                 "ratio CI": f"{r.ratio_lo:.2f}-{r.ratio_hi:.2f}", "random": r.random_ratio,
                 "transfer AUROC": r.transfer_auroc, "drift matched": r.drift_matched,
                 "drift mismatched": r.drift_mismatched, "own cos": r.own_cosine, "own AUROC": r.own_auroc,
                 "split-half cos": r.split_half_cosine}
                for r in g.itertuples() if r.lang != res.source and (int(r.layer) % args.every == 0 or int(r.layer) == res.layer)]
    lg = res.language
    lang_rows = [{"layer": r["layer"], "lang": r["lang"], "identity acc": r["identity_accuracy"], "overlap": r["overlap"],
                  "ratio before": r["ratio_before"], "ratio LEACE": r["ratio_leace"], "ratio random": r["ratio_random"],
                  "AUROC before": r["auroc_before"], "AUROC LEACE": r["auroc_leace"], "AUROC random": r["auroc_random"]}
                 for r in lg.to_frame().to_dict("records") if r["lang"] != res.source and (r["layer"] % args.every == 0 or r["layer"] == res.layer)]
    head = (f"{model_name}; {res.geometry.n_test} parallel test prompts per set and language (the ids never trained "
            f"on); greedy {args.max_new_tokens} tokens judged by evals.judge_languages.is_refusal_multilingual; English "
            f"direction of layer {res.layer} ({res.layer_choice['rule']}) ablated at every layer, "
            f"{args.ablate_positions} tokens; massive dimensions left out of every statistic and of both ablated "
            f"directions: {res.layer_choice.get('massive_dims_removed')}; random direction seeded {args.seed}; "
            f"{wall:.0f} s on {machine()}, "
            f"load {os.getloadavg()[0]:.1f}")
    return [f"Command: `python benchmarks/study_multilingual.py --model {model_name} --ablate-positions "
            f"{args.ablate_positions}`", "",
            table(f"Refusal per language ({head})", rows, list(rows[0])), "",
            table(f"Geometry by layer ({model_name}; projection ratio with its {res.geometry.n_boot}-resample "
                  f"bootstrap interval; random = mean |gap| on random directions over the English gap; chance "
                  f"|cos| of random directions {res.geometry.random_cosine:.3f})", geo_rows, list(geo_rows[0])), "",
            table(f"Language identity and erasure ({model_name}; nearest-language-mean accuracy, chance {lg.chance:.2f}; "
                  f"overlap = squared projection of the refusal direction on the rank-{lg.rank} language subspace, "
                  f"random {lg.random_overlap:.4f}; ratio / AUROC after LEACE-erasing language vs a random rank-{lg.rank} "
                  f"erasure)", lang_rows, list(lang_rows[0])), "",
            "Notes: " + ("; ".join(res.notes) if res.notes else "none"), ""]


def neuron_section(model, data, args) -> list[str]:
    t0 = time.time()
    res = safety_neurons(model, data, k=args.k, n_candidates=4 * args.k, n_random=args.n_random,
                         runtime=Runtime(batch_size=32, seed=args.seed))
    ov = res.overlap
    pair_rows = [{"a": a, "b": b, "shared": int(ov.intersections[i, j]), "jaccard": float(ov.jaccard[i, j])}
                 for i, a in enumerate(ov.names) for j, b in enumerate(ov.names) if i < j]
    rows = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in res.to_frame().to_dict("records")]
    return [table(f"Safety neurons per language ({model.name}; top {4 * args.k} mlp_post neurons by harmful-vs-harmless "
                  f"effect size on train prompts, then the {args.k} whose zero-ablation most lowers the refusal score "
                  f"on that language's val prompts; pairwise overlaps, chance {res.chance_pairwise:.3f} shared per pair; "
                  f"{len(ov.common)} common to all)", pair_rows, list(pair_rows[0])), "",
            table(f"Ablating each language's neurons (and the common ones) on every language's harmful test prompts: "
                  f"change of the mean refusal score (log-odds of a refusal first token) vs {args.n_random} random "
                  f"sets of the same size from the same layers ({time.time() - t0:.0f} s)", rows, list(rows[0])), ""]


def pathway_section(model, data, args) -> list[str]:
    from interp.studies.multilingual.pathways import refusal_pathways

    t0 = time.time()
    res = refusal_pathways(model, data, layers=range(0, model.n_layers, 2))
    def ci(r: dict, name: str) -> str:
        return f"{r[f'{name}_lo']:.2f} to {r[f'{name}_hi']:.2f}"

    rows = [{"lang": r["lang"], "layer": r["layer"], "site": r["site"], "restored": round(r["restored"], 3),
             "restored CI": ci(r, "restored"), "control": round(r["control"], 3), "control CI": ci(r, "control"),
             "excess": round(r["excess"], 3), "excess CI": ci(r, "excess"),
             "beyond control": "yes" if r["excess_lo"] > 0 else ""} for r in res.to_frame().to_dict("records")]
    gaps = ", ".join(f"{lang} {res.source_score[lang]:.2f} vs {res.target_score[lang]:.2f}" for lang in res.langs)
    return [table(f"Patching English into other-language runs ({model.name}; {res.n_pairs} harmful test pairs, the "
                  f"{res.n_positions} post-instruction tokens; restored = share of the English-minus-language refusal "
                  f"score gap closed; control = the same from English harmless prompts; excess = restored - control; 95% "
                  f"paired bootstrap intervals over pairs ({res.n_boot} resamples); every other layer; mean refusal "
                  f"scores English vs language: {gaps}; {time.time() - t0:.0f} s)", rows, list(rows[0])), ""]


def feature_section(model, data, layer: int, args) -> list[str]:
    from interp.studies.multilingual.features import features_by_language

    t0 = time.time()
    res = features_by_language(model, data, layer, top=args.top_features, max_new_tokens=args.max_new_tokens,
                               runtime=Runtime(batch_size=32, seed=args.seed))
    pair_rows = [{"a": a, "b": b, "shared": v} for (a, b), v in res.shared.items()]
    rows = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in res.rows]
    feat = "; ".join(f"{lang}: {v} (AUROC {min(res.aurocs[lang]):.2f}-{max(res.aurocs[lang]):.2f})"
                     for lang, v in res.features.items())
    return [f"SAE at resid_pre.{layer}: d_sae {res.d_sae}, TopK 32, trained on every language's train prompts "
            f"({res.sae_quality}); top {res.top} safety latents per language by harmful-vs-harmless AUROC: {feat}; "
            f"common to all: {res.common}", "",
            table(f"Safety latents shared between languages (chance {res.chance_shared:.3f} per pair)", pair_rows,
                  list(pair_rows[0])), "",
            table(f"Ablating a language's safety latents (SAE error kept, every token) on its harmful test prompts vs "
                  f"as many random latents active on them ({model.name}; {time.time() - t0:.0f} s)", rows, list(rows[0])),
            ""]


def studies_only(model, data, args) -> None:
    """Each chosen study, printed and (``--write``) put in the results file under a fixed heading as it finishes
    (its tables' own headings become ``####``)."""
    if args.features and args.layer is None:
        raise SystemExit("--no-retention --features needs --layer (the retention's ablated layer, e.g. 11)")
    chosen = {"neurons": lambda: neuron_section(model, data, args), "pathways": lambda: pathway_section(model, data, args),
              "features": lambda: feature_section(model, data, args.layer, args)}
    for name, run in chosen.items():
        if not getattr(args, name):
            continue
        t0 = time.time()
        body = [line.replace("### ", "#### ", 1) if line.startswith("### ") else line for line in "\n".join(run()).split("\n")]
        heading = f"### {model.name}: the {name} study at full size"
        flag = f"--{name}" + (f" --layer {args.layer}" if name == "features" else "")
        section = "\n".join([heading, "", *body, f"Command: `python benchmarks/study_multilingual.py --model {model.name} "
                              f"--no-retention {flag} --write`; {time.time() - t0:.0f} s on {machine()}, load "
                              f"{os.getloadavg()[0]:.1f}", ""])
        print(section, flush=True)
        if args.write:
            replace_section(REPO / "benchmarks" / "RESULTS_multilingual.md", heading, section)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-aligned")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "multilingual")
    ap.add_argument("--ablate-positions", default="post_instruction", choices=("post_instruction", "all"))
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--n", type=int, default=None, help="prompts per kind and split (default: all)")
    ap.add_argument("--every", type=int, default=3, help="layers shown in the by-layer tables (and the ablated one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--neurons", action="store_true", help="also the safety-neuron study")
    ap.add_argument("--k", type=int, default=16, help="neurons per language (--neurons)")
    ap.add_argument("--n-random", type=int, default=20)
    ap.add_argument("--pathways", action="store_true", help="also the English -> language patching sweep")
    ap.add_argument("--features", action="store_true", help="also the SAE features by language (at the ablated layer)")
    ap.add_argument("--top-features", type=int, default=8)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--no-retention", action="store_true",
                    help="only the --neurons / --pathways / --features studies (needs --layer for --features)")
    ap.add_argument("--layer", type=int, default=None, help="the SAE layer with --no-retention --features")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    model = load_model(args.model)
    data = load_parallel_safety(n=args.n)
    if args.no_retention:
        studies_only(model, data, args)
        return
    res = refusal_retention(model, data, RetentionConfig(ablate_positions=args.ablate_positions,
                                                         max_new_tokens=args.max_new_tokens, seed=args.seed))
    wall = time.time() - t0
    print(res.report())
    print("report:", write_retention(res, args.out / f"{args.model}-{args.ablate_positions}", overwrite=True))
    text = "\n".join(sections(res, args.model, wall, args) + (neuron_section(model, data, args) if args.neurons else [])
                     + (pathway_section(model, data, args) if args.pathways else [])
                     + (feature_section(model, data, res.layer, args) if args.features else []))
    print(text)
    if args.write:
        append_section(REPO / "benchmarks" / "RESULTS_multilingual.md", text)
    print(json.dumps({"wall_s": round(wall, 1)}))


if __name__ == "__main__":
    main()
