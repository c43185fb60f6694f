"""The refusal-direction analysis (Arditi et al. 2024) end to end: ``run_refusal(RefusalConfig(...), out)``."""

from pipelines.refusal.run import RefusalConfig, RefusalResult, run_refusal

__all__ = ["RefusalConfig", "RefusalResult", "run_refusal"]
