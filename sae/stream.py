"""Token batches for SAE training: from a tensor, an `Activations`, or an `ActivationStore` on disk.

Every stream is a pure function of its seed, so a resumed run replays it and skips the batches already
seen (:meth:`TokenStream.skip`), which makes resumed training match an uninterrupted run exactly.
A store is read shard by shard through a shuffling buffer, so memory stays bounded by the buffer.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Float

from interp.positions import check_sinks


def _bad_values(t: torch.Tensor, where: str) -> None:
    if not torch.isfinite(t).all():
        n_bad = int((~torch.isfinite(t)).any(-1).sum())
        raise ValueError(f"{where} holds NaN/Inf activations ({n_bad} tokens); recapture them in float32, or "
                         f"drop those prompts before training an SAE")


def _pick_site(sites: list[str], site: str | None, what: str) -> str:
    from interp.sites import parse_site

    if site is None:
        if len(sites) != 1:
            raise ValueError(f"{what} holds {len(sites)} sites {sites[:4]}...; pass site=... to choose one")
        return sites[0]
    canon = parse_site(site).name
    if canon not in sites:
        raise ValueError(f"site {site!r} is not in {what}; it holds {sites}")
    return canon


def _pair(xy: tuple) -> tuple[torch.Tensor, int]:
    """``(x, y)`` with one row per token each -> ``[n, d + d_out]`` side by side, and ``d_out``."""
    if len(xy) != 2 or not all(isinstance(t, torch.Tensor) for t in xy):
        raise TypeError("paired training data is a tuple (inputs, targets) of two tensors [..., d]")
    x, y = (t.reshape(-1, t.shape[-1]) if t.dim() >= 2 else t for t in xy)
    if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"inputs {tuple(xy[0].shape)} and targets {tuple(xy[1].shape)} must be [..., d] with the same "
                         f"tokens (one target row per input row)")
    return torch.cat([x.float(), y.float()], -1), int(y.shape[-1])


class TokenStream:
    """Infinite, deterministic stream of ``[batch_size, d]`` float32 token batches.

    ``source``: a tensor ``[..., d]``, an :class:`~interp.activations.Activations`, or an
    :class:`~interp.store.ActivationStore` (anything with ``iter_shards()``). ``site`` picks one site of a
    multi-site capture. ``buffer_tokens`` bounds memory when streaming a store.

    Paired (a transcoder's input and target): ``source`` a tuple ``(x, y)`` of tensors ``[..., d]`` and ``[..., d_out]``
    with the same tokens, or a capture holding both sites, ``site`` the input and ``target_site`` the target. Batches
    are then ``[batch_size, d + d_out]``, the pair side by side (shuffled together); :meth:`split` parts them.

    Data parallel (``world > 1``, rank ``rank``), ``batch_size`` is this rank's share of the global batch. In
    memory every rank draws the same global stream of ``world * batch_size`` rows and keeps its slice, so the
    ranks' batches together are exactly the one-process batch. From a store each rank reads only its own shards
    (round robin) through its own shuffling buffer, seeded per rank: no rank reads another's tokens.

    ``sinks="exclude"``: tokens of an Activations / store flagged as massive activations (attention sinks,
    :func:`interp.positions.massive`) at the site (or the target site) are left out, with a warning; ``n_sinks``
    counts them (a store's as its shards are read). Plain tensors carry no flags and are taken as they are.
    """

    def __init__(self, source: Any, batch_size: int, seed: int = 0, site: str | None = None,
                 buffer_tokens: int = 1 << 18, device: str | torch.device = "cpu", rank: int = 0, world: int = 1,
                 target_site: str | None = None, sinks: str = "exclude"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in 0..{world - 1}, got {rank}")
        self.batch_size, self.seed, self.device = batch_size, seed, torch.device(device)
        self.rank, self.world = rank, world
        self.sinks, self.n_sinks = check_sinks(sinks), 0
        self.buffer_tokens = max(buffer_tokens, 2 * batch_size)
        self.site: str | None = None
        self.model_id = ""
        self.model_shape: dict[str, Any] | None = None  # the capture's meta["model"] (n_layers, d_model), if known
        self._store = None
        self._tokens: torch.Tensor | None = None
        self.target_site: str | None = None
        self.d_out: int | None = None  # the target's width when paired
        if isinstance(source, tuple):
            self._tokens, self.d_out = _pair(source)
            self.site, self.target_site = site, target_site
        elif isinstance(source, torch.Tensor):
            if source.dim() < 2:
                raise ValueError(f"activations must be [..., d], got shape {tuple(source.shape)}")
            self._tokens = source.reshape(-1, source.shape[-1])
            self.site = site
        elif hasattr(source, "iter_shards"):
            self._store = source
            what = f"store {getattr(source, 'path', '')}"
            self.site = _pick_site(list(source.sites), site, what)
            if target_site is not None:
                self.target_site, self.d_out = _pick_site(list(source.sites), target_site, what), int(source.d_model)
            self.model_id = source.manifest.get("model_id", "") if hasattr(source, "manifest") else ""
            self.model_shape = source.manifest.get("meta", {}).get("model") if hasattr(source, "manifest") else None
        elif hasattr(source, "flat_tokens") and hasattr(source, "sites"):
            self.site = _pick_site(list(source.sites), site, "these Activations")
            if target_site is not None:
                self.target_site = _pick_site(list(source.sites), target_site, "these Activations")
            self._tokens = self._read(source)
            if target_site is not None:
                self._tokens, self.d_out = _pair((self._tokens[:, 0], self._tokens[:, 1]))
            self.model_id, self.model_shape = source.model_id, source.meta.get("model")
            self._warn()
        else:
            raise TypeError(f"cannot train on {type(source).__name__}; pass a tensor [n, d], Activations or an "
                            f"ActivationStore")
        if self._tokens is not None:
            if self._tokens.shape[0] == 0:
                raise ValueError("no tokens to train on (empty activations)")
            _bad_values(self._tokens, "the training activations")
            self.d = int(self._tokens.shape[-1]) - (self.d_out or 0)
        else:
            self.d = int(self._store.d_model)
            if self._store.n_shards < world:
                raise ValueError(f"the store at {self._store.path} has {self._store.n_shards} shards for {world} "
                                 f"processes, each of which reads its own; capture with a smaller batch_size or "
                                 f"train with fewer processes")
        self._it: Iterator[torch.Tensor] | None = None
        self.n_batches = 0
        self.max_buffered = 0  # peak tokens held by the shuffling buffer (store streams)

    def _read(self, acts: Any, count: bool = True) -> torch.Tensor:
        """The training tokens of one capture ``[n, d]`` (paired: ``[n, 2, d]``), sinks left out unless kept."""
        sites = [self.site] if self.target_site is None else [self.site, self.target_site]
        idx = [acts.sites.index(s) for s in sites]
        if not acts.has_positions:
            return acts.tensor[:, idx[0]] if len(idx) == 1 else acts.tensor[:, idx]
        real, kept = acts.kept(sites, "keep"), acts.kept(sites, self.sinks)
        self.n_sinks += (int(real.sum()) - int(kept.sum())) if count else 0
        t = acts.tensor[:, idx].permute(0, 2, 1, 3)[kept]
        return t[:, 0] if len(idx) == 1 else t

    def _warn(self) -> None:
        if self.n_sinks:
            warnings.warn(f"left {self.n_sinks} massive-activation tokens (attention sinks, see "
                          f"interp.positions.SINK_RATIO) out of the training data at {self.site}; pass sinks='keep' "
                          f"to train on them", UserWarning, stacklevel=4)

    # --- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> Float[torch.Tensor, "b d"]:
        if self._it is None:
            self._it = self._memory_iter() if self._tokens is not None else self._store_iter()
        self.n_batches += 1
        return next(self._it).to(self.device, torch.float32)

    def split(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A batch as ``(x [B, d], y [B, d_out])``; ``y`` is ``None`` for an unpaired stream."""
        if self.d_out is None:
            return batch, None
        return batch[:, :self.d], batch[:, self.d:]

    def copy(self, batch_size: int) -> TokenStream:
        """The one-process stream of the same data from its start, in batches of ``batch_size`` (no data copied)."""
        c = copy.copy(self)
        c.batch_size, c.rank, c.world, c._it, c.n_batches, c.max_buffered = batch_size, 0, 1, None, 0, 0
        c.buffer_tokens = max(self.buffer_tokens, 2 * batch_size)
        return c

    def skip(self, n: int) -> None:
        """Advance ``n`` batches without using them (replays the shuffle; no SAE compute)."""
        for _ in range(n):
            next(self)

    # --- in memory: concatenated seeded permutations --------------------------------------------
    def _memory_iter(self) -> Iterator[torch.Tensor]:
        tokens = self._tokens
        n, b = tokens.shape[0], self.batch_size * self.world
        mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        epoch, pos = 0, 0
        perm = self._perm(n, epoch)
        while True:
            take: list[torch.Tensor] = []
            need = b
            while need:
                if pos == n:
                    epoch, pos = epoch + 1, 0
                    perm = self._perm(n, epoch)
                t = min(need, n - pos)
                take.append(perm[pos:pos + t])
                pos, need = pos + t, need - t
            yield tokens[torch.cat(take)[mine]]

    def _perm(self, n: int, epoch: int, seed: int | None = None) -> torch.Tensor:
        g = torch.Generator().manual_seed((self.seed if seed is None else seed) * 1_000_003 + epoch)
        return torch.randperm(n, generator=g)

    def _rank_seed(self) -> int:
        """The seed of this rank's shard order and shuffling buffer (the plain seed for one process)."""
        return self.seed if self.world == 1 else self.seed * 65_537 + 7_919 * (self.rank + 1)

    # --- on disk: shards through a shuffling buffer ---------------------------------------------
    def _store_iter(self) -> Iterator[torch.Tensor]:
        store, b, seed = self._store, self.batch_size, self._rank_seed()
        g = torch.Generator().manual_seed(seed)
        buf = torch.empty(0, self.d + (self.d_out or 0))
        epoch = 0
        mine = [k for k in range(store.n_shards) if k % self.world == self.rank]
        while True:
            order = [mine[i] for i in self._perm(len(mine), epoch, seed).tolist()]
            seen = 0
            for k in order:
                tok = self._read(store.shard(k), count=epoch == 0).to(torch.float32).flatten(1)
                _bad_values(tok, f"shard {k} of the store at {store.path}")
                seen += tok.shape[0]
                buf = torch.cat([buf, tok])
                self.max_buffered = max(self.max_buffered, buf.shape[0])
                if buf.shape[0] >= self.buffer_tokens:
                    buf = buf[torch.randperm(buf.shape[0], generator=g)]
                    n_out = (buf.shape[0] // 2) // b * b
                    for i in range(0, n_out, b):
                        yield buf[i:i + b]
                    buf = buf[n_out:]
            if seen == 0:
                raise ValueError(f"the store at {store.path} holds no tokens")
            if epoch == 0:
                self._warn()
            epoch += 1
            if buf.shape[0] >= b:
                # at each epoch end flush what the buffer holds, so a store smaller than the buffer still trains
                buf = buf[torch.randperm(buf.shape[0], generator=g)]
                n_out = buf.shape[0] // b * b
                for i in range(0, n_out, b):
                    yield buf[i:i + b]
                buf = buf[n_out:]
