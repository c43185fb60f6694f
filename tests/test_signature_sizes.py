"""Issue 37 (no threaded flags): no public function or method of the four packages takes more than 10 parameters,
apart from the per-batch plumbing named here with the reason; the new studies' entry points take at most 8."""

import ast
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("interp", "probes", "sae", "steering")
# plumbing that the public entry points call once per batch; a researcher calls capture / forward / apply instead
PLUMBING = {"interp/forward.py:forward": "the one forward layer under every entry point (hooks, logits, resume)",
            "interp/capturing.py:run_batch": "one batch of capture; interp.capture is the entry point",
            "interp/capturing.py:run_batch_flagged": "one batch of capture with sink flags",
            "interp/capture_pass.py:run_groups": "one forward keeping groups of sites; capture_groups calls it",
            "steering/kernels.py:edit_triton": "a Triton kernel launch: one argument per kernel input"}


def public_signatures() -> list[tuple[str, int]]:
    """``(path:qualname, number of parameters without self / cls)`` of every public function and method."""
    rows = []
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = f.relative_to(ROOT)
            if any(p.startswith("_") and p != "__init__.py" for p in rel.parts):
                continue

            def visit(node: ast.AST, prefix: str, rel: Path = rel) -> None:
                for n in ast.iter_child_nodes(node):
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_"):
                        a = n.args
                        names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                        rows.append((f"{rel.as_posix()}:{prefix}{n.name}", len(names)))
                    elif isinstance(n, ast.ClassDef) and not n.name.startswith("_"):
                        visit(n, f"{prefix}{n.name}.", rel)

            visit(ast.parse(f.read_text()), "")
    return rows


def test_the_walk_sees_the_packages():
    rows = dict(public_signatures())
    assert len(rows) > 1000 and "interp/capturing.py:capture" in rows and "steering/generation.py:generate" in rows


def test_no_public_function_takes_more_than_ten_parameters():
    big = {name: k for name, k in public_signatures() if k > 10 and name not in PLUMBING}
    assert not big, f"public functions over 10 parameters (move choices into a config or a value type): {big}"


def test_the_plumbing_list_is_current():
    rows = dict(public_signatures())
    assert not [n for n in PLUMBING if n not in rows], "a PLUMBING entry no longer exists: remove it"


@pytest.mark.parametrize("path", ["interp.studies.entrainment:entrainment_study",
                                  "interp.studies.syntax:syntactic_refusal",
                                  "interp.studies.moe:moe_refusal",
                                  "interp.studies.refusal.frontier:run_frontier"])
def test_new_study_entry_points_take_at_most_eight(path):
    import importlib

    mod, name = path.split(":")
    params = inspect.signature(getattr(importlib.import_module(mod), name)).parameters
    assert len(params) <= 8, list(params)
    assert not {"chat", "system", "seed", "batch_size", "progress"} & set(params), list(params)
