"""Four import names: a researcher's own ``viz.py``, ``evals/``, ``tune.py``, ``pipelines.py`` beside a notebook
(first on ``sys.path``, as a notebook's folder is) break no import of ours."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import REPO

OURS = ("import interp, probes, sae, steering\n"
        "from interp import evals, viz, tune, patching\n"
        "import interp.studies.refusal, interp.studies.kit, interp.organisms, interp.cli.main\n"
        "import steering.generation, sae.edits, probes.directions\n"
        "print('ok')\n")


def _run(folder) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", OURS], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_notebook_folder_with_generic_names_breaks_nothing(tmp_path):
    for name in ("viz.py", "tune.py", "pipelines.py", "organism.py", "patching.py"):
        (tmp_path / name).write_text(f"raise ImportError('the researcher\\'s own {name} was imported')\n")
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "__init__.py").write_text("raise ImportError('the researcher\\'s own evals/ was imported')\n")
    r = _run(tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_the_check_sees_a_shadowed_name(tmp_path):
    """The same run fails when one of our four names is shadowed (so the test above could fail)."""
    (tmp_path / "probes.py").write_text("raise ImportError('shadowed')\n")
    r = _run(tmp_path)
    assert r.returncode != 0 and "shadowed" in r.stderr
