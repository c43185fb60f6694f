"""The mixture-of-experts study's choices, checked when built."""

from __future__ import annotations

from dataclasses import dataclass

# The categories of our harmful set (interp/data/prompts/harmful_realistic.jsonl) the subspaces are built from. The
# seed study used violence, sexual content and hate; our set has no sexual-content category, so harassment stands
# in for it (said in the report).
CATEGORIES = ("violence", "hate", "harassment")


@dataclass(frozen=True)
class MoeConfig:
    """``n_direction`` train / val prompts per class for the refusal direction (the kit's selection, over every
    ``layer_stride``-th layer: 1 searches every layer, more is cheaper); ``n_eval``
    harmful and harmless test prompts scored (first response token refusal score); ``n_generate`` of the harmful
    ones answered greedily (``max_new_tokens``) and judged for the main conditions; ``n_random`` random unit
    directions orthogonal to the refusal direction; ``categories`` whose subspaces of each rank in ``ranks`` are
    ablated (each built from at most ``n_category`` of the category's train + val prompts, at least
    ``max(ranks)``; ``exclude_refusal``: the refusal direction projected out of the category directions first, so
    ablating a category subspace cannot remove the refusal direction itself); ``n_boot`` bootstrap resamples over prompts; ``tolerance``: the largest relative logit
    difference allowed between the baked weights and the hooks."""

    n_direction: int = 32
    layer_stride: int = 1
    n_eval: int = 64
    n_generate: int = 32
    max_new_tokens: int = 24
    n_random: int = 3
    categories: tuple[str, ...] = CATEGORIES
    ranks: tuple[int, ...] = tuple(range(1, 13))
    n_category: int = 26
    exclude_refusal: bool = True
    n_boot: int = 1000
    tolerance: float = 1e-4

    def __post_init__(self) -> None:
        for name in ("n_direction", "layer_stride", "n_eval", "n_random", "n_category", "n_boot", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_generate < 0:
            raise ValueError(f"n_generate must be >= 0 (0: no judged generation), got {self.n_generate}")
        if not self.ranks or any(r < 1 for r in self.ranks) or list(self.ranks) != sorted(set(self.ranks)):
            raise ValueError(f"ranks must be increasing positive integers, e.g. tuple(range(1, 13)); got {self.ranks}")
        if max(self.ranks) > self.n_category:
            raise ValueError(f"rank {max(self.ranks)} needs at least as many category directions (one per prompt), "
                             f"but n_category={self.n_category}; lower the ranks or raise n_category")
        if not self.categories or len(set(self.categories)) != len(self.categories):
            raise ValueError(f"categories must name at least one category, each once; got {self.categories}")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {self.tolerance}")


__all__ = ["CATEGORIES", "MoeConfig"]
