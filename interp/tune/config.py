"""What decides a fine-tune: the method (LoRA or full), which layers and modules, optimisation and seed; and the
model made trainable by it (peft LoRA, or the chosen blocks' own weights)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from interp.models import Model, peft_wrapped
from interp.sites import resolve_layers

METHODS = ("lora", "full", "neurons")
PARTS = ("attn", "mlp")
SCHEDULES = ("linear", "constant")


@dataclass(frozen=True)
class TuneConfig:
    """A fine-tune. ``method``: ``"lora"`` (peft adapters of ``rank`` / ``alpha`` on ``targets``, the module names
    peft matches, e.g. ``("q_proj", "v_proj")``) or ``"full"`` (every weight of the chosen blocks). ``layers``: the
    blocks trained (``None``: all; embeddings and final norm stay frozen in a full fine-tune). AdamW at ``lr``
    with ``warmup`` steps of linear warm-up, then a linear decay to 0 at ``steps`` (``schedule="linear"``) or a
    constant rate. Batches of ``batch_size`` pairs in a seeded shuffled order, reshuffled when used up.
    ``checkpoint_steps``: after which steps (1-based counts of steps done) a resumable checkpoint is written.
    ``method="neurons"`` trains only the weights of the MLP neurons ``neurons`` (``(layer, index)`` pairs of site
    ``mlp_post``): their rows of every projection into the MLP (and those rows' biases) and their columns of the
    down projection; every other entry gets a zero gradient and stays bit for bit as it was (weight decay must be 0).
    A LoRA restricted to chosen components names their modules in ``targets`` (:func:`component_targets`)."""

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
    neurons: tuple[tuple[int, int], ...] | None = None

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
        if (self.method == "neurons") != (self.neurons is not None):
            raise ValueError("neurons are given with method='neurons' and only then: TuneConfig(method='neurons', "
                             "neurons=((layer, index), ...))")
        if self.method == "neurons":
            if not self.neurons or any(len(n) != 2 for n in self.neurons):
                raise ValueError(f"neurons must be a non-empty tuple of (layer, index) pairs, got {self.neurons!r}")
            if self.weight_decay:
                raise ValueError("a neuron-restricted fine-tune needs weight_decay=0 (decay would move the frozen "
                                 "entries of the weights it trains)")
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
    if not layers:
        raise ValueError("layers must be non-empty (or None: every layer)")
    if any(i < 0 for i in layers):
        raise ValueError(f"layers {list(layers)} must be within 0..{model.n_layers - 1}")
    try:
        resolve_layers(list(layers), model.n_layers, what="fine-tune layers")
    except ValueError as e:
        raise ValueError(f"{e}; layers must be within 0..{model.n_layers - 1}") from None


def component_targets(model: Model, components: list[tuple[int, str]] | tuple[tuple[int, str], ...]
                      ) -> tuple[str, ...]:
    """The full module names (as peft matches them) of every ``Linear`` inside the chosen components, ``(layer,
    part)`` with part ``"attn"`` (the attention block: q/k/v/o) or ``"mlp"`` (the MLP block): the ``targets`` of
    a LoRA on those components only."""
    names = {id(m): n for n, m in model.hf.named_modules()}
    out: list[str] = []
    for item in components:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and item[1] in PARTS):
            raise ValueError(f"components are (layer, part) pairs with part in {PARTS}, got {item!r}")
        layer = int(item[0])
        _check_layers(model, (layer,))
        root = model.module(model.spec.attn if item[1] == "attn" else model.spec.mlp, layer)
        found = [names[id(m)] for m in root.modules() if isinstance(m, torch.nn.Linear)]
        if not found:
            raise ValueError(f"no Linear module inside {item[1]} of layer {layer} ({type(root).__name__}); a LoRA "
                             f"cannot be placed there")
        out += [n for n in found if n not in out]
    return tuple(out)


def neuron_weights(model: Model, layer: int) -> list[tuple[torch.nn.Parameter, int]]:
    """The parameters holding layer ``layer``'s MLP neurons and the dimension that indexes the neuron in each: rows
    of every projection into the MLP (weights whose output width is ``d_mlp``) and of their biases, columns of the
    down projection (GPT-2's ``Conv1D`` stores weights transposed)."""
    spec = model.spec
    if spec.mlp_proj is None:
        raise ValueError(f"{spec.family} has mixture-of-experts MLPs; neurons live inside each expert, so a "
                         f"neuron-restricted fine-tune does not apply")
    down, D = model.module(spec.mlp_proj, layer), int(model.d_mlp)
    out_dim = 1 if spec.conv1d else 0       # the output axis of an in-projection's weight
    found: list[tuple[torch.nn.Parameter, int]] = [(down.weight, 1 - out_dim)]
    for m in model.module(spec.mlp, layer).modules():
        w = getattr(m, "weight", None)
        if m is down or not isinstance(w, torch.nn.Parameter) or w.dim() != 2 or w.shape[out_dim] != D:
            continue
        found.append((w, out_dim))
        b = getattr(m, "bias", None)
        if isinstance(b, torch.nn.Parameter):
            found.append((b, 0))
    if len(found) < 2:
        raise ValueError(f"found no projection into the MLP of layer {layer} with output width {D}")
    return found


def grad_masks(model: Model, config: TuneConfig) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """For a neuron-restricted fine-tune, each trained parameter and the 0/1 mask its gradient is multiplied by
    (1 on the chosen neurons' rows or columns); empty otherwise."""
    if config.method != "neurons":
        return []
    by_layer: dict[int, list[int]] = {}
    D = int(model.d_mlp)
    for layer, i in config.neurons or ():
        _check_layers(model, (int(layer),))
        if not 0 <= int(i) < D:
            raise ValueError(f"neuron ({layer}, {i}) is out of range; this model's MLP has neurons 0..{D - 1}")
        by_layer.setdefault(int(layer), []).append(int(i))
    out = []
    for layer, idx in sorted(by_layer.items()):
        for p, dim in neuron_weights(model, layer):
            shape = [1] * p.dim()
            shape[dim] = p.shape[dim]
            mask = torch.zeros(shape, dtype=p.dtype, device=p.device)
            mask.view(-1)[idx] = 1
            out.append((p, mask))
    return out


def make_trainable(model: Model, config: TuneConfig) -> Model:
    """``model`` ready to train under ``config``: LoRA wraps ``model.hf`` in a ``PeftModel`` (seeded adapters;
    peft injects them into the base modules in place, and ``disable_adapter()`` gives the base back) and returns
    it as a :class:`Model`; a full fine-tune returns ``model`` itself with only the chosen blocks trainable (a
    neuron-restricted one, with the weights of :func:`grad_masks` trainable)."""
    model.require_local("fine-tuning (gradients and weight edits)")
    _check_layers(model, config.layers)
    for p in model.hf.parameters():
        p.requires_grad_(False)
    if config.method == "neurons":
        for p, _ in grad_masks(model, config):
            p.requires_grad_(True)
        return model
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


__all__ = ["TuneConfig", "component_targets", "grad_masks", "make_trainable", "neuron_weights", "trainable_parameters"]
