"""Greedy decoding that drops finished rows from the batch.

HF ``generate`` keeps a row that has emitted its end-of-sequence token in the batch until every row is done,
feeding it padding: on a compute-bound device a batch of mostly short answers (refusals) costs as much as if every
answer ran to ``max_new_tokens``. :func:`greedy_rows` runs the same greedy decoding (one prompt pass, then one token
per step from the key/value cache, position ids from the attention mask) and, after each step, removes the rows
that have finished from the cache, the attention mask and the steering state (:meth:`Steering.keep_rows`), so a
step costs what its live rows cost. Each row's tokens equal HF greedy ``generate``'s up to the float rounding of a
narrower batch (tested equal on tiny models and the organisms).

It is used only where it is that same decoding: greedy, no logits processor in the model's generation config, a
dynamic key/value cache whose rows can be selected, and interventions that act on each row alike (steering's own
edits, :class:`~steering.rows.RowGroups` of them, weight edits); anything else goes through HF ``generate``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from interp.forward import cache_kwarg, dense_unembed, kv_cache
from interp.models import Model
from interp.nnsight_backend import NNsightModel
from interp.sites import parse_site
from interp.skip import resume_from
from steering.applying import _flat, _is_weight_edit
from steering.rows import RowEdits, RowGroups

# generation-config fields that add a logits processor to greedy decoding (a field away from its default: HF path)
_PROCESSORS = ("repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size",
               "encoder_no_repeat_ngram_size", "min_length", "min_new_tokens", "bad_words_ids", "force_words_ids",
               "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id",
               "sequence_bias", "exponential_decay_length_penalty", "renormalize_logits", "guidance_scale",
               "watermarking_config", "constraints", "low_memory", "penalty_alpha", "num_beams", "dola_layers")
_KWARGS = {"max_new_tokens", "do_sample", "pad_token_id", "output_logits", "return_dict_in_generate"}
_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer", "ReservedLayer")


class ReservedLayer(DynamicLayer):
    """A full-attention :class:`DynamicLayer` whose keys and values are views of buffers with room for ``room`` more
    columns: a decoding step writes its column in place instead of concatenating (copying) the whole cache. The
    same keys and values as ``DynamicLayer``'s, so the same logits; anything that replaces ``keys`` / ``values``
    directly (crop, reorder) is adopted at the next update."""

    def __init__(self, room: int):
        super().__init__()
        self.room = room
        self._kv: tuple[torch.Tensor, torch.Tensor] | None = None   # the buffers, [B, heads, capacity, head_dim]
        self._view: torch.Tensor | None = None                        # the ``keys`` this layer last handed out

    @classmethod
    def adopt(cls, layer: DynamicLayer, room: int) -> ReservedLayer:
        """``layer``'s keys and values (no copy until the first update) with room for ``room`` more columns."""
        new = cls(room)
        if layer.is_initialized:
            new.lazy_initialization(layer.keys, layer.values)
            new.keys, new.values = layer.keys, layer.values
        return new

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, t = self.get_seq_length(), key_states.shape[-2]
        if self._kv is None or self.keys is not self._view or n + t > self._kv[0].shape[-2]:
            self._kv = tuple(torch.empty(*new.shape[:-2], n + t + self.room, new.shape[-1], dtype=new.dtype,  # type: ignore[assignment]
                                         device=new.device) for new in (key_states, value_states))
            if n:
                self._kv[0][:, :, :n].copy_(self.keys)
                self._kv[1][:, :, :n].copy_(self.values)
        self._kv[0][:, :, n:n + t].copy_(key_states)
        self._kv[1][:, :, n:n + t].copy_(value_states)
        self.keys, self.values = self._kv[0][:, :, :n + t], self._kv[1][:, :, :n + t]
        self._view = self.keys
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._kv is not None and self.keys is self._view:
            n = self.get_seq_length()
            self._kv = (self._kv[0][indices], self._kv[1][indices])
            self.keys, self.values = self._kv[0][:, :, :n], self._kv[1][:, :, :n]
            self._view = self.keys
        else:
            super().batch_select_indices(indices)


def row_wise(interventions: tuple) -> bool:
    """Whether every intervention acts on each row alike (so rows may leave the batch): steering's own edits
    (``site_edits``), :class:`RowGroups` of them, weight edits; not :class:`RowEdits` or arbitrary hooks."""
    for iv in _flat(interventions):
        if isinstance(iv, RowGroups):
            if not all(row_wise(g) for g in iv.groups):
                return False
        elif isinstance(iv, RowEdits) or not (hasattr(iv, "site_edits") or _is_weight_edit(iv)):
            return False
    return True


def can_drop_rows(model: Model, kw: dict[str, Any], interventions: tuple) -> bool:
    """Whether :func:`greedy_rows` decodes exactly as HF greedy ``generate`` would with ``kw`` here."""
    if isinstance(model, NNsightModel) or kw.get("do_sample") or set(kw) - _KWARGS:
        return False
    hf = model.hf
    if not isinstance(hf, PreTrainedModel) or getattr(hf.config, "is_encoder_decoder", False):
        return False  # e.g. an adapter with its own generate (or none)
    cfg, default = hf.generation_config, GenerationConfig()
    if any(getattr(cfg, a, None) != getattr(default, a, None) for a in _PROCESSORS):
        return False
    return row_wise(interventions)


def _fresh_cache(model: Model, prefix: Any, start: int, room: int = 0) -> Any:
    """The cache the prompt pass extends: the prefix's first ``start`` columns, or an empty one laid out as the
    model's config says; ``None`` when its layers cannot drop rows. Its full-attention layers are
    :class:`ReservedLayer` with ``room`` columns to spare for the decoding steps."""
    cache = kv_cache(prefix, start) if prefix is not None else DynamicCache(config=model.hf.config)
    layers = getattr(cache, "layers", None)
    if layers is None or any(type(la).__name__ not in _LAYERS for la in layers):
        return None
    cache.layers = [ReservedLayer.adopt(la, room) if type(la) is DynamicLayer else la for la in layers]
    return cache


def lowest_edited_layer(model: Model, interventions: tuple) -> int | None:
    """The lowest block any of ``interventions`` edits (``model.n_layers`` for none), so a prompt pass under them
    may take the plain pass's residual stream and keys and values below it; ``None`` when that cannot be told
    (an edit outside the blocks, a weight edit, a bare hook)."""
    low = model.n_layers
    for iv in _flat(interventions):
        if isinstance(iv, RowGroups):
            got = lowest_edited_layer(model, tuple(x for g in iv.groups for x in g))
        elif hasattr(iv, "site_edits"):
            layers = [parse_site(site, model.n_layers).layer for site in iv.site_edits(model)]
            got = None if any(la is None for la in layers) else min(layers, default=model.n_layers)
        else:
            got = None
        if got is None:
            return None
        low = min(low, got)
    return low


def _prefill(model: Model, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any, start: int,
             resume: tuple[int, torch.Tensor, Any] | None) -> torch.Tensor:
    """The prompt pass's last-token logits (float32), filling ``cache``; ``resume = (layer, resid, kv)``: the blocks
    below ``layer`` are stood in for by the plain pass's ``resid`` there and their keys and values ``kv``."""
    name = cache_kwarg(model)
    layer, resid, kv = resume if resume is not None else (0, None, None)
    with resume_from(model, layer, resid) as skipped, dense_unembed(model):
        logits = model.hf(input_ids=ids[:, start:], attention_mask=attn, position_ids=pos[:, start:],
                          use_cache=True, logits_to_keep=1, **{name: cache}).logits[:, -1].float()
    if skipped:  # the skipped blocks wrote nothing: theirs are the plain pass's
        for i in range(layer):
            cache.update(kv[i][0], kv[i][1], i)
    return logits


def _keep(cache: Any, idx: torch.Tensor) -> None:
    """Rows ``idx`` of every cache layer, each indexed on its own device (a model split over devices keeps each
    layer's keys and values on that layer's)."""
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.numel():
            layer.batch_select_indices(idx.to(keys.device))


@torch.inference_mode()
def greedy_rows(model: Model, inputs: dict[str, torch.Tensor], max_new_tokens: int, eos: set[int], handle: Any,
                prefix: Any = None, start: int = 0, firsts: list[torch.Tensor] | None = None,
                resume: tuple[int, torch.Tensor, Any] | None = None) -> list[list[int]] | None:
    """Greedy tokens for each row of ``inputs`` (``input_ids``, ``attention_mask``, ``position_ids``, left padded,
    on the model's device), each up to and including its first ``eos`` token, dropping finished rows as it goes;
    ``prefix``/``start``: the keys and values of the first ``start`` columns (only the later ones are computed);
    or ``resume = (layer, resid, kv)``: the plain pass's resid_pre at ``layer`` and its keys and values of every
    layer (from :func:`interp.forward.plain_states`; only the blocks from ``layer`` on are computed, exact when
    nothing below ``layer`` is edited, see :func:`lowest_edited_layer`).
    ``handle``: the :class:`~steering.applying.Steering` whose state follows the rows (``None``: no interventions).
    The prompt pass's last-token logits go to ``firsts``. ``None`` (nothing run) when the cache cannot drop rows."""
    if prefix is not None and resume is not None:
        raise ValueError("resume from the prompt's first columns (prefix=, start=) or from a layer (resume=), not both")
    cache = _fresh_cache(model, prefix, start, max_new_tokens)
    if cache is None:
        return None
    ids, attn, pos = inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"]
    name, B = cache_kwarg(model), ids.shape[0]
    logits = _prefill(model, ids, attn, pos, cache, start, resume)
    if firsts is not None:
        firsts.append(logits.cpu())
    stop = torch.tensor(sorted(eos), dtype=torch.long, device=ids.device)
    rows, out = torch.arange(B, device=ids.device), [[] for _ in range(B)]
    nxt = logits.argmax(-1)
    for step in range(max_new_tokens):
        for r, t in zip(rows.tolist(), nxt.tolist()):
            out[r].append(t)
        live = ~torch.isin(nxt, stop)
        if step == max_new_tokens - 1 or not bool(live.any()):
            break
        if not bool(live.all()):
            idx = live.nonzero().squeeze(1)
            _keep(cache, idx)
            attn, nxt, rows = attn[idx], nxt[idx], rows[idx]
            if handle is not None:
                handle.keep_rows(idx)
        attn = torch.cat([attn, attn.new_ones((len(rows), 1))], 1)
        logits = model.hf(input_ids=nxt[:, None], attention_mask=attn, position_ids=attn.sum(1, keepdim=True) - 1,
                          use_cache=True, **{name: cache}).logits[:, -1]
        nxt = logits.argmax(-1)
    return out


__all__ = ["can_drop_rows", "greedy_rows", "lowest_edited_layer", "row_wise"]
