"""Choosing layers by a stated rule: ``choose(LayerRule(("auroc", "cohens_d"), tol=0.005), {name: [L]}, sites)``."""

from probes._choice import LayerChoice, LayerRule, choose

__all__ = ["LayerChoice", "LayerRule", "choose"]
