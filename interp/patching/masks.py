"""Learned masks: a differentiable ablation strength per head (or neuron), trained with the model frozen to
move a metric while ablating as few components as possible; the components come back ranked.

Component ``c`` at layer ``l`` becomes ``x + a[l, c] * (ref - x)`` with ``a = sigmoid(theta)``, ``ref`` zero or
the mean. The loss is ``+/- metric + sparsity * sum(a)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.forward import batch_of, last_logits
from interp.hooking import HookContext
from interp.models import Model
from interp.patching.measures import Metric, call_metric, metric_name
from interp.patching.progress import progress_bar
from interp.patching.runs import MOVED, Prompts
from interp.sites import Site, parse_site
from interp.values import Runtime, moved_keywords

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class MaskResult(Result):
    """``scores [L, C]``: learned ablation strength in [0, 1] per head / neuron (higher: ablating it moves the
    metric more); ``history``: per-step metric, loss and number of components above 0.5."""

    scores: torch.Tensor
    over: str
    layers: list[int]
    history: list[dict[str, float]]
    baseline: float
    selected_metric: float
    objective: str
    metric: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def ranking(self, k: int | None = None) -> list[tuple[int, int, float]]:
        """Components ``(layer, index, score)`` from the highest score down."""
        C = self.scores.shape[1]
        flat = self.scores.flatten()
        idx = flat.argsort(descending=True)[: (k or flat.numel())].tolist()
        return [(self.layers[i // C], i % C, float(flat[i])) for i in idx]

    def selected(self, threshold: float = 0.5) -> list[tuple[int, int]]:
        return [(la, c) for la, c, s in self.ranking() if s > threshold]

    def to_frame(self, threshold: float = 0.5) -> pd.DataFrame:
        """One row per component: ``layer``, ``head`` (or ``neuron``), ``score``, ``rank`` (0 = highest) and
        ``selected`` (score above ``threshold``); the per-step history is :meth:`history_frame`."""
        import pandas as pd

        unit = "head" if self.over == "heads" else "neuron"
        rows = [{"layer": la, unit: c, "score": s, "rank": r, "selected": s > threshold}
                for r, (la, c, s) in enumerate(self.ranking())]
        return pd.DataFrame(rows).sort_values(["layer", unit], ignore_index=True)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the metric before masking and with the selected components ablated, how many are
        selected (score > 0.5) of how many, and the five highest-scoring ``[layer, index, score]``."""
        return {"over": self.over, "objective": self.objective, "metric": self.metric, "baseline": self.baseline,
                "selected_metric": self.selected_metric, "n_selected": len(self.selected()),
                "n_components": self.scores.numel(), "n_steps": len(self.history),
                "top": [list(r) for r in self.ranking(5)]}

    def history_frame(self) -> Any:
        """One row per optimisation step: ``step``, ``metric``, ``loss``, ``n_active``."""
        import pandas as pd

        return pd.DataFrame(self.history, columns=["step", "metric", "loss", "n_active"])

    def plot(self, k: int = 20, title: str | None = None) -> Any:
        """Bars of the ``k`` highest mask scores (ablation strength in [0, 1])."""
        from interp.viz.patching import mask_ranking

        return mask_ranking(self, k=k, title=title)


@dataclass(frozen=True)
class MaskConfig:
    """How :func:`learn_mask` optimises: Adam at ``lr`` for ``steps`` steps on ``sign * metric + sparsity *
    sum(sigmoid(theta))`` from logits ``init``; ``objective``: ``"decrease"`` or ``"increase"`` the metric."""

    objective: str = "decrease"
    sparsity: float = 0.01
    steps: int = 200
    lr: float = 0.1
    init: float = 0.0

    def __post_init__(self) -> None:
        if self.objective not in ("decrease", "increase"):
            raise ValueError(f"objective must be 'decrease' or 'increase', got {self.objective!r}")
        if self.steps < 1 or self.sparsity < 0 or self.lr <= 0:
            raise ValueError("steps must be >= 1, sparsity >= 0 and lr > 0")


MASK_MOVED = {**MOVED, **{f.name: f"config=interp.patching.MaskConfig({f.name}=...)" for f in fields(MaskConfig)},
              "ablate": "means= (given: a mean ablation; None: a zero ablation)"}


@moved_keywords(MASK_MOVED)
def learn_mask(model: Model, prompts: Prompts, metric: Metric, over: str = "heads",
               layers: Sequence[int] | None = None, means: torch.Tensor | None = None,
               config: MaskConfig | None = None, runtime: Runtime | None = None) -> MaskResult:
    """Train a mask over ``heads`` (site ``attn_z``) or ``neurons`` (``mlp_post``) that decreases or increases
    ``metric`` (``config.objective``); masked units move to ``means`` (``[n_layers, H, dh]`` / ``[n_layers, D]``:
    a mean ablation) or to zero (``means=None``).
    ``prompts``: texts (a list: the chat template; ``interp.Prompts(texts, chat=False)``: raw) or a batch;
    ``runtime``: the seed and a bar over the optimisation steps showing the metric and the active count."""
    cfg, runtime = config or MaskConfig(), Runtime.of(runtime)
    objective, sparsity, steps, lr, init = cfg.objective, cfg.sparsity, cfg.steps, cfg.lr, cfg.init
    seed, progress, ablate = runtime.seed, runtime.progress, "zero" if means is None else "mean"
    _check_args(model, over, objective, ablate, means, steps, sparsity)
    kind = "attn_z" if over == "heads" else "mlp_post"
    layer_list = list(range(model.n_layers)) if layers is None else \
        [parse_site(Site(kind, int(x)), model.n_layers).layer for x in layers]
    C = model.n_heads if over == "heads" else int(model.d_mlp)
    batch = batch_of(model, prompts)
    torch.manual_seed(seed)
    theta = torch.full((len(layer_list), C), float(init), device=model.device, requires_grad=True)

    def make(i: int, layer: int, gate: torch.Tensor):
        def fn(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
            a = gate[i].to(x.dtype)
            ref = 0.0 if means is None else means[layer].to(x.device, x.dtype)
            shape = (C, 1) if over == "heads" else (C,)
            return x + a.view(shape) * (ref - x)
        return fn

    def run(gate: torch.Tensor) -> torch.Tensor:
        fns = [(Site(kind, la), make(i, la, gate)) for i, la in enumerate(layer_list)]
        return call_metric(metric, last_logits(model, batch, fns, grad=gate.requires_grad))

    params = [p for p in model.hf.parameters() if p.device.type != "meta"]  # offloaded ones are reloaded per call
    flags = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        baseline = float(run(torch.zeros_like(theta).detach()))
        history = _train(theta, run, 1.0 if objective == "decrease" else -1.0, sparsity, steps, lr, progress)
        scores = torch.sigmoid(theta.detach()).cpu()
        selected = float(run((scores > 0.5).float().to(model.device)))
    finally:
        for p, f in zip(params, flags, strict=True):
            p.requires_grad_(f)
    return MaskResult(scores, over, layer_list, history, baseline, selected, objective, metric_name(metric),
                      meta={"ablate": ablate, "sparsity": sparsity, "steps": steps, "lr": lr})


def _check_args(model: Model, over: str, objective: str, ablate: str, means: torch.Tensor | None, steps: int,
                sparsity: float) -> None:
    if over not in ("heads", "neurons"):
        raise ValueError(f"over must be 'heads' or 'neurons', got {over!r}")
    if objective not in ("decrease", "increase"):
        raise ValueError(f"objective must be 'decrease' or 'increase', got {objective!r}")
    if ablate not in ("zero", "mean"):
        raise ValueError(f"ablate must be 'zero' or 'mean', got {ablate!r}")
    if ablate == "mean" and means is None:
        raise ValueError("ablate='mean' needs means= (head_means(...) or neuron_means(...))")
    if steps < 1 or sparsity < 0:
        raise ValueError("steps must be >= 1 and sparsity >= 0")
    if over == "neurons" and model.spec.mlp_proj is None:
        raise ValueError(f"{model.spec.family} has mixture-of-experts MLPs; learn a mask over heads instead")


def _train(theta: torch.Tensor, run: Any, sign: float, sparsity: float, steps: int, lr: float,
           progress: bool = False) -> list[dict[str, float]]:
    """Adam on ``theta`` for ``sign * metric + sparsity * sum(sigmoid(theta))``; the per-step history."""
    opt = torch.optim.Adam([theta], lr=lr)
    history: list[dict[str, float]] = []
    with torch.enable_grad(), progress_bar(steps, "learning mask", progress, unit="step") as bar:
        for step in range(steps):
            gate = torch.sigmoid(theta)
            value = run(gate)
            loss = sign * value + sparsity * gate.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append({"step": step, "metric": value.item(), "loss": loss.item(),
                            "n_active": int((gate > 0.5).sum())})
            bar.set_postfix(metric=f"{history[-1]['metric']:.4g}", active=history[-1]["n_active"], refresh=False)
            bar.update(1)
    return history


__all__ = ["MaskResult", "learn_mask"]
