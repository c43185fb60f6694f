"""Studies through fine-tuning: where a fine-tune's behaviour lives (block transplants between an aligned model
and its base), what it changed (SAE model diffing), which training tokens carry it (attribution-guided loss
masking), how elastic it is (further fine-tuning), and how post-training methods differ, on any HF model and its
fine-tune.

``pipelines.finetune.transplant.transplant_study``; ``pipelines.finetune.diffing.diff_study``;
``pipelines.finetune.masking.masking_study``; ``pipelines.finetune.elasticity.elasticity_study``;
``pipelines.finetune.methods.compare_methods``.
"""

from __future__ import annotations

from pipelines.finetune.elasticity import elasticity_study
from pipelines.finetune.masking import masking_study
from pipelines.finetune.methods import compare_methods
from pipelines.finetune.transplant import TransplantStudy, transplant_study

__all__ = ["TransplantStudy", "compare_methods", "elasticity_study", "masking_study", "transplant_study"]
