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

    ``ablate_mask [rows, T]`` (bool, the prompt pass's columns): ablate only those tokens, e.g. each row's
    post-instruction tokens (``Batch.post_mask`` repeated per candidate), which equals
    ``DirectionalAblation(ablate[i], positions="post_instruction")`` on that pass; ``None``: every token.
    """

    ablate: Float[torch.Tensor, "rows d"] | None = None
    add: Float[torch.Tensor, "rows d"] | None = None
    add_layer: Int[torch.Tensor, " rows"] | None = None
    ablate_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.ablate is None and self.add is None:
            raise ValueError("RowEdits needs ablate=[rows, d] and/or add=[rows, d]")
        if self.add is not None and (self.add_layer is None or self.add_layer.shape != self.add.shape[:1]):
            raise ValueError("RowEdits(add=...) needs add_layer=[rows], one layer index per row of add")
        for name, t in (("ablate", self.ablate), ("add", self.add)):
            if t is not None and t.dim() != 2:
                raise ValueError(f"RowEdits.{name} must be [rows, d], got shape {tuple(t.shape)}")
        if self.ablate_mask is not None:
            if self.ablate is None:
                raise ValueError("RowEdits(ablate_mask=...) restricts an ablation: pass ablate=[rows, d] too")
            if self.ablate_mask.dim() != 2 or self.ablate_mask.shape[0] != self.ablate.shape[0]:
                raise ValueError(f"RowEdits.ablate_mask must be Bool[rows, T] with rows = {self.ablate.shape[0]}, "
                                 f"got shape {tuple(self.ablate_mask.shape)}")

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
            keep = None if self.ablate_mask is None else self.ablate_mask.to(model.device, model.dtype)

            def ablate(x: torch.Tensor) -> torch.Tensor:
                proj = torch.einsum("btd,bd->bt", x, r)
                if keep is not None:
                    if keep.shape[1] != x.shape[1]:
                        raise ValueError(f"RowEdits.ablate_mask covers {keep.shape[1]} tokens but this pass has "
                                         f"{x.shape[1]}; build it from the batch being run (its post_mask)")
                    proj = proj * keep
                return x - proj[..., None] * r[:, None, :]

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
