"""SAE interventions: splice the reconstruction in, steer along a latent, ablate latents (error kept).

Each object follows the project's intervention protocol (shared with ``steering``, never imported here):
``hook_fns(model) -> {site: fn(x, ctx)}``, used as ``with interp.hooking.hooks(model, iv.hook_fns(model)):``.
``positions`` limits the edit to some sequence positions (``None``: every position, including tokens
generated later). ``sinks="exclude"`` (latent steering and ablation) leaves each prompt's first real token alone:
in many models it is an attention sink whose activations are orders of magnitude larger than the rest, where an
SAE trained without it is out of distribution; it reads the pass's token state, ``ctx.tokens``, which
``interp.hooks`` (and so ``steering.apply``) records for every forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from interp.bundle import check_model
from interp.positions import check_sinks
from interp.tokens import TokenState
from interp.values import moved_keywords
from sae.model import SAE
from sae.runner import SINK_MOVED

HookFn = Callable[[torch.Tensor, Any], "torch.Tensor | None"]


def _site_width(model: Any, kind: str) -> int | None:
    if kind in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "ln_final"):
        return int(model.d_model)
    if kind == "attn_z":
        return int(model.n_heads * model.d_head)
    if kind == "mlp_post":
        return int(model.d_mlp) if model.d_mlp else None
    return None


def check_site(sae: SAE, model: Any, site: str | None = None) -> str:
    """Resolve the site an SAE applies to on ``model`` and check the widths agree; returns the site name."""
    from interp.sites import parse_site

    check_model(sae, model, "this SAE")
    name = site or sae.site
    if name is None:
        raise ValueError("this SAE does not record its site; pass site='blocks.L.hook_resid_post' (or similar)")
    try:
        s = parse_site(name, model.n_layers)
    except ValueError as e:
        raise ValueError(f"cannot splice this SAE: its hook {name!r} is not a site we can hook ({e})") from None
    width = _site_width(model, s.kind)
    if width is not None and width != sae.d_in:
        raise ValueError(f"SAE width d_in={sae.d_in} does not match site {s.name} of {getattr(model, 'name', 'the model')} "
                         f"(width {width}); use an SAE trained on this model and site")
    return s.name


def _flat(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Apply ``fn`` over the last axis, flattening heads (``attn_z``: ``[b, s, h, d_head]``)."""

    def g(x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4:
            return fn(x.flatten(-2)).unflatten(-1, x.shape[-2:])
        return fn(x)

    return g


def _at_positions(x: torch.Tensor, new: torch.Tensor, positions: Sequence[int] | slice | None) -> torch.Tensor:
    if positions is None:
        return new
    out = x.clone()
    idx = positions if isinstance(positions, slice) else [p for p in positions if -x.shape[1] <= p < x.shape[1]]
    out[:, idx] = new[:, idx]
    return out


def _keep_sink(x: torch.Tensor, new: torch.Tensor, ctx: Any) -> torch.Tensor:
    """``new`` with each row's first real prompt token (the attention sink) set back to ``x``. Reads the pass's
    token state ``ctx.tokens`` (an :class:`interp.tokens.TokenState`), recorded by ``interp.hooks``."""
    st: TokenState | None = getattr(ctx, "tokens", None)
    if st is None:
        raise ValueError("sinks=\"exclude\" needs to know each row's first real token (ctx.tokens), which is recorded "
                         "for each forward pass of the model inside interp.hooks(model, edit.hook_fns(model)) or "
                         "steering.apply(model, edit); call the hook functions through one of those")
    if st.past > 0:   # a cached pass holds generated tokens only
        return new
    start = st.prompt.start.to(x.device)
    rows = torch.arange(x.shape[0], device=x.device)
    inside = start < x.shape[1]
    out = new.clone()
    out[rows[inside], start[inside]] = x[rows[inside], start[inside]]
    return out


def _edit(x: torch.Tensor, new: torch.Tensor, ctx: Any, positions: Sequence[int] | slice | None,
          skip_sink: bool) -> torch.Tensor:
    out = _at_positions(x, new, positions)
    return _keep_sink(x, out, ctx) if skip_sink else out


class SAESplice:
    """Replace the site's activation by the SAE reconstruction (``keep_error=True``: add the error back,
    a no-op on outputs but it routes the computation through the latents for patching)."""

    def __init__(self, sae: SAE, site: str | None = None, keep_error: bool = False,
                 positions: Sequence[int] | slice | None = None):
        self.sae, self.site, self.keep_error, self.positions = sae, site, keep_error, positions
        self.last_latents: torch.Tensor | None = None

    def hook_fns(self, model: Any) -> dict[str, HookFn]:
        site = check_site(self.sae, model, self.site)
        sae = self.sae

        def edit(x: torch.Tensor) -> torch.Tensor:
            z = sae.encode(x)
            self.last_latents = z.detach()
            rec = sae.decode(z).to(x.dtype)
            return rec + (x - rec).detach() if self.keep_error else rec

        f = _flat(edit)
        return {site: lambda x, ctx: _at_positions(x, f(x), self.positions)}


class TranscoderSplice:
    """Replace each MLP's output (``mlp_module_out.L``) by its transcoder's prediction from that MLP's input
    (``mlp_in.L``, read in the same pass): every MLP of ``transcoders`` at once. ``transcoders``: ``{layer: tc}`` or
    one per layer (checked by :func:`sae.transcoder.check_transcoders`), or a :class:`sae.clt.CrossLayerTranscoder`
    (each MLP's prediction adds the earlier layers' cross-layer writes of the same pass). ``keep_error=True`` adds the error back
    (outputs unchanged, the computation routed through the latents). ``last_latents``: ``{layer: z}`` of the last run."""

    def __init__(self, transcoders: Any, keep_error: bool = False):
        self.transcoders, self.keep_error = transcoders, keep_error
        self.last_latents: dict[int, torch.Tensor] = {}

    def hook_fns(self, model: Any) -> dict[str, HookFn]:
        from interp.sites import Site
        from sae.clt import CrossLayerTranscoder, check_clt
        from sae.transcoder import check_transcoders

        clt = self.transcoders if isinstance(self.transcoders, CrossLayerTranscoder) else None
        tcs = check_clt(model, clt) if clt is not None else check_transcoders(model, self.transcoders)
        fns: dict[str, HookFn] = {}
        for layer, tc in tcs.items():
            key = f"transcoder_in.{layer}"

            def stash(x: torch.Tensor, ctx: Any, key: str = key) -> None:
                ctx.data[key] = x

            def replace(y: torch.Tensor, ctx: Any, key: str = key, tc: Any = tc, layer: int = layer) -> torch.Tensor:
                x = ctx.data.pop(key).to(tc.device)
                z = tc.encode(x)
                self.last_latents[layer] = z.detach()
                pred = tc.decode(z, x)
                cross = None if clt is None else clt.cross_write(layer, self.last_latents)  # this pass's earlier layers
                pred = (pred if cross is None else pred + cross).to(y.device, y.dtype)
                return pred + (y - pred).detach() if self.keep_error else pred

            fns[Site("mlp_in", layer).name] = stash
            fns[Site("mlp_module_out", layer).name] = replace
        return fns


class TranscoderAblation:
    """Set transcoder features to ``value`` (0: ablate) at every position, the error term kept: at
    ``mlp_module_out.L`` add ``(value - z_f) * W_dec[f]`` for each chosen feature ``f`` of layer ``L``, ``z`` encoded
    from that MLP's input in the same pass (``only_active``: only where the feature fires). ``features``: ``(layer,
    feature)`` pairs; ``transcoders``: ``{layer: tc}`` or a list. ``sinks`` as for :class:`LatentSteering`."""

    @moved_keywords(SINK_MOVED)
    def __init__(self, transcoders: Any, features: Sequence[tuple[int, int]], value: float = 0.0,
                 only_active: bool = True, sinks: str = "keep"):
        from sae.clt import CrossLayerTranscoder

        if isinstance(transcoders, CrossLayerTranscoder):
            raise TypeError("TranscoderAblation writes through per-layer decoders only; for a cross-layer transcoder "
                            "use interp.patching.graph_edits.DecoderEdit(clt, edits), which writes into every later MLP")
        tcs = dict(transcoders) if isinstance(transcoders, dict) else {t.layer: t for t in transcoders}
        self.features = [(int(la), int(f)) for la, f in features]
        if not self.features:
            raise ValueError("no transcoder features given")
        for la, f in self.features:
            if la not in tcs:
                raise ValueError(f"feature {f} of layer {la}: no transcoder for layer {la} was given")
            _check_latents(tcs[la], [f])
        self.transcoders = {la: tcs[la] for la in sorted({la for la, _ in self.features})}
        self.value, self.only_active, self.sinks = float(value), only_active, check_sinks(sinks)

    def hook_fns(self, model: Any) -> dict[str, HookFn]:
        from interp.sites import Site
        from sae.transcoder import check_transcoders

        fns: dict[str, HookFn] = {}
        for layer, tc in check_transcoders(model, self.transcoders).items():
            idx = torch.tensor([f for la, f in self.features if la == layer], dtype=torch.long, device=tc.device)
            key = f"transcoder_ablation_in.{layer}.{id(self)}"

            def stash(x: torch.Tensor, ctx: Any, key: str = key) -> None:
                ctx.data[key] = x

            def write(y: torch.Tensor, ctx: Any, key: str = key, tc: Any = tc, idx: torch.Tensor = idx) -> torch.Tensor:
                z = tc.encode(ctx.data.pop(key).to(tc.device))[..., idx]
                target = torch.full_like(z, self.value)
                if self.only_active and self.value != 0.0:
                    target = torch.where(z > 0, target, z)
                new = y + ((target - z) @ tc.W_dec[idx]).to(y.device, y.dtype)
                return _keep_sink(y, new, ctx) if self.sinks == "exclude" else new

            fns[Site("mlp_in", layer).name] = stash
            fns[Site("mlp_module_out", layer).name] = write
        return fns


class LatentSteering:
    """Add ``alpha * W_dec[latent]`` (the decoder vector) for each latent at the SAE's site (``alpha``: one strength,
    or one per latent; the name every steering edit uses for its strength, as ``steering.AddVector``)."""

    @moved_keywords(SINK_MOVED)
    def __init__(self, sae: SAE, latents: int | Sequence[int], alpha: float | Sequence[float] = 1.0,
                 site: str | None = None, positions: Sequence[int] | slice | None = None, sinks: str = "keep"):
        self.sae, self.site, self.positions, self.sinks = sae, site, positions, check_sinks(sinks)
        self.latents = [latents] if isinstance(latents, int) else list(latents)
        _check_latents(sae, self.latents)
        alphas = [alpha] * len(self.latents) if isinstance(alpha, (int, float)) else list(alpha)
        if len(alphas) != len(self.latents):
            raise ValueError(f"{len(alphas)} alphas for {len(self.latents)} latents: give one alpha or one per latent")
        self.alphas = alphas

    def vector(self) -> torch.Tensor:
        """The added vector ``[d_in]``."""
        c = torch.tensor(self.alphas, dtype=self.sae.dtype, device=self.sae.device)
        return (c[:, None] * self.sae.W_dec[self.latents]).sum(0).detach()

    def hook_fns(self, model: Any) -> dict[str, HookFn]:
        site = check_site(self.sae, model, self.site)
        v = self.vector()
        f = _flat(lambda x: x + v.to(x.device, x.dtype))
        return {site: lambda x, ctx: _edit(x, f(x), ctx, self.positions, self.sinks == "exclude")}


class LatentAblation:
    """Set latents to ``value`` (0: ablate) and keep the SAE error term: ``x - sum (z_l - value) W_dec[l]``.

    Everything the SAE fails to reconstruct passes through untouched, so only the chosen latents change."""

    @moved_keywords(SINK_MOVED)
    def __init__(self, sae: SAE, latents: int | Sequence[int], value: float = 0.0, site: str | None = None,
                 positions: Sequence[int] | slice | None = None, only_active: bool = True, sinks: str = "keep"):
        self.sae, self.site, self.positions, self.value = sae, site, positions, float(value)
        self.sinks = check_sinks(sinks)
        self.latents = [latents] if isinstance(latents, int) else list(latents)
        self.only_active = only_active
        _check_latents(sae, self.latents)

    def _delta(self, z: torch.Tensor) -> torch.Tensor:
        """What the edit adds at each token, from the chosen latents' activations ``z [..., len(latents)]``."""
        target = torch.full_like(z, self.value)
        if self.only_active and self.value != 0.0:  # clamping: only where the latent is on
            target = torch.where(z > 0, target, z)
        return (target - z) @ self.sae.W_dec[self.latents]

    def hook_fns(self, model: Any) -> dict[str, HookFn]:
        site = check_site(self.sae, model, self.site)
        sae = self.sae
        idx = torch.tensor(self.latents, dtype=torch.long, device=sae.device)

        def edit(x: torch.Tensor) -> torch.Tensor:
            z = sae.encode(x.to(sae.device))[..., idx]          # the block may sit on another device (device_map)
            return x + self._delta(z).to(x.device, x.dtype)

        f = _flat(edit)
        return {site: lambda x, ctx: _edit(x, f(x), ctx, self.positions, self.sinks == "exclude")}


class MatchedRemoval(LatentAblation):
    """The random control of :class:`LatentAblation` (value 0): at each token, take out exactly as much as ablating
    ``latents`` would (the norm of ``z_latents @ W_dec[latents]``), at the same tokens, but along ``others``'
    decoder vectors weighted by the same activations (``z_latents @ W_dec[others]``, rescaled to that norm).

    Same positions, same size, other directions: a difference from the ablation is about the directions, not about
    how much was removed where. ``others``: one latent per latent in ``latents`` (e.g. a matched random draw)."""

    @moved_keywords(SINK_MOVED)
    def __init__(self, sae: SAE, latents: Sequence[int], others: Sequence[int], site: str | None = None,
                 positions: Sequence[int] | slice | None = None, sinks: str = "keep"):
        super().__init__(sae, [int(i) for i in latents], site=site, positions=positions, sinks=sinks)
        self.others = [int(i) for i in others]
        _check_latents(sae, self.others)
        if len(self.others) != len(self.latents):
            raise ValueError(f"{len(self.others)} other latents for {len(self.latents)} latents: give one each")

    def _delta(self, z: torch.Tensor) -> torch.Tensor:
        cut, alt = z @ self.sae.W_dec[self.latents], z @ self.sae.W_dec[self.others]
        return -alt * (cut.norm(dim=-1, keepdim=True) / alt.norm(dim=-1, keepdim=True).clamp_min(1e-12))


def _check_latents(sae: SAE, latents: list[int]) -> None:
    if not latents:
        raise ValueError("no latents given")
    bad = [i for i in latents if not 0 <= int(i) < sae.d_sae]
    if bad:
        raise ValueError(f"latents {bad} are out of range; this SAE has latents 0..{sae.d_sae - 1}")
