"""Contextual entrainment on SmolLM2-135M-Instruct and Gemma 3 270M (plain prompts, no chat template): the logit and
probability gain of a context token present vs absent per context kind, counterfactual vs factual, entrainment
heads by a learned-mask sparsity sweep, the found heads zeroed vs layer-matched random heads (entrainment and clean
accuracy) and their attention to the context token (``interp.studies.entrainment.entrainment_study``).

    nice -n 10 python benchmarks/study_entrainment.py --threads 2

Writes ``benchmarks/RESULTS_entrainment.md`` (one section per model; a rerun replaces it) and saves each study under
``--out`` (refused if it exists) before writing its section; ``--report FOLDER [FOLDER ...]`` rewrites the sections
from saved studies, running nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine, replace_section  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.studies.entrainment import (  # noqa: E402
    EntrainmentConfig,
    EntrainmentStudy,
    entrainment_study,
    load_entrainment,
)
from interp.values import Runtime  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS_entrainment.md"


def _ci(d: dict, fmt: str = ".3g") -> str:
    return f"{d['mean']:{fmt}} [{d['lo']:{fmt}}, {d['hi']:{fmt}}] (p {d['p']:.3g})"


def _holds(d: dict) -> str:
    return "holds" if d["lo"] > 0 else "does not hold (interval reaches 0)"


def report(name: str, st) -> str:
    s, run = st.summary(), st.meta.get("run", {})
    e, ab, at = s["effect"], s["ablation"], s["attention"]
    lines = [f"### {name}", "", f"`{run.get('command')}` ({run.get('machine')}; {run.get('seconds', float('nan')):.0f} s, "
             f"shared machine: times are noise). {e['n_items']} items, plain prompts; clean accuracy (question alone, "
             f"answer's first token on top): {e['clean_accuracy']:.3f}.", "",
             "Gain of the tracked token at the last prompt position, its context present minus another item's "
             "context of the same kind (mean over pairs, 95% bootstrap interval over items, one-sided p of no gain):",
             "", "| context | pairs | logit gain | probability gain | entrainment (logit) |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {e['n_pairs'][k]} | {_ci(g['logit'])} | {_ci(g['prob'])} | {_holds(g['logit'])} |"
              for k, g in e["gains"].items()]
    cf = e["counterfactual_vs_factual"]
    lines += ["", f"Counterfactual minus factual logit gain, paired by item ({cf['n']} items): {_ci(cf)}; "
              f"counterfactual entrains more: **{'yes' if cf['counterfactual_entrains_more'] else 'no'}**.", "",
              f"Mask sweep on the {s['mask_kind']} prompts (metric: logit[tracked] - logit[answer], decreased; "
              f"{st.meta.get('steps', '?')} steps, zero ablation):", "",
              "| sparsity | heads > 0.5 | metric clean | metric, those heads zeroed |", "|---|---|---|---|"]
    lines += [f"| {r['sparsity']} | {r['n_selected']} | {r['baseline']:.3f} | {r['selected_metric']:.3f} |"
              for r in s["sweep"]["sweep"]]
    lines += ["", f"(Of {st.sweep.masks[0].scores.numel()} heads; a mask keeping many heads above 0.5 has not "
              "converged to a sparse circuit at this many steps, so the highest-scoring heads are kept.)"]
    dr = ab["drop_found_minus_random"]
    lines += ["", f"Heads kept at sparsity {s['sweep']['chosen']} (at most {st.meta.get('max_heads', '?')}, highest "
              f"scores): "
              f"{', '.join(f'L{la}H{h}' for la, h in s['sweep']['heads'])}.", "",
              f"Zeroing them vs {ab['n_draws']} sets of as many random heads of the same layers: {s['mask_kind']} logit "
              f"gain clean {ab['gain_clean']:.3f}, found zeroed {ab['gain_found']:.3f}, random zeroed "
              f"{ab['gain_random']:.3f}; extra drop found - random {_ci(ab['drop_found_minus_random'])}, draws dropping "
              f"as much p {ab['p_draws']:.3g} (at best 1/{ab['n_draws'] + 1} with {ab['n_draws']} draws). Clean accuracy: {ab['accuracy_clean']:.3f} -> found "
              f"{ab['accuracy_found']:.3f}, random {ab['accuracy_random']:.3f}; accuracy lost beyond random "
              f"{_ci(ab['accuracy_cost_found_minus_random'])}. The found heads attenuate entrainment more than "
              f"random heads: **{'yes' if dr['lo'] > 0 else 'no'}** (interval {'above' if dr['lo'] > 0 else 'reaching'}"
              f" 0).", "",
              f"Attention from the last prompt position to the context token (mean over the {s['mask_kind']} present "
              f"prompts): found heads {at['mean_found']:.3f} "
              f"({', '.join(f'{k} {v:.3f}' for k, v in at['found'].items())}); one random layer-matched set "
              f"{at['mean_random']:.3f} ({', '.join(f'{k} {v:.3f}' for k, v in at['random'].items())}). Their full "
              f"patterns on `{st.attention.example}`: `EntrainmentStudy.load(FOLDER).plot('pattern')`.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--sparsities", type=float, nargs="+", default=[0.003, 0.01, 0.03])
    ap.add_argument("--max-heads", type=int, default=8)
    ap.add_argument("--n-draws", type=int, default=5)
    ap.add_argument("--n", type=int, default=None, help="items (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="folder to save each study under (default: not saved)")
    ap.add_argument("--report", nargs="+", help="saved studies (FOLDER/<model>): rewrite their sections, run nothing")
    args = ap.parse_args()
    if args.report:
        for folder in args.report:
            st = EntrainmentStudy.load(folder)
            text = report(st.model_id, st)
            print(text, flush=True)
            replace_section(RESULTS, f"### {st.model_id}", text)
        return
    torch.set_num_threads(args.threads)
    cfg = EntrainmentConfig(sparsities=tuple(args.sparsities), steps=args.steps, max_heads=args.max_heads,
                            n_draws=args.n_draws)
    data = load_entrainment(n=args.n)
    command = "nice -n 10 python benchmarks/study_entrainment.py " + " ".join(sys.argv[1:])
    for name in args.models:
        t0 = time.time()
        model = load_model(name)
        st = entrainment_study(model, data, cfg, Runtime(batch_size=16))
        st.meta.update(steps=args.steps, max_heads=args.max_heads,
                       run={"command": command, "seconds": time.time() - t0, "machine": machine()})
        if args.out:   # the bundle first: a report error loses no run
            st.save(Path(args.out) / name)
        text = report(name, st)
        print(text, flush=True)
        replace_section(RESULTS, f"### {name}", text)


if __name__ == "__main__":
    main()
