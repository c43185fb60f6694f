"""The entrainment study in one call: the effect per context kind, heads by a mask sweep, their ablation against
layer-matched random heads and their attention to the context token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from interp.bundle import Result
from interp.models import Model
from interp.studies.entrainment.config import EntrainmentConfig
from interp.studies.entrainment.data import EntrainmentSet, load_entrainment, make_pairs
from interp.studies.entrainment.effect import EntrainmentEffect, entrainment_effect
from interp.studies.entrainment.heads import (
    ContextAttention,
    HeadAblationCheck,
    HeadSweep,
    ablation_check,
    context_attention,
    find_heads,
)
from interp.values import Runtime

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class EntrainmentStudy(Result):
    """The stages' results: ``effect``, the mask ``sweep``, the ``ablation`` check and the ``attention``."""

    model_id: str
    effect: EntrainmentEffect
    sweep: HeadSweep
    ablation: HeadAblationCheck
    attention: ContextAttention
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Each stage's summary under its name."""
        return {"model_id": self.model_id, "effect": self.effect.summary(), "sweep": self.sweep.summary(),
                "ablation": self.ablation.summary(), "attention": self.attention.summary(), **self.meta}

    def to_frame(self) -> pd.DataFrame:
        """The per-pair effect rows (:meth:`EntrainmentEffect.to_frame`)."""
        return self.effect.to_frame()

    def plot(self, stage: str = "effect", **kw: Any) -> Any:
        """The figure of one stage: ``effect``, ``sweep``, ``ablation``, ``attention`` (bars of the attention to the
        context token) or ``pattern`` (the found heads' attention patterns on the example prompt)."""
        if stage == "pattern":
            return self.attention.plot(kind="pattern", **kw)
        if stage not in ("effect", "sweep", "ablation", "attention"):
            raise ValueError(f"stage must be 'effect', 'sweep', 'ablation', 'attention' or 'pattern', got {stage!r}")
        return getattr(self, stage).plot(**kw)

    def pattern_figure(self, model: Model) -> Any:
        """Attention patterns of the found heads of the first head's layer on the example prompt
        (:func:`interp.look.heads.pattern_figure`)."""
        from interp.look.heads import pattern_figure

        layer = self.sweep.heads[0][0]
        return pattern_figure(model, self.attention.example, layer, [h for la, h in self.sweep.heads if la == layer])


def entrainment_study(model: Model, data: EntrainmentSet | None = None, config: EntrainmentConfig | None = None,
                      runtime: Runtime | None = None) -> EntrainmentStudy:
    """Run every stage on ``data`` (default: our 68-item set) with ``config`` (see :class:`EntrainmentConfig`)."""
    cfg, run = config or EntrainmentConfig(), Runtime.of(runtime)
    data = data if data is not None else load_entrainment()
    effect = entrainment_effect(model, data, cfg.kinds, cfg.chat, cfg.n_boot, cfg.seed, run.batch_size)
    pairs = make_pairs(model, data, cfg.mask_kind)
    sweep = find_heads(model, pairs, cfg)
    check = ablation_check(model, data, pairs, sweep.heads, cfg, run)
    attn = context_attention(model, pairs, sweep.heads, cfg.chat, cfg.seed, run.batch_size)
    return EntrainmentStudy(model.name, effect, sweep, check, attn,
                            {"mask_kind": cfg.mask_kind, "n_items": len(data)})


__all__ = ["EntrainmentStudy", "entrainment_study"]
