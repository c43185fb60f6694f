"""The fine-tuning loop: AdamW over the trainable weights, a seeded batch order, checkpoints at chosen steps,
resumption that reproduces an uninterrupted run bit for bit (CPU), and a progress bar.

``fine_tune(model, prompts, responses, config)`` trains on (prompt, response) pairs through the chat template,
loss on response tokens only (minus any ``mask_out``); :func:`train_loop` runs any :class:`~tune.objective.Objective`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from interp.io import write_json
from interp.models import Model
from interp.tune.checkpoint import LoopState, load_checkpoint, refuse_existing, save_checkpoint
from interp.tune.config import TuneConfig, grad_masks, make_trainable, trainable_parameters
from interp.tune.data import MOVED, MaskLike, encode_pairs
from interp.tune.objective import SFT, Objective
from interp.values import Prompts, moved_keywords

Callback = Callable[[int, float, Model], None]
"""Called after every step with (steps done, that step's loss, the model): logging, evaluation over steps."""


@dataclass
class TuneResult:
    """A finished fine-tune: the trained ``model`` (a peft-wrapped :class:`Model` for LoRA), the loss of every
    step, tokens processed, wall time, the number of trainable entries (a neuron-restricted fine-tune counts only
    the chosen neurons' entries) and the checkpoints written."""

    model: Model
    config: TuneConfig
    losses: list[float]
    tokens: int
    wall_s: float
    trainable_params: int
    checkpoints: list[Path] = field(default_factory=list)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The trained tensors by name (LoRA matrices, or the chosen blocks' weights), detached copies."""
        return {k: v.detach().clone() for k, v in trainable_parameters(self.model).items()}

    def save(self, folder: str | os.PathLike) -> Path:
        """The adapter (LoRA: peft's folder, ``with_adapter(base, folder)`` loads it) or the whole model (full:
        an HF folder with its tokenizer), and ``training.json``; staged and renamed, never over an existing one."""
        dest = Path(folder)
        if dest.exists():
            raise FileExistsError(f"{dest} already exists; choose another folder (a fine-tune never overwrites)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
        try:
            self.model.hf.save_pretrained(str(tmp), safe_serialization=True)
            if self.config.method == "full" and self.model.tokenizer is not None:
                self.model.tokenizer.save_pretrained(str(tmp))
            write_json(tmp / "training.json", self.record())
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dest

    def record(self) -> dict[str, Any]:
        """The run as JSON-able numbers (config, losses, tokens, throughput)."""
        return {"config": self.config.record(), "losses": self.losses, "tokens": self.tokens,
                "train_wall_s": round(self.wall_s, 1), "tokens_per_s": round(self.tokens / max(self.wall_s, 1e-9), 1),
                "trainable_params": self.trainable_params}


def _draw(state: LoopState, n: int, batch_size: int, gen: torch.Generator) -> list[int]:
    """The next batch of the seeded order: a fresh permutation is appended whenever fewer than a batch remain."""
    while len(state.order) < batch_size:
        state.order += torch.randperm(n, generator=gen).tolist()
    idx, state.order = state.order[:batch_size], state.order[batch_size:]
    return idx


def _step(model: Model, objective: Objective, idx: list[int], opt: torch.optim.Optimizer, params: list,
          config: TuneConfig, step: int, masks: list) -> tuple[float, int]:
    for g in opt.param_groups:
        g["lr"] = config.lr_at(step)
    loss, tokens = objective.loss(model, idx)
    opt.zero_grad()
    loss.backward()
    for p, m in masks:     # a neuron-restricted fine-tune: only the chosen neurons' entries move
        if p.grad is not None:
            p.grad.mul_(m)
    if config.max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
    opt.step()
    return float(loss.detach()), tokens


def train_loop(model: Model, objective: Objective, config: TuneConfig, out: str | os.PathLike | None = None,
               resume: str | os.PathLike | None = None, progress: bool = True,
               callback: Callback | None = None) -> TuneResult:
    """Train the already trainable ``model`` (:func:`~tune.config.make_trainable`) on ``objective`` for
    ``config.steps`` steps; checkpoints go to ``out/checkpoint-{step}`` at ``config.checkpoint_steps``;
    ``resume``: a checkpoint folder to continue from (same config and data)."""
    named = trainable_parameters(model)
    if not named:
        raise ValueError("no parameter of this model is trainable; build it with tune.config.make_trainable")
    params = list(named.values())
    masks = grad_masks(model, config)
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    gen = torch.Generator().manual_seed(config.seed)
    meta = {"config": config.record(), "data": objective.fingerprint()}
    state = LoopState(0, [], [], 0)
    if resume is not None:
        state = load_checkpoint(resume, named, opt, gen, meta)
    refuse_existing(out, tuple(s for s in config.checkpoint_steps if s > state.step))
    saved: list[Path] = []
    model.hf.train()
    t0 = time.time()
    try:
        with tqdm(total=config.steps, initial=state.step, desc=f"fine-tune {model.name}", unit="step",
                  disable=not progress, leave=False) as bar:
            while state.step < config.steps:
                idx = _draw(state, objective.n, config.batch_size, gen)
                loss, tokens = _step(model, objective, idx, opt, params, config, state.step, masks)
                state.step, state.tokens = state.step + 1, state.tokens + tokens
                state.losses.append(round(loss, 5))
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
                if state.step in config.checkpoint_steps:
                    saved.append(save_checkpoint(out, state, named, opt, gen, meta))  # type: ignore[arg-type]
                if callback is not None:
                    callback(state.step, loss, model)
    finally:
        model.hf.eval()
    free = {id(p): int(m.expand_as(p).sum()) for p, m in masks}   # a neuron fine-tune trains only the unmasked entries
    return TuneResult(model, config, state.losses, state.tokens, time.time() - t0,
                      sum(free.get(id(p), p.numel()) for p in params), saved)


@moved_keywords(MOVED)
def fine_tune(model: Model, prompts: Prompts | Sequence[str], responses: Sequence[str],
              config: TuneConfig = TuneConfig(), mask_out: Sequence[MaskLike] | None = None,
              out: str | os.PathLike | None = None, resume: str | os.PathLike | None = None, progress: bool = True,
              callback: Callback | None = None) -> TuneResult:
    """Fine-tune ``model`` on (prompt, response) pairs (a list of prompts: the chat template;
    ``interp.Prompts(texts, chat=False)``: raw text, ``system=``: a system prompt), next-token loss on
    the response tokens only; ``mask_out[i]`` (one flag per response token, ``True`` = out of the loss, e.g.
    :func:`tune.masks.top_mask`) removes tokens from it. LoRA leaves ``model``'s weights as they were but peft
    injects the adapter into its modules (``result.model.hf.disable_adapter()`` gives the base back); a full
    fine-tune changes ``model`` in place. Same seed and data -> same weights, bit for bit on CPU."""
    rows = encode_pairs(model, prompts, responses, mask_out)
    trainable = make_trainable(model, config)
    return train_loop(trainable, SFT(rows), config, out=out, resume=resume, progress=progress, callback=callback)


__all__ = ["TuneResult", "fine_tune", "train_loop"]
