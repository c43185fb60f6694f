"""Attribution graphs with a cross-layer transcoder: ours beside circuit-tracer's on the same tiny Llamas and the same
seeded random JumpReLU CLT (written by ``sae.clt_io.save_circuit_tracer_clt``, read by its ``load_clt``), through
``.oracle-venv`` (``scripts/circuit_tracer_oracle.py``). Edges compared (max |difference|), graph sizes, and each
side's attribution time (medians of ``--repeats``; circuit-tracer's excludes its model load, ours includes the
replacement run). Writes its section of ``benchmarks/RESULTS_graphs.md``.

    bash scripts/oracle_venv.sh && python benchmarks/bench_graphs_clt.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import interp  # noqa: E402
from benchmarks._common import machine, replace_section, skipped  # noqa: E402
from interp.patching import GraphConfig, ReplacementModel, attribution_graph  # noqa: E402
from interp.patching.graph_targets import TopLogits  # noqa: E402
from interp.testing.tiny import tiny_model  # noqa: E402
from tests.test_graphs_clt_circuit_tracer import ORACLE_PY, run_oracle, seeded_clt  # noqa: E402

RESULTS = REPO / "benchmarks" / "RESULTS_graphs.md"
HEADING = "### Attribution graphs with a cross-layer transcoder: ours vs circuit-tracer (tiny models)"
CASES = ((3, 64, 32, 9), (4, 128, 256, 16))


def one(n_layers: int, d_model: int, d_sae: int, T: int, repeats: int, threads: int) -> dict:
    model = tiny_model("llama", num_hidden_layers=n_layers, hidden_size=d_model)
    clt = seeded_clt(model, d_sae=d_sae)
    ids = [1] + [int(x) for x in torch.randint(3, 250, (T - 1,), generator=torch.Generator().manual_seed(T))]
    with tempfile.TemporaryDirectory() as d:
        theirs, meta = run_oracle(Path(d), model, clt, ids, repeats, threads)
    rm = ReplacementModel(model, clt)
    times, g = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        g = attribution_graph(rm, ids, TopLogits(tokens=theirs["logit_ids"].tolist()),
                              config=GraphConfig(constant_positions=1),
                              runtime=interp.Runtime(batch_size=64, progress=False))
        times.append(time.perf_counter() - t0)
    A = theirs["adjacency"].double()
    same = torch.equal(g.features, theirs["active_features"]) and g.adjacency.shape == A.shape
    return {"model": f"tiny llama {n_layers}L x {d_model}, CLT d_sae {d_sae}/layer", "tokens": T,
            "active": g.n_active, "nodes": int(A.shape[0]), "ours_s": statistics.median(times),
            "theirs_s": meta["seconds"], "max_edge_diff": float((g.adjacency - A).abs().max()) if same else float("nan"),
            "max_edge": float(A.abs().max()), "same_nodes": same}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines = [HEADING, ""]
    if not ORACLE_PY.exists():
        lines.append(skipped("circuit-tracer CLT comparison", "no .oracle-venv; run `bash scripts/oracle_venv.sh`"))
    else:
        rows = [one(*case, args.repeats, args.threads) for case in CASES]
        for r in rows:
            print(r, flush=True)
        lines += ["| model | tokens | active features | graph nodes | same nodes | ours s | circuit-tracer s | "
                  "max edge diff | max edge |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['tokens']} | {r['active']} | {r['nodes']} | {r['same_nodes']} | "
                  f"{r['ours_s']:.3f} | {r['theirs_s']:.3f} | {r['max_edge_diff']:.1e} | {r['max_edge']:.3g} |"
                  for r in rows]
    load = "/".join(f"{v:.1f}" for v in os.getloadavg())
    lines += ["", f"{machine()}; load average at the end {load} (a shared machine: timings are indicative). Command: "
              f"`python benchmarks/bench_graphs_clt.py --threads {args.threads} --repeats {args.repeats}`. Seconds: "
              f"medians; circuit-tracer's time is its `attribute` call alone (model and CLT loaded before), ours is "
              f"`attribution_graph` including the replacement run and the graph's influence and pruning.", ""]
    text = "\n".join(lines)
    print(text)
    replace_section(RESULTS, HEADING, text)


if __name__ == "__main__":
    main()
