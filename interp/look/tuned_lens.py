"""The tuned lens (Belrose et al. 2023): per layer an affine translator ``h -> h + A h + b`` (``A = 0``, ``b = 0`` at
the start: the logit lens) trained so that ``unembed(final_norm(h + A h + b))`` matches the model's final
distribution, by KL(final || lens) averaged over tokens.

The residuals are captured once (:func:`interp.capture`, ``positions="all"``; padding and the attention-sink
positions the capture flags are left out, as the default ``sinks="exclude"`` does), split by prompt into train and
held-out, and the translators are trained in memory, every layer in one batched step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float

from interp.bundle import Fitted, check_model, from_provenance, read_object, register_kind, save_object
from interp.capturing import capture
from interp.fingerprint import content_ids
from interp.io import content_hash
from interp.look.lens import FINAL_SITE, logit_lens, readout, unembed
from interp.look.lens_result import LogitLens
from interp.models import Model
from interp.positions import Positions
from interp.sites import Site, parse_site, resolve_layers
from interp.values import Prompts, Runtime

KIND = "interp.look.TunedLens"


@dataclass(kw_only=True)
class TunedLens(Fitted):
    """Translators ``weight [L, d, d]`` (the ``A`` of ``h + A h + b``, applied as ``h @ A.T``) and ``bias [L, d]``,
    one per site in ``sites`` (``blocks.{i}.hook_resid_post``). ``meta`` holds the model's shape, the training
    settings and the held-out KL by layer of the logit lens and of this lens."""

    weight: Float[torch.Tensor, "L d d"]
    bias: Float[torch.Tensor, "L d"]
    sites: list[str] = field(default_factory=list)

    def translate(self, site: str, h: Float[torch.Tensor, "... d"]) -> Float[torch.Tensor, "... d"]:
        """``h + A h + b`` with the translator of ``site``."""
        name = parse_site(site).name
        if name == self._final_site():  # the residual the final norm reads: the identity is exact there
            return h
        if name not in self.sites:
            raise ValueError(f"this tuned lens has no translator for {name}; it covers {self.sites}")
        i = self.sites.index(name)
        A, b = self.weight[i].to(h.device, h.dtype), self.bias[i].to(h.device, h.dtype)
        return h + h @ A.T + b

    def check(self, model: Model, sites: Sequence[str]) -> None:
        """Refuse a model of another shape (:func:`interp.bundle.check_model`) and sites without a translator."""
        check_model(self, model, "this tuned lens")
        missing = [s for s in sites if s not in self.sites and s != self._final_site()]
        if missing:
            raise ValueError(f"this tuned lens has no translator for {missing}; it covers {self.sites}: pass "
                             f"sites=lens.sites or train one with train_tuned_lens(model, texts, layers=...)")

    def _final_site(self) -> str | None:
        """The last layer's ``resid_post``: what the model itself reads out, so the tuned lens is the identity there."""
        n = self.meta.get("model", {}).get("n_layers")
        return None if n is None else Site("resid_post", int(n) - 1).name

    def lens(self, model: Model, prompts: Prompts | Sequence[str], positions: Positions | str = "last",
             **kw: Any) -> LogitLens:
        """:func:`~interp.look.lens.logit_lens` through this lens at its sites (same result type)."""
        return logit_lens(model, prompts, kw.pop("sites", self.sites), positions, lens=self, **kw)

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        save_object(path, KIND, {"weight": self.weight, "bias": self.bias}, self.provenance, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike, model: Model | None = None) -> TunedLens:
        """Read what :meth:`save` wrote; with ``model``, check it fits (another width or depth is refused)."""
        b = read_object(path, KIND)
        out = cls(weight=b.tensors["weight"], bias=b.tensors["bias"], sites=list(b.provenance.sites),
                  **from_provenance(b.provenance))
        if model is not None:
            check_model(out, model, "this tuned lens")
        return out

    def summary(self) -> dict[str, Any]:
        """Training settings and the held-out KL by layer (logit lens vs this lens)."""
        keys = ("steps", "lr", "seed", "batch_tokens", "train_tokens", "heldout_tokens", "seconds",
                "heldout_kl_logit", "heldout_kl_tuned")
        return {"model_id": self.model_id, "sites": list(self.sites), **{k: self.meta.get(k) for k in keys}}


def _tokens(model: Model, prompts: Prompts, sites: list[str], runtime: Runtime | None, split: Sequence[int]
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals ``[N, L, d]`` and final-norm outputs ``[N, d]`` of the real, non-sink tokens of the ``split`` prompts."""
    part = Prompts(tuple(prompts.texts[i] for i in split), chat=prompts.chat, system=prompts.system)
    acts = capture(model, part, sites + [FINAL_SITE], positions=Positions("all"), runtime=runtime)
    keep = acts.kept(sites)
    t = acts.tensor.permute(0, 2, 1, 3)[keep]
    return t[:, :-1].contiguous(), t[:, -1].contiguous()


def _kl(model: Model, h: torch.Tensor, final_logp: torch.Tensor) -> torch.Tensor:
    """KL(final || lens) per layer ``[L]`` of translated residuals ``h [L, B, d]`` (mean over the ``B`` tokens)."""
    L, B, d = h.shape
    logq = readout(model, h.reshape(L * B, d)).log_softmax(-1).reshape(L, B, -1)
    return (final_logp.exp()[None] * (final_logp[None] - logq)).sum(-1).mean(-1)


def _heldout_kl(model: Model, A: torch.Tensor, b: torch.Tensor, X: torch.Tensor, F: torch.Tensor,
                chunk: int = 64) -> torch.Tensor:
    """Mean KL per layer ``[L]`` over held-out tokens, with the translators ``A``, ``b`` (zeros: the logit lens)."""
    total = torch.zeros(A.shape[0])
    with torch.no_grad():
        for c in range(0, X.shape[0], chunk):
            h = X[c:c + chunk].transpose(0, 1)
            final = unembed(model, F[c:c + chunk]).log_softmax(-1)
            total += _kl(model, h + h @ A.transpose(1, 2) + b[:, None], final).cpu() * h.shape[1]
    return total / max(X.shape[0], 1)


def _fit(model: Model, X: torch.Tensor, F: torch.Tensor, steps: int, lr: float, batch: int, seed: int
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Adam on the summed per-layer KL (the layers are independent), ``batch`` random train tokens a step."""
    L, d = X.shape[1], X.shape[2]
    dev = model.device
    A = torch.zeros(L, d, d, device=dev, requires_grad=True)
    b = torch.zeros(L, d, device=dev, requires_grad=True)
    opt = torch.optim.Adam([A, b], lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / max(steps, 1))  # linear decay to zero
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, X.shape[0], (batch,), generator=gen)
        h = X[idx].to(dev).transpose(0, 1)
        with torch.no_grad():
            final = unembed(model, F[idx].to(dev)).log_softmax(-1)
        loss = _kl(model, h + h @ A.transpose(1, 2) + b[:, None], final).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return A.detach().cpu(), b.detach().cpu()


def train_tuned_lens(model: Model, texts: Prompts | Sequence[str], *, layers: Any = None, steps: int = 100,
                     lr: float = 1e-3, batch_tokens: int = 32, heldout: float = 0.2, seed: int = 0,
                     runtime: Runtime | None = None) -> TunedLens:
    """Train a tuned lens on ``texts`` (prompts split ``1 - heldout`` / ``heldout`` by a seeded shuffle) at
    ``resid_post`` of ``layers`` (default all but the last, whose residual the model reads as it is).
    Records the held-out KL by layer of the logit lens and the tuned lens in ``meta``."""
    prompts = Prompts.of(texts)
    L = model.n_layers
    layer_list = resolve_layers(layers if layers is not None else list(range(L - 1)), L, what="train_tuned_lens")
    if not 0 < heldout < 1 or len(prompts) < 2:
        raise ValueError(f"train_tuned_lens needs at least 2 texts and 0 < heldout < 1 (got {len(prompts)} texts, "
                         f"heldout={heldout})")
    if steps < 0 or batch_tokens < 1:
        raise ValueError(f"steps must be >= 0 and batch_tokens >= 1, got steps={steps}, batch_tokens={batch_tokens}")
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed)).tolist()
    n_held = max(1, round(heldout * len(prompts)))
    held, train = order[:n_held], order[n_held:]
    sites = [Site("resid_post", i).name for i in layer_list]
    ids = content_ids(list(prompts.texts))
    t0 = time.perf_counter()
    X, F = _tokens(model, prompts, sites, runtime, train)
    Xh, Fh = _tokens(model, prompts, sites, runtime, held)
    torch.manual_seed(seed)
    A, b = _fit(model, X, F, steps, lr, batch_tokens, seed)
    seconds = time.perf_counter() - t0
    zero = torch.zeros_like(A), torch.zeros_like(b)
    meta = {"model": {"n_layers": L, "d_model": model.d_model}, "steps": steps, "lr": lr, "seed": seed,
            "batch_tokens": batch_tokens, "train_tokens": int(X.shape[0]), "heldout_tokens": int(Xh.shape[0]),
            "seconds": round(seconds, 2), "heldout_kl_logit": _heldout_kl(model, *zero, Xh, Fh).tolist(),
            "heldout_kl_tuned": _heldout_kl(model, A, b, Xh, Fh).tolist(), "sinks": "exclude"}
    return TunedLens(weight=A, bias=b, sites=sites, method="tuned_lens", model_id=model.name,
                     data_hash=content_hash([model.name, sites, ids]),
                     fitted_on=[ids[i] for i in train], meta=meta)


register_kind(KIND, TunedLens.load)

__all__ = ["TunedLens", "train_tuned_lens"]
