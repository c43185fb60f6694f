"""Multilingual safety studies on parallel prompts: refusal retention across languages (``retention``: refusal per
language, the English direction's projection ratio, cosine drift, language-specific directions, ablation per
language with random controls), language identity vs safety geometry (``language``: identity, subspace overlap,
LEACE erasure vs random erasure), safety neurons per language and their intersections (``neurons``), English ->
language patching (``pathways``), SAE safety features by language (``features``), pathway- and neuron-restricted
updates vs random sets of the same size (``updates``); the data (``data``), the geometry (``geometry``) and the
report page (``report``)."""

from interp.studies.multilingual.data import LANGS, ParallelSafety, load_parallel_safety
from interp.studies.multilingual.features import LanguageFeatures, features_by_language
from interp.studies.multilingual.geometry import Geometry
from interp.studies.multilingual.language import LanguageGeometry, language_geometry
from interp.studies.multilingual.neurons import SafetyNeurons, safety_neurons
from interp.studies.multilingual.pathways import Pathways, refusal_pathways
from interp.studies.multilingual.report import retention_page, write_retention
from interp.studies.multilingual.retention import Retention, RetentionConfig, refusal_retention
from interp.studies.multilingual.updates import RestrictedUpdate, UpdateConfig, restricted_update

__all__ = ["LANGS", "Geometry", "LanguageFeatures", "LanguageGeometry", "ParallelSafety", "Pathways", "Retention",
           "RestrictedUpdate", "RetentionConfig", "SafetyNeurons", "UpdateConfig", "features_by_language",
           "language_geometry", "load_parallel_safety", "refusal_pathways", "refusal_retention", "restricted_update",
           "retention_page", "safety_neurons", "write_retention"]
