"""The run folder and its stage cache: each stage saved as safetensors + JSON under ``stages/NAME/``.

A stage's ``meta.json`` records its key (inputs, the thresholds that affect it, the package version); a
stage whose key matches is loaded, anything else is recomputed. No pickles: tensor fields go to
safetensors, the rest to JSON, and loading rebuilds the stage's dataclass from both.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from interp.bundle import decode_fields, encode_fields
from interp.io import OwnedFolder, read_json, read_safetensors, write_json, write_safetensors
from interp.studies.kit.config import RefusalConfig

OUR_FILES = ("metrics.json", "generations.jsonl", "report.html", "run.json", "direction", "stages", "model", "edits",
             "frontier_model")
T = TypeVar("T")


def save_stage(folder: Path, key: str, obj: Any) -> None:
    """Write a stage dataclass through the one result serialiser (:func:`interp.bundle.encode_fields`): tensors to
    ``tensors.safetensors``, the rest (and the key) to ``meta.json``."""
    if not is_dataclass(obj):
        raise TypeError(f"a stage result must be a dataclass, got {type(obj).__name__}")
    plain, tensors = encode_fields(obj)
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "tensors.safetensors", tensors)
    write_json(folder / "meta.json", {"kind": f"refusal.{type(obj).__name__}", "key": key, "fields": plain})  # last


def load_stage(folder: Path, key: str, cls: type[T]) -> T | None:
    """The saved stage if its key matches ``key``, else ``None`` (never a stale result)."""
    meta_file = folder / "meta.json"
    if not meta_file.exists():
        return None
    meta = read_json(meta_file)
    if meta.get("key") != key or meta.get("kind") != f"refusal.{cls.__name__}":
        return None
    return decode_fields(cls, meta["fields"], read_safetensors(folder / "tensors.safetensors"))


class Run:
    """The run folder: refuses another run's folder unless ``overwrite``; never deletes a user's files.

    A folder is "the same run" when the model's weights and everything but the selection thresholds (and
    ``save_model``) agree, so re-selecting with new thresholds needs no ``--overwrite``; the stage cache (keyed on
    the weights hash, never the model's name) decides what re-runs.
    Constructing a ``Run`` only checks the folder; :meth:`begin` (called once the inputs are validated) clears
    another run's outputs and writes ``run.json``, so a run that fails on bad input leaves no marker behind.
    """

    def __init__(self, out: str | Path, cfg: RefusalConfig, overwrite: bool):
        self.out, self.key, self.cfg, self.overwrite = Path(out), cfg.run_identity(), cfg, overwrite
        self.computed: list[str] = []
        if self.out.exists() and not self.out.is_dir():
            raise FileExistsError(f"{self.out} is a file; choose an output folder")
        if not self.out.exists():
            self._replace = False
            return
        foreign = OwnedFolder(self.out, OUR_FILES).foreign()
        if foreign:
            raise FileExistsError(f"{self.out} holds files that are not from a refusal run ({foreign[:3]}); choose "
                                  f"an empty or new --out folder (nothing was deleted)")
        run_file = self.out / "run.json"
        self._replace = run_file.exists() and read_json(run_file).get("key") != self.key
        if self._replace and not overwrite:
            raise FileExistsError(f"{self.out} holds another refusal run (different settings); pass "
                                  f"--overwrite to replace it, or choose another --out")

    def begin(self, model: str) -> None:
        """Claim the folder for this run of the model whose weights hash is ``model``: refuse the same settings'
        run of other weights unless ``overwrite``, clear another run's outputs (``overwrite``), write ``run.json``."""
        run_file = self.out / "run.json"
        if not self._replace and run_file.exists():
            before = read_json(run_file).get("model")  # None: a folder from before runs recorded their model
            if before not in (None, model):
                if not self.overwrite:
                    raise FileExistsError(f"{self.out} holds a refusal run with these settings of a model with other "
                                          f"weights (weights hash {before}, this model's {model}; a name says "
                                          f"nothing); pass --overwrite to replace it, or choose another --out")
                self._replace = True
        self.out.mkdir(parents=True, exist_ok=True)
        if self._replace:  # only our own outputs; stages stay and are re-checked by their keys
            OwnedFolder(self.out, OUR_FILES).clear(keep=("stages",))
            self._replace = False
        (self.out / "stages").mkdir(exist_ok=True)
        write_json(run_file, {"key": self.key, "config": self.cfg.flat(), "model": model})

    def stage(self, name: str, key: str, cls: type[T], compute: Callable[[], T],
              say: Callable[[str, str], None], complete: Callable[[T], T | None] | None = None) -> T:
        """Load stage ``name`` if saved under ``key``, else compute and save it; reports to ``say``.
        ``complete``: given the loaded result, a fuller one to save instead (what this run needs that the saved
        one skipped), or ``None`` when it has all."""
        folder = self.out / "stages" / name
        say(name, "start")
        got = load_stage(folder, key, cls)
        more = complete(got) if got is not None and complete is not None else None
        if got is not None and more is None:
            say(name, "cached")
            return got
        got = more if more is not None else compute()
        save_stage(folder, key, got)
        self.computed.append(name)
        say(name, "done")
        return got

    def remove_outputs(self, *names: str) -> None:
        """Remove our own outputs that a new result no longer has (e.g. the direction when none is found)."""
        for name in names:
            p = self.replace_dir(name)
            if p.exists():
                p.unlink()

    def replace_dir(self, name: str) -> Path:
        """A fresh ``out/name`` for one of our own output folders (``direction``, ``model``)."""
        if name not in OUR_FILES:
            raise ValueError(f"{name} is not one of the run's own outputs")
        p = self.out / name
        if p.is_dir():
            shutil.rmtree(p)
        return p
