"""JumpReLU SAE (Rajamanoharan et al. 2024): ``pre * (pre > threshold)`` with a learned per-latent threshold,
trained by straight-through estimators with an L0 penalty (sae-lens ``jumprelu``, ``step`` mode; with a target L0,
our batch-level form ``target * (mean L0 / target - 1)^2``), thresholds started at a quantile of the data and
kept positive, and Anthropic's pre-activation loss pulling dead latents up to their jump."""

from __future__ import annotations

from typing import Any

import torch

from sae.kinds.base import Kind, KindOut, fired_and_l0, train_pre
from sae.kinds.ste import JumpReLUSTE, StepSTE


class JumpReLUKind(Kind):
    """Inference ``relu(pre) * (pre > threshold)``; the threshold is a trained parameter."""

    name = "jumprelu"
    extra = (("threshold", True),)
    scaled = ("threshold",)
    sparsity_coef = "l0_coefficient"
    transcoder = True
    saelens = "jumprelu"
    saelens_reads = ("jumprelu",)
    saelens_transcoder = ("jumprelu_transcoder", "jumprelu_skip_transcoder")
    circuit_tracer = "jumprelu"

    def activate(self, sae: Any, pre: torch.Tensor) -> torch.Tensor:
        return torch.relu(pre) * (pre > sae.threshold).to(pre.dtype)

    def target_l0(self, train_cfg: Any) -> float | None:
        return train_cfg.target_l0 or train_cfg.k

    def l0_penalty(self, l0_per: torch.Tensor, target: float | None) -> torch.Tensor:
        """The sparsity penalty from each row's (straight-through) L0 ``[B]``."""
        if target:
            return (l0_per.mean() / target - 1.0).pow(2) * target
        return l0_per.mean()

    def train_forward(self, sae: Any, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor,
                      coeffs: dict[str, float], opts: dict[str, Any]) -> KindOut:
        pre = train_pre(sae, x)
        thr, bw = sae.threshold, opts["bandwidth"]
        z = JumpReLUSTE.apply(pre, thr, bw)
        sparsity = self.l0_penalty(StepSTE.apply(pre, thr, bw).sum(-1), opts.get("target_l0"))
        terms = {"sparsity": coeffs["sparsity"] * sparsity}
        if coeffs.get("preact", 0) > 0 and bool(dead.any()):
            # dead latents: pull pre-activations up to (and thresholds down to) the jump (Anthropic 2025)
            terms["preact"] = coeffs["preact"] * (torch.relu(thr - pre) * dead).sum(-1).mean()
        fired, l0 = fired_and_l0(z)
        return KindOut(x_hat=z @ sae.W_dec + sae.b_dec, pre=pre.detach().clone(), fired=fired, l0=l0, terms=terms,
                       sparsity=sparsity.detach(), latents=z)

    @torch.no_grad()
    def init_from_data(self, sae: Any, xs: torch.Tensor, opts: dict[str, Any]) -> None:
        """Start near the target L0: each latent's threshold at the matching quantile of its pre-activations."""
        target = opts.get("target_l0") or max(1, sae.d_sae // 32)
        q = 1.0 - min(0.999, target / sae.d_sae)
        pre = sae.pre_acts(xs[: 1 << 13])
        sae.threshold.copy_(pre.quantile(q, dim=0).clamp_min(1e-3))

    @torch.no_grad()
    def after_step(self, trainer: Any, out: Any) -> None:
        trainer.sae.threshold.clamp_(min=1e-6)
