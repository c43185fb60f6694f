"""Tidy frames of probe results: a numeric ``layer`` column, sorted by it (``"blocks.10"`` sorts after ``"blocks.2"``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from interp.sites import parse_site


def site_layer(site: str) -> int | None:
    """The block number of a site name, or None for sites outside the blocks (``ln_final``) or unknown names."""
    try:
        return parse_site(site).layer
    except (KeyError, ValueError):
        return None


def layer_sorted(rows: list[dict[str, Any]], keys_before: Sequence[str] = ()) -> Any:
    """A DataFrame of ``rows`` (each with a ``site``) with a numeric ``layer`` column, stably sorted by
    ``keys_before`` then layer; sites without a layer come last."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame.insert(list(frame.columns).index("site") + 1, "layer", [site_layer(s) for s in frame["site"]])
    keys = [*keys_before, "layer"]
    return frame.sort_values(keys, kind="stable", na_position="last").reset_index(drop=True)


def layer_order(sites: Sequence[str]) -> list[int]:
    """Indices of ``sites`` in layer order (stable; sites without a layer last)."""
    layers = [site_layer(s) for s in sites]
    return sorted(range(len(sites)), key=lambda i: (layers[i] is None, layers[i] or 0))
