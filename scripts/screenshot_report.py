"""Open a report in headless Chromium, wait for plotly to draw, count rendered figures, save a screenshot.

    python scripts/screenshot_report.py runs/refusal/report.html --png report.png

Exits non-zero when Chromium is missing or a figure did not render. Uses Chromium's own command line
(--dump-dom after the page's scripts ran, --screenshot), no extra Python packages.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=15000", "--hide-scrollbars"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def rendered_figures(html: Path) -> tuple[int, int]:
    """(plotly divs in the page, divs plotly actually drew into) after the scripts ran."""
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as prof:
        dom = subprocess.run([exe, *FLAGS, f"--user-data-dir={prof}", "--dump-dom", html.resolve().as_uri()],
                             capture_output=True, text=True, timeout=120).stdout
    divs = len(re.findall(r'class="plotly-graph-div[" ]', dom))
    drawn = len(re.findall(r'class="main-svg"', dom)) // 2  # plotly draws two main svgs per figure
    return divs, drawn


def screenshot(html: Path, png: Path, height: int = 6000) -> None:
    """Save a ``1400 x height`` PNG of the page after its scripts ran."""
    exe = chromium()
    with tempfile.TemporaryDirectory() as prof:
        subprocess.run([exe, *FLAGS, f"--user-data-dir={prof}", f"--window-size=1400,{height}",
                        f"--screenshot={png.resolve()}", html.resolve().as_uri()], capture_output=True, timeout=120,
                       check=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("html")
    ap.add_argument("--png", default=None, help="write a screenshot here (default: none)")
    ap.add_argument("--height", type=int, default=6000, help="window height in pixels (default: %(default)s)")
    args = ap.parse_args()
    divs, drawn = rendered_figures(Path(args.html))
    print(f"{divs} figures in the page, {drawn} rendered by plotly")
    if args.png:
        screenshot(Path(args.html), Path(args.png), args.height)
        print(f"screenshot: {args.png}")
    return 0 if divs and drawn >= divs else 1


if __name__ == "__main__":
    sys.exit(main())
