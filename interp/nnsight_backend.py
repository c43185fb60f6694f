"""The nnsight backend: the core's forward passes run as nnsight traces, locally or on NDIF (``remote=True``).

A model from ``interp.from_nnsight(lm, backend="nnsight")`` is a :class:`NNsightModel`. On it, every batch that
:func:`interp.capturing.capture`, :func:`interp.readout.logits` / ``token_logprobs`` and
:func:`interp.forward.forward` run (without hooks) becomes one ``with lm.trace(...)`` block, and
``steering.apply(model, ...)`` hands its edits to that block instead of attaching PyTorch hooks. The same
site names (:mod:`interp.sites`), position rules (:func:`interp.positions.plan`, computed here from the batch)
and batching (:func:`interp.forward.prepare` / ``batches``: left padding, ``position_ids`` from the mask) are
used; only the last step differs: the values a site reads and writes are reached through nnsight's
``.input`` / ``.output`` of the module our ArchSpec names, in execution order.

What travels to the trace is plain data: module envoys, torch tensors (position indices, averaging weights,
the edit matrices ``U, W, b`` of :class:`TraceEdit`, token masks), numbers and strings. The block's code
is written with torch alone and calls nothing of this project, because for ``remote=True`` nnsight ships the
block's source and the objects it names to the NDIF server, where this package is not installed. The block
applies an edit as ``x + g * (b - U^T (W x))`` in float32, the same math as ``steering.fused.edit_torch``.

Tested (tests/test_nnsight_backend.py, tiny random HF models, CPU, nnsight 0.8.1): the backend equals our
hooks within 1e-5 (bit for bit on CPU) for capture at every site kind (llama, gemma2, gpt2, gpt_neox, olmo2,
qwen3_moe) and every position rule, and for logits and captures under AddVector, DirectionalAblation, Clamp
and AblateSubspace (sites, scope, positions, conditions), also against an nnsight block written by hand;
nnsight's dry run of the remote path, ``remote="local"`` (the block serialised as for NDIF and run from the
payload), gives the same numbers, and the payload deserialises with every module of this project refused.
Not tested: a real NDIF run (no network here), so neither NDIF's own limits on shipped code nor its model
keys; models larger than the tiny ones; GPU. Not supported (clear errors): ``experts_out`` /
``shared_expert_out`` sites, hook functions of our own (``forward(..., hook_fns)``, interventions with only
``hook_fns``, e.g. SAE latent edits), ``interp.hooks``, weight edits (``steering.bake``, ``bake_addition``),
gradients, prefix reuse, resuming from a layer, and generation (``steering.generate``): each refuses the model
(:meth:`NNsightModel.require_local`). Direct ``model.hf(...)`` calls bypass the trace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor

from interp.chat import Batch
from interp.hooking import norm_parts
from interp.models import Model
from interp.positions import Plan
from interp.sites import ATTN_KINDS, MOE_KINDS, Site, parse_site

SKIP = "skip"  # a TraceEdit's gate: this batch has no token to edit

# where a site kind is reached: (path in the ArchSpec, "input" | "output", rank in a block's execution order)
_TAPS: dict[str, tuple[str, str, int]] = {
    "resid_pre": ("", "input", 0), "attn_z": ("attn_proj", "input", 2), "attn_out": ("attn_out", "output", 3),
    "mlp_in": ("mlp", "input", 4), "mlp_post": ("mlp_proj", "input", 5), "mlp_module_out": ("mlp", "output", 6),
    "mlp_out": ("mlp_out", "output", 7), "resid_post": ("", "output", 8),
}
UNSUPPORTED = ("through the nnsight backend; supported there: interp.capture, interp.logits, interp.token_logprobs, "
               "interp.forward.forward / last_logits without hooks, and steering.apply with steering's own "
               "interventions (AddVector, Ablate, DirectionalAblation, Clamp, AblateSubspace). For the rest, wrap the "
               "model without backend='nnsight' (interp.from_nnsight(lm) attaches our hooks to the same modules); "
               "attention sites (q, k, v, rot_q, rot_k, scores, pattern) need such a local model too: interp.load_model "
               "/ interp.from_hf")
ATTENTION_REFUSED = ("attention sites (q, k, v, rot_q, rot_k, scores, pattern) are not available through the nnsight "
                     "backend: scores and pattern exist only inside the attention function, which a trace reaches as "
                     "no module's input or output, and the sites are read by switching that function locally. Load "
                     "the model with interp.load_model / interp.from_hf (or interp.from_nnsight(lm) without "
                     "backend='nnsight')")


@dataclass(eq=False)
class TraceEdit:
    """One edit at one site for the trace: ``x -> x + g * (b - U^T (W x))`` (``U, W [k, d]``, ``b [d]`` or None).

    ``gate(batch)`` says which tokens of a batch ``g`` covers: ``None`` (every token), :data:`SKIP`, or
    ``Bool[B, T]``; ``cond`` (unit ``[d]``) further gates on ``x . cond > threshold`` (``<`` when not ``above``)."""

    site: str
    U: Tensor
    W: Tensor
    b: Tensor | None = None
    gate: Callable[[Batch], Any] | None = None
    cond: Tensor | None = None
    threshold: float = 0.0
    above: bool = True


@dataclass(repr=False)
class NNsightModel(Model):
    """A :class:`Model` whose passes run as traces of the nnsight model ``lm`` (``remote``: ``False``, ``True``
    for NDIF, ``"local"`` for nnsight's serialising dry run, or a host URL); ``trace_kwargs`` go to every
    ``lm.trace`` (e.g. ``{"verbose": True}``). ``edits`` holds the edits of the open ``steering.apply`` blocks."""

    lm: Any = None
    remote: bool | str = False
    trace_kwargs: dict[str, Any] = field(default_factory=dict)
    edits: list[TraceEdit] = field(default_factory=list)

    @contextmanager
    def editing(self, edits: Sequence[TraceEdit]) -> Iterator[None]:
        """Add ``edits`` to every trace of the block (nested blocks compose in order); removed on exit."""
        edits = list(edits)
        for e in edits:
            site = parse_site(e.site, self.n_layers)
            if site.kind in ATTN_KINDS:
                raise ValueError(f"{site.name}: {ATTENTION_REFUSED}")
            if site.kind in MOE_KINDS or site.kind not in (*_TAPS, "resid_mid"):
                raise ValueError(f"{site.name}: editing {site.kind} is not available {UNSUPPORTED}")
        self.edits.extend(edits)
        try:
            yield
        finally:
            for e in edits:
                self.edits.remove(e)

    def require_local(self, what: str) -> None:
        """Our hooks, weight edits and generation act on the local modules, not in the trace (nor on NDIF)."""
        raise refuse(what)

    def __repr__(self) -> str:
        return f"NNsightModel({self.name!r}, family={self.spec.family}, layers={self.n_layers}, remote={self.remote!r})"


def refuse(what: str) -> NotImplementedError:
    """The error for a feature the nnsight backend does not offer."""
    return NotImplementedError(f"{what} is not available {UNSUPPORTED}")


def _envoy(model: NNsightModel, path: str, layer: int | None) -> tuple[str, Any]:
    """``(full path, envoy)`` of a module by ArchSpec path (block-relative with ``layer``; ``""`` is the block)."""
    full = path if layer is None else f"{model.spec.layers}.{layer}" + (f".{path}" if path else "")
    return full, model.lm.get(full)


def _tap(model: NNsightModel, site: Site) -> tuple[tuple, str, tuple[str, Any]]:
    """``(order key, io, (path, envoy))`` of the one value a site kind reads or writes (not resid_mid / ln_final)."""
    spec = model.spec
    if site.kind == "ln_final_out":
        return (model.n_layers, 1), "output", _envoy(model, spec.final_norm, None)
    if site.kind in ATTN_KINDS:
        raise ValueError(f"{site.name}: {ATTENTION_REFUSED}")
    if site.kind not in _TAPS:
        raise ValueError(f"{site.name}: the {site.kind} site is not available {UNSUPPORTED}")
    attr, io, rank = _TAPS[site.kind]
    path = getattr(spec, attr) if attr else ""
    if path is None:
        raise ValueError(f"{site.name}: this is a mixture-of-experts layer (no dense MLP projection); use mlp_out")
    return (site.layer, rank), io, _envoy(model, path, site.layer)


def _add(taps: dict, model: NNsightModel, site: Site, act: tuple) -> None:
    """Put ``act`` at the tap(s) of ``site``; resid_mid stashes resid_pre where the block reads it first."""
    if site.kind == "resid_mid":
        if model.spec.resid_mid_in is None:
            raise ValueError(f"{site.name}: {model.spec.family} uses a parallel residual, so there is no resid_mid")
        stash = ((site.layer, 1), "input", _envoy(model, model.spec.resid_pre_in, site.layer))
        taps.setdefault((stash[2][0], "input"), (stash, []))[1].append(("stash",))
        key, io, env = _tap(model, Site("attn_out", site.layer))
        act = (act[0], "mid", *act[2:])
    elif site.kind == "ln_final":
        key, io, env = (model.n_layers, 0), "input", _envoy(model, model.spec.final_norm, None)
    else:
        key, io, env = _tap(model, site)
    taps.setdefault((env[0], io), ((key, io, env), []))[1].append(act)


def schedule(model: NNsightModel, batch: Batch, reads: Sequence[tuple[Site, Plan]],
             edits: Sequence[TraceEdit]) -> list[tuple[Any, str, list[tuple]]]:
    """``[(envoy, io, actions)]`` in execution order: at each value, the edits (in the order given), then the
    reads (a read of ``resid_mid`` / ``ln_final`` is computed from the values it is made of, as our hooks do);
    read ``k`` of ``reads`` carries ``k`` as its third field."""
    taps: dict = {}
    for e in edits:
        rows = None if e.gate is None else e.gate(batch)
        if isinstance(rows, str) and rows == SKIP:
            continue
        cond = None if e.cond is None else e.cond.float()
        _add(taps, model, parse_site(e.site, model.n_layers),
             ("edit", "x", e.U.float(), e.W.float(), None if e.b is None else e.b.float(), rows, cond,
              float(e.threshold), bool(e.above)))
    norm = norm_parts(model.module(model.spec.final_norm), model.spec.norm_offset)
    for k, (site, p) in enumerate(reads):
        _add(taps, model, site, ("read", "norm" if site.kind == "ln_final" else "x", k, p.index, p.weights,
                                 bool(p.squeeze), float(norm.eps), bool(norm.centre)))
    ordered = sorted(taps.values(), key=lambda t: t[0][0])
    return [(env, io, acts) for (_, io, (_, env)), acts in ordered]


def repeated(batch: Batch, repeat: int) -> Batch:
    """``batch`` stacked ``repeat`` times along the rows (as :func:`interp.forward.forward` stacks it)."""
    if repeat == 1:
        return batch
    return replace(batch, **{f.name: getattr(batch, f.name).repeat(repeat, 1) for f in fields(batch)
                             if isinstance(getattr(batch, f.name), Tensor)})


def trace_batch(model: NNsightModel, batch: Batch, reads: Sequence[tuple[Site, Plan]] = (),
                logits: str | None = None, repeat: int = 1) -> tuple[list[Tensor], Tensor | None]:
    """One trace of ``batch`` with the model's edits: the ``reads`` (each site at its plan, on the CPU, in the
    model's dtype; ``[B, (P,) width]``) and the logits (``"all"`` ``[B, T, V]``, ``"last"`` ``[B, V]``, float32)."""
    if logits not in ("all", "last", None):
        raise ValueError(f"logits must be 'all', 'last' or None, got {logits!r}")
    batch = repeated(batch, repeat)
    taps = schedule(model, batch, reads, model.edits)
    kw: dict[str, Any] = {**batch.model_inputs, "use_cache": False, **model.trace_kwargs}
    if logits == "last":
        kw["logits_to_keep"] = 1
    if model.remote:
        kw["remote"] = model.remote
    with torch.inference_mode():
        got, out = run_trace(model.lm, kw, taps, logits is not None)
    if out is not None:
        out = out.float()
        out = out[:, -1] if logits == "last" else out
    order = [act[2] for _, _, acts in taps for act in acts if act[0] == "read"]  # the trace reads in model order
    ys: list[Tensor] = [torch.empty(0)] * len(reads)
    for k, y in zip(order, got, strict=True):
        ys[k] = y
    return ys, out


def run_trace(lm: Any, kw: dict[str, Any], taps: list, want_logits: bool) -> tuple[list[Tensor], Tensor | None]:
    """The trace itself. Its block uses torch only (it is shipped as source to NDIF with ``remote=True``)."""
    import nnsight

    out = None
    with lm.trace(**kw) as tracer:
        got = nnsight.save([])
        pre = None
        for env, io, acts in taps:
            v = env.input if io == "input" else env.output
            x = v[0] if isinstance(v, tuple) else v
            x0 = x
            for act in acts:
                if act[0] == "stash":
                    pre = x
                    continue
                base = pre + x if act[1] == "mid" else x
                if act[0] == "read":
                    idx, w, squeeze, eps, centre = act[3:]
                    if act[1] == "norm":  # ln_final.hook_normalized: the final norm's input, normalised, no gain
                        f = base.float() - base.float().mean(-1, keepdim=True) if centre else base.float()
                        base = (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(base.dtype)
                    if w is not None:
                        y = torch.einsum("bt...,bt->b...", base.float(), w.to(base.device, torch.float32))
                    elif idx is not None:
                        y = base[torch.arange(base.shape[0], device=base.device)[:, None], idx.to(base.device)]
                        y = y[:, 0] if squeeze else y
                    else:
                        y = base
                    got.append(y.to("cpu"))
                    continue
                U, W, b, rows, cond, thr, above = act[2:]
                xf = base.reshape(-1, base.shape[-1])
                cdt = torch.float64 if xf.dtype == torch.float64 else torch.float32
                xf = xf.to(cdt)
                y = torch.addmm(xf, xf @ W.to(xf.device, cdt).T, U.to(xf.device, cdt), alpha=-1) if U.shape[0] else xf
                y = y if b is None else y + b.to(xf.device, cdt)
                g = None if rows is None else rows.reshape(-1).to(xf.device)
                if cond is not None:
                    proj = xf @ cond.to(xf.device, cdt)
                    c = proj > thr if above else proj < thr
                    g = c if g is None else g & c
                y = (y if g is None else torch.where(g[:, None], y, xf)).to(base.dtype).reshape(base.shape)
                x = y - pre if act[1] == "mid" else y
            if x is not x0:
                new = (x, *v[1:]) if isinstance(v, tuple) else x
                if io == "input":
                    env.input = new
                else:
                    env.output = new
        if not want_logits:
            tracer.stop()  # every read is in: the rest of the model need not run
        out = lm.output.logits.save()
    return got, out


__all__ = ["NNsightModel", "SKIP", "TraceEdit", "refuse", "repeated", "run_trace", "schedule", "trace_batch"]
