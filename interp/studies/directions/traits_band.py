"""The middle-layer band of a graded direction, chosen by a stated rule (recorded in every result)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probes.graded import GradedDirection

ON_EMPTY = ("raise", "report")


@dataclass(frozen=True)
class BandRule:
    """Eligible layers: not among the first / last ``edge`` layers of the model, levels in order in every
    held-out fold, and held-out adjacent-level Cohen's d (mean over folds, min over adjacent pairs) at least
    ``min_d``. The band is the longest run of consecutive eligible layers among those captured (ties: the run
    whose centre is nearest the model's middle layer); it must hold at least ``min_len`` layers."""

    min_d: float = 0.3
    edge: int = 1
    min_len: int = 1

    def describe(self) -> str:
        return (f"longest run of consecutive captured layers, excluding the first and last {self.edge} of the "
                f"model, where the levels are in order in every held-out fold and the held-out adjacent-level "
                f"Cohen's d (fold mean, min over adjacent pairs) >= {self.min_d:g}; ties: nearest the middle layer; at least "
                f"{self.min_len} layer(s)")


def heldout_min_d(g: GradedDirection) -> torch.Tensor:
    """Held-out adjacent d ``[n_layers]``: mean over folds, min over adjacent level pairs."""
    if g.heldout_adjacent_d is None:
        raise ValueError("the band needs held-out statistics; fit the graded direction with n_folds set")
    return g.heldout_adjacent_d.mean(0).min(-1).values


def _runs(ok: list[bool]) -> list[list[int]]:
    """Runs of consecutive captured layers (as indices into the captured list) where ``ok`` holds: with every layer
    captured these are consecutive model layers; with a subsample (``range(0, 30, 3)``) neighbours in it."""
    runs: list[list[int]] = []
    for j, good in enumerate(ok):
        if not good:
            continue
        if runs and runs[-1][-1] == j - 1:
            runs[-1].append(j)
        else:
            runs.append([j])
    return runs


def choose_band(g: GradedDirection, rule: BandRule, n_layers: int, trait: str = "",
                on_empty: str = "raise") -> tuple[list[int], str]:
    """``(band as indices into g.sites, note)``; no qualifying run raises (``on_empty="raise"``) or returns an
    empty band with the reason (``"report"``): never a silent pick."""
    if on_empty not in ON_EMPTY:
        raise ValueError(f"on_empty must be one of {ON_EMPTY}, got {on_empty!r}")
    layers = [int(x) if x is not None else -1 for x in g.direction.layers]
    dmin = heldout_min_d(g)
    ordered = g.heldout_monotonic.all(0)
    ok = [bool(ordered[j]) and float(dmin[j]) >= rule.min_d and rule.edge <= layer < n_layers - rule.edge
          for j, layer in enumerate(layers)]
    runs = [r for r in _runs(ok) if len(r) >= rule.min_len]
    if runs:
        mid = (n_layers - 1) / 2
        best = max(runs, key=lambda r: (len(r), -abs((layers[r[0]] + layers[r[-1]]) / 2 - mid)))
        return best, f"layers {layers[best[0]]}-{layers[best[-1]]}"
    interior = [j for j, layer in enumerate(layers) if rule.edge <= layer < n_layers - rule.edge]
    best_d = max((float(dmin[j]) for j in interior), default=float("nan"))
    note = (f"no layer meets the band rule for {trait or 'this direction'} ({rule.describe()}): ordered in every "
            f"held-out fold at {int(ordered.sum())}/{len(layers)} layers, best held-out adjacent d among the "
            f"interior layers {best_d:.2f}")
    if on_empty == "raise":
        raise ValueError(note + "; loosen the rule (BandRule(min_d=..., edge=...)), add statements, or pass "
                                "on_empty='report' to keep the trait without a band")
    return [], note


__all__ = ["BandRule", "choose_band", "heldout_min_d"]
