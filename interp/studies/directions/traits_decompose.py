"""A behaviour direction (e.g. sycophancy, from a contrast of system prompts) decomposed onto the trait
directions: least squares on one level step of each trait per layer, bootstrap intervals over every item that
fitted a direction, and the R^2 random vectors of the same norm get."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.activations import Activations
from interp.bundle import Result
from interp.evals.bootstrap import percentile_interval
from interp.studies.directions.traits import TraitScales, affine_to_levels
from probes import diff_of_means, graded_direction

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Decomposition(Result):
    """``target ~ sum_t coef[t] * (one level step of trait t)`` per layer, by least squares.

    ``coef [n_layers, n_traits]`` (level steps of each trait in the target direction), ``r2 [n_layers]`` (share
    of the target's squared norm the traits explain), ``coef_lo`` / ``coef_hi`` / ``r2_lo`` / ``r2_hi``
    (bootstrap 95% over the items of the target and of every trait), ``random_r2 [n_layers]`` (mean R^2 of
    random vectors of the target's norm: what any direction gets), ``layers`` (model layers), ``report``
    (indices of the layers summarised, with ``report_note`` saying which)."""

    traits: list[str]
    layers: list[int]
    coef: torch.Tensor
    coef_lo: torch.Tensor
    coef_hi: torch.Tensor
    r2: torch.Tensor
    r2_lo: torch.Tensor
    r2_hi: torch.Tensor
    random_r2: torch.Tensor
    report: list[int]
    report_note: str
    target: str = "target"
    n_boot: int = 0
    model_id: str = ""
    boot: torch.Tensor | None = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: R^2 (and the random control's) over the report layers, each trait's coefficient with
        its bootstrap interval (:meth:`table`)."""
        rows = json.loads(self.table().to_json(orient="records"))
        return {"target": self.target, "layers": self.report_note, "r2": float(self.r2[self.report].mean()),
                "random_r2": float(self.random_r2[self.report].mean()),
                "traits": {r["trait"]: {k: r[k] for k in ("coef", "lo", "hi", "excludes_0")} for r in rows}}

    def table(self) -> pd.DataFrame:
        """One row per trait: coefficient averaged over the report layers with its bootstrap interval."""
        import pandas as pd

        r = self.report
        b = self.boot[:, r].mean(1) if self.boot is not None else None              # [B, T]
        ci = torch.stack(percentile_interval(b), 1).float() if b is not None else None  # [T, 2]
        rows = [{"trait": t, "coef": float(self.coef[r, j].mean()),
                 "lo": float(ci[j, 0]) if ci is not None else float("nan"),
                 "hi": float(ci[j, 1]) if ci is not None else float("nan"),
                 "excludes_0": bool(ci is not None and (ci[j, 0] > 0 or ci[j, 1] < 0))}
                for j, t in enumerate(self.traits)]
        df = pd.DataFrame(rows)
        df["r2"], df["random_r2"] = float(self.r2[r].mean()), float(self.random_r2[r].mean())
        df["layers"], df["target"] = self.report_note, self.target
        return df

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([{"layer": layer, "trait": t, "coef": float(self.coef[i, j]),
                              "lo": float(self.coef_lo[i, j]), "hi": float(self.coef_hi[i, j]),
                              "r2": float(self.r2[i]), "random_r2": float(self.random_r2[i]), "reported": i in self.report}
                             for i, layer in enumerate(self.layers) for j, t in enumerate(self.traits)])

    def plot(self) -> Any:
        from interp.viz.directions_traits import interval_bars

        s = self.table()
        return interval_bars(self.traits, [self.target], torch.tensor(s.coef.values), torch.tensor(s.lo.values),
                             torch.tensor(s.hi.values), ylabel="level steps of each trait",
                             title=f"{self.target} onto the trait directions ({self.report_note}; R^2 "
                                   f"{float(s.r2[0]):.2f} vs random {float(s.random_r2[0]):.3f})")


def _steps(X: torch.Tensor, names: list[str], order: list[str]) -> torch.Tensor:
    """One level step ``[L, d]`` of a trait: the graded direction's unit vector times its level spacing."""
    g = graded_direction(X, names, order=order, n_folds=None, warn=False)
    slope, _ = affine_to_levels(g.level_means)
    return g.direction.vectors.double() / slope[:, None]


def _lstsq(steps: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Coefficients ``[L, T]`` of ``target [L, d]`` on ``steps [T, L, d]`` and the R^2 ``[L]`` per layer."""
    A = steps.permute(1, 2, 0)                                                         # [L, d, T]
    coef = torch.linalg.lstsq(A, target[..., None]).solution[..., 0]
    resid = target - (A @ coef[..., None])[..., 0]
    return coef, 1 - resid.pow(2).sum(-1) / target.pow(2).sum(-1).clamp_min(1e-30)


def _resample(groups: list[Any], g: torch.Generator) -> torch.Tensor:
    """Row indices of a bootstrap resample of whole groups (an item's rows travel together)."""
    members: dict[Any, list[int]] = {}
    for i, k in enumerate(groups):
        members.setdefault(k, []).append(i)
    keys = list(members)
    pick = torch.randint(len(keys), (len(keys),), generator=g).tolist()
    return torch.tensor([i for p in pick for i in members[keys[p]]])


def _report_layers(scales: TraitScales, layers: list[int]) -> tuple[list[int], str]:
    bands = [{int(scales[t].graded.direction.layers[j]) for j in scales[t].band} for t in scales.traits]
    common = set.intersection(*bands) if bands else set()
    if common:
        return [i for i, x in enumerate(layers) if x in common], f"layers in every trait's band {sorted(common)}"
    union = set.union(*bands) if bands else set()
    if not union:
        raise ValueError("no trait has a band to report the decomposition on; rerun trait_scales with a looser rule")
    return [i for i, x in enumerate(layers) if x in union], f"no layer is in every band; union of bands {sorted(union)}"


def _trait_data(scales: TraitScales) -> list[tuple[torch.Tensor, list[str], list[str], list[int]]]:
    out = []
    for t in scales.traits:
        a = scales.acts[t]
        out.append((a.tensor.double(), [str(x) for x in a.labels], scales[t].levels, scales.groups[t]))
    return out


def _fit_all(data: list, X: torch.Tensor, y: torch.Tensor, rows: list[torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(coef, r2, target) on all items, or on the resampled ``rows`` (one index tensor per trait, then target)."""
    steps = []
    for i, (Xt, names, order, _) in enumerate(data):
        r = None if rows is None else rows[i]
        steps.append(_steps(Xt if r is None else Xt[r], names if r is None else [names[j] for j in r.tolist()],
                            order))
    r = None if rows is None else rows[-1]
    target = diff_of_means(X if r is None else X[r], y if r is None else y[r]).raw.double()
    coef, r2 = _lstsq(torch.stack(steps), target)
    return coef, r2, target


def decompose(scales: TraitScales, contrast: Activations, *, positive: Any = None, n_boot: int = 200,
              n_random: int = 8, seed: int = 0, target: str = "sycophancy") -> Decomposition:
    """Decompose the contrast's difference of means (``positive`` minus the other label; default the second
    prompt of :func:`~interp.studies.directions.traits_analysis.capture_contrast`) onto one level step of each trait.

    Intervals: ``n_boot`` resamples of the contrast's items and of every trait's statements (each item with all
    its levels), every direction refitted. Control: ``n_random`` random vectors of the target's norm per layer."""
    labels = [str(x) for x in contrast.labels]
    names = list(dict.fromkeys(labels))
    if len(names) != 2:
        raise ValueError(f"the contrast needs two labels, got {names}")
    pos = str(positive) if positive is not None else names[1]
    if pos not in names:
        raise ValueError(f"positive={positive!r} is not a label of the contrast {names}")
    X, y = contrast.tensor.double(), torch.tensor([int(x == pos) for x in labels])
    item = [pid.rsplit(":", 1)[-1] for pid in contrast.prompt_ids]
    data = _trait_data(scales)
    coef, r2, tvec = _fit_all(data, X, y)
    g = torch.Generator().manual_seed(seed)
    boots = [_fit_all(data, X, y, [_resample(d[3], g) for d in data] + [_resample(item, g)])[:2] for _ in range(n_boot)]
    bc = torch.stack([b[0] for b in boots]) if boots else coef[None]
    br = torch.stack([b[1] for b in boots]) if boots else r2[None]
    steps = torch.stack([_steps(d[0], d[1], d[2]) for d in data])
    rnd = torch.randn(n_random, *tvec.shape, generator=g, dtype=torch.float64)
    rnd = rnd / rnd.norm(dim=-1, keepdim=True) * tvec.norm(dim=-1, keepdim=True)
    random_r2 = torch.stack([_lstsq(steps, r)[1] for r in rnd]).mean(0) if n_random else torch.full_like(r2, float("nan"))
    layers = [int(x) for x in scales[scales.traits[0]].graded.direction.layers]
    report, note = _report_layers(scales, layers)
    (clo, chi), (rlo, rhi) = percentile_interval(bc), percentile_interval(br)
    return Decomposition(scales.traits, layers, coef.float(), clo.float(), chi.float(),
                         r2.float(), rlo.float(), rhi.float(), random_r2.float(), report, note,
                         target, n_boot, scales.model_id, bc.float() if boots else None)


__all__ = ["Decomposition", "decompose"]
