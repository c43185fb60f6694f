"""BatchTopK SAE (Bussmann et al. 2024): the ``B * k`` largest positive pre-activations of a batch of ``B`` rows
while training; at inference a JumpReLU at a threshold estimated while training (a running average of the smallest
selected value), as sae-lens saves it."""

from __future__ import annotations

from typing import Any

import torch

from sae.kinds.topk import TopKKind
from sae.sparse_decoder import Active


class BatchTopKKind(TopKKind):
    """``k`` active latents on average over a batch; inference ``relu(pre) * (pre > threshold)``."""

    name = "batchtopk"
    extra = (("threshold", False),)  # a running statistic, not trained by gradient
    scaled = ("threshold",)
    transcoder = False
    saelens = "jumprelu"
    saelens_reads = ("batchtopk",)
    circuit_tracer = None

    def activate(self, sae: Any, pre: torch.Tensor) -> torch.Tensor:
        return torch.relu(pre) * (pre > sae.threshold).to(pre.dtype)

    def select(self, sae: Any, pre: torch.Tensor) -> tuple[Active, torch.Tensor]:
        B = pre.shape[0]
        flat = torch.relu(pre).reshape(-1)
        top = flat.topk(min(B * sae.cfg.k, flat.numel()), sorted=False)
        keep = top.indices[top.values > 0]
        act = Active.from_flat(keep, B, sae.d_sae)
        return act, pre.reshape(-1)[act.rows * sae.d_sae + act.cols]

    def stats(self, v: torch.Tensor, on: torch.Tensor) -> dict[str, Any]:
        with torch.no_grad():
            return {"min_active": float(v[on].min()) if bool(on.any()) else None}

    @torch.no_grad()
    def after_step(self, trainer: Any, out: Any) -> None:
        """The inference threshold: an exponential moving average (rate ``threshold_lr``) of the smallest selected
        value over all ranks (the first step sets it)."""
        m = trainer._global_min(out.stats.get("min_active"))
        if m is not None:
            a = trainer.cfg.threshold_lr if trainer.step > 0 else 1.0
            trainer.sae.threshold.mul_(1 - a).add_(a * m)

    def saelens_config(self, sae: Any) -> dict[str, Any]:
        return {}
