"""Where the forms differ inside the model: activation patching between the imperative and another form of the same
requests (:mod:`interp.patching`), read by the first-token refusal score.

Pairs are aligned on their last ``n_positions`` tokens (the chat template's post-instruction tokens and the end of
the request), or token for token (``align="same"``, which needs equal token counts). ``to_form``: the imperative's
``resid_pre`` patched into the other form, the share of the imperative-minus-form score gap restored (1: the
imperative's score). ``back``: the other form's patched into the imperative, the share of the gap removed.
Heads and neurons are then patched at the found layers, all chosen units at once, against random units of the same
layers and number (:func:`interp.evals.controls.matched_random`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from interp.evals.controls import matched_random
from interp.models import Model
from interp.patching.activation import Patch, patch, sweep_heads, sweep_positions
from interp.patching.measures import Metric, refusal_score, refusal_token_ids
from interp.patching.neurons import neuron_contrast, random_neurons
from interp.patching.results import Sweep
from interp.patching.runs import PromptPairs, gather_aligned, make_pairs, run_with_capture
from interp.sites import Site
from interp.values import Runtime


def refusal_metric(model: Model) -> Metric:
    """Mean first-token refusal score over the judge's refusal openings."""
    return refusal_score(refusal_token_ids(model.tokenizer))


def form_pairs(model: Model, imperative: list[str], other: list[str], align: str, n_positions: int) -> PromptPairs:
    """Imperative (clean) and other-form (corrupted) prompts, aligned on the last ``n_positions`` tokens or token for
    token (``align="same"``)."""
    if align == "same":
        return make_pairs(model, imperative, other, align="same")
    return make_pairs(model, imperative, other, align=[(p - n_positions, p - n_positions) for p in range(n_positions)])


def share(values: torch.Tensor, baseline: float, reference: float) -> torch.Tensor:
    """``(values - baseline) / (reference - baseline)``; nan where the two runs score the same."""
    gap = reference - baseline
    return (values.float() - baseline) / gap if abs(gap) > 1e-9 else torch.full_like(values.float(), float("nan"))


def both_ways(model: Model, pairs: PromptPairs, metric: Metric, layers: Sequence[int], batch_size: int
              ) -> tuple[Sweep, Sweep]:
    """``resid_pre`` by layer x aligned position, imperative -> form and form -> imperative."""
    kw = dict(site="resid_pre", layers=list(layers), runtime=Runtime(batch_size=batch_size, progress=False))
    return (sweep_positions(model, pairs, metric, **kw),
            sweep_positions(model, pairs, metric, runs=("corrupted", "clean"), **kw))


def top_layers(grids: Sequence[torch.Tensor], layers: Sequence[int], n: int) -> list[int]:
    """The ``n`` layers whose best position restores the largest share, averaged over the ``grids [L, P]``."""
    best = torch.stack([torch.nan_to_num(g, nan=float("-inf")).max(1).values for g in grids]).mean(0)
    return [layers[i] for i in torch.nan_to_num(best, nan=float("-inf"), neginf=-1e9).argsort(descending=True)[:n]]


def head_sweep(model: Model, pairs: PromptPairs, metric: Metric, layers: list[int], batch_size: int) -> Sweep:
    """Each head's output (``z``) at every aligned position, imperative -> form: ``[len(layers), H]``."""
    return sweep_heads(model, pairs, metric, layers=layers, runtime=Runtime(batch_size=batch_size, progress=False))


def top_heads(sweep: Sweep, layers: list[int], n: int) -> list[tuple[int, int]]:
    """The ``n`` (layer, head) whose patch restores the largest share of the gap (either sign of the gap)."""
    restored = share(sweep.values, sweep.baseline, sweep.reference)
    order = torch.nan_to_num(restored, nan=float("-inf")).flatten().argsort(descending=True)
    H = sweep.values.shape[1]
    return [(layers[i // H], i % H) for i in order[:n].tolist()]


def top_neurons(model: Model, imperative: list[str], other: list[str], layers: list[int], n: int,
                batch_size: int) -> list[tuple[int, int]]:
    """The ``n`` MLP neurons of ``layers`` whose last-token activation differs most between the forms (effect
    size; :func:`interp.patching.neurons.neuron_contrast`)."""
    con = neuron_contrast(model, imperative, other, layers=layers, batch_size=batch_size)
    return [(la, i) for la, i, _ in con.top(n)]


def unit_patch(units: Sequence[tuple[int, int]], kind: str) -> list[Patch]:
    """Patches of ``units`` (layer, head) for ``attn_z`` or (layer, neuron) for ``mlp_post``, every position."""
    if kind == "heads":
        return [Patch(Site("attn_z", la), None, head=h) for la, h in units]
    return [Patch(Site("mlp_post", la), None, neuron=i) for la, i in units]


def component_control(model: Model, pairs: PromptPairs, metric: Metric, found: list[tuple[int, int]], kind: str,
                      gap: tuple[float, float], n_random: int, seed: int, batch_size: int) -> dict[str, object]:
    """Share of the ``gap`` (form's score, imperative's score) restored by patching all ``found`` units at once, and
    by ``n_random`` draws of as many random units of the same layers (heads: :func:`matched_random`; neurons: :func:`interp.patching.neurons.random_neurons`)."""
    if kind == "heads":
        H = model.n_heads
        draws = [matched_random(found, lambda u: [(u[0], h) for h in range(H)], seed + i, what="head")
                 for i in range(n_random)]
    else:
        draws = [random_neurons(found, int(model.d_mlp), len(found), seed + i) for i in range(n_random)]
    variants = [unit_patch(found, kind)] + [unit_patch(d, kind) for d in draws]
    vals = patch(model, pairs, variants, metric, runtime=Runtime(batch_size=batch_size, progress=False))
    s = share(vals, *gap).tolist()
    return {"size": len(found), "units": [list(u) for u in found], "found": s[0], "random": s[1:],
            "random_units": [[list(u) for u in d] for d in draws]}


def aligned_difference(model: Model, pairs: PromptPairs, layers: list[int]) -> torch.Tensor:
    """Mean over pairs of imperative minus other-form ``resid_pre`` at ``layers`` x aligned positions: ``[F, P, d]``."""
    sites = [Site("resid_pre", la) for la in layers]
    a, _ = run_with_capture(model, pairs.clean, sites)
    b, _ = run_with_capture(model, pairs.corrupted, sites)
    return torch.stack([(gather_aligned(a[s], pairs.cols["clean"]).float()
                         - gather_aligned(b[s], pairs.cols["corrupted"]).float()).mean(0) for s in sites]).cpu()


__all__ = ["aligned_difference", "both_ways", "component_control", "form_pairs", "head_sweep", "refusal_metric",
           "share", "top_heads", "top_layers", "top_neurons", "unit_patch"]
