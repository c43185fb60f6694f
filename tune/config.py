"""What decides a fine-tune: the method (LoRA or full), which layers and modules, optimisation and seed; and the
model made trainable by it (peft LoRA, or the chosen blocks' own weights)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from interp.models import Model, peft_wrapped

METHODS = ("lora", "full")
SCHEDULES = ("linear", "constant")


@dataclass(frozen=True)
class TuneConfig:
    """A fine-tune. ``method``: ``"lora"`` (peft adapters of ``rank`` / ``alpha`` on ``targets``, the module names
    peft matches, e.g. ``("q_proj", "v_proj")``) or ``"full"`` (every weight of the chosen blocks). ``layers``: the
    blocks trained (``None``: all; embeddings and final norm stay frozen in a full fine-tune). AdamW at ``lr``
    with ``warmup`` steps of linear warm-up, then a linear decay to 0 at ``steps`` (``schedule="linear"``) or a
    constant rate. Batches of ``batch_size`` pairs in a seeded shuffled order, reshuffled when used up.
    ``checkpoint_steps``: after which steps (1-based counts of steps done) a resumable checkpoint is written."""

    method: str = "lora"
    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] | None = ("q_proj", "k_proj", "v_proj", "o_proj")
    layers: tuple[int, ...] | None = None
    steps: int = 100
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 4
    weight_decay: float = 0.0
    schedule: str = "linear"
    max_grad_norm: float | None = None
    seed: int = 0
    checkpoint_steps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("steps", "batch_size", "warmup", "rank"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        bad = [s for s in self.checkpoint_steps if not 1 <= s <= self.steps]
        if bad:
            raise ValueError(f"checkpoint_steps {bad} are outside 1..{self.steps} (steps done when it is written)")
        if self.method == "lora" and self.targets is not None and not self.targets:
            raise ValueError("targets is empty; name the modules LoRA adapts (e.g. ('q_proj', 'v_proj')) or None")

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based)."""
        warm = min(1.0, (step + 1) / self.warmup)
        return self.lr * (warm * max(0.0, 1 - step / self.steps) if self.schedule == "linear" else warm)

    def record(self) -> dict[str, Any]:
        """The fields that decide the weights (what a resumed run must share); checkpoint steps do not."""
        out = asdict(self)
        out.pop("checkpoint_steps")
        return out


def _check_layers(model: Model, layers: tuple[int, ...] | None) -> None:
    if layers is None:
        return
    bad = [i for i in layers if not 0 <= i < model.n_layers]
    if bad or not layers:
        raise ValueError(f"layers {list(layers)} must be non-empty and within 0..{model.n_layers - 1}")


def make_trainable(model: Model, config: TuneConfig) -> Model:
    """``model`` ready to train under ``config``: LoRA wraps ``model.hf`` in a ``PeftModel`` (seeded adapters;
    peft injects them into the base modules in place, and ``disable_adapter()`` gives the base back) and returns
    it as a :class:`Model`; a full fine-tune returns ``model`` itself with only the chosen blocks trainable."""
    _check_layers(model, config.layers)
    for p in model.hf.parameters():
        p.requires_grad_(False)
    if config.method == "full":
        keep = range(model.n_layers) if config.layers is None else config.layers
        for i in keep:
            for p in model.block(i).parameters():
                p.requires_grad_(True)
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError("LoRA fine-tuning needs peft: `pip install --no-deps peft`") from e
    if type(model.hf).__name__.startswith("Peft"):
        raise ValueError("this model already carries a peft adapter; fine-tune its base (load_model(base name)) "
                         "or merge the adapter first (interp.models.with_adapter(..., merge=True))")
    torch.manual_seed(config.seed)
    cfg = LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=0.0,
                     target_modules=list(config.targets) if config.targets is not None else None,
                     layers_to_transform=list(config.layers) if config.layers is not None else None,
                     bias="none", task_type="CAUSAL_LM")
    try:
        wrapped = get_peft_model(model.hf, cfg)
    except ValueError as e:
        raise ValueError(f"peft could not place LoRA on targets {config.targets} of this {type(model.hf).__name__}: "
                         f"{e}; name modules this architecture has (its Linear layers' names)") from e
    return peft_wrapped(model, wrapped, f"{model.name}+lora")


def trainable_parameters(model: Model) -> dict[str, torch.nn.Parameter]:
    """The parameters that train, by name (the ones a checkpoint saves)."""
    return {n: p for n, p in model.hf.named_parameters() if p.requires_grad}


__all__ = ["TuneConfig", "make_trainable", "trainable_parameters"]
