"""Token batches for SAE training: from a tensor, an `Activations`, or an `ActivationStore` on disk.

Every stream is a pure function of its seed, so a resumed run replays it and skips the batches already
seen (:meth:`TokenStream.skip`), which makes resumed training match an uninterrupted run exactly.
A store is read shard by shard through a shuffling buffer, so memory stays bounded by the buffer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Float


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


class TokenStream:
    """Infinite, deterministic stream of ``[batch_size, d]`` float32 token batches.

    ``source``: a tensor ``[..., d]``, an :class:`~interp.activations.Activations`, or an
    :class:`~interp.store.ActivationStore` (anything with ``iter_shards()``). ``site`` picks one site of a
    multi-site capture. ``buffer_tokens`` bounds memory when streaming a store.
    """

    def __init__(self, source: Any, batch_size: int, seed: int = 0, site: str | None = None,
                 buffer_tokens: int = 1 << 18, device: str | torch.device = "cpu"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size, self.seed, self.device = batch_size, seed, torch.device(device)
        self.buffer_tokens = max(buffer_tokens, 2 * batch_size)
        self.site: str | None = None
        self.model_id = ""
        self._store = None
        self._tokens: torch.Tensor | None = None
        if isinstance(source, torch.Tensor):
            if source.dim() < 2:
                raise ValueError(f"activations must be [..., d], got shape {tuple(source.shape)}")
            self._tokens = source.reshape(-1, source.shape[-1])
            self.site = site
        elif hasattr(source, "iter_shards"):
            self._store = source
            self.site = _pick_site(list(source.sites), site, f"store {getattr(source, 'path', '')}")
            self.model_id = source.manifest.get("model_id", "") if hasattr(source, "manifest") else ""
        elif hasattr(source, "flat_tokens") and hasattr(source, "sites"):
            self.site = _pick_site(list(source.sites), site, "these Activations")
            self._tokens = source.flat_tokens(self.site)
            self.model_id = source.model_id
        else:
            raise TypeError(f"cannot train on {type(source).__name__}; pass a tensor [n, d], Activations or an "
                            f"ActivationStore")
        if self._tokens is not None:
            if self._tokens.shape[0] == 0:
                raise ValueError("no tokens to train on (empty activations)")
            _bad_values(self._tokens, "the training activations")
            self.d = int(self._tokens.shape[-1])
        else:
            self.d = int(self._store.d_model)
        self._it: Iterator[torch.Tensor] | None = None
        self.n_batches = 0
        self.max_buffered = 0  # peak tokens held by the shuffling buffer (store streams)

    # --- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> Float[torch.Tensor, "b d"]:
        if self._it is None:
            self._it = self._memory_iter() if self._tokens is not None else self._store_iter()
        self.n_batches += 1
        return next(self._it).to(self.device, torch.float32)

    def skip(self, n: int) -> None:
        """Advance ``n`` batches without using them (replays the shuffle; no SAE compute)."""
        for _ in range(n):
            next(self)

    # --- in memory: concatenated seeded permutations --------------------------------------------
    def _memory_iter(self) -> Iterator[torch.Tensor]:
        tokens = self._tokens
        n, b = tokens.shape[0], self.batch_size
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
            yield tokens[torch.cat(take)]

    def _perm(self, n: int, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(n, generator=g)

    # --- on disk: shards through a shuffling buffer ---------------------------------------------
    def _store_iter(self) -> Iterator[torch.Tensor]:
        store, b = self._store, self.batch_size
        g = torch.Generator().manual_seed(self.seed)
        buf = torch.empty(0, self.d)
        epoch = 0
        while True:
            order = self._perm(store.n_shards, epoch).tolist()
            seen = 0
            for k in order:
                shard = store.shard(k)
                tok = shard.flat_tokens(self.site).to(torch.float32)
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
            epoch += 1
            if buf.shape[0] >= b:
                # at each epoch end flush what the buffer holds, so a store smaller than the buffer still trains
                buf = buf[torch.randperm(buf.shape[0], generator=g)]
                n_out = buf.shape[0] // b * b
                for i in range(0, n_out, b):
                    yield buf[i:i + b]
                buf = buf[n_out:]
