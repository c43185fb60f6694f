"""The house rules, checked on the source: imports run one way down the floors, no import circle (imports
inside functions count), no oversized file or function, and one definition of each shared job."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the four import names the install puts in a researcher's environment (DESIGN.md); nothing else is top level
TOP_LEVEL = ("interp", "probes", "sae", "steering")
NOT_PACKAGES = {"tests", "benchmarks", "scripts", "notebooks"}  # repository folders that are not installed
GROUND = {"interp.evals", "interp.viz"}
CORE = GROUND | {"interp"}
BELOW_ACT = CORE | {"probes", "sae", "interp.tune", "interp.look"}
BELOW_STUDIES = BELOW_ACT | {"steering", "interp.patching"}
# what each floor may import from this project (itself always); see ARCHITECTURE.md. A floor is a top-level
# package or a subpackage of interp named here; every other module of interp is the core.
ALLOWED: dict[str, set[str]] = {
    "interp.evals": set(),                          # ground floors: pure functions
    "interp.viz": set(),
    "interp": GROUND,                                # the core: load, locate, hook, forward, capture, store
    "interp.testing": CORE,                          # beside the core: tiny models and oracles
    "probes": CORE,                                  # fit
    "sae": CORE,
    "interp.tune": CORE,
    "interp.look": CORE,                             # lenses, direct logit attribution, head scores
    "steering": BELOW_ACT,                           # act
    "interp.patching": BELOW_ACT,
    "interp.studies.kit": BELOW_STUDIES,             # what the studies share
    "interp.studies": BELOW_STUDIES | {"interp.studies.kit"},  # each study; never another study
    "interp.organisms": BELOW_STUDIES | {"interp.studies.kit"},  # builds the organisms with the public floors
    "interp.cli": BELOW_STUDIES | {"interp.studies.kit", "interp.studies", "interp.organisms"},
}
SUBFLOORS = {f.split(".")[1] for f in ALLOWED if f.startswith("interp.")}
CORE_FOLDERS = {"data", "embedded"}                  # folders of the core itself (prompt sets, embedded models)


def _top_level_packages(root: Path) -> set[str]:
    """Folders at the repository root that Python would import (hold an ``__init__.py``) and ship."""
    return {d.name for d in root.iterdir() if d.is_dir() and (d / "__init__.py").exists()} - NOT_PACKAGES


def _unplaced_folders(root: Path) -> list[str]:
    """Folders of ``interp`` holding Python that no floor of ALLOWED places."""
    return sorted(d.name for d in (root / "interp").iterdir()
                  if d.is_dir() and any(d.rglob("*.py")) and d.name not in SUBFLOORS | CORE_FOLDERS)


def _modules(root: Path = REPO) -> dict[str, Path]:
    out = {}
    for pkg in sorted(_top_level_packages(root)):
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
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
    parts = mod.split(".")
    if parts[0] != "interp" or len(parts) == 1 or parts[1] not in SUBFLOORS:
        return parts[0]
    if parts[1] == "studies" and len(parts) > 2 and parts[2] == "kit":
        return "interp.studies.kit"
    return ".".join(parts[:2])


def _study(mod: str) -> str | None:
    """The study folder a module of ``interp.studies`` belongs to (None for the package itself and the kit)."""
    parts = mod.split(".")
    if parts[:2] != ["interp", "studies"] or len(parts) < 3 or parts[2] == "kit":
        return None
    return parts[2]


def _floor_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in graph.items():
        me = _floor(mod)
        for d in deps:
            other = _floor(d)
            if other != me and other not in ALLOWED.get(me, ()):
                bad.append(f"{mod} imports {d} ({me} may import {sorted(ALLOWED.get(me, ())) or 'nothing of ours'})")
            elif _study(mod) and _study(d) and _study(d) != _study(mod):
                bad.append(f"{mod} imports {d}: one study never imports another (move what they share to "
                           "interp.studies.kit or a lower floor)")
    return sorted(bad)


def test_four_import_names():
    """The install ships exactly the four design names, as setuptools finds them from pyproject's include."""
    import tomllib
    from setuptools import find_packages
    assert _top_level_packages(REPO) == set(TOP_LEVEL)
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = find_packages(str(REPO), include=conf["include"])
    assert {p.split(".")[0] for p in found} == set(TOP_LEVEL), found


def test_every_folder_is_placed():
    """A new top-level package or a new subpackage of interp must be given a floor here (and in ARCHITECTURE.md)."""
    assert _top_level_packages(REPO) <= {f.split(".")[0] for f in ALLOWED}
    assert not _unplaced_folders(REPO), f"folders of interp on no floor: {_unplaced_folders(REPO)}"
    assert len(MODULES) > 50


def test_the_checker_fails_on_a_new_folder_and_a_study_import(tmp_path):
    """The rules can fail: a new top-level package, a new interp folder, a study importing another study."""
    for pkg in TOP_LEVEL:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "viz").mkdir()
    (tmp_path / "viz" / "__init__.py").write_text("")
    (tmp_path / "interp" / "extras").mkdir()
    (tmp_path / "interp" / "extras" / "m.py").write_text("")
    assert "viz" in _top_level_packages(tmp_path)
    assert _unplaced_folders(tmp_path) == ["extras"]
    graph = {"interp.studies.finetune.a": {"interp.studies.refusal.evaluation"},
             "interp.studies.finetune.b": {"interp.studies.kit.cache", "interp.studies.finetune.a"}}
    bad = _floor_violations(graph)
    assert len(bad) == 1 and "one study never imports another" in bad[0]
    assert _floor_violations({"interp.evals.rates": {"interp.forward"}})  # the ground floor imports nothing


def test_no_import_runs_up_a_floor():
    bad = _floor_violations(GRAPH)
    assert not bad, "imports against the floors:\n" + "\n".join(bad)


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
    f.write_text("def f():\n    from steering.applying import apply\n    return apply\n")
    assert _imports("interp.fake", f) == {"steering.applying"}


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
    r = subprocess.run(["git", "grep", "-c", "-E", r"^def (encode|collate)\(", "--", *TOP_LEVEL],
                       cwd=REPO, capture_output=True, text=True)
    if r.returncode not in (0, 1) or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    total = sum(int(line.rsplit(":", 1)[1]) for line in r.stdout.splitlines() if line)
    assert total == 2, r.stdout


SAMPLER_HOME = "interp/evals/controls.py"   # the one matched-random sampler
RATE_HOME = "interp/evals/rates.py"         # the one rate record (Rate) and its table columns
_DRAWS = {"choice", "choices", "sample", "randperm"}


def _grown_or_given(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names a function takes as parameters (or as a ``set`` of them) or grows as it goes (``x.append``, ``x += ...``)."""
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("append", "add", "extend") \
                and isinstance(n.func.value, ast.Name):
            names.add(n.func.value.id)
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
    for n in ast.walk(fn):  # taken = set(chosen): the given units as a set
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and getattr(n.value.func, "id", "") == "set" \
                and n.value.args and isinstance(n.value.args[0], ast.Name) and n.value.args[0].id in names:
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return names


def _is_matched_sampler(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A function that draws at random among candidates it filters against the units it was given or has already
    drawn: the shape of a matched random control."""
    draws = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in _DRAWS
                for c in ast.walk(fn))
    if not draws:
        return False
    own = _grown_or_given(fn)
    for n in ast.walk(fn):
        if isinstance(n, ast.Compare) and any(isinstance(o, ast.NotIn) for o in n.ops):
            for right in n.comparators:
                inner = right.args[0] if isinstance(right, ast.Call) and getattr(right.func, "id", "") == "set" \
                    and right.args else right
                if isinstance(inner, ast.Name) and inner.id in own:
                    return True
    return False


def _is_rate_record(node: ast.AST) -> bool:
    """A dict literal spelling a rate's fields itself (a count and a sample size beside a rate or interval)."""
    if not isinstance(node, ast.Dict):
        return False
    keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return "n" in keys and bool(keys & {"k", "refused"}) and bool(
        keys & {"rate", "refusal", "ci95", "lo", "hi", "low", "high", "wilson95", "ci_low", "ci_high"})


def _second_copies(files: dict[str, Path]) -> list[str]:
    out = []
    for rel, p in sorted(files.items()):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if rel != SAMPLER_HOME and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and _is_matched_sampler(node):
                out.append(f"{rel}:{node.lineno} {node.name} draws a matched random control: use "
                           "interp.evals.controls.matched_random")
            if rel != RATE_HOME and _is_rate_record(node):
                out.append(f"{rel}:{node.lineno} spells a rate record: use interp.evals.rates.Rate (or .columns())")
    return out


def test_one_matched_random_sampler_and_one_rate_record():
    """Found by shape, not by name: a second sampler of matched random controls or a second rate layout fails."""
    files = {str(p.relative_to(REPO)): p for p in MODULES.values()}
    bad = _second_copies(files)
    assert not bad, "second copies of the kit's jobs:\n" + "\n".join(bad)


def test_the_copy_check_can_fail(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import random\n\n"
                 "def pick(top, pool, rng):\n"
                 "    out = []\n"
                 "    for la, _ in top:\n"
                 "        out.append(rng.choice([p for p in pool if p[0] == la and p not in top]))\n"
                 "    return out\n\n"
                 "def row(k, n):\n"
                 "    return {'refused': k, 'n': n, 'rate': k / n}\n"
                 "def not_a_control(xs, rng):\n"
                 "    banned = {1, 2}\n"
                 "    return rng.choice([x for x in xs if x not in banned])\n")
    bad = _second_copies({"interp/studies/x/m.py": f})
    assert len(bad) == 2 and "matched_random" in bad[0] and "Rate" in bad[1]


def test_one_class_per_name_and_one_spelling_of_the_writers():
    """Two public classes of one name (three ``Direction``s once) and the residual writers' site tuple spelled
    outside ``interp.sites.WRITERS`` are second names for one job."""
    classes: dict[str, list[str]] = {}
    spelled = []
    for mod, p in MODULES.items():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                classes.setdefault(node.name, []).append(mod)
        if mod != "interp.sites":
            for node in ast.walk(tree):
                if isinstance(node, ast.Tuple) and [getattr(e, "value", None) for e in node.elts] == \
                        ["resid_pre", "attn_out", "mlp_out"]:
                    spelled.append(f"{mod}:{node.lineno}")
    twice = {k: v for k, v in classes.items() if len(v) > 1}
    assert not twice, f"public classes defined twice: {twice}"
    assert not spelled, f"the writers' sites spelled again (use interp.sites.WRITERS): {spelled}"
