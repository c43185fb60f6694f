"""Circuits: activation, attribution and path patching, heads and neurons, learned masks, component transplant.

Typical flow: ``pairs = make_pairs(model, clean, corrupted)`` then ``sweep_positions(model, pairs, metric)``
(exact, batched), ``attribute(model, pairs, metric)`` (one forward + backward) and
``compare_attribution(...)`` to check the estimate; every sweep is a :class:`Sweep` with ``.plot()``.
"""

from __future__ import annotations

from patching.activation import Patch, patch, sweep_heads, sweep_layers, sweep_positions
from patching.attribution import Attribution, AttributionCheck, attribute, compare_attribution, pearson
from patching.heads import HeadOutputs, ablate_heads, head_ablation_sweep, head_means, head_outputs
from patching.masks import MaskResult, learn_mask
from patching.measures import (
    call_metric,
    kl_div,
    logit_diff,
    refusal_score,
    refusal_token_ids,
    token_logprob,
)
from patching.neurons import (
    NeuronContrast,
    NeuronEffect,
    NeuronOverlap,
    ablate_neurons,
    intersect_neurons,
    neuron_ablation_effect,
    neuron_acts,
    neuron_contrast,
    neuron_means,
)
from patching.path import Component, path_patch, path_patch_sweep
from patching.results import Sweep
from patching.runs import PromptPairs, make_pairs
from patching.transplant import (
    TransplantSearch,
    check_compatible,
    greedy_transplant,
    transplant,
    transplanted,
)

__all__ = [
    "Patch", "patch", "sweep_positions", "sweep_heads", "sweep_layers",
    "Attribution", "AttributionCheck", "attribute", "compare_attribution", "pearson",
    "HeadOutputs", "head_outputs", "head_means", "ablate_heads", "head_ablation_sweep",
    "MaskResult", "learn_mask",
    "call_metric", "logit_diff", "kl_div", "refusal_score", "refusal_token_ids", "token_logprob",
    "NeuronContrast", "NeuronEffect", "NeuronOverlap", "neuron_acts", "neuron_contrast", "neuron_means",
    "ablate_neurons", "neuron_ablation_effect", "intersect_neurons",
    "Component", "path_patch", "path_patch_sweep",
    "Sweep", "PromptPairs", "make_pairs",
    "transplant", "transplanted", "check_compatible", "greedy_transplant", "TransplantSearch",
]
