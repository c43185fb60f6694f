"""Atomic, never-overwriting file writes shared by every object that saves itself."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def check_writable(path: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse to replace a user's existing file unless ``overwrite=True``."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise FileExistsError(f"{p} already exists; pass overwrite=True to replace it, or choose another path")
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename into place, so readers never see a half-written file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the user's usual permissions
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    def _w(tmp: str) -> None:
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=2, sort_keys=True, default=_json_default)

    atomic_write(path, _w)


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as fh:
        return json.load(fh)


def write_safetensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    clean = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write(path, lambda tmp: save_file(clean, tmp, metadata=metadata))


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def save_bundle(path: str | os.PathLike, tensors: dict[str, torch.Tensor], meta: dict, overwrite: bool = False) -> Path:
    """Save ``tensors`` to ``PATH/tensors.safetensors`` and ``meta`` to ``PATH/meta.json`` atomically."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise FileExistsError(f"{p} already exists; pass overwrite=True to replace it, or choose another path")
    p.mkdir(parents=True, exist_ok=True)
    write_safetensors(p / "tensors.safetensors", tensors)
    write_json(p / "meta.json", meta)
    return p


def load_bundle(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    p = Path(path)
    if not (p / "meta.json").exists():
        raise FileNotFoundError(f"{p} holds no saved bundle (meta.json missing)")
    return read_safetensors(p / "tensors.safetensors"), read_json(p / "meta.json")


def _json_default(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"cannot serialise {type(o).__name__} to JSON")
