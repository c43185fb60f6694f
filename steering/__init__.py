"""Steering: interventions on the residual stream, applied by hooks, baked into weights, or fused kernels.

    import steering
    with steering.apply(model, steering.AddVector(v, layers=6, alpha=4.0)):
        out = model.hf.generate(...)
    gens = steering.generate(model, prompts, steering.DirectionalAblation(r))
    baked = steering.bake(model, r).model

The functions ``apply``, ``bake`` and ``generate`` share their names with their modules, so they are
imported here eagerly (a lazy attribute would be shadowed by the submodule once it loads). Triton is
imported only when a CUDA kernel first runs.
"""

from __future__ import annotations

from steering.apply import Steering, apply
from steering.bake import WRITERS, BakeResult, ablate_writers, bake
from steering.fused import LowRankEdit, apply_edit
from steering.generate import Generations, generate
from steering.interventions import Ablate, AblateSubspace, AddVector, Clamp, Condition, DirectionalAblation
from steering.rows import RowEdits
from steering.scope import TokenState

__all__ = [
    "Ablate", "AblateSubspace", "AddVector", "BakeResult", "Clamp", "Condition", "DirectionalAblation",
    "Generations", "LowRankEdit", "RowEdits", "Steering", "TokenState", "WRITERS", "ablate_writers", "apply", "apply_edit",
    "bake", "generate",
]
