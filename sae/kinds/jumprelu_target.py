"""JumpReLU trained towards a target L0 with sae-lens's quadratic penalty (its ``jumprelu`` with
``jumprelu_sparsity_loss_mode="quadratic"``, Gemma Scope 2): ``mean_rows(2 / target * (L0_row - target)^2)``, the
L0 coefficient warmed up linearly from zero as sae-lens's ``CoefficientScheduler`` does (over
``sparsity_warmup_frac * n_steps`` steps). Saved as a sae-lens ``jumprelu``."""

from __future__ import annotations

from typing import Any

import torch

from sae.kinds.jumprelu import JumpReLUKind


class JumpReLUTargetKind(JumpReLUKind):
    """A JumpReLU whose per-row L0 is pulled to ``target_l0`` (default ``k``) by a quadratic penalty."""

    name = "jumprelu_target_l0"
    saelens_reads = ()
    saelens_transcoder = None
    circuit_tracer = None
    transcoder = False

    def l0_penalty(self, l0_per: torch.Tensor, target: float | None) -> torch.Tensor:
        if not target or target <= 0:
            raise ValueError("arch 'jumprelu_target_l0' needs a positive target L0: TrainConfig(target_l0=...) or k")
        return (2.0 / target * (l0_per - target).pow(2)).mean()

    def target_l0(self, train_cfg: Any) -> float | None:
        return train_cfg.target_l0 or train_cfg.k
