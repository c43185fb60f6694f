"""Acausal crosscoders for model diffing: one sparse dictionary over two (or more) models' activations at one site on
the same tokens. The encoder reads the models' activations side by side (``[x_A, x_B]``, width ``n * d``); each
latent has one decoder vector per model (``W_dec [d_sae, n * d]``, model ``m``'s block ``d_j^m``). The kinds
(``crosscoder_batchtopk``, ``crosscoder_relu``: :mod:`sae.kinds.crosscoder`) weigh a latent by the sum of its
per-model decoder norms; everything else (model, loss, the trainer: data parallel, resumable, checkpoints) is the
SAE's. Data: two tensors, two :class:`~interp.activations.Activations` or two
:class:`~interp.store.ActivationStore` of the same tokens (:func:`paired`), or two models and prompts captured on the
fly (:func:`capture_paired`). Analysis (norm ratios, latent scaling, classes): :mod:`sae.crosscoder_analysis`.

While training the decoder rows ``[d_j^A, d_j^B]`` keep unit norm together, and the inputs are normalised by one
scale for both models (``E ||[x_A, x_B]||^2 = 2 d``): the models are assumed to share units at the site, as a model
and its fine-tune do. Rescale one model's activations yourself if their norms differ widely.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from interp.activations import Activations
from interp.bundle import read_object, register_kind, save_object
from sae.kinds.crosscoder import model_norms
from sae.model import SAE, SAEConfig
from sae.train_config import TrainConfig, TrainResult
from sae.trainer import Trainer, train_sae

ARCHS = ("crosscoder_batchtopk", "crosscoder_relu")


class Crosscoder(SAE):
    """An SAE over ``n_models`` models' activations side by side. ``encode``: ``[..., n * d] -> [..., d_sae]``
    (:meth:`join` makes the input from per-model tensors); :meth:`decode_models`: ``[..., n, d]``."""

    def __init__(self, cfg: SAEConfig, seed: int | None = 0):
        if cfg.arch not in ARCHS:
            raise ValueError(f"a Crosscoder is arch {ARCHS}, got {cfg.arch!r}")
        super().__init__(cfg, seed=seed)

    @classmethod
    def build(cls, d_model: int, d_sae: int, arch: str = "crosscoder_batchtopk", k: int | None = 32,
              models: Sequence[str] = ("base", "chat"), site: str | None = None, seed: int | None = 0) -> Crosscoder:
        """A fresh crosscoder over ``len(models)`` models of width ``d_model`` (``k``: BatchTopK's mean active count)."""
        models = [str(m) for m in models]
        cfg = SAEConfig(d_in=len(models) * d_model, d_sae=d_sae, arch=arch, k=k if arch == ARCHS[0] else None,
                        site=site, model_id=" | ".join(models), options={"n_models": len(models), "models": models})
        return cls(cfg, seed=seed)

    @property
    def n_models(self) -> int:
        return int(self.cfg.options["n_models"])

    @property
    def d_model(self) -> int:
        return self.d_in // self.n_models

    @property
    def models(self) -> list[str]:
        return list(self.cfg.options.get("models") or [f"model {m}" for m in range(self.n_models)])

    def join(self, *xs: torch.Tensor) -> torch.Tensor:
        """The crosscoder's input from one tensor ``[..., d]`` per model (same tokens, same order)."""
        if len(xs) != self.n_models:
            raise ValueError(f"this crosscoder reads {self.n_models} models ({self.models}); got {len(xs)} tensors")
        shapes = {tuple(x.shape) for x in xs}
        if len(shapes) != 1 or xs[0].shape[-1] != self.d_model:
            raise ValueError(f"each model's activations must be [..., {self.d_model}] with the same tokens; got shapes "
                             f"{[tuple(x.shape) for x in xs]}")
        return torch.cat([x.to(self.dtype) for x in xs], -1)

    def decoders(self) -> torch.Tensor:
        """The per-model decoder vectors ``[d_sae, n_models, d]``."""
        return self.W_dec.reshape(self.d_sae, self.n_models, self.d_model)

    def decoder_norms(self) -> torch.Tensor:
        """``||d_j^m||`` ``[d_sae, n_models]``."""
        return model_norms(self)

    def decode_models(self, z: torch.Tensor) -> torch.Tensor:
        """Each model's reconstruction ``[..., n_models, d]`` of latents ``z [..., d_sae]``."""
        return self.decode(z).unflatten(-1, (self.n_models, self.d_model))

    @torch.no_grad()
    def normalize_decoder_(self) -> None:
        """Unit-norm decoder rows, the norms folded into the encoder; BatchTopK's threshold (on the score
        ``relu(pre) * sum_m ||d^m||``, which this leaves unchanged) is kept."""
        before = None if self.threshold is None else self.threshold.clone()
        super().normalize_decoder_()
        if before is not None:
            self.threshold.copy_(before)

    def view(self, model: int | str, inputs: str = "alone") -> SAE:
        """A plain SAE of width ``d`` for one model (by index or name): its decoder block ``d_j^m`` and ``b_dec``
        block, for steering (:class:`sae.edits.LatentSteering`) and ablating (:class:`sae.edits.LatentAblation`)
        at the crosscoder's site with that model alone.

        Its encoder approximates the crosscoder's, which reads every model. ``inputs="alone"``: the other models'
        inputs taken at their ``b_dec`` (their evidence left out); ``inputs="same"``: every model fed this model's
        activation, exact when the models agree at the token (the premise of diffing a fine-tune). A BatchTopK
        crosscoder's inference rule carries over: the view is a JumpReLU whose latent ``j`` fires when
        ``relu(pre_j) * sum_m ||d_j^m||`` passes the crosscoder's threshold (a ReLU before a threshold exists)."""
        m = self.models.index(model) if isinstance(model, str) else int(model)
        if not 0 <= m < self.n_models:
            raise ValueError(f"model {model!r} is not one of this crosscoder's {self.models}")
        if inputs not in ("alone", "same"):
            raise ValueError(f"inputs must be 'alone' or 'same', got {inputs!r}")
        d, blk = self.d_model, slice(m * self.d_model, (m + 1) * self.d_model)
        jump = self.threshold is not None
        cfg = SAEConfig(d_in=d, d_sae=self.d_sae, arch="jumprelu" if jump else "relu", site=self.site,
                        model_id=self.models[m], apply_b_dec_to_input=self.cfg.apply_b_dec_to_input,
                        meta={**self.cfg.meta, "crosscoder_view": self.models[m], "view_inputs": inputs})
        out = SAE(cfg, seed=None).to(self.device, self.dtype)
        with torch.no_grad():
            out.W_dec.copy_(self.W_dec[:, blk])
            out.b_dec.copy_(self.b_dec[blk])
            if inputs == "alone":
                out.W_enc.copy_(self.W_enc[blk])
                out.b_enc.copy_(self.b_enc)
            else:  # sum_k (x - s_k) W_k + b = (x - s_m) sum_k W_k + b + sum_k (s_m - s_k) W_k  (s: the input shift)
                W = self.W_enc.unflatten(0, (self.n_models, d))
                shift = self.b_dec.unflatten(0, (self.n_models, d)) if self.cfg.apply_b_dec_to_input else \
                    torch.zeros(self.n_models, d, dtype=self.dtype, device=self.device)
                out.W_enc.copy_(W.sum(0))
                out.b_enc.copy_(self.b_enc + torch.einsum("kd,kdj->j", shift[m] - shift, W))
            if jump:
                w = model_norms(self).sum(-1)
                out.threshold.copy_(torch.where(w > 0, self.threshold / w.clamp_min(1e-30),
                                                torch.full_like(w, float("inf"))))
        return out

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Save as a bundle folder (atomic; refuses to overwrite)."""
        return save_object(path, "sae.Crosscoder", dict(self.state_dict()), self.provenance,
                           {"cfg": self.cfg.to_dict()}, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device | None = None) -> Crosscoder:
        """Load a crosscoder saved by :meth:`save`."""
        b = read_object(Path(path), "sae.Crosscoder")
        cc = cls(SAEConfig.from_dict(b.fields["cfg"]), seed=None)
        cc.load_state_dict(b.tensors)
        return cc.to(device) if device is not None else cc


register_kind("sae.Crosscoder", Crosscoder.load)


# --- paired data ----------------------------------------------------------------------------------------------
def _check_acts(a: Activations, b: Activations, what: str) -> None:
    if a.d_model != b.d_model:
        raise ValueError(f"{what}: the two models' activations have widths {a.d_model} and {b.d_model}; a crosscoder "
                         f"pairs models of the same width (a model and its fine-tune)")
    if tuple(a.tensor.shape) != tuple(b.tensor.shape) or (a.prompt_ids or []) != (b.prompt_ids or []):
        raise ValueError(f"{what}: the two captures hold different tokens (shapes {tuple(a.tensor.shape)} vs "
                         f"{tuple(b.tensor.shape)}); capture the same prompts with the same settings in both models")
    if (a.mask is None) != (b.mask is None) or (a.mask is not None and not torch.equal(a.mask, b.mask)):
        raise ValueError(f"{what}: the two captures' token masks differ: the models tokenise the prompts differently; "
                         f"a crosscoder needs the same tokens through both models (the same tokenizer)")


def pair_activations(a: Activations, b: Activations, site: str | None = None, what: str = "paired data") -> Activations:
    """One :class:`Activations` at ``site`` whose width is the two models' side by side (sinks flagged in either
    model are flagged)."""
    _check_acts(a, b, what)
    site = site or (a.sites[0] if len(a.sites) == 1 else None)
    if site is None or site not in a.sites or site not in b.sites:
        raise ValueError(f"{what}: name one site held by both captures (site=...); they hold {a.sites} and {b.sites}")
    i, j = a.sites.index(site), b.sites.index(site)
    t = torch.cat([a.tensor[:, i:i + 1], b.tensor[:, j:j + 1]], -1)
    sinks = None
    if a.sinks is not None or b.sinks is not None:
        sa = a.sinks[:, i:i + 1] if a.sinks is not None else torch.zeros_like(b.sinks[:, j:j + 1])
        sb = b.sinks[:, j:j + 1] if b.sinks is not None else torch.zeros_like(sa)
        sinks = sa | sb
    return Activations(tensor=t, sites=[site], positions=a.positions, model_id=f"{a.model_id} | {b.model_id}",
                       prompt_ids=a.prompt_ids, labels=a.labels, mask=a.mask, sinks=sinks,
                       meta={**a.meta, "paired_models": [a.model_id, b.model_id]})


class PairedStore:
    """Two :class:`~interp.store.ActivationStore` of the same prompts read shard by shard as one store of the two
    models' activations side by side at ``site`` (what :class:`sae.stream.TokenStream` streams)."""

    def __init__(self, a: Any, b: Any, site: str | None = None):
        for s in (a, b):
            if not s.complete:
                raise ValueError(f"the store at {s.path} is unfinished; rerun its capture to finish it")
        if a.d_model != b.d_model:
            raise ValueError(f"the stores at {a.path} and {b.path} have widths {a.d_model} and {b.d_model}; a "
                             f"crosscoder pairs models of the same width")
        if len(a) != len(b) or a.n_shards != b.n_shards or a.manifest["prompt_ids"] != b.manifest["prompt_ids"] \
                or a.order != b.order:
            raise ValueError(f"the stores at {a.path} ({len(a)} prompts, {a.n_shards} shards) and {b.path} ({len(b)} "
                             f"prompts, {b.n_shards} shards) hold different prompts or orders; capture the same "
                             f"prompts with the same batch size and settings into both")
        common = [s for s in a.sites if s in b.sites]
        self.site = site or (common[0] if len(common) == 1 else None)
        if self.site is None or self.site not in common:
            raise ValueError(f"name one site held by both stores (site=...); they hold {a.sites} and {b.sites}")
        self.a, self.b, self.path = a, b, a.path
        self.manifest = {**a.manifest, "model_id": f"{a.manifest.get('model_id', '')} | "
                                                   f"{b.manifest.get('model_id', '')}"}

    sites = property(lambda self: [self.site])
    d_model = property(lambda self: 2 * int(self.a.d_model))
    n_shards = property(lambda self: self.a.n_shards)

    def __len__(self) -> int:
        return len(self.a)

    def shard(self, k: int) -> Activations:
        return pair_activations(self.a.shard(k), self.b.shard(k), self.site, what=f"shard {k}")

    def iter_shards(self) -> Any:
        return (self.shard(k) for k in range(self.n_shards))


def paired(a: Any, b: Any, site: str | None = None) -> Any:
    """The crosscoder's training data from the two models' data on the same tokens: two tensors ``[..., d]`` (one
    row per token each), two :class:`Activations` or two :class:`ActivationStore`."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            raise ValueError(f"the two models' activations have shapes {tuple(a.shape)} and {tuple(b.shape)}; give "
                             f"the same tokens through both models (same count and width)")
        return torch.cat([a.reshape(-1, a.shape[-1]).float(), b.reshape(-1, b.shape[-1]).float()], -1)
    if isinstance(a, Activations) and isinstance(b, Activations):
        return pair_activations(a, b, site)
    if hasattr(a, "iter_shards") and hasattr(b, "iter_shards"):
        return PairedStore(a, b, site)
    raise TypeError(f"pair two tensors, two Activations or two ActivationStores; got {type(a).__name__} and "
                    f"{type(b).__name__}")


def check_models(a: Any, b: Any) -> None:
    """Refuse two models a crosscoder cannot pair: another width, depth, tokenizer or chat template."""
    if int(a.d_model) != int(b.d_model) or int(a.n_layers) != int(b.n_layers):
        raise ValueError(f"{a.name!r} (width {a.d_model}, {a.n_layers} layers) and {b.name!r} (width {b.d_model}, "
                         f"{b.n_layers} layers) differ in shape; a crosscoder pairs a model with its fine-tune")
    ta, tb = a.tokenizer, b.tokenizer
    if ta is not None and tb is not None and ta.get_vocab() != tb.get_vocab():
        raise ValueError(f"{a.name!r} and {b.name!r} have different tokenizers; a crosscoder reads the same tokens "
                         f"through both models, so they must share one")
    if ta is not None and tb is not None and getattr(ta, "chat_template", None) != getattr(tb, "chat_template", None):
        raise ValueError(f"{a.name!r} and {b.name!r} have different chat templates, so the same prompts would be "
                         f"different tokens; give both the fine-tune's template (load the pair with "
                         f"interp.studies.finetune.crossdiff.load_pair, or set tokenizer.chat_template)")


def capture_paired(models: Sequence[Any], prompts: Any, site: str, out: str | os.PathLike | None = None,
                   runtime: Any = None) -> Any:
    """Capture every token's activation at ``site`` in both ``models`` (checked by :func:`check_models`) and pair
    them: in memory, or with ``out=DIR`` into two stores ``DIR/model_0`` and ``DIR/model_1`` (resumable)."""
    from interp.capturing import capture

    if len(models) != 2:
        raise ValueError(f"give two models (base, fine-tuned), got {len(models)}")
    check_models(*models)
    caps = [capture(m, prompts, sites=[site], positions="all", runtime=runtime,
                    **({} if out is None else {"out": Path(out) / f"model_{i}"})) for i, m in enumerate(models)]
    return paired(caps[0], caps[1], caps[0].sites[0])


def train_crosscoder(data: Any, cfg: TrainConfig | None = None, out_dir: str | os.PathLike | None = None,
                     models: Sequence[str] = ("base", "chat"), resume: bool = True,
                     callback: Callable[[Trainer], None] | None = None, **overrides: Any) -> TrainResult:
    """Train a crosscoder (``cfg.arch``: ``crosscoder_batchtopk`` (default) or ``crosscoder_relu`` with
    ``l1_coefficient``) with the SAE trainer on :func:`paired` data (or a pair ``(a, b)`` it pairs). ``out_dir``:
    checkpoints and resumption as :func:`sae.trainer.train_sae`; the result's ``sae`` is a :class:`Crosscoder`."""
    if isinstance(data, tuple):
        data = paired(*data, site=(cfg or TrainConfig()).site)
    cfg = cfg or TrainConfig(arch=ARCHS[0])
    if overrides:
        cfg = TrainConfig(**{**asdict(cfg), **overrides})
    if cfg.arch not in ARCHS:
        raise ValueError(f"a crosscoder trains as arch {ARCHS}, got {cfg.arch!r} (TrainConfig(arch=...))")
    width = int(data.shape[-1]) if isinstance(data, torch.Tensor) else int(data.d_model)
    sites = list(getattr(data, "sites", None) or [])
    site = cfg.site or (sites[0] if len(sites) == 1 else None)
    d_sae = cfg.d_sae or cfg.expansion * (width // len(models))
    cc = Crosscoder.build(width // len(models), d_sae, cfg.arch, cfg.k, models, site=site, seed=cfg.seed)
    return train_sae(data, cfg, out_dir=out_dir, resume=resume, callback=callback, sae=cc, fresh=True)


__all__ = ["Crosscoder", "PairedStore", "capture_paired", "check_models", "paired", "train_crosscoder"]
