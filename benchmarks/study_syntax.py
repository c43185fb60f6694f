"""The syntactic refusal study on ``smollm2-aligned``: refusal of each form (imperative, past tense, statement,
question about others) with Wilson intervals, activation patching imperative -> form and back by layer x position,
heads and neurons at the found layers against random ones, the refusal direction's projection by form, and
steering the least-refused form with the found difference against random vectors of the same norms.

``nice -n 10 python benchmarks/study_syntax.py [--n-pairs 45] [--threads 1] [--write]`` (the result bundle goes to ``--out``;
``--write``: the tables into ``benchmarks/RESULTS_syntax.md``; ``python benchmarks/study_syntax.py --report
FOLDER`` rewrites them from a saved bundle)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import machine, markdown_table, write_text  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.studies.syntax import SyntaxConfig, syntactic_refusal  # noqa: E402
from interp.values import Runtime  # noqa: E402


def _rate(r: dict) -> str:
    return f"{r['rate']:.3f} ({r['k']}/{r['n']}, CI {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f})"


def report(res) -> str:
    s, run = res.summary(), res.config.get("run", {})
    cfg = {k: v for k, v in res.config.items() if k != "run"}
    lines = ["# Syntactic refusal by causal mediation (issue 39, part 2)", "",
             f"Command: `{run.get('command')}`. Machine: {run.get('machine')}. Wall time "
             f"{run.get('seconds', float('nan')) / 60:.1f} min (shared machine: times are noise).", "",
             f"Model `{s['model']}`, {s['n_pairs']} requests per form (our `interp/data/prompts/syntax_forms.jsonl`), "
             f"config `{json.dumps(cfg)}`.", "", "## Refusal by form (phrase judge, greedy)", "",
             "| form | refusal rate (k/n, Wilson 95%) | first-token refusal score | direction projection "
             f"(layer {s['direction_layer']}, mean [95% bootstrap]) |", "|---|---|---|---|"]
    for f in res.forms:
        lo, m, hi = s["projection"][f]
        lines.append(f"| {f} | {_rate(s['rates'][f])} | {s['scores'][f]:.3f} | {m:.3f} [{lo:.3f}, {hi:.3f}] |")
    fr = res.to_frame()
    best = fr.groupby(["layer", "form", "direction"])["restored"].max().unstack(["form", "direction"])
    best.columns = [f"{f} {d}" for f, d in best.columns]
    lines += ["", "## Patching resid_pre, best aligned position per layer (restored share)", "",
              "`to_form`: the imperative's activations patched into the form's run, share of the "
              "imperative-minus-form score gap restored; `back`: the form's patched into the imperative's run, "
              "share of the gap moved towards the form's score.", "",
              markdown_table(best.reset_index(), ".2f"), "",
              f"Aligned positions: {', '.join(res.positions)}.", "",
              f"## Components at the found layers {s['found_layers']} (target form: {s['target_form']})", "",
              "| components | size | restored share, found | restored share, random draws (same layers, same size) |",
              "|---|---|---|---|"]
    for kind, c in s["components"].items():
        lines.append(f"| {kind} | {c['size']} | {c['found']:.3f} | "
                     f"{', '.join(f'{v:.3f}' for v in c['random'])} |")
    lines += ["", f"Found heads (layer, head): {s['found_heads']}.", "",
              f"## Steering the {s['target_form']} form (AddVector of the imperative-minus-form difference at the "
              "found layers x aligned positions, prompt tokens)", "",
              "| condition | refusal rate (k/n, Wilson 95%) |", "|---|---|"]
    for k, r in s["steering"].items():
        lines.append(f"| {k} | {_rate(r)} |")
    lines += ["", "Share of the imperative-minus-form refusal-rate gap closed by steering: "
              + ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} n/a (no gap)"
                          for k, v in s["steering_restored"].items()) + "."]
    return "\n".join(lines[:6] + plainly(res) + lines[6:]) + "\n"


def plainly(res) -> list[str]:
    """The must-show findings in words: refusal by form against the imperative, the mediating layers and their
    restored share, found components against their random draws, steering against random vectors."""
    s = res.summary()
    imp = res.rates["imperative"]
    out = ["## In plain words", ""]
    for f in res.forms[1:]:
        r = res.rates[f]
        below = r.ci95[1] < imp.ci95[0]
        above = r.ci95[0] > imp.ci95[1]
        verdict = ("refused less than the imperative (Wilson intervals apart)" if below else
                   "refused more than the imperative (intervals apart)" if above else
                   "no difference from the imperative shown (intervals overlap)")
        out.append(f"- **{f}**: refused {r.rate:.3f} vs imperative {imp.rate:.3f}: {verdict}.")
    grid = res.to_form[res.target_form]
    li = [res.layers.index(la) for la in res.found_layers]
    best = [(res.layers[i], float(grid[i].nan_to_num(nan=float("-inf")).max()),
             res.positions[int(grid[i].nan_to_num(nan=float("-inf")).argmax())]) for i in li]
    out.append(f"- Mediating layers (largest restored share of the first-token refusal-score gap, imperative -> "
               f"form, over the bypassing forms): {', '.join(f'L{la} ({v:.2f} at {p})' for la, v, p in best)} "
               f"on the target form `{res.target_form}`.")
    for kind, c in s["components"].items():
        rnd = c["random"]
        beats = all(c["found"] > v for v in rnd)
        p = (sum(v >= c["found"] for v in rnd) + 1) / (len(rnd) + 1)
        out.append(f"- {kind.capitalize()} at those layers ({c['size']} found): restored share {c['found']:.3f} vs "
                   f"random {sum(rnd) / len(rnd):.3f} (mean of {len(rnd)} draws of the same size and layers, max "
                   f"{max(rnd):.3f}); above every random draw: **{'yes' if beats else 'no'}** (rank p {p:.2f}, "
                   f"at best 1/{len(rnd) + 1} with {len(rnd)} draws).")
    st, sr = s["steering"], s["steering_restored"]
    found_up = st["found"]["ci95"][0] > st["plain"]["ci95"][1]
    out.append(f"- Steering the `{res.target_form}` form along the found difference: refusal "
               f"{st['plain']['rate']:.3f} -> {st['found']['rate']:.3f} (random vectors of the same norms: "
               f"{st['random']['rate']:.3f}); raised beyond its interval: **{'yes' if found_up else 'no'}**"
               + (f"; share of the imperative gap closed {sr['found']:.3f} vs random {sr['random']:.3f}."
                  if sr["found"] is not None else "; no gap to close."))
    lo_t = s["projection"][res.target_form][2]
    sep = s["projection"]["imperative"][0] > lo_t
    out.append(f"- The refusal direction (layer {s['direction_layer']}) projection at the last token separates the "
               f"imperative from `{res.target_form}` (imperative's interval above): **{'yes' if sep else 'no'}**.")
    small = [f for f in res.forms[1:] if abs(s["scores"]["imperative"] - s["scores"][f]) < 0.5]
    out += ["", "Reading it: patching the whole residual stream at the last positions of the last layers restores "
            "the output almost by construction, so the layers where the share *rises* say where the difference "
            "is built; steering adds the whole imperative-minus-form difference at the found layers, so its "
            "restoration is the causal check of those layers, not of the found heads or neurons, which carry the "
            "share in the components rows."
            + (f" Shares for {', '.join(small)} are unstable: its first-token refusal score is within 0.5 of the "
               "imperative's (no gap to restore)." if small else ""),
            f"Size: {res.n_pairs} requests per form, {len(res.layers)} layers, {len(res.positions)} aligned positions, "
            f"{res.config.get('max_new_tokens')} new tokens, {res.config.get('n_random')} random draws; the script's "
            "defaults (45 requests, every layer, 8 positions, 32 new tokens, 32 direction prompts) are the full study.",
            ""]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-aligned")
    ap.add_argument("--n-pairs", type=int, default=45)
    ap.add_argument("--n-positions", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--layers", default="all", help="layers swept: 'all' or a stride like '0:30:3'")
    ap.add_argument("--n-direction", type=int, default=32, help="train / val prompts per class for the direction")
    ap.add_argument("--n-random", type=int, default=3)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (1 on a busy machine: much faster)")
    ap.add_argument("--out", default="/tmp/syntax_run")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--report", help="a saved SyntaxRefusal bundle: write its tables, run nothing")
    a = ap.parse_args()
    if a.report:
        from interp.studies.syntax import SyntaxRefusal

        res = SyntaxRefusal.load(a.report)
        text = report(res)
        print(text)
        if a.write:
            write_text(REPO / "benchmarks" / "RESULTS_syntax.md", text)
        return
    torch.set_num_threads(a.threads)
    t0 = time.time()
    model = load_model(a.model)
    layers = None if a.layers == "all" else tuple(range(*map(int, a.layers.split(":"))))
    cfg = SyntaxConfig(n_pairs=a.n_pairs, n_positions=a.n_positions, max_new_tokens=a.max_new_tokens, layers=layers,
                       n_direction=a.n_direction, n_random=a.n_random, n_boot=a.n_boot)
    res = syntactic_refusal(model, config=cfg, runtime=Runtime(batch_size=a.batch_size, progress=False, seed=0))
    res.config["run"] = {"command": "nice -n 10 python benchmarks/study_syntax.py " + " ".join(sys.argv[1:]),
                         "seconds": time.time() - t0, "machine": machine()}
    res.save(a.out, overwrite=True)  # the bundle first: a report error loses no run
    text = report(res)
    print(text)
    if a.write:
        write_text(REPO / "benchmarks" / "RESULTS_syntax.md", text)


if __name__ == "__main__":
    main()
