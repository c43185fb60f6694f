"""Attribution graph cost: ours beside circuit-tracer on the same tiny Llamas and transcoders, and ours on a real
model by prompt length and feature budget.

1. Tiny seeded Llamas (from configs) with seeded random JumpReLU transcoders, skip on every layer: our
   ``attribution_graph`` (top logits, position 0 constant, as circuit-tracer) against circuit-tracer's
   ``attribute`` run in ``.oracle-venv`` (``scripts/circuit_tracer_oracle.py``, same saved weights and
   transcoders: ``sae.circuit_tracer_io``); medians of ``--repeats``; edges compared (max |difference|).
2. The real model with the transcoders ``benchmarks/study_circuits.py`` trained and cached: one graph's time and
   peak memory as the prompt grows and as ``max_feature_nodes`` grows.

    bash scripts/oracle_venv.sh && python benchmarks/bench_graphs.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import interp  # noqa: E402
from benchmarks._common import PeakRSS, machine, skipped, write_text  # noqa: E402
from interp.models import cache_dir, load_model  # noqa: E402
from interp.patching import GraphConfig, ReplacementModel, attribution_graph  # noqa: E402
from interp.patching.graph_targets import TopLogits  # noqa: E402
from interp.testing.tiny import tiny_model  # noqa: E402
from sae.circuit_tracer_io import save_circuit_tracer  # noqa: E402
from sae.transcoder import Transcoder, TranscoderConfig  # noqa: E402

RESULTS = REPO / "benchmarks" / "RESULTS_graphs.md"
ORACLE_PY = REPO / ".oracle-venv" / "bin" / "python"


def transcoders(model, d_sae: int) -> list[Transcoder]:
    out = []
    for layer in range(model.n_layers):
        tc = Transcoder(TranscoderConfig(d_in=model.d_model, d_sae=d_sae, arch="jumprelu", layer=layer, skip=True),
                        seed=layer)
        g = torch.Generator().manual_seed(300 + layer)
        with torch.no_grad():
            tc.W_enc.mul_(3.0)
            tc.W_dec.mul_(0.05)
            tc.b_enc.copy_(0.5 * torch.randn(d_sae, generator=g) - 1.5)
            tc.threshold.copy_(0.05 + 0.1 * torch.rand(d_sae, generator=g))
            tc.W_skip.copy_(0.05 * torch.randn(model.d_model, model.d_model, generator=g))
        out.append(tc)
    return out


def theirs(model, tcs, ids: list[int], repeats: int, d: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    (d / "in").mkdir(parents=True)
    model.hf.save_pretrained(d / "in" / "model")
    model.tokenizer.save_pretrained(d / "in" / "model")
    save_circuit_tracer(tcs, d / "in" / "transcoders")
    (d / "in" / "prompt.json").write_text(json.dumps({"ids": ids, "batch_size": 64, "repeats": repeats}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS=str(torch.get_num_threads()))
    res = subprocess.run([str(ORACLE_PY), str(REPO / "scripts" / "circuit_tracer_oracle.py"), str(d / "in"),
                          str(d / "out")], env=env, cwd=d, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"circuit-tracer failed: {res.stderr[-2000:]}")
    return json.loads((d / "out" / "meta.json").read_text()), load_file(str(d / "out" / "graph.safetensors"))


def ours(rm, ids: list[int], repeats: int, tokens: list[int]):
    times, g, peak = [], None, 0.0
    for _ in range(repeats):
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            g = attribution_graph(rm, ids, TopLogits(tokens=tokens), config=GraphConfig(constant_positions=1),
                                  runtime=interp.Runtime(batch_size=64, progress=False))
            times.append(time.perf_counter() - t0)
        peak = max(peak, mem.growth_mb)
    return statistics.median(times), peak, g


def versus(repeats: int) -> list[dict]:
    rows = []
    for n_layers, d_model, d_sae, T in ((2, 64, 32, 9), (4, 128, 256, 16), (4, 128, 256, 32)):
        model = tiny_model("llama", n_layers=n_layers, d_model=d_model)
        tcs = transcoders(model, d_sae)
        rm = ReplacementModel(model, tcs)
        ids = [1] + [int(x) for x in torch.randint(3, 250, (T - 1,), generator=torch.Generator().manual_seed(T))]
        with tempfile.TemporaryDirectory() as d:
            meta, g_theirs = theirs(model, tcs, ids, repeats, Path(d))
        s, mb, g = ours(rm, ids, repeats, g_theirs["logit_ids"].tolist())   # its targets, in its order
        same = torch.equal(g.features, g_theirs["active_features"]) and g.adjacency.shape == g_theirs["adjacency"].shape
        diff = float((g.adjacency.float() - g_theirs["adjacency"]).abs().max()) if same else float("nan")
        rows.append({"model": f"tiny llama {n_layers}L x {d_model}, d_sae {d_sae}", "tokens": T,
                     "active": g.n_active, "ours_s": s, "theirs_s": meta["seconds"], "ratio": s / meta["seconds"],
                     "ours_peak_mb": mb, "theirs_rss_mb": meta["peak_rss_mb"], "max_edge_diff": diff,
                     "max_edge": float(g.adjacency.abs().max())})
        print(rows[-1], flush=True)
    return rows


def real(model_name: str, layer: int, budgets: tuple[int, ...], lengths: tuple[int, ...]) -> list[dict] | str:
    folder = cache_dir() / "transcoders" / model_name / "d1024_k32"
    if not (folder / "layer_0" / "meta.json").exists():
        return f"no cached transcoders at {folder}; run benchmarks/study_circuits.py first"
    model = load_model(model_name)
    rm = ReplacementModel(model, [Transcoder.load(folder / f"layer_{i}") for i in range(model.n_layers)])
    base = "Explain in detail how to pick a lock on a front door without the key, step by step, with tools. " * 4
    rows = []
    for T in lengths:
        ids = model.tokenizer(base)["input_ids"][:T]
        for budget in budgets:
            with PeakRSS() as mem:
                t0 = time.perf_counter()
                g = attribution_graph(rm, ids, TopLogits(),
                                      config=GraphConfig(max_feature_nodes=budget, max_positions=256))
                s = time.perf_counter() - t0
            rows.append({"tokens": T, "budget": budget, "active": g.n_active, "nodes": g.n_features, "s": s,
                         "peak_mb": mem.growth_mb, "completeness": g.completeness()})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="smollm2-aligned")
    ap.add_argument("--layer", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines = ["### Attribution graphs: ours vs circuit-tracer on the same tiny models and transcoders", ""]
    if ORACLE_PY.exists():
        vs = versus(args.repeats)
        lines += ["| model | tokens | active features | ours s | circuit-tracer s | ours / theirs | ours peak MB "
                  "(growth) | theirs peak RSS MB (process) | max edge diff | max edge |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['tokens']} | {r['active']} | {r['ours_s']:.3f} | {r['theirs_s']:.3f} | "
                  f"{r['ratio']:.2f} | {r['ours_peak_mb']:.0f} | {r['theirs_rss_mb']:.0f} | {r['max_edge_diff']:.1e} | "
                  f"{r['max_edge']:.3g} |" for r in vs]
    else:
        lines.append(skipped("circuit-tracer comparison", "no .oracle-venv; run `bash scripts/oracle_venv.sh`"))
    rr = real(args.model, args.layer, (128, 512, 2048), (16, 32, 64))
    lines += ["", f"### One graph on {args.model} (our transcoders), by prompt length and feature budget", ""]
    if isinstance(rr, str):
        lines.append(skipped(args.model, rr))
    else:
        lines += ["| tokens | max_feature_nodes | active features | feature nodes | s | peak MB | completeness gap |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['tokens']} | {r['budget']} | {r['active']} | {r['nodes']} | {r['s']:.1f} | {r['peak_mb']:.0f} "
                  f"| {r['completeness']:.1e} |" for r in rr]
        lines.append("\ncircuit-tracer was not run on this model: the oracle script builds tiny Llamas from a saved HF "
                     "folder, and writing this GGUF-dequantised model out as one was not attempted.")
    lines += ["", f"{machine()}. Command: `python benchmarks/bench_graphs.py --threads {args.threads} --repeats "
              f"{args.repeats}`. Peak memory: ours is the growth of this process during the call; circuit-tracer's "
              f"is its whole process's peak RSS (model load included), so only ours reads as the graph's cost.", ""]
    text = "\n".join(lines)
    print(text)
    write_text(RESULTS, text)


if __name__ == "__main__":
    main()
