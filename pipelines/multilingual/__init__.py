"""Multilingual safety studies on parallel prompts: refusal retention across languages (``retention``: refusal per
language, the English direction's projection ratio, cosine drift, language-specific directions, ablation per
language with random controls), language identity vs safety geometry (``language``: identity, subspace overlap,
LEACE erasure vs random erasure), safety neurons per language and their intersections (``neurons``); the data (``data``), the geometry (``geometry``) and the report page (``report``)."""

from pipelines.multilingual.data import LANGS, ParallelSafety, load_parallel_safety
from pipelines.multilingual.geometry import Geometry
from pipelines.multilingual.language import LanguageGeometry, language_geometry
from pipelines.multilingual.neurons import SafetyNeurons, safety_neurons
from pipelines.multilingual.report import retention_page, write_retention
from pipelines.multilingual.retention import Retention, RetentionConfig, refusal_retention

__all__ = ["LANGS", "Geometry", "LanguageGeometry", "ParallelSafety", "Retention", "RetentionConfig", "SafetyNeurons",
           "language_geometry", "load_parallel_safety", "refusal_retention", "retention_page", "safety_neurons",
           "write_retention"]
