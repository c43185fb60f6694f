"""Export an :class:`~interp.store.ActivationStore` to sae-lens's cached-activations format, so sae-lens trains on
activations we captured (``LanguageModelSAERunnerConfig(use_cached_activations=True, cached_activations_path=...)``).

The format (sae-lens 6.x, ``CacheActivationsRunner`` writes it and ``ActivationsStore`` reads it) is a Hugging Face
``datasets`` dataset saved to disk: one column named by the hook, each row ``[context_size, d_in]`` activations of
``context_size`` consecutive tokens (optionally a ``token_ids`` column, which a store does not hold). sae-lens
flattens rows into tokens for training, so rows here are consecutive real tokens of the store in its row order:
prompt boundaries are not kept and padding never appears. Needs the ``datasets`` package (a sae-lens dependency).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from sae.stream import _pick_site

_ARROW_DTYPES = {torch.float32: "float32", torch.float16: "float16"}  # Arrow has no bfloat16: it goes as float32


def export_saelens_activations(store: Any, out: str | os.PathLike, site: str | None = None, context_size: int = 128,
                               rows_per_part: int = 1024, overwrite: bool = False) -> dict[str, Any]:
    """Write ``store``'s tokens at ``site`` as a sae-lens cached-activations dataset at ``out``.

    Rows of ``context_size`` consecutive real tokens ``[context_size, d_in]`` in the column ``site`` (a TransformerLens
    hook name, as sae-lens's ``hook_name``); the last ``n_tokens % context_size`` tokens do not fill a row and are
    left out. Built in a temporary folder beside ``out`` (``rows_per_part`` rows in memory at a time) and renamed
    into place. Returns ``{"path", "hook_name", "rows", "context_size", "d_in", "tokens", "dropped_tokens"}``:
    pass ``hook_name``, ``context_size`` and ``d_in`` to sae-lens's config."""
    from datasets import Array2D, Features, concatenate_datasets, load_from_disk

    if context_size < 1 or rows_per_part < 1:
        raise ValueError(f"context_size and rows_per_part must be >= 1, got {context_size} and {rows_per_part}")
    if not getattr(store, "complete", False):
        raise ValueError(f"the store at {getattr(store, 'path', '?')} is unfinished; finish the capture first")
    site = _pick_site(list(store.sites), site, f"store {store.path}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True to replace it, or choose another path")
    dtype = _ARROW_DTYPES.get(getattr(torch, str(store.manifest.get("dtype", "float32")).replace("torch.", "")),
                              "float32")
    features = Features({site: Array2D(shape=(context_size, store.d_model), dtype=dtype)})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        parts, tokens = _write_parts(store, site, tmp, features, context_size, rows_per_part)
        if not parts:
            raise ValueError(f"the store holds {tokens} tokens at {site}, fewer than one row of {context_size}; "
                             f"pass a smaller context_size")
        ds = concatenate_datasets([load_from_disk(str(p)) for p in parts])
        ds.save_to_disk(str(tmp / "dataset"))
        rows = len(ds)
        del ds
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(tmp / "dataset", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"path": str(out), "hook_name": site, "rows": rows, "context_size": context_size, "d_in": store.d_model,
            "tokens": rows * context_size, "dropped_tokens": tokens - rows * context_size}


def _write_parts(store: Any, site: str, tmp: Path, features: Any, context_size: int, rows_per_part: int
                 ) -> tuple[list[Path], int]:
    """The store's tokens, shard by shard, as saved datasets of ``rows_per_part`` rows (the last may be smaller);
    the part folders and the number of tokens read."""
    from datasets import Dataset

    parts: list[Path] = []
    pending: list[torch.Tensor] = []
    held = total = 0

    def flush(rows: int) -> None:
        nonlocal pending, held
        flat = torch.cat(pending)
        take, rest = flat[:rows * context_size], flat[rows * context_size:]
        chunk = take.reshape(rows, context_size, -1).numpy()
        p = tmp / f"part_{len(parts):05d}"
        Dataset.from_dict({site: chunk}, features=features).save_to_disk(str(p))
        parts.append(p)
        pending, held = [rest], rest.shape[0]

    for shard in store.iter_shards():
        tok = shard.flat_tokens(site)
        tok = tok.to(torch.float32) if tok.dtype not in _ARROW_DTYPES else tok.clone()
        pending.append(tok)
        held += tok.shape[0]
        total += tok.shape[0]
        while held >= rows_per_part * context_size:
            flush(rows_per_part)
    if held >= context_size:
        flush(held // context_size)
    return parts, total


__all__ = ["export_saelens_activations"]
