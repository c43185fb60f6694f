"""The main job (``run_refusal`` on the embedded organism): wall time and forward passes per stage, for one or
more source trees (e.g. this checkout and the pre-refactor commit), each in its own fresh process.

    git archive fc90834 | tar -x -C /tmp/old       # the code before the typed-stage refactor
    python benchmarks/bench_refusal.py --trees .,/tmp/old

A forward pass is one call of a ``*ForCausalLM`` module's forward (each generation step counts; baked copies
count), seen by a global module pre-hook: the count is the same whichever code path runs the model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# old and new stage names, one label each
LABEL = {"refusal tokens": "tokens", "tokens": "tokens", "candidates": "candidates", "scoring": "scores",
         "scores": "scores", "selection": "selection", "evaluation": "evaluation", "subspaces": "subspaces",
         "report": "report"}


def one_run(out: Path) -> dict:
    """Run the job once in this process (the tree on ``sys.path``) and count forwards per stage."""
    import torch

    import interp
    from pipelines.refusal.run import RefusalConfig, run_refusal

    cfg = RefusalConfig.from_flat() if hasattr(RefusalConfig, "from_flat") else RefusalConfig()
    model = interp.load_model("organism")
    count = {"n": 0}

    def pre(mod: torch.nn.Module, args: tuple) -> None:
        if type(mod).__name__.endswith("ForCausalLM"):
            count["n"] += 1

    stages: dict[str, dict] = {}
    t_start: dict[str, tuple[float, int]] = {}

    def progress(stage: str, status: str) -> None:
        if status == "start":
            t_start[stage] = (time.perf_counter(), count["n"])
        else:
            t0, n0 = t_start[stage]
            stages[LABEL.get(stage, stage)] = {"s": time.perf_counter() - t0, "forwards": count["n"] - n0}

    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    try:
        t0 = time.perf_counter()
        res = run_refusal(cfg, out, progress=progress, model=model)
        wall = time.perf_counter() - t0
    finally:
        handle.remove()
    sel = res.metrics.get("selection", {})
    return {"wall_s": wall, "forwards": count["n"], "stages": stages, "layer": sel.get("layer"),
            "position": sel.get("position")}


def measure(tree: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        code = (f"import sys, json; sys.path.insert(0, {str(tree)!r}); sys.path.insert(0, {str(HERE)!r}); "
                f"import bench_refusal as b; print('RESULT' + json.dumps(b.one_run(__import__('pathlib').Path({tmp!r}) / 'run')))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree,
                           env={**__import__("os").environ, "PYTHONPATH": str(tree)})
        if r.returncode != 0:
            raise RuntimeError(f"the run in {tree} failed:\n{r.stderr[-3000:]}")
        return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT"))[6:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", default=str(HERE.parent), help="comma-separated source trees (default: this checkout)")
    ap.add_argument("--names", default=None, help="comma-separated labels for the trees (default: their paths)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per tree, interleaved; the median is reported "
                    "(the fastest with fewer than 3) (default: %(default)s)")
    ap.add_argument("--out", default=str(HERE / "RESULTS_refusal.md"), help="results file (default: %(default)s)")
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    names = args.names.split(",") if args.names else [str(t) for t in trees]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(args.repeats):  # interleaved, so load on a shared machine hits every tree alike
        for n, t in zip(names, trees):
            runs[n].append(measure(t))
    results = {n: min(rs, key=lambda r: r["wall_s"]) if len(rs) < 3 else sorted(rs, key=lambda r: r["wall_s"])[len(rs) // 2]
               for n, rs in runs.items()}
    order = ["tokens", "candidates", "scores", "selection", "evaluation", "subspaces", "report"]
    head = "| stage | " + " | ".join(f"{n} s | {n} forwards" for n in names) + " |"
    lines = ["### Refusal main job on the embedded organism: wall time and forward passes per stage", "", head,
             "|" + "---|" * (1 + 2 * len(names))]
    for st in order:
        cells = []
        for n in names:
            x = results[n]["stages"].get(st)
            cells += [f"{x['s']:.2f}", str(x["forwards"])] if x else ["-", "-"]
        lines.append(f"| {st} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"**{results[n]['wall_s']:.2f}** | **{results[n]['forwards']}**"
                                                 for n in names) + " |")
    lines.append("")
    lines.append("Selected (layer, position): " + ", ".join(f"{n}: ({results[n]['layer']}, {results[n]['position']})"
                                                             for n in names) + ".")
    sys.path.insert(0, str(HERE))
    from _common import machine

    lines.append(f"Machine: {machine()}. Command: `python benchmarks/bench_refusal.py --trees {args.trees}"
                 + (f" --names {args.names}" if args.names else "") + f" --repeats {args.repeats}`. A forward = one `*ForCausalLM` forward "
                 "call (each generated token counts). Absolute times are noisy on a shared machine.")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
