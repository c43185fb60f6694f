"""More random controls for a saved frontier's confirmed points (issue 36): each point's edit's ``random_like`` at
further seeds, judged on the same held-out harmful prompts as the run's own control, pooled with it. One draw of a
random direction is one sample: a control 4 prompts of 64 off the baseline says little about whether random edits
of that strength move refusal; several draws do.

    python benchmarks/frontier_controls.py --model gemma3-aligned --result runs/frontier/gemma3-aligned-heretic-ranges \
        --points 2,3 --draws 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--model", required=True)
ap.add_argument("--result", required=True, help="a saved FrontierResult (bench_frontier.py --save)")
ap.add_argument("--points", default="", help="comma-separated point indices (default: all)")
ap.add_argument("--draws", type=int, default=3, help="further random draws per point (>= 1)")
ap.add_argument("--threads", type=int, default=1)


def main() -> int:
    a = ap.parse_args()
    if a.draws < 1:
        raise SystemExit("--draws must be >= 1 (the run's own control is already in the result)")
    torch.set_num_threads(a.threads)
    import interp
    import steering
    from interp import Runtime
    from interp.evals.rates import Rate
    from interp.studies.kit.config import DataConfig
    from interp.studies.kit.prompt_sets import load_refusal_data
    from interp.studies.kit.stages import find_candidates
    from interp.studies.refusal.frontier import point_edits
    from interp.studies.refusal.frontier_result import FrontierResult

    t0 = time.perf_counter()
    res = FrontierResult.load(a.result)
    model = interp.load_model(a.model)
    data = load_refusal_data(model.name, DataConfig())
    edits = point_edits(res, find_candidates(model, data))
    points = [int(x) for x in a.points.split(",")] if a.points else list(range(len(edits)))
    prompts, seed = data.harmful["test"].instructions, int(res.settings["seed"])
    rt = Runtime(batch_size=int(res.settings["batch_size"]), progress=False)
    base = res.baseline["harmful"]
    print("| point | run's control (seed) | further draws (seeds) | pooled [95% CI] | baseline |\n|---|---|---|---|---|")
    for i in points:
        own = res.points[i]["control_harmful"]
        ks, ns, seeds = [own["k"]], [own["n"]], [seed + 1000 * (j + 1) + i for j in range(a.draws)]
        for s in seeds:
            r = steering.generate_and_judge(model, prompts, edits[i].random_like(model, seed=s),
                                            max_new_tokens=res.settings["max_new_tokens"], runtime=rt)
            ks.append(r.k)
            ns.append(r.n)
        pooled = Rate(sum(ks), sum(ns))
        lo, hi = pooled.ci95
        print(f"| {i} | {own['k']}/{own['n']} ({seed + i}) | {', '.join(f'{k}/{n}' for k, n in zip(ks[1:], ns[1:]))} "
              f"({', '.join(map(str, seeds))}) | {pooled.rate:.0%} [{lo:.0%}, {hi:.0%}] ({sum(ks)}/{sum(ns)}) | "
              f"{base['rate']:.0%} ({base['k']}/{base['n']}) |", flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
