"""`Activations`: captured tensors plus the metadata needed to trust and reuse them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float

from interp.bundle import Provenance, read_object, register_kind, save_object
from interp.io import content_hash
from interp.positions import check_sinks, massive
from interp.sites import parse_site

KIND = "interp.Activations"


@dataclass
class Activations:
    """Activations of ``n_prompts`` prompts at ``sites``.

    ``tensor`` is ``[n_prompts, n_sites, d_model]`` for reduced position rules (last token, a mean)
    or ``[n_prompts, n_sites, n_positions, d_model]`` when several positions are kept; then ``mask``
    ``[n_prompts, n_positions]`` marks the real (non-padding) positions. Padding is on the left, so
    position ``-1`` is always the last real token.

    The last axis is the site's width: ``d_model`` for residual-width sites, ``d_mlp`` for neurons
    (``mlp_post``), ``n_heads * d_head`` for per-head ``attn_z``, stored flattened (head-major, as the output
    projection reads it) so probes and SAEs take every site alike; :meth:`site_view` restores
    ``[.., n_heads, d_head]`` from ``meta["site_shapes"]``. ``prompt_ids`` from :func:`interp.capture` are
    content ids; built by hand without them they default to ``"0".."n-1"``. ``sinks`` ``[n_prompts, n_sites,
    n_positions]`` flags the massive-activation positions found at capture (:func:`interp.positions.massive`), which
    :meth:`flat_tokens` leaves out by default.
    """

    tensor: torch.Tensor
    sites: list[str]
    positions: str = "last"
    model_id: str = ""
    prompt_ids: list[str] | None = None
    labels: list[Any] | None = None
    mask: torch.Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    sinks: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.tensor.dim() not in (3, 4):
            raise ValueError(f"Activations tensor must be 3-D or 4-D, got shape {tuple(self.tensor.shape)}")
        if self.tensor.shape[1] != len(self.sites):
            raise ValueError(f"tensor has {self.tensor.shape[1]} sites but {len(self.sites)} site names were given")
        n = self.tensor.shape[0]
        if self.prompt_ids is None:
            self.prompt_ids = [str(i) for i in range(n)]
        for name, seq in (("prompt_ids", self.prompt_ids), ("labels", self.labels)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"{name} has {len(seq)} entries for {n} prompts")
        if self.sinks is not None and tuple(self.sinks.shape) != tuple(self.tensor.shape[:3]):
            raise ValueError(f"sinks must be [n_prompts, n_sites, n_positions] = {tuple(self.tensor.shape[:3])}, got "
                             f"{tuple(self.sinks.shape)}")

    # --- shape -------------------------------------------------------------------------------
    @property
    def n_prompts(self) -> int:
        return self.tensor.shape[0]

    @property
    def d_model(self) -> int:
        return self.tensor.shape[-1]

    @property
    def width(self) -> int:
        """The last axis: ``d_model``, ``d_mlp`` or ``n_heads * d_head`` (same as :attr:`d_model`)."""
        return self.tensor.shape[-1]

    @property
    def has_positions(self) -> bool:
        return self.tensor.dim() == 4

    @property
    def layers(self) -> list[int | None]:
        """Layer index of each site (``None`` for sites outside the blocks, e.g. ``ln_final``)."""
        return [parse_site(s).layer for s in self.sites]

    # --- access ------------------------------------------------------------------------------
    def site(self, name: str) -> Float[torch.Tensor, "n ... d"]:
        """The activations at one site: ``[n_prompts, (n_positions,) d_model]``."""
        canon = parse_site(name).name
        if canon not in self.sites:
            raise KeyError(f"site {name!r} was not captured; captured sites: {self.sites}")
        return self.tensor[:, self.sites.index(canon)]

    def site_view(self, name: str) -> Float[torch.Tensor, "n ..."]:
        """One site in its own shape: ``[n_prompts, (n_positions,) n_heads, d_head]`` for ``attn_z``, else as
        :meth:`site`."""
        x = self.site(name)
        shape = (self.meta.get("site_shapes") or {}).get(parse_site(name).name)
        return x.unflatten(-1, tuple(shape)) if shape else x

    def __getitem__(self, idx: Any) -> Activations:
        """Subset of prompts (int, slice, list of ints, or bool mask)."""
        if isinstance(idx, int):
            idx = [idx]
        if isinstance(idx, torch.Tensor) and idx.dtype == torch.bool:
            idx = idx.nonzero().flatten().tolist()
        if isinstance(idx, slice):
            idx = list(range(self.n_prompts))[idx]
        idx = list(idx)
        return Activations(
            tensor=self.tensor[idx],
            sites=list(self.sites),
            positions=self.positions,
            model_id=self.model_id,
            prompt_ids=[self.prompt_ids[i] for i in idx],
            labels=None if self.labels is None else [self.labels[i] for i in idx],
            mask=None if self.mask is None else self.mask[idx],
            meta=_rows_meta(self.meta, idx),
            sinks=None if self.sinks is None else self.sinks[idx],
        )

    def __len__(self) -> int:
        return self.n_prompts

    def with_labels(self, labels: list[Any]) -> Activations:
        if len(labels) != self.n_prompts:
            raise ValueError(f"{len(labels)} labels for {self.n_prompts} prompts")
        out = self[slice(None)]
        out.labels = list(labels)
        return out

    def flat_tokens(self, site: str | None = None, sinks: str = "exclude",
                    sinks_at: list[str] | None = None) -> torch.Tensor:
        """Real tokens only, padding dropped: ``[n_tokens, n_sites, d]`` (or ``[n_tokens, d]`` for one site).

        ``sinks="exclude"`` also drops the massive-activation positions (attention sinks) flagged at ``site`` (every
        site when ``None``; ``sinks_at``: these sites instead, e.g. a transcoder's input and target, so both keep
        the same tokens); ``"keep"`` keeps every real token."""
        if not self.has_positions:
            t = self.tensor
        else:
            t = self.tensor.permute(0, 2, 1, 3)[self.kept(sinks_at or ([site] if site else None), sinks)]
        if site is not None:
            return t[:, self.sites.index(parse_site(site).name)]
        return t

    def kept(self, sites: list[str] | None = None, sinks: str = "exclude") -> torch.Tensor:
        """``[n_prompts, n_positions]`` real positions, less (``sinks="exclude"``) those flagged massive at any of
        ``sites`` (default every site): flags from capture, else found now from the tensor by the same rule."""
        shape = self.tensor.shape[:1] + self.tensor.shape[2:3]
        m = self.mask if self.mask is not None else torch.ones(shape, dtype=torch.bool)
        if check_sinks(sinks) == "keep":
            return m
        idx = [self.sites.index(parse_site(s).name) for s in sites] if sites else list(range(len(self.sites)))
        if self.sinks is not None:
            flags = self.sinks[:, idx].any(1)
        else:
            flags = torch.stack([massive(self.tensor[:, i], m) for i in idx], 1).any(1)
        return m & ~flags

    @staticmethod
    def concat(parts: list[Activations], on_duplicate: str = "error") -> Activations:
        """Stack prompt sets captured with the same sites and position rule.

        A prompt id in more than one part is refused (``on_duplicate="error"``): the leakage guards of fitted
        objects key on ids. ``"suffix"`` renames the later copies ``ID#2``, ``ID#3``, ... Scores / pattern captures
        of different key widths (their longest prompts differ) are padded with zero keys on the right, as capture
        lays out keys past a prompt's length, and their ``meta["key_lengths"]`` are joined."""
        if not parts:
            raise ValueError("concat needs at least one Activations")
        ids = _joined_ids([list(p.prompt_ids or []) for p in parts], on_duplicate)
        first = parts[0]
        if any(p.sites != first.sites or p.positions != first.positions for p in parts[1:]):
            raise ValueError("cannot concat Activations with different sites, position rules or widths")
        tensors, meta = _keys_padded(parts)
        if any(t.shape[-1] != tensors[0].shape[-1] for t in tensors[1:]):
            raise ValueError("cannot concat Activations with different sites, position rules or widths")
        masks = [p.mask for p in parts]
        flags = [p.sinks for p in parts] if first.has_positions and all(p.sinks is not None for p in parts) else None
        if first.has_positions:
            width = max(t.shape[2] for t in tensors)
            masks = [_left_pad(m if m is not None else torch.ones(t.shape[0], t.shape[2], dtype=torch.bool), width, dim=1)
                     for m, t in zip(masks, tensors, strict=False)]
            tensors = [_left_pad(t, width, dim=2) for t in tensors]
            flags = None if flags is None else [_left_pad(f, width, dim=2) for f in flags]
        labels = None
        if all(p.labels is not None for p in parts):
            labels = [lab for p in parts for lab in p.labels]
        return Activations(
            tensor=torch.cat(tensors),
            sites=list(first.sites),
            positions=first.positions,
            model_id=first.model_id,
            prompt_ids=ids,
            labels=labels,
            mask=torch.cat(masks) if first.has_positions else None,
            meta=meta,
            sinks=None if flags is None else torch.cat(flags),
        )

    def data_hash(self) -> str:
        """Short content hash (prompt ids + labels + sites), recorded in the provenance of fitted objects."""
        return content_hash([self.model_id, self.sites, self.positions, self.prompt_ids, self.labels])

    # --- persistence -------------------------------------------------------------------------
    @property
    def provenance(self) -> Provenance:
        """Where these activations came from (method ``capture:<position rule>``)."""
        return Provenance(method=f"capture:{self.positions}", sites=list(self.sites), model_id=self.model_id,
                          data_hash=self.data_hash(), meta=dict(self.meta))

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """Save as ``PATH/tensors.safetensors`` + ``PATH/meta.json`` (atomic; refuses to overwrite by default)."""
        tensors = {"activations": self.tensor}
        if self.mask is not None:
            tensors["mask"] = self.mask
        if self.sinks is not None:
            tensors["sinks"] = self.sinks
        own = {"positions": self.positions, "prompt_ids": self.prompt_ids, "labels": self.labels,
               "dtype": str(self.tensor.dtype)}
        save_object(path, KIND, tensors, self.provenance, own, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Activations:
        """Load what :meth:`save` wrote (also the older flat ``meta.json`` layout)."""
        b = read_object(path, KIND)
        return cls(tensor=b.tensors["activations"], sites=b.provenance.sites, positions=b.fields["positions"],
                   model_id=b.provenance.model_id, prompt_ids=b.fields["prompt_ids"], labels=b.fields["labels"],
                   mask=b.tensors.get("mask"), meta=b.provenance.meta, sinks=b.tensors.get("sinks"))

    def __repr__(self) -> str:
        return (f"Activations(n_prompts={self.n_prompts}, sites={len(self.sites)}, positions={self.positions!r}, "
                f"shape={tuple(self.tensor.shape)}, dtype={self.tensor.dtype}, model={self.model_id!r})")


def _joined_ids(groups: list[list[str]], on_duplicate: str) -> list[str]:
    """The prompt ids of concatenated parts, duplicates refused or suffixed (see :meth:`Activations.concat`)."""
    if on_duplicate not in ("error", "suffix"):
        raise ValueError(f"on_duplicate must be 'error' or 'suffix', got {on_duplicate!r}")
    out: list[str] = []
    seen: set[str] = set()
    for g in groups:
        for i in g:
            if i in seen:
                if on_duplicate == "error":
                    raise ValueError(f"prompt id {i!r} is in more than one of the parts: the same prompt twice would "
                                     f"count twice and defeat leakage checks; drop the copy, or pass "
                                     f"on_duplicate='suffix' to keep it renamed")
                k = 2
                while f"{i}#{k}" in seen:
                    k += 1
                i = f"{i}#{k}"
            seen.add(i)
            out.append(i)
    return out


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    pad = width - t.shape[dim]
    if pad == 0:
        return t
    shape = list(t.shape)
    shape[dim] = pad
    return torch.cat([torch.zeros(shape, dtype=t.dtype), t], dim=dim)


register_kind(KIND, Activations.load)


def _keys_padded(parts: list[Activations]) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """The parts' tensors with the key axis of scores / pattern captures (``[.., n_heads * n_keys]``) right-padded
    with zeros to the widest, and the merged ``meta`` (``key_lengths`` joined, ``site_shapes`` widened)."""
    meta = dict(parts[0].meta)
    has = [isinstance(p.meta.get("key_lengths"), list) for p in parts]
    if not any(has):
        return [p.tensor for p in parts], meta
    if not all(has):
        raise ValueError("cannot concat an attention scores / pattern capture with one of other sites; capture "
                         "them with the same sites")
    shapes = [p.meta["site_shapes"][p.sites[0]] for p in parts]
    heads, keys = shapes[0][0], max(s[1] for s in shapes)
    tensors = []
    for p, (_, k) in zip(parts, shapes, strict=True):
        t = p.tensor.unflatten(-1, (heads, k))
        tensors.append(torch.nn.functional.pad(t, (0, keys - k)).flatten(-2))
    meta["key_lengths"] = [n for p in parts for n in p.meta["key_lengths"]]
    meta["site_shapes"] = {name: [heads, keys] for name in parts[0].meta["site_shapes"]}
    return tensors, meta


def _rows_meta(meta: dict[str, Any], idx: list[int]) -> dict[str, Any]:
    """``meta`` of a row subset: the per-prompt entries (``key_lengths`` of attention patterns) follow the rows."""
    out = dict(meta)
    if isinstance(out.get("key_lengths"), list):
        out["key_lengths"] = [out["key_lengths"][i] for i in idx]
    return out
