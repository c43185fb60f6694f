"""Gated SAE (Rajamanoharan et al. 2024, sae-lens ``gated``): a gate path ``x W_enc + b_gate`` decides which latents
fire, a magnitude path ``x (W_enc * exp(r_mag)) + b_mag`` sets their values (weights shared up to a per-latent
scale). Trained with an L1 penalty on ``relu(gate)`` weighted by decoder norms and an auxiliary reconstruction of
the input from ``relu(gate)`` through the frozen decoder. Our ``b_enc`` is sae-lens's ``b_gate``."""

from __future__ import annotations

from typing import Any

import torch

from sae.kinds.base import Kind, KindOut, enc_shift, fired_and_l0


class GatedKind(Kind):
    """``z = (gate > 0) * relu(mag)``; ``pre_acts`` are the gate's pre-activations."""

    name = "gated"
    extra = (("r_mag", True), ("b_mag", True))
    scaled = ("b_mag",)
    sparsity_coef = "l1_coefficient"
    aux_k = False
    saelens = "gated"
    saelens_reads = ("gated",)
    saelens_names = {"b_enc": "b_gate"}

    def magnitudes(self, sae: Any, xc: torch.Tensor) -> torch.Tensor:
        """Magnitude path pre-activations of centred inputs ``[..., d_in] -> [..., d_sae]``."""
        return xc @ (sae.W_enc * sae.r_mag.exp()) + sae.b_mag

    def encode(self, sae: Any, x: torch.Tensor) -> torch.Tensor:
        gate = sae.pre_acts(x)
        xc = x.to(sae.dtype) - (sae.b_dec if sae.cfg.apply_b_dec_to_input else 0)
        return (gate > 0).to(gate.dtype) * torch.relu(self.magnitudes(sae, xc))

    def activate(self, sae: Any, pre: torch.Tensor) -> torch.Tensor:
        raise ValueError("a gated SAE's latents need the input (two paths): call sae.encode(x), not activate(pre)")

    def train_forward(self, sae: Any, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor,
                      coeffs: dict[str, float], opts: dict[str, Any]) -> KindOut:
        xc = x - enc_shift(sae, x)
        gate = xc @ sae.W_enc + sae.b_enc
        z = (gate > 0).to(gate.dtype) * torch.relu(self.magnitudes(sae, xc))
        pi = torch.relu(gate)
        sparsity = (pi * sae.W_dec.norm(dim=1)).sum(-1).mean()
        via_gate = pi @ sae.W_dec.detach() + sae.b_dec.detach()  # the frozen decoder: only the gate learns here
        aux = (via_gate - y).pow(2).sum(-1).mean()
        fired, l0 = fired_and_l0(z)
        return KindOut(x_hat=z @ sae.W_dec + sae.b_dec, pre=gate.detach().clone(), fired=fired, l0=l0,
                       terms={"sparsity": coeffs["sparsity"] * sparsity, "gate_reconstruction": aux},
                       sparsity=sparsity.detach())
