"""Circuits: activation, attribution and path patching, heads and neurons, learned masks, component transplant.

Typical flow: ``pairs = make_pairs(model, clean, corrupted)`` then ``sweep_positions(model, pairs, metric)``
(exact, batched), ``attribute(model, pairs, metric)`` (one forward + backward) and
``compare_attribution(...)`` to check the estimate; every sweep is a :class:`Sweep` with ``.plot()``.
At feature level: ``rm = ReplacementModel(model, transcoders)`` then ``attribution_graph(rm, prompt)`` (an
:class:`~patching.graph_result.AttributionGraph`); ``patching.graph_edits.intervene`` tests it.
"""

from __future__ import annotations

from interp.patching.activation import patch, sweep_layers, sweep_positions
from interp.patching.attribution import attribute
from interp.patching.graphs import GraphConfig, attribution_graph
from interp.patching.heads import ablate_heads
from interp.patching.masks import MaskConfig, learn_mask
from interp.patching.measures import logit_diff, refusal_score
from interp.patching.neurons import ablate_neurons
from interp.patching.path import path_patch
from interp.patching.replacement import ReplacementModel
from interp.patching.runs import make_pairs
from interp.patching.transplants import SearchConfig, greedy_transplant, transplant

__all__ = ["ReplacementModel", "ablate_heads", "ablate_neurons", "attribute", "attribution_graph", "GraphConfig",
           "greedy_transplant", "learn_mask", "MaskConfig", "logit_diff", "make_pairs", "patch", "path_patch",
           "refusal_score", "SearchConfig", "sweep_layers", "sweep_positions", "transplant"]
