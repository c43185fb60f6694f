"""``interp refusal``: the refusal-direction analysis from the command line, with a live stage display."""

from __future__ import annotations

import argparse
import time
from typing import Any

STAGES = ("tokens", "candidates", "estimate", "scores", "selection", "evaluation", "writers", "subspaces", "frontier", "report")


def add_refusal_parser(sub: Any, model_args: Any) -> None:
    p = sub.add_parser("refusal", help="find, test and bake the refusal direction (Arditi et al. 2024)")
    from interp.studies.kit.config import DEFAULT_REFUSAL_MODEL

    model_args(p, DEFAULT_REFUSAL_MODEL)
    p.add_argument("--harmful", default=None, help="CSV/JSON/JSONL/text file of harmful instructions "
                   "(default: our own realistic set; the toy organism's synthetic set for --model organism)")
    p.add_argument("--harmless", default=None, help="file of harmless instructions (default: our own realistic "
                   "set of 519; the toy organism's synthetic set for --model organism)")
    p.add_argument("--column", default=None, help="column/key of the harmful file's instruction (default: detected)")
    p.add_argument("--harmless-column", default=None, help="column/key of the harmless file's "
                   "instruction (default: detected from that file, independent of --column)")
    p.add_argument("--out", default="runs/refusal", help="run folder, resumable; another run's folder is refused "
                   "(default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace another run's outputs in --out (default: off)")
    p.add_argument("--n-train", type=int, default=64, help="training prompts per class (default: %(default)s)")
    p.add_argument("--n-val", type=int, default=32, help="validation prompts per class, for candidate scoring "
                   "(default: %(default)s)")
    p.add_argument("--n-test", type=int, default=64, help="test prompts per class, for evaluation (default: %(default)s)")
    _selection_args(p)
    p.add_argument("--max-new-tokens", type=int, default=24, help="tokens generated per answer (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="prompts per forward / generate batch "
                   "(default: %(default)s)")
    p.add_argument("--max-rows", type=int, default=256, help="rows per forward when scoring candidates; the "
                   "evaluation generates max-rows // batch-size conditions per batch (default: %(default)s)")
    p.add_argument("--subspace-rank", type=int, default=8, help="largest per-category subspace to ablate "
                   "(default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads for the run (default: torch's own)")
    p.add_argument("--layers", default=None, help="comma-separated candidate layers (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed for data splits and random controls (default: %(default)s)")
    p.add_argument("--save-model", action="store_true", help="also save the baked (direction-ablated) model "
                   "(default: off)")
    p.add_argument("--borderline", default=None, help="file of borderline-benign prompts (benign look-alikes of "
                   "harmful requests) for over-refusal; 'none' leaves it out (default: our own set for real models, "
                   "none for the toy organism)")
    p.add_argument("--borderline-column", default=None, help="column/key of the borderline file (default: detected)")
    p.add_argument("--n-borderline", type=int, default=64, help="borderline prompts used (default: %(default)s)")
    p.add_argument("--judge", default=None, help="refusal judge: 'phrases' (refusal phrases anchored at the start "
                   "of the response) or a local HF sequence-classification model folder (default: phrases)")
    p.set_defaults(func=cmd_refusal)


def _selection_args(p: argparse.ArgumentParser) -> None:
    """The search, its filters and the diagnosis before it (changing a filter re-runs selection only)."""
    from interp.studies.kit.config import RANDOM_KL

    p.add_argument("--kl-threshold", type=float, default=0.1, help="keep candidates whose ablation moves harmless "
                   "next-token KL below this; changing it on a finished run re-runs selection only (default: %(default)s)")
    p.add_argument("--kl-reference", choices=("absolute", "random"), default="absolute", help="absolute: the KL "
                   "filter keeps candidates below --kl-threshold (the paper); random: below the larger of it and the "
                   f"highest KL of {RANDOM_KL} random unit directions ablated the same way (for a model on which any ablation "
                   "costs about the threshold; stated as a relaxed filter); re-runs selection only (default: %(default)s)")
    p.add_argument("--prune-layer-fraction", type=float, default=0.2, help="drop candidates in the last fraction of "
                   "layers; re-runs selection only (default: %(default)s)")
    p.add_argument("--induce-threshold", type=float, default=0.0, help="keep candidates whose addition raises the "
                   "harmless refusal score above this; re-runs selection only (default: %(default)s)")
    p.add_argument("--search", choices=("estimate", "exhaustive", "frontier"), default="estimate", help="estimate: rank every "
                   "candidate by an attribution estimate (one forward and a few backwards per batch) and score only the --top-k "
                   "exactly; exhaustive: score every candidate exactly; frontier: the estimate search, then the "
                   "refusal-vs-damage frontier (a seeded Optuna search of the abliteration families, confirmed on the "
                   "test prompts; --save-model saves its chosen point) (default: %(default)s)")
    p.add_argument("--trials", type=int, default=48, help="the frontier search's Optuna budget (default: %(default)s)")
    p.add_argument("--frontier-target", type=float, default=0.10, help="the frontier's rule: the lowest KL among points "
                   "with held-out harmful refusal at most this, else the lowest refusal (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=8, help="candidates scored exactly with --search estimate "
                   "(default: %(default)s)")
    p.add_argument("--ablate-positions", choices=("auto", "all", "post_instruction"), default="auto", help="where a "
                   "candidate is ablated: all: every token (the paper; bakeable into weights); post_instruction: the "
                   "prompt's post-instruction tokens and every generated token (hooks only); auto: every token "
                   "first, post-instruction only if no every-token candidate passes the filters, said in the notes "
                   "(default: %(default)s)")
    p.add_argument("--min-refusals", type=int, default=8, help="find refusal tokens only from at least this many "
                   "refused harmful train prompts; fewer stops the run with that finding (default: %(default)s)")
    p.add_argument("--diagnosis-alpha", type=float, default=0.01, help="stop before scoring unless harmful train "
                   "prompts are refused more often than harmless ones, one-sided Fisher exact p below this "
                   "(default: %(default)s)")


def _frontier_config(args: argparse.Namespace) -> Any:
    """``--search frontier``: the frontier search's settings (its budget checked here, before any model loads)."""
    from interp.studies.refusal.frontier import FrontierConfig

    return None if args.search != "frontier" else FrontierConfig(
        trials=args.trials, seed=args.seed, target=args.frontier_target, max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size)


def cmd_refusal(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from interp.studies.refusal.run import RefusalConfig, run_refusal

    cfg = RefusalConfig.from_flat(
        model=args.model, harmful=args.harmful, harmless=args.harmless, column=args.column,
        harmless_column=args.harmless_column, n_train=args.n_train, n_val=args.n_val, n_test=args.n_test,
        kl_threshold=args.kl_threshold, kl_reference=args.kl_reference, prune_layer_fraction=args.prune_layer_fraction,
        induce_threshold=args.induce_threshold, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
        max_rows=args.max_rows, subspace_rank=args.subspace_rank, seed=args.seed, dtype=args.dtype,
        device=args.device, layers=[int(x) for x in args.layers.split(",")] if args.layers else None,
        save_model=args.save_model, borderline=args.borderline, borderline_column=args.borderline_column,
        n_borderline=args.n_borderline, min_refusals=args.min_refusals, diagnosis_alpha=args.diagnosis_alpha,
        judge=args.judge, search="estimate" if args.search == "frontier" else args.search, top_k=args.top_k,
        threads=args.threads, ablate_positions=args.ablate_positions)
    frontier = _frontier_config(args)
    con = Console()
    state = {s: ("waiting", None) for s in STAGES}
    t_start = time.perf_counter()

    def render() -> Table:
        t = Table(title=f"interp refusal: {cfg.runtime.model} -> {args.out}")
        t.add_column("stage")
        t.add_column("status")
        t.add_column("seconds", justify="right")
        # stages in the order they ran (an "auto" run's post-instruction search after the every-token one), then
        # those still waiting
        order = sorted(started, key=started.__getitem__) + [s for s in state if s not in started]
        for s in order:
            st, sec = state[s]
            t.add_row(s, st, "" if sec is None else f"{sec:.1f}")
        return t

    started: dict[str, float] = {}
    with Live(render(), console=con, refresh_per_second=4, transient=False) as live:
        def progress(stage: str, status: str) -> None:
            if stage not in state:
                state[stage] = ("waiting", None)
            if status == "start":
                started[stage] = time.perf_counter()
                state[stage] = ("running", None)
            elif status == "cached":
                state[stage] = ("cached (resumed)", None)
            else:
                state[stage] = ("done", time.perf_counter() - started.get(stage, time.perf_counter()))
            live.update(render())

        res = run_refusal(cfg, args.out, overwrite=args.overwrite, progress=progress, frontier=frontier)
        for s in STAGES:
            if state[s][0] == "waiting":
                state[s] = ("skipped", None)
        live.update(render())
    con.print(summary_table(res.metrics))
    for n in res.notes:
        con.print(f"[yellow]note:[/yellow] {n}")
    con.print(f"outputs in {res.out} (report: {res.out / 'report.html'}); {time.perf_counter() - t_start:.0f} s")
    return 0


def summary_table(m: dict) -> Any:
    from rich.table import Table

    from interp.studies.refusal.conditions import KL_CONTROLS

    t = Table(title="Refusal direction: summary")
    t.add_column("measure")
    t.add_column("value", justify="right")
    diag = m.get("diagnosis")
    if diag:
        tr = diag["train_refusal"]
        t.add_row("baseline refusal (train): harmful", _rate(tr["harmful"]))
        t.add_row("baseline refusal (train): harmless", _rate(tr["harmless"]))
        t.add_row("model refuses harmful > harmless", f"{diag['refuses']} (Fisher p = {diag['p_value']:.2g})")
    t.add_row("direction found", str(m.get("found_direction")))
    sel = m.get("selection", {})
    if sel.get("ablate_positions"):
        search = [x["ablate_positions"] for x in sel.get("ablation_search", [])]
        t.add_row("ablated at", sel["ablate_positions"] + (f" (auto: searched {' then '.join(search)})"
                                                            if len(search) > 1 else ""))
    if m.get("found_direction"):
        t.add_row("layer / position", f"{sel['layer']} / {sel['position']} ({sel['position_token']!r})")
        t.add_row("KL on harmless (val)", f"{sel['kl']:.4f}")
    ev = m.get("evaluation")
    if ev:
        for k, r in ev["refusal"].items():
            t.add_row(f"refusal rate: {k}" + (" (over-refusal)" if k.startswith("borderline") else ""), _rate(r))
        eq = ev["hook_vs_baked"]
        diff, against = eq["max_abs_logit_diff"], eq.get("compared_with", "harmful/ablation")
        t.add_row("hook vs baked max |logit diff|", "not bakeable (post-instruction ablation)" if diff is None
                  else f"{diff:.2e}" + ("" if against == "harmful/ablation" else f" (against {against})"))
        kc = ev["harmless_kl_ce"]
        if kc:
            t.add_row("harmless KL (first response token)", f"{kc['kl_first_response_token']:.4f}" + "".join(
                f" ({name} {kc[f'kl_first_response_token ({name})']:.4f})" for name in KL_CONTROLS
                if f"kl_first_response_token ({name})" in kc))
            t.add_row("harmless CE baseline -> ablated", f"{kc['ce_baseline']:.3f} -> {kc['ce_edited']:.3f}")
    fr = m.get("frontier")
    if fr:
        c = fr["summary"]["chosen"]
        t.add_row("frontier: chosen point (held-out harmful refusal)", f"{100 * c['harmful_refusal']:.0f}% (95% CI "
                  f"{100 * c['harmful_ci95'][0]:.0f}-{100 * c['harmful_ci95'][1]:.0f}%; random control "
                  f"{100 * c['control_refusal']:.0f}%)")
        t.add_row("frontier: chosen point KL / CE", f"{c['kl']:.4f} / {c['ce']:.3f}")
    return t


def _rate(r: dict) -> str:
    """``rate (k/n, 95% CI)`` for the summary table."""
    return f"{100 * r['rate']:.0f}% ({r['k']}/{r['n']}, 95% CI {100 * r['ci95'][0]:.0f}-{100 * r['ci95'][1]:.0f}%)"
