"""Shared benchmark helpers: timing medians, a peak-RSS sampler, machine description, table output."""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch


class PeakRSS:
    """Samples this process's resident memory every millisecond; ``peak - start`` is the growth of a call."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakRSS:
        self.start = self.proc.memory_info().rss
        self.peak = self.start
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, warmup: int = 1) -> dict[str, dict[str, float]]:
    """Run every function once per round, in rotating order; report the median seconds and peak RSS growth."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    mem: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            with PeakRSS() as p:
                t0 = time.perf_counter()
                fns[k]()
                times[k].append(time.perf_counter() - t0)
            mem[k].append(p.growth_mb)
    return {k: {"median_s": statistics.median(times[k]), "peak_mb": max(mem[k])} for k in fns}


def machine() -> str:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), device {dev}")


def table(title: str, rows: list[dict[str, Any]], cols: list[str]) -> str:
    out = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(out) + "\n"


def append_section(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` to a result file (atomically rewritten; what was there is kept)."""
    from pathlib import Path

    old = Path(path).read_text() if Path(path).exists() else ""
    write_text(path, old + ("\n" if old else "") + text)


def markdown_table(frame: Any, floatfmt: str = ".3g") -> str:
    """A pandas frame as a markdown table (no index; floats formatted ``floatfmt``, missing values empty); no
    ``tabulate`` needed."""
    import pandas as pd

    def cell(v: Any) -> str:
        if v is None or v is pd.NA or (isinstance(v, float) and v != v):
            return ""
        return format(v, floatfmt) if isinstance(v, float) else str(v).replace("|", "/")

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, "|" + "---|" * len(frame.columns)] + rows)


def replace_section(path: str | os.PathLike, heading: str, text: str) -> None:
    """``text`` (starting with ``heading``, a ``### ...`` line) in place of the file's section under that exact heading
    (up to the next ``### `` heading), or appended when the file has none; every other section kept; atomic."""
    from pathlib import Path

    if not text.startswith(heading):
        raise ValueError(f"the section must start with its heading {heading!r}")
    old = Path(path).read_text() if Path(path).exists() else ""
    lines = old.split("\n")
    try:
        start = lines.index(heading)
    except ValueError:
        write_text(path, (old.rstrip("\n") + "\n\n" if old.strip() else "") + text.rstrip("\n") + "\n")
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("### ")), len(lines))
    rest = "\n".join(lines[end:])
    write_text(path, "\n".join(lines[:start]) + ("\n" if start else "") + text.rstrip("\n") + "\n"
               + ("\n" + rest if rest.strip() else ""))


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a result file atomically (its folder created)."""
    from pathlib import Path

    from interp.io import atomic_write

    atomic_write(path, lambda p: Path(p).write_text(text))


def skipped(what: str, why: str, out: str | os.PathLike | None = None) -> str:
    """The one line a benchmark prints (and writes to ``out``) when it cannot run here: ``skipped: <why>``."""
    line = f"{what}: skipped: {why}"
    print(line, flush=True)
    if out:
        write_text(out, line + "\n")
    return line


def cuda_wanted(device: str, what: str, out: str | os.PathLike | None = None) -> bool:
    """True when the run may go on: ``device`` is not CUDA, or CUDA is there; else False, and with ``out`` the
    skip line is printed and written there."""
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        if out is not None:
            skipped(what, "no CUDA (--device cuda asked for, but torch sees no CUDA device)", out)
        return False
    return True


def sync(device: Any) -> None:
    """Wait for queued CUDA work, so wall-clock timings of GPU calls are complete (no-op on CPU)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)
