"""`ActivationStore`: activations sharded on disk, written atomically, memory-mapped for reading, resumable.

Layout of a store folder::

    store.json               manifest (sites, positions, model, prompt ids, labels, fingerprint, complete)
    shard_00000.safetensors  one batch: "activations" [b, n_sites, (P,) d] (+ "mask" [b, P], "sinks" [b, S, P],
                             "sink_counts" [S]; the manifest keeps each shard's sink counts too)

A shard file exists only once fully written (written in a temp folder ``.shard_*.tmp`` of its own, then
renamed), so an interrupted run resumes by skipping the shards present and removing the temp folders.
Deterministic contents make a resumed store byte-identical to an uninterrupted one.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from interp.activations import Activations
from interp.io import OwnedFolder, read_json, write_json, write_safetensors

MANIFEST = "store.json"
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
           "BOOL": torch.bool, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


def shard_name(k: int) -> str:
    return f"shard_{k:05d}.safetensors"


class ActivationStore:
    """Read access to a store folder (and the writer API used by :func:`interp.capture`)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not (self.path / MANIFEST).exists():
            raise FileNotFoundError(f"{self.path} is not an activation store (no {MANIFEST})")
        self.manifest: dict[str, Any] = read_json(self.path / MANIFEST)

    # --- creation / resumption ---------------------------------------------------------------
    @classmethod
    def open_for_writing(cls, path: str | os.PathLike, manifest: dict[str, Any], overwrite: bool = False) -> ActivationStore:
        """Create a store, or resume an unfinished one with the same fingerprint.

        An existing finished store, a store of another run, or a folder holding other files is refused
        unless ``overwrite=True``; even then only the store's own files are removed, never other files.
        """
        p = Path(path)
        if p.exists() and not p.is_dir():
            raise FileExistsError(f"{p} exists and is a file; choose another output path")
        if p.exists() and any(p.iterdir()):
            theirs = _owned(p).foreign()
            if theirs:
                raise FileExistsError(f"{p} holds files that are not part of an activation store ({theirs[:3]}); "
                                      f"move them out or choose an empty or new output folder (nothing was deleted)")
            old = read_json(p / MANIFEST) if (p / MANIFEST).exists() else None
            resumable = old is not None and old.get("fingerprint") == manifest["fingerprint"] and not old.get("complete")
            if not resumable and not overwrite:
                why = "a finished store" if old and old.get("complete") else "a store of a different run" + _diff(old, manifest)
                raise FileExistsError(f"{p} already holds {why}; pass overwrite=True to replace it, or choose another path")
            # resuming: remove only a killed writer's unfinished writes; replacing: all of the store's files
            _owned(p).clear(temps_only=resumable)
        p.mkdir(parents=True, exist_ok=True)
        if not (p / MANIFEST).exists():
            write_json(p / MANIFEST, {**manifest, "complete": False})
        return cls(p)

    def has_shard(self, k: int) -> bool:
        return (self.path / shard_name(k)).exists()

    def write_shard(self, k: int, acts: torch.Tensor, mask: torch.Tensor | None = None,
                    sinks: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> None:
        """Write shard ``k``, then its sink counts per site into the manifest (both atomically). ``sinks``
        ``[b, S, P]``: massive-activation flags (:func:`interp.positions.massive`); ``counts`` ``[b, S]``: the
        sinks a position mean left out, for positions that keep no flags."""
        tensors = {"activations": acts}
        if mask is not None:
            tensors["mask"] = mask
        if sinks is not None:
            tensors["sinks"] = sinks
        per_site = sinks.sum((0, 2)) if sinks is not None else None if counts is None else counts.reshape(-1, len(self.sites)).sum(0)
        if per_site is not None:
            tensors["sink_counts"] = per_site.long()
        write_safetensors(self.path / shard_name(k), tensors)
        if per_site is not None:
            self.manifest.setdefault("sink_counts", {"shards": {}})["shards"][str(k)] = per_site.long().tolist()
            write_json(self.path / MANIFEST, self.manifest)

    def _recount_sinks(self) -> None:
        """Fill the manifest's per-shard sink counts from the shards (ranks of a parallel capture each wrote their
        own manifest, so the last one written lacks the others' shards)."""
        shards: dict[str, list[int]] = {}
        for k in range(self.n_shards):
            t = mmap_safetensors(self.path / shard_name(k))
            if "sink_counts" in t:
                shards[str(k)] = t["sink_counts"].tolist()
        if shards:
            self.manifest["sink_counts"] = {"shards": shards}

    def finish(self, process: dict[str, Any] | None = None) -> None:
        """Mark the store complete (after checking every shard is there), recording ``process`` (the writers'
        world size and backend: the only manifest fields a data-parallel capture writes differently)."""
        missing = [k for k in range(self.n_shards) if not self.has_shard(k)]
        if missing:
            raise RuntimeError(f"{self.path} lacks shards {missing[:5]}{' ...' if len(missing) > 5 else ''}: a writer "
                               f"stopped early; rerun the capture with the same arguments to resume it")
        self._recount_sinks()
        self.manifest["complete"] = True
        self.manifest["process"] = process or {"world_size": 1, "backend": None}
        write_json(self.path / MANIFEST, self.manifest)
        _owned(self.path).clear(temps_only=True)  # a killed writer's temp files

    def reload(self) -> ActivationStore:
        """Re-read the manifest (another process finished the store)."""
        self.manifest = read_json(self.path / MANIFEST)
        return self

    # --- reading -----------------------------------------------------------------------------
    @property
    def sites(self) -> list[str]:
        return list(self.manifest["sites"])

    @property
    def d_model(self) -> int:
        return int(self.manifest["d_model"])

    @property
    def n_prompts(self) -> int:
        return len(self.manifest["prompt_ids"])

    @property
    def n_shards(self) -> int:
        return int(self.manifest["n_shards"])

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    @property
    def positions(self) -> str:
        return str(self.manifest["positions"])

    def __len__(self) -> int:
        return self.n_prompts

    @property
    def order(self) -> list[int] | None:
        """For a store captured sorted by length: the caller's index of each stored row (shards hold rows in this
        order; ``prompt_ids`` and ``labels`` stay in the caller's order). ``None``: rows are in the caller's order."""
        order = self.manifest.get("order")
        return None if order is None else list(order)

    def shard_bounds(self, k: int) -> tuple[int, int]:
        bs = int(self.manifest["batch_size"])
        return k * bs, min((k + 1) * bs, self.n_prompts)

    def shard(self, k: int) -> Activations:
        """Shard ``k`` as :class:`Activations` whose tensors are memory-mapped (no copy into RAM)."""
        if not 0 <= k < self.n_shards:
            raise IndexError(f"shard {k} out of range 0..{self.n_shards - 1}")
        f = self.path / shard_name(k)
        if not f.exists():
            raise FileNotFoundError(f"{f} is missing: the store is unfinished; rerun the capture with the same "
                                    f"arguments to resume it")
        t = mmap_safetensors(f)
        lo, hi = self.shard_bounds(k)
        rows = self.manifest.get("order", range(self.n_prompts))[lo:hi]
        ids, labels = self.manifest["prompt_ids"], self.manifest.get("labels")
        return Activations(tensor=t["activations"], sites=self.sites, positions=self.positions,
                           model_id=self.manifest.get("model_id", ""), prompt_ids=[ids[i] for i in rows],
                           labels=None if labels is None else [labels[i] for i in rows], mask=t.get("mask"), sinks=t.get("sinks"),
                           meta=dict(self.manifest.get("meta", {})))

    def iter_shards(self) -> Iterator[Activations]:
        for k in range(self.n_shards):
            yield self.shard(k)

    def load(self) -> Activations:
        """Everything in memory as one :class:`Activations`, rows in the caller's order."""
        acts = Activations.concat([a[slice(None)] for a in self.iter_shards()])
        order = self.order
        if order is None:
            return acts
        inverse = [0] * len(order)
        for row, i in enumerate(order):
            inverse[i] = row
        return acts[inverse]

    @property
    def sink_counts(self) -> dict[str, int] | None:
        """Massive-activation positions (attention sinks) per site over the shards written so far, from the
        manifest (``None``: the capture detected none at these sites or positions)."""
        shards = self.manifest.get("sink_counts", {}).get("shards")
        if not shards:
            return None
        total = torch.tensor(list(shards.values()), dtype=torch.long).sum(0)
        return {s: int(c) for s, c in zip(self.sites, total)}

    def summary(self) -> dict[str, Any]:
        """Headline facts: prompts, sites, positions, shards, complete, the model and the sink counts per site."""
        return {"path": str(self.path), "model_id": self.manifest.get("model_id", ""), "n_prompts": self.n_prompts,
                "sites": self.sites, "positions": self.positions, "d_model": self.d_model, "n_shards": self.n_shards,
                "complete": self.complete, "sink_counts": self.sink_counts}

    def __repr__(self) -> str:
        sinks = self.sink_counts
        return (f"ActivationStore({str(self.path)!r}, prompts={self.n_prompts}, sites={len(self.sites)}, "
                f"shards={self.n_shards}, complete={self.complete}"
                + ("" if sinks is None else f", sinks={sum(sinks.values())}") + ")")


def _owned(path: Path) -> OwnedFolder:
    """The store's own files: its manifest and its shards (and the temp files of writing them)."""
    return OwnedFolder(path, [MANIFEST], [r"shard_\d{5}\.safetensors"])


def _diff(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """Which parts of the run fingerprint differ (model weights, dtype, labels, ...), for the refusal message."""
    a, b = (old or {}).get("fingerprint_parts"), new.get("fingerprint_parts")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return ""
    keys = [k for k in {**a, **b} if a.get(k) != b.get(k)]
    return f" (differs in: {', '.join(keys)})" if keys else ""


def mmap_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file as read-only views of a memory map of the file."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e}); it is damaged: delete it and rerun "
                         f"the capture with the same arguments to rewrite it") from None
    base = 8 + n
    end_of_data = max((i["data_offsets"][1] for k, i in header.items() if k != "__metadata__"), default=0)
    if base + end_of_data > size:
        raise ValueError(f"{path} is truncated ({size} bytes, its header needs {base + end_of_data}): delete it and "
                         f"rerun the capture with the same arguments to rewrite it")
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = (end - start) // torch.empty((), dtype=dtype).element_size()
        if count == 0:
            out[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only buffer: we never write through it
            out[name] = torch.frombuffer(mm, dtype=dtype, count=count, offset=base + start).view(info["shape"])
    return out
