"""Cross-validation folds: stratified, or grouped so that no group (template, source question) straddles folds."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Fold:
    """One split: ``train`` and ``test`` sample indices (LongTensors)."""

    train: torch.Tensor
    test: torch.Tensor


def make_folds(y: torch.Tensor, n_folds: int = 5, groups: list[Any] | None = None, seed: int = 0,
               need_both_classes: bool = True) -> list[Fold]:
    """``n_folds`` disjoint test sets covering every sample.

    With ``groups`` every group lands in exactly one test fold (groups are dealt largest first to the
    emptiest fold, ties broken by ``seed``); otherwise folds are stratified by class.
    """
    n = y.shape[0]
    if not isinstance(n_folds, int) or n_folds < 2:
        raise ValueError(f"n_folds must be an int >= 2, got {n_folds!r}")
    if n < n_folds:
        raise ValueError(f"{n} samples cannot fill {n_folds} folds; use n_folds <= {n} or add samples")
    g = torch.Generator().manual_seed(seed)
    assign = torch.empty(n, dtype=torch.long)
    if groups is not None:
        if len(groups) != n:
            raise ValueError(f"groups has {len(groups)} entries for {n} samples")
        keys = list(dict.fromkeys(groups))
        if len(keys) < n_folds:
            raise ValueError(f"only {len(keys)} distinct groups for {n_folds} folds; use n_folds <= {len(keys)} "
                             f"or finer groups")
        sizes = Counter(groups)
        order = [keys[i] for i in torch.randperm(len(keys), generator=g).tolist()]
        order.sort(key=lambda k: -sizes[k])                              # stable: random among equal sizes
        load = [0] * n_folds
        fold_of: dict[Any, int] = {}
        for k in order:
            f = min(range(n_folds), key=lambda i: load[i])
            fold_of[k] = f
            load[f] += sizes[k]
        assign = torch.tensor([fold_of[k] for k in groups], dtype=torch.long)
    else:
        for c in y.unique().tolist():
            idx = (y == c).nonzero().flatten()
            idx = idx[torch.randperm(len(idx), generator=g)]
            start = int(torch.randint(n_folds, (1,), generator=g))
            assign[idx] = (torch.arange(len(idx)) + start) % n_folds
    folds = [Fold(train=(assign != f).nonzero().flatten(), test=(assign == f).nonzero().flatten())
             for f in range(n_folds)]
    if need_both_classes:
        check_folds(y, folds)
    return folds


def check_folds(y: torch.Tensor, folds: list[Fold], what: str = "") -> None:
    """Raise unless every fold's training and test parts hold every class present in ``y``.

    Classes are counted by the values present (not ``y.max() + 1``), so labels coded e.g. ``{1, 2}`` or a
    label vector that happens to lack class 0 are judged by what is there.
    """
    present = y.unique()
    for i, f in enumerate(folds):
        for part, idx in (("training", f.train), ("test", f.test)):
            if len(idx) == 0 or torch.isin(present, y[idx]).sum() < present.numel():
                raise ValueError(f"fold {i}: the {part} part{what} lacks a class ({len(idx)} samples); use fewer "
                                 f"folds, more samples per class, or groups that mix classes")


def masks(folds: list[Fold], n: int) -> torch.Tensor:
    """Training masks ``[n_folds, n]`` (bool)."""
    m = torch.zeros(len(folds), n, dtype=torch.bool)
    for i, f in enumerate(folds):
        m[i, f.train] = True
    return m
