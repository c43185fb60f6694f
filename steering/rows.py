"""Per-row edits for batched candidate scoring: row ``i`` of the batch gets its own direction or vector.

Scoring many candidate directions at once stacks the prompts once per candidate along the batch; each
row's hooks then use that row's own edit, so one forward pass scores a whole chunk of candidates. It is
an intervention like the others (``hook_fns(model)``), so it composes in :func:`steering.apply`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int

from interp.hooks import HookContext
from interp.models import Model

ABLATE_KINDS = ("resid_pre", "attn_out", "mlp_out")  # the writers, as steering.DirectionalAblation's default


@dataclass(eq=False)
class RowEdits:
    """Per-row ablation and/or addition for one forward pass over ``rows`` (e.g. candidates x prompts).

    ``ablate [rows, d]``: unit directions projected out at every layer's ``resid_pre``, ``attn_out`` and
    ``mlp_out`` (row ``i`` equals ``DirectionalAblation(ablate[i])`` run alone). ``add [rows, d]``: vectors
    added at ``resid_pre`` of ``add_layer[i]`` (row ``i`` equals ``AddVector(add[i], layers=add_layer[i],
    sites="resid_pre")`` run alone). Where both apply at one site, the ablation runs first.
    """

    ablate: Float[torch.Tensor, "rows d"] | None = None
    add: Float[torch.Tensor, "rows d"] | None = None
    add_layer: Int[torch.Tensor, " rows"] | None = None

    def __post_init__(self) -> None:
        if self.ablate is None and self.add is None:
            raise ValueError("RowEdits needs ablate=[rows, d] and/or add=[rows, d]")
        if self.add is not None and (self.add_layer is None or self.add_layer.shape != self.add.shape[:1]):
            raise ValueError("RowEdits(add=...) needs add_layer=[rows], one layer index per row of add")
        for name, t in (("ablate", self.ablate), ("add", self.add)):
            if t is not None and t.dim() != 2:
                raise ValueError(f"RowEdits.{name} must be [rows, d], got shape {tuple(t.shape)}")

    @property
    def rows(self) -> int:
        """Number of batch rows the edits are for; the forward's batch must have exactly this many."""
        return (self.ablate if self.ablate is not None else self.add).shape[0]  # type: ignore[union-attr]

    def _check(self, x: torch.Tensor) -> None:
        if x.shape[0] != self.rows:
            raise ValueError(f"RowEdits holds edits for {self.rows} rows but the batch has {x.shape[0]}; stack the "
                             f"prompts once per candidate (interp.forward.last_logits(..., repeat=k))")

    def hook_fns(self, model: Model) -> dict[str, Callable[[torch.Tensor, HookContext], torch.Tensor]]:
        """``{site: fn(x, ctx)}``: the per-row ablation at every writer site, the addition at its layers."""
        steps: dict[str, list[Callable[[torch.Tensor], torch.Tensor]]] = {}
        if self.ablate is not None:
            r = self.ablate.to(model.device, model.dtype)

            def ablate(x: torch.Tensor) -> torch.Tensor:
                return x - torch.einsum("btd,bd->bt", x, r)[..., None] * r[:, None, :]

            for layer in range(model.n_layers):
                for kind in ABLATE_KINDS:
                    steps.setdefault(f"blocks.{layer}.hook_{kind}", []).append(ablate)
        if self.add is not None:
            assert self.add_layer is not None
            v = self.add.to(model.device, model.dtype)
            row_layer = self.add_layer.to(model.device)
            for layer in sorted(set(self.add_layer.tolist())):
                sel = (row_layer == layer).to(model.dtype)[:, None, None]

                def add(x: torch.Tensor, sel: torch.Tensor = sel) -> torch.Tensor:
                    return x + sel * v[:, None, :]

                steps.setdefault(f"blocks.{layer}.hook_resid_pre", []).append(add)
        return {site: self._chain(fs) for site, fs in steps.items()}

    def _chain(self, fs: list[Callable[[torch.Tensor], torch.Tensor]]) -> Any:
        def fn(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
            self._check(x)
            for f in fs:
                x = f(x)
            return x
        return fn


__all__ = ["RowEdits"]
