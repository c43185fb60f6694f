"""Steering: interventions on the residual stream, applied by hooks, baked into weights, or fused kernels.

    import steering
    with steering.apply(model, steering.AddVector(v, layers=6, alpha=4.0)):
        out = model.hf.generate(...)
    gens = steering.generate(model, prompts, steering.DirectionalAblation(r))
    session = steering.GenerationSession(model, prompts)     # many edits, one encoding and plain prompt pass
    outs = session.generate_each([(steering.DirectionalAblation(r),), (steering.AddVector(v, layers=6),)])
    baked = steering.bake(model, r).model
    k = steering.AblationKernel(1.0, 12.5, 0.2, 6.0)        # heretic-style: a weight kernel per writer kind
    baked = steering.WeightedAblation(r, kernel={"attn": k, "mlp": k}, reference=harmless_mean).bake(model).model
    served = steering.bake_addition(model, steering.AddVector(v, layers=6)).model   # a bias: save_pretrained, vLLM
    steering.export_gguf(served, "steered.gguf")      # llama.cpp (steering.gguf_export.export_control_vector too)
    norms = steering.residual_norms(model, prompts)          # alpha in units of the residual norm:
    iv = steering.AddVector(d, layers=12, alpha=0.5, unit="residual", norms=norms)
    sweep = steering.alpha_sweep(model, prompts, make_iv, [0, 0.5, 1], evals.refusal_rate)
    steering.save_edit(iv, "edits/add", model=model); iv = steering.load_edit("edits/add", model=model)   # exact

The functions ``apply``, ``bake`` and ``generate`` share their names with their modules, so they are
imported here eagerly (a lazy attribute would be shadowed by the submodule once it loads). Triton is
imported only when a CUDA kernel first runs.
"""

from __future__ import annotations

from steering.abliteration import AblationKernel, WeightedAblation, direction_at, orthogonalize  # noqa: F401  (steering.abliteration's helpers, reachable here too)
from steering.abliteration_norm import NormPreservingAblation, WriterAblation
from steering.applying import apply
from steering.baking import bake
from steering.bias import bake_addition
from steering.generation import GenerationSession, Sampling, generate
from steering.gguf_export import export_gguf
from steering.interventions import Ablate, AblateSubspace, AddVector, Clamp, DirectionalAblation
from steering.judged import generate_and_judge
from steering.rows import RowEdits, RowGroups
from steering.specs import load_edit, save_edit
from steering.strength import residual_norms
from steering.sweep import SweepConfig, alpha_sweep

__all__ = ["Ablate", "AblateSubspace", "AddVector", "Clamp", "DirectionalAblation", "GenerationSession",
           "NormPreservingAblation", "RowEdits", "RowGroups", "Sampling", "SweepConfig", "WeightedAblation",
           "WriterAblation", "alpha_sweep", "apply", "bake", "bake_addition", "export_gguf", "generate",
           "generate_and_judge", "load_edit", "residual_norms", "save_edit"]
