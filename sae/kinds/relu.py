"""ReLU SAE with an L1 penalty weighted by decoder norms (sae-lens ``standard``)."""

from __future__ import annotations

from typing import Any

import torch

from sae.kinds.base import Kind, KindOut, fired_and_l0, train_pre


class ReluKind(Kind):
    """``relu(pre)``; penalty ``sum_i z_i ||W_dec[i]||`` averaged over rows (Anthropic's; sae-lens ``standard``)."""

    name = "relu"
    sparsity_coef = "l1_coefficient"
    transcoder = True
    saelens = "standard"
    saelens_reads = ("standard",)
    saelens_transcoder = ("transcoder", "skip_transcoder")
    circuit_tracer = "relu"

    def activate(self, sae: Any, pre: torch.Tensor) -> torch.Tensor:
        return torch.relu(pre)

    def penalty_norms(self, sae: Any) -> torch.Tensor:
        """The weight of each latent's activation in the penalty ``[d_sae]``: its decoder row's norm."""
        return sae.W_dec.norm(dim=1)

    def train_forward(self, sae: Any, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor,
                      coeffs: dict[str, float], opts: dict[str, Any]) -> KindOut:
        pre = train_pre(sae, x)
        z = torch.relu(pre)
        sparsity = (z * self.penalty_norms(sae)).sum(-1).mean()
        fired, l0 = fired_and_l0(z)
        return KindOut(x_hat=z @ sae.W_dec + sae.b_dec, pre=pre.detach().clone(), fired=fired, l0=l0,
                       terms={"sparsity": coeffs["sparsity"] * sparsity}, sparsity=sparsity.detach(), latents=z)
