"""The entrainment study's choices, checked when built."""

from __future__ import annotations

from dataclasses import dataclass

from interp.studies.entrainment.data import KINDS

SPARSITY_RANGE = (1e-4, 1.0)


@dataclass(frozen=True)
class EntrainmentConfig:
    """``kinds`` measured; ``mask_kind``: the kind whose present prompts the head mask is trained on (the mask
    decreases the tracked token's logit minus the answer's); ``sparsities``: the sweep of the mask's L1 weight, each in
    :data:`SPARSITY_RANGE`; ``sparsity``: the sweep point whose heads are ablated (default the middle one);
    ``max_heads``: at most this many heads kept (highest mask scores); ``steps`` / ``lr`` of each mask;
    ``n_draws`` sets of layer-matched random heads; ``n_boot`` bootstrap resamples over items; ``chat``: the chat
    template (False: plain prompts, as for a pretrained model)."""

    kinds: tuple[str, ...] = KINDS
    mask_kind: str = "counterfactual"
    sparsities: tuple[float, ...] = (0.003, 0.01, 0.03)
    sparsity: float | None = None
    max_heads: int = 8
    steps: int = 100
    lr: float = 0.1
    n_draws: int = 5
    n_boot: int = 2000
    chat: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [k for k in (*self.kinds, self.mask_kind) if k not in KINDS]
        if bad:
            raise ValueError(f"unknown context kind(s) {bad}; choose from {KINDS}")
        if self.mask_kind == "factual":
            raise ValueError("mask_kind='factual' tracks the answer itself (the mask's logit difference is 0); choose "
                             "'counterfactual', 'irrelevant' or 'random'")
        lo, hi = SPARSITY_RANGE
        if not self.sparsities:
            raise ValueError("sparsities is empty; give at least one mask sparsity, e.g. (0.003, 0.01, 0.03)")
        out = [s for s in (*self.sparsities, *([self.sparsity] if self.sparsity is not None else []))
               if not lo <= s <= hi]
        if out:
            raise ValueError(f"mask sparsity {out} is outside its range [{lo}, {hi}] (the L1 weight per head against "
                             f"a logit difference: below it nothing is pruned, above it every head is); pick values "
                             f"inside it")
        if self.sparsity is not None and self.sparsity not in self.sparsities:
            raise ValueError(f"sparsity={self.sparsity} is not one of the sweep's {self.sparsities}; add it to "
                             f"sparsities or leave it None (the middle one)")
        if self.max_heads < 1 or self.steps < 1 or self.n_draws < 1 or self.n_boot < 1:
            raise ValueError("max_heads, steps, n_draws and n_boot must be >= 1")

    @property
    def chosen_sparsity(self) -> float:
        return self.sparsity if self.sparsity is not None else sorted(self.sparsities)[len(self.sparsities) // 2]


__all__ = ["EntrainmentConfig", "SPARSITY_RANGE"]
