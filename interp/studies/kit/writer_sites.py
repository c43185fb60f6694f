"""The residual stream's writers grouped by kind (attention, MLP, routed experts, shared expert, embedding, all),
each with the edits that ablate a direction from that group alone: the per-writer studies share them.

Every write to the residual stream comes from the embedding (``resid_pre`` of layer 0), an attention output or
an MLP output (for a mixture of experts: the routed experts' weighted sum plus the gated shared expert).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from interp.models import Model
from interp.studies.kit.scoring import ablation

Make = Callable[[torch.Tensor], list[Any]]   # a unit direction -> the interventions that ablate it from a group


def _span(layers: list[int]) -> str:
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]}"
    return f"layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}"


def embedding_note(model: Model) -> str:
    """What ``resid_pre`` of layer 0 holds in this family: the token embedding, plus learned positions if any."""
    spec = model.spec
    s = f"resid_pre of layer 0 = the token embedding ({spec.embed})"
    if spec.family.startswith("gemma"):
        s += " times sqrt(d_model)"
    if spec.pos_embed:
        return s + f" plus the learned positional embedding ({spec.pos_embed})"
    return s + "; no positional embedding is added to the residual stream (positions enter inside attention)"


def moe_layers(model: Model) -> tuple[list[int], list[int]]:
    """Layers whose routed experts (``experts_out``) and shared expert (``shared_expert_out``) can be hooked."""
    names = set(model.site_names())
    return ([i for i in range(model.n_layers) if f"blocks.{i}.mlp.hook_experts_out" in names],
            [i for i in range(model.n_layers) if f"blocks.{i}.mlp.hook_shared_expert_out" in names])


def writer_groups(model: Model, positions: str = "all") -> tuple[dict[str, tuple[str, Make]], list[str]]:
    """``{group: (sites, make)}`` in order (attention, MLP, [routed experts, shared expert], embedding, all writers)
    and notes on what a mixture of experts' groups leave out. ``positions``: every token, or the
    post-instruction ones (and every generated one), as the run's ablation."""
    every = list(range(model.n_layers))

    def at(d: torch.Tensor, sites: str, layers: Any = "all") -> list[Any]:
        return [ablation(d, positions, sites=sites, layers=layers)]

    groups: dict[str, tuple[str, Make]] = {
        "attention": (f"attn_out, {_span(every)}", lambda d: at(d, "attn_out")),
        "MLP": (f"mlp_out, {_span(every)}", lambda d: at(d, "mlp_out"))}
    notes: list[str] = []
    routed, shared = moe_layers(model)
    if model.spec.is_moe and not routed:
        notes.append("the routed experts are separate modules here (no one module's output is their sum): routed "
                     "and shared experts are not ablated apart")
    if routed:
        groups["routed experts"] = (f"experts_out, {_span(routed)}",
                                    lambda d: at(d, "experts_out", routed))
        dense = [i for i in every if i not in routed]
        if dense:
            notes.append(f"{_span(dense)} have a dense MLP: they are in the MLP group only")
    if shared:
        groups["shared expert"] = (f"shared_expert_out (before its sigmoid gate, a per-token scalar), {_span(shared)}",
                                   lambda d: at(d, "shared_expert_out", shared))
    groups["embedding"] = ("resid_pre, layer 0", lambda d: at(d, "resid_pre", 0))
    groups["all writers"] = ("resid_pre, attn_out, mlp_out at every layer (DirectionalAblation)",
                             lambda d: [ablation(d, positions)])
    return groups, notes


__all__ = ["Make", "embedding_note", "moe_layers", "writer_groups"]
