"""End-to-end training of a cross-layer transcoder (Ameisen et al. 2025): every layer's encoder and every decoder,
the cross-layer ones included, trained together against one loss.

Each layer ``l``'s features read MLP ``l``'s input and write into the output of MLP ``l`` and of every later MLP
(:class:`sae.clt.CrossLayerTranscoder`). On a batch of tokens (every layer's MLP input and output, each layer's
input and output normalised to ``E ||.||^2 = d`` by its own scale, as the SAE trainer normalises one site):

    loss = sum_L ||y_L - (sum_{l <= L} z_l D(l, L) + b_dec_L)||^2  +  sum_l (layer l's kind's own terms)

averaged over the batch. The kind's terms are the ones the SAE trainer uses (:meth:`sae.kinds.Kind.train_forward`):
JumpReLU's straight-through L0 penalty towards the target L0 (``TrainConfig.target_l0`` or ``k``) and the
pre-activation loss of dead latents; ReLU's L1 of each activation times the norm of its feature's decoders, here the
norm over all the layers it writes (the same-layer decoder and the cross-layer ones, as the paper weights its
penalty); TopK none, with AuxK for dead latents on its layer's residual. The learning-rate schedule, sparsity
warm-up, gradient clipping (per layer's dictionary), dead-latent counts and the seeded token stream
(:class:`sae.stream.TokenStream`) are the SAE trainer's; the decoders are not held at unit norm (the paper's
penalty carries the norms instead). The scales are folded in at the end: the returned CLT reads raw MLP inputs and
predicts raw MLP outputs. Checkpoints (one atomic file) make a stopped run resume to the same weights.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from interp.io import atomic_write
from sae.clt import CLTConfig, CrossLayerTranscoder
from sae.kinds import get_kind
from sae.losses import _aux_k
from sae.stream import TokenStream
from sae.train_config import TrainConfig
from sae.trainer import _adam, _step_at
from sae.transcoder_train import ENCODER_INIT

HISTORY = ("step", "tokens", "loss", "mse", "fvu", "l0", "dead", "lr")


@dataclass
class CLTBatchLoss:
    """One batch's ``loss`` (with gradient) and, per layer, the normalised MSE of its MLP output, the batch FVU, the
    mean L0 and the latents that fired."""

    loss: torch.Tensor
    mse: list[float] = field(default_factory=list)
    fvu: list[float] = field(default_factory=list)
    l0: list[float] = field(default_factory=list)
    fired: list[torch.Tensor] = field(default_factory=list)
    terms: dict[str, float] = field(default_factory=dict)


def later_norms(clt: CrossLayerTranscoder, layer: int) -> torch.Tensor:
    """Each of ``layer``'s features' decoder norm over every layer it writes ``[d_sae]`` (same-layer and later)."""
    own = clt.layers[layer].W_dec.pow(2).sum(-1)
    later = clt.W_later[layer]
    return (own + later.pow(2).sum((1, 2))).sqrt() if later.numel() else own.sqrt()


def clt_loss(clt: CrossLayerTranscoder, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor,
             coeffs: dict[str, float], opts: dict[str, Any]) -> CLTBatchLoss:
    """The end-to-end loss of a normalised batch ``x, y [B, n_layers, d]`` (module docstring); ``dead
    [n_layers, d_sae]`` the latents counted dead; ``coeffs`` / ``opts`` as :func:`sae.losses.train_step`'s."""
    n = clt.n_layers
    outs = [tc.kind.train_forward(tc, x[:, i], y[:, i], dead[i], coeffs, {**opts, "latents": True, "sparse": False})
            for i, tc in enumerate(clt.layers)]
    zs = {i: o.latents for i, o in enumerate(outs)}
    if any(z is None for z in zs.values()):
        raise ValueError(f"arch {clt.cfg.arch!r} gives no dense latents to write into later layers; train a CLT "
                         f"end to end as relu, jumprelu or topk")
    res = CLTBatchLoss(loss=x.new_zeros(()))
    terms: dict[str, torch.Tensor] = {}
    for i, (tc, o) in enumerate(zip(clt.layers, outs)):
        cross = clt.cross_write(i, zs)
        pred = o.x_hat if cross is None else o.x_hat + cross
        mse = (pred - y[:, i]).pow(2).sum(-1).mean()
        for k, t in o.terms.items():
            terms[k] = terms.get(k, 0) + t
        if hasattr(tc.kind, "penalty_norms") and "sparsity" in o.terms and i < n - 1:
            # the kind weighs each activation by its same-layer decoder norm; the rest of the norm over all layers
            extra = later_norms(clt, i) - tc.kind.penalty_norms(tc)
            terms["sparsity"] = terms["sparsity"] + coeffs["sparsity"] * (zs[i] * extra).sum(-1).mean()
        if coeffs["aux"] > 0 and tc.kind.aux_k and bool(dead[i].any()):
            aux = _aux_k(tc, x[:, i], y[:, i], o.pre, pred.detach(), dead[i], opts["k_aux"], False, opts["backend"])
            terms["aux"] = terms.get("aux", 0) + coeffs["aux"] * aux
        res.loss = res.loss + mse
        var = (y[:, i] - y[:, i].mean(0)).pow(2).sum(-1).mean().clamp_min(1e-12)
        res.mse.append(float(mse.detach()))
        res.fvu.append(float(mse.detach() / var))
        res.l0.append(o.l0)
        res.fired.append(o.fired)
    for t in terms.values():
        res.loss = res.loss + t
    res.terms = {k: float(t.detach()) for k, t in terms.items()}
    return res


class CLTTrainer:
    """Optimisation state of end-to-end CLT training on in-memory pairs ``x, y [n, n_layers, d]``; ``run`` trains."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, out_dir: str | os.PathLike | None = None,
                 model_id: str = ""):
        if x.dim() != 3 or x.shape != y.shape:
            raise ValueError(f"end-to-end CLT training needs every layer's MLP inputs and outputs as x, y "
                             f"[n, n_layers, d] of one shape; got {tuple(x.shape)} and {tuple(y.shape)}")
        kind = get_kind(cfg.arch)
        if not kind.transcoder:
            raise ValueError(f"a CLT's layers are transcoders: arch relu, jumprelu or topk, not {cfg.arch!r}")
        self.cfg, self.n_layers, self.d = cfg, int(x.shape[1]), int(x.shape[2])
        self.device = torch.device(cfg.device or "cpu")
        self.stream = TokenStream((x.flatten(1), y.flatten(1)), cfg.batch_size, seed=cfg.seed, device=self.device,
                                  sinks="keep")
        d_sae = cfg.d_sae or cfg.expansion * self.d
        self.clt = CrossLayerTranscoder(CLTConfig(n_layers=self.n_layers, d_in=self.d, d_sae=d_sae, arch=cfg.arch,
                                                  k=cfg.k if kind.needs_k else None, model_id=model_id),
                                        seed=cfg.seed).to(self.device)
        with torch.no_grad():
            for tc in self.clt.layers:
                tc.W_enc.mul_(ENCODER_INIT)
        self.lr = cfg.lr or 2e-4 / math.sqrt(d_sae / 2 ** 14)
        self.opt = _adam(list(self.clt.parameters()), self.lr, cfg.betas)
        self.step = 0
        self.scales = torch.ones(2, self.n_layers, dtype=torch.float64)  # [input, output] per layer
        self.since_fired = torch.zeros(self.n_layers, d_sae, dtype=torch.long, device=self.device)
        self.dead_after = cfg.dead_after_tokens or max(10 * cfg.batch_size, cfg.total_tokens // 10)
        self.opts = {"backend": cfg.backend, "k_aux": cfg.k_aux or max(1, self.d // 2),
                     "bandwidth": cfg.jumprelu_bandwidth, "target_l0": kind.target_l0(cfg)}
        self._coef = float(getattr(cfg, kind.sparsity_coef)) if kind.sparsity_coef else 0.0
        self.history: dict[str, list[float]] = {k: [] for k in HISTORY}
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self._initialised = False

    def split(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A stream batch as normalised ``x, y [B, n_layers, d]``."""
        x, y = self.stream.split(batch)
        s = self.scales.to(batch)
        return x.view(-1, self.n_layers, self.d) * s[0, :, None], y.view(-1, self.n_layers, self.d) * s[1, :, None]

    @torch.no_grad()
    def prepare(self) -> None:
        """Per-layer scales, ``b_dec`` and the kind's start (JumpReLU thresholds) from the first batches."""
        if self._initialised:
            return
        probe = self.stream.copy(self.cfg.batch_size)
        count = max(1, min(self.cfg.n_steps, (1 << 16) // self.cfg.batch_size))
        x, y = self.split(torch.cat([next(probe) for _ in range(count)]))  # raw: the scales are still 1
        for j, t in enumerate((x, y)):
            sq = t.pow(2).sum(-1).mean(0).double()
            if bool((sq <= 0).any()):
                raise ValueError("a layer's MLP inputs or outputs are all zero; check the capture")
            if self.cfg.normalize_input:
                self.scales[j] = (self.d / sq).sqrt()
        x, y = x * self.scales[0, :, None].to(x), y * self.scales[1, :, None].to(y)
        for i, tc in enumerate(self.clt.layers):
            tc.b_dec.copy_(y[:, i].mean(0))
            tc.kind.init_from_data(tc, x[:, i], self.opts)
        self._initialised = True

    def train_one(self, batch: torch.Tensor) -> CLTBatchLoss:
        """One optimisation step on a raw stream batch."""
        cfg = self.cfg
        x, y = self.split(batch)
        ramp = min(1.0, (self.step + 1) / max(1, cfg.sparsity_warmup_frac * cfg.n_steps))
        coeffs = {"sparsity": self._coef * ramp, "aux": cfg.aux_coefficient, "preact": cfg.preact_coefficient}
        dead = self.since_fired >= self.dead_after
        out = clt_loss(self.clt, x, y, dead, coeffs, self.opts)
        out.loss.backward()
        if cfg.grad_clip is not None:
            for tc, w in zip(self.clt.layers, self.clt.W_later):
                torch.nn.utils.clip_grad_norm_([*tc.parameters(), w], cfg.grad_clip)
        lr = cfg.lr_at(self.step, self.lr)
        _step_at(self.opt, lr)
        with torch.no_grad():
            for tc in self.clt.layers:
                tc.kind.after_step(SimpleNamespace(sae=tc, step=self.step, cfg=cfg), out)
            self.since_fired += x.shape[0]
            self.since_fired[torch.stack(out.fired)] = 0
        if self.step % cfg.log_every == 0 or self.step == cfg.n_steps - 1:
            row = {"step": self.step, "tokens": (self.step + 1) * cfg.batch_size, "loss": float(out.loss.detach()),
                   "mse": sum(out.mse), "fvu": sum(out.fvu) / self.n_layers, "l0": sum(out.l0) / self.n_layers,
                   "dead": float(dead.float().mean()), "lr": lr}
            for k, v in row.items():
                self.history[k].append(v)
        self.step += 1
        return out

    def run(self, callback: Callable[[CLTTrainer], None] | None = None) -> CrossLayerTranscoder:
        """Train to ``cfg.total_tokens`` (from a checkpoint's step when resumed); the CLT with the scales folded in."""
        cfg = self.cfg
        self.prepare()
        stop_ok = True
        try:
            while self.step < cfg.n_steps:
                batch = next(self.stream)
                stop_ok = False
                self.train_one(batch)
                stop_ok = True
                if self.out_dir is not None and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    self.save_checkpoint()
                if callback is not None:
                    callback(self)
        except KeyboardInterrupt:
            if self.out_dir is not None and stop_ok:
                self.save_checkpoint()
            raise
        return self.finish()

    @torch.no_grad()
    def finish(self) -> CrossLayerTranscoder:
        """Fold the per-layer scales in: layer ``l``'s latents become ``1 / out_l`` of the trained ones, so a
        cross-layer decoder ``D(l, L)`` takes ``out_l / out_L``."""
        s_in, s_out = self.scales.tolist()
        clt = self.clt
        for i, tc in enumerate(clt.layers):
            tc.fold_input_scale_(s_in[i], s_out[i])
            tc.cfg.meta["target_scale"] = s_out[i]
        for i, w in enumerate(clt.W_later):
            for j in range(w.shape[1]):
                w[:, j].mul_(s_out[i] / s_out[i + 1 + j])
        clt.cfg.meta.update({"trained": "end to end (sae.clt_e2e)", "trained_tokens": self.step * self.cfg.batch_size,
                             "train_cfg": self.cfg.comparable(),
                             "dead_fraction": float((self.since_fired >= self.dead_after).float().mean())})
        return clt

    def save_checkpoint(self) -> Path:
        """``OUT/checkpoint.pt``, written atomically: weights, optimiser, step, scales, dead counts and history."""
        assert self.out_dir is not None
        state = {"clt": self.clt.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                 "scales": self.scales, "since_fired": self.since_fired.cpu(), "history": self.history,
                 "cfg": repr(sorted(self.cfg.comparable().items())), "lr": self.lr}
        path = self.out_dir / "checkpoint.pt"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda p: torch.save(state, p))
        return path

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        state = torch.load(Path(path), map_location=self.device, weights_only=True)
        if state["cfg"] != repr(sorted(self.cfg.comparable().items())):
            raise ValueError(f"the checkpoint at {path} was made with different settings; resume with the same "
                             f"TrainConfig, or start a new out_dir")
        self.clt.load_state_dict(state["clt"])
        self.opt.load_state_dict(state["opt"])
        self.step, self.lr, self.scales = int(state["step"]), float(state["lr"]), state["scales"]
        self.since_fired = state["since_fired"].to(self.device)
        self.history = {k: list(v) for k, v in state["history"].items()}
        self._initialised = True
        self.stream.skip(self.step)


def fit_clt(x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, out_dir: str | os.PathLike | None = None,
            model_id: str = "", callback: Callable[[CLTTrainer], None] | None = None) -> CLTTrainer:
    """Train a CLT end to end on ``x, y [n, n_layers, d]`` (every layer's MLP input and output on the same tokens);
    with ``out_dir`` a run resumes from ``OUT/checkpoint.pt`` and the result is saved to ``OUT/clt``. The trainer, its ``clt`` trained and folded."""
    if out_dir is not None and (Path(out_dir) / "clt").exists():
        raise FileExistsError(f"{Path(out_dir) / 'clt'} already holds a trained CLT; load it with "
                              f"CrossLayerTranscoder.load(...) or choose another out_dir")
    tr = CLTTrainer(x, y, cfg, out_dir=out_dir, model_id=model_id)
    if out_dir is not None and (Path(out_dir) / "checkpoint.pt").exists():
        tr.load_checkpoint(Path(out_dir) / "checkpoint.pt")
    tr.run(callback=callback)
    if out_dir is not None:
        tr.clt.save(Path(out_dir) / "clt")
    return tr


__all__ = ["CLTTrainer", "clt_loss", "fit_clt"]
