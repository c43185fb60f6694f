"""Train an SAE from activations in memory or streamed from an `ActivationStore`.

Adam with linear warm-up and a final linear decay, unit-norm decoder rows (parallel gradient removed),
input normalised to ``E||x||^2 = d_in`` and folded into the weights at the end (the returned SAE reads raw
activations), dead-latent tracking with AuxK, atomic checkpoints and exact resumption.

The same loop trains a transcoder (:mod:`sae.transcoder_train`) on paired data (an input and a target per token,
:class:`~sae.stream.TokenStream`): the loss is the prediction's error on the target, which is normalised by its own
scale, and ``b_dec`` starts at the target's mean; both scales are folded in at the end.

Data parallel under an initialised process group (e.g. ``torchrun``; :mod:`interp.distributed`): ``batch_size``
is the global batch, each rank trains on its share, gradients are averaged over ranks before the step (as DDP
does), latents count as fired when they fired on any rank, and rank 0 alone writes checkpoints and the result.
With a per-token loss (TopK, ReLU; AuxK's normaliser is taken over the global batch) this is one-process
training on the same global batch; BatchTopK's selection and JumpReLU's L0 target are batch statistics per rank.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from interp import distributed as dist
from sae.kinds import get_kind
from sae.losses import StepOut, train_step
from sae.model import SAE, SAEConfig
from sae.stream import TokenStream
from sae.train_config import TrainConfig, TrainResult

__all__ = ["TrainConfig", "TrainResult", "Trainer", "train_sae"]

def _adam(params: list[torch.nn.Parameter], lr: float, betas: tuple[float, float]) -> torch.optim.Adam:
    """Fused Adam (one pass over each parameter) where this torch and device support it."""
    try:
        return torch.optim.Adam(params, lr=lr, betas=betas, fused=True)
    except (RuntimeError, ValueError, TypeError):
        return torch.optim.Adam(params, lr=lr, betas=betas)


def _step_at(opt: torch.optim.Optimizer, lr: float) -> None:
    """One optimiser step at learning rate ``lr`` (the schedule's value for this step), gradients then cleared."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    opt.zero_grad(set_to_none=True)


class Trainer:
    """Holds the optimisation state; :func:`train_sae` is the usual entry point."""

    def __init__(self, data: Any, cfg: TrainConfig, out_dir: str | os.PathLike | None = None,
                 sae: SAE | None = None, fresh: bool | None = None):
        """``sae``: train this one further (``fresh=True``: as if new: scales, ``b_dec`` and thresholds from the data;
        how a transcoder is trained). Paired data needs a transcoder handed in."""
        self.cfg = cfg
        device = torch.device(dist.device_for(cfg.device) or (sae.device if sae is not None else "cpu"))
        self.device = device
        self.world, self.rank = dist.world_size(), dist.rank()
        if cfg.batch_size % self.world:
            raise ValueError(f"batch_size={cfg.batch_size} (the global batch) does not split over {self.world} "
                             f"processes; choose a multiple of {self.world}")
        self.stream = TokenStream(data, cfg.batch_size // self.world, seed=cfg.seed, site=cfg.site,
                                  buffer_tokens=cfg.buffer_tokens, device=device, rank=self.rank, world=self.world,
                                  target_site=cfg.target_site, sinks=cfg.sinks)
        d_in, d_out = self.stream.d, self.stream.d_out
        self._fresh = sae is None if fresh is None else fresh
        if sae is None and d_out is not None:
            raise ValueError("paired (input, target) data trains a transcoder: use sae.transcoder_train.fit_transcoder")
        if sae is None:
            d_sae = cfg.d_sae or cfg.expansion * d_in
            k = cfg.k if get_kind(cfg.arch).needs_k else None
            sae = SAE(SAEConfig(d_in=d_in, d_sae=d_sae, arch=cfg.arch, k=k, site=self.stream.site,
                                model_id=self.stream.model_id, options=dict(cfg.options)), seed=cfg.seed)
        elif sae.d_in != d_in or d_out not in (None, sae.d_in):
            raise ValueError(f"the SAE reads width {sae.d_in} but the activations have width {d_in}"
                             + ("" if d_out is None else f" (targets {d_out})"))
        self.sae = sae.to(device)
        self.lr = cfg.lr or 2e-4 / math.sqrt(self.sae.d_sae / 2 ** 14)
        self.opt = _adam(list(self.sae.parameters()), self.lr, cfg.betas)
        self.step = 0
        self.scale = 1.0
        self.target_scale: float | None = None if d_out is None else 1.0
        self.tokens_since_fired = torch.zeros(self.sae.d_sae, dtype=torch.long, device=device)
        self.history: dict[str, list[float]] = {k: [] for k in
                                                ("step", "tokens", "loss", "mse", "aux", "l0", "fvu", "dead", "lr")}
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.dead_after = cfg.dead_after_tokens or max(10 * cfg.batch_size, cfg.total_tokens // 10)
        kind = self.sae.kind
        self.opts = {"sparse": kind.k_sparse and cfg.decoder in ("auto", "sparse"), "backend": cfg.backend,
                     "k_aux": cfg.k_aux or max(1, d_in // 2), "bandwidth": cfg.jumprelu_bandwidth,
                     "target_l0": kind.target_l0(cfg)}
        self._sparsity_coef = float(getattr(cfg, kind.sparsity_coef)) if kind.sparsity_coef else 0.0
        self._initialised = False

    # --- initialisation from data ---------------------------------------------------------------
    def prepare(self) -> None:
        """Initialise from the data once (done by :meth:`run`; call it yourself to drive :meth:`train_one`)."""
        if not self._initialised:
            self._init_from_data()
            scale = torch.tensor([self.scale, self.target_scale or 1.0], dtype=torch.float64)
            dist.broadcast_([*self.sae.state_dict().values(), scale])  # identical replicas, as DDP starts
            self.scale = float(scale[0])
            self.target_scale = None if self.target_scale is None else float(scale[1])
            self._initialised = True

    @torch.no_grad()
    def _init_from_data(self) -> None:
        """Input scale and ``b_dec`` from the first batches of a separate copy of the stream (seeded; the one-process
        stream on every rank, so data-parallel training starts where one process would). An SAE handed in (to
        train further) keeps its weights and reads raw inputs (scale 1)."""
        cfg = self.cfg
        if not self._fresh:
            return
        probe = self.stream.copy(cfg.batch_size)
        n = max(1, min(cfg.n_steps, (1 << 16) // cfg.batch_size))
        xs, ys = probe.split(torch.cat([next(probe) for _ in range(n)]))
        self.scale = self._norm_scale(xs, "training activations")
        xs = xs * self.scale
        if ys is not None:
            self.target_scale = self._norm_scale(ys, "targets")
        self.sae.b_dec.copy_(xs.mean(0) if ys is None else (ys * self.target_scale).mean(0))
        self.sae.kind.init_from_data(self.sae, xs, self.opts)

    def _norm_scale(self, t: torch.Tensor, what: str) -> float:
        """The factor that makes ``E ||t||^2 = d`` (1 without ``normalize_input``)."""
        sq = t.pow(2).sum(-1).mean().item()
        if sq <= 0:
            raise ValueError(f"the {what} are all zero; check the site and capture")
        return math.sqrt(t.shape[-1] / sq) if self.cfg.normalize_input else 1.0

    # --- one step -------------------------------------------------------------------------------
    def _coeffs(self) -> dict[str, float]:
        cfg = self.cfg
        ramp = min(1.0, (self.step + 1) / max(1, cfg.sparsity_warmup_frac * cfg.n_steps))
        return {"sparsity": self._sparsity_coef * ramp, "aux": cfg.aux_coefficient, "preact": cfg.preact_coefficient}

    def train_one(self, x: torch.Tensor, y: torch.Tensor | None = None) -> StepOut:
        """One optimisation step on a raw batch ``x [B, d_in]`` (a transcoder's targets ``y``; normalised here)."""
        sae, cfg = self.sae, self.cfg
        x = x * self.scale
        y = None if y is None else y * self.target_scale
        dead = self.tokens_since_fired >= self.dead_after
        out = train_step(sae, x, dead, self._coeffs(), self.opts, target=y)
        out.loss.backward()
        dist.average_gradients(sae.parameters())
        with torch.no_grad():
            g = sae.W_dec.grad
            if g is not None:  # keep decoder rows on the unit sphere: drop the radial gradient
                radial = torch.linalg.vecdot(g, sae.W_dec, dim=1)
                g.addcmul_(radial[:, None], sae.W_dec, value=-1.0)
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(sae.parameters(), cfg.grad_clip)
        lr = cfg.lr_at(self.step, self.lr)
        _step_at(self.opt, lr)
        with torch.no_grad():
            sae.W_dec.div_(sae.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12))
            sae.kind.after_step(self, out)  # the kind's own hook: thresholds, clamps
            self.tokens_since_fired += x.shape[0] * self.world
            fired = out.fired if self.world == 1 else dist.all_reduce_(out.fired.to(torch.uint8), "max").bool()
            self.tokens_since_fired[fired] = 0
        if self.step % cfg.log_every == 0 or self.step == cfg.n_steps - 1:
            self._log(out, x if y is None else y, dead, lr)
        self.step += 1
        return out

    def _global_min(self, v: float | None) -> float | None:
        """The smallest of the ranks' values (``None`` where a rank had none; ``None`` if all had none)."""
        t = dist.all_reduce_(torch.tensor([math.inf if v is None else v], dtype=torch.float64), "min")
        return None if math.isinf(float(t)) else float(t)

    def _log(self, out: StepOut, x: torch.Tensor, dead: torch.Tensor, lr: float) -> None:
        """One history row; data parallel, the batch numbers are averaged over ranks."""
        var = (x - x.mean(0)).pow(2).sum(-1).mean().clamp_min(1e-12)
        vals = torch.tensor([float(out.loss.detach()), float(out.mse), float(out.aux), out.l0,
                             float(out.mse / var)], dtype=torch.float64)
        loss, mse, aux, l0, fvu = (dist.all_reduce_(vals) / self.world).tolist()
        rec = {"step": self.step, "tokens": (self.step + 1) * self.cfg.batch_size, "loss": loss, "mse": mse,
               "aux": aux, "l0": l0, "fvu": fvu, "dead": float(dead.float().mean()), "lr": lr}
        for k, v in rec.items():
            self.history[k].append(v)

    # --- loop -----------------------------------------------------------------------------------
    def run(self, callback: Callable[[Trainer], None] | None = None) -> TrainResult:
        cfg = self.cfg
        self.prepare()
        bar = tqdm(total=cfg.n_steps, initial=self.step, desc=f"SAE {cfg.arch}", unit="step",
                   disable=not cfg.progress or not dist.is_main())
        between_steps = True  # a Ctrl-C inside a step would leave it half applied: then keep the last checkpoint
        try:
            while self.step < cfg.n_steps:
                batch = next(self.stream)
                between_steps = False
                self.train_one(*self.stream.split(batch))
                between_steps = True
                if self.history["l0"] and self.step % cfg.log_every == 1:
                    bar.set_postfix(l0=f"{self.history['l0'][-1]:.1f}", fvu=f"{self.history['fvu'][-1]:.3f}",
                                    dead=f"{self.history['dead'][-1]:.2f}")
                bar.update(1)
                if self.out_dir is not None and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 \
                        and dist.is_main():
                    self.save_checkpoint()
                if callback is not None:
                    callback(self)
        except KeyboardInterrupt:
            if self.out_dir is not None and between_steps and dist.is_main():
                self.save_checkpoint()
            raise
        finally:
            bar.close()
        return self._finish()

    def _finish(self) -> TrainResult:
        sae = self.sae
        dead = float((self.tokens_since_fired >= self.dead_after).float().mean())
        if self.target_scale is None:
            sae.fold_input_scale_(self.scale)
        else:
            sae.fold_input_scale_(self.scale, self.target_scale)
            sae.cfg.meta["target_scale"] = self.target_scale
        sae.cfg.meta.update({"trained_tokens": self.step * self.cfg.batch_size, "input_scale": self.scale,
                             "sinks_left_out": self.stream.n_sinks,
                             **({"model": self.stream.model_shape} if self.stream.model_shape else {}),
                             "train_cfg": self.cfg.comparable(), **({"processes": self.world} if self.world > 1 else {})})
        if self.out_dir is not None:
            dist.on_main(lambda: sae.save(self.out_dir / "sae"))  # one writer; the others wait until it is there
        return TrainResult(sae=sae, history=self.history, input_scale=self.scale, steps=self.step,
                           tokens=self.step * self.cfg.batch_size, out_dir=self.out_dir, dead_fraction=dead,
                           target_scale=self.target_scale)

    # --- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Write ``OUT/checkpoint`` atomically (built in a temp folder, then swapped in)."""
        from interp.io import atomic_write, save_bundle, write_json

        assert self.out_dir is not None
        final = self.out_dir / "checkpoint"
        tmp = self.out_dir / f".checkpoint.tmp{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        save_bundle(tmp / "sae", dict(self.sae.state_dict()), {"kind": "sae.SAE", "cfg": self.sae.cfg.to_dict()})
        save_bundle(tmp / "state", {"tokens_since_fired": self.tokens_since_fired.cpu()},
                    {"step": self.step, "scale": self.scale, "target_scale": self.target_scale,
                     "history": self.history, "cfg": self.cfg.comparable(),
                     "lr": self.lr, "processes": self.world})
        opt_state = self.opt.state_dict()
        atomic_write(tmp / "optimizer.pt", lambda p: torch.save(opt_state, p))
        write_json(tmp / "done.json", {"step": self.step})
        old = self.out_dir / ".checkpoint.old"
        if old.exists():
            shutil.rmtree(old)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        if old.exists():
            shutil.rmtree(old)
        return final

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        from interp.io import load_bundle

        p = Path(path)
        if not (p / "done.json").exists():
            raise FileNotFoundError(f"{p} holds no finished checkpoint")
        tensors, meta = load_bundle(p / "state")
        mine, theirs = self.cfg.comparable(), meta["cfg"]
        theirs["betas"] = tuple(theirs["betas"])
        diff = sorted(k for k in mine if mine.get(k) != theirs.get(k))
        if diff:
            raise ValueError(f"the checkpoint at {p} was made with different settings ({diff}); resume with the "
                             f"same TrainConfig, or start a new out_dir")
        if int(meta.get("processes", 1)) != self.world:
            raise ValueError(f"the checkpoint at {p} was made by {meta.get('processes', 1)} processes and this run has "
                             f"{self.world}; each replays its own token stream, so resume with the same number")
        sae_t, _ = load_bundle(p / "sae")
        self.sae.load_state_dict(sae_t)
        self.opt.load_state_dict(torch.load(p / "optimizer.pt", map_location=self.device, weights_only=True))
        self.tokens_since_fired = tensors["tokens_since_fired"].to(self.device)
        self.step, self.scale, self.lr = int(meta["step"]), float(meta["scale"]), float(meta["lr"])
        self.target_scale = None if meta.get("target_scale") is None else float(meta["target_scale"])
        self.history = {k: list(v) for k, v in meta["history"].items()}
        self._initialised = True
        self.stream.skip(self.step)


def train_sae(data: Any, cfg: TrainConfig | None = None, out_dir: str | os.PathLike | None = None,
              resume: bool = True, callback: Callable[[Trainer], None] | None = None, sae: SAE | None = None,
              fresh: bool | None = None, **overrides: Any) -> TrainResult:
    """Train an SAE on ``data`` (tensor ``[n, d]``, ``Activations`` or ``ActivationStore``).

    With ``out_dir``, checkpoints go to ``OUT/checkpoint`` (every ``checkpoint_every`` steps and on Ctrl-C)
    and the result to ``OUT/sae``; a run with the same config resumes from the checkpoint when
    ``resume=True``. Keyword overrides set ``TrainConfig`` fields, e.g. ``train_sae(x, arch="topk", k=16)``.
    ``sae`` / ``fresh``: a model to train (see :class:`Trainer`; a transcoder: :mod:`sae.transcoder_train`).
    """
    cfg = cfg or TrainConfig()
    if overrides:
        cfg = TrainConfig(**{**asdict(cfg), **overrides})
    if out_dir is not None and (Path(out_dir) / "sae").exists():
        raise FileExistsError(f"{Path(out_dir) / 'sae'} already holds a trained SAE; load it with SAE.load(...) "
                              f"(a transcoder: Transcoder.load(...)) or choose another out_dir")
    trainer = Trainer(data, cfg, out_dir=out_dir, sae=sae, fresh=fresh)
    ckpt = Path(out_dir) / "checkpoint" if out_dir is not None else None
    if ckpt is not None and ckpt.exists():
        if not resume:
            raise FileExistsError(f"{ckpt} holds an unfinished run; pass resume=True to continue it, or choose "
                                  f"another out_dir")
        trainer.load_checkpoint(ckpt)
    return trainer.run(callback=callback)
