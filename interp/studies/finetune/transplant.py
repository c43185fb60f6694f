"""Where does a fine-tune's refusal live? Transplant blocks between an aligned model and its base.

Three measurements, all on the same score (the harmful-specific first-token refusal score: mean refusal log-odds
on harmful prompts minus that on harmless ones, with the aligned model's own refusal tokens):
1. **single blocks, both ways**: each (layer block, attention or MLP) of the aligned model put alone into the base
   (how much refusal it brings) and each block of the base put alone into the aligned model (how much it removes);
2. **greedy search** (:func:`interp.patching.transplants.greedy_transplant`) for the smallest set of aligned blocks that
   gives the base its refusal;
3. **validation by generation** on held-out prompts: refusal rates (95% Wilson intervals, the anchored judge) of
   the base, the aligned model, the base with the found blocks, the aligned model with the base's found blocks,
   and the base with as many blocks of each part drawn at random among the other blocks the fine-tune changed
   (the control; blocks it left untouched, e.g. outside a LoRA's layers, would make it trivially weak).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

import steering
from interp.bundle import Result
from interp.evals.controls import matched_random
from interp.evals.judge import Judge
from interp.evals.logits import refusal_score
from interp.evals.rates import rate_cells
from interp.forward import prepare
from interp.models import Model
from interp.patching.transplants import (
    SearchConfig,
    Transplant,
    TransplantSearch,
    check_compatible,
    differs,
    greedy_transplant,
)
from interp.studies.kit.moved import moved
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.runs import refusal_rate
from interp.studies.kit.scoring import prompt_logits
from interp.studies.kit.stages import find_refusal_tokens
from interp.values import Runtime, moved_keywords

if TYPE_CHECKING:
    import pandas as pd

Block = tuple[tuple[int, ...], str]


@dataclass
class TransplantStudy(Result):
    """``single``: one row per (part, block) with ``into_base`` (score gain of the base carrying that aligned block)
    and ``out_of_aligned`` (score drop of the aligned model carrying the base's block); ``search``: the greedy
    search; ``rates``: one row per condition and split with the refusal rate, ``k``, ``n`` and ``ci95``;
    ``scores``: the base's and the aligned model's scores; ``tokens``: the refusal tokens."""

    single: list[dict[str, Any]]
    search: TransplantSearch
    rates: list[dict[str, Any]]
    scores: dict[str, float]
    tokens: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the base's and the aligned model's scores, the block that moves the score most each
        way, the search's blocks and best score, and refusal (rate, k, n, 95% interval) per condition and split."""
        into = max(self.single, key=lambda r: r["into_base"], default=None)
        out = max(self.single, key=lambda r: r["out_of_aligned"], default=None)
        return {"scores": dict(self.scores),
                "best_into_base": None if into is None else {"block": f"{into['part']}:{into['block']}",
                                                             "gain": into["into_base"]},
                "best_out_of_aligned": None if out is None else {"block": f"{out['part']}:{out['block']}",
                                                                 "drop": out["out_of_aligned"]},
                "found": self.search.summary()["chosen"], "search_best": self.search.best,
                "rates": rate_cells(self.rates, ("condition", "split"))}

    @property
    def found(self) -> list[Block]:
        return list(self.search.chosen)

    def to_frame(self, which: str = "rates") -> pd.DataFrame:
        """``which='rates'`` (validation by generation), ``'single'`` (each block alone) or ``'search'``."""
        import pandas as pd

        if which == "search":
            return self.search.to_frame()
        if which not in ("rates", "single"):
            raise ValueError(f"which must be 'rates', 'single' or 'search', got {which!r}")
        return pd.DataFrame(self.rates if which == "rates" else self.single)

    def plot(self, title: str | None = None) -> Any:
        """Each block alone, both ways: score gain into the base and score drop out of the aligned model."""
        from interp.viz.patching import grid_heatmap

        parts = sorted({r["part"] for r in self.single})
        blocks = sorted({r["block"] for r in self.single}, key=lambda b: int(b.split("-")[0]))
        z = [[next(r[k] for r in self.single if r["part"] == p and r["block"] == b) for b in blocks]
             for k in ("into_base", "out_of_aligned") for p in parts]
        rows = [f"{p}: {k}" for k in ("into base (gain)", "out of aligned (drop)") for p in parts]
        return grid_heatmap(z, blocks, rows, "layers", "transplant", "refusal score change",
                            diverging=True, title=title or "Refusal brought by each aligned block, and removed by each base block")


def _label(b: Block) -> str:
    return f"{b[0][0]}-{b[0][-1]}" if b[0] else b[1]


def refusal_gap(encs_h: list, encs_s: list, tokens: list[int], batch_size: int = 64):
    """``score(model)``: mean refusal log-odds on ``encs_h`` minus that on ``encs_s``."""
    def score(model: Model) -> float:
        h = refusal_score(prompt_logits(model, encs_h, batch_size=batch_size), tokens).mean()
        s = refusal_score(prompt_logits(model, encs_s, batch_size=batch_size), tokens).mean()
        return float(h - s)
    return score


def _apply(model: Model, source: Model, chosen: list[Block]) -> list[Transplant]:
    by_part: dict[str, list[int]] = {}
    for layers, part in chosen:
        by_part.setdefault(part, []).extend(layers)
    return [Transplant(source, sorted(set(ls)), [p]) for p, ls in by_part.items()]


def _single(base: Model, aligned: Model, score: Any, cands: list[Block], s_base: float, s_aligned: float
            ) -> list[dict[str, Any]]:
    rows = []
    for layers, part in cands:
        with steering.apply(base, *_apply(base, aligned, [(layers, part)])):
            into = score(base)
        with steering.apply(aligned, *_apply(aligned, base, [(layers, part)])):
            out = score(aligned)
        rows.append({"part": part, "block": _label((layers, part)), "layers": list(layers),
                     "into_base": into - s_base, "out_of_aligned": s_aligned - out})
    return rows


def _random_blocks(found: list[Block], changed: list[Block], rng: random.Random) -> list[Block] | None:
    """As many blocks of each part as were found, drawn among the blocks the fine-tune changed that were not found
    (``None`` when too few are left: the control cannot be drawn)."""
    try:
        return matched_random(found, lambda b: [c for c in changed if c[1] == b[1]], rng, what="block")
    except ValueError:
        return None


def _rates(base: Model, aligned: Model, found: list[Block], changed: list[Block], data: RefusalData, n_random: int,
           seed: int, max_new_tokens: int, judge: Judge | None) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    conds: list[tuple[str, Model, list]] = [("base", base, []), ("aligned", aligned, []),
                                            ("base + found aligned blocks", base, _apply(base, aligned, found)),
                                            ("aligned + found base blocks", aligned, _apply(aligned, base, found))]
    draws = [_random_blocks(found, changed, rng) for _ in range(n_random if found else 0)]
    conds += [(f"base + random changed aligned blocks (draw {i})", base, _apply(base, aligned, d))
              for i, d in enumerate(draws) if d is not None]
    rows = []
    for name, model, edits in conds:
        for split in ("harmful", "harmless"):
            prompts = getattr(data, split)["test"].instructions
            rows.append({"condition": name, "split": split,
                         **refusal_rate(model, prompts, judge, max_new_tokens, edits),
                         "blocks": [f"{iv.parts[0]}:{','.join(map(str, iv.layers))}" for iv in edits]})
    return rows


@dataclass(frozen=True)
class TransplantConfig:
    """The study's knobs: blocks of ``block_size`` layers, at most ``max_steps`` greedy steps, ``n_random``
    changed-block controls, ``max_new_tokens`` of the judged generations."""

    block_size: int = 3
    max_steps: int = 4
    n_random: int = 3
    max_new_tokens: int = 24

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_steps < 1:
            raise ValueError(f"block_size and max_steps must be >= 1, got {self.block_size} and {self.max_steps}")
        if self.n_random < 0 or self.max_new_tokens < 1:
            raise ValueError(f"n_random must be >= 0 and max_new_tokens >= 1, got {self.n_random} and "
                             f"{self.max_new_tokens}")


DEFAULT_RUNTIME = Runtime(batch_size=64, progress=False)


@moved_keywords(moved(config="TransplantConfig", knobs=("block_size", "max_steps", "n_random", "max_new_tokens")))
def transplant_study(base: Model, aligned: Model, data: RefusalData, parts: tuple[str, ...] = ("attn", "mlp"),
                     judge: Judge | None = None, config: TransplantConfig | None = None,
                     runtime: Runtime | None = None) -> TransplantStudy:
    """Single blocks both ways, a greedy search and validation by generation (see the module docstring).

    ``data``: train prompts choose the refusal tokens (the aligned model's own refusals), val prompts score the
    blocks, test prompts validate. ``base`` and ``aligned`` must share an architecture (a merged adapter).
    ``runtime``: batch size, the controls' ``seed`` and the search's progress bar (default: 64, 0, no bar)."""
    c = config if config is not None else TransplantConfig()
    rt = runtime if runtime is not None else DEFAULT_RUNTIME
    block_size, max_steps, n_random, max_new_tokens = c.block_size, c.max_steps, c.n_random, c.max_new_tokens
    seed, batch_size, progress = rt.seed, rt.batch_size, rt.progress
    check_compatible(base, aligned)
    tok = find_refusal_tokens(aligned, data, judge=judge)
    if not tok.tokens:
        raise ValueError(f"the aligned model {aligned.name!r} refused none of the harmful train prompts, so there is "
                         f"no refusal to locate; check it is the aligned model (merged adapter)")
    encs = {w: prepare(base, getattr(data, w)["val"].instructions)[1] for w in ("harmful", "harmless")}
    score = refusal_gap(encs["harmful"], encs["harmless"], tok.tokens, batch_size)
    n = base.n_layers
    blocks = [tuple(range(i, min(i + block_size, n))) for i in range(0, n, block_size)]
    cands: list[Block] = [(b, p) for p in parts for b in blocks]
    with torch.no_grad():
        s_base, s_aligned = score(base), score(aligned)
        single = _single(base, aligned, score, cands, s_base, s_aligned)
        search = greedy_transplant(base, aligned, score, blocks=blocks, parts=parts,
                                   config=SearchConfig(max_steps=max_steps), runtime=Runtime(progress=progress))
    changed = [c for c in cands if differs(base, aligned, c[0], [c[1]])]
    rates = _rates(base, aligned, list(search.chosen), changed, data, n_random, seed, max_new_tokens, judge)
    return TransplantStudy(single, search, rates, {"base": s_base, "aligned": s_aligned}, list(tok.strings),
                           meta={"block_size": block_size, "parts": list(parts), "max_steps": max_steps,
                                 "n_val": len(encs["harmful"]), "seed": seed, "sizes": data.sizes(),
                                 "changed": [f"{p}:{_label((b, p))}" for b, p in changed]})


__all__ = ["TransplantConfig", "TransplantStudy", "refusal_gap", "transplant_study"]
