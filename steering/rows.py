"""Per-row edits: row ``i`` of the batch gets its own direction or vector (:class:`RowEdits`, batched candidate
scoring), or each block of rows its own interventions (:class:`RowGroups`, several conditions in one batch).

Scoring many candidate directions at once stacks the prompts once per candidate along the batch; each
row's hooks then use that row's own edit, so one forward pass scores a whole chunk of candidates. Generating the
same prompts under several conditions stacks them once per condition, each block of rows under its own
interventions, so one wide batch replaces several narrow ones. Both are interventions like the others
(``hook_fns(model)``), so they compose in :func:`steering.apply`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int

from interp.hooking import HookContext
from interp.models import Model
from interp.sites import WRITERS
from interp.tokens import TokenState, TokenTracker
from steering.applying import _flat, _is_weight_edit, plan_hooks

ABLATE_KINDS = WRITERS  # the writers, as steering.DirectionalAblation's default (interp.sites.WRITERS)


@dataclass(eq=False)
class RowEdits:
    """Per-row ablation and/or addition for one forward pass over ``rows`` (e.g. candidates x prompts).

    ``ablate [rows, d]``: unit directions projected out at every layer's ``resid_pre``, ``attn_out`` and
    ``mlp_out`` (row ``i`` equals ``DirectionalAblation(ablate[i])`` run alone). ``add [rows, d]``: vectors
    added at ``resid_pre`` of ``add_layer[i]`` (row ``i`` equals ``AddVector(add[i], layers=add_layer[i],
    sites="resid_pre")`` run alone). Where both apply at one site, the ablation runs first.

    ``ablate_mask [rows, T]`` (bool, the prompt pass's columns): ablate only those tokens, e.g. each row's
    post-instruction tokens (``Batch.post_mask`` repeated per candidate), which equals
    ``DirectionalAblation(ablate[i], positions="post_instruction")`` on that pass; ``None``: every token.
    """

    ablate: Float[torch.Tensor, "rows d"] | None = None
    add: Float[torch.Tensor, "rows d"] | None = None
    add_layer: Int[torch.Tensor, " rows"] | None = None
    ablate_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.ablate is None and self.add is None:
            raise ValueError("RowEdits needs ablate=[rows, d] and/or add=[rows, d]")
        if self.add is not None and (self.add_layer is None or self.add_layer.shape != self.add.shape[:1]):
            raise ValueError("RowEdits(add=...) needs add_layer=[rows], one layer index per row of add")
        for name, t in (("ablate", self.ablate), ("add", self.add)):
            if t is not None and t.dim() != 2:
                raise ValueError(f"RowEdits.{name} must be [rows, d], got shape {tuple(t.shape)}")
        if self.ablate_mask is not None:
            if self.ablate is None:
                raise ValueError("RowEdits(ablate_mask=...) restricts an ablation: pass ablate=[rows, d] too")
            if self.ablate_mask.dim() != 2 or self.ablate_mask.shape[0] != self.ablate.shape[0]:
                raise ValueError(f"RowEdits.ablate_mask must be Bool[rows, T] with rows = {self.ablate.shape[0]}, "
                                 f"got shape {tuple(self.ablate_mask.shape)}")

    @property
    def rows(self) -> int:
        """Number of batch rows the edits are for; the forward's batch must have exactly this many."""
        return (self.ablate if self.ablate is not None else self.add).shape[0]  # type: ignore[union-attr]

    def _check(self, x: torch.Tensor) -> None:
        if x.shape[0] != self.rows:
            raise ValueError(f"RowEdits holds edits for {self.rows} rows but the batch has {x.shape[0]}; stack the "
                             f"prompts once per candidate (interp.forward.last_logits(..., repeat=k))")

    def hook_fns(self, model: Model) -> dict[str, Callable[[torch.Tensor, HookContext], torch.Tensor]]:
        """``{site: fn(x, ctx)}``: the per-row ablation at every writer site, the addition at its layers."""
        steps: dict[str, list[Callable[[torch.Tensor], torch.Tensor]]] = {}
        if self.ablate is not None:
            r = self.ablate.to(model.device, model.dtype)
            keep = None if self.ablate_mask is None else self.ablate_mask.to(model.device, model.dtype)

            def ablate(x: torch.Tensor) -> torch.Tensor:
                proj = torch.einsum("btd,bd->bt", x, r)
                if keep is not None:
                    if keep.shape[1] != x.shape[1]:
                        raise ValueError(f"RowEdits.ablate_mask covers {keep.shape[1]} tokens but this pass has "
                                         f"{x.shape[1]}; build it from the batch being run (its post_mask)")
                    proj = proj * keep
                return x - proj[..., None] * r[:, None, :]

            for layer in range(model.n_layers):
                for kind in ABLATE_KINDS:
                    steps.setdefault(f"blocks.{layer}.hook_{kind}", []).append(ablate)
        if self.add is not None:
            assert self.add_layer is not None
            v = self.add.to(model.device, model.dtype)
            row_layer = self.add_layer.to(model.device)
            for layer in sorted(set(self.add_layer.tolist())):
                sel = (row_layer == layer).to(model.dtype)[:, None, None]

                def add(x: torch.Tensor, sel: torch.Tensor = sel) -> torch.Tensor:
                    return x + sel * v[:, None, :]

                steps.setdefault(f"blocks.{layer}.hook_resid_pre", []).append(add)
        return {site: self._chain(fs) for site, fs in steps.items()}

    def _chain(self, fs: list[Callable[[torch.Tensor], torch.Tensor]]) -> Any:
        def fn(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
            self._check(x)
            for f in fs:
                x = f(x)
            return x
        return fn


@dataclass(eq=False)
class RowGroups:
    """Each block of rows under its own interventions: the batch holds ``len(groups)`` equal consecutive blocks
    of rows (the same prompts stacked once per group, e.g. ``encs * 3``), and block ``g`` runs ``groups[g]`` (a
    sequence of interventions, empty for a plain block), so one forward or generation serves several conditions.

    Block ``g`` equals running ``groups[g]`` alone on those rows (up to the float rounding of a wider batch): each
    group's hooks see only its rows, and ``positions=`` / ``scope=`` gates (the pass's
    :class:`~interp.tokens.TokenState`) are sliced to them. Hooks that look beyond their own rows, row-indexed
    edits (:class:`RowEdits`) and weight edits cannot be split by rows and are refused. When finished rows
    leave a generation (:meth:`~steering.applying.Steering.keep_rows`), each remaining row keeps its block's edits."""

    groups: Any

    def __post_init__(self) -> None:
        self.groups = [tuple(_flat(tuple(g))) for g in self.groups]
        if not self.groups:
            raise ValueError("RowGroups needs at least one group (a sequence of interventions; () for a plain block)")
        for iv in (iv for g in self.groups for iv in g):
            if _is_weight_edit(iv) or isinstance(iv, (RowEdits, RowGroups)):
                raise ValueError(f"RowGroups cannot split {type(iv).__name__} by rows (a weight edit acts on every "
                                 f"row; row-indexed edits index the whole batch); run that condition on its own")

    def hook_fns(self, model: Model) -> dict[str, Callable[[torch.Tensor, HookContext], torch.Tensor]]:
        """``{site: fn(x, ctx)}``: at each site any group edits, each block of rows through its group's hooks."""
        plans = [plan_hooks(model, g) for g in self.groups]
        sites = dict.fromkeys(site for plan in plans for site, _ in plan)
        return {site: self._at_site([[fn for s, fn in plan if s == site] for plan in plans]) for site in sites}

    def _at_site(self, chains: list[list[Any]]) -> Callable[[torch.Tensor, HookContext], torch.Tensor]:
        k = len(chains)

        def fn(x: torch.Tensor, ctx: HookContext) -> torch.Tensor:
            st = ctx.tokens
            if st is not None and x.shape[0] not in (st.batch, st.batch * st.seq):
                raise ValueError(f"the hook at {ctx.site.name} sees {x.shape[0]} leading rows, neither the batch's "
                                 f"{st.batch} rows nor its {st.batch * st.seq} tokens: RowGroups cannot split it")
            kept = None if st is None else st.kept
            if kept is not None:  # some rows finished generating: each row's block from its original index
                counts, views = _blocks_left(ctx.data, st, k)
            else:
                if x.shape[0] % k:
                    raise ValueError(f"RowGroups holds {k} groups but the batch has {x.shape[0]} rows, not a "
                                     f"multiple; stack the prompts once per group (encodings * {k})")
                counts, views = [x.shape[0] // k] * k, [_block_view(ctx.data, st, g, k) for g in range(k)]
            per_token = kept is not None and st.seq > 1 and x.shape[0] == st.batch * st.seq
            parts = list(torch.split(x, [c * st.seq for c in counts] if per_token else counts))
            for g, chain in enumerate(chains):  # each block is one run of consecutive rows (or of their tokens)
                if chain and counts[g]:
                    sub = HookContext(ctx.site, ctx.model, *views[g])
                    for f in chain:
                        parts[g] = f(parts[g], sub)
            return torch.cat(parts)
        return fn


View = tuple[dict, TokenTracker | None]  # a block's hook data and token state


def _blocks_left(data: dict, st: TokenState, k: int) -> tuple[list[int], list[View]]:
    """A batch that lost its finished rows: rows per block, and each block's view (its own data dict, its rows'
    token state), built once per pass. Row ``i`` was the batch's row ``kept.index[i]`` of ``kept.total``, so it
    belongs to block ``kept.index[i] // (kept.total // k)``; the kept rows stay in their original order, so each
    block is still one run of consecutive rows."""
    assert st.kept is not None
    total, rows = st.kept.total, st.kept.index
    if total % k:
        raise ValueError(f"RowGroups holds {k} groups but the batch had {total} rows, not a multiple")
    key = ("row_groups_left", k)
    if key not in st._cache:
        counts = torch.bincount(rows // (total // k), minlength=k).tolist()
        views, a = [], 0
        for c in counts:
            views.append(({**data}, TokenTracker(st.rows(slice(a, a + c)))))
            a += c
        st._cache[key] = (counts, views)
    return st._cache[key]


def _block_view(data: dict, st: TokenState | None, g: int, k: int) -> View:
    """The hooks' data and token state as block ``g`` of ``k`` sees them: a dict of its own (hooks that stash a
    value for a later site keep their block's), and the pass's token state sliced to its rows (built once per pass
    and block)."""
    if st is None:
        return data, None
    key = ("row_groups", k)
    if key not in st._cache:
        n = st.batch // k
        st._cache[key] = [({**data}, TokenTracker(st.rows(slice(i * n, (i + 1) * n)))) for i in range(k)]
    return st._cache[key][g]


__all__ = ["RowEdits", "RowGroups"]
