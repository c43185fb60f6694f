"""Execute the notebooks in notebooks/ and write them back with their outputs, so they read without a kernel.

    python scripts/run_notebooks.py                 # every notebook
    python scripts/run_notebooks.py notebooks/01_refusal_direction.ipynb

Each notebook runs top to bottom in a fresh kernel (nbclient) started in the repository root; a notebook
is replaced only when it ran without error, atomically (a temp file beside it, then a rename), so a failed
or interrupted run leaves the committed file as it was. Plotly figures are saved both interactive and as a
static PNG (through kaleido, which uses the system's Chromium), so they render where JavaScript does not
(GitHub's viewer, nbviewer without JS, a PDF export).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STATIC_RENDERER = "plotly_mimetype+png"  # interactive figure and a PNG of it in the same output


def static_images_available() -> str | None:
    """``None`` when kaleido can render PNGs here, else what is missing and how to get it."""
    try:
        import plotly.graph_objects as go

        go.Figure().to_image(format="png", width=10, height=10)
    except Exception as e:  # kaleido missing, or no Chrome/Chromium for it
        return (f"static figure images need kaleido and Chromium ({type(e).__name__}: {e}); "
                f"pip install kaleido, apt-get install chromium")
    return None


def execute(path: Path, timeout: int = 900, static: bool = True) -> object:
    """Run ``path`` in a fresh kernel (cwd: the repository root) and return the executed notebook."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = {"OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if static:
        env["PLOTLY_RENDERER"] = STATIC_RENDERER
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits the environment of this process
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(REPO)}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb


def _as_terminal(text: str) -> str:
    """What a terminal would show for ``text``: each carriage return overwrites its line (progress bars)."""
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
    noise = ("TqdmWarning: IProgress not found", "from .autonotebook import tqdm as notebook_tqdm")
    return "\n".join(line for line in lines if line and not any(n in line for n in noise))


def tidy_streams(nb: object) -> None:
    """Merge each cell's consecutive stdout/stderr chunks and keep only their final text (no bar frames)."""
    import nbformat

    for cell in nb.cells:  # type: ignore[attr-defined]
        if cell.cell_type != "code":
            continue
        merged: list = []
        for o in cell.outputs:
            if o.output_type == "stream" and merged and merged[-1].output_type == "stream" \
                    and merged[-1].name == o.name:
                merged[-1].text += o.text
            else:
                merged.append(o)
        cell.outputs = []
        for o in merged:
            if o.output_type == "stream":
                text = _as_terminal(o.text)
                if not text:
                    continue
                o = nbformat.v4.new_output("stream", name=o.name, text=text + "\n")
            cell.outputs.append(o)


def write_atomic(nb: object, path: Path) -> None:
    """Write ``nb`` over ``path`` through a temp file in the same folder and a rename."""
    import nbformat

    tmp = path.with_name(f".{path.name}.run_notebooks.tmp")
    try:
        nbformat.write(nb, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="execute notebooks and write their outputs back")
    ap.add_argument("paths", nargs="*", help="notebooks to run (default: every notebooks/*.ipynb)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell (default: %(default)s)")
    ap.add_argument("--no-static", action="store_true", help="skip the PNG copies of figures (default: off)")
    args = ap.parse_args(argv)
    paths = [Path(p) for p in args.paths] or sorted((REPO / "notebooks").glob("*.ipynb"))
    static = not args.no_static
    if static and (why := static_images_available()) is not None:
        print(f"error: {why}; or pass --no-static", file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        t0 = time.perf_counter()
        try:
            nb = execute(path, args.timeout, static)
        except Exception as e:  # a cell raised: keep the committed notebook as it was
            print(f"{path.name}: FAILED ({type(e).__name__}: {str(e)[-500:]}); left unchanged", file=sys.stderr)
            failed += 1
            continue
        tidy_streams(nb)
        write_atomic(nb, path)
        print(f"{path.name}: executed in {time.perf_counter() - t0:.0f} s, outputs written")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
