"""The sparse autoencoder: one module for every kind (ReLU, TopK, BatchTopK, JumpReLU, gated, Matryoshka, ...);
what differs between kinds lives in :mod:`sae.kinds`, looked up by ``cfg.arch``.

Layout follows the common convention (and sae-lens): ``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``,
``W_dec [d_sae, d_in]`` (one row per latent, unit norm while training), ``b_dec [d_in]``, plus the kind's own
parameters (``threshold [d_sae]`` for JumpReLU and BatchTopK, ...). The encoder reads ``x - b_dec``.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from jaxtyping import Float

from interp.bundle import Provenance, read_object, register_kind, save_object
from interp.sites import parse_site
from sae.kinds import Kind, get_kind


@dataclass
class SAEConfig:
    """Shape and kind of an SAE. ``k`` is the number of active latents (per token for TopK, on average
    over a batch for BatchTopK); ``site`` and ``model_id`` say where the SAE reads its input.
    ``arch`` names a registered kind (:mod:`sae.kinds`); ``options`` holds its own settings (e.g. Matryoshka's
    ``widths``). ``apply_b_dec_to_input=False`` (some loaded sae-lens SAEs) makes the encoder read ``x``."""

    d_in: int
    d_sae: int
    arch: str = "topk"
    k: int | None = None
    site: str | None = None
    model_id: str = ""
    dtype: str = "float32"
    apply_b_dec_to_input: bool = True
    meta: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.d_in < 1 or self.d_sae < 1:
            raise ValueError(f"d_in and d_sae must be positive, got d_in={self.d_in}, d_sae={self.d_sae}")
        self.options = dict(self.options or {})
        self.kind.check(self)
        if self.site is not None:
            try:
                self.site = parse_site(self.site).name
            except ValueError:
                pass  # a hook name we cannot splice (kept as given); splicing will say so

    @property
    def kind(self) -> Kind:
        """The registered kind ``arch`` names."""
        return get_kind(self.arch)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SAEConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class SAE(nn.Module):
    """A sparse autoencoder. ``encode``: ``[..., d_in] -> [..., d_sae]``; ``decode`` the reverse."""

    def __init__(self, cfg: SAEConfig, seed: int | None = 0):
        super().__init__()
        self.cfg = cfg
        dt = cfg.torch_dtype
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        w_dec = torch.randn(cfg.d_sae, cfg.d_in, generator=gen, dtype=torch.float64)
        w_dec = (w_dec / w_dec.norm(dim=1, keepdim=True)).to(dt)
        self.W_dec = nn.Parameter(w_dec)
        self.W_enc = nn.Parameter(w_dec.T.clone().contiguous())
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dt))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in, dtype=dt))
        self.kind = cfg.kind  # looked up once: the hot paths ask this object
        self.kind.make_params(self)
        if "threshold" not in self._parameters and "threshold" not in self._buffers:
            self.threshold: torch.Tensor | None = None

    # --- properties ---------------------------------------------------------------------------
    @property
    def d_in(self) -> int:
        return self.cfg.d_in

    @property
    def d_sae(self) -> int:
        return self.cfg.d_sae

    @property
    def arch(self) -> str:
        return self.cfg.arch

    @property
    def site(self) -> str | None:
        return self.cfg.site

    @property
    def device(self) -> torch.device:
        return self.W_dec.device

    @property
    def dtype(self) -> torch.dtype:
        return self.W_dec.dtype

    # --- forward ------------------------------------------------------------------------------
    def _check_width(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.d_in:
            where = f" (trained at {self.site})" if self.site else ""
            raise ValueError(f"SAE expects inputs of width d_in={self.d_in}{where}, got width {x.shape[-1]} "
                             f"(shape {tuple(x.shape)}); use an SAE trained for this model and site")

    def pre_acts(self, x: Float[torch.Tensor, "... d_in"]) -> Float[torch.Tensor, "... d_sae"]:
        """Encoder pre-activations ``(x - b_dec) @ W_enc + b_enc``: ``[..., d_in] -> [..., d_sae]``."""
        self._check_width(x)
        x = x.to(self.dtype)
        if self.cfg.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def activate(self, pre: Float[torch.Tensor, "... d_sae"]) -> Float[torch.Tensor, "... d_sae"]:
        """Inference nonlinearity of the kind (BatchTopK: its learned threshold, a JumpReLU, as in sae-lens)."""
        return self.kind.activate(self, pre)

    def encode(self, x: Float[torch.Tensor, "... d_in"]) -> Float[torch.Tensor, "... d_sae"]:
        """Latent activations of ``x``: ``[..., d_in] -> [..., d_sae]``."""
        return self.kind.encode(self, x)

    def decode(self, z: Float[torch.Tensor, "... d_sae"]) -> Float[torch.Tensor, "... d_in"]:
        """Reconstruction ``z @ W_dec + b_dec`` (or the kind's own decoder)."""
        if z.shape[-1] != self.d_sae:
            raise ValueError(f"decode expects {self.d_sae} latents, got shape {tuple(z.shape)}")
        return self.kind.decode(self, z.to(self.dtype))

    def forward(self, x: Float[torch.Tensor, "... d_in"]) -> Float[torch.Tensor, "... d_in"]:
        """Reconstruction of ``x``."""
        return self.decode(self.encode(x))

    # --- weight surgery -----------------------------------------------------------------------
    @torch.no_grad()
    def normalize_decoder_(self) -> None:
        """Rescale decoder rows to unit norm, folding the norms into the encoder (same outputs for ReLU and
        JumpReLU; for TopK the per-latent scale changes which latents win, so call it only while training)."""
        norms = self.W_dec.norm(dim=1).clamp_min(1e-12)
        self.W_dec.div_(norms[:, None])
        self.W_enc.mul_(norms[None, :])
        self.b_enc.mul_(norms)
        for name in self.kind.scaled:
            getattr(self, name).mul_(norms)

    @torch.no_grad()
    def fold_input_scale_(self, scale: float) -> None:
        """Turn an SAE trained on ``x * scale`` into one that reads raw ``x``, keeping unit-norm decoder rows.

        Pre-activations and latents become ``1/scale`` of the trained ones (same pattern, raw units)."""
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"input scale must be a positive finite number, got {scale}")
        self.b_enc.div_(scale)
        self.b_dec.div_(scale)
        for name in self.kind.scaled:
            getattr(self, name).div_(scale)

    # --- persistence (our own format: a bundle folder) ----------------------------------------
    @property
    def provenance(self) -> Provenance:
        """Where the SAE reads (site, model) and how it was made (``cfg.meta`` may hold ``data_hash`` etc.)."""
        m = dict(self.cfg.meta)
        return Provenance(method=f"sae.{self.arch}", sites=[self.site] if self.site else [], model_id=self.cfg.model_id,
                          data_hash=str(m.get("data_hash", "")), fitted_on=list(m.get("fitted_on", [])),
                          meta=m)

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Save as ``PATH/tensors.safetensors`` + ``PATH/meta.json`` (atomic; refuses to overwrite)."""
        tensors = {k: v for k, v in self.state_dict().items()}
        return save_object(path, "sae.SAE", tensors, self.provenance, {"cfg": self.cfg.to_dict()},
                           overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device | None = None) -> SAE:
        """Load an SAE saved by :meth:`save` (a sae-lens folder loads with ``sae.load_saelens``)."""
        p = Path(path)
        if (p / "cfg.json").exists() and not (p / "meta.json").exists():
            raise ValueError(f"{p} holds a sae-lens SAE (cfg.json); load it with sae.load_saelens(path)")
        b = read_object(p, "sae.SAE")
        sae = cls(SAEConfig.from_dict(b.fields["cfg"]), seed=None)
        sae.load_state_dict(b.tensors)
        return sae.to(device) if device is not None else sae

    def extra_repr(self) -> str:
        k = f", k={self.cfg.k}" if self.cfg.k is not None else ""
        return f"arch={self.arch}, d_in={self.d_in}, d_sae={self.d_sae}{k}, site={self.site!r}"


register_kind("sae.SAE", SAE.load)
