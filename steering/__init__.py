"""Steering: interventions on the residual stream, applied by hooks, baked into weights, or fused kernels.

    import steering
    with steering.apply(model, steering.AddVector(v, layers=6, alpha=4.0)):
        out = model.hf.generate(...)
    gens = steering.generate(model, prompts, steering.DirectionalAblation(r))
    baked = steering.bake(model, r).model
    norms = steering.residual_norms(model, prompts)          # alpha in units of the residual norm:
    iv = steering.AddVector(d, layers=12, alpha=0.5, unit="residual", norms=norms)
    sweep = steering.alpha_sweep(model, prompts, make_iv, [0, 0.5, 1], evals.refusal_rate)

The functions ``apply``, ``bake`` and ``generate`` share their names with their modules, so they are
imported here eagerly (a lazy attribute would be shadowed by the submodule once it loads). Triton is
imported only when a CUDA kernel first runs.
"""

from __future__ import annotations

from steering.apply import Steering, apply
from steering.bake import WRITERS, BakeResult, ablate_writers, bake
from steering.fused import LowRankEdit, apply_edit
from steering.generate import Generations, generate
from steering.interventions import (
    WRITER_SITES,
    Ablate,
    AblateSubspace,
    AddVector,
    Clamp,
    Condition,
    DirectionalAblation,
)
from steering.rows import RowEdits
from steering.scope import TokenState
from steering.strength import ResidualNorms, residual_norms
from steering.sweep import AlphaSweep, alpha_sweep

__all__ = [
    "Ablate", "AblateSubspace", "AddVector", "AlphaSweep", "BakeResult", "Clamp", "Condition", "DirectionalAblation",
    "Generations", "LowRankEdit", "ResidualNorms", "RowEdits", "Steering", "TokenState", "WRITERS", "WRITER_SITES",
    "ablate_writers", "alpha_sweep", "apply", "apply_edit", "bake", "generate", "residual_norms",
]
