"""Families of cue-induced bias directions (leave-one-dataset-out study): for each bias, is "cued vs uncued"
linearly readable at each layer (held-out AUROC, shuffled-label control, a bag-of-tokens lexical baseline),
does the probe transfer to a source dataset it never saw (LODO), and what is its difference-of-means direction.

    items = load_bias_items(n_per_source=60)
    fam = bias_directions(model, items, layers=range(0, 30, 3))
    fam.to_frame(); fam.plot(); fam.overlap().plot()
    causal = bias_causal_test(model, fam, items, "suggested", band=[12, 15, 18])   # biases_causal

Activations are read at the last prompt token (with the chat template where the model has one: the position
the answer is generated from). Each question's cued and uncued copies share one CV group.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

import probes
from interp.bundle import Result
from interp.capturing import capture
from interp.evals.metrics import auroc
from interp.models import Model
from interp.studies.directions.biases_items import BiasItem
from interp.studies.directions.biases_overlap import bias_overlap
from interp.values import Prompts, Runtime, moved_keywords
from probes._choice import LayerChoice, LayerRule, choose
from probes.objects import Direction, Subspace
from probes.subspace import mean_diff_subspace

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class BiasConfig:
    """Settings of :func:`bias_directions`. ``tie_tol``: layers within this AUROC of the best tie (broken by
    Cohen's d, then the middle, never the lowest captured layer while another ties); ``lexical_margin``: a bias
    is lexically separable when the bag-of-tokens probe comes within this of the best layer's AUROC;
    ``transfer_min``: the LODO AUROC (worst held-out source, at the best layer) a direction must reach to transfer;
    ``lexical_l2``: the bag-of-tokens probe's ridge (its features are sparse and outnumber the samples: with a
    weak ridge it fits question-specific tokens and understates how visible the cue is); ``chat``: the model's
    chat template (``False``: plain prompts); ``n_random`` / ``max_items``: the causal test's random directions and
    flipped items."""

    n_folds: int = 5
    seed: int = 0
    tie_tol: float = 0.005
    lexical_margin: float = 0.02
    transfer_min: float = 0.7
    lexical_l2: float = 1.0
    lodo: bool = True
    batch_size: int = 16
    l2: float = 1e-3
    progress: bool = False
    chat: bool = True
    n_random: int = 3
    max_items: int = 40

    def __post_init__(self) -> None:
        if not isinstance(self.chat, bool):
            raise TypeError(f"chat must be True or False, got {self.chat!r}")
        if self.n_random < 1:
            raise ValueError("n_random must be >= 1: the random-direction control is the comparison")


BIAS_MOVED = {"chat": "config=BiasConfig(chat=...)", "n_random": "config=BiasConfig(n_random=...)",
              "max_items": "config=BiasConfig(max_items=...)", "batch_size": "config=BiasConfig(batch_size=...)"}
"""The keywords the bias studies took before ``config=``, and where each went."""


@dataclass
class BiasProbe:
    """One bias: held-out ``auroc`` / ``control_auroc`` ``[n_layers]`` (mean over folds), the lexical baseline's
    XX, the chosen layer and the difference-of-means ``direction`` over every captured layer."""

    bias: str
    sites: list[str]
    auroc: torch.Tensor
    auroc_std: torch.Tensor
    control_auroc: torch.Tensor
    lexical_auroc: float
    choice: LayerChoice
    direction: Direction
    subspace: Subspace | None
    sources: list[str]
    lodo: torch.Tensor | None = None
    lexical_lodo: torch.Tensor | None = None
    n_items: int = 0
    margin: float = 0.02
    transfer_min: float = 0.7

    @property
    def best(self) -> int:
        return self.choice.index

    @property
    def lexically_separable(self) -> bool:
        """The bag-of-tokens baseline is about as good as the best layer's probe: the cue is visible in the words."""
        return self.lexical_auroc >= float(self.auroc[self.best]) - self.margin

    @property
    def transfers(self) -> bool | None:
        """Does the best layer's probe reach ``transfer_min`` on every held-out source (None: no LODO run)?"""
        return None if self.lodo is None else bool(self.lodo[:, self.best].min() >= self.transfer_min)


@dataclass
class BiasFamily(Result):
    """The bias directions of one model: ``probes[bias]`` (:class:`BiasProbe`), on shared ``sites``."""

    model_id: str
    sites: list[str]
    probes: dict[str, BiasProbe]
    config: BiasConfig = field(default_factory=BiasConfig)

    @property
    def biases(self) -> list[str]:
        return list(self.probes)

    def direction(self, bias: str) -> Direction:
        return self.probes[bias].direction

    def to_frame(self) -> pd.DataFrame:
        """One row per (bias, site): AUROC (mean, std), shuffled control, lexical baseline, LODO (worst / mean
        source), whether the site is the chosen layer, and the bias's flags."""
        import pandas as pd

        rows = []
        for b, p in self.probes.items():
            for j, s in enumerate(p.sites):
                rows.append({"bias": b, "site": s, "layer": p.direction.layers[j], "auroc": float(p.auroc[j]),
                             "auroc_std": float(p.auroc_std[j]), "control_auroc": float(p.control_auroc[j]),
                             "lexical_auroc": p.lexical_auroc,
                             "lodo_min": None if p.lodo is None else float(p.lodo[:, j].min()),
                             "lodo_mean": None if p.lodo is None else float(p.lodo[:, j].mean()),
                             "best": j == p.best, "lexically_separable": p.lexically_separable,
                             "transfers": p.transfers, "n_items": p.n_items})
        return pd.DataFrame(rows)

    def at_best_layer(self) -> pd.DataFrame:
        """One row per bias at its chosen layer (the figures to report)."""
        df = self.to_frame()
        return df[df["best"]].reset_index(drop=True)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: per bias, :meth:`at_best_layer`'s row (JSON-ready)."""
        rows = json.loads(self.at_best_layer().to_json(orient="records"))
        return {"model_id": self.model_id, "biases": {r.pop("bias"): r for r in rows},
                "layer_rule": {b: p.choice.rule for b, p in self.probes.items()}}

    def overlap(self, layer: int | None = None) -> Any:
        """Cosines and principal angles between the biases' directions / subspaces (see ``biases_overlap``)."""
        return bias_overlap(self, layer)

    def plot(self, kind: str = "auroc") -> Any:
        """``"auroc"``: AUROC by layer with lexical baseline and shuffled control per bias; ``"lodo"``: LODO bars
        at each bias's chosen layer (with the lexical LODO beside); ``"overlap"``: the cosine heatmap."""
        from interp.viz.directions_biases import auroc_by_layer, lodo_bars

        if kind == "auroc":
            return auroc_by_layer({b: p.auroc for b, p in self.probes.items()},
                                  {b: p.control_auroc for b, p in self.probes.items()},
                                  {b: p.lexical_auroc for b, p in self.probes.items()}, self.sites,
                                  title=f"cued vs uncued: held-out AUROC by layer ({self.model_id})")
        if kind == "lodo":
            rows = {b: (p.lodo[:, p.best].tolist(), p.lexical_lodo.tolist() if p.lexical_lodo is not None else None,
                        p.sources) for b, p in self.probes.items() if p.lodo is not None}
            return lodo_bars(rows, threshold=self.config.transfer_min,
                             title=f"leave-one-dataset-out AUROC at each bias's layer ({self.model_id})")
        if kind == "overlap":
            return self.overlap().plot()
        raise ValueError(f"kind must be 'auroc', 'lodo' or 'overlap', got {kind!r}")


def lexical_features(model: Model, prompts: Prompts | Sequence[str]) -> torch.Tensor:
    """Bag of token ids of each formatted prompt (``Prompts.chat`` / ``system``), ``log1p(count)``, as
    ``[n, 1, n_token_types_seen]``."""
    _, encs = Prompts.of(prompts).encode(model)
    vocab = sorted({t for e in encs for t in e.ids})
    col = {t: j for j, t in enumerate(vocab)}
    X = torch.zeros(len(encs), 1, len(vocab))
    for i, e in enumerate(encs):
        for t in e.ids:
            X[i, 0, col[t]] += 1
    return X.log1p()


def choose_bias_layer(scores: Any, tol: float) -> LayerChoice:
    """Highest AUROC within ``tol``, then Cohen's d, then accuracy, then the middle, except that the lowest
    captured layer is never chosen while another layer ties with it on AUROC (a stated :class:`LayerRule`)."""
    rule = LayerRule(("auroc", "cohens_d", "accuracy"), tol=tol, avoid_lowest=True)
    return choose(rule, {m: scores.mean(m) for m in rule.criteria}, scores.sites)


def _check_items(items: Sequence[BiasItem], lodo: bool) -> dict[str, list[BiasItem]]:
    if not items:
        raise ValueError("no items; load some with interp.studies.directions.biases_items.load_bias_items()")
    by_bias: dict[str, list[BiasItem]] = {}
    for it in items:
        by_bias.setdefault(it.bias, []).append(it)
    for bias, its in by_bias.items():
        sources = sorted({i.source for i in its})
        if lodo and len(sources) < 2:
            raise ValueError(f"bias {bias!r} has items from one source dataset only ({sources[0]!r}); leave-one-"
                             f"dataset-out needs two or more: add items from another source or pass lodo=False")
        if len(its) < 2 * 2:
            raise ValueError(f"bias {bias!r} has {len(its)} items; cross-validation needs at least 4 questions")
    return by_bias


def _mean_diff_lodo(X: torch.Tensor, y: torch.Tensor, source: list[str]) -> torch.Tensor:
    """Leave-one-dataset-out AUROC ``[n_sources]`` (sorted names) of a difference of means on the first layer of ``X``."""
    out = []
    for s in sorted(set(source)):
        held = torch.tensor([x == s for x in source])
        d = probes.diff_of_means(X[~held], y[~held])
        out.append(float(auroc(d.project(X[held])[:, 0], y[held])))
    return torch.tensor(out)


def _fit_bias(bias: str, X: torch.Tensor, X_lex: torch.Tensor, its: list[BiasItem], sites: list[str],
              cfg: BiasConfig, model_id: str = "") -> BiasProbe:
    """Probe, controls, lexical baseline, LODO and direction of one bias from ``X [2m, L, d]`` (uncued first)."""
    y = torch.tensor([0] * len(its) + [1] * len(its))
    groups = [i.item for i in its] * 2
    source = [i.source for i in its] * 2
    kw = dict(groups=groups, runtime=Runtime(seed=cfg.seed, progress=False))
    cv = probes.cross_validate(X, y, config=probes.CVConfig(cfg.n_folds, l2=cfg.l2, control=True), **kw)
    lex = probes.cross_validate(X_lex, y, config=probes.CVConfig(cfg.n_folds, l2=cfg.lexical_l2, control=False), **kw)
    lex_md = probes.cross_validate(X_lex, y, method="mean_diff", config=probes.CVConfig(cfg.n_folds, control=False), **kw)
    lodo = lex_lodo = None
    if cfg.lodo:
        lodo = probes.transfer_matrix(X, y, datasets=source, groups=groups, n_folds=cfg.n_folds, seed=cfg.seed,
                                      l2=cfg.l2).lodo
        lex_lodo = probes.transfer_matrix(X_lex, y, datasets=source, groups=groups, n_folds=cfg.n_folds,
                                          seed=cfg.seed, l2=cfg.lexical_l2).lodo[:, 0]
        lex_lodo = torch.maximum(lex_lodo, _mean_diff_lodo(X_lex, y, source))
    direction = probes.diff_of_means(X, y)
    meta = {"bias": bias, "n_items": len(its)}
    direction = Direction(vectors=direction.vectors, norms=direction.norms, sites=list(sites),
                          **direction.provenance_kwargs(model_id=model_id, meta=meta))
    sub = mean_diff_subspace(X, y, groups=source) if len(set(source)) > 1 else None
    if sub is not None:
        sub = Subspace(bases=sub.bases, strengths=sub.strengths, sites=list(sites),
                       **sub.provenance_kwargs(model_id=model_id, meta=meta))
    control = cv.control_auroc.nanmean(0) if cv.control_auroc is not None else torch.full((len(sites),), float("nan"))
    return BiasProbe(bias=bias, sites=list(sites), auroc=cv.mean("auroc"), auroc_std=cv.auroc.std(0),
                     control_auroc=control, lexical_auroc=max(float(lex.mean("auroc")[0]), float(lex_md.mean("auroc")[0])),
                     choice=choose_bias_layer(cv, cfg.tie_tol), direction=direction, subspace=sub,
                     sources=sorted(set(source)), lodo=lodo, lexical_lodo=lex_lodo, n_items=len(its),
                     margin=cfg.lexical_margin, transfer_min=cfg.transfer_min)


def capture_items(model: Model, items: Sequence[BiasItem], layers: Sequence[int], config: BiasConfig | None = None
                  ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Last-token ``resid_post`` of every distinct prompt (uncued prompts shared across biases run once):
    ``{prompt: [L, d]}`` and the site names."""
    prompts = list(dict.fromkeys([i.uncued for i in items] + [i.cued for i in items]))
    cfg = config or BiasConfig()
    acts = capture(model, Prompts(prompts, chat=cfg.chat), sites="resid_post", layers=list(layers),
                   positions="last",
                   runtime=Runtime(batch_size=cfg.batch_size, progress=cfg.progress, sort_by_length=True))
    return dict(zip(prompts, acts.tensor, strict=True)), list(acts.sites)


@moved_keywords(BIAS_MOVED)
def bias_directions(model: Model, items: Sequence[BiasItem], layers: Sequence[int] | None = None,
                    config: BiasConfig | None = None) -> BiasFamily:
    """Probe every bias in ``items`` at ``layers`` (default all) and fit its difference-of-means direction.

    ``config.chat``: format with the chat template (default ``True``). Raises when a bias has a single source
    dataset and ``config.lodo`` is on. Returns a :class:`BiasFamily`.
    """
    cfg = config or BiasConfig()
    by_bias = _check_items(items, cfg.lodo)
    layers = list(range(model.n_layers)) if layers is None else sorted(set(int(x) for x in layers))
    acts, sites = capture_items(model, items, layers, cfg)
    out = {}
    for bias, its in by_bias.items():
        prompts = [i.uncued for i in its] + [i.cued for i in its]
        X = torch.stack([acts[p] for p in prompts])
        out[bias] = _fit_bias(bias, X, lexical_features(model, Prompts(prompts, chat=cfg.chat)), its, sites, cfg,
                             model.name)
    return BiasFamily(model_id=model.name, sites=sites, probes=out, config=cfg)


__all__ = ["BIAS_MOVED", "bias_directions", "BiasConfig", "BiasFamily", "BiasProbe", "capture_items", "choose_bias_layer",
           "lexical_features"]
