"""Selective steering: add the value direction at the chosen layers only and read the forced-choice rate on
held-out items against alpha, beside same-norm random vectors at the same layers (several seeds), every rate
with its Wilson interval. A value vector that moves the rate no more than random ones is reported as a null.

    eff = selective_steering(model, vv, test_items, sel.chosen, alphas=[-1, -0.5, 0, 0.5, 1], n_random=4)
    eff.comparison()      # per alpha: value shift, random shifts, whether the value one is larger, Fisher p
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.evals.rates import Rate, fisher_greater, wilson
from interp.models import Model
from interp.sites import parse_site
from interp.studies.directions.moved import moved_into
from interp.studies.directions.values import ValueVectors, item_norms, steer_at
from interp.studies.directions.values_choice import PoleMetric, ValueStudyConfig, check_items
from interp.studies.directions.values_data import ChoiceItem
from interp.values import Prompts, Runtime, moved_keywords
from probes.objects import Direction
from steering.sweep import SweepConfig, alpha_sweep

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class SteeringEffect(Result):
    """Counts of pole choices among ``n`` held-out items: ``baseline_k``, ``value_k [n_alphas]`` and
    ``random_k [n_random, n_alphas]`` (same-norm random vectors, ``seeds``), and the matching mean pole
    probabilities ``*_p``; steered at ``layers`` with alpha in residual-norm units."""

    alphas: list[float]
    layers: list[int]
    n: int
    baseline_k: int
    value_k: torch.Tensor
    random_k: torch.Tensor
    baseline_p: float
    value_p: torch.Tensor
    random_p: torch.Tensor
    seeds: list[int]
    model_id: str
    label: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def _rate(self, k: Any) -> torch.Tensor:
        return torch.as_tensor(k, dtype=torch.float64) / self.n

    @property
    def value_rate(self) -> torch.Tensor:
        return self._rate(self.value_k)

    @property
    def random_rate(self) -> torch.Tensor:
        return self._rate(self.random_k)

    @property
    def baseline_rate(self) -> float:
        return self.baseline_k / self.n

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the baseline pole rate (95% interval) and, per alpha, the value vector's rate with
        its interval, its shift, the random vectors' mean shift, whether it exceeds every random one and
        Fisher's p; ``n`` items, the layers and the random seeds."""
        comp = self.comparison().to_dict("records")
        per = {f"{r['alpha']:g}": {"rate": float(self.value_rate[i]), "ci95": list(wilson(int(self.value_k[i]), self.n)),
                                  **{k: r[k] for k in ("value_shift", "random_shift_mean", "value_exceeds_random",
                                                       "fisher_p")}} for i, r in enumerate(comp)}
        return {"label": self.label, "layers": list(self.layers), "n": self.n, "n_random": len(self.seeds),
                "baseline_rate": self.baseline_rate, "baseline_ci95": list(wilson(self.baseline_k, self.n)),
                "by_alpha": per}

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (condition, seed, alpha) with the rate, its count and Wilson interval."""
        import pandas as pd

        rows = [_row("baseline", None, None, self.baseline_k, self.n, self.baseline_p)]
        for i, a in enumerate(self.alphas):
            rows.append(_row("value", None, a, int(self.value_k[i]), self.n, float(self.value_p[i])))
            for j, s in enumerate(self.seeds):
                rows.append(_row("random", s, a, int(self.random_k[j, i]), self.n, float(self.random_p[j, i])))
        df = pd.DataFrame(rows)
        df["layers"], df["label"], df["model_id"] = str(self.layers), self.label, self.model_id
        return df

    def comparison(self) -> Any:
        """Per alpha: the value vector's rate shift from baseline, the random vectors' (mean and largest in size),
        whether the value shift is larger than every random one, and Fisher's one-sided p of the value rate
        against the pooled random rate in the value shift's direction."""
        import pandas as pd

        rows = []
        for i, a in enumerate(self.alphas):
            kv, kr = int(self.value_k[i]), int(self.random_k[:, i].sum())
            nr = self.n * len(self.seeds)
            dv = kv / self.n - self.baseline_rate
            dr = self.random_rate[:, i] - self.baseline_rate
            p = float("nan") if not nr else (fisher_greater(kv, self.n, kr, nr) if dv >= 0 else
                                              fisher_greater(kr, nr, kv, self.n))
            rows.append({"alpha": a, "value_shift": dv, "random_shift_mean": float(dr.mean()) if nr else float("nan"),
                         "random_shift_max_abs": float(dr.abs().max()) if nr else float("nan"),
                         "value_exceeds_random": bool(nr and abs(dv) > float(dr.abs().max())), "fisher_p": p,
                         "value_p_shift": float(self.value_p[i]) - self.baseline_p})
        return pd.DataFrame(rows)

    def plot(self, title: str | None = None) -> Any:
        from interp.viz.directions_values import rate_vs_alpha

        ci = [wilson(int(k), self.n) for k in self.value_k.tolist()]
        rci = [[wilson(int(k), self.n) for k in row] for row in self.random_k.tolist()]
        return rate_vs_alpha(self.alphas, self.value_rate, ci, self.random_rate, rci, self.baseline_rate,
                             title=title or f"forced-choice pole rate vs alpha at layers {self.layers} "
                                            f"({self.label}, {self.n} items)")


def _row(condition: str, seed: Any, alpha: Any, k: int, n: int, p: float) -> dict[str, Any]:
    return {"condition": condition, "seed": seed, "alpha": alpha, **Rate(k, n).columns(), "p_pole": p}


def _direction(vectors: ValueVectors | Direction) -> Direction:
    if isinstance(vectors, ValueVectors):
        return vectors.direction
    if isinstance(vectors, Direction):
        return vectors
    raise TypeError(f"vectors must be ValueVectors or a probes Direction, got {type(vectors).__name__}")


@moved_keywords(moved_into(ValueStudyConfig, ["alphas", "n_random", "chat"]))
def selective_steering(model: Model, vectors: ValueVectors | Direction, items: Sequence[ChoiceItem],
                       layers: Sequence[int], *, norms: Any = None, label: str = "",
                       config: ValueStudyConfig | None = None, runtime: Runtime | None = None) -> SteeringEffect:
    """Forced-choice pole rate on ``items`` vs ``config.alphas`` (residual-norm units) when the direction is added
    at ``layers`` only, against ``config.n_random`` same-norm random vectors (seeds from ``runtime.seed``) at the
    same layers (``steering.alpha_sweep``)."""
    cfg, run = config or ValueStudyConfig(), Runtime.of(runtime)
    alphas, n_random, seed, batch_size = cfg.alphas, cfg.n_random, run.seed, run.batch_size
    direction = _direction(vectors)
    ids = check_items(model, items, balanced=True)
    layers = sorted({int(x) for x in layers})
    if not layers:
        raise ValueError("no layers to steer; pass select_layers(...).chosen or a list of layers")
    have = {int(x) for x in direction.layers}
    if not set(layers) <= have:
        raise ValueError(f"the direction has no vector at layers {sorted(set(layers) - have)}; it covers {sorted(have)}")
    c = cfg.chat
    norms = item_norms(model, direction, items, cfg) if norms is None else norms
    metric = PoleMetric(ids, items)
    sweep = alpha_sweep(model, Prompts([i.prompt(c) for i in items], chat=c),
                        lambda a: steer_at(direction, layers, a, norms), alphas, metric, on="logits",
                        config=SweepConfig(n_random=n_random),
                        runtime=Runtime(batch_size=batch_size, seed=seed, progress=False))
    calls = metric.calls
    A, S = len(sweep.alphas), n_random
    if len(calls) != 1 + A * (1 + S):
        raise RuntimeError(f"alpha_sweep ran {len(calls)} conditions, expected {1 + A * (1 + S)}")
    cond = torch.tensor([float(r.chose_pole.float().mean()) for r in calls])
    expect = torch.cat([torch.tensor([sweep.baseline]),
                        torch.cat([sweep.steered[:, None], sweep.random.T], 1).reshape(-1)]).float()
    if not torch.allclose(cond.float(), expect, atol=1e-6):
        raise RuntimeError("the recorded conditions do not match alpha_sweep's order (baseline, then per alpha the "
                           "steered run and each random seed)")
    k = torch.tensor([int(r.chose_pole.sum()) for r in calls])
    p = torch.tensor([float(r.p_pole.mean()) for r in calls])
    grid_k, grid_p = k[1:].reshape(A, 1 + S), p[1:].reshape(A, 1 + S)
    return SteeringEffect(list(sweep.alphas), layers, len(items), int(k[0]), grid_k[:, 0], grid_k[:, 1:].T.contiguous(),
                          float(p[0]), grid_p[:, 0], grid_p[:, 1:].T.contiguous(), list(sweep.seeds), model.name, label,
                          {"site": parse_kind(direction), "chat": c})


def parse_kind(direction: Direction) -> str:
    return parse_site(direction.sites[0]).kind


__all__ = ["SteeringEffect", "selective_steering"]
