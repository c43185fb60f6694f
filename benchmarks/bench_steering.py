"""Steering benchmark: batched greedy generation (16 prompts x 64 new tokens), plain vs steered.

Interleaved in one process on the same left-padded batch: plain HF ``generate``; ours with a one-layer
addition (target <= 1.05x plain); ours with all-layer directional ablation through hooks (target
<= 1.15x); the baked-weight model (target 1.00x within noise); the steering-vectors library doing the
same addition (ours should be faster). ``--parts vllm``: vLLM serving the baked model against HF ``generate``
of the same weights (GPU; skipped with the reason when vLLM or CUDA is absent). ``repeng`` is left out: version 0.4 fails to import under
numpy 2 (``np.float_``). Every variant generates exactly 64 tokens (``min_new_tokens``), so the work is
equal. Prints medians and ratios and writes benchmarks/RESULTS_steering.md.

    python benchmarks/bench_steering.py                      # SmolLM2-135M-Instruct + tiny llama, 3 rounds
    python benchmarks/bench_steering.py --models tiny --rounds 5
    python benchmarks/bench_steering.py --device cuda --parts generate,vllm --out runs/gpu/steering.md
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
machine, table, sync = _common.machine, _common.table, _common.sync

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
        if (path.endswith("interp/hooking.py") and func in ("post_hook", "pre_hook")) or \
                (path.endswith("steering/applying.py") and func == "pre"):
            hooked += cum
    return hooked / total


def _setup(model: Model, n_prompts: int) -> tuple[Any, dict, torch.Tensor, torch.Tensor, int]:
    """The prompt batch, its model inputs on the model's device, the vector to add, the direction to ablate, the layer."""
    _, encs = prepare(model, PROMPTS[:n_prompts])
    batch = batches(model, encs, n_prompts)[0]
    inputs = {k: t.to(model.device) for k, t in batch.model_inputs.items()}
    g = torch.Generator().manual_seed(0)
    v = torch.randn(model.d_model, generator=g)
    r = torch.randn(model.d_model, generator=g)
    return batch, inputs, 4.0 * v / v.norm(), r, model.n_layers // 2


def run(model: Model, label: str, rounds: int, n_prompts: int, n_tokens: int) -> tuple[list[dict], dict]:
    from steering_vectors import SteeringVector

    batch, inputs, v, r, layer = _setup(model, n_prompts)
    L = model.n_layers
    add = steering.AddVector(v, layers=layer, alpha=1.0, sites="resid_post")
    ablate = steering.DirectionalAblation(r)
    baked = steering.bake(model, r).model
    sv = SteeringVector({layer: v.to(model.device)}, "decoder_block")
    pad = model.tokenizer.pad_token_id
    outs: dict[str, torch.Tensor] = {}

    def gen(m: Model, key: str, n: int) -> None:
        with torch.inference_mode():
            outs[key] = m.hf.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=pad)
        sync(m.device)

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


VLLM_COLS = ["model", "method", "median s", "vs HF", "min s", "tokens/s", "same tokens as HF"]


def vllm_rows(model: Model, label: str, rounds: int, n_prompts: int, n_tokens: int) -> list[dict]:
    """vLLM serving the baked model (the direction ablated in the weights, saved with ``save_pretrained``)
    against HF ``generate`` of the same baked weights: same token ids in, greedy, exactly ``n_tokens`` out."""
    import tempfile

    from vllm import LLM, SamplingParams

    batch, inputs, _, r, _ = _setup(model, n_prompts)
    baked = steering.bake(model, r).model
    folder = tempfile.mkdtemp(prefix="baked-")
    baked.hf.save_pretrained(folder)
    dtype = str(model.dtype).removeprefix("torch.")
    engine = {"llm": LLM(model=folder, dtype=dtype, skip_tokenizer_init=True, gpu_memory_utilization=0.3, seed=0)}
    prompts = [{"prompt_token_ids": [int(t) for t in row[m.bool()]]}
               for row, m in zip(batch.input_ids, batch.attention_mask, strict=True)]
    outs: dict[str, Any] = {}

    def hf(n: int) -> None:
        with torch.inference_mode():
            outs["hf"] = baked.hf.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                           pad_token_id=model.tokenizer.pad_token_id)
        sync(model.device)

    def served(n: int) -> None:
        sp = SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
        outs["vllm"] = [o.outputs[0].token_ids for o in engine["llm"].generate(prompts, sp, use_tqdm=False)]

    times = timed_rounds({"HF generate, baked model": hf, "vLLM, baked model": served}, rounds, n_tokens)
    T = inputs["input_ids"].shape[1]
    same = sum(list(map(int, outs["hf"][i, T:])) == list(outs["vllm"][i]) for i in range(n_prompts)) / n_prompts
    engine.clear()  # frees its GPU memory before the next model's engine starts
    torch.cuda.empty_cache()
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["HF generate, baked model"]
    return [{"model": label, "method": k, "median s": med[k], "vs HF": med[k] / base, "min s": min(times[k]),
             "tokens/s": n_prompts * n_tokens / med[k], "same tokens as HF": same if "vLLM" in k else ""}
            for k in times]


def _load(name: str, device: str) -> tuple[Model, str]:
    if name == "tiny":
        model = tiny_model("llama", n_layers=4, d_model=128)
        model.hf.to(device)
        return model, "tiny llama (4 x 128)"
    if name == "smollm2":
        return load_model("smollm2-135m-instruct", device=device), "SmolLM2-135M-Instruct"
    raise SystemExit(f"unknown model {name!r}; use smollm2 and/or tiny")


def _vllm_text(args: argparse.Namespace) -> str:
    """The vLLM section, or the line saying why it did not run (no CUDA, vLLM not importable)."""
    what = "vLLM serving the baked model vs HF generate"
    if not torch.cuda.is_available() or not args.device.startswith("cuda"):
        return _common.skipped(what, "no CUDA (vLLM serves on a GPU; run with --device cuda on a GPU machine)") + "\n"
    if importlib.util.find_spec("vllm") is None:
        return _common.skipped(what, "vllm is not installed (`pip install vllm`, a GPU machine's extra)") + "\n"
    rows = []
    for name in args.models.split(","):
        rows += vllm_rows(*_load(name, args.device), args.rounds, args.prompts, args.tokens)
    return table(f"vLLM vs HF generate on the baked model, {args.prompts} prompts x {args.tokens} new tokens", rows,
                 VLLM_COLS) + ("\nThe ablation of a random direction is baked into the weights (steering.bake), "
                               "saved with save_pretrained and loaded by vLLM unchanged; greedy, EOS ignored, "
                               "same token ids in. `same tokens as HF`: fraction of prompts whose generated ids "
                               "match HF's exactly (kernels differ, so long greedy runs may part late).\n")


def _generate_text(args: argparse.Namespace) -> str:
    t0 = time.perf_counter()
    rows, notes = [], []
    for name in args.models.split(","):
        model, label = _load(name, args.device)
        r, checks = run(model, label, args.rounds, args.prompts, args.tokens)
        rows += r
        notes.append(f"{label}: " + ", ".join(f"{k}: {v}" for k, v in checks.items()))
        print(table(label, r, COLS[1:]), checks, flush=True)
    text = table(f"Steering: batched greedy generation, {args.prompts} prompts x {args.tokens} new tokens", rows,
                 COLS)
    return text + (
        f"\nMachine: {machine()}. Command: `{_command(args)}` (total {time.perf_counter() - t0:.0f} s).\n"
        "Targets (vs plain): one-layer addition <= 1.05, all-layer ablation through hooks <= 1.15, "
        "baked weights 1.00 within noise; `ours / this` < 1 means ours is faster than steering-vectors. "
        "`hook share`: fraction of a 16-token generate call spent inside the steering hooks, under "
        "cProfile (an upper bound, insensitive to other load on the machine). On a loaded machine the "
        "wall-clock ratio of plain vs baked (identical work) shows the noise level of the other ratios.\n"
        "repeng 0.4 is left out: it fails to import under numpy 2 (`np.float_`).\n\n"
        + "\n".join(f"- {n}" for n in notes) + "\n")


def _command(args: argparse.Namespace) -> str:
    return "python benchmarks/bench_steering.py" + "".join(
        f" --{k} {getattr(args, k)}" for k in ("models", "rounds", "prompts", "tokens", "threads", "device", "parts"))


def _write_results(text: str) -> None:
    """benchmarks/RESULTS_steering.md: this table, keeping the GPU kernel block already there."""
    old = RESULTS.read_text() if RESULTS.exists() else ""
    begin, end = "<!-- begin:gpu_kernels -->", "<!-- end:gpu_kernels -->"
    gpu = old[old.index(begin):old.index(end) + len(end)] + "\n" if begin in old and end in old else (
        f"{begin}\n### Fused residual edit on GPU\n\nNot run yet: `python benchmarks/gpu_kernels.py --write` "
        f"needs a CUDA device (none in the session that wrote this file).\n{end}\n")
    atomic_write(RESULTS, lambda p: Path(p).write_text(text + "\n" + gpu))
    print(f"wrote {RESULTS}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,tiny")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: stable ratios on a shared machine; 0: torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--parts", default="generate", help="generate (plain vs steered), vllm (baked model), or both")
    ap.add_argument("--out", help="write the tables here instead of benchmarks/RESULTS_steering.md")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    parts = args.parts.split(",")
    text = ""
    if "generate" in parts:
        what = "steered generation vs plain generate"
        text = _generate_text(args) if _common.cuda_wanted(args.device, what) else _common.skipped(
            what, "no CUDA (--device cuda asked for, but torch sees no CUDA device)") + "\n"
    text += ("\n" if text else "") + (_vllm_text(args) if "vllm" in parts else "")
    print(text)
    if args.out:
        _common.write_text(args.out, text)
    elif not args.no_write:
        _write_results(text)


if __name__ == "__main__":
    main()
