"""Every notebook in notebooks/ runs top to bottom on the embedded organism (nbclient, fresh kernel), and is
committed executed: outputs in every code cell, no errors, each figure also as a static PNG."""

from __future__ import annotations

import sys

import pytest

from .conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
OURS = {"interp", "probes", "sae", "steering"}


def _outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _executes(path):
    """The same code path as ``scripts/run_notebooks.py`` (without the PNG copies, which need Chromium)."""
    import os

    sys.path.insert(0, str(REPO / "scripts"))
    from run_notebooks import execute

    os.environ["INTERP_NOTEBOOK_SMALL"] = "1"  # notebooks that read it run smaller here (the committed run is full size)
    nb = execute(path, timeout=600, static=False)
    assert not [o for o in _outputs(nb) if o.output_type == "error"]
    assert [o for o in _outputs(nb) if PLOTLY in o.get("data", {})], "the notebook shows no figure"


# One class per notebook, each executing it: pytest-xdist (--dist loadscope) runs a module's functions on one worker
# but each class on any worker, so the notebooks (the longest tests) spread over the workers. The longest first.
LONGEST_FIRST = ("06", "05", "08", "10", "04", "03", "07")
for _path in sorted(NOTEBOOKS, key=lambda p: (LONGEST_FIRST.index(p.name[:2]) if p.name[:2] in LONGEST_FIRST
                                              else len(LONGEST_FIRST), p.name)):
    _name = "TestExecutes" + "".join(w.capitalize() for w in _path.stem.split("_"))
    globals()[_name] = type(_name, (), {"test_notebook_executes": lambda self, p=_path: _executes(p),
                                        "__doc__": f"{_path.name} runs top to bottom in a fresh kernel."})


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_notebook_has_outputs(path):
    """Readable without running it: every code cell executed in order with output, figures also as PNG."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.get("execution_count") for c in code]
    assert None not in counts, f"{path.name}: unexecuted cells; run python scripts/run_notebooks.py {path.name}"
    assert counts == sorted(counts), f"{path.name}: cells executed out of order; rerun scripts/run_notebooks.py"
    assert all(c.get("outputs") for c in code), f"{path.name}: a code cell has no output"
    assert not [o for o in _outputs(nb) if o.output_type == "error"]
    figures = [o for o in _outputs(nb) if PLOTLY in o.get("data", {})]
    assert figures and all("image/png" in o["data"] for o in figures), \
        f"{path.name}: a figure has no static PNG copy; rerun python scripts/run_notebooks.py (needs kaleido)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_uses_public_apis_only(path):
    """Notebooks teach the public API: every imported name is in its module's ``__all__``, nothing private;
    the refusal notebook calls the stage functions that ``interp.studies.refusal`` exports (as ``interp refusal`` does)."""
    import ast
    import importlib
    import importlib.util

    import nbformat

    nb = nbformat.read(path, as_version=4)
    tree = ast.parse("\n".join(c.source for c in nb.cells if c.cell_type == "code"))
    modules: dict[str, object] = {}  # local name -> one of our modules, to check attributes used on it
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    modules[alias.asname or alias.name] = importlib.import_module(alias.name)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OURS:
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert not alias.name.startswith("_"), f"{path.name} imports private {node.module}.{alias.name}"
                try:
                    modules[alias.asname or alias.name] = importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    assert alias.name in getattr(mod, "__all__", [alias.name]), \
                        f"{path.name}: {node.module}.{alias.name} is not public"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            assert not node.attr.startswith("_"), f"{path.name} reaches into private .{node.attr}"
            if isinstance(node.value, ast.Name) and node.value.id in modules:
                mod = modules[node.value.id]
                public_submodule = importlib.util.find_spec(f"{mod.__name__}.{node.attr}") is not None \
                    if hasattr(mod, "__path__") else False             # e.g. sae.quality: the API beyond __all__
                assert node.attr in getattr(mod, "__all__", [node.attr]) or public_submodule, \
                    f"{path.name}: {mod.__name__}.{node.attr} is not in its __all__"
    if path.name.startswith("01_"):
        froms = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "interp.studies.refusal" in froms and not any(m.startswith("interp.studies.refusal.") for m in froms)
        import interp.studies.refusal as pr

        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        stages = {"find_refusal_tokens", "find_candidates", "score_candidates", "select_direction", "evaluate",
                  "find_subspaces"}
        assert stages <= used & set(pr.__all__)


def test_there_are_notebooks():
    assert any(p.name.startswith("01_") for p in NOTEBOOKS)
