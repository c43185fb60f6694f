"""The model's own refusal direction as the refusal job finds it, for studies that need the direction but not
the whole job: difference of means at each layer's resid_pre, last post-instruction token, the layer chosen by the
job's filters (:func:`interp.studies.kit.stages.select_direction`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from interp.models import Model
from interp.studies.kit.config import SelectionConfig
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.stages import RefusalTokens, find_candidates, score_candidates, select_direction
from interp.values import Runtime


@dataclass(frozen=True)
class OwnDirection:
    """The model's own refusal direction: ``raw`` (difference of means) at ``resid_pre`` of ``layer``, ``unit``;
    ``how``: ``"filters"`` (passed the refusal job's filters) or ``"lowest bypass"`` (none passed: the candidate
    whose ablation lowers the refusal score most)."""

    layer: int
    raw: torch.Tensor
    unit: torch.Tensor
    how: str


def own_direction(model: Model, data: RefusalData, tokens: RefusalTokens, batch_size: int,
                  layers: list[int] | None = None) -> OwnDirection:
    """Difference of means at every layer's resid_pre (or only at ``layers``, a cheaper search), last
    post-instruction token; the refusal job's selection."""
    cand = find_candidates(model, data, layers=layers, batch_size=batch_size)
    only = torch.zeros(cand.raw.shape[:2], dtype=torch.bool)
    only[:, -1] = True
    scores = score_candidates(model, data, cand, tokens, only=only, runtime=Runtime(batch_size=batch_size, progress=False))
    sel = select_direction(model.n_layers, cand, scores, SelectionConfig())
    if sel.found:
        li, how = sel.layer_index, "filters"
    else:
        cut = max(1, math.floor(model.n_layers * (1 - SelectionConfig().prune_layer_fraction)))
        bypass = torch.nan_to_num(scores.bypass[:, -1], nan=math.inf)
        bypass[cand.raw[:, -1].norm(dim=-1) < 1e-6] = math.inf  # e.g. layer 0: one template token, no difference
        bypass[torch.tensor(cand.layers) >= cut] = math.inf     # the layers the filters prune
        li, how = int(bypass.argmin()), "lowest bypass"
    if not cand.raw[li, -1].norm() > 1e-6:
        raise ValueError("harmful and harmless prompts have the same mean activation at every layer, so there is no "
                         "refusal direction; check the prompt sets")
    raw = cand.raw[li, -1].float()
    return OwnDirection(cand.layers[li], raw, raw / raw.norm(), how)


__all__ = ["OwnDirection", "own_direction"]
