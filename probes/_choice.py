"""Choosing the best layer from per-layer scores, with ties broken by a stated rule the user can inspect."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class LayerChoice:
    """The chosen layer and how it was chosen.

    ``index`` into ``sites``; ``tied``: indices that tied on the primary criterion (``criteria[0]``);
    ``remaining``: those still tied after every secondary criterion (the middle one was taken);
    ``values[name]``: each criterion's per-layer value (NaN-aware means over folds).
    """

    index: int
    site: str
    criteria: list[str]
    tied: list[int]
    remaining: list[int]
    values: dict[str, list[float]] = field(default_factory=dict)

    @property
    def rule(self) -> str:
        """The tie-breaking rule in words."""
        rest = ", then ".join(f"highest {c}" for c in self.criteria[1:])
        return (f"highest {self.criteria[0]} (within tol)" + (f", then {rest}" if rest else "")
                + ", then the middle of the layers still tied")


def choose_layer(criteria: dict[str, torch.Tensor], sites: Sequence[str], tol: float = 1e-6) -> LayerChoice:
    """Pick the layer maximising the first criterion ``[n_layers]``; ties (within ``tol``) go to the next
    criterion, and layers tied on all go to the middle one of them (not the first, which favours layer 0)."""
    names = list(criteria)
    if not names:
        raise ValueError("choose_layer needs at least one criterion")
    vals = torch.stack([criteria[n].double() for n in names])             # [m, L]
    if torch.isnan(vals[0]).all():
        raise ValueError(f"{names[0]} is undefined (NaN) at every layer; check that the folds hold both classes")
    cand = ~torch.isnan(vals[0])
    tied: list[int] = []
    for i in range(vals.shape[0]):
        v = vals[i].masked_fill(~cand | torch.isnan(vals[i]), float("-inf"))
        if torch.isinf(v.max()):
            continue                                                     # criterion undefined on the candidates
        cand = cand & (v >= v.max() - tol)
        if i == 0:
            tied = cand.nonzero().flatten().tolist()
    remaining = cand.nonzero().flatten().tolist()
    index = remaining[(len(remaining) - 1) // 2]
    return LayerChoice(index=index, site=str(sites[index]), criteria=names, tied=tied, remaining=remaining,
                       values={n: vals[i].tolist() for i, n in enumerate(names)})
