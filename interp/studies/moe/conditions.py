"""The writer conditions of a mixture of experts and the joint edit baked into its weights.

Every residual write after the embedding is an attention output, a dense MLP's output (the ``mlp_only_layers``)
or a mixture-of-experts block's output, which is the routed experts' weighted sum plus the gated shared expert.
The conditions split these writers into three disjoint groups (attention; dense MLPs and shared experts; routed
experts) and the joint condition ablates from all three at once, so ``joint`` plus the embedding is
:class:`steering.DirectionalAblation` exactly. A basis ``[k, d]`` is ablated as a subspace
(:class:`steering.AblateSubspace`) from the same writers.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

import steering
from interp.chat import Encoded
from interp.forward import batches, forward
from interp.models import Model
from interp.studies.kit.writer_sites import moe_layers

ALONE = ("attention", "dense + shared", "routed experts")
JOINT = "joint"
BAKED_WRITERS = ("attn", "mlp", "experts", "shared_expert")   # steering.bake's names of the same writers


def moe_parts(model: Model) -> dict[str, list[int]]:
    """Layers of each writer kind: ``attention`` (every layer), ``dense`` (dense MLP layers), ``shared`` (a
    shared expert), ``routed`` (routed experts). A model without routed experts is refused."""
    routed, shared = moe_layers(model)
    if not model.spec.is_moe or not routed:
        raise ValueError(f"{model.name} ({model.spec.family}) has no routed experts whose summed output can be hooked "
                         f"(experts_out); this study needs a mixture of experts such as qwen2_moe or "
                         f"load_model('smollm2-moe-aligned'); for a dense model use "
                         f"interp.studies.refusal.writer_attribution")
    dense = [i for i in range(model.n_layers) if i not in routed]
    if not dense and not shared:
        raise ValueError(f"{model.name} has neither dense MLP layers nor a shared expert, so the 'dense + shared' "
                         f"condition would ablate nothing; use a model with either (qwen2_moe with mlp_only_layers)")
    return {"attention": list(range(model.n_layers)), "dense": dense, "shared": shared, "routed": routed}


def _edit(v: torch.Tensor, site: str, layers: list[int]) -> Any:
    if v.dim() == 1:
        return steering.DirectionalAblation(v, sites=site, layers=layers)
    return steering.AblateSubspace(v, sites=site, layers=layers)


def writer_sites(model: Model) -> dict[str, list[tuple[str, list[int]]]]:
    """``{condition: [(site, layers), ...]}`` for the three groups alone and the joint condition."""
    p = moe_parts(model)
    groups = {"attention": [("attn_out", p["attention"])],
              "dense + shared": [(s, ls) for s, ls in (("mlp_out", p["dense"]), ("shared_expert_out", p["shared"]))
                                 if ls],
              "routed experts": [("experts_out", p["routed"])]}
    groups[JOINT] = [x for g in ALONE for x in groups[g]]
    return groups


def writer_conditions(model: Model, direction: torch.Tensor) -> dict[str, list[Any]]:
    """``{condition: edits}`` ablating ``direction`` (a unit ``[d]`` or an orthonormal basis ``[k, d]``) from each
    group alone and from all three jointly (every token, prompt and answer)."""
    v = torch.as_tensor(direction).detach().float().cpu()
    if v.shape[-1] != model.d_model or v.dim() not in (1, 2):
        raise ValueError(f"direction must be [d] or a basis [k, d] with d = {model.d_model}, got {tuple(v.shape)}")
    return {name: [_edit(v, site, layers) for site, layers in sites] for name, sites in writer_sites(model).items()}


def bake_check(model: Model, direction: torch.Tensor, encs: list[Encoded], batch_size: int = 16,
               tolerance: float = 1e-4) -> dict[str, Any]:
    """Bake the joint ablation of unit ``direction`` into a copy's weights (attention ``o_proj``, dense
    ``down_proj``, the routed experts' 3-D ``down_proj``, the shared expert's ``down_proj``) and compare its logits
    at every real token of ``encs`` with the hooks': ``{rel, max_abs, ok, edited, per_writer, probe_rel}`` (``rel``: max |diff| /
    max |hook logit|; ``probe_rel``: :func:`steering.bake`'s own check on random tokens)."""
    joint = writer_conditions(model, direction)[JOINT]
    baked = steering.bake(model, direction, writers=BAKED_WRITERS, measure=True)
    worst, top = 0.0, 0.0
    for b in batches(model, encs, batch_size):
        with steering.apply(model, *joint) as handle:
            handle.set_batch(b)
            ref = forward(model, b).float()
        got = forward(baked.model, b).float()
        real = b.attention_mask.bool().to(ref.device)
        worst = max(worst, float((got - ref)[real].abs().max()))
        top = max(top, float(ref[real].abs().max()))
    rel = worst / max(top, 1e-30)
    kinds = Counter(r["writer"] for r in baked.removed)
    return {"rel": rel, "max_abs": worst, "ok": rel < tolerance, "tolerance": tolerance, "edited": len(baked.edited),
            "per_writer": dict(kinds), "probe_rel": baked.rel_logit_error, "parameters": baked.edited}


__all__ = ["ALONE", "BAKED_WRITERS", "JOINT", "bake_check", "moe_parts", "writer_conditions", "writer_sites"]
