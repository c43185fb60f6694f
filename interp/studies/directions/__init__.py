"""Studies of directions: calibrated trait scales, families of cue-induced bias directions, value and partisan
vectors, and representational similarity, on any HF model, each returning a result with ``.plot()``,
``.to_frame()`` and its controls (random directions or a random-weights twin, intervals, a null reported as one).

- Trait scales (Big Five persona vectors): :func:`trait_scales` (graded levels -> direction, held-out ordering and
  adjacent d, a band by a stated :class:`BandRule`, calibration to level units, AUROC), :func:`corpus_signature`,
  :func:`decompose` (a behaviour direction on the trait directions, bootstrap intervals), :func:`steer_levels` and
  :func:`level_sweep` (steering in level units, with the KL cost).
- Cue-induced biases (LODO): :func:`load_bias_items` / :func:`make_items` (our prompt sets: five cues on two
  sources), :func:`bias_directions` (probe AUROC by layer beside a bag-of-tokens baseline and a shuffled control,
  LODO transfer), :func:`bias_causal_test` (subtract the direction: recovery of the uncued answer vs random
  directions), :func:`bias_overlap`, :func:`compare_checkpoints`.
- Values and parties: :func:`value_study` (value vector, layers by held-out separation x causal effect, selective
  steering vs same-norm random vectors on a forced-choice set), :func:`partisan_direction`,
  :func:`cross_lingual_transfer`.
- Representational similarity: :func:`category_rsa` / :func:`rsa` (Mantel permutation test, noise ceiling),
  :func:`typicality`, :func:`cross_language_similarity` (each language centred); the math is
  :mod:`probes.similarity`.
"""

from __future__ import annotations

from interp.studies.directions.biases import BiasConfig, BiasFamily, bias_directions
from interp.studies.directions.biases_causal import BiasCausal, answer_table, bias_causal_test, flip_counts
from interp.studies.directions.biases_compare import CheckpointComparison, compare_checkpoints
from interp.studies.directions.biases_items import BIASES, BiasItem, load_bias_items, make_items
from interp.studies.directions.biases_overlap import BiasOverlap, bias_overlap
from interp.studies.directions.similarity import RSAResult, SimilarityConfig, category_rsa, rsa
from interp.studies.directions.similarity_data import (
           category_matrix,
           load_categories,
           load_parallel,
           random_init,
)
from interp.studies.directions.similarity_language import CrossLanguageSimilarity, cross_language_similarity
from interp.studies.directions.similarity_typicality import TypicalityResult, typicality
from interp.studies.directions.traits import TraitConfig, TraitScale, TraitScales, trait_scales
from interp.studies.directions.traits_analysis import capture_contrast, corpus_signature
from interp.studies.directions.traits_band import BandRule
from interp.studies.directions.traits_data import LEVEL_PROMPTS, SYCOPHANCY_PROMPTS, TRAITS, sycophancy_items
from interp.studies.directions.traits_decompose import Decomposition, decompose
from interp.studies.directions.traits_steer import TraitSteering, level_sweep, steer_levels
from interp.studies.directions.values_data import load_dilemmas, load_statements
from interp.studies.directions.values_study import (
           CrossLingual,
           ValueStudy,
           ValueStudyConfig,
           cross_lingual_transfer,
           partisan_direction,
           value_study,
)

__all__ = ["BIASES", "BandRule", "BiasCausal", "BiasConfig", "BiasFamily", "BiasItem", "BiasOverlap", "CheckpointComparison",
           "CrossLanguageSimilarity", "CrossLingual", "Decomposition", "LEVEL_PROMPTS", "RSAResult", "SYCOPHANCY_PROMPTS",
           "SimilarityConfig", "TRAITS", "TraitConfig", "TraitScale", "TraitScales", "TraitSteering", "TypicalityResult", "ValueStudy", "ValueStudyConfig",
           "answer_table",
           "bias_causal_test", "bias_directions", "bias_overlap", "capture_contrast", "category_matrix", "category_rsa",
           "compare_checkpoints", "corpus_signature", "cross_language_similarity", "cross_lingual_transfer",
           "decompose", "flip_counts", "level_sweep", "load_bias_items", "load_categories", "load_dilemmas",
           "load_parallel", "load_statements", "make_items", "partisan_direction", "random_init", "rsa",
           "steer_levels", "sycophancy_items", "trait_scales", "typicality", "value_study"]
