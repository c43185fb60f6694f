"""Cheap estimates of every candidate's bypass, induce and KL scores from one forward per batch and a few backwards.

Bypass (to second order in the logits): ablating the unit direction ``r`` at every writer (the embedding, i.e.
resid_pre of block 0, and every block's attn_out and mlp_out) changes each writer output ``o`` by ``-(o.r) r``, so
to first order the mean harmful refusal score moves by ``-sum (g.r)(o.r) = -r^T M r``, ``M = sum g o^T`` over
writers, positions and prompts (``g``: the gradient of the mean score at that writer's output). The refusal score
is a log-odds, ``LSE(z_R) - LSE(z_N)`` over the refusal tokens ``R`` and the rest ``N``, curved in the logits ``z``:
its second-order term along the first-order logit change ``dz`` is ``1/2 dz^T (F_R - F_N) dz`` with ``F_A = diag q_A -
q_A q_A^T`` (``q_A``: the softmax within ``A``), estimated with random probes like the KL below and added. It is
what an ablation that scatters the logits does to a log-odds (the many ``N`` tokens gain together): without it the
estimate misses most of the large bypasses (on the organism Spearman with the exact bypass 0.735 -> 0.93). The
network's own second derivatives are not included. Induce (first order): adding ``v`` at resid_pre of block ``l``
moves the mean harmless score by ``(sum_t g_{l,t}) . v``. KL (second order, its first order is 0): the ablation
moves prompt ``i``'s next-token logits by ``dz_i = -sum J (o.r) r`` to first order, and ``KL ~ 1/2 dz^T (diag p -
p p^T) dz``, estimated with random probes ``u ~ N(0, diag p - p p^T)`` (one backward each): ``KL ~ 1/2 E[(u .
dz)^2]``. The estimates rank poorly where an ablation breaks the model through the network's own non-linearity
(large KL), which the KL estimate flags; :func:`top_candidates` uses all three to pick the candidates worth
scoring exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float

from interp.bundle import Result
from interp.chat import Batch, Encoded
from interp.evals.logits import refusal_score
from interp.evals.metrics import spearman
from interp.forward import batches, prepare
from interp.hooking import HookContext, hooks
from interp.models import Model
from interp.patching.runs import run_with_capture
from interp.sites import Site
from interp.studies.kit.config import SelectionConfig
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.scoring import check_ablate_positions
from interp.studies.kit.stage_views import chosen, grid_figure, grid_frame, labels
from interp.studies.kit.stages import Candidates, RefusalTokens, Scores, Selection
from steering.rows import ABLATE_KINDS

if TYPE_CHECKING:
    import pandas as pd

PROBES = 4  # random probes for the KL estimate: its Spearman with the exact KL on SmolLM2 was 0.88 with 2, 0.89 with 4


@dataclass
class Estimate(Result):
    """Estimated scores ``[layers, P]`` on the scale of :class:`~interp.studies.kit.stages.Scores` (bypass: mean
    harmful refusal score under ablation, first order plus ``curvature``; induce: mean harmless score under addition; kl: mean harmless KL under
    ablation), the clean baselines, and the passes spent."""

    bypass: Float[torch.Tensor, "layers P"]
    induce: Float[torch.Tensor, "layers P"]
    kl: Float[torch.Tensor, "layers P"]
    baseline_harmful: float
    baseline_harmless: float
    forwards: int
    backwards: int
    curvature: Float[torch.Tensor, "layers P"] | None = None  # the logit-curvature part of ``bypass``

    def summary(self) -> dict[str, Any]:
        """The passes spent, the baselines, and the best estimate of each map over the candidates."""
        return {"n_candidates": self.bypass.numel(), "forwards": self.forwards, "backwards": self.backwards,
                "baseline_harmful": self.baseline_harmful, "baseline_harmless": self.baseline_harmless,
                "min_bypass": float(self.bypass.nan_to_num(math.inf).min()),
                "max_induce": float(self.induce.nan_to_num(-math.inf).max()),
                "min_kl": float(self.kl.nan_to_num(math.inf).min())}

    def to_frame(self, cand: Candidates | None = None, selection: Selection | None = None) -> pd.DataFrame:
        """One row per candidate (layer x position): the estimated bypass, induce, KL and the curvature part of
        bypass; ``cand`` labels the layers and position tokens, ``selection`` marks the chosen one."""
        return grid_frame({"bypass": self.bypass, "induce": self.induce, "kl": self.kl, "curvature": self.curvature},
                          *labels(cand), chosen(selection))

    def plot(self, cand: Candidates | None = None, selection: Selection | None = None, kl: bool = True) -> Any:
        """The three estimated maps (``kl=False``: the KL map left empty), white at the selection's thresholds
        when given (else at the harmful baseline, induce 0 and KL 0.1)."""
        f = selection.filters if selection is not None else {"induce_threshold": 0.0, "kl_threshold": 0.1}
        return grid_figure(self.bypass, self.induce, self.kl if kl else torch.full_like(self.bypass, math.nan),
                           *labels(cand), chosen(selection), (self.baseline_harmful, f["induce_threshold"], f["kl_threshold"]))


def writer_sites(model: Model) -> list[Site]:
    """The sites steering.RowEdits ablates that write to the residual stream: resid_pre of block 0 (the
    embedding), every block's attn_out and mlp_out (resid_pre of later blocks holds nothing else)."""
    first, *later = ABLATE_KINDS  # resid_pre, then the block writers
    return [Site(first, 0)] + [Site(k, i) for i in range(model.n_layers) for k in later]


def _captured(model: Model, batch: Batch, sites: Sequence[Site], ablate: torch.Tensor | None,
              positions: str = "all"
              ) -> tuple[dict[Site, torch.Tensor], torch.Tensor, dict[Site, torch.Tensor], torch.Tensor]:
    """One forward keeping ``sites`` in the autograd graph: ``(acts, last logits, values [B, T, d] with padding
    zeroed, mask [B, T, 1])``. ``ablate [k, d]`` (orthonormal rows): that subspace is projected out at every
    site; ``acts`` (what gradients are taken at) are then after the projection, ``values`` before it.
    ``positions="post_instruction"``: the ablation acts, and ``values`` count, at the post-instruction tokens
    only (the tokens an ablation restricted to them changes; gradients keep every token)."""
    pre: dict[str, torch.Tensor] = {}
    check_ablate_positions(positions)
    where = batch.attention_mask if positions == "all" else batch.attention_mask.bool() & batch.post_mask

    def project_out(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        pre[ctx.site.name] = x.detach()
        q = ablate.to(x.device, x.dtype)  # type: ignore[union-attr]
        return x - ((x @ q.T) @ q) * where.to(x.device, x.dtype)[..., None]

    edits = [] if ablate is None else [(s.name, project_out) for s in sites]
    with hooks(model, edits):  # attached first, so the capture sees (and differentiates) the edited value
        acts, logits = run_with_capture(model, batch, sites, grad=True)
    mask = batch.attention_mask.to(logits.device)[..., None].float()
    counted = where.to(logits.device)[..., None].float()
    values = {s: pre.get(s.name, acts[s]).detach().float() * counted for s in sites}
    return acts, logits, values, mask


def _grads(value: torch.Tensor, acts: dict[Site, torch.Tensor], sites: Sequence[Site], mask: torch.Tensor,
           retain: bool) -> list[torch.Tensor]:
    """Gradients ``[B, T, d]`` of ``value`` at ``sites`` (padding zeroed; zeros where it does not depend on one)."""
    gs = torch.autograd.grad(value, [acts[s] for s in sites], retain_graph=retain, allow_unused=True)
    return [torch.zeros_like(acts[s], dtype=torch.float) if g is None else g.float() * mask for s, g in zip(sites, gs)]


def curvature_parts(tokens: Sequence[int]) -> int:
    """How many parts of the vocabulary the curvature term probes: the rest, and the refusal tokens when there are
    several (``F_R`` is exactly 0 for one)."""
    return 1 + (len(set(tokens)) > 1)


def _per_mode(values: dict[Site, torch.Tensor], batch: Batch, modes: Sequence[str]) -> list[dict[Site, torch.Tensor]]:
    """``values`` counted at every token (padding zeroed), as each of ``modes`` counts them: all of them, or the
    post-instruction tokens only (one forward serves both: without an ablation in it, the ablation positions
    change only which tokens' writer outputs count, not the forward or its gradients)."""
    out = []
    for mode in modes:
        if mode == "all":
            out.append(values)
        else:
            ref = next(iter(values.values()))
            post = batch.post_mask.to(ref.device, ref.dtype)[..., None]
            out.append({s: v * post for s, v in values.items()})
    return out


def _check_modes(modes: Sequence[str], ablate: torch.Tensor | None) -> None:
    for mode in modes:
        check_ablate_positions(mode)
    if not modes or len(set(modes)) != len(modes):
        raise ValueError(f"modes must be distinct ablation positions, got {list(modes)}")
    if ablate is not None and len(modes) > 1:
        raise ValueError("one mode at a time with ablate=: the ablation in the forward acts at that mode's tokens")


def harmful_modes(model: Model, encs: Sequence[Encoded], tokens: Sequence[int], batch_size: int,
                  units: Float[torch.Tensor, "c d"] | None = None, probes: int = 0, seed: int = 0,
                  ablate: torch.Tensor | None = None, modes: Sequence[str] = ("all",)
                  ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], float, int]:
    """:func:`harmful_terms` for each of ``modes`` (ablation positions) from the same forwards and backwards:
    ``[(M, curvature) per mode]``, the mean score, the batches run."""
    _check_modes(modes, ablate)
    sites, n, gen = writer_sites(model), len(encs), torch.Generator().manual_seed(seed)
    Ms = [torch.zeros(model.d_model, model.d_model, dtype=torch.float64) for _ in modes]
    curvs = [torch.zeros(0 if units is None else len(units), dtype=torch.float64) for _ in modes]
    probes = probes if units is not None else 0
    inside: torch.Tensor | None = None   # the refusal tokens as a vocabulary mask, built at the first batch
    total, n_batches = 0.0, 0
    for batch in batches(model, encs, batch_size):
        acts, logits, values, mask = _captured(model, batch, sites, ablate, modes[0] if ablate is not None else "all")
        per = [values] if ablate is not None else _per_mode(values, batch, modes)
        scores = refusal_score(logits, tokens)
        for s, g in zip(sites, _grads(scores.sum() / n, acts, sites, mask, retain=probes > 0)):
            for M, vals in zip(Ms, per):
                M += torch.einsum("btd,bte->de", g, vals[s]).double().cpu()
        if probes:
            if inside is None:
                inside = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
                inside[torch.as_tensor(list(tokens), device=logits.device)] = True
            several = curvature_parts(tokens) > 1
            rest = _probe_terms(logits, acts, per, mask, units, probes, gen, part=~inside, retain_last=several)
            own = _probe_terms(logits, acts, per, mask, units, probes, gen, part=inside) if several else None
            for i, curv in enumerate(curvs):
                curv -= rest[i]
                if own is not None:
                    curv += own[i]
        total, n_batches = total + float(scores.detach().sum()), n_batches + 1
    return [(M, c / (2 * max(probes, 1) * n)) for M, c in zip(Ms, curvs)], total / n, n_batches


def harmful_terms(model: Model, encs: Sequence[Encoded], tokens: Sequence[int], batch_size: int,
                  units: Float[torch.Tensor, "c d"] | None = None, probes: int = 0, seed: int = 0,
                  ablate: torch.Tensor | None = None, positions: str = "all"
                  ) -> tuple[Float[torch.Tensor, "d d"], Float[torch.Tensor, " c"], float, int]:
    """From one forward per batch of the harmful prompts: ``M = sum g o^T`` over writers, positions and prompts
    (float64, CPU); the logit-curvature term of the mean score for ablating each of ``units`` (``probes`` probes
    per part of the vocabulary; zeros without units or probes); the mean score; the batches run.
    ``ablate [k, d]``: taken where that subspace is ablated (``o`` before the projection, ``g`` after it: the
    second point of a trapezoid estimate). ``positions``: the tokens the ablation acts on (see ``_captured``)."""
    [(M, curv)], mean, n_batches = harmful_modes(model, encs, tokens, batch_size, units, probes, seed, ablate,
                                                 (positions,))
    return M, curv, mean, n_batches


def ablation_moment(model: Model, encs: Sequence[Encoded], tokens: Sequence[int], batch_size: int,
                    ablate: torch.Tensor | None = None, positions: str = "all"
                    ) -> tuple[Float[torch.Tensor, "d d"], float, int]:
    """``M``, the mean score and the batches run of :func:`harmful_terms` (no curvature term)."""
    M, _, mean, n_batches = harmful_terms(model, encs, tokens, batch_size, ablate=ablate, positions=positions)
    return M, mean, n_batches


def _probe_terms(logits: torch.Tensor, acts: dict[Site, torch.Tensor], per: Sequence[dict[Site, torch.Tensor]],
                 mask: torch.Tensor, units: torch.Tensor, probes: int, gen: torch.Generator,
                 part: torch.Tensor | None = None, retain_last: bool = False) -> list[torch.Tensor]:
    """``sum_i sum_k (u_ik . dz_i(r_c))^2`` per candidate ``[C]`` for this batch, for each writer-value set of
    ``per`` (one per ablation mode; the same probes): ``probes`` backwards of ``u . z`` with ``u ~ N(0, diag p - p
    p^T)``, ``p`` the softmax over the vocabulary or, with ``part`` (a bool mask over it), within that part (``u``
    is 0 outside it); ``dz`` the first-order logit change of ablating ``units[c]``. ``retain_last``: keep the graph
    after the last probe (more backwards follow)."""
    sites = list(per[0])
    r = units.to(logits.device, torch.float)
    projs = [{s: values[s] @ r.T for s in sites} for values in per]              # [B, T, C]: o . r
    z = logits.detach().float()
    p = (z if part is None else z.masked_fill(~part, float("-inf"))).softmax(-1)
    out = [torch.zeros(len(units), dtype=torch.float64) for _ in per]
    for k in range(probes):
        xi = torch.randn(p.shape, generator=gen).to(p.device)
        u = p.sqrt() * xi
        u = u - p * u.sum(-1, keepdim=True)
        gs = _grads((u * logits).sum(), acts, sites, mask, retain=retain_last or k < probes - 1)
        along = [g @ r.T for g in gs]                                              # [B, T, C]: g . r
        for acc, proj in zip(out, projs):
            dz = sum((a * proj[s]).sum(1) for s, a in zip(sites, along))          # [B, C], sign irrelevant
            acc += (dz.double() ** 2).sum(0).cpu()
    return out


def harmless_modes(model: Model, encs: Sequence[Encoded], tokens: Sequence[int], layers: Sequence[int],
                   units: Float[torch.Tensor, "c d"], batch_size: int, probes: int = PROBES, seed: int = 0,
                   modes: Sequence[str] = ("all",)
                   ) -> tuple[Float[torch.Tensor, "layers d"], list[torch.Tensor], float, int]:
    """:func:`harmless_terms` for each of ``modes`` from the same passes: ``G`` (the same for every mode), the KL
    estimate per mode, the mean score, the batches run."""
    _check_modes(modes, None)
    writers, resid = writer_sites(model), [Site("resid_pre", int(layer)) for layer in layers]
    sites = list(dict.fromkeys(writers + resid))
    n, gen = len(encs), torch.Generator().manual_seed(seed)
    G = torch.zeros(len(resid), model.d_model, dtype=torch.float64)
    kls = [torch.zeros(len(units), dtype=torch.float64) for _ in modes]
    total, n_batches = 0.0, 0
    for batch in batches(model, encs, batch_size):
        acts, logits, values, mask = _captured(model, batch, sites, None, "all")
        scores = refusal_score(logits, tokens)
        G += torch.stack([g.sum((0, 1)) for g in _grads(scores.sum() / n, acts, resid, mask, retain=probes > 0)]
                         ).double().cpu()
        if probes:
            per = _per_mode({s: values[s] for s in writers}, batch, modes)
            for kl, t in zip(kls, _probe_terms(logits, acts, per, mask, units, probes, gen)):
                kl += t
        total, n_batches = total + float(scores.detach().sum()), n_batches + 1
    return G, [kl / (2 * max(probes, 1) * n) for kl in kls], total / n, n_batches


def harmless_terms(model: Model, encs: Sequence[Encoded], tokens: Sequence[int], layers: Sequence[int],
                   units: Float[torch.Tensor, "c d"], batch_size: int, probes: int = PROBES, seed: int = 0,
                   positions: str = "all"
                   ) -> tuple[Float[torch.Tensor, "layers d"], Float[torch.Tensor, " c"], float, int]:
    """From one forward per batch of the harmless prompts: ``G`` (``sum_t g_{l,t}`` over prompts at resid_pre of
    ``layers``, the induce gradients), the second-order KL estimate of ablating each of ``units`` (at
    ``positions``), the mean score and the batches run (each: one forward, ``1 + probes`` backwards)."""
    G, [kl], mean, n_batches = harmless_modes(model, encs, tokens, layers, units, batch_size, probes, seed,
                                              (positions,))
    return G, kl, mean, n_batches


def estimate_modes(model: Model, data: RefusalData, cand: Candidates, tokens: RefusalTokens,
                   batch_size: int = 64, probes: int = PROBES, seed: int = 0, modes: Sequence[str] = ("all",)
                   ) -> dict[str, Estimate]:
    """:func:`estimate_candidates` for each of ``modes`` (ablation positions) from the same passes; each equals its
    own run. The passes are counted in the first mode's estimate (the others': 0 forwards, 0 backwards)."""
    toks = tokens.tokens
    _, enc_h = prepare(model, data.harmful["val"].instructions)
    _, enc_s = prepare(model, data.harmless["val"].instructions)
    raw = cand.raw.double()
    r = torch.nn.functional.normalize(raw, dim=-1)                                # [layers, P, d]
    units = r.flatten(0, 1).float()
    terms, base_h, nb_h = harmful_modes(model, enc_h, toks, batch_size, units, probes, seed + 1, modes=modes)
    G, kls, base_s, nb_s = harmless_modes(model, enc_s, toks, cand.layers, units, batch_size, probes, seed, modes)
    induce = (base_s + torch.einsum("lpd,ld->lp", raw, G)).float()
    passes = (nb_h + nb_s, nb_h * (1 + curvature_parts(toks) * probes) + nb_s * (1 + probes))
    out = {}
    for i, (mode, (M, curv), kl) in enumerate(zip(modes, terms, kls)):
        bypass = base_h - torch.einsum("lpd,de,lpe->lp", r, M, r) + curv.view(r.shape[:2])
        forwards, backwards = passes if i == 0 else (0, 0)
        out[mode] = Estimate(bypass.float(), induce, kl.view(bypass.shape).float(), base_h, base_s, forwards,
                             backwards, curv.view(r.shape[:2]).float())
    return out


def estimate_candidates(model: Model, data: RefusalData, cand: Candidates, tokens: RefusalTokens,
                        batch_size: int = 64, probes: int = PROBES, seed: int = 0, ablate_positions: str = "all"
                        ) -> Estimate:
    """Bypass, induce (first order) and KL (second order, ``probes`` random probes) estimates ``[layers, P]`` of
    every candidate, on the scale of :class:`~interp.studies.kit.stages.Scores`; ablations at ``ablate_positions``."""
    return estimate_modes(model, data, cand, tokens, batch_size, probes, seed, (ablate_positions,))[ablate_positions]


def top_candidates(est: Estimate, cand: Candidates, n_layers: int, cfg: SelectionConfig, k: int
                   ) -> Bool[torch.Tensor, "layers P"]:
    """The ``k`` candidates to score exactly, among those the depth filter keeps: first those whose estimates
    pass the induce and KL filters, then those failing only KL, then only induce, then both; by estimated bypass
    within each group. With ``kl_reference="random"`` the KL cut is known only once the random ablations are scored
    exactly, so the estimated KL does not rank (induce, then bypass)."""
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    n_pos = cand.n_positions
    depth_ok = (torch.tensor(cand.layers) < math.floor(n_layers * (1 - cfg.prune_layer_fraction)))[:, None]
    depth_ok = depth_ok.expand(len(cand.layers), n_pos).flatten()
    kl_fails = (est.kl >= cfg.kl_threshold).flatten() if cfg.kl_reference == "absolute" else torch.zeros(est.kl.numel())
    fails = 2 * (est.induce <= cfg.induce_threshold).flatten().double() + kl_fails
    key = est.bypass.flatten().double() + 1e9 * fails        # refusal scores are log-odds, far below 1e9
    key = torch.where(depth_ok, key, math.inf)
    chosen = torch.argsort(key, stable=True)[:min(k, int(depth_ok.sum()))]
    mask = torch.zeros(len(key), dtype=torch.bool)
    mask[chosen] = True
    return mask.view(len(cand.layers), n_pos)


def agreement(est: Estimate, scores: Scores, only: torch.Tensor | None = None) -> dict[str, float | None]:
    """Spearman rank correlation of estimated and exact bypass / induce / KL over the exactly scored candidates
    (``only``; all when ``None``); ``None`` where fewer than 3 are scored or one side is constant."""
    keep = torch.ones_like(scores.bypass, dtype=torch.bool) if only is None else only
    keep = keep & ~scores.bypass.isnan()
    names = ("bypass", "induce", "kl")
    if int(keep.sum()) < 3:
        return dict.fromkeys(names)
    rho = {name: float(spearman(getattr(est, name)[keep], getattr(scores, name)[keep])) for name in names}
    return {name: (v if math.isfinite(v) else None) for name, v in rho.items()}


def search_metrics(cfg: SelectionConfig, est: Estimate | None, scores: Scores) -> dict[str, Any]:
    """metrics.json's record of the search: the mode, ``top_k``, how many candidates were scored exactly, the KL
    of random directions ablated the same way (the KL filter's reference level) and (in estimate mode) the
    Spearman correlation of the estimates with the exact scores over those."""
    out: dict[str, Any] = {"search": cfg.search, "top_k": cfg.top_k if cfg.search == "estimate" else None,
                           "n_scored_exactly": scores.n_scored, "kl_random": scores.kl_random}
    if est is not None:
        out["estimate_spearman"] = agreement(est, scores)
    return out


__all__ = ["PROBES", "Estimate", "ablation_moment", "agreement", "estimate_candidates", "estimate_modes", "harmless_terms",
           "search_metrics", "top_candidates", "writer_sites"]
