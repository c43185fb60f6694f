"""``interp probe``: is a concept linearly readable, layer by layer? Held-out probe scores with a control.

Captures a positive and a negative prompt set, cross-validates a probe at every site with the shuffled-label
control (Hewitt & Liang) so selectivity is visible, and saves the difference-of-means direction for
``interp steer``.
"""

from __future__ import annotations

import argparse
from typing import Any

from interp.cli.jobs import JobFolder, add_out_args, load, option, prompts_of, run_job
from interp.values import Prompts, Runtime

METRICS = ("accuracy", "auroc", "cohens_d", "control_accuracy", "control_auroc", "selectivity")
POSITIONS = ("last", "post_instruction", "prompt_mean")


def add_probe_parser(sub: Any, model_args: Any) -> None:
    p = sub.add_parser("probe", help="cross-validated linear probes per layer with a shuffled-label control, "
                                     "and the difference-of-means direction")
    model_args(p)
    p.add_argument("--positive", required=True, help="CSV/JSON/JSONL/text file of prompts of the positive class "
                                                     "(e.g. harmful requests)")
    p.add_argument("--negative", required=True, help="file of prompts of the negative class (e.g. harmless)")
    option(p, "--column", None, "column/key of the positive file's prompt; none: the first of instruction, "
                                "prompt, goal, text, ...")
    option(p, "--negative-column", None, "column/key of the negative file's prompt; none: found the same way "
                                         "(not copied from --column)")
    option(p, "--sites", "resid_post", "comma-separated sites; a kind alone (resid_post) means every layer")
    option(p, "--positions", "last", "which token's activation represents a prompt", choices=POSITIONS)
    option(p, "--folds", 5, "cross-validation folds", type=int)
    option(p, "--method", "logistic", "probe: logistic, or a direction method scored by projection",
           choices=("logistic", "mean_diff", "pca_diff", "lda"))
    option(p, "--seed", 0, "seed of the folds and the shuffled-label control", type=int)
    option(p, "--batch-size", 16, "prompts per forward pass", type=int)
    p.add_argument("--raw", action="store_true", help="do not wrap prompts in the chat template (default: wrap)")
    add_out_args(p, "runs/probe")
    p.set_defaults(func=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    return run_job(args, "probe", ("direction",), lambda folder: probe_job(args, folder))


def probe_inputs(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    """Prompts (positive first) and their 1/0 labels."""
    pos = prompts_of(args.positive, args.column, "--positive")
    neg = prompts_of(args.negative, args.negative_column, "--negative")
    if args.folds < 2:
        raise ValueError(f"--folds must be at least 2, got {args.folds}")
    if min(len(pos), len(neg)) < args.folds:
        raise ValueError(f"{len(pos)} positive and {len(neg)} negative prompts cannot fill {args.folds} folds; "
                         f"give at least {args.folds} of each or lower --folds")
    return pos + neg, [1] * len(pos) + [0] * len(neg)


def probe_job(args: argparse.Namespace, folder: JobFolder) -> dict[str, Any]:
    """Capture, cross-validate, fit the direction, write the outputs; returns the summary rows."""
    import interp
    import probes

    prompts, labels = probe_inputs(args)
    model = load(args)
    acts = interp.capture(model, Prompts(prompts, chat=not args.raw, labels=labels),
                          sites=args.sites.split(","), positions=args.positions,
                          runtime=Runtime(batch_size=args.batch_size))
    try:
        scores = probes.cross_validate(acts, method=args.method, positive=1,
                                       config=probes.CVConfig(n_folds=args.folds), runtime=Runtime(seed=args.seed))
    except ValueError as e:
        raise ValueError(f"{e} (in some held-out fold); give more prompts of each class or lower --folds") from None
    direction = probes.diff_of_means(acts, positive=1)
    direction.save(folder.path("direction"))
    result = probe_result(scores, args, n_pos=sum(labels), n_neg=len(labels) - sum(labels))
    folder.write_json("result.json", result)
    best = result["best_layer"]
    figures = {"scores": scores.plot(metrics=("accuracy", "auroc"),
                                     title=f"{args.method} probe: held-out scores by layer (control: shuffled labels)"),
               "projection": _projection_figure(direction, acts, labels, best["index"], best["site"])}
    facts = [("model", model.name), ("positive prompts", result["n_positive"]),
             ("negative prompts", result["n_negative"]), ("sites", args.sites), ("positions", args.positions),
             ("method / folds", f"{args.method} / {scores.meta['n_folds']}"),
             ("best site (held-out AUROC)", best["site"]), ("AUROC there", best["auroc"]),
             ("accuracy there", best["accuracy"]), ("control accuracy there", best.get("control_accuracy")),
             ("direction", f"{folder.path('direction')} (difference of means, every site)")]
    folder.write_report(f"interp probe: {model.name}", facts, figures)
    return {"best site": best["site"], "AUROC": best["auroc"], "accuracy": best["accuracy"],
            "control accuracy": best.get("control_accuracy"), "direction": str(folder.path("direction"))}


def probe_result(scores: Any, args: argparse.Namespace, n_pos: int, n_neg: int) -> dict[str, Any]:
    """``result.json``: per-site means (and stds) over folds of every metric, and the best site by AUROC."""
    from interp.sites import parse_site

    layers = []
    for j, site in enumerate(scores.sites):
        row: dict[str, Any] = {"site": site, "layer": parse_site(site).layer}
        for m in METRICS:
            v = getattr(scores, m)
            if v is not None:
                row[m] = float(v[:, j].mean())
                row[m + "_std"] = float(v[:, j].std()) if v.shape[0] > 1 else 0.0
        layers.append(row)
    b = scores.best_layer("auroc")
    best = {"index": b, **layers[b]}
    return {"method": scores.method, "n_folds": scores.meta["n_folds"], "seed": args.seed, "positions": args.positions,
            "n_positive": n_pos, "n_negative": n_neg, "control": scores.control_accuracy is not None,
            "model_id": scores.model_id, "data_hash": scores.data_hash, "layers": layers, "best_layer": best,
            "direction": "direction"}


def _projection_figure(direction: Any, acts: Any, labels: list[int], index: int, site: str) -> Any:
    """Histogram of both classes' projections on the direction at the best site (fitted on all prompts)."""
    from interp.viz.probes import projection_histogram

    proj = direction.project(acts)[:, index]
    names = ["positive" if y else "negative" for y in labels]
    return projection_histogram(proj, names, title=f"projection on the difference-of-means direction at {site} "
                                                   f"(in-sample)")


__all__ = ["add_probe_parser", "cmd_probe", "probe_job", "probe_result"]
