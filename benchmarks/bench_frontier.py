"""The refusal-vs-damage frontier (issue 36) on one model: the job's refusal tokens and candidates, then the seeded
Optuna search, exact rescoring of its Pareto front and the confirmation of the front by generation and the judge
(held-out harmful refusal [95% CI], harmless KL and CE, over-refusal, a same-strength random control per point),
timed; writes the table to ``benchmarks/RESULTS_frontier_ours.md``.

    nice -n 10 python benchmarks/bench_frontier.py --model smollm2-aligned --trials 40 --threads 2
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS_frontier.md"      # the side-by-side file (bench_heretic.py writes heretic's sections)
PLACEHOLDER = "### Our frontier"


def cpu() -> float:
    """This process's user + system CPU seconds (on a shared machine, fairer than wall seconds)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_side_by_side(model: str, lines: list[str], path: Path = RESULTS) -> None:
    """Our section for ``model`` in ``RESULTS_frontier.md`` (``### Our frontier on <model>``, replacing the empty
    placeholder section bench_heretic.py leaves and any earlier section for that model); other sections kept."""
    sys.path.insert(0, str(HERE.parent))
    from benchmarks._common import replace_section, write_text

    old = path.read_text().split("\n") if path.exists() else ["# The refusal-vs-damage frontier (issue 36)", ""]
    if PLACEHOLDER in old:
        i = old.index(PLACEHOLDER)
        j = next((k for k in range(i + 1, len(old)) if old[k].startswith("### ")), len(old))
        old = old[:i] + old[j:]
    write_text(path, "\n".join(old).rstrip("\n") + "\n")
    heading = f"{PLACEHOLDER} on {model}"
    replace_section(path, heading, "\n".join([heading, "", *lines]).rstrip("\n") + "\n")


def _ci(r: dict) -> str:
    return f"{r['rate']:.0%} [{r['ci95'][0]:.0%}, {r['ci95'][1]:.0%}] ({r['k']}/{r['n']})"


def table(res, seconds: dict) -> list[str]:
    """The result's confirmed points as markdown rows, the baseline first."""
    b = res.baseline
    over = f"{b['borderline']['rate']:.0%}" if "borderline" in b else "-"
    rows = ["| point | variant | orth. | dir. index | val score | val KL | held-out harmful refusal [95% CI] | "
            "harmless KL | CE (base) | over-refusal | random control refusal | control KL | chosen |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            f"| baseline | - | - | - | {b['val_refusal_score']:.2f} | 0 | {_ci(b['harmful'])} | 0 | - | {over} | - | - | |"]
    for i in range(len(res.points)):
        r, p = res.point_row(i), res.points[i]
        rows.append(f"| {i} | {r['variant']} ({r['scope']}) | {r['orthogonalize']} | {r['direction_index']:.2f} | "
                    f"{r['val_refusal_score']:.2f} | {r['val_kl']:.3f} | {_ci(p['harmful'])} | {r['kl']:.3f} | "
                    f"{r['ce']:.3f} ({r['ce_baseline']:.3f}) | "
                    f"{'-' if r['over_refusal'] is None else format(r['over_refusal'], '.0%')} | "
                    f"{_ci(p['control_harmful'])} | {r['control_kl']:.3f} | {'yes' if r['chosen'] else ''} |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-aligned")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-points", type=int, default=3)
    ap.add_argument("--reuse-search", default="", help="a saved FrontierResult whose trials are rescored and "
                    "confirmed again instead of a new search (same model and data)")
    ap.add_argument("--ranges", default="heretic", choices=("heretic", "wide"), help="the search space (FrontierConfig)")
    ap.add_argument("--out", default=str(HERE / "RESULTS_frontier_ours.md"))
    ap.add_argument("--save", default="", help="also save the FrontierResult to this path (FrontierResult.load)")
    ap.add_argument("--side-by-side", default=str(RESULTS), help="also our section in this file ('' : not)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import interp
    from interp.studies.kit.config import DataConfig
    from interp.studies.kit.prompt_sets import load_refusal_data
    from interp.studies.kit.stages import find_candidates, find_refusal_tokens
    from interp.studies.refusal.frontier import FrontierConfig, run_frontier
    from interp.studies.refusal.frontier_result import FrontierResult

    t0, c0 = time.perf_counter(), cpu()
    model = interp.load_model(a.model)
    data = load_refusal_data(model.name, DataConfig())
    t1 = time.perf_counter()
    tokens = find_refusal_tokens(model, data, 12, 64)
    cand = find_candidates(model, data)
    t2 = time.perf_counter()
    print(f"tokens + candidates: {t2 - t1:.0f} s", file=sys.stderr, flush=True)
    res = run_frontier(model, data, cand, tokens.tokens, FrontierConfig(trials=a.trials, seed=a.seed,
                                                                         max_points=a.max_points, ranges=a.ranges),
                       searched=FrontierResult.load(a.reuse_search) if a.reuse_search else None)
    t3, c3 = time.perf_counter(), cpu()
    if a.save:      # the whole result first, so a failure below loses no measurement
        res.save(a.save, overwrite=True)
    s = res.seconds
    reach = [i for i, p in enumerate(res.points) if p["harmful"]["rate"] <= 0.10]
    base = res.baseline["harmful"]["rate"]
    off = [i for i, p in enumerate(res.points) if abs(p["control_harmful"]["rate"] - base) > 0.05]
    side = res.side_effect
    lines = [f"# The refusal-vs-damage frontier, ours ({a.model})", "",
             f"Command: `{f'nice -n {os.nice(0)} ' if os.nice(0) else ''}python benchmarks/bench_frontier.py --model {a.model} --trials {a.trials} "
             f"--threads {a.threads} --max-points {a.max_points} --ranges {a.ranges}{f' --reuse-search {a.reuse_search}' if a.reuse_search else ''}{f' --save {a.save}' if a.save else ''}`", "",
             f"Machine: {platform.machine()}, {a.threads} torch threads on a 2-core machine shared with other jobs; "
             f"python {sys.version.split()[0]}, torch {torch.__version__}. Data: {data.sizes()}.", "",
             f"Search: Optuna {res.settings['sampler'].upper()} (seed {a.seed}), {a.trials} trials, each one forward "
             f"over {res.settings['n_screen']} harmful + {res.settings['n_screen']} harmless validation prompts; the "
             f"screen's Pareto front rescored on the whole validation split; up to {a.max_points} points confirmed "
             f"on the held-out test prompts (greedy, {res.settings['max_new_tokens']} tokens, the anchored phrase "
             f"judge). Rule: {res.rule}.", "", *table(res, s), "",
             f"Time (s): load {t1 - t0:.0f}, refusal tokens + candidates {t2 - t1:.0f}, search {s['search']:.0f}, "
             f"rescore {s['rescore']:.0f}, confirm {s['confirm']:.0f}, side effect {s['side_effect']:.0f}; "
             f"frontier total {t3 - t2:.0f}; all {t3 - t0:.0f} s wall, {c3 - c0:.0f} s CPU (user + system, this "
             f"process).", "",
             f"Points with held-out harmful refusal <= 10%: {reach or 'none'}"
             + (f" (lowest KL among them: {min(res.points[i]['kl'] for i in reach):.3f})." if reach else "."),
             f"Random controls more than 5 points from the baseline refusal ({base:.0%}): {off or 'none'}.", "",
             f"Ablation-to-zero side effect at the chosen point (layer {side.get('layer')}): {side.get('n')} of "
             f"{side.get('of')} harmless + borderline test prompts project negatively on the direction; "
             + ("refused " + ", ".join(f"{k} {_ci(v)}" for k, v in side["refused"].items()) if side.get("refused")
                else "none, so ablating to 0 raises no prompt's projection here and there is nothing to judge") + "."]
    sys.path.insert(0, str(HERE.parent))
    from benchmarks._common import write_text

    write_text(a.out, "\n".join(lines) + "\n")
    if a.side_by_side:
        write_side_by_side(a.model, lines[2:], Path(a.side_by_side))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
