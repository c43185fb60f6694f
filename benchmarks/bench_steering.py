"""Steering benchmark: batched greedy generation (16 prompts x 64 new tokens), plain vs steered.

Interleaved in one process on the same left-padded batch: plain HF ``generate``; ours with a one-layer
addition (target <= 1.05x plain); ours with all-layer directional ablation through hooks (target
<= 1.15x); the baked-weight model (target 1.00x within noise); the steering-vectors library doing the
same addition (ours should be faster). ``repeng`` is left out: version 0.4 fails to import under
numpy 2 (``np.float_``). Every variant generates exactly 64 tokens (``min_new_tokens``), so the work is
equal. Prints medians and ratios and writes benchmarks/RESULTS_steering.md.

    python benchmarks/bench_steering.py                      # SmolLM2-135M-Instruct + tiny llama, 3 rounds
    python benchmarks/bench_steering.py --models tiny --rounds 5
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import importlib.util
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# this script is named like the package it measures: keep its folder off sys.path, load _common by path
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))
_spec = importlib.util.spec_from_file_location("_bench_common", HERE / "_common.py")
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)
machine, table = _common.machine, _common.table

import steering  # noqa: E402
from interp.forward import batches, prepare  # noqa: E402
from interp.io import atomic_write  # noqa: E402
from interp.models import Model, load_model  # noqa: E402
from interp.testing.tiny import tiny_model  # noqa: E402

PROMPTS = [
    "Describe a quiet morning in a small fishing village.", "How do I keep basil alive indoors?",
    "Explain what a hash table is to a new programmer.", "Write a short note thanking a neighbour for help.",
    "What are three good habits for studying?", "Summarise the plot of a heist story in two sentences.",
    "Why is the sky blue?", "Give me a packing list for a weekend hike.",
    "What makes a good cup of tea?", "Suggest a name for a friendly robot and explain it.",
    "How does compound interest work?", "Write a haiku about trains.",
    "What should I cook with leftover rice?", "Explain photosynthesis simply.",
    "List some ways to save energy at home.", "Tell me a fun fact about octopuses.",
]
COLS = ["model", "method", "median s", "vs plain", "min s", "vs plain (min)", "ours / this", "hook share"]
RESULTS = HERE / "RESULTS_steering.md"


def timed_rounds(fns: dict[str, Callable[[int], Any]], rounds: int, n_tokens: int) -> dict[str, list[float]]:
    """A short warm-up each, then ``rounds`` rounds in rotating order; seconds per call for each variant."""
    for fn in fns.values():
        fn(2)
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            fns[k](n_tokens)
            times[k].append(time.perf_counter() - t0)
    return times


def hook_share(fn: Callable[[], Any]) -> float:
    """Fraction of one call's time spent in steering hooks, under cProfile (an upper bound: the profiler
    slows Python code, which the hooks are, more than the C++ kernels of the forward pass)."""
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(fn)
    total = time.perf_counter() - t0
    hooked = 0.0
    for (path, _, func), (_, _, _, cum, _) in pstats.Stats(prof).stats.items():
        if (path.endswith("interp/hooks.py") and func in ("post_hook", "pre_hook")) or \
                (path.endswith("steering/apply.py") and func == "pre"):
            hooked += cum
    return hooked / total


def run(model: Model, label: str, rounds: int, n_prompts: int, n_tokens: int) -> tuple[list[dict], dict]:
    from steering_vectors import SteeringVector

    _, encs = prepare(model, PROMPTS[:n_prompts])
    batch = batches(model, encs, n_prompts)[0]
    inputs = batch.model_inputs
    g = torch.Generator().manual_seed(0)
    d, L = model.d_model, model.n_layers
    layer = L // 2
    v = torch.randn(d, generator=g)
    v = 4.0 * v / v.norm()
    r = torch.randn(d, generator=g)
    add = steering.AddVector(v, layers=layer, alpha=1.0, sites="resid_post")
    ablate = steering.DirectionalAblation(r)
    baked = steering.bake(model, r).model
    sv = SteeringVector({layer: v}, "decoder_block")
    pad = model.tokenizer.pad_token_id
    outs: dict[str, torch.Tensor] = {}

    def gen(m: Model, key: str, n: int) -> None:
        with torch.inference_mode():
            outs[key] = m.hf.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=pad)

    def ours(iv: Any, key: str) -> Callable[[int], None]:
        def fn(n: int) -> None:
            with steering.apply(model, iv) as h:
                h.set_batch(batch)
                gen(model, key, n)
        return fn

    def theirs(n: int) -> None:
        with sv.apply(model.hf, multiplier=1.0):
            gen(model, "sv", n)

    fns = {
        "plain HF generate": lambda n: gen(model, "plain", n),
        "ours: add at 1 layer": ours(add, "add"),
        f"ours: ablate at all {L} layers (hooks)": ours(ablate, "ablate"),
        "baked weights (plain generate)": lambda n: gen(baked, "baked", n),
        "steering-vectors: add at 1 layer": theirs,
    }
    times = timed_rounds(fns, rounds, n_tokens)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    names = list(fns)
    p_med, p_best = med[names[0]], best[names[0]]
    rows = [{"model": label, "method": k, "median s": med[k], "vs plain": med[k] / p_med,
             "min s": best[k], "vs plain (min)": best[k] / p_best} for k in names]
    rows[-1]["ours / this"] = med[names[1]] / med[names[-1]]
    T = inputs["input_ids"].shape[1]
    checks = {
        "same tokens as steering-vectors": bool(torch.equal(outs["add"], outs["sv"])),
        "baked = hook ablation (tokens equal)": float((outs["baked"][:, T:] == outs["ablate"][:, T:]).float().mean()),
        "addition changed the output": not torch.equal(outs["add"], outs["plain"]),
    }
    for i in (1, 2):  # after the checks: these runs overwrite the outputs with 16-token ones
        rows[i]["hook share"] = hook_share(functools.partial(fns[names[i]], 16))
    return rows, checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,tiny")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: stable ratios on a shared machine; 0: torch's default)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    rows, notes = [], []
    for name in args.models.split(","):
        if name == "tiny":
            model, label = tiny_model("llama", n_layers=4, d_model=128), "tiny llama (4 x 128)"
        elif name == "smollm2":
            model, label = load_model("smollm2-135m-instruct"), "SmolLM2-135M-Instruct"
        else:
            raise SystemExit(f"unknown model {name!r}; use smollm2 and/or tiny")
        r, checks = run(model, label, args.rounds, args.prompts, args.tokens)
        rows += r
        notes.append(f"{label}: " + ", ".join(f"{k}: {v}" for k, v in checks.items()))
        print(table(label, r, COLS[1:]), checks, flush=True)
    cmd = "python benchmarks/bench_steering.py" + "".join(
        f" --{k} {getattr(args, k)}" for k in ("models", "rounds", "prompts", "tokens", "threads"))
    text = table(f"Steering: batched greedy generation, {args.prompts} prompts x {args.tokens} new tokens", rows,
                 COLS)
    text += (f"\nMachine: {machine()}. Command: `{cmd}` (total {time.perf_counter() - t0:.0f} s).\n"
             "Targets (vs plain): one-layer addition <= 1.05, all-layer ablation through hooks <= 1.15, "
             "baked weights 1.00 within noise; `ours / this` < 1 means ours is faster than steering-vectors. "
             "`hook share`: fraction of a 16-token generate call spent inside the steering hooks, under "
             "cProfile (an upper bound, insensitive to other load on the machine). On a loaded machine the "
             "wall-clock ratio of plain vs baked (identical work) shows the noise level of the other ratios.\n"
             "repeng 0.4 is left out: it fails to import under numpy 2 (`np.float_`).\n\n"
             + "\n".join(f"- {n}" for n in notes) + "\n")
    print(text)
    if not args.no_write:
        old = RESULTS.read_text() if RESULTS.exists() else ""
        begin, end = "<!-- begin:gpu_kernels -->", "<!-- end:gpu_kernels -->"
        gpu = old[old.index(begin):old.index(end) + len(end)] + "\n" if begin in old and end in old else (
            f"{begin}\n### Fused residual edit on GPU\n\nNot run yet: `python benchmarks/gpu_kernels.py --write` "
            f"needs a CUDA device (none in the session that wrote this file).\n{end}\n")
        atomic_write(RESULTS, lambda p: Path(p).write_text(text + "\n" + gpu))
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
