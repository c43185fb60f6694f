"""The refusal job's evaluated conditions: each condition's prompt set and edits, and the edits as objects a user can
save and reload (``steering.save_edit`` / ``load_edit``): what :func:`~interp.studies.refusal.evaluation.evaluate`
applies and the run writes to ``edits/``."""

from __future__ import annotations

from typing import Any

import torch

import steering
from interp.models import Model
from interp.studies.kit.scoring import ablation
from probes.directions import random_directions, random_orthogonal

KL_CONTROLS = ("random ablation", "every-token ablation")


def conditions(r: torch.Tensor, v: torch.Tensor, rand_u: torch.Tensor, layer: int, seed: int, borderline: bool,
               positions: str = "all") -> dict[str, tuple]:
    """``{condition: (prompt set, edits)}``: the baseline, the ablation and the addition of the direction ``r`` (its raw
    difference of means ``v``) at ``layer`` with their random (``rand_u``) and orthogonal controls."""
    orth_u = random_orthogonal(r[None], 1, seed=seed)[0].vectors[0]
    add = {"sites": "resid_pre", "layers": layer}
    over = {} if not borderline else {  # over-refusal on benign look-alikes, at baseline and under each edit
        "borderline/baseline": ("borderline", ()),
        "borderline/ablation": ("borderline", (ablation(r, positions),)),
        "borderline/random ablation": ("borderline", (ablation(rand_u, positions),)),
        "borderline/addition": ("borderline", (steering.AddVector(v, **add),)),
        "borderline/random addition": ("borderline", (steering.AddVector(rand_u * v.norm(), **add),)),
    }
    return over | {
        "harmful/baseline": ("harmful", ()),
        "harmful/ablation": ("harmful", (ablation(r, positions),)),
        "harmful/random ablation": ("harmful", (ablation(rand_u, positions),)),
        "harmful/orthogonal ablation": ("harmful", (ablation(orth_u, positions),)),
        "harmless/baseline": ("harmless", ()),
        "harmless/addition": ("harmless", (steering.AddVector(v, **add),)),
        "harmless/random addition": ("harmless", (steering.AddVector(rand_u * v.norm(), **add),)),
        "harmless/orthogonal addition": ("harmless", (steering.AddVector(orth_u * v.norm(), **add),)),
    }


def evaluated_edits(model: Model, direction: Any, layer: int, seed: int, borderline: bool,
                    ablate_positions: str = "all") -> dict[str, Any]:
    """``{condition: edit}`` of every edit :func:`evaluate` applies (one per condition), and the every-token
    ablation (the baked edit and, in post-instruction runs, a KL control): what the run saves as edit specs."""
    rand_u = random_directions(model.d_model, 1, seed=seed)[0].vectors[0]
    conds = conditions(direction.vectors[0], direction.raw[0], rand_u, layer, seed, borderline, ablate_positions)
    return {k: ivs[0] for k, (_, ivs) in conds.items() if ivs} | {
        KL_CONTROLS[1]: ablation(direction.vectors[0], "all")}


__all__ = ["KL_CONTROLS", "conditions", "evaluated_edits"]
