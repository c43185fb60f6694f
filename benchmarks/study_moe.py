"""Directional ablation on the mixture-of-experts organism ``smollm2-moe-aligned`` (issue 39, part 3): the model's
own refusal direction ablated from attention, dense MLPs + shared experts and routed experts alone and jointly
(the joint-only share), random orthogonal directions, category subspaces of rank 1..12, judged rates for the main
conditions, and the joint edit baked into the weights (routed experts included) against the hooks.

``nice -n 10 python benchmarks/study_moe.py [--threads 1] [--write]`` (the result bundle goes to ``--out``;
``--write``: the tables into ``benchmarks/RESULTS_moe.md``; ``python benchmarks/study_moe.py --report FOLDER``
rewrites them from a saved bundle)
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

from benchmarks._common import machine, write_text  # noqa: E402
from interp.models import load_model  # noqa: E402
from interp.studies.moe import MoeConfig, MoeRefusal, moe_refusal  # noqa: E402
from interp.values import Runtime  # noqa: E402

ALONE = ("attention", "dense + shared", "routed experts")


def _iv(v: dict, key: str = "removed") -> str:
    return f"{v[key]:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]"


def _rate(r: dict | None) -> str:
    return "-" if r is None else f"{r['rate']:.3f} ({r['k']}/{r['n']}, Wilson {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f})"


def plainly(res: MoeRefusal) -> list[str]:
    """The must-show findings in words: alone vs joint, the joint-only share, the random directions, the rank
    sweep, bake = hooks."""
    w, jo, s = res.writers, res.joint_only, res.summary()
    out = ["## In plain words", ""]
    alone = ", ".join(f"{g} {w[g]['removed']:.3f}" for g in ALONE)
    out.append(f"- **Alone vs joint**: ablating the refusal direction from one group of writers removes {alone} of "
               f"the refusal (first-token score, fraction of the harmful-minus-harmless gap); jointly "
               f"{_iv(w['joint'])}. Sum of the three alone {jo['sum_alone']:.3f} [{jo['sum_lo']:.3f}, "
               f"{jo['sum_hi']:.3f}].")
    out.append(f"- **Joint-only share** 1 - sum(alone) / joint = {jo['share']:.3f} [{jo['lo']:.3f}, {jo['hi']:.3f}] "
               f"(seed study: 0.74 on a 320B MoE, alone 0.039 / 0.016 / 0.148, joint 0.776).")
    flat = all(v["lo"] <= 0 <= v["hi"] or abs(v["removed"]) < 0.05 for v in res.random)
    out.append("- **Random orthogonal directions** (unit, orthogonal to the refusal direction, ablated jointly): "
               + ", ".join(_iv(v) for v in res.random)
               + f"; flat (interval holds 0 or |removed| < 0.05): **{'yes' if flat else 'no'}**.")
    for name, rows in res.subspaces.items():
        hi, label = max(rows, key=lambda v: v["removed"]), name if name.endswith("subspace") else f"{name} subspace"
        out.append(f"- **{label}**, ranks {res.ranks[0]}-{res.ranks[-1]}: removed from "
                   f"{min(v['removed'] for v in rows):.3f} to {hi['removed']:.3f} (rank {hi['rank']}, "
                   f"[{hi['lo']:.3f}, {hi['hi']:.3f}]); the refusal direction's projection into the raw subspace at the top rank "
                   f"{rows[-1]['overlap']:.3f}.")
    b = s["bake"]
    out.append(f"- **Bake = hooks**: the joint edit baked into {b['edited']} weights ({b['per_writer']}) vs the hooks: "
               f"max relative logit difference {b['rel']:.2e} on the harmful prompts (max |diff| {b['max_abs']:.2e}), "
               f"{b['probe_rel']:.2e} on random tokens; below {b['tolerance']:g}: **{'yes' if b['ok'] else 'no'}**.")
    return out + [""]


def report(res: MoeRefusal) -> str:
    s, run = res.summary(), res.config.get("run", {})
    cfg = {k: v for k, v in res.config.items() if k != "run"}
    d = s["direction"]
    lines = ["# Directional ablation on a mixture of experts (issue 39, part 3)", "",
             f"Command: `{run.get('command')}`. Machine: {run.get('machine')}. Wall time "
             f"{run.get('seconds', float('nan')) / 60:.1f} min (shared machine: times are noise).", "",
             f"Model `{s['model']}`; refusal direction: resid_pre of layer {d['layer']} ({d['how']}); refusal tokens "
             f"{s['tokens']}; {s['n_eval']} harmful test prompts scored (baseline mean score "
             f"{s['baseline_score']:.3f}, harmless {s['harmless_score']:.3f}); config `{json.dumps(cfg)}`.", ""]
    lines += plainly(res)
    lines += ["## Writer conditions", "",
              "Fraction of refusal removed: (baseline - condition) / (baseline - harmless) of the mean first-token "
              "refusal score, 95% bootstrap interval over prompts; judged rate: phrase judge on greedy answers.", "",
              "| condition | sites | removed [95%] | mean score | judged refusal rate |", "|---|---|---|---|---|",
              f"| nothing ablated | - | 0 | {s['baseline_score']:.3f} | {_rate(s['rates'].get('baseline'))} |"]
    for k, v in s["writers"].items():
        lines.append(f"| {k} | {v['sites']} | {_iv(v)} | {v['score']:.3f} | {_rate(s['rates'].get(k))} |")
    for i, v in enumerate(s["random"]):
        lines.append(f"| random orthogonal {i} (joint; cos {v['cos']:.1e}) | as joint | {_iv(v)} | {v['score']:.3f} | "
                     f"{_rate(s['rates'].get('random')) if i == 0 else '-'} |")
    names = list(s["subspaces"])
    lines += ["", "## Category subspaces (ablated from every writer of the joint condition)", "",
              "Removed [95%], then after the bar: the refusal direction's projection norm into the subspace.", "",
              "| rank | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i, k in enumerate(res.ranks):
        cells = [f"{_iv(s['subspaces'][n][i])} \\| {s['subspaces'][n][i]['overlap']:.2f}" for n in names]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += ["", "Notes: " + "; ".join(s["notes"]) + ".", ""]
    return "\n".join(lines)


def _ranks(text: str) -> tuple[int, ...]:
    if ":" in text:
        return tuple(range(*map(int, text.split(":"))))
    return tuple(int(x) for x in text.split(","))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-moe-aligned")
    ap.add_argument("--n-direction", type=int, default=32)
    ap.add_argument("--layer-stride", type=int, default=1, help="search the direction at every k-th layer")
    ap.add_argument("--n-eval", type=int, default=64)
    ap.add_argument("--n-generate", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--n-random", type=int, default=3)
    ap.add_argument("--ranks", default="1:13", help="ranks of the category subspaces: 'a:b' (range) or '1,2,4'")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="/tmp/moe_run")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--report", help="a saved MoeRefusal bundle: write its tables, run nothing")
    a = ap.parse_args()
    if a.report:
        text = report(MoeRefusal.load(a.report))
    else:
        torch.set_num_threads(a.threads)
        t0 = time.time()
        model = load_model(a.model)
        cfg = MoeConfig(n_direction=a.n_direction, layer_stride=a.layer_stride, n_eval=a.n_eval,
                        n_generate=a.n_generate, max_new_tokens=a.max_new_tokens, n_random=a.n_random,
                        ranks=_ranks(a.ranks),
                        n_boot=a.n_boot)
        res = moe_refusal(model, cfg, runtime=Runtime(batch_size=a.batch_size, progress=False, seed=0))
        res.config["run"] = {"command": "nice -n 10 python benchmarks/study_moe.py " + " ".join(sys.argv[1:]),
                             "seconds": time.time() - t0, "machine": machine()}
        res.save(a.out, overwrite=True)  # the bundle first: a report error loses no run
        text = report(res)
    print(text)
    if a.write:
        write_text(REPO / "benchmarks" / "RESULTS_moe.md", text)


if __name__ == "__main__":
    main()
