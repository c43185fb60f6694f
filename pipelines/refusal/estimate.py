"""First-order estimates of every candidate's bypass and induce scores from one forward + backward per batch.

Bypass: ablating the unit direction ``r`` at every writer (the embedding, i.e. resid_pre of block 0, and every
block's attn_out and mlp_out) changes each writer output ``o`` by ``-(o.r) r``, so to first order the mean
harmful refusal score moves by ``-sum (g.r)(o.r) = -r^T M r`` with ``M = sum g o^T`` over writers, positions and
prompts (``g``: the gradient of the mean score at that writer's output). Induce: adding ``v`` at resid_pre of
block ``l`` at every position moves the mean harmless score by ``(sum_t g_{l,t}) . v``. One backward on each
val set gives ``M`` (``d x d``) and the per-layer gradient sums; every candidate is then a quadratic / linear form.
:func:`top_candidates` picks the ones worth scoring exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float

from evals.logits import refusal_score
from evals.metrics import spearman
from interp.chat import Encoded
from interp.forward import batches, prepare
from interp.hooks import HookContext, hooks
from interp.models import Model
from interp.sites import Site
from patching.runs import run_with_capture
from pipelines.refusal.config import SelectionConfig
from pipelines.refusal.prompt_sets import RefusalData
from pipelines.refusal.stages import Candidates, RefusalTokens, Scores


@dataclass
class Estimate:
    """Estimated mean refusal scores ``[layers, P]`` (bypass on harmful val, induce on harmless val), the clean
    baselines they are offsets of, and the passes spent (each batch: one forward and one backward)."""

    bypass: Float[torch.Tensor, "layers P"]
    induce: Float[torch.Tensor, "layers P"]
    baseline_harmful: float
    baseline_harmless: float
    forwards: int
    backwards: int


def writer_sites(model: Model) -> list[Site]:
    """The sites steering.RowEdits ablates that write to the residual stream: resid_pre of block 0 (the
    embedding), every block's attn_out and mlp_out (resid_pre of later blocks holds nothing else)."""
    return [Site("resid_pre", 0)] + [Site(k, i) for i in range(model.n_layers) for k in ("attn_out", "mlp_out")]


def _batches_with_grads(model: Model, encs: Sequence[Encoded], tokens: Sequence[int], sites: Sequence[Site],
                        batch_size: int, ablate: torch.Tensor | None = None
                        ) -> Iterator[tuple[dict[Site, tuple[torch.Tensor, torch.Tensor]], float]]:
    """Yield per batch ``{site: (act, grad)}`` (``[B, T, d]``, padding zeroed) of the mean refusal score over all
    ``encs``, and the batch's summed score. ``ablate [k, d]`` (orthonormal rows): that subspace is projected out
    at every site; ``act`` is then the site's value before the projection, ``grad`` the gradient after it."""
    n = len(encs)
    pre: dict[str, torch.Tensor] = {}

    def project_out(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        pre[ctx.site.name] = x.detach()
        q = ablate.to(x.device, x.dtype)  # type: ignore[union-attr]
        return x - (x @ q.T) @ q

    edits = [] if ablate is None else [(s.name, project_out) for s in sites]
    for batch in batches(model, encs, batch_size):
        with hooks(model, edits):  # attached first, so the capture below sees (and differentiates) the edited value
            acts, logits = run_with_capture(model, batch, sites, grad=True)
        scores = refusal_score(logits, tokens)
        tensors = [acts[s] for s in sites]
        grads = torch.autograd.grad(scores.sum() / n, tensors, allow_unused=True)
        mask = batch.attention_mask.to(logits.device)[..., None].float()
        out = {s: (pre.get(s.name, t).detach().float() * mask,
                   torch.zeros_like(t, dtype=torch.float) if g is None else g.float() * mask)
               for s, t, g in zip(sites, tensors, grads, strict=True)}
        yield out, float(scores.detach().sum())


def ablation_moment(model: Model, encs: Sequence[Encoded], tokens: Sequence[int], batch_size: int,
                    ablate: torch.Tensor | None = None) -> tuple[Float[torch.Tensor, "d d"], float, int]:
    """``M = sum g o^T`` over writers, positions and prompts (float64, CPU), the mean score, the batches run.
    ``ablate [k, d]``: taken where that subspace is ablated (``o`` before the projection, ``g`` after it)."""
    d = model.d_model
    M = torch.zeros(d, d, dtype=torch.float64)
    total, n_batches = 0.0, 0
    for got, score_sum in _batches_with_grads(model, encs, tokens, writer_sites(model), batch_size, ablate):
        for o, g in got.values():
            M += torch.einsum("btd,bte->de", g, o).double().cpu()
        total, n_batches = total + score_sum, n_batches + 1
    return M, total / len(encs), n_batches


def addition_gradients(model: Model, encs: Sequence[Encoded], tokens: Sequence[int], layers: Sequence[int],
                       batch_size: int) -> tuple[Float[torch.Tensor, "layers d"], float, int]:
    """``sum_t g_{l,t}`` summed over prompts at resid_pre of each of ``layers`` (float64, CPU), the mean
    score, the batches run."""
    sites = [Site("resid_pre", int(layer)) for layer in layers]
    G = torch.zeros(len(sites), model.d_model, dtype=torch.float64)
    total, n_batches = 0.0, 0
    for got, score_sum in _batches_with_grads(model, encs, tokens, sites, batch_size):
        G += torch.stack([got[s][1].sum((0, 1)) for s in sites]).double().cpu()
        total, n_batches = total + score_sum, n_batches + 1
    return G, total / len(encs), n_batches


def estimate_candidates(model: Model, data: RefusalData, cand: Candidates, tokens: RefusalTokens,
                        batch_size: int = 64) -> Estimate:
    """First-order bypass and induce estimates ``[layers, P]`` of every candidate, on the scale of
    :class:`~pipelines.refusal.stages.Scores` (mean refusal scores on the val prompts)."""
    toks = tokens.tokens
    _, enc_h = prepare(model, data.harmful["val"].instructions)
    _, enc_s = prepare(model, data.harmless["val"].instructions)
    M, base_h, nb_h = ablation_moment(model, enc_h, toks, batch_size)
    G, base_s, nb_s = addition_gradients(model, enc_s, toks, cand.layers, batch_size)
    raw = cand.raw.double()
    r = torch.nn.functional.normalize(raw, dim=-1)                           # [layers, P, d]
    bypass = base_h - torch.einsum("lpd,de,lpe->lp", r, M, r)
    induce = base_s + torch.einsum("lpd,ld->lp", raw, G)
    return Estimate(bypass.float(), induce.float(), base_h, base_s, nb_h + nb_s, nb_h + nb_s)


def top_candidates(est: Estimate, cand: Candidates, n_layers: int, cfg: SelectionConfig, k: int
                   ) -> Bool[torch.Tensor, "layers P"]:
    """The ``k`` candidates to score exactly: the lowest estimated bypass among those the depth filter keeps,
    those whose estimated induce passes the threshold first (the rest fill up when fewer than ``k`` pass)."""
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    n_pos = cand.n_positions
    depth_ok = (torch.tensor(cand.layers) < math.floor(n_layers * (1 - cfg.prune_layer_fraction)))[:, None]
    depth_ok = depth_ok.expand(len(cand.layers), n_pos).flatten()
    induce_ok = (est.induce > cfg.induce_threshold).flatten()
    # tier 0: both pass, tier 1: depth only; ranked by estimated bypass inside a tier
    key = est.bypass.flatten().double() + torch.where(induce_ok, 0.0, 1e12)
    key = torch.where(depth_ok, key, math.inf)
    chosen = torch.argsort(key, stable=True)[:min(k, int(depth_ok.sum()))]
    mask = torch.zeros(len(key), dtype=torch.bool)
    mask[chosen] = True
    return mask.view(len(cand.layers), n_pos)


def agreement(est: Estimate, scores: Scores, only: torch.Tensor | None = None) -> dict[str, float | None]:
    """Spearman rank correlation of estimated and exact bypass / induce over the exactly scored candidates
    (``only``; all when ``None``); ``None`` where fewer than 3 are scored."""
    keep = torch.ones_like(scores.bypass, dtype=torch.bool) if only is None else only
    keep = keep & ~scores.bypass.isnan()
    if int(keep.sum()) < 3:
        return {"bypass": None, "induce": None}
    rho = {name: float(spearman(getattr(est, name)[keep], getattr(scores, name)[keep])) for name in ("bypass", "induce")}
    return {name: (v if math.isfinite(v) else None) for name, v in rho.items()}


def search_metrics(cfg: SelectionConfig, est: Estimate | None, scores: Scores) -> dict[str, Any]:
    """metrics.json's record of the search: the mode, ``top_k``, how many candidates were scored exactly and (in
    estimate mode) the Spearman correlation of the estimates with the exact scores over those."""
    out: dict[str, Any] = {"search": cfg.search, "top_k": cfg.top_k if cfg.search == "estimate" else None,
                           "n_scored_exactly": int((~scores.bypass.isnan()).sum())}
    if est is not None:
        out["estimate_spearman"] = agreement(est, scores)
    return out


__all__ = ["Estimate", "ablation_moment", "addition_gradients", "agreement", "estimate_candidates", "search_metrics",
           "top_candidates",
           "writer_sites"]
