"""Studies through fine-tuning: where a fine-tune's behaviour lives (block transplants between an aligned model
and its base) and what it changed (SAE model diffing), on any HF model and its fine-tune.

``pipelines.finetune.transplant.transplant_study``; ``pipelines.finetune.diffing.diff_study``;
``pipelines.finetune.methods.compare_methods`` (post-training methods compared).
"""

from __future__ import annotations

from pipelines.finetune.methods import compare_methods
from pipelines.finetune.transplant import TransplantStudy, transplant_study

__all__ = ["TransplantStudy", "compare_methods", "transplant_study"]
