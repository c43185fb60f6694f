"""Tables and figures of the refusal stages (their ``to_frame`` / ``plot`` call these): per-candidate maps
``[layers, P]`` as one row per layer x post-instruction position, and the candidate heatmaps of
:mod:`interp.viz.refusal` labelled with a run's layers and position tokens."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from interp.evals.metrics import cohens_d_groups

if TYPE_CHECKING:
    import pandas as pd

# what a post-instruction candidate at layer 0 holds (the report's cosine map and Candidates.plot say it)
ZERO_NOTE = ("resid_pre at layer 0 is the token embedding: at a post-instruction position<br>every prompt holds "
             "the same template token, so the harmful and harmless<br>means are equal and their difference is zero.")


def grid_labels(shape: Sequence[int], layers: Sequence[int] | None, pos_tokens: Sequence[str] | None
                ) -> tuple[list[int], list[str]]:
    """The layers and position tokens of a ``[layers, P]`` map: a run's own (from its Candidates) or the row
    indices and empty tokens; an error when their lengths do not fit the map."""
    n_layers, n_pos = int(shape[0]), int(shape[1])
    layers = list(range(n_layers)) if layers is None else list(layers)
    pos_tokens = [""] * n_pos if pos_tokens is None else list(pos_tokens)
    if len(layers) != n_layers or len(pos_tokens) != n_pos:
        raise ValueError(f"the maps are [layers, P] = {[n_layers, n_pos]} but the labels give {len(layers)} layers and "
                         f"{len(pos_tokens)} positions; pass the Candidates of the same run")
    return layers, pos_tokens


def grid_frame(maps: Mapping[str, torch.Tensor | None], layers: Sequence[int] | None = None,
               pos_tokens: Sequence[str] | None = None, chosen: tuple[int, int] | None = None) -> pd.DataFrame:
    """One row per candidate (layer x position, ``position`` counted from the end: -P..-1) with each map's value
    (NaN: not scored) and ``selected`` (the ``chosen`` (layer index, position index))."""
    import pandas as pd

    given = {k: v.detach().float().cpu() for k, v in maps.items() if v is not None}
    shape = next(iter(given.values())).shape
    layers, pos_tokens = grid_labels(shape, layers, pos_tokens)
    n_pos = shape[1]
    rows = [{"layer": layer, "position": p - n_pos, "position_token": pos_tokens[p],
             **{k: float(v[i, p]) for k, v in given.items()}, "selected": (i, p) == chosen}
            for i, layer in enumerate(layers) for p in range(n_pos)]
    return pd.DataFrame(rows)


def grid_figure(bypass: torch.Tensor, induce: torch.Tensor, kl: torch.Tensor, layers: Sequence[int] | None,
                pos_tokens: Sequence[str] | None, chosen: tuple[int, int] | None,
                thresholds: tuple[float, float, float] | None) -> Any:
    """:func:`interp.viz.refusal.candidate_heatmaps` of three ``[layers, P]`` maps, labelled (:func:`grid_labels`)."""
    from interp.viz.refusal import candidate_heatmaps

    layers, pos_tokens = grid_labels(bypass.shape, layers, pos_tokens)
    return candidate_heatmaps(bypass, induce, kl, layers, pos_tokens, chosen, thresholds)


def labels(cand: Any) -> tuple[list[int] | None, list[str] | None]:
    """The layers and position tokens of a run's Candidates (``None``: row indices and no tokens)."""
    return (None, None) if cand is None else (list(cand.layers), list(cand.pos_tokens))


def chosen(selection: Any) -> tuple[int, int] | None:
    """The selected candidate's (layer index, position index), or ``None`` when nothing was selected."""
    return (selection.layer_index, selection.position_index) if selection is not None and selection.found else None


def scores_figure(scores: Any, cand: Any, selection: Any) -> Any:
    """The Scores' three maps, white at the filters' thresholds when ``selection`` gives them (else the median)."""
    thresholds = None if selection is None else (
        scores.baseline_harmful, selection.filters["induce_threshold"], selection.filters["kl_threshold"])
    return grid_figure(scores.bypass, scores.induce, scores.kl, *labels(cand), chosen(selection), thresholds)


def scores_summary(scores: Any) -> dict[str, Any]:
    """Counts, baselines, the best value of each map over the candidates scored, the random directions' KL."""
    def best(t: torch.Tensor, fn: Any) -> float:
        t = t[~t.isnan()]
        return float(fn(t)) if t.numel() else math.nan

    return {"n_candidates": scores.kl.numel(), "n_scored": scores.n_scored, "n_gated": scores.n_gated,
            "baseline_harmful": scores.baseline_harmful, "baseline_harmless": scores.baseline_harmless,
            "min_bypass": best(scores.bypass, torch.min), "max_induce": best(scores.induce, torch.max),
            "min_kl": best(scores.kl, torch.min), "max_kl_random": max(scores.kl_random, default=math.nan)}


def separation(raw: torch.Tensor, harmful: torch.Tensor, harmless: torch.Tensor) -> torch.Tensor:
    """Cohen's d ``[layers, P]`` of the harmful ``[n, layers, P, d]`` over the harmless ``[m, layers, P, d]``
    projections on each unit candidate of ``raw [layers, P, d]`` (NaN-free: a zero candidate gives 0)."""
    unit = torch.nn.functional.normalize(raw.float(), dim=-1)
    h, s = (torch.einsum("nlpd,lpd->lpn", a.float(), unit) for a in (harmful, harmless))
    return cohens_d_groups(s, h)


def candidates_summary(cand: Any) -> dict[str, Any]:
    """The grid's size, the prompts it came from and the candidate that separates them best."""
    d = torch.nan_to_num(cand.separation(), nan=-math.inf)
    li, pi = divmod(int(d.flatten().argmax()), cand.n_positions)
    return {"n_layers": len(cand.layers), "n_positions": cand.n_positions, "d_model": int(cand.raw.shape[-1]),
            "n_harmful": int(cand.harmful_acts.shape[0]), "n_harmless": int(cand.harmless_acts.shape[0]),
            "position_tokens": list(cand.pos_tokens), "best_separation_layer": cand.layers[li],
            "best_separation_position": pi - cand.n_positions, "best_separation_d": float(d[li, pi])}


def cosine_figure(cand: Any, position: int) -> Any:
    """Cosine similarity of the candidates across layers at ``position`` (-P..-1 from the end, or an index)."""
    from interp.viz.refusal import cosine_heatmap

    pi = position % cand.n_positions
    return cosine_heatmap(cand.raw[:, pi], cand.layers,
                          f"candidates at position {pi - cand.n_positions} ({cand.pos_tokens[pi]!r})",
                          ZERO_NOTE if 0 in cand.layers else None)


def tokens_summary(tok: Any) -> dict[str, Any]:
    """The refusal tokens and the train refusal rates (with counts and intervals when the verdicts are kept)."""
    return {"refusal_tokens": list(tok.strings), "n_tokens": len(tok.tokens),
            "train_refusal_harmful": tok.train_refusal_harmful, "train_refusal_harmless": tok.train_refusal_harmless,
            "min_refusals": tok.min_refusals, **{k: dict(r) for k, r in tok.rates().items()}}


def tokens_frame(tok: Any) -> pd.DataFrame:
    """One row per judged train prompt: ``set`` (harmful / harmless), the model's ``response``, ``refused``."""
    import pandas as pd

    rows = [{"set": w, "response": t, "refused": bool(f)}
            for w, texts, flags in (("harmful", tok.harmful_texts, tok.harmful_refused),
                                    ("harmless", tok.harmless_texts, tok.harmless_refused))
            for t, f in zip(texts, flags, strict=True)]
    return pd.DataFrame(rows, columns=["set", "response", "refused"])


def tokens_figure(tok: Any) -> Any:
    """Refusal rate on the harmful and harmless train prompts, with 95% Wilson intervals when the verdicts are kept."""
    from interp.viz.refusal import refusal_rates

    rates = tok.rates()
    if not rates:
        return refusal_rates({"harmful/train": tok.train_refusal_harmful, "harmless/train": tok.train_refusal_harmless},
                             title="Refusal on the train prompts")
    return refusal_rates({k: r.rate for k, r in rates.items()}, {k: r.ci95 for k, r in rates.items()},
                         title="Refusal on the train prompts (baseline generations)")


def selection_summary(sel: Any) -> dict[str, Any]:
    """The chosen candidate (when found), its scores, and how many candidates pass all filters."""
    out: dict[str, Any] = {"found": sel.found, "passing": sel.passing.get("all"), "of": sel.passing.get("of"),
                           "kl_threshold": sel.filters.get("kl_threshold")}
    if sel.found:
        out |= {"layer": sel.layer, "position": sel.position, "position_token": sel.position_token,
                "bypass_score": sel.bypass_score, "induce_score": sel.induce_score, "kl": sel.kl}
    return out


def selection_frame(sel: Any) -> pd.DataFrame:
    """One row per filter (depth, KL, induce, bypass, all together): its rule and how many candidates pass it."""
    import pandas as pd

    f, base = sel.filters, sel.baseline_refusal_score.get("harmful", math.nan)
    rules = {"layer": f"layer < {1 - f.get('prune_layer_fraction', 0.0):.0%} of depth",
             "kl": f"KL < {f.get('kl_threshold', math.nan):.4g}",
             "induce": f"induce > {f.get('induce_threshold', math.nan):.4g}",
             "bypass": f"bypass < harmful baseline {base:.4g}", "all": "all four"}
    return pd.DataFrame([{"filter": k, "rule": rule, "passing": sel.passing[k], "of": sel.passing.get("of")}
                         for k, rule in rules.items() if k in sel.passing])


def selection_figure(sel: Any) -> Any:
    """How many candidates pass each filter alone and all together."""
    from interp.viz.refusal import filter_counts

    fr = selection_frame(sel)
    note = (f"selected: layer {sel.layer}, position {sel.position} ({sel.position_token!r})" if sel.found
            else "no candidate selected")
    return filter_counts(list(fr["rule"]), [int(v) for v in fr["passing"]], sel.passing.get("of"), note)


__all__ = ["ZERO_NOTE", "candidates_summary", "chosen", "cosine_figure", "grid_figure", "grid_frame", "grid_labels",
           "labels", "scores_figure", "scores_summary", "selection_figure", "selection_frame", "selection_summary",
           "separation", "tokens_figure", "tokens_frame", "tokens_summary"]
