"""The house rules, checked on the source: imports run one way down the floors, no import circle (imports
inside functions count), no oversized file or function, and one definition of each shared job."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BELOW_FIT = {"interp", "evals", "viz"}
BELOW_ACT = BELOW_FIT | {"probes", "sae"}
BELOW_PIPELINES = BELOW_ACT | {"steering", "patching"}
# what each top-level package may import from this project (itself always); see ARCHITECTURE.md
ALLOWED: dict[str, set[str]] = {
    "interp": set(),                       # the core imports no other floor
    "interp.testing": {"interp"},          # beside the core: tiny models and oracles
    "evals": set(),                        # ground floors: pure functions
    "viz": set(),
    "probes": BELOW_FIT,
    "sae": BELOW_FIT,
    "tune": BELOW_FIT,                     # fit floor: fine-tuning and token attribution through adapters
    "steering": BELOW_ACT,
    "patching": BELOW_ACT,
    "organism": BELOW_PIPELINES | {"tune"},  # builds the organisms with the public floors
    "pipelines": BELOW_PIPELINES | {"tune"},
    "interp_cli": BELOW_PIPELINES | {"tune", "pipelines", "organism"},
}
PACKAGES = ("interp", "evals", "viz", "probes", "sae", "tune", "steering", "patching", "pipelines", "organism", "interp_cli")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            parts = list(f.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module a dotted import name lands in (the longest known prefix), or None if external."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in MODULES:
            return cand
    return None


def _imports(mod: str, path: Path) -> set[str]:
    """Every project module ``mod`` imports, at module level or inside functions (``TYPE_CHECKING`` skipped)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` blocks do not run
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            # `from pkg import submodule` runs pkg/__init__ only as every import of a submodule does: not an edge
            names = subs if all(n in MODULES for n in subs) else subs + [base]
        else:
            continue
        for n in names:
            r = _resolve(n)
            if r is not None and r != mod:
                out.add(r)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _floor(mod: str) -> str:
    return "interp.testing" if mod.startswith("interp.testing") else mod.split(".")[0]


def test_every_package_is_checked():
    assert set(PACKAGES) <= set(ALLOWED)
    assert len(MODULES) > 50


def test_no_import_runs_up_a_floor():
    bad = []
    for mod, deps in GRAPH.items():
        me = _floor(mod)
        for d in deps:
            other = _floor(d)
            if other != me and other not in ALLOWED[me]:
                bad.append(f"{mod} imports {d} ({me} may import {sorted(ALLOWED[me]) or 'nothing of ours'})")
    assert not bad, "imports against the floors:\n" + "\n".join(sorted(bad))


def test_no_import_circle():
    """Module-level strongly connected components of size > 1 (or self loops) are circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan, iterative enough for this size
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_checker_sees_lazy_imports(tmp_path):
    """The parser must see an import inside a function (else the floor test could not fail)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from steering.apply import apply\n    return apply\n")
    assert _imports("interp.fake", f) == {"steering.apply"}


def _code_files() -> list[Path]:
    return [p for p in MODULES.values()]


def test_no_file_over_400_lines():
    big = [f"{p.relative_to(REPO)}: {n}" for p in _code_files()
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400]
    assert not big, "files over 400 lines:\n" + "\n".join(big)


def test_no_function_over_60_lines():
    long = []
    for p in _code_files():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    long.append(f"{p.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "functions over 60 lines:\n" + "\n".join(sorted(long))


ONE_DEFINITION = {
    "encode": r"^def encode\(", "collate": r"^def collate\(", "last-position logits": r"^def last_logits\(",
    "refusal score": r"^def refusal_score\(", "KL": r"^def kl_div\(", "AUROC": r"^def auroc\(",
    "Cohen's d": r"^def cohens_d\(", "refusal phrase list": r"^REFUSAL_PHRASES\b", "generation": r"^def generate\(",
    "pad-id rule": r"^def pad_id\(",
}


@pytest.mark.parametrize("job", sorted(ONE_DEFINITION))
def test_one_definition_each(job):
    pattern = ONE_DEFINITION[job]
    hits = []
    for p in _code_files():
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(pattern, line):  # module level only: a method of the same name is another job
                hits.append(f"{p.relative_to(REPO)}:{i}")
    assert len(hits) == 1, f"{job}: expected one definition, found {len(hits)}: {hits}"


def test_git_grep_agrees():
    """The same count with `git grep -c`, as the issue asks (tracked files only; skipped outside a checkout)."""
    r = subprocess.run(["git", "grep", "-c", "-E", r"^def (encode|collate)\(", "--", *PACKAGES],
                       cwd=REPO, capture_output=True, text=True)
    if r.returncode not in (0, 1) or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    total = sum(int(line.rsplit(":", 1)[1]) for line in r.stdout.splitlines() if line)
    assert total == 2, r.stdout
