"""Studies through fine-tuning: where a fine-tune's behaviour lives (block transplants between an aligned model
and its base) and what it changed (SAE model diffing), on any HF model and its fine-tune.

``pipelines.finetune.transplant.transplant_study``; ``pipelines.finetune.diffing.diff_study``; attribution-guided loss masking
(``pipelines.finetune.masking.masking_study``) and alignment elasticity (``pipelines.finetune.elasticity.elasticity_study``).
"""

from __future__ import annotations

from pipelines.finetune.elasticity import elasticity_study
from pipelines.finetune.masking import masking_study
from pipelines.finetune.transplant import TransplantStudy, transplant_study

__all__ = ["TransplantStudy", "elasticity_study", "masking_study", "transplant_study"]

