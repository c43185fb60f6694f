"""The refusal circuit study on a real model: transcoders for every layer, attribution graphs of refused harmful
prompts with the refusal direction as target, the found features ablated against random ones, and one graph's
time and memory at a few prompt lengths.

    python benchmarks/study_circuits.py --model smollm2-aligned --layer 20 --positions post_instruction --threads 2

(layer 20: where the organism's refusal is read, `bench_refusal_positions.py --judged`; every-position ranking is
dominated by layer-0 token features, see RESULTS_circuits.md.)

Transcoders are trained once and cached under ``--cache`` (default ``~/.cache/interp-toolkit/transcoders``).
Figures are written to ``benchmarks/RESULTS_circuits.md``, one section per target layer and ranking positions (a rerun
replaces its own section only).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import PeakRSS, machine, replace_section, write_text  # noqa: E402
from interp.data import load_prompts  # noqa: E402
from interp.models import cache_dir, load_model  # noqa: E402
from interp.patching import GraphConfig, ReplacementModel, attribution_graph  # noqa: E402
from interp.studies.circuits import CircuitConfig, refusal_circuit  # noqa: E402
from interp.studies.kit.config import DataConfig  # noqa: E402
from interp.studies.kit.prompt_sets import load_refusal_data  # noqa: E402
from interp.studies.kit.stages import find_candidates, find_refusal_tokens  # noqa: E402
from interp.values import Runtime  # noqa: E402
from sae.train_config import TrainConfig  # noqa: E402
from sae.transcoder import Transcoder  # noqa: E402
from sae.transcoder_quality import evaluate_transcoders  # noqa: E402
from sae.transcoder_train import train_transcoder  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS_circuits.md"


def transcoders(model, prompts: list[str], folder: Path, d_sae: int, k: int, tokens: int) -> dict[int, Transcoder]:
    if (folder / "layer_0" / "meta.json").exists():
        return {i: Transcoder.load(folder / f"layer_{i}") for i in range(model.n_layers)}
    t0 = time.time()
    tr = train_transcoder(model, prompts, cfg=TrainConfig(arch="topk", d_sae=d_sae, k=k, total_tokens=tokens,
                                                         batch_size=512, lr=2e-3, progress=False),
                          sinks="exclude", runtime=Runtime(batch_size=16))
    for i, tc in tr.transcoders.items():
        tc.save(folder / f"layer_{i}")
    print(f"trained {model.n_layers} transcoders in {time.time() - t0:.0f} s", flush=True)
    return dict(tr.transcoders)


def graph_costs(rm: ReplacementModel, r: torch.Tensor, layer: int, prompts: list[str], budget: int) -> list[dict]:
    rows = []
    from interp.patching.graph_targets import Direction

    target = Direction(r / r.norm(), f"blocks.{layer}.hook_resid_pre")
    for p in prompts:
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            g = attribution_graph(rm, p, target, config=GraphConfig(max_feature_nodes=budget, max_positions=256))
            dt = time.perf_counter() - t0
        rows.append({"tokens": g.n_positions, "active": g.n_active, "feature_nodes": g.n_features, "s": dt,
                     "peak_mb": mem.growth_mb, "completeness": g.completeness()})
    return rows


def load_diff(folder: str | None) -> tuple | None:
    """``(sae, latents)`` saved by ``study_diffing.py`` in ``folder``, or ``None``."""
    if folder is None:
        return None
    import json

    from sae.model import SAE

    return SAE.load(Path(folder) / "sae"), json.loads((Path(folder) / "latents.json").read_text())["top"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-aligned")
    ap.add_argument("--layer", type=int, default=10)
    ap.add_argument("--n-graph", type=int, default=8)
    ap.add_argument("--n-eval", type=int, default=32)
    ap.add_argument("--n-features", type=int, default=20)
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=150_000)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--graph-page", default="runs/refusal_circuit_graph.html",
                    help="where to write the first graph's interactive page")
    ap.add_argument("--cache", default=None)
    ap.add_argument("--rank-by", default="influence", choices=("influence", "direct"))
    ap.add_argument("--positions", default="all", choices=("all", "post_instruction"),
                    help="the feature nodes ranked: at every position or at the post-instruction tokens only")
    ap.add_argument("--diff", default=None, help="a folder from study_diffing.py: each feature's largest |cosine| "
                                                 "with the SAE model-diff latents it ranked")
    ap.add_argument("--no-costs", action="store_true", help="skip the graph cost rows")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t_start = time.time()
    model = load_model(args.model)
    data = load_refusal_data(args.model, DataConfig(n_train=200, n_val=64, n_test=args.n_eval))
    extra = [r["instruction"] for r in load_prompts("harmless_general")]
    train = data.harmful["train"].instructions + data.harmless["train"].instructions + extra
    folder = Path(args.cache) if args.cache else cache_dir() / "transcoders" / args.model / f"d{args.d_sae}_k{args.k}"
    tcs = transcoders(model, train, folder, args.d_sae, args.k, args.tokens)
    held = data.harmless["val"].instructions[:16] + data.harmful["val"].instructions[:16]
    q = evaluate_transcoders(model, tcs, held, sinks="exclude")
    print(q.to_frame().to_string(), q.summary(), flush=True)
    small = load_refusal_data(args.model, DataConfig(n_train=64, n_val=64, n_test=args.n_eval))
    r = find_candidates(model, small, layers=[args.layer]).raw[0, -1]
    tok = find_refusal_tokens(model, small)
    refused = [p for p, f in zip(small.harmful["train"].instructions, tok.harmful_refused) if f][: args.n_graph]
    rm = ReplacementModel(model, tcs)
    t0 = time.time()
    diff = load_diff(args.diff)
    res = refusal_circuit(rm, refused, r, args.layer, data.harmful["test"].instructions,
                          config=CircuitConfig(n_features=args.n_features, n_random=3, max_feature_nodes=args.budget,
                                               max_positions=160, max_new_tokens=24, rank_by=args.rank_by,
                                               positions=args.positions, diff=diff))
    t_study = time.time() - t0
    print(res.to_frame().head(25).to_string(), res.to_frame("rates").to_string(), res.test, flush=True)
    write_text(args.graph_page, res.page(0))
    costs = [] if args.no_costs else graph_costs(rm, r, args.layer, [refused[0], refused[0] + " " + refused[1],
                                                                      " ".join(refused[:4])], args.budget)
    out = RESULTS if args.rank_by == "influence" else RESULTS.with_name(f"RESULTS_circuits_{args.rank_by}.md")
    text = report(args, q, res, costs, t_study, time.time() - t_start, diff)
    replace_section(out, text.split("\n", 1)[0], text)


def _mean_cos(res) -> float:
    chosen = [x["cos_diff"] for x in res.features if x["chosen"]]
    return sum(chosen) / len(chosen)


def chance_cos(sae, latents: list[int], n: int = 2000) -> tuple[float, float]:
    """The chance levels of the two cosines: the median |cosine| of a random unit vector with one fixed direction,
    and the median of its largest |cosine| with the diff latents' decoder rows (seeded draws)."""
    d = sae.W_dec[latents].detach().float()
    d = d / d.norm(dim=1, keepdim=True)
    u = torch.randn(n, d.shape[1], generator=torch.Generator().manual_seed(0))
    u = u / u.norm(dim=1, keepdim=True)
    return float((u @ d[0]).abs().median()), float((u @ d.T).abs().max(1).values.median())


def report(args, q, res, costs, t_study: float, t_total: float, diff: tuple | None = None) -> str:
    s = q.summary()
    fvu = q.to_frame()["fvu"].tolist()
    where = "" if args.positions == "all" else ", features at the post-instruction tokens"
    lines = [f"### Refusal circuit on {args.model} (transcoders, attribution graphs, ablation test; target "
             f"resid_pre.{args.layer}{where})", "",
             f"Transcoders: TopK, d_sae {args.d_sae}, k {args.k}, {args.tokens} tokens per layer, first token of each "
             f"prompt left out (attention sink). Held-out FVU of the MLP output by layer (sink left out): "
             f"{', '.join(f'{x:.2f}' for x in fvu)}. CE with every MLP replaced at every token, the sink included "
             f"(whose massive MLP writes the transcoders were not trained on): {s}.", "",
             f"Target: the refusal direction (difference of means, train split) at resid_pre.{args.layer}, last "
             f"token; {len(res.graphs)} refused harmful train prompts graphed (budget {args.budget} feature nodes); "
             f"features chosen by {args.rank_by} among the nodes at "
             f"{'every position' if args.positions == 'all' else 'the post-instruction tokens'}.",
             "", "| condition | refused | n | rate | 95% CI |", "|---|---|---|---|---|"]
    lines += [f"| {r['condition']} | {r['k']} | {r['n']} | {r['rate']:.2f} | {r['ci95'][0]:.2f}-{r['ci95'][1]:.2f} |"
              for r in res.rates]
    t = res.test
    lines += ["", f"Fisher's exact test, random draws pooled refuse more than with the top features ablated: "
              f"p = {t['fisher_p_random_refuses_more']:.3g}.", "",
              "Top features (summed influence over the graphs; chosen = promoting, ablated):", "",
              "| layer | feature | influence | direct | prompts | cos with direction | chosen |"
              + (" max abs cos with the diff latents |" if args.diff else ""),
              "|---|---|---|---|---|---|---|" + ("---|" if args.diff else "")]
    lines += [f"| {x['layer']} | {x['feature']} | {x['influence']:.3f} | {x['direct']:.3f} | {x['prompts']} | "
              f"{x['cos_direction']:.3f} | {x['chosen']} |" + (f" {x['cos_diff']:.3f} |" if args.diff else "")
              for x in res.features[:15]]
    if args.diff:
        one, most = chance_cos(*diff)  # type: ignore[misc]
        lines += ["", f"SAE model-diff latents from `{args.diff}` (benchmarks/study_diffing.py): the chosen features' "
                  f"largest |cosine| with them, mean {_mean_cos(res):.3f}. Chance (random unit vectors, median): "
                  f"{one:.3f} with one direction, {most:.3f} as the largest over the diff latents."]
    lines += ["", "One graph, cost by prompt length:", "", "| tokens | active features | feature nodes | s | peak MB | "
              "completeness gap |", "|---|---|---|---|---|---|"] if costs else []
    lines += [f"| {c['tokens']} | {c['active']} | {c['feature_nodes']} | {c['s']:.1f} | {c['peak_mb']:.0f} | "
              f"{c['completeness']:.2e} |" for c in costs]
    lines += ["", f"Study {t_study:.0f} s, whole run {t_total:.0f} s. {machine()}. Command: `python "
              f"benchmarks/study_circuits.py --model {args.model} --layer {args.layer} --threads {args.threads} "
              f"--rank-by {args.rank_by} --positions {args.positions}{' --no-costs' if not costs else ''}"
              f"{f' --diff {args.diff}' if args.diff else ''}`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
