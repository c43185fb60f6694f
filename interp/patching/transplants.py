"""Component transplant: copy attention / MLP / whole-block (and embedding, final norm, unembedding) weights of
chosen layers from a source model into a target of the same architecture, temporarily (a context manager that
restores the target) or into a copy; and a greedy search over layer blocks that maximises a score.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from interp.bundle import Result
from interp.models import Model
from interp.patching.progress import progress_bar
from interp.values import Runtime, moved_keywords

if TYPE_CHECKING:
    import pandas as pd

BLOCK_PARTS = ("attn", "mlp", "norms", "block")
GLOBAL_PARTS = ("embed", "final_norm", "unembed")


def check_compatible(target: Model, source: Model) -> None:
    """Same family, same layer count, and the same parameter names and shapes."""
    target.require_local("the weight edit (transplant)")
    if target.spec.family != source.spec.family:
        raise ValueError(f"cannot transplant between architectures: target is {target.spec.family!r}, source is "
                         f"{source.spec.family!r}; both models must share the architecture")
    if target.n_layers != source.n_layers:
        raise ValueError(f"target has {target.n_layers} layers but source has {source.n_layers}; transplant needs "
                         f"the same architecture")
    ts = {k: tuple(v.shape) for k, v in target.hf.state_dict().items()}
    ss = {k: tuple(v.shape) for k, v in source.hf.state_dict().items()}
    if ts.keys() != ss.keys():
        diff = sorted(ts.keys() ^ ss.keys())[:5]
        raise ValueError(f"target and source have different parameters (e.g. {diff}); same architecture needed")
    bad = [k for k in ts if ts[k] != ss[k]]
    if bad:
        raise ValueError(f"parameter {bad[0]} has shape {ts[bad[0]]} in the target but {ss[bad[0]]} in the source; "
                         f"the configs differ (width, heads, vocabulary)")


def _modules(model: Model, part: str, layer: int | None) -> list[nn.Module]:
    spec = model.spec
    if part == "attn":
        return [model.module(spec.attn, layer)]
    if part == "mlp":
        return [model.module(spec.mlp, layer)]
    if part == "norms":
        return [model.module(n, layer) for n in spec.norms]
    if part == "block":
        return [model.block(layer)]
    if part == "embed":
        mods = [model.module(spec.embed)]
        return mods + ([model.module(spec.pos_embed)] if spec.pos_embed else [])
    if part == "final_norm":
        return [model.module(spec.final_norm)]
    if part == "unembed":
        return [model.module(spec.unembed)]
    raise ValueError(f"unknown part {part!r}; per-layer parts: {BLOCK_PARTS}, global parts: {GLOBAL_PARTS}")


def _pairs(target: Model, source: Model, layers: Sequence[int], parts: Sequence[str]
           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(target tensor, source tensor) for every parameter and buffer touched, each target tensor once."""
    if isinstance(parts, str):
        parts = [parts]
    seen: set[int] = set()
    out = []
    L = target.n_layers
    norm_layers = []
    for la in layers:
        if not isinstance(la, int) or not -L <= la < L:
            raise ValueError(f"layer {la!r} is out of range; the models have layers 0..{L - 1}")
        norm_layers.append(la % L)
    jobs: list[tuple[str, int | None]] = []
    for p in parts:
        if p in BLOCK_PARTS:
            jobs += [(p, la) for la in norm_layers]
        elif p in GLOBAL_PARTS:
            jobs.append((p, None))
        else:
            raise ValueError(f"unknown part {p!r}; per-layer parts: {BLOCK_PARTS}, global parts: {GLOBAL_PARTS}")
    for part, la in jobs:
        for tm, sm in zip(_modules(target, part, la), _modules(source, part, la), strict=True):
            st = dict(sm.named_parameters())
            st.update(dict(sm.named_buffers()))
            for name, t in list(tm.named_parameters()) + list(tm.named_buffers()):
                if id(t) in seen or name not in st:
                    continue
                seen.add(id(t))
                out.append((t, st[name]))
    if any(t.device.type == "meta" or s.device.type == "meta" for t, s in out):
        raise ValueError("transplant copies weights in memory, but some it touches are offloaded by a device_map (to the "
                         "CPU or disk, on the meta device outside the forward pass); transplant between plain copies: "
                         "interp.models.materialize(model)")
    return out


def differs(target: Model, source: Model, layers: Sequence[int], parts: Sequence[str] = ("attn", "mlp")) -> bool:
    """Whether any weight a transplant of ``parts`` of ``layers`` would copy differs between the two models (a block
    a fine-tune left untouched, e.g. outside a LoRA's layers, does not)."""
    check_compatible(target, source)
    return any(not torch.equal(t, s.to(t.device, t.dtype)) for t, s in _pairs(target, source, layers, parts))


@dataclass
class Transplant:
    """The weight edit of the edit protocol: ``source``'s weights for ``parts`` of ``layers`` (and global parts
    such as ``embed``) in the target, for the duration of ``steering.apply`` (``weights(model)``), composable
    with activation edits; the target's own weights come back on exit, also on error."""

    source: Model
    layers: Sequence[int]
    parts: Sequence[str] = ("attn", "mlp")

    @contextmanager
    def weights(self, model: Model) -> Iterator[Model]:
        check_compatible(model, self.source)
        pairs = _pairs(model, self.source, self.layers, self.parts)
        saved = [t.detach().clone() for t, _ in pairs]
        try:
            with torch.no_grad():
                for t, s in pairs:
                    t.copy_(s.to(t.device, t.dtype))
            yield model
        finally:
            with torch.no_grad():
                for (t, _), old in zip(pairs, saved, strict=True):
                    t.copy_(old)


@contextmanager
def transplant(target: Model, source: Model, layers: Sequence[int], parts: Sequence[str] = ("attn", "mlp")
               ) -> Iterator[Model]:
    """Within the block, ``target`` carries ``source``'s weights for ``parts`` of ``layers`` (and any global
    parts such as ``embed``); the target's own weights come back on exit, also on error. A :class:`Transplant` alone."""
    with Transplant(source, layers, parts).weights(target) as model:
        yield model


def transplanted(target: Model, source: Model, layers: Sequence[int], parts: Sequence[str] = ("attn", "mlp")) -> Model:
    """A new model: a deep copy of ``target`` carrying ``source``'s ``parts`` of ``layers`` (the target is untouched)."""
    check_compatible(target, source)
    clone = Model(hf=copy.deepcopy(target.hf), tokenizer=target.tokenizer, spec=target.spec,
                  name=f"{target.name}+{source.name}[{','.join(map(str, layers))}:{','.join(parts)}]")
    with torch.no_grad():
        for t, s in _pairs(clone, source, layers, parts):
            t.copy_(s.to(t.device, t.dtype))
    return clone


@dataclass
class TransplantSearch(Result):
    """Greedy search result: ``trajectory[i]`` is the candidate added at step ``i`` and the score after it;
    ``chosen`` the candidates kept; ``baseline`` the target's score, ``source_score`` the source's."""

    trajectory: list[dict[str, Any]]
    chosen: list[tuple[tuple[int, ...], str]]
    baseline: float
    source_score: float | None
    evaluations: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> float:
        return max([self.baseline] + [t["score"] for t in self.trajectory])

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the target's and the source's scores, the best score reached, the blocks kept
        (``part`` and layers), steps taken and candidates evaluated."""
        return {"baseline": self.baseline, "source_score": self.source_score, "best": self.best,
                "gain": self.best - self.baseline, "chosen": [f"{p} {','.join(map(str, la))}".strip()
                                                          for la, p in self.chosen],
                "n_steps": len(self.trajectory), "evaluations": self.evaluations}

    def to_frame(self) -> pd.DataFrame:
        """One row per greedy step: ``step``, ``part``, ``first_layer`` / ``last_layer`` (nullable ints; none
        for global parts), ``layers`` (as text), ``score``, ``gain`` and ``tried`` (candidates scored)."""
        import pandas as pd

        rows = [{"step": t["step"], "part": t["part"], "first_layer": min(t["layers"]) if t["layers"] else None,
                 "last_layer": max(t["layers"]) if t["layers"] else None,
                 "layers": ",".join(map(str, t["layers"])), "score": t["score"], "gain": t["gain"],
                 "tried": len(t["tried"])} for t in self.trajectory]
        frame = pd.DataFrame(rows, columns=["step", "part", "first_layer", "last_layer", "layers", "score", "gain",
                                            "tried"])
        for c in ("first_layer", "last_layer"):
            frame[c] = frame[c].astype("Int64")
        frame.attrs.update(baseline=self.baseline, source_score=self.source_score)
        return frame

    def plot(self, title: str | None = None) -> Any:
        """Score after each added block, with the target's and the source's scores as lines."""
        from interp.viz.patching import transplant_trajectory

        return transplant_trajectory(self, title=title)


@dataclass(frozen=True)
class SearchConfig:
    """When :func:`greedy_transplant` stops: after ``max_steps`` additions (``None``: when no candidate is left)
    or when no candidate gains more than ``min_gain``; ``score_source``: also score the source model itself."""

    max_steps: int | None = None
    min_gain: float = 0.0
    score_source: bool = True

    def __post_init__(self) -> None:
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError(f"max_steps must be >= 0 or None, got {self.max_steps}")


SEARCH_MOVED = {"progress": "runtime=interp.Runtime(progress=...)",
                **{f.name: f"config=interp.patching.SearchConfig({f.name}=...)" for f in fields(SearchConfig)}}


@moved_keywords(SEARCH_MOVED)
def greedy_transplant(target: Model, source: Model, score: Callable[[Model], float],
                      blocks: Sequence[Sequence[int]] | None = None, block_size: int = 1,
                      parts: Sequence[str] = ("attn", "mlp"), config: SearchConfig | None = None,
                      runtime: Runtime | None = None) -> TransplantSearch:
    """Greedily add the (layer block, part) whose transplant raises ``score(target)`` most, until the search stops
    (``config``: :class:`SearchConfig`). ``blocks`` default: consecutive groups of ``block_size`` layers; global
    parts (``embed``, ``final_norm``, ``unembed``) are single candidates. The target is restored afterwards.
    ``runtime.progress``: a bar over the score evaluations (its total is the most the search could need; it stops
    early when no candidate gains)."""
    cfg, progress = config or SearchConfig(), Runtime.of(runtime).progress
    max_steps, min_gain, score_source = cfg.max_steps, cfg.min_gain, cfg.score_source
    check_compatible(target, source)
    if isinstance(parts, str):
        parts = [parts]
    if blocks is None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        blocks = [tuple(range(i, min(i + block_size, target.n_layers))) for i in range(0, target.n_layers, block_size)]
    cands = [((), p) for p in parts if p in GLOBAL_PARTS]
    cands += [(tuple(int(x) for x in b), p) for b in blocks for p in parts if p not in GLOBAL_PARTS]
    for b, p in cands:
        _pairs(target, source, b, [p])                                   # validate early

    def evaluate(chosen: list[tuple[tuple[int, ...], str]]) -> float:
        with _stack(target, source, chosen):
            value = score(target)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                return float(value)
            raise ValueError(f"score must return one number for the model, got {type(value).__name__}")
        return float(value)

    steps = len(cands) if max_steps is None else max_steps
    bar = progress_bar(1 + sum(len(cands) - i for i in range(min(steps, len(cands)))) + int(score_source),
                       "transplant search", progress, unit="eval")
    try:
        return _search(target, source, score, cands, steps, min_gain, score_source, evaluate, bar,
                       meta={"parts": list(parts), "blocks": [list(b) for b in blocks]})
    finally:
        bar.close()


def _search(target: Model, source: Model, score: Callable[[Model], float], cands: list, steps: int,
            min_gain: float, score_source: bool, evaluate: Callable[[list], float], bar: Any,
            meta: dict[str, Any]) -> TransplantSearch:
    """The greedy loop of :func:`greedy_transplant`, ticking ``bar`` once per evaluation."""
    def tick(chosen: list) -> float:
        value = evaluate(chosen)
        bar.update(1)
        return value

    baseline = tick([])
    current, chosen, traj, n_eval = baseline, [], [], 1
    remaining = list(cands)
    for step in range(steps):
        if not remaining:
            break
        scored = [(tick(chosen + [c]), c) for c in remaining]
        n_eval += len(scored)
        best, cand = max(scored, key=lambda t: t[0])
        if best - current <= min_gain:
            break
        chosen.append(cand)
        remaining.remove(cand)
        traj.append({"step": step, "layers": list(cand[0]), "part": cand[1], "score": best, "gain": best - current,
                     "tried": {_label(c): s for s, c in scored}})
        current = best
        bar.set_postfix(score=f"{best:.4g}", refresh=False)
    src = None
    if score_source:
        src = float(score(source))
        bar.update(1)
    return TransplantSearch(traj, chosen, baseline, src, n_eval, meta=meta)


def _label(cand: tuple[tuple[int, ...], str]) -> str:
    return cand[1] if not cand[0] else f"{cand[1]}:{','.join(map(str, cand[0]))}"


@contextmanager
def _stack(target: Model, source: Model, chosen: Sequence[tuple[tuple[int, ...], str]]) -> Iterator[None]:
    if not chosen:
        yield
        return
    by_part: dict[str, list[int]] = {}
    for b, p in chosen:
        by_part.setdefault(p, []).extend(b)
    with contextlib_nest([transplant(target, source, sorted(set(ls)), [p]) for p, ls in by_part.items()]):
        yield


@contextmanager
def contextlib_nest(cms: list) -> Iterator[None]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        for cm in cms:
            stack.enter_context(cm)
        yield


__all__ = ["transplant", "transplanted", "check_compatible", "differs", "greedy_transplant", "TransplantSearch",
           "BLOCK_PARTS", "GLOBAL_PARTS"]
