"""Tables and figures of :class:`~interp.studies.directions.traits.TraitScales` (kept apart from the fitting)."""

from __future__ import annotations

from typing import Any

import torch

from interp.studies.directions.traits_band import heldout_min_d

WHAT = ("adjacent_d", "auroc", "error")


def _layer_of(site_layers: list[int | None], j: int) -> int:
    return -1 if site_layers[j] is None else int(site_layers[j])


def scales_frame(scales: Any) -> Any:
    """One row per (trait, layer)."""
    import pandas as pd

    rows = []
    for t, s in scales.scales.items():
        layers = s.graded.direction.layers
        dmin, ordered, auc = heldout_min_d(s.graded), s.graded.heldout_ordered, s.auroc.mean("auroc")
        err = s.heldout_error.mean(0)
        for j, site in enumerate(s.sites):
            rows.append({"trait": t, "site": site, "layer": _layer_of(layers, j), "in_band": j in s.band,
                         "heldout_ordered": float(ordered[j]), "heldout_min_adjacent_d": float(dmin[j]),
                         "auroc": float(auc[j]), "control_auroc": float(s.auroc.mean("control_auroc")[j])
                         if s.auroc.control_auroc is not None else None,
                         "spacing": float(s.spacing[j]), "heldout_level_error": float(err[j])})
    df = pd.DataFrame(rows)
    df["model_id"], df["band_rule"] = scales.model_id, scales.rule.describe()
    return df


def scales_summary(scales: Any) -> Any:
    """One row per trait: held-out ordered layers, band, adjacent d and AUROC in the band."""
    import pandas as pd

    rows = []
    for t, s in scales.scales.items():
        layers = s.graded.direction.layers
        band_layers = [_layer_of(layers, j) for j in s.band]
        d_band = heldout_min_d(s.graded)[s.band] if s.band else torch.tensor([float("nan")])
        auc = s.auroc.mean("auroc")
        rows.append({"trait": t, "ordered_layers": [_layer_of(layers, j) for j in s.graded.ordered_layers()],
                     "band": band_layers, "band_note": s.band_note,
                     "band_min_adjacent_d": float(d_band.min()), "band_mean_adjacent_d": float(d_band.mean()),
                     "band_auroc": float(auc[s.band].mean()) if s.band else float("nan"),
                     "max_auroc": float(auc.max()),
                     "band_level_error": float(s.heldout_error.mean(0)[s.band].mean()) if s.band else float("nan")})
    return pd.DataFrame(rows)


def scales_plot(scales: Any, what: str = "adjacent_d") -> Any:
    from interp.viz.directions_traits import trait_layers

    if what not in WHAT:
        raise ValueError(f"what must be one of {WHAT}, got {what!r}")
    first = next(iter(scales.scales.values()))
    layers = [_layer_of(first.graded.direction.layers, j) for j in range(len(first.sites))]
    pick = {"adjacent_d": lambda s: heldout_min_d(s.graded), "auroc": lambda s: s.auroc.mean("auroc"),
            "error": lambda s: s.heldout_error.mean(0)}[what]
    label = {"adjacent_d": "held-out adjacent d (min over levels)", "auroc": "held-out AUROC (high vs low)",
             "error": "held-out level error (level units)"}[what]
    bands = {t: [layers[j] for j in s.band] for t, s in scales.scales.items()}
    return trait_layers({t: pick(s) for t, s in scales.scales.items()}, bands, layers, ylabel=label,
                        threshold=scales.rule.min_d if what == "adjacent_d" else None,
                        title=f"Trait scales ({scales.model_id}, {scales.site}, {scales.positions}): {label}")
