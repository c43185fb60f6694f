"""The replacement model: each MLP's output written as transcoder features + skip + an error term.

:class:`ReplacementModel` runs the real HF model with our hooks (``interp.hooks``; no monkeypatching). In
:meth:`~ReplacementModel.run` every MLP module's output (site ``mlp_module_out.L``) is replaced by the
transcoder's prediction ``z @ W_dec + b_dec (+ x @ W_skip)`` plus the error ``real out - prediction``, so the
logits equal the real model's. The run records what the linearised model needs: feature activations, errors, the
token embeddings (``resid_pre.0``), the attention's query and key projections and every norm's scale.

:meth:`~ReplacementModel.frozen` is the linearised model of one recorded run: attention patterns frozen (the
``q_proj`` / ``k_proj`` outputs are the recorded ones, so only the value path carries a change), norm
denominators frozen (``norm(x) = gain(centre(x) * s_recorded)``), and feature activations, errors and
embeddings are inputs (held at their recorded values unless given). The residual stream is then affine in those
inputs; the constant part is the transcoders' ``b_dec`` and the model's own biases (norm and projection biases).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from jaxtyping import Int

from interp.arch import get_module, has_module
from interp.chat import Batch
from interp.forward import batches, encodings, forward
from interp.hooking import hooks, module_hooks, norm_parts
from interp.models import Model
from interp.sites import parse_site
from interp.values import Prompts
from interp.weights import unembed
from sae.clt import CrossLayerTranscoder, check_clt
from sae.transcoder import Transcoder
from sae.transcoder import check_transcoders as sae_checks

Acts = Mapping[int, torch.Tensor]  # {layer: [b, T, d_sae]} (b = 1 or the pass's batch)
READ_KINDS = ("resid_pre", "resid_mid", "resid_post", "ln_final_out")


def check_transcoder(model: Model, layer: int, tc: Transcoder) -> None:
    """A clear error unless ``tc`` is a transcoder of ``model``'s layer ``layer`` (width, layer, model id: the
    checks of :func:`sae.transcoder.check_transcoders`) that reads ``mlp_in.L`` and writes ``mlp_module_out.L``."""
    if not isinstance(tc, Transcoder):
        raise TypeError(f"layer {layer}: expected a sae.transcoder.Transcoder, got {type(tc).__name__}")
    if tc.layer != layer:
        raise ValueError(f"the transcoder given for layer {layer} was made for layer {tc.layer}")
    sae_checks(model, {layer: tc})
    kinds = (parse_site(tc.cfg.input_site or "").kind, parse_site(tc.site or "").kind)
    if kinds != ("mlp_in", "mlp_module_out"):
        raise ValueError(f"the layer-{layer} transcoder reads {tc.cfg.input_site} and writes {tc.site}; the "
                         f"replacement model needs transcoders from mlp_in.L to mlp_module_out.L")


def check_transcoders(model: Model, transcoders: Sequence[Transcoder] | Mapping[int, Transcoder]
                      ) -> dict[int, Transcoder]:
    """``{layer: transcoder}`` for every layer of ``model``, each checked by :func:`check_transcoder`."""
    items = list(transcoders.items()) if isinstance(transcoders, Mapping) else \
        [(getattr(t, "layer", None), t) for t in transcoders]
    out: dict[int, Transcoder] = {}
    for layer, tc in items:
        if layer in out:
            raise ValueError(f"two transcoders for layer {layer}; give one per layer")
        check_transcoder(model, layer, tc)
        out[layer] = tc
    missing = [i for i in range(model.n_layers) if i not in out]
    if missing:
        raise ValueError(f"no transcoder for layers {missing}: the replacement model replaces every MLP, so give "
                         f"one transcoder per layer 0..{model.n_layers - 1}")
    return dict(sorted(out.items()))


@dataclass
class ReplacementRun:
    """One prompt through the replacement model. Per layer: ``acts [T, d_sae]`` (feature activations),
    ``errors [T, d]`` (real MLP out - transcoder prediction), ``mlp_in [T, d]``; ``embed [T, d]`` (resid_pre.0),
    ``logits [T, V]`` (equal to the real model's), and the recorded ``q`` / ``k`` projections and norm scales
    (by module) that :meth:`ReplacementModel.frozen` holds fixed."""

    batch: Batch
    acts: dict[int, torch.Tensor]
    errors: dict[int, torch.Tensor]
    mlp_in: dict[int, torch.Tensor]
    embed: torch.Tensor
    logits: torch.Tensor
    qk: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    scales: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def ids(self) -> Int[torch.Tensor, "T"]:  # noqa: F821
        return self.batch.input_ids[0]

    @property
    def n_positions(self) -> int:
        return int(self.batch.input_ids.shape[1])


def _qk_modules(model: Model, layer: int) -> tuple[nn.Module, nn.Module]:
    block = model.block(layer)
    paths = [f"{model.spec.attn}.q_proj", f"{model.spec.attn}.k_proj"]
    if not all(has_module(block, p) for p in paths):
        raise ValueError(f"{model.spec.family}: the linearised model freezes attention patterns by holding the "
                         f"q_proj / k_proj outputs, and this family has no separate {paths} (a fused projection); "
                         f"attribution graphs support families with separate query and key projections (Llama, "
                         f"Gemma, Qwen, Mistral, OLMo)")
    return get_module(block, paths[0]), get_module(block, paths[1])


def _norm_modules(model: Model) -> dict[str, nn.Module]:
    """Every norm the residual stream passes through: the blocks' norms and the final norm, by path."""
    out = {}
    for i in range(model.n_layers):
        for p in model.spec.norms:
            if has_module(model.block(i), p):
                out[f"{i}.{p}"] = get_module(model.block(i), p)
    out["final"] = model.module(model.spec.final_norm)
    return out


def _norm_input(mod: nn.Module, args: tuple) -> torch.Tensor:
    if not args:
        raise RuntimeError(f"{type(mod).__name__} was called without a positional input; the linearised model cannot "
                           f"read and freeze its scale")
    return args[0]


def _centred(x: torch.Tensor, centre: bool) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True) if centre else x


class ReplacementModel:
    """The HF ``model`` with every MLP replaced by its transcoder plus an error term (``transcoders``: one per
    layer, a list or ``{layer: Transcoder}``, or a :class:`~sae.clt.CrossLayerTranscoder`, whose layer ``l``
    features also write into every later MLP's output). Its logits equal the real model's; :meth:`frozen` is the
    linearised model attribution graphs differentiate. ``transcoders`` holds the per-layer parts (for a CLT:
    encoders, same-layer decoders, ``b_dec``), ``clt`` the CLT (``None`` for per-layer transcoders)."""

    def __init__(self, model: Model,
                 transcoders: Sequence[Transcoder] | Mapping[int, Transcoder] | CrossLayerTranscoder):
        self.model = model
        self.clt = transcoders if isinstance(transcoders, CrossLayerTranscoder) else None
        if self.clt is not None:
            transcoders = check_clt(model, self.clt)
        self.transcoders = check_transcoders(model, transcoders)
        self.qk_modules = {i: _qk_modules(model, i) for i in range(model.n_layers)}
        self.norms = _norm_modules(model)
        self.offset = float(model.spec.norm_offset)

    @property
    def n_layers(self) -> int:
        return self.model.n_layers

    def cross(self, layer: int, zs: Acts, out: torch.Tensor) -> torch.Tensor:
        """``out`` plus what the CLT's earlier layers' latents ``zs`` write into MLP ``layer`` (``out`` itself for
        per-layer transcoders)."""
        extra = None if self.clt is None else self.clt.cross_write(layer, zs)
        return out if extra is None else out + extra.to(out.dtype)

    @property
    def d_model(self) -> int:
        return self.model.d_model

    def batch(self, prompt: str | Prompts | Sequence[int] | torch.Tensor, max_positions: int | None = None) -> Batch:
        """One prompt (a string: the chat template; ``interp.Prompts([text], chat=False)``: raw text; or token
        ids) as a batch of one."""
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.reshape(-1).tolist()
        encs = encodings(self.model, Prompts([prompt]) if isinstance(prompt, str) else
                         prompt if isinstance(prompt, Prompts) else [prompt])
        n = len(encs[0].ids)
        if max_positions is not None and n > max_positions:
            raise ValueError(f"the prompt has {n} tokens, over the graph budget max_positions={max_positions}; "
                             f"shorten the prompt or pass a larger max_positions=")
        return batches(self.model, encs, 1)[0]

    def run(self, prompt: str | Prompts | Sequence[int] | torch.Tensor | Batch,
            max_positions: int | None = None) -> ReplacementRun:
        """The replacement model on one prompt, recording everything :meth:`frozen` needs."""
        batch = prompt if isinstance(prompt, Batch) else self.batch(prompt, max_positions)
        rec: dict[str, Any] = {"acts": {}, "errors": {}, "mlp_in": {}, "qk": {}, "scales": {}}
        fns: list[tuple[str, Any]] = [("resid_pre.0", lambda x, ctx: rec.__setitem__("embed", x[0].detach()))]
        for layer, tc in self.transcoders.items():
            fns.append((f"mlp_in.{layer}", self._record_in(rec, layer)))
            fns.append((f"mlp_module_out.{layer}", self._splice(rec, layer, tc, self.cross)))
        with torch.no_grad(), module_hooks(self._record_module_hooks(rec)):
            logits = forward(self.model, batch, fns, grad=True)
        assert logits is not None
        return ReplacementRun(batch, rec["acts"], rec["errors"], rec["mlp_in"], rec["embed"], logits[0],
                              rec["qk"], rec["scales"])

    @staticmethod
    def _record_in(rec: dict[str, Any], layer: int) -> Any:
        def fn(x: torch.Tensor, ctx: Any) -> None:
            rec["mlp_in"][layer] = x[0].detach()
        return fn

    @staticmethod
    def _splice(rec: dict[str, Any], layer: int, tc: Transcoder, cross: Any) -> Any:
        def fn(out: torch.Tensor, ctx: Any) -> torch.Tensor:
            x = rec["mlp_in"][layer][None]
            z = tc.encode(x)
            pred = cross(layer, {i: a[None] for i, a in rec["acts"].items()}, tc.decode(z, x)).to(out.dtype)
            err = out - pred
            rec["acts"][layer], rec["errors"][layer] = z[0].detach(), err[0].detach()
            return pred + err
        return fn

    def _record_module_hooks(self, rec: dict[str, Any]) -> list[tuple[nn.Module, str, Any]]:
        items: list[tuple[nn.Module, str, Any]] = []
        for layer, (q, k) in self.qk_modules.items():
            rec["qk"][layer] = [None, None]

            def grab(mod: nn.Module, args: tuple, out: Any, layer: int = layer, j: int = 0) -> None:
                rec["qk"][layer][j] = out[0].detach()
            items += [(q, "post", grab), (k, "post", lambda m, a, o, layer=layer: grab(m, a, o, layer, 1))]
        for key, norm in self.norms.items():
            parts = norm_parts(norm, self.offset)

            def scale(mod: nn.Module, args: tuple, out: Any, key: str = key, centre: bool = parts.centre,
                      eps: float = parts.eps) -> None:
                xc = _centred(_norm_input(mod, args)[0].detach(), centre)
                rec["scales"][key] = torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
            items.append((norm, "post", scale))
        return items

    def _freeze_module_hooks(self, run: ReplacementRun, b: int) -> list[tuple[nn.Module, str, Any]]:
        """Hold the attention's q / k projections and every norm's scale at the run's values (batch ``b``)."""
        items: list[tuple[nn.Module, str, Any]] = []
        for layer, (q, k) in self.qk_modules.items():
            rq, rk = run.qk[layer]
            items.append((q, "post", lambda m, a, o, t=rq: t.expand(b, *t.shape).contiguous()))
            items.append((k, "post", lambda m, a, o, t=rk: t.expand(b, *t.shape).contiguous()))
        for key, norm in self.norms.items():
            parts = norm_parts(norm, self.offset)

            def frozen(mod: nn.Module, args: tuple, out: Any, s: torch.Tensor = run.scales[key], parts: Any = parts
                       ) -> torch.Tensor:
                x = _norm_input(mod, args)
                y = _centred(x, parts.centre) * s.to(x.dtype)
                if parts.weight is not None:  # in x's dtype (NormParts.gain works in float32 for Gemma)
                    y = y * (parts.offset + parts.weight.to(x.dtype))
                return (y if parts.bias is None else y + parts.bias.to(x.dtype)).to(out.dtype)
            items.append((norm, "post", frozen))
        return items

    @contextmanager
    def frozen(self, run: ReplacementRun, acts: Acts | None = None, errors: Acts | None = None,
               embed: torch.Tensor | None = None, batch: int = 1, grad: bool = False,
               read: Sequence[str] = ()) -> Iterator[dict[str, Any]]:
        """Hooks of the linearised model of ``run`` for a forward of ``batch`` copies of its prompt.

        ``acts`` / ``errors`` (``{layer: [b, T, .]}``, b = 1 or ``batch``) and ``embed [b, T, d]`` replace the
        recorded inputs (layers not given keep theirs). Yields ``stash``, filled by the forward with
        ``mlp_in[L]``, ``mlp_out[L]`` (what the replaced MLP writes), ``embed`` (a leaf with ``grad``) and
        ``sites[name]`` for each site in ``read``; run the forward inside (as :meth:`linear` does)."""
        stash: dict[str, Any] = {"mlp_in": {}, "mlp_out": {}, "sites": {}}
        e = (run.embed[None] if embed is None else embed).expand(batch, *run.embed.shape).clone()
        stash["embed"] = e.requires_grad_(grad)
        fns: list[tuple[str, Any]] = [("resid_pre.0", lambda x, ctx: stash["embed"])]
        given = {i: run.acts[i][None] if acts is None or i not in acts else acts[i] for i in self.transcoders}
        for layer, tc in self.transcoders.items():
            a = given[layer]
            er = run.errors[layer][None] if errors is None or layer not in errors else errors[layer]
            const = self.cross(layer, given, a.to(tc.dtype) @ tc.W_dec + tc.b_dec + er.to(tc.dtype)).detach()
            fns.append((f"mlp_in.{layer}", lambda x, ctx, layer=layer: stash["mlp_in"].__setitem__(layer, x)))
            fns.append((f"mlp_module_out.{layer}", self._linear_write(stash, layer, tc, const)))
        fns += [(s, self._reader(stash, s)) for s in read]
        with module_hooks(self._freeze_module_hooks(run, batch)), hooks(self.model, fns):
            yield stash

    @staticmethod
    def _linear_write(stash: dict[str, Any], layer: int, tc: Transcoder, const: torch.Tensor) -> Any:
        def fn(out: torch.Tensor, ctx: Any) -> torch.Tensor:
            x = stash["mlp_in"][layer]
            skip = tc.skip_out(x)
            new = (const if skip is None else const + skip).to(out.dtype).expand_as(out)
            if torch.is_grad_enabled() and not new.requires_grad:  # a leaf, so its gradient can be read
                new = new.clone().requires_grad_(True)
            stash["mlp_out"][layer] = new
            return new
        return fn

    @staticmethod
    def _reader(stash: dict[str, Any], site: str) -> Any:
        def fn(x: torch.Tensor, ctx: Any) -> None:
            stash["sites"][site] = x
        return fn

    def check_read(self, site: str) -> str:
        """The canonical name of a readout site (residual sites or ``ln_final.hook_out``); a clear error else."""
        s = parse_site(site, self.n_layers)
        if s.kind not in READ_KINDS:
            raise ValueError(f"targets read the residual stream: use a site of kind {READ_KINDS}, not {s.name}")
        return s.name

    def linear(self, run: ReplacementRun, acts: Acts | None = None, errors: Acts | None = None,
               embed: torch.Tensor | None = None, batch: int = 1, grad: bool = False,
               read: Sequence[str] = ()) -> dict[str, Any]:
        """One forward of the linearised model (see :meth:`frozen`); the stash, with ``logits [b, T, V]``."""
        read = [self.check_read(s) for s in read]
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx, self.frozen(run, acts, errors, embed, batch, grad, read) as stash:
            stash["logits"] = forward(self.model, run.batch, grad=True, repeat=batch)
        return stash

    def replaced(self, run: ReplacementRun, edit: Any = None, batch: int = 1, freeze: bool = False,
                 read: Sequence[str] = ()) -> dict[str, Any]:
        """The (nonlinear) replacement model with errors held at ``run``'s values: downstream features are
        re-encoded from their changed inputs. ``edit(layer, z [b, T, d_sae]) -> z`` changes activations;
        ``freeze``: hold attention patterns and norm scales too. Returns the stash (``sites``, ``logits``)."""
        read = [self.check_read(s) for s in read]
        stash: dict[str, Any] = {"mlp_in": {}, "sites": {}, "acts": {}}
        fns: list[tuple[str, Any]] = []
        for layer, tc in self.transcoders.items():
            fns.append((f"mlp_in.{layer}", lambda x, ctx, layer=layer: stash["mlp_in"].__setitem__(layer, x)))

            def write(out: torch.Tensor, ctx: Any, layer: int = layer, tc: Transcoder = tc) -> torch.Tensor:
                x = stash["mlp_in"][layer]
                z = tc.encode(x)
                z = z if edit is None else edit(layer, z)
                stash["acts"][layer] = z
                pred = self.cross(layer, stash["acts"], tc.decode(z, x))
                return (pred + run.errors[layer].to(tc.dtype)).to(out.dtype)
            fns.append((f"mlp_module_out.{layer}", write))
        fns += [(s, self._reader(stash, s)) for s in read]
        frozen = self._freeze_module_hooks(run, batch) if freeze else []
        with torch.no_grad(), module_hooks(frozen), hooks(self.model, fns):
            stash["logits"] = forward(self.model, run.batch, grad=True, repeat=batch)
        return stash


__all__ = ["ReplacementModel", "ReplacementRun", "check_transcoder", "check_transcoders", "unembed"]
