"""Candidate search of the refusal job, exhaustive against first-order estimate + exact top k, on one model.

Both modes start from the same refusal tokens and candidates (computed once, not timed in the comparison) and
run the pipeline's own stage functions: exhaustive = ``score_candidates`` on every candidate + ``select_direction``;
estimate = ``estimate_candidates`` + ``top_candidates`` + ``score_candidates(only=)`` + ``select_direction``.
A forward = one ``*ForCausalLM`` forward call; backward passes are the estimate's own count.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" if (REPO.parent / "shared").exists() else Path("/work/shared")
DATA = {  # per model: harmful file, harmless file (None: the organism's own sets)
    "organism": (None, None),
    "smollm2-aligned": (str(SHARED / "data" / "refusal" / "harmful_test.json"),
                        str(REPO / "interp" / "data" / "prompts" / "harmless_realistic.jsonl")),
}


class ForwardCount:
    """Counts ``*ForCausalLM`` forward calls while active (global module pre-hook)."""

    def __enter__(self) -> ForwardCount:
        self.n = 0

        def pre(mod: torch.nn.Module, args: tuple) -> None:
            if type(mod).__name__.endswith("ForCausalLM"):
                self.n += 1

        self.handle = torch.nn.modules.module.register_module_forward_pre_hook(pre)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.remove()


def _timed(fn: Any) -> tuple[Any, float, int]:
    with ForwardCount() as fc:
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0, fc.n


def _sel(sel: Any) -> dict:
    return {"found": sel.found, "layer": sel.layer, "position": sel.position, "bypass": sel.bypass_score,
            "induce": sel.induce_score, "kl": sel.kl}


def setup(name: str, n_val: int, n_train: int, batch_size: int) -> tuple[Any, Any, Any, Any, dict]:
    """The model, data, refusal tokens and candidates (shared by both modes), with their cost."""
    import interp
    from pipelines.refusal import find_candidates, find_refusal_tokens, load_refusal_data

    model = interp.load_model(name)
    harmful, harmless = DATA[name]
    data = load_refusal_data(harmful, harmless, n_train=n_train, n_val=n_val, n_test=2)
    tok, t_tok, f_tok = _timed(lambda: find_refusal_tokens(model, data, 12, batch_size))
    cand, t_c, f_c = _timed(lambda: find_candidates(model, data, None, batch_size))
    return model, data, tok, cand, {"tokens_s": t_tok, "tokens_forwards": f_tok, "candidates_s": t_c,
                                    "candidates_forwards": f_c, "refusal_tokens": tok.strings}


def exhaustive(model: Any, data: Any, tok: Any, cand: Any, batch_size: int, max_rows: int) -> tuple[Any, dict]:
    from pipelines.refusal import SelectionConfig, score_candidates, select_direction

    scores, t, f = _timed(lambda: score_candidates(model, data, cand, tok, batch_size, max_rows))
    sel = select_direction(model.n_layers, cand, scores, SelectionConfig())
    return scores, {"s": t, "forwards": f, "backwards": 0, "n_scored": scores.bypass.numel(), "selected": _sel(sel)}


def estimate_mode(model: Any, data: Any, tok: Any, cand: Any, batch_size: int, max_rows: int, top_k: int
                  ) -> tuple[Any, Any, Any, dict]:
    from pipelines.refusal import SelectionConfig, score_candidates, select_direction
    from pipelines.refusal.estimate import estimate_candidates, top_candidates

    cfg = SelectionConfig()
    est, t_e, f_e = _timed(lambda: estimate_candidates(model, data, cand, tok, batch_size))
    only = top_candidates(est, cand, model.n_layers, cfg, top_k)
    scores, t_s, f_s = _timed(lambda: score_candidates(model, data, cand, tok, batch_size, max_rows, only=only))
    sel = select_direction(model.n_layers, cand, scores, cfg)
    return est, only, scores, {"s": t_e + t_s, "estimate_s": t_e, "exact_s": t_s, "forwards": f_e + f_s,
                               "backwards": est.backwards, "n_scored": int(only.sum()), "selected": _sel(sel)}


def compare(est: Any, exact: Any, cand: Any, n_layers: int) -> dict:
    """Spearman of estimate vs exhaustive (all candidates, and those the depth filter keeps) and the exhaustive
    winner's rank in the estimate's order (among depth-kept candidates, 1 = first)."""
    import math

    from evals.metrics import spearman
    from pipelines.refusal import SelectionConfig, select_direction

    keep = (torch.tensor(cand.layers) < math.floor(n_layers * 0.8))[:, None].expand_as(exact.bypass)
    out = {f"spearman_{k}": float(spearman(getattr(est, k).flatten(), getattr(exact, k).flatten()))
           for k in ("bypass", "induce")}
    out |= {f"spearman_{k}_depth_kept": float(spearman(getattr(est, k)[keep], getattr(exact, k)[keep]))
            for k in ("bypass", "induce")}
    sel = select_direction(n_layers, cand, exact, SelectionConfig())
    if sel.found:
        order = torch.where(keep, est.bypass, torch.tensor(math.inf)).flatten().argsort()
        target = sel.layer_index * cand.n_positions + sel.position_index
        out["winner_rank_in_estimate"] = int((order == target).nonzero()[0, 0]) + 1
    return out


def run_model(name: str, n_val: int, n_train: int, top_k: int, batch_size: int, max_rows: int,
              save: Path | None, reuse: Path | None) -> dict:
    """Both modes on one model; ``reuse``: an earlier run's saved exhaustive scores and cost (same code, data)."""
    model, data, tok, cand, common = setup(name, n_val, n_train, batch_size)
    if reuse is not None and reuse.exists():
        blob = torch.load(reuse, weights_only=False)
        exact, ex = blob["exact"], blob["exhaustive"] | {"reused_from": str(reuse)}
    else:
        exact, ex = exhaustive(model, data, tok, cand, batch_size, max_rows)
    est, only, sub, es = estimate_mode(model, data, tok, cand, batch_size, max_rows, top_k)
    res = {"model": name, "n_layers": model.n_layers, "n_positions": cand.n_positions, "n_val": n_val,
           "n_train": n_train, "top_k": top_k, **common, "exhaustive": ex, "estimate": es,
           **compare(est, exact, cand, model.n_layers)}
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"exact": exact, "exhaustive": ex, "estimate": asdict(est), "only": only, "result": res,
                    "cand_raw": cand.raw, "layers": cand.layers, "tokens": tok.tokens}, save)
        save.with_suffix(".json").write_text(json.dumps(res, indent=1))
    return res


def section(results: list[dict], command: str, machine: str) -> str:
    """The markdown section of the search comparison."""
    lines = ["### Candidate search: exhaustive vs first-order estimate + exact top k", "",
             "| model | candidates | n_val | mode | s | forwards | backwards | scored exactly | selected (layer, pos) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        n_c = r["n_layers"] * r["n_positions"]
        for mode in ("exhaustive", "estimate"):
            x = r[mode]
            s = x["selected"]
            pick = f"({s['layer']}, {s['position']})" if s["found"] else "none"
            label = mode if mode == "exhaustive" else f"estimate + top {r['top_k']}"
            lines.append(f"| {r['model']} | {n_c} | {r['n_val']} | {label} | {x['s']:.1f} | {x['forwards']} | "
                         f"{x['backwards']} | {x['n_scored']} | {pick} |")
    lines += ["", "| model | Spearman bypass (all) | Spearman induce (all) | bypass (depth-kept) | induce (depth-kept) "
              "| exhaustive winner's rank in estimate |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['spearman_bypass']:.3f} | {r['spearman_induce']:.3f} | "
                     f"{r['spearman_bypass_depth_kept']:.3f} | {r['spearman_induce_depth_kept']:.3f} | "
                     f"{r.get('winner_rank_in_estimate', '-')} |")
    lines += ["", f"Machine: {machine}. Command: `{command}`. Refusal tokens and candidates are computed once and "
              "shared by both modes (not in the times above)."]
    return "\n".join(lines) + "\n"
