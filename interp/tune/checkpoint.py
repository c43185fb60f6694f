"""Resumable checkpoints of a fine-tune: the trainable weights, the optimiser state, the data order and the RNG,
written as one folder atomically (staged beside it, then renamed), never over an existing one.

``OUT/checkpoint-{step}/``: ``trainable.safetensors``, ``optimizer.pt``, ``rng.safetensors`` (the order
generator's and torch's RNG state) and ``state.json`` (steps done, losses, the order still to draw, the config
and data fingerprint a resumed run must match).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from interp.io import read_json, read_safetensors, write_json, write_safetensors

NAME = "checkpoint-{step}"


@dataclass
class LoopState:
    """Where a run is: ``step`` steps done, their ``losses``, the shuffled ``order`` still to draw from, tokens seen."""

    step: int
    losses: list[float]
    order: list[int]
    tokens: int


def checkpoint_path(out: str | os.PathLike, step: int) -> Path:
    return Path(out) / NAME.format(step=step)


def latest_checkpoint(out: str | os.PathLike) -> Path | None:
    """The ``checkpoint-{step}`` folder with the largest step under ``out`` (by step, not by name; ``None``: none
    yet, or no such folder): what a stopped run resumes from."""
    found = [(int(m.group(1)), c) for c in Path(out).glob("checkpoint-*") if (m := re.fullmatch(r"checkpoint-(\d+)", c.name))]
    return max(found)[1] if found else None


def refuse_existing(out: str | os.PathLike | None, steps: tuple[int, ...]) -> None:
    """Fail before training when a checkpoint this run would write already exists (never overwrite silently)."""
    if out is None:
        if steps:
            raise ValueError("checkpoint_steps are set but no folder is given; pass out=FOLDER")
        return
    if Path(out).exists() and not Path(out).is_dir():
        raise NotADirectoryError(f"{out} is a file; checkpoints go into a folder (choose another out=)")
    there = [str(checkpoint_path(out, s)) for s in steps if checkpoint_path(out, s).exists()]
    if there:
        raise FileExistsError(f"{there[0]} already exists; resume from it (resume=...), delete it, or choose "
                              f"another out= folder")


def save_checkpoint(out: str | os.PathLike, state: LoopState, params: dict[str, torch.Tensor],
                    optimizer: torch.optim.Optimizer, order_gen: torch.Generator, meta: dict[str, Any]) -> Path:
    """Write ``OUT/checkpoint-{step}`` atomically; refuses an existing one."""
    dest = checkpoint_path(out, state.step)
    refuse_existing(out, (state.step,))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        write_safetensors(tmp / "trainable.safetensors", {k: v.detach() for k, v in params.items()})
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        write_safetensors(tmp / "rng.safetensors", {"order": order_gen.get_state(), "torch": torch.get_rng_state()})
        write_json(tmp / "state.json", {"step": state.step, "losses": state.losses, "order": state.order,
                                        "tokens": state.tokens, **meta})
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def load_checkpoint(path: str | os.PathLike, params: dict[str, torch.nn.Parameter],
                    optimizer: torch.optim.Optimizer, order_gen: torch.Generator, meta: dict[str, Any]) -> LoopState:
    """Restore a checkpoint into ``params`` / ``optimizer`` / ``order_gen`` (and torch's RNG); refuses one written
    under another config or data (``meta``)."""
    p = Path(path)
    if not (p / "state.json").exists():
        raise FileNotFoundError(f"{p} is not a tune checkpoint (no state.json); pass a checkpoint-N folder")
    saved = read_json(p / "state.json")
    for key, want in json.loads(json.dumps(meta)).items():  # as JSON holds it (tuples as lists)
        have = saved.get(key)
        if have != want:
            what = [f"{k}: {have.get(k)!r} vs {want.get(k)!r}" for k in want if have.get(k) != want.get(k)] \
                if isinstance(have, dict) and isinstance(want, dict) else [f"{have!r} vs {want!r}"]
            raise ValueError(f"checkpoint {p} was written with another {key} ({'; '.join(what)}, checkpoint vs "
                             f"this run); resume with the same config and data, or start afresh")
    tensors = read_safetensors(p / "trainable.safetensors")
    if set(tensors) != set(params):
        raise ValueError(f"checkpoint {p} holds other trainable weights than this model "
                         f"({len(tensors)} vs {len(params)} tensors); resume on the same base and method")
    with torch.no_grad():
        for k, v in params.items():
            v.copy_(tensors[k])
    optimizer.load_state_dict(torch.load(p / "optimizer.pt", weights_only=True))
    rng = read_safetensors(p / "rng.safetensors")
    order_gen.set_state(rng["order"])
    torch.set_rng_state(rng["torch"])
    return LoopState(int(saved["step"]), list(saved["losses"]), list(saved["order"]), int(saved["tokens"]))


__all__ = ["LoopState", "checkpoint_path", "latest_checkpoint", "load_checkpoint", "refuse_existing", "save_checkpoint"]
