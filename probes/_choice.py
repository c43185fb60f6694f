"""Choosing layers from per-layer criteria by one stated rule (:class:`LayerRule`) the user can read and inspect."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from probes._frames import site_layer

TIES = ("middle", "lowest", "highest")


@dataclass(frozen=True)
class LayerRule:
    """How to choose a layer from per-layer criteria.

    ``criteria``: the primary first, the rest break its ties in order; each is maximised unless named in
    ``minimise``. ``tol``: values within ``tol`` of the best tie. ``window``: ``"middle half"`` (layers
    ``n // 4 <= l < n - n // 4`` of ``n`` layers) or ``(lo, hi)`` (``lo <= l < hi``); all layers when none captured
    is in it. ``tie``: which of the layers tied on every criterion (middle, so layer 0 is not favoured).
    ``avoid_lowest``: never the lowest captured layer while another ties with it on the primary.
    ``above``: the primary must be strictly better than this. ``top_k``: how many layers, best first.
    """

    criteria: tuple[str, ...]
    minimise: tuple[str, ...] = ()
    tol: float = 1e-6
    window: str | tuple[int, int] | None = None
    tie: str = "middle"
    avoid_lowest: bool = False
    above: float | None = None
    top_k: int = 1

    def __post_init__(self) -> None:
        if not self.criteria:
            raise ValueError("a LayerRule needs at least one criterion, e.g. LayerRule(('auroc',))")
        if self.tie not in TIES:
            raise ValueError(f"tie must be one of {TIES}, got {self.tie!r}")
        if self.window is not None and self.window != "middle half" and len(self.window) != 2:
            raise ValueError(f"window must be None, 'middle half' or (lo, hi) layers, got {self.window!r}")
        if self.top_k < 1 or self.tol < 0:
            raise ValueError(f"need top_k >= 1 and tol >= 0, got top_k={self.top_k}, tol={self.tol}")

    def describe(self, window_empty: bool = False) -> str:
        """The rule in words, for reports."""
        def best(c: str) -> str:
            return ("lowest " if c in self.minimise else "highest ") + c
        tol = f" (within {self.tol:g} of the best)" if self.tol > 0 else ""
        parts = [("the top " + str(self.top_k) + " layers by " if self.top_k > 1 else "") + best(self.criteria[0]) + tol]
        if self.above is not None:
            parts.append(f"only layers with {self.criteria[0]} {'below' if self.criteria[0] in self.minimise else 'above'}"
                         f" {self.above:g}")
        parts += [f"then {best(c)}" for c in self.criteria[1:]]
        parts.append(f"then the {self.tie} of the layers still tied")
        if self.avoid_lowest:
            parts.append("never the lowest captured layer while another ties with it")
        if self.window is not None:
            win = self.window if isinstance(self.window, str) else f"layers {self.window[0]} to {self.window[1] - 1}"
            parts.append(f"layers in the {win}" if isinstance(self.window, str) else win)
            if window_empty:
                parts.append("(no layer in the window was captured: all layers)")
        return ", ".join(parts)


@dataclass
class LayerChoice:
    """The chosen layer and how it was chosen.

    ``index`` into ``sites``; ``tied``: indices that tied on the primary criterion (``criteria[0]``);
    ``remaining``: those still tied after every secondary criterion; ``values[name]``: each criterion's per-layer
    value; ``indices``: every chosen index, best first (``top_k``); ``rule``: the rule in words.
    """

    index: int
    site: str
    criteria: list[str]
    tied: list[int]
    remaining: list[int]
    values: dict[str, list[float]] = field(default_factory=dict)
    indices: list[int] = field(default_factory=list)
    rule: str = ""

    @property
    def layer(self) -> int | None:
        """The chosen site's layer number (``None`` for a site with none)."""
        return site_layer(self.site) if not self.site.lstrip("-").isdigit() else int(self.site)


def _layer_numbers(sites: Sequence[str | int]) -> list[int]:
    out = [s if isinstance(s, int) else site_layer(str(s)) for s in sites]
    if any(v is None for v in out):
        raise ValueError(f"a layer window needs sites with layer numbers, got {list(sites)}")
    return [int(v) for v in out]  # type: ignore[arg-type]


def _window(rule: LayerRule, sites: Sequence[str | int], n_layers: int | None) -> torch.Tensor | None:
    """Mask ``[L]`` of the sites in the rule's window (``None``: no window or none captured in it)."""
    if rule.window is None:
        return None
    layers = _layer_numbers(sites)
    if rule.window == "middle half":
        n = max(layers) + 1 if n_layers is None else n_layers
        lo, hi = n // 4, n - n // 4
    else:
        lo, hi = rule.window  # type: ignore[misc]
    mask = torch.tensor([lo <= la < hi for la in layers])
    return mask if mask.any() else None


def _pick(rule: LayerRule, vals: torch.Tensor, cand: torch.Tensor, lowest: int) -> tuple[int, list[int], list[int]]:
    """One choice among ``cand`` ``[L]`` by the criteria ``vals`` ``[m, L]`` (higher is better): index, tied, remaining."""
    tied: list[int] = []
    for i in range(vals.shape[0]):
        v = vals[i].masked_fill(~cand | torch.isnan(vals[i]), float("-inf"))
        if torch.isinf(v.max()):
            continue                                                     # criterion undefined on the candidates
        cand = cand & (v >= v.max() - rule.tol)
        if i == 0:
            tied = cand.nonzero().flatten().tolist()
    remaining = cand.nonzero().flatten().tolist()
    at = {"middle": (len(remaining) - 1) // 2, "lowest": 0, "highest": -1}[rule.tie]
    index = remaining[at]
    if rule.avoid_lowest and index == lowest and len(tied) > 1:
        rest = [j for j in tied if j != lowest]
        index = rest[{"middle": (len(rest) - 1) // 2, "lowest": 0, "highest": -1}[rule.tie]]
        remaining = [index]
    return index, tied, remaining


def choose(rule: LayerRule, criteria_by_layer: Mapping[str, torch.Tensor | Sequence[float]],
           sites: Sequence[str | int] | None = None, n_layers: int | None = None) -> LayerChoice:
    """Choose by ``rule`` from ``{criterion: [L] values}`` (NaN: undefined there, never chosen) at ``sites``
    (site names or layer numbers; default ``0..L-1``); ``n_layers``: the model's depth for a window."""
    missing = [c for c in rule.criteria if c not in criteria_by_layer]
    if missing:
        raise ValueError(f"criteria {missing} missing; given {list(criteria_by_layer)}: pass a value per layer for each")
    vals = torch.stack([torch.as_tensor(criteria_by_layer[c], dtype=torch.float64).flatten() for c in rule.criteria])
    sites = list(range(vals.shape[1])) if sites is None else list(sites)
    if vals.shape[1] != len(sites):
        raise ValueError(f"{vals.shape[1]} values per criterion for {len(sites)} sites; give one value per site")
    signs = torch.tensor([-1.0 if c in rule.minimise else 1.0 for c in rule.criteria], dtype=torch.float64)
    signed = vals * signs[:, None]
    if torch.isnan(vals[0]).all():
        raise ValueError(f"{rule.criteria[0]} is undefined (NaN) at every layer; check that the folds hold both classes")
    window = _window(rule, sites, n_layers)
    cand = ~torch.isnan(vals[0]) & (torch.ones_like(vals[0], dtype=torch.bool) if window is None else window)
    if rule.above is not None:
        cand &= signed[0] > float(signs[0]) * rule.above
        if not cand.any():
            raise ValueError(f"no layer has {rule.criteria[0]} {'below' if signs[0] < 0 else 'above'} {rule.above:g}")
    if not cand.any():
        raise ValueError(f"{rule.criteria[0]} is undefined (NaN) at every layer in the window {rule.window!r}")
    lowest = min(range(len(sites)), key=lambda j: _layer_numbers([sites[j]])[0]) if rule.avoid_lowest else 0
    picks = []
    for _ in range(min(rule.top_k, int(cand.sum()))):
        picks.append(_pick(rule, signed, cand, lowest))
        cand = cand.clone()
        cand[picks[-1][0]] = False
    index, tied, remaining = picks[0]
    return LayerChoice(index=index, site=str(sites[index]), criteria=list(rule.criteria), tied=tied,
                       remaining=remaining, values={c: vals[i].tolist() for i, c in enumerate(rule.criteria)},
                       indices=[p[0] for p in picks],
                       rule=rule.describe(window_empty=rule.window is not None and window is None))


def choose_layer(criteria: dict[str, torch.Tensor], sites: Sequence[str], tol: float = 1e-6) -> LayerChoice:
    """Pick the layer maximising the first criterion ``[n_layers]``; ties (within ``tol``) go to the next
    criterion, and layers tied on all go to the middle one of them (not the first, which favours layer 0)."""
    if not criteria:
        raise ValueError("choose_layer needs at least one criterion")
    return choose(LayerRule(tuple(criteria), tol=tol), criteria, sites)
