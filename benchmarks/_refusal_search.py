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

DATA = {  # per model: harmful file, harmless file (None: the job's default sets for that model, as `interp refusal`)
    "organism": (None, None),
    "smollm2-aligned": (None, None),
}


class ForwardCount:
    """Counts ``*ForCausalLM`` forward calls and the prompt rows entering the token embedding while active
    (global module pre-hook)."""

    def __enter__(self) -> ForwardCount:
        self.n, self.rows = 0, 0

        def pre(mod: torch.nn.Module, args: tuple) -> None:
            if type(mod).__name__.endswith("ForCausalLM"):
                self.n += 1
            elif isinstance(mod, torch.nn.Embedding) and args and args[0].dim() == 2:
                self.rows += args[0].shape[0]

        self.handle = torch.nn.modules.module.register_module_forward_pre_hook(pre)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.remove()


def _timed(fn: Any) -> tuple[Any, float, dict]:
    with ForwardCount() as fc:
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0, {"forwards": fc.n, "rows": fc.rows}


def _sel(sel: Any) -> dict:
    return {"found": sel.found, "layer": sel.layer, "position": sel.position, "bypass": sel.bypass_score,
            "induce": sel.induce_score, "kl": sel.kl}


def setup(name: str, n_val: int, n_train: int, batch_size: int) -> tuple[Any, Any, Any, Any, dict]:
    """The model, data, refusal tokens and candidates (shared by both modes), with their cost."""
    import interp
    from interp.studies.kit.config import DataConfig
    from interp.studies.refusal import find_candidates, find_refusal_tokens, load_refusal_data

    model = interp.load_model(name)
    harmful, harmless = DATA[name]
    data = load_refusal_data(name, DataConfig(harmful=harmful, harmless=harmless, n_train=n_train, n_val=n_val, n_test=64))  # the job's splits
    tok, t_tok, f_tok = _timed(lambda: find_refusal_tokens(model, data, 12, batch_size))
    cand, t_c, f_c = _timed(lambda: find_candidates(model, data, None, batch_size))
    return model, data, tok, cand, {"tokens_s": t_tok, "tokens_forwards": f_tok["forwards"], "candidates_s": t_c,
                                    "candidates_forwards": f_c["forwards"], "refusal_tokens": tok.strings}


def exhaustive(model: Any, data: Any, tok: Any, cand: Any, batch_size: int, max_rows: int, positions: str = "all"
               ) -> tuple[Any, dict]:
    from interp.studies.kit.config import SelectionConfig
    from interp.studies.refusal import score_candidates
    from interp.values import Runtime

    scores, t, f = _timed(lambda: score_candidates(
        model, data, cand, tok, config=SelectionConfig(ablate_positions=positions, max_rows=max_rows),
        runtime=Runtime(batch_size=batch_size, progress=False)))
    return scores, {"s": t, **f, "backwards": 0, "n_scored": scores.bypass.numel()}


def estimate_mode(model: Any, data: Any, tok: Any, cand: Any, batch_size: int, max_rows: int, top_k: int,
                  cfgs: dict[str, Any], positions: str = "all", probes: int | None = None) -> tuple[Any, dict]:
    """The estimate once (``probes``: its random probes per part, default the job's), then for each selection
    config its top k scored exactly and the selection."""
    from interp.studies.kit.config import SelectionConfig
    from interp.studies.refusal import score_candidates, select_direction
    from interp.studies.refusal.estimate import PROBES, estimate_candidates, top_candidates
    from interp.values import Runtime

    est, t_e, f_e = _timed(lambda: estimate_candidates(model, data, cand, tok, batch_size,
                                                       probes=PROBES if probes is None else probes,
                                                       ablate_positions=positions))
    out: dict[str, Any] = {"estimate_s": t_e, "estimate_forwards": f_e["forwards"], "estimate_rows": f_e["rows"],
                           "backwards": est.backwards, "by_filters": {}}
    for name, cfg in cfgs.items():
        only = top_candidates(est, cand, model.n_layers, cfg, top_k)
        sub, t_s, f_s = _timed(lambda only=only: score_candidates(
            model, data, cand, tok, only, config=SelectionConfig(ablate_positions=positions, max_rows=max_rows),
            runtime=Runtime(batch_size=batch_size, progress=False)))
        sel = select_direction(model.n_layers, cand, sub, cfg)
        out["by_filters"][name] = {"s": t_e + t_s, "exact_s": t_s, "forwards": f_e["forwards"] + f_s["forwards"],
                                   "rows": f_e["rows"] + f_s["rows"], "n_scored": int(only.sum()),
                                   "selected": _sel(sel)}
    return est, out


def compare(model: Any, data: Any, tok: Any, est: Any, exact: Any, cand: Any, cfgs: dict[str, Any],
            batch_size: int, positions: str = "all") -> dict:
    """Spearman of estimate vs exhaustive (all candidates; those whose exact KL is below 0.1 / 1; depth-kept),
    the exhaustive selection and its rank in the estimate's top-k order per filter setting, and the trapezoid
    variant (bypass with a second gradient point where the estimate's best candidate is ablated)."""
    import math

    from interp.evals.metrics import spearman
    from interp.forward import prepare
    from interp.studies.refusal import select_direction
    from interp.studies.refusal.estimate import ablation_moment

    def rho(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor) -> float | None:
        return float(spearman(a[keep].float(), b[keep].float())) if int(keep.sum()) >= 3 else None

    every = torch.ones_like(exact.bypass, dtype=torch.bool)
    keep = (torch.tensor(cand.layers) < math.floor(model.n_layers * 0.8))[:, None].expand_as(exact.bypass)
    out: dict[str, Any] = {f"spearman_{k}": rho(getattr(est, k), getattr(exact, k), every)
                           for k in ("bypass", "induce", "kl")}
    out |= {"spearman_bypass_depth_kept": rho(est.bypass, exact.bypass, keep),
            "spearman_bypass_exact_kl_below_0.1": rho(est.bypass, exact.bypass, exact.kl < 0.1),
            "n_exact_kl_below_0.1": int((exact.kl < 0.1).sum()),
            "spearman_bypass_exact_kl_below_1": rho(est.bypass, exact.bypass, exact.kl < 1.0),
            "n_exact_kl_below_1": int((exact.kl < 1.0).sum()), "by_filters": {}}
    n_pos = cand.n_positions
    for name, cfg in cfgs.items():
        sel = select_direction(model.n_layers, cand, exact, cfg)
        row: dict[str, Any] = {"exhaustive_selected": _sel(sel)}
        if sel.found:
            key = _rank_key(est, cand, model.n_layers, cfg)
            row["winner_rank_in_estimate"] = int(key[sel.layer_index * n_pos + sel.position_index]) + 1
        out["by_filters"][name] = row
    r = torch.nn.functional.normalize(cand.raw.double(), dim=-1)
    best = int(torch.where(keep, est.bypass, math.inf).flatten().argmin())
    _, enc_h = prepare(model, data.harmful["val"].instructions)
    M0, b0, _ = ablation_moment(model, enc_h, tok.tokens, batch_size, positions=positions)
    M1, _, _ = ablation_moment(model, enc_h, tok.tokens, batch_size, r.flatten(0, 1)[best][None].float(), positions)
    trap = b0 - 0.5 * torch.einsum("lpd,de,lpe->lp", r, M0 + M1, r)
    out["spearman_bypass_trapezoid"] = rho(trap, exact.bypass, every)
    return out


def _rank_key(est: Any, cand: Any, n_layers: int, cfg: Any) -> torch.Tensor:
    """The order :func:`top_candidates` ranks by (its k-th choice is the k-th smallest key)."""
    from interp.studies.refusal import top_candidates

    n = est.bypass.numel()
    key = torch.full((n,), float(n))
    for k in range(1, n + 1):  # the mask grows by one per k: the new entry has rank k
        new = top_candidates(est, cand, n_layers, cfg, k).flatten() & (key == n)
        key[new] = k - 1
    return key


FILTERS = {"default": {}, "relaxed (KL < 1, no induce filter)": {"kl_threshold": 1.0, "induce_threshold": -1e9}}


def run_model(name: str, n_val: int, n_train: int, top_k: int, batch_size: int, max_rows: int,
              save: Path | None, reuse: Path | None, positions: str = "all", probes: int | None = None) -> dict:
    """Both modes on one model; ``reuse``: an earlier run's saved exhaustive scores and cost (same code, data)."""
    from interp.studies.refusal import SelectionConfig

    cfgs = {k: SelectionConfig(**kw) for k, kw in FILTERS.items()}
    model, data, tok, cand, common = setup(name, n_val, n_train, batch_size)
    if reuse is not None and reuse.exists():
        blob = torch.load(reuse, weights_only=False)
        exact, ex = blob["exact"], blob["exhaustive"] | {"reused_from": str(reuse)}
    else:
        exact, ex = exhaustive(model, data, tok, cand, batch_size, max_rows, positions)
    est, es = estimate_mode(model, data, tok, cand, batch_size, max_rows, top_k, cfgs, positions, probes)
    res = {"model": name, "n_layers": model.n_layers, "n_positions": cand.n_positions, "n_val": n_val,
           "n_train": n_train, "top_k": top_k, "ablate_positions": positions, **common, "exhaustive": ex,
           "estimate": es, **compare(model, data, tok, est, exact, cand, cfgs, batch_size, positions)}
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"exact": exact, "exhaustive": ex, "estimate": asdict(est), "result": res,
                    "cand_raw": cand.raw, "layers": cand.layers, "tokens": tok.tokens}, save)
        save.with_suffix(".json").write_text(json.dumps(res, indent=1))
    return res


def _pick(s: dict) -> str:
    return f"({s['layer']}, {s['position']})" if s["found"] else "none"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def section(results: list[dict], command: str, machine: str) -> str:
    """The markdown section of the search comparison."""
    modes = sorted({r.get("ablate_positions", "all") for r in results})
    lines = [f"### Candidate search: exhaustive vs estimate + exact top k (ablation at {', '.join(modes)} tokens)", "",
             "| model | candidates | n_val | mode | s | forwards | rows | backwards | scored exactly | selected, default "
             "filters | selected, relaxed filters |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        n_c, f = r["n_layers"] * r["n_positions"], r["by_filters"]
        ex, es = r["exhaustive"], r["estimate"]["by_filters"]
        d, rel = es["default"], es["relaxed (KL < 1, no induce filter)"]
        lines.append(f"| {r['model']} | {n_c} | {r['n_val']} | exhaustive | {ex['s']:.1f} | {ex['forwards']} | "
                     f"{ex.get('rows', '-')} | 0 | {ex['n_scored']} | {_pick(f['default']['exhaustive_selected'])} | "
                     f"{_pick(f['relaxed (KL < 1, no induce filter)']['exhaustive_selected'])} |")
        lines.append(f"| {r['model']} | {n_c} | {r['n_val']} | estimate + top {r['top_k']} | {d['s']:.1f} | "
                     f"{d['forwards']} | {d['rows']} | {r['estimate']['backwards']} | {d['n_scored']} | "
                     f"{_pick(d['selected'])} | {_pick(rel['selected'])} ({rel['s']:.1f} s) |")
    lines += ["", "| model | Spearman bypass | induce | KL | bypass, depth-kept | bypass, exact KL < 0.1 (n) | "
              "bypass, exact KL < 1 (n) | bypass, trapezoid variant | winner's rank in estimate order (default; "
              "relaxed) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ranks = "; ".join(str(x.get("winner_rank_in_estimate", "no winner")) for x in r["by_filters"].values())
        lines.append(f"| {r['model']} | {_f(r['spearman_bypass'])} | {_f(r['spearman_induce'])} | "
                     f"{_f(r['spearman_kl'])} | {_f(r['spearman_bypass_depth_kept'])} | "
                     f"{_f(r['spearman_bypass_exact_kl_below_0.1'])} ({r['n_exact_kl_below_0.1']}) | "
                     f"{_f(r['spearman_bypass_exact_kl_below_1'])} ({r['n_exact_kl_below_1']}) | "
                     f"{_f(r['spearman_bypass_trapezoid'])} | {ranks} |")
    lines += ["", f"Machine: {machine}. Command: `{command}`. Refusal tokens and candidates are computed once and "
              "shared by both modes (not in the times above). A forward = one `*ForCausalLM` call; rows = prompt "
              "rows through the token embedding; backwards = the estimate's backward passes (per harmful "
              "batch 1 + 4 curvature probes per part of the vocabulary, refusal tokens and the rest, the first part "
              "skipped for a single refusal token; per harmless batch 1 + 4 KL probes)."]
    return "\n".join(lines) + "\n"
