"""What every CLI job shares: an output folder it owns, atomic writes, figures, the HTML page and ``run.json``.

A job folder holds only files the job names. The folder is claimed with a marker (``.interp_job.json``)
before any work starts, and ``run.json`` (the arguments) is written only after the job succeeded, so:
a folder with anyone else's files is refused and nothing is deleted; a finished run of the same job is
replaced only with ``--overwrite`` (deleting only that job's own files); a failed run's leftovers never
block the corrected rerun.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from interp import distributed as dist
from interp.io import OwnedFolder, atomic_write, read_json, write_json

MARKER = ".interp_job.json"
COMMON = ("result.json", "report.html", "run.json", "figures", MARKER)


class JobFolder:
    """The output folder of one job (``name``); ``own`` lists its outputs besides :data:`COMMON`."""

    def __init__(self, out: str | Path, name: str, own: Sequence[str], overwrite: bool = False):
        self.out = Path(out)
        self.name = name
        self.own = tuple(COMMON) + tuple(own)
        self.folder = OwnedFolder(self.out, self.own)
        if self.out.exists() and not self.out.is_dir():
            raise FileExistsError(f"--out {self.out} is a file; give a folder (new or empty) for the job's outputs")
        self.out.mkdir(parents=True, exist_ok=True)
        self._claim(overwrite)

    def _claim(self, overwrite: bool) -> None:
        entries = self.folder.entries()
        marker = self.out / MARKER
        foreign = self.folder.foreign()
        if entries and not marker.exists():
            foreign = [p.name for p in entries]
        if foreign:
            raise FileExistsError(f"{self.out} holds files that are not outputs of an `interp {self.name}` run "
                                  f"({foreign[:5]}); choose an empty or new --out folder (nothing was deleted)")
        if not entries:
            self._write_marker()
            return
        owner = read_json(marker).get("job")
        finished = (self.out / "run.json").exists()
        if owner != self.name and not overwrite:
            raise FileExistsError(f"{self.out} holds the outputs of an `interp {owner}` run; pass --overwrite to "
                                  f"replace them, or choose another --out")
        if owner == self.name and finished and not overwrite:
            raise FileExistsError(f"{self.out} holds a finished `interp {self.name}` run; pass --overwrite to "
                                  f"replace it, or choose another --out")
        self.clear()  # an unfinished (failed) run of this job, or --overwrite
        self._write_marker()

    def _write_marker(self) -> None:
        write_json(self.out / MARKER, {"job": self.name, "started": time.strftime("%Y-%m-%dT%H:%M:%S")})

    def clear(self) -> None:
        """Delete this job's own outputs (never anything else in the folder)."""
        self.folder.clear()

    def path(self, name: str) -> Path:
        """Where output ``name`` goes; refuses names the job did not declare (so ``clear`` can find them)."""
        if name.split("/")[0] not in self.own:
            raise ValueError(f"internal: {name!r} is not among the outputs of `interp {self.name}` {self.own}")
        return self.out / name

    def write_json(self, name: str, obj: Any) -> Path:
        p = self.path(name)
        write_json(p, obj)
        return p

    def write_text(self, name: str, text: str) -> Path:
        p = self.path(name)

        def _w(tmp: str) -> None:
            Path(tmp).write_text(text, encoding="utf-8")

        atomic_write(p, _w)
        return p

    def write_report(self, title: str, facts: list[tuple[str, Any]], figures: dict[str, Any],
                     extra: Sequence[tuple[str, str]] = ()) -> Path:
        """Each figure as ``figures/NAME.html`` (a fragment without plotly.js) and all of them in ``report.html``."""
        from interp.viz.html import kv_table, page

        for key, fig in figures.items():
            self.write_text(f"figures/{key}.html", fig.to_html(full_html=False, include_plotlyjs=False))
        sections: list[tuple[str, Any]] = [("Summary", kv_table(facts))]
        sections += [(_heading(fig, key), fig) for key, fig in figures.items()]
        sections += list(extra)
        return self.write_text("report.html", page(title, sections))

    def finish(self, args: argparse.Namespace) -> Path:
        """Record the arguments in ``run.json``: written last, so only a successful run leaves it."""
        return self.write_json("run.json", {"job": self.name, "args": job_args(args),
                                            "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})


def _heading(fig: Any, key: str) -> str:
    title = getattr(getattr(fig.layout, "title", None), "text", None)
    return str(title) if title else key


def job_args(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed arguments as plain JSON values (the handler function left out)."""
    return {k: v for k, v in vars(args).items() if k != "func" and not callable(v)}


def run_job(args: argparse.Namespace, name: str, own: Sequence[str], body: Callable[[JobFolder], dict],
            others: Callable[[], Any] | None = None) -> int:
    """Claim ``args.out`` for job ``name``, run ``body(folder) -> summary``, write ``run.json``, print the summary.

    Data parallel (:mod:`interp.distributed`), rank 0 claims the folder and runs ``body`` (the one writer) while
    every other rank runs ``others()`` (its share of the collective work), once rank 0 holds the folder."""
    folder = dist.on_main(lambda: JobFolder(args.out, name, own, overwrite=args.overwrite))
    if folder is None:
        if others is None:
            raise ValueError(f"`interp {name}` does not run data-parallel; launch it without torchrun")
        others()
        return 0
    summary = body(folder)
    folder.finish(args)
    print_summary(f"interp {name}: {args.out}", summary)
    print(f"report: {folder.out / 'report.html'}")
    return 0


def print_summary(title: str, rows: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_header=False)
    for k, v in rows.items():
        t.add_row(str(k), f"{v:.4g}" if isinstance(v, float) else str(v))
    Console().print(t)


def load(args: argparse.Namespace) -> Any:
    """The model named by ``--model`` / ``--dtype`` / ``--device``."""
    from interp.models import load_model

    return load_model(args.model, dtype=args.dtype, device=args.device)


def prompts_of(path: str, column: str | None, flag: str) -> list[str]:
    """Prompts of one file, with the flag that named it in any error (e.g. ``--negative``)."""
    from interp.prompts import read_prompt_file

    try:
        return read_prompt_file(path, column).prompts
    except (ValueError, FileNotFoundError) as e:
        raise type(e)(f"{flag}: {e}") from None


def floats(text: str, flag: str) -> list[float]:
    """Comma-separated numbers (``--alpha 0,4,8``), with a clear error naming the flag."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers such as 2,4,8; got {text!r}") from None
    if not vals:
        raise ValueError(f"{flag} needs at least one number; got {text!r}")
    return vals


def add_out_args(p: argparse.ArgumentParser, default: str) -> None:
    """``--out`` and ``--overwrite``, worded the same for every job."""
    option(p, "--out", default, "output folder, new or empty")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a finished run's outputs in --out (only the job's own files are deleted; "
                        "default: refuse)")


def option(p: argparse.ArgumentParser, flag: str, default: Any, help: str, **kw: Any) -> None:
    """An option whose help always ends with its default, so ``--help`` shows every default."""
    shown = "none" if default is None else default
    p.add_argument(flag, default=default, help=f"{help} (default: {shown})", **kw)


__all__ = ["COMMON", "MARKER", "JobFolder", "add_out_args", "floats", "job_args", "load", "option",
           "print_summary", "prompts_of", "run_job"]
