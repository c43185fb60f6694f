"""``steering.apply(model, *interventions)``: attach interventions around ``forward`` and ``generate``.

Protocol: an intervention is any object with ``hook_fns(model) -> {site name: fn(x, ctx)}`` (the ``sae``
package's latent interventions qualify without importing ``steering``). Ours also expose
``site_edits(model)``; runs of them at one site with the same gate are composed into one low-rank map
and applied in one fused pass (:mod:`steering.fused`). Order is kept: at each site, edits run in the
order the interventions were given. Hooks live only inside the ``with`` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from interp.hooking import HookContext, hooks
from interp.models import Model
from interp.nnsight_backend import SKIP as TRACE_SKIP
from interp.nnsight_backend import NNsightModel, TraceEdit, refuse
from interp.sites import parse_site
from interp.tokens import SKIP, TokenState, TokenTracker
from steering.fused import LowRankEdit, apply_edit


@dataclass(eq=False)
class SiteEdit:
    """One edit at one site: a :class:`LowRankEdit` under a gate (scope, positions, optional condition)."""

    edit: LowRankEdit
    scope: str = "both"
    positions: Any = "all"
    cond: torch.Tensor | None = None       # [d] unit condition direction
    threshold: float = 0.0
    above: bool = True

    @property
    def gate_key(self) -> tuple | None:
        """Edits with equal keys may be composed; conditional edits never are (the gate reads x)."""
        return None if self.cond is not None else (self.scope, self.positions)

    def run(self, x: torch.Tensor, st: TokenState | None, backend: str = "auto") -> torch.Tensor:
        """``x`` edited where the gate opens on the pass ``st`` (the hook context's ``tokens``)."""
        if st is None:
            if self.scope != "both" or self.positions != "all":
                raise RuntimeError("this intervention has a scope/positions but the pass has no token state "
                                   "(ctx.tokens): attach it with steering.apply(model, ...) or interp.hooks(model, "
                                   "iv.hook_fns(model)), which record each forward pass's prompt and generated tokens")
            sel = None
        else:
            sel = st.select(self.scope, self.positions)
        if isinstance(sel, str) and sel == SKIP:
            return x
        U, W, b = self.edit.on(x.device)
        cond = None if self.cond is None else self.cond.to(x.device, torch.float32, non_blocking=True)
        return apply_edit(x, U, W, b, row_mask=sel, cond=cond, threshold=self.threshold, above=self.above,
                          backend=backend)


def merge(edits: list[SiteEdit]) -> list[SiteEdit]:
    """Compose consecutive edits that share a gate into one (fewer passes over the activations)."""
    out: list[SiteEdit] = []
    for e in edits:
        if out and e.gate_key is not None and out[-1].gate_key == e.gate_key:
            prev = out[-1]
            out[-1] = SiteEdit(prev.edit.then(e.edit), prev.scope, prev.positions)
        else:
            out.append(e)
    return out


def _native_fn(edits: list[SiteEdit], backend: str):
    def fn(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        for e in edits:
            x = e.run(x, ctx.tokens, backend)
        return x
    return fn


def _is_weight_edit(iv: Any) -> bool:
    """A weight edit (e.g. ``interp.patching.transplants.Transplant``): ``weights(model)`` is a context manager."""
    return hasattr(iv, "weights") and callable(iv.weights) and not hasattr(iv, "hook_fns") \
        and not hasattr(iv, "site_edits")


def _flat(interventions: tuple) -> list[Any]:
    out: list[Any] = []
    for iv in interventions:
        out += list(iv) if isinstance(iv, (list, tuple)) else [iv]
    return out


def plan_hooks(model: Model, interventions: tuple, backend: str = "auto") -> list[tuple[str, Any]]:
    """``[(site, fn), ...]`` in attach order; consecutive native edits at a site fused into one hook."""
    per_site: dict[str, list[Any]] = {}
    for iv in _flat(interventions):  # a list of interventions is accepted as if unpacked
        if _is_weight_edit(iv):
            continue                                                     # entered by apply, not a hook
        if hasattr(iv, "site_edits"):
            for site, edit in iv.site_edits(model).items():
                per_site.setdefault(parse_site(site, model.n_layers).name, []).append(edit)
        elif hasattr(iv, "hook_fns"):
            fns = iv.hook_fns(model)
            if not isinstance(fns, dict):
                raise TypeError(f"{type(iv).__name__}.hook_fns(model) must return a dict {{site: fn}}, got "
                                f"{type(fns).__name__}")
            for site, fn in fns.items():
                per_site.setdefault(parse_site(site, model.n_layers).name, []).append(fn)
        else:
            raise TypeError(f"{type(iv).__name__} is not an intervention: it needs a hook_fns(model) method "
                            f"returning {{site name: fn(x, ctx)}} (see steering.interventions), or a weights(model) "
                            f"context manager for a weight edit (see interp.patching.transplants.Transplant)")
    items: list[tuple[str, Any]] = []
    for site, seq in per_site.items():
        run: list[SiteEdit] = []
        for item in seq:
            if isinstance(item, SiteEdit):
                run.append(item)
                continue
            if run:
                items.append((site, _native_fn(merge(run), backend)))
                run = []
            items.append((site, item))
        if run:
            items.append((site, _native_fn(merge(run), backend)))
    return items


def _gate(scope: str, positions: Any):
    """The tokens of a prompt batch an edit with this scope and positions touches (the rule of
    :class:`~interp.tokens.TokenState`, on a cacheless pass of the batch): None, "skip" or ``Bool[B, T]``."""
    def gate(batch: Any) -> Any:
        tracker = TokenTracker()
        tracker.declare(batch.input_ids.shape[1], batch.input_ids.shape[0], batch.post_mask)
        st = tracker.record((), {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask})
        assert st is not None
        sel = st.select(scope, positions)
        return TRACE_SKIP if isinstance(sel, str) else sel
    return gate


def trace_edits(model: Model, interventions: tuple) -> list[TraceEdit]:
    """Steering's own interventions as :class:`~interp.nnsight_backend.TraceEdit` s (plain tensors and a gate),
    consecutive edits at a site with one gate composed; anything else is refused with the reason."""
    out: list[TraceEdit] = []
    for iv in _flat(interventions):
        if _is_weight_edit(iv):
            raise refuse(f"the weight edit {type(iv).__name__}")
        if not hasattr(iv, "site_edits"):
            raise refuse(f"{type(iv).__name__} (its hook_fns are Python functions that cannot travel with a trace)")
    per_site: dict[str, list[SiteEdit]] = {}
    for iv in _flat(interventions):
        for site, e in iv.site_edits(model).items():
            per_site.setdefault(parse_site(site, model.n_layers).name, []).append(e)
    for site, edits in per_site.items():
        for e in merge(edits):
            out.append(TraceEdit(site, e.edit.U, e.edit.W, e.edit.b, _gate(e.scope, e.positions), e.cond,
                                 e.threshold, e.above))
    return out


class Steering:
    """The handle yielded by :func:`apply`: the hooks' shared ``data``, and ``tokens`` (the
    :class:`~interp.tokens.TokenTracker` the hooks read as ``ctx.tokens``), where the prompt batch is declared."""

    def __init__(self, model: Model, data: dict[str, Any], tokens: TokenTracker | None = None):
        self.model = model
        self.data = data
        self.tokens = TokenTracker() if tokens is None else tokens

    def set_batch(self, batch: Any = None, post_mask: torch.Tensor | None = None, cached: int = 0) -> None:
        """Declare the next prompt batch (an ``interp.chat.Batch``, or just its ``post_mask [B, T]``), so
        ``positions='post_instruction'`` works on the next prompt pass of that shape. ``cached``: that pass
        computes only the columns after the first ``cached`` ones, whose keys and values are in the cache."""
        pm = post_mask if post_mask is not None else getattr(batch, "post_mask", None)
        ids = getattr(batch, "input_ids", None)
        if pm is None and ids is None:
            raise ValueError("set_batch needs an interp.chat.Batch or post_mask=Bool[B, T]")
        ref = pm if pm is not None else ids
        self.tokens.declare(ref.shape[1], ref.shape[0], pm, cached)

    def clear_batch(self) -> None:
        self.tokens.clear()

    def keep_rows(self, idx: torch.Tensor) -> None:
        """Only rows ``idx`` of the batch being generated go on (the others finished): the later passes hold
        just those rows, and the gates and row-wise edits (:class:`~steering.rows.RowGroups`) follow them."""
        self.tokens.keep_rows(idx)

    @property
    def state(self) -> TokenState | None:
        """The :class:`~interp.tokens.TokenState` of the last forward pass (None before the first)."""
        return self.tokens.state


@contextmanager
def apply(model: Model, *interventions: Any, backend: str = "auto") -> Iterator[Steering]:
    """Attach ``interventions`` for the block; yields a :class:`Steering`.

    The edit protocol: an activation edit has ``hook_fns(model) -> {site: fn(x, ctx)}`` (ours also
    ``site_edits``, fused per site); a weight edit has ``weights(model)``, a context manager that changes the
    weights and restores them (``interp.patching.transplants.Transplant``). Weight edits are entered first.

    Works around ``model.hf(...)``, ``model.hf.generate(...)`` (KV cache, left padding) and
    ``interp.capture`` (captures inside the block see the steered activations). Nested blocks compose.
    With no interventions the block is a no-op (the handle is yielded, nothing is attached), so a
    baseline runs through the same code as its steered conditions.
    """
    if not isinstance(model, Model):
        raise TypeError(f"apply expects an interp Model (interp.load_model / interp.models.from_hf), got "
                        f"{type(model).__name__}")
    if not interventions:
        yield Steering(model, {})
        return
    if isinstance(model, NNsightModel):  # the edits travel with each trace (to NDIF with remote=True)
        with model.editing(trace_edits(model, interventions)):
            yield Steering(model, {})
        return
    items = plan_hooks(model, interventions, backend)
    data: dict[str, Any] = {}
    tokens = TokenTracker()
    with ExitStack() as weights:
        for iv in _flat(interventions):
            if _is_weight_edit(iv):
                weights.enter_context(iv.weights(model))                 # restored on exit, also on error
        with hooks(model, items, data=data, tokens=tokens):
            yield Steering(model, data, tokens)
