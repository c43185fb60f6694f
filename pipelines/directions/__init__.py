"""Studies of directions: calibrated trait scales, families of cue-induced bias directions, value and partisan
vectors, and representational similarity, on any HF model, each returning a result with ``.plot()``,
``.to_frame()`` and its controls."""

from __future__ import annotations

__all__: list[str] = []
