"""``interp patch``: where does the clean run's behaviour live? Activation patching over layers and positions.

Clean and corrupted prompts are paired line by line; each site of the clean run is patched into the
corrupted run, one (layer, position) at a time and one (layer, component) at a time, and a metric read at
the last token says how much of the clean behaviour each patch restores (1 = all of it, 0 = none).
"""

from __future__ import annotations

import argparse
from typing import Any

from interp.cli.jobs import JobFolder, add_out_args, load, option, prompts_of, run_job

COMPONENTS = "resid_pre,attn_out,mlp_out"


def add_patch_parser(sub: Any, model_args: Any) -> None:
    p = sub.add_parser("patch", help="activation patching (clean -> corrupted) over layers x positions and "
                                     "layers x components, with a logit-difference or refusal metric")
    model_args(p)
    p.add_argument("--clean", required=True, help="CSV/JSON/JSONL/text file of clean prompts (the behaviour to find)")
    p.add_argument("--corrupted", required=True, help="file of corrupted prompts, paired 1:1 with --clean by order")
    option(p, "--column", None, "column/key of the clean file's prompt; none: the first of instruction, prompt, ...")
    option(p, "--corrupted-column", None, "column/key of the corrupted file; none: found the same way "
                                          "(not copied from --column)")
    option(p, "--answer", None, "the clean run's answer token, for --metric logit_diff (one token, e.g. ' Paris')")
    option(p, "--wrong", None, "the corrupted run's answer token, for --metric logit_diff")
    option(p, "--metric", None, "logit_diff (logit[answer] - logit[wrong]) or refusal (log-odds of a refusal "
                                "opening); none: logit_diff when --answer is given, else refusal",
           choices=("logit_diff", "refusal"))
    option(p, "--site", "resid_pre", "site kind patched in the layer x position sweep")
    option(p, "--components", COMPONENTS, "comma-separated site kinds of the layer x component sweep "
                                          "(every aligned position patched at once)")
    option(p, "--align", "end", "align positions from the end (chat suffixes line up) or from the start",
           choices=("end", "start"))
    option(p, "--batch-size", 64, "rows (patch variants x pairs) per forward pass", type=int)
    p.add_argument("--raw", action="store_true", help="do not wrap prompts in the chat template (default: wrap)")
    add_out_args(p, "runs/patch")
    p.set_defaults(func=cmd_patch)


def cmd_patch(args: argparse.Namespace) -> int:
    return run_job(args, "patch", (), lambda folder: patch_job(args, folder))


def token_id(tokenizer: Any, token: str, flag: str) -> int:
    """The id of a string that must be exactly one token."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        pieces = [tokenizer.decode([i]) for i in ids]
        raise ValueError(f"{flag} {token!r} is {len(ids)} tokens {pieces}; give a single token (e.g. one of those)")
    return int(ids[0])


def make_metric(args: argparse.Namespace, tokenizer: Any) -> tuple[Any, dict[str, Any]]:
    """The metric the flags ask for, and its description for result.json."""
    from interp import patching

    kind = args.metric or ("logit_diff" if args.answer is not None else "refusal")
    if kind == "logit_diff":
        if args.answer is None or args.wrong is None:
            raise ValueError("--metric logit_diff needs both --answer TOKEN and --wrong TOKEN; or use --metric refusal")
        a, w = token_id(tokenizer, args.answer, "--answer"), token_id(tokenizer, args.wrong, "--wrong")
        return patching.logit_diff(a, w), {"metric": kind, "answer": args.answer, "answer_id": a,
                                           "wrong": args.wrong, "wrong_id": w}
    if args.answer is not None or args.wrong is not None:
        raise ValueError("--answer/--wrong only apply to --metric logit_diff; drop them or pass --metric logit_diff")
    ids = patching.measures.refusal_token_ids(tokenizer)
    return patching.refusal_score(ids), {"metric": kind, "refusal_token_ids": ids}


def patch_job(args: argparse.Namespace, folder: JobFolder) -> dict[str, Any]:
    """Pair the prompts, run both sweeps, write result, heatmaps and page."""
    from interp import patching
    from interp.values import Prompts, Runtime

    clean = prompts_of(args.clean, args.column, "--clean")
    corrupted = prompts_of(args.corrupted, args.corrupted_column, "--corrupted")
    if len(clean) != len(corrupted):
        raise ValueError(f"{len(clean)} clean but {len(corrupted)} corrupted prompts; pair them 1:1 (same count, "
                         f"same order)")
    model = load(args)
    metric, described = make_metric(args, model.tokenizer)
    pairs = patching.make_pairs(model, Prompts(clean, chat=not args.raw), Prompts(corrupted, chat=not args.raw),
                                align=args.align)
    run = Runtime(batch_size=args.batch_size)
    by_pos = patching.sweep_positions(model, pairs, metric, site=args.site, runtime=run)
    by_comp = patching.sweep_layers(model, pairs, metric, sites=tuple(args.components.split(",")), runtime=run)
    result = {**described, "n_pairs": pairs.n_pairs, "align": args.align, "baseline_corrupted": by_pos.baseline,
              "reference_clean": by_pos.reference, "positions": sweep_json(by_pos), "components": sweep_json(by_comp)}
    folder.write_json("result.json", result)
    norm = result["positions"]["normalized"] is not None
    figures = {"positions": by_pos.plot(normalized=norm, title=f"patching {args.site}: layer x position "
                                                              f"({'share of the clean-corrupted gap restored' if norm else 'metric'})"),
               "components": by_comp.plot(normalized=norm, title="patching each component at every aligned position")}
    top = by_pos.top(3)
    facts = [("model", model.name), ("pairs", pairs.n_pairs), ("metric", described["metric"]),
             ("metric on corrupted (baseline)", by_pos.baseline), ("metric on clean (reference)", by_pos.reference),
             ("largest effects (layer, position, change)", "; ".join(f"{r}, {c}, {v:+.3g}" for r, c, v in top))]
    if not norm:
        facts.append(("note", "clean and corrupted runs give the same metric, so effects are shown unnormalised"))
    folder.write_report(f"interp patch: {model.name}", facts, figures)
    return {"pairs": pairs.n_pairs, "metric": described["metric"], "corrupted baseline": by_pos.baseline,
            "clean reference": by_pos.reference, "top cell": f"layer {top[0][0]}, position {top[0][1]}"}


def sweep_json(sweep: Any) -> dict[str, Any]:
    """A sweep's grid as plain lists: rows, columns, values and (when defined) normalised effects."""
    try:
        normalized = sweep.normalized().tolist()
    except ValueError:
        normalized = None
    return {"site": sweep.site, "row_name": sweep.row_name, "col_name": sweep.col_name, "rows": sweep.rows,
            "cols": sweep.cols, "values": sweep.values.tolist(), "normalized": normalized}


__all__ = ["add_patch_parser", "cmd_patch", "make_metric", "patch_job", "sweep_json", "token_id"]
