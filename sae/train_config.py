"""Training settings and results for :mod:`sae.trainer` (SAEs and transcoders alike)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interp.bundle import Result
from interp.positions import check_sinks
from sae.kinds import get_kind
from sae.model import SAE

if TYPE_CHECKING:
    import pandas as pd

# fields that may differ between an interrupted run and its resumption
_RUNTIME_FIELDS = {"progress", "checkpoint_every", "log_every", "device"}


@dataclass
class TrainConfig:
    """Hyper-parameters. ``d_sae`` defaults to ``expansion * d_in``; ``lr`` to ``2e-4 / sqrt(d_sae / 2**14)``
    (Gao et al.); ``k`` is the active count (TopK/BatchTopK) and the JumpReLU target L0 unless
    ``target_l0`` is set; ``dead_after_tokens`` defaults to ``max(10 * batch_size, total_tokens // 10)``.
    ``site`` picks the input of a multi-site capture, ``target_site`` the target of a transcoder (paired data).
    ``arch`` names a registered kind (:mod:`sae.kinds`), ``options`` its own settings (Matryoshka's ``widths``)."""

    arch: str = "topk"
    options: dict[str, Any] = field(default_factory=dict)  # the kind's own settings, e.g. {"widths": [...]}
    d_sae: int | None = None
    expansion: int = 8
    k: int | None = 32
    total_tokens: int = 2_000_000
    batch_size: int = 4096
    lr: float | None = None
    lr_end_frac: float = 0.0
    warmup_steps: int = 50
    decay_frac: float = 0.2
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = 1.0
    l1_coefficient: float = 2.0
    l0_coefficient: float = 10.0
    target_l0: float | None = None
    jumprelu_bandwidth: float = 0.1
    preact_coefficient: float = 0.1
    sparsity_warmup_frac: float = 0.05
    aux_coefficient: float = 1 / 32
    k_aux: int | None = None
    dead_after_tokens: int | None = None
    threshold_lr: float = 0.01
    normalize_input: bool = True
    decoder: str = "auto"
    backend: str = "auto"
    seed: int = 0
    buffer_tokens: int = 1 << 18
    site: str | None = None
    target_site: str | None = None
    checkpoint_every: int | None = None
    log_every: int = 10
    progress: bool = True
    device: str | None = None
    sinks: str = "exclude"  # massive-activation tokens (interp.positions.massive) left out of the data, or "keep"

    def __post_init__(self) -> None:
        if self.decoder not in ("auto", "sparse", "dense"):
            raise ValueError(f"decoder must be 'auto', 'sparse' or 'dense', got {self.decoder!r}")
        if self.total_tokens < self.batch_size:
            raise ValueError(f"total_tokens={self.total_tokens} is less than one batch ({self.batch_size})")
        self.betas = tuple(self.betas)
        self.options = dict(self.options or {})
        get_kind(self.arch)  # an unknown kind fails here, naming register_kind
        check_sinks(self.sinks)

    @property
    def n_steps(self) -> int:
        return self.total_tokens // self.batch_size

    def lr_at(self, step: int, base: float) -> float:
        """Linear warm-up, constant, then linear decay to ``lr_end_frac * base`` over the last ``decay_frac``."""
        if step < self.warmup_steps:
            return base * (step + 1) / self.warmup_steps
        decay_start = int(self.n_steps * (1 - self.decay_frac))
        if step >= decay_start and self.decay_frac > 0:
            t = (step - decay_start) / max(1, self.n_steps - decay_start)
            return base * (1 - t * (1 - self.lr_end_frac))
        return base

    def comparable(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in _RUNTIME_FIELDS}


@dataclass
class TrainResult(Result):
    """The trained SAE or transcoder (reads raw activations), its history (lists per logged step) and run facts.
    ``fvu`` in the history is of the target (the input for an SAE)."""

    sae: SAE
    history: dict[str, list[float]]
    input_scale: float
    steps: int
    tokens: int
    out_dir: Path | None = None
    dead_fraction: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    target_scale: float | None = None  # a transcoder's target normalisation (None for an SAE)

    def summary(self) -> dict[str, Any]:
        """Steps, tokens, dead fraction and scales, and the last logged value of each history series."""
        return {"steps": self.steps, "tokens": self.tokens, "dead_fraction": self.dead_fraction,
                "input_scale": self.input_scale, "target_scale": self.target_scale,
                "final": {k: v[-1] for k, v in self.history.items() if v}}

    def to_frame(self) -> pd.DataFrame:
        """One row per logged step: ``step``, ``tokens``, ``loss``, ``mse``, ``aux``, ``l0``, ``fvu``, ``dead``
        (fraction of latents counted dead then) and ``lr``."""
        import pandas as pd

        return pd.DataFrame({k: list(v) for k, v in self.history.items()})

    def plot(self, x: str = "step", title: str = "SAE training") -> Any:
        """Loss, FVU (log scale), L0 and dead fraction against ``step`` (or ``tokens``)."""
        from interp.viz.sae import training_curves

        return training_curves(self.history, keys=("loss", "fvu", "l0", "dead"), x=x, title=title)
