"""Attribution patching: the first-order estimate ``grad(metric) . (source_act - target_act)`` for every site,
layer, position, head and neuron from one forward of the source run and one forward + backward of the target.

It predicts what exact patching measures (``patched metric - target metric``); :func:`compare_attribution`
runs both and reports the Pearson correlation per site type. It is exact when the metric is linear in the site
(a site followed only by linear maps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.models import Model
from interp.patching.activation import Edit, prepare_patching, run_variants, sweep_heads, sweep_positions
from interp.patching.measures import Metric, call_metric, metric_name
from interp.patching.progress import progress_bar
from interp.patching.results import Sweep
from interp.patching.runs import (
    MOVED,
    PromptPairs,
    check_pairs,
    check_runs,
    gather_aligned,
    patch_runtime,
    run_with_capture,
)
from interp.sites import Site, expand_sites
from interp.values import Runtime, moved_keywords

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_KINDS = ("resid_pre", "attn_out", "mlp_out", "attn_z", "mlp_post")


@dataclass
class Attribution(Result):
    """Estimated metric after patching each cell. ``sweeps[kind]``: ``[L, P]`` for whole sites, ``[L, H]`` for
    ``attn_z`` and ``[L, d_mlp]`` for ``mlp_post`` (summed over positions, i.e. patching every aligned position);
    ``per_position[kind]``: the unsummed ``[L, P, (H | d_mlp)]`` deltas."""

    sweeps: dict[str, Sweep]
    per_position: dict[str, torch.Tensor]
    baseline: float
    reference: float

    def summary(self) -> dict[str, Any]:
        """Headline numbers: baseline and reference metrics and, per kind, its sweep's largest cell."""
        return {"baseline": self.baseline, "reference": self.reference,
                "kinds": {k: {n: v for n, v in sw.summary().items() if n.startswith("top_") or n == "n_cells"}
                          for k, sw in self.sweeps.items()}}

    def __getitem__(self, kind: str) -> Sweep:
        if kind not in self.sweeps:
            raise KeyError(f"no attribution for {kind!r}; computed: {list(self.sweeps)}")
        return self.sweeps[kind]

    def to_frame(self) -> pd.DataFrame:
        """Every kind's sweep in one long frame: ``kind``, ``layer``, then ``position`` / ``head`` / ``neuron``
        (whichever the kind has; nullable integers, empty for the kinds without it), ``value`` (estimated
        metric), ``delta`` and ``normalized``."""
        import pandas as pd

        parts = [sw.to_frame().assign(kind=k) for k, sw in self.sweeps.items()]
        ints = {c for p in parts for c in p.columns if p[c].dtype.kind == "i"}
        frame = pd.concat(parts, ignore_index=True)
        return frame.astype({c: "Int64" for c in ints})[["kind", *[c for c in frame.columns if c != "kind"]]]

    def plot(self, kind: str | None = None, title: str | None = None) -> Any:
        """Heatmap of one kind's estimates (default the first computed: ``resid_pre`` with the default kinds)."""
        return self[kind or next(iter(self.sweeps))].plot(title=title)


@moved_keywords(MOVED)
def attribute(model: Model, pairs: PromptPairs, metric: Metric, sites: Sequence[str] = DEFAULT_KINDS,
              layers: Sequence[int] | None = None, runs: tuple[str, str] = ("clean", "corrupted"),
              runtime: Runtime | None = None) -> Attribution:
    """Attribution patching for the site kinds ``sites`` (``resid_pre``, ``resid_mid``, ``resid_post``,
    ``attn_out``, ``mlp_out``, ``attn_z`` for heads, ``mlp_post`` for neurons, ``ln_final``). A
    bar over the source forward, the target forward + backward and the per-site products (``runtime.progress``);
    ``runs``: (source, target)."""
    source, target = check_runs(runs)
    progress = patch_runtime(runtime).progress
    check_pairs(pairs)
    if isinstance(sites, str):
        sites = [sites]
    site_list: list[Site] = []
    for k in sites:
        site_list += expand_sites(k, model.n_layers, layers)
    with progress_bar(2 + len(site_list), "attribution", progress, unit="step") as bar:
        src_acts, src_logits = run_with_capture(model, pairs.batch(source), site_list)
        bar.update(1)
        tgt_acts, tgt_logits = run_with_capture(model, pairs.batch(target), site_list, grad=True)
        value = call_metric(metric, tgt_logits)
        tensors = [tgt_acts[s] for s in site_list]
        grads = torch.autograd.grad(value, tensors, allow_unused=True)
        bar.update(1)
        per_kind = _products(pairs, site_list, grads, tensors, src_acts, source, target, bar)
    baseline, reference = float(value.detach()), float(call_metric(metric, src_logits))
    return _assemble(per_kind, pairs, baseline, reference, metric, source, target)


def _products(pairs: PromptPairs, site_list: Sequence[Site], grads: Sequence[torch.Tensor | None],
              tensors: Sequence[torch.Tensor], src_acts: dict[Site, torch.Tensor], source: str, target: str,
              bar: Any) -> dict[str, list[tuple[Site, torch.Tensor]]]:
    """``grad . (source - target)`` per site, summed over pairs: ``[P]``, ``[P, H]`` or ``[P, d_mlp]``."""
    per_kind: dict[str, list[tuple[Site, torch.Tensor]]] = {}
    for s, g, t in zip(site_list, grads, tensors, strict=True):
        diff = gather_aligned(src_acts[s].detach(), pairs.cols[source]) - gather_aligned(t.detach(), pairs.cols[target])
        g = torch.zeros_like(diff) if g is None else gather_aligned(g, pairs.cols[target])
        prod = (g.float() * diff.float()).sum(0)                       # [P, *shape], summed over pairs
        if s.kind == "attn_z":
            prod = prod.sum(-1)                                        # [P, H]
        elif s.kind != "mlp_post":
            prod = prod.flatten(1).sum(-1)                             # [P]
        per_kind.setdefault(s.kind, []).append((s, prod.cpu()))
        bar.update(1)
    return per_kind


def _assemble(per_kind: dict[str, list[tuple[Site, torch.Tensor]]], pairs: PromptPairs, baseline: float,
              reference: float, metric: Metric, source: str, target: str) -> Attribution:
    """One :class:`Sweep` per site kind from the per-site products."""
    sweeps, per_pos = {}, {}
    for kind, items in per_kind.items():
        stack = torch.stack([p for _, p in items])                     # [L, P, (H|D)]
        rows = [str(s.layer) if s.layer is not None else "final" for s, _ in items]
        per_pos[kind] = stack
        if kind in ("attn_z", "mlp_post"):
            grid = stack.sum(1)
            cols = [str(i) for i in range(grid.shape[1])]
            col_name = "head" if kind == "attn_z" else "neuron"
        else:
            grid, cols, col_name = stack, list(pairs.labels), "position"
        sweeps[kind] = Sweep(baseline + grid, baseline, reference, rows, cols, col_name=col_name, site=kind,
                             method="attribution", metric=metric_name(metric), meta={"source": source, "target": target})
    return Attribution(sweeps, per_pos, baseline, reference)


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of two flattened tensors (nan when one is constant)."""
    a, b = a.flatten().double(), b.flatten().double()
    a, b = a - a.mean(), b - b.mean()
    den = float(a.norm() * b.norm())
    return float((a * b).sum()) / den if den > 0 else math.nan


@dataclass
class AttributionCheck(Result):
    """Attribution estimates against exact patching, per site kind (both as metric deltas)."""

    exact: dict[str, torch.Tensor]
    estimate: dict[str, torch.Tensor]
    r: dict[str, float]
    max_abs_err: dict[str, float]
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: per site kind, the cells checked, Pearson r of estimate vs exact and the max error."""
        return {"kinds": {row.pop("site"): row for row in self.table()}}

    def table(self) -> list[dict[str, Any]]:
        return [{"site": k, "n": int(self.exact[k].numel()), "pearson_r": self.r[k], "max_abs_err": self.max_abs_err[k]}
                for k in self.exact]

    def to_frame(self) -> pd.DataFrame:
        """One row per checked cell: ``kind``, ``cell`` (its index among the kind's checked cells: the flattened
        grid, or the checked neurons), ``exact`` and ``estimate`` (metric deltas) and ``error`` (estimate - exact)."""
        import pandas as pd

        parts = [pd.DataFrame({"kind": k, "cell": range(self.exact[k].numel()), "exact": self.exact[k].tolist(),
                               "estimate": self.estimate[k].tolist()}) for k in self.exact]
        frame = pd.concat(parts, ignore_index=True)
        frame["error"] = frame["estimate"] - frame["exact"]
        return frame

    def plot(self, title: str | None = None) -> Any:
        """Attribution estimate against exact patching per cell, one trace per kind, with y = x."""
        from interp.viz.patching import attribution_scatter

        return attribution_scatter(self, title=title)

    def __repr__(self) -> str:
        rs = ", ".join(f"{k}: r={v:.3f}" for k, v in self.r.items())
        return f"AttributionCheck({rs})"


@moved_keywords(MOVED)
def compare_attribution(model: Model, pairs: PromptPairs, metric: Metric, sites: Sequence[str] = DEFAULT_KINDS,
                        layers: Sequence[int] | None = None, n_neurons: int = 32,
                        runs: tuple[str, str] = ("clean", "corrupted"),
                        runtime: Runtime | None = None) -> AttributionCheck:
    """Run attribution and exact patching on the same cells and compare them per site kind.

    Whole sites: every layer x position; heads: every layer x head (all positions); neurons: the
    ``n_neurons`` with the largest estimates plus ``n_neurons`` random ones (each patched at all positions).
    ``runtime``: rows per forward (default 64), the seed of the random neurons and a bar over the site kinds (the
    sweeps inside run without bars of their own).
    """
    source, target = check_runs(runs)
    runtime = patch_runtime(runtime)
    progress, seed = runtime.progress, runtime.seed
    quiet = replace(runtime, progress=False)
    if isinstance(sites, str):
        sites = [sites]
    att = attribute(model, pairs, metric, sites, layers, runs, quiet)
    exact, est = {}, {}
    for kind, sw in _kinds_bar(att.sweeps.items(), len(att.sweeps), progress):
        layer_list = None if sw.rows == ["final"] else [int(r) for r in sw.rows]
        if kind == "attn_z":
            ex = sweep_heads(model, pairs, metric, layer_list, None, runs, quiet).delta
            exact[kind], est[kind] = ex.flatten(), sw.delta.flatten()
        elif kind == "mlp_post":
            exact[kind], est[kind] = _neuron_check(model, pairs, metric, sw, n_neurons, source, target, quiet, seed)
        elif kind == "ln_final":
            prep = prepare_patching(model, pairs, [Site("ln_final", None)], metric, source, target)
            variants = [[Edit(Site("ln_final", None), torch.tensor([p]))] for p in range(pairs.n_positions)]
            vals = run_variants(model, pairs.batch(target), variants, prep.values, prep.dst_cols, metric, quiet)
            exact[kind], est[kind] = vals - prep.baseline, sw.delta.flatten()
        else:
            ex = sweep_positions(model, pairs, metric, kind, layer_list, runs, runtime=quiet).delta
            exact[kind], est[kind] = ex.flatten(), sw.delta.flatten()
    r = {k: pearson(exact[k], est[k]) for k in exact}
    err = {k: float((exact[k] - est[k]).abs().max()) for k in exact}
    return AttributionCheck(exact, est, r, err, meta={"metric": metric_name(metric), "baseline": att.baseline,
                                                      "reference": att.reference})


def _kinds_bar(items: Any, total: int, progress: bool) -> Any:
    """Iterate ``items`` under a bar named after attribution checking (closed when the loop ends)."""
    with progress_bar(total, "checking attribution", progress, unit="site kind") as bar:
        for item in items:
            yield item
            bar.update(1)


def _neuron_check(model: Model, pairs: PromptPairs, metric: Metric, sw: Sweep, n_neurons: int, source: str,
                  target: str, runtime: Runtime, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = sw.delta                                                       # [L, D]
    D = d.shape[1]
    flat = d.flatten()
    top = flat.abs().argsort(descending=True)[:n_neurons]
    g = torch.Generator().manual_seed(seed)
    rand = torch.randperm(flat.numel(), generator=g)[:n_neurons]
    cells = torch.unique(torch.cat([top, rand]))
    layers = [int(sw.rows[i // D]) for i in cells.tolist()]
    sites = [Site("mlp_post", layer) for layer in layers]
    prep = prepare_patching(model, pairs, sites, metric, source, target)
    allpos = torch.arange(pairs.n_positions)
    variants = [[Edit(s, allpos, int(c) % D)] for s, c in zip(sites, cells.tolist(), strict=True)]
    vals = run_variants(model, pairs.batch(target), variants, prep.values, prep.dst_cols, metric, runtime)
    return vals - prep.baseline, flat[cells]


__all__ = ["Attribution", "attribute", "AttributionCheck", "compare_attribution", "pearson", "DEFAULT_KINDS"]
