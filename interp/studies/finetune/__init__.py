"""Studies through fine-tuning: where a fine-tune's behaviour lives (block transplants between an aligned model
and its base), what it changed (SAE model diffing), which training tokens carry it (attribution-guided loss
masking), how elastic it is (further fine-tuning), and how post-training methods differ, on any HF model and its
fine-tune.

``interp.studies.finetune.transplant.transplant_study``; ``interp.studies.finetune.diffing.diff_study``;
``interp.studies.finetune.masking.masking_study``; ``interp.studies.finetune.elasticity.elasticity_study``;
``interp.studies.finetune.methods.compare_methods``.
"""

from __future__ import annotations

from interp.studies.finetune.diffing import DiffConfig, diff_study
from interp.studies.finetune.elasticity import ElasticityConfig, elasticity_study
from interp.studies.finetune.masking import MaskingConfig, masking_study
from interp.studies.finetune.methods import MethodsConfig, compare_methods
from interp.studies.finetune.transplant import TransplantConfig, TransplantStudy, transplant_study

__all__ = ["DiffConfig", "ElasticityConfig", "MaskingConfig", "MethodsConfig", "TransplantConfig", "TransplantStudy",
           "compare_methods", "diff_study", "elasticity_study", "masking_study", "transplant_study"]
