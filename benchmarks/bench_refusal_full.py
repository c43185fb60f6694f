"""The main job end to end with its defaults (``interp refusal --model MODEL``): wall time per stage and in total,
forward passes, and the headline results, written as a markdown section.

``python benchmarks/bench_refusal_full.py --model smollm2-aligned --threads 2 --out benchmarks/RESULTS_refusal_full.md``

The target is a full default run on ``smollm2-aligned`` in <= 5 min on a 2-core machine; the load average is
recorded beside the times, since a shared machine slows every stage.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._common import append_section, write_text  # noqa: E402
from interp.studies.refusal.conditions import KL_CONTROLS  # noqa: E402


def run(model: str, threads: int | None, out: Path, ablate_positions: str = "auto", kl_reference: str = "absolute"
        ) -> tuple[dict[str, float], float, int, dict]:
    """One default run into ``out``: seconds per stage, total seconds, forward passes, metrics."""
    from interp.studies.refusal import RefusalConfig, run_refusal

    n_fwd = 0

    def count(mod: torch.nn.Module, args: tuple) -> None:
        nonlocal n_fwd
        n_fwd += 1

    seconds: dict[str, float] = {}
    started: dict[str, float] = {}

    def progress(stage: str, status: str) -> None:
        if status == "start":
            started[stage] = time.perf_counter()
        else:
            seconds[stage] = time.perf_counter() - started[stage]

    import interp

    t0 = time.perf_counter()
    m = interp.load_model(model)
    handle = m.hf.register_forward_pre_hook(count)
    try:
        cfg = RefusalConfig.from_flat(model=model, threads=threads, ablate_positions=ablate_positions,
                                      kl_reference=kl_reference)
        res = run_refusal(cfg, out, progress=progress, model=m)
    finally:
        handle.remove()
    return seconds, time.perf_counter() - t0, n_fwd, res.metrics


def headline(m: dict) -> list[str]:
    """The numbers the issue asks for, from metrics.json."""
    lines = [f"- found direction: {m['found_direction']}"]
    sel = m.get("selection", {})
    for t in sel.get("ablation_search", []):
        lines.append(f"- search with ablate_positions={t['ablate_positions']}: "
                     f"{'found' if t['found'] else 'none passes'} ({t['passing'].get('kl', 0)} of "
                     f"{t['n_scored_exactly']} scored exactly pass KL < {t.get('kl_threshold', 0.1):.3g})")
    if sel.get("kl_random"):
        lines.append(f"- KL of {len(sel['kl_random'])} random unit directions ablated the same way (val harmless): "
                     + ", ".join(f"{k:.3f}" for k in sel["kl_random"]))
    if m["found_direction"]:
        lines.append(f"- selected: layer {sel['layer']}, position {sel['position']} ({sel['position_token']!r}); "
                     f"KL (val) {sel['kl']:.3f}; search {sel.get('search')}, scored exactly {sel.get('n_scored_exactly')}")
    for cond, r in m.get("evaluation", {}).get("refusal", {}).items():
        lines.append(f"- {cond}: {r['k']}/{r['n']} = {100 * r['rate']:.0f}% (95% CI {100 * r['ci95'][0]:.0f}-"
                     f"{100 * r['ci95'][1]:.0f}%)")
    kc = m.get("evaluation", {}).get("harmless_kl_ce")
    if kc:
        lines.append(f"- harmless KL (first response token) {kc['kl_first_response_token']:.3f}; CE "
                     f"{kc['ce_baseline']:.3f} -> {kc['ce_edited']:.3f}")
        for name in KL_CONTROLS:
            if f"kl_first_response_token ({name})" in kc:
                lines.append(f"- the same under the {name}: KL {kc[f'kl_first_response_token ({name})']:.3f}; CE "
                             f"{kc['ce_baseline']:.3f} -> {kc[f'ce_edited ({name})']:.3f}")
    eq = m.get("evaluation", {}).get("hook_vs_baked", {})
    if eq.get("max_abs_logit_diff") is not None:
        lines.append(f"- hook vs baked weights: max |logit diff| {eq['max_abs_logit_diff']:.2e}")
    lines += [f"- note: {n}" for n in m.get("notes", [])]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-aligned", help="model name (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--out", default=str(HERE / "RESULTS_refusal_full.md"), help="results file (default: %(default)s)")
    ap.add_argument("--keep", default=None, help="keep the run folder here (default: a temporary folder)")
    ap.add_argument("--ablate-positions", choices=("auto", "all", "post_instruction"), default="auto",
                    help="the run's ablation positions (default: %(default)s, the job's default)")
    ap.add_argument("--kl-reference", choices=("absolute", "random"), default="absolute",
                    help="the KL filter's reference (default: %(default)s, the job's default)")
    ap.add_argument("--append", action="store_true", help="append to the results file instead of replacing it")
    args = ap.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp()) / "run"
    load0 = os.getloadavg()
    seconds, total, n_fwd, metrics = run(args.model, args.threads, folder, args.ablate_positions, args.kl_reference)
    load1 = os.getloadavg()
    rows = "\n".join(f"| {s} | {t:.1f} |" for s, t in seconds.items())
    flag = "" if args.ablate_positions == "auto" else f" --ablate-positions {args.ablate_positions}"
    flag += "" if args.kl_reference == "absolute" else f" --kl-reference {args.kl_reference}"
    text = (f"### The main job end to end: `interp refusal --model {args.model}{flag}` "
            f"({'defaults' if not flag else 'otherwise defaults'})\n\n"
            f"| stage | s |\n|---|---|\n{rows}\n| **total (incl. model load)** | **{total:.1f}** |\n\n"
            f"Forward passes (model calls, generation steps included): {n_fwd}.\n\n" + "\n".join(headline(metrics)) +
            f"\n\nMachine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads); load average before {load0[0]:.1f}, after {load1[0]:.1f}. "
            f"Command: `python benchmarks/bench_refusal_full.py --model {args.model}"
            f"{f' --threads {args.threads}' if args.threads else ''}{flag}`.\n")
    (append_section if args.append else write_text)(args.out, text)
    print(text)
    if not args.keep:
        shutil.rmtree(folder.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
