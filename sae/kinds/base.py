"""What an SAE kind declares: its parameters, its encoder, its training terms and hooks, and its names in sae-lens and
circuit-tracer. The built-in kinds subclass :class:`Kind`; a user's kind does too and is registered with
:func:`sae.kinds.register_kind`. Kinds never import :mod:`sae.model`: they are handed the SAE."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from sae.model import SAE, SAEConfig


@dataclass
class KindOut:
    """One training forward pass of a kind. ``x_hat [B, d]`` is the reconstruction (a transcoder's skip is added by
    the caller); ``terms`` the kind's loss terms, already weighted, added to the MSE; ``pre`` the encoder
    pre-activations without gradient (AuxK reads and overwrites them), ``fired [d_sae]`` the latents active in the
    batch, ``l0`` their mean count per row; ``sparsity`` the unweighted penalty (for logs); ``stats`` what the
    kind's :meth:`Kind.after_step` reads (e.g. BatchTopK's smallest active value); ``latents [B, d_sae]`` the
    activations with their gradient, where the kind made them dense (a cross-layer transcoder's later layers read
    them; TopK makes them only when ``opts["latents"]`` is set and the sparse kernels are off)."""

    x_hat: torch.Tensor
    pre: torch.Tensor
    fired: torch.Tensor
    l0: float
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    sparsity: torch.Tensor | None = None
    sparse: bool = False
    stats: dict[str, Any] = field(default_factory=dict)
    latents: torch.Tensor | None = None


def enc_shift(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """What the encoder subtracts from its input: ``b_dec``, or zeros where it reads ``x`` itself."""
    return sae.b_dec if sae.cfg.apply_b_dec_to_input else x.new_zeros(x.shape[-1])


def train_pre(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """Encoder pre-activations of a training batch ``[B, d_in] -> [B, d_sae]`` (no width check, no cast)."""
    return (x - enc_shift(sae, x)) @ sae.W_enc + sae.b_enc


def fired_and_l0(z: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Latents active anywhere in the batch ``[d_sae]`` and the mean count of active latents per row."""
    with torch.no_grad():
        on = z > 0
        return on.any(0), float(on.sum()) / z.shape[0]


class Kind:
    """An SAE kind. Class attributes declare it; methods take the SAE (``sae.cfg``, its parameters) as first argument.

    - ``name``: the ``arch`` string saved in configs; ``needs_k``: ``k`` is its active count (TopK-like).
    - ``extra``: its parameters beyond ``W_enc, b_enc, W_dec, b_dec``, each ``(name, trainable)`` of shape
      ``[d_sae]`` starting at zero (override :meth:`make_params` for others).
    - ``scaled``: per-latent parameters in the units of the pre-activations (rescaled with the input scale and the
      decoder norms, like ``b_enc``).
    - ``k_sparse``: trains through the sparse encode/decode kernels (only the selected latents are computed).
    - ``aux_k``: takes the dead-latent AuxK loss; ``sparsity_coef``: the ``TrainConfig`` field weighting its penalty.
    - ``saelens``: the sae-lens inference architecture it saves as; ``saelens_reads``: sae-lens architectures read
      back as this kind when the file names no kind of ours; ``saelens_names``: our parameter -> sae-lens tensor name
      where they differ; ``saelens_transcoder``: sae-lens's transcoder architectures (without, with a skip);
      ``circuit_tracer``: circuit-tracer's ``activation`` name (``None``: not a transcoder activation there).
    """

    name: ClassVar[str] = ""
    needs_k: ClassVar[bool] = False
    extra: ClassVar[tuple[tuple[str, bool], ...]] = ()
    scaled: ClassVar[tuple[str, ...]] = ()
    k_sparse: ClassVar[bool] = False
    aux_k: ClassVar[bool] = True
    sparsity_coef: ClassVar[str | None] = None
    transcoder: ClassVar[bool] = False
    saelens: ClassVar[str | None] = None
    saelens_reads: ClassVar[tuple[str, ...]] = ()
    saelens_names: ClassVar[dict[str, str]] = {}
    saelens_transcoder: ClassVar[tuple[str, str] | None] = None
    circuit_tracer: ClassVar[str | None] = None
    crosscoder: ClassVar[bool] = False

    # --- shape ----------------------------------------------------------------------------------
    def check(self, cfg: SAEConfig) -> None:
        """Refuse a config this kind cannot build (default: ``k`` checked when ``needs_k``)."""
        if self.needs_k:
            if cfg.k is None:
                raise ValueError(f"arch {self.name!r} needs k (the number of active latents), e.g. k=32")
            if not 1 <= cfg.k <= cfg.d_sae:
                raise ValueError(f"k={cfg.k} must be between 1 and the latent count d_sae={cfg.d_sae}; "
                                 f"lower k or widen the SAE")

    def make_params(self, sae: SAE) -> None:
        """Add the kind's own parameters / buffers to a new SAE (``threshold`` is ``None`` unless one is made)."""
        for name, trainable in self.extra:
            t = torch.zeros(sae.cfg.d_sae, dtype=sae.cfg.torch_dtype)
            if trainable:
                setattr(sae, name, nn.Parameter(t))
            else:
                sae.register_buffer(name, t)

    # --- inference ------------------------------------------------------------------------------
    def activate(self, sae: SAE, pre: torch.Tensor) -> torch.Tensor:
        """Latents from pre-activations ``[..., d_sae] -> [..., d_sae]`` (inference)."""
        raise NotImplementedError(f"kind {self.name!r} defines no activate()")

    def encode(self, sae: SAE, x: torch.Tensor) -> torch.Tensor:
        """Latents of inputs ``[..., d_in] -> [..., d_sae]``; default ``activate(pre_acts(x))``."""
        return self.activate(sae, sae.pre_acts(x))

    def decode(self, sae: SAE, z: torch.Tensor) -> torch.Tensor:
        """Reconstruction ``z @ W_dec + b_dec``: ``[..., d_sae] -> [..., d_in]``."""
        return z @ sae.W_dec + sae.b_dec

    # --- training -------------------------------------------------------------------------------
    def target_l0(self, train_cfg: Any) -> float | None:
        """The L0 its penalty aims at (``None``: no target)."""
        return None

    def train_forward(self, sae: SAE, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor,
                      coeffs: dict[str, float], opts: dict[str, Any]) -> KindOut:
        """One training forward of a batch ``x [B, d_in]`` (normalised) towards ``y [B, d]``. Default: dense
        :meth:`encode` and :meth:`decode`, no penalty (a kind trained by its reconstruction alone)."""
        pre = sae.pre_acts(x)
        z = self.activate(sae, pre)
        fired, l0 = fired_and_l0(z)
        return KindOut(x_hat=self.decode(sae, z), pre=pre.detach().clone(), fired=fired, l0=l0)

    @torch.no_grad()
    def init_from_data(self, sae: SAE, xs: torch.Tensor, opts: dict[str, Any]) -> None:
        """Initialise from the first (normalised) inputs ``xs [n, d_in]`` of a fresh run (default: nothing)."""

    @torch.no_grad()
    def after_step(self, trainer: Any, out: Any) -> None:
        """After each optimiser step (decoder rows already renormalised): thresholds, clamps (default: nothing)."""

    # --- formats --------------------------------------------------------------------------------
    def saelens_config(self, sae: SAE) -> dict[str, Any]:
        """Entries of sae-lens's ``cfg.json`` this kind adds (``k`` for TopK)."""
        return {}

    def from_saelens(self, cfg: dict[str, Any], md: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
        """``(k, options)`` of a sae-lens config read as this kind (``md``: its ``metadata``)."""
        k = md.get("interp_k") if md.get("interp_k") is not None else cfg.get("k")
        return (int(round(float(k))) if self.needs_k and k is not None else None), dict(md.get("interp_options") or {})

    def __repr__(self) -> str:
        return f"<SAE kind {self.name!r} ({type(self).__module__}.{type(self).__name__})>"
