"""Every notebook in notebooks/ runs top to bottom on the embedded organism (nbclient, fresh kernel)."""

from __future__ import annotations

import os

import pytest

from .conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    os.environ["OMP_NUM_THREADS"] = "1"  # the kernel inherits it: tiny models run faster on one thread
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    figures = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert figures, "the notebook shows no figure"


def test_there_are_notebooks():
    assert any(p.name.startswith("01_") for p in NOTEBOOKS)
