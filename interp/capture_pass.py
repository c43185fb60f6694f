"""One forward pass keeping sites at a position plan: the engine under :func:`interp.capture` and
:func:`interp.capturing.capture_groups`.

Sites come in groups; each group is one ``[b, S, (P,) width]`` tensor of one width, and every group of a pass is
filled by the same forward, which stops as soon as every requested site has been seen.
"""

from __future__ import annotations

import torch

from interp.attention import keys_aligned
from interp.chat import Batch
from interp.forward import forward
from interp.hooking import HookContext, StopForward
from interp.models import Model
from interp.nnsight_backend import NNsightModel, trace_batch
from interp.positions import Plan, PositionSpec, plan
from interp.sites import Site

Part = tuple[torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"]
"""One group's ``(acts [b, S, (P,) width], mask [b, P] or None, sink flags or None)``."""

WIDTH_HELP = ("one Activations tensor holds sites of one width; capture each width group in its own call "
              "(e.g. sites='resid_post' and sites='mlp_post' separately), or all of them in one pass with "
              "interp.capturing.capture_groups(model, prompts, {'resid': 'resid_post', 'mlp': 'mlp_post'})")


def run_groups(model: Model, batch: Batch, groups: list[list[Site]], rule: PositionSpec, out_dtype: torch.dtype,
               need_logits: bool = False, skip_special: bool = True, pin: bool = False, sinks: str = "exclude",
               n_keys: int | None = None) -> tuple[list[Part], torch.Tensor | None]:
    """One forward pass keeping every group of ``groups`` at ``rule``: per group ``(acts, mask, flags)`` on the
    CPU (see :func:`interp.capturing.run_batch_flagged`), and the logits ``[b, T, V]`` if ``need_logits``."""
    p = plan(rule, batch, skip_special=skip_special, sinks=sinks)
    if isinstance(model, NNsightModel):  # one nnsight trace (locally or on NDIF), the same plan
        return _run_nnsight(model, batch, groups, p, out_dtype, need_logits)
    flat = [(g, i, s) for g, group in enumerate(groups) for i, s in enumerate(group)]
    bufs: list[torch.Tensor | None] = [None] * len(groups)  # [b, S, (P,) d] on the CPU, allocated at first hook
    flags: list[list[torch.Tensor | None]] = [[None] * len(group) for group in groups]
    seen: set[tuple[int, int]] = set()
    devices: set[torch.device] = set()
    keys = batch.input_ids.shape[1] if n_keys is None else n_keys

    def make(g: int, i: int, site: Site):
        aligned = site.kind in ("scores", "pattern")

        def fn(x: torch.Tensor, ctx: HookContext) -> None:
            if aligned:
                y, flags[g][i] = _pattern_rows(x, p, batch.attention_mask, keys)
            else:
                y, flags[g][i] = p.take(x.flatten(2) if x.dim() > 3 else x)
            devices.add(y.device)
            buf = bufs[g]
            if buf is None:
                with torch.inference_mode(False):  # a normal tensor, so users can edit it in place later
                    buf = bufs[g] = torch.empty((y.shape[0], len(groups[g]), *y.shape[1:]), dtype=out_dtype,
                                                pin_memory=pin and y.is_cuda)
            if y.shape[-1] != buf.shape[-1]:
                raise ValueError(f"{site.name} has width {y.shape[-1]}, the sites before it {buf.shape[-1]}: "
                                 f"{WIDTH_HELP}")
            buf[:, i].copy_(y, non_blocking=True)
            seen.add((g, i))
            if len(seen) == len(flat) and not need_logits:
                raise StopForward
        return fn

    logits = forward(model, batch, [(s, make(g, i, s)) for g, i, s in flat], logits="all" if need_logits else None)
    for d in devices:
        if d.type == "cuda":  # the non-blocking copies into the buffers must land before anyone reads them
            torch.cuda.synchronize(d)
    missing = [s.name for g, i, s in flat if (g, i) not in seen]
    if missing:
        raise RuntimeError(f"sites {missing} never fired during the forward pass; is the ArchSpec right for this model?")
    parts = [(*_masked(buf, p, g > 0), _stacked(f, p)) for g, (buf, f) in enumerate(zip(bufs, flags, strict=True))]
    return parts, None if logits is None else logits.to("cpu")


def _pattern_rows(x: torch.Tensor, p: Plan, attention_mask: torch.Tensor, keys: int
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``scores`` / ``pattern [b, H, T, T]`` at the plan's query rows, keys left-aligned: ``[b, (P,) H * keys]``
    and the sink flags. Kept rows are picked before the keys are aligned (a row rule copies ``P`` rows, not the
    ``T x T`` table); the flags read each row's norm over heads and keys (the alignment only moves keys)."""
    if p.index is None or p.weights is not None:  # every row, or a mean over rows
        return p.take(keys_aligned(x, attention_mask, keys).flatten(2))
    b, H, _, K = x.shape
    _, flags = p.take(torch.linalg.vector_norm(x, dim=(1, 3), dtype=torch.float32)[..., None])  # [b, T, 1]
    idx = p.index.to(x.device)
    rows = torch.gather(x, 2, idx.view(b, 1, -1, 1).expand(b, H, idx.shape[1], K))  # [b, H, P, T]
    y = keys_aligned(rows, attention_mask, keys).flatten(2)                           # [b, P, H * keys]
    return (y[:, 0] if p.squeeze else y), flags


def _run_nnsight(model: NNsightModel, batch: Batch, groups: list[list[Site]], p: Plan, out_dtype: torch.dtype,
                 need_logits: bool) -> tuple[list[Part], torch.Tensor | None]:
    """:func:`run_groups` through one nnsight trace; a mean that leaves out sinks reads every token and averages here."""
    local = p.weights is not None and p.sinks == "exclude"
    read = Plan(mask=p.real) if local else p
    ys, logits = trace_batch(model, batch, [(s, read) for group in groups for s in group],
                             logits="all" if need_logits else None)
    parts, k = [], 0
    for g, group in enumerate(groups):
        got = [p.take(y.float()) if local else (y, None) for y in ys[k:k + len(group)]]
        k += len(group)
        acts, mask = _masked(torch.stack([y for y, _ in got], 1).to(out_dtype), p, g > 0)
        parts.append((acts, mask, _stacked([f for _, f in got], p)))
    return parts, None if logits is None else logits.to("cpu")


def _stacked(flags: list[torch.Tensor | None], p: Plan) -> torch.Tensor | None:
    """Per-site flags as ``[b, S, P]`` bool (positions kept) or ``[b, S]`` counts (means, one position)."""
    if not flags or any(f is None for f in flags):
        return None
    f = torch.stack([t.to("cpu") for t in flags], 1)
    return f.sum(-1) if f.dtype == torch.bool and p.n_positions is None else f


def _masked(acts: torch.Tensor, p: Plan, copy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``acts [b, S, (P,) width]`` with padding positions zeroed (not garbage), and the plan's mask (or None;
    ``copy``: a copy of it, for a second group of the same pass)."""
    mask = p.mask if p.n_positions is not None else None
    if mask is not None and not mask.all():
        keep = mask.view(mask.shape[0], 1, mask.shape[1], *([1] * (acts.dim() - 3)))
        acts.mul_(keep.to(acts.dtype))
    return acts, None if mask is None else (mask.clone() if copy else mask)


__all__ = ["WIDTH_HELP", "run_groups"]
