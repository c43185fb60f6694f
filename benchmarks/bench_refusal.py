"""The main job (``run_refusal`` on the embedded organism): wall time and forward passes per stage, for one or
more source trees (e.g. this checkout and the pre-refactor commit), each in its own fresh process.

    git archive fc90834 | tar -x -C /tmp/old       # the code before the typed-stage refactor
    python benchmarks/bench_refusal.py --trees .,/tmp/old

and the candidate search, exhaustive against the first-order estimate + exact top k (``_refusal_search``):

    python benchmarks/bench_refusal.py --search organism,smollm2-aligned --threads 2 --n-val 32,16

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
    from interp.studies.refusal.run import RefusalConfig, run_refusal

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


SEARCH_HEADER = "### Candidate search"


def write_section(path: Path, text: str, search: bool) -> None:
    """Replace one of the file's two parts (before/after table; candidate search) and keep the other."""
    old = path.read_text() if path.exists() else ""
    cut = old.find(SEARCH_HEADER)
    before, after = (old[:cut], old[cut:]) if cut >= 0 else (old, "")
    parts = [before.rstrip(), text.rstrip()] if search else [text.rstrip(), after.rstrip()]
    path.write_text("\n\n".join(p for p in parts if p) + "\n")


def search_main(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, str(HERE))
    from _common import machine
    from _refusal_search import run_model, section

    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    names = args.search.split(",")
    n_vals = [int(x) for x in str(args.n_val).split(",")]
    if len(n_vals) not in (1, len(names)):
        raise SystemExit(f"--n-val: give one number or one per model ({len(names)})")
    for name, n_val in zip(names, n_vals * len(names) if len(n_vals) == 1 else n_vals):
        mode = "" if args.ablate_positions == "all" else f"_{args.ablate_positions}"
        save = Path(args.save_dir) / f"search_{name}_n{n_val}{mode}.pt" if args.save_dir else None
        reuse = save if args.reuse_exhaustive else None
        results.append(run_model(name, n_val, args.n_train, args.top_k, args.batch_size, args.max_rows, save, reuse,
                                 args.ablate_positions, args.probes))
        print(json.dumps(results[-1], indent=1), flush=True)
    cmd = " ".join(["python benchmarks/bench_refusal.py"] + sys.argv[1:])
    text = section(results, cmd, machine())
    print(text)
    write_section(Path(args.out), text, search=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", default=str(HERE.parent), help="comma-separated source trees (default: this checkout)")
    ap.add_argument("--names", default=None, help="comma-separated labels for the trees (default: their paths)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per tree, interleaved; the median is reported "
                    "(the fastest with fewer than 3) (default: %(default)s)")
    ap.add_argument("--out", default=str(HERE / "RESULTS_refusal.md"), help="results file (default: %(default)s)")
    ap.add_argument("--search", default=None, help="comma-separated models: compare the candidate search modes "
                    "instead (organism, smollm2-aligned)")
    ap.add_argument("--n-val", default="16", help="--search: validation prompts per class, one number or one per "
                    "model (default: %(default)s)")
    ap.add_argument("--n-train", type=int, default=64, help="--search: training prompts per class (default: %(default)s)")
    ap.add_argument("--top-k", type=int, default=8, help="--search: candidates scored exactly (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=32, help="--search: prompts per batch (default: %(default)s)")
    ap.add_argument("--max-rows", type=int, default=256, help="--search: rows per scoring forward (default: %(default)s)")
    ap.add_argument("--ablate-positions", default="all", choices=["all", "post_instruction"],
                    help="--search: where a candidate is ablated (default: %(default)s, every token)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--save-dir", default=None, help="--search: save each model's scores and figures here")
    ap.add_argument("--reuse-exhaustive", action="store_true", help="--search: take the exhaustive scores and cost "
                    "from --save-dir's earlier run of this script (same data and settings) instead of re-running them")
    ap.add_argument("--probes", type=int, default=None, help="--search: the estimate's random probes per part of "
                    "the vocabulary (default: the job's, interp.studies.refusal.estimate.PROBES)")
    args = ap.parse_args()
    if args.search:
        search_main(args)
        return
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
    write_section(Path(args.out), text, search=False)


if __name__ == "__main__":
    main()
