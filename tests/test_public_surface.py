"""The public surface is deliberate: a short ``__all__`` per package, every name real and documented, and the
rest reachable from the submodules (``probes.folds.make_folds``, ``sae.quality.ce_loss_recovered``, ...)."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ("interp", "interp.evals", "probes", "sae", "steering", "interp.patching", "interp.tune", "interp.look")


def test_about_sixty_deliberate_names():
    total = sum(len(importlib.import_module(p).__all__) for p in PACKAGES)
    # 85 before the value types (interp.Prompts, interp.Runtime, steering.Sampling, steering.GenerationSession)
    # +6 for the exploratory looks (interp.look: logit_lens, train_tuned_lens, TunedLens, direct_logit_attribution,
    # head_scores, pattern_figure); +5 for the refusal frontier's edits (WeightedAblation, NormPreservingAblation,
    # WriterAblation) and their specs (save_edit, load_edit); their helpers live in steering.abliteration;
    # +6 for the configs that replaced threaded flags (probes: LogisticConfig, CVConfig; interp.patching:
    # MaskConfig, SearchConfig, GraphConfig; steering: SweepConfig)
    assert total <= 107, f"{total} public names; keep __all__ to the deliberate API (the rest lives in submodules)"


@pytest.mark.parametrize("pkg", PACKAGES)
def test_every_public_name_exists_and_says_what_it_is(pkg):
    mod = importlib.import_module(pkg)
    assert len(set(mod.__all__)) == len(mod.__all__)
    for name in mod.__all__:
        obj = getattr(mod, name)
        if callable(obj):
            assert (obj.__doc__ or "").strip(), f"{pkg}.{name} has no docstring"


def test_the_rest_stays_reachable_from_submodules():
    import probes
    import sae

    assert callable(probes.folds.make_folds) and callable(probes.compare.cosine_matrix)
    assert callable(sae.quality.ce_loss_recovered) and callable(sae.analysis.separating_latents)
    with pytest.raises(AttributeError):
        sae.no_such_thing  # noqa: B018


def test_every_package_is_installed_by_pyproject():
    """A package missing from ``[tool.setuptools.packages.find] include`` imports from the repository root (the
    tests) but not from an installed copy: every top-level package must match one of the globs."""
    import fnmatch

    import tomllib

    from .conftest import REPO
    from .test_architecture import TOP_LEVEL

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    missing = [p for p in TOP_LEVEL if not any(fnmatch.fnmatch(p, g) for g in include)]
    assert not missing, f"add {missing} to pyproject.toml's [tool.setuptools.packages.find] include"


def _packages() -> list[str]:
    from .conftest import REPO
    from .test_architecture import TOP_LEVEL

    out = []
    for top in TOP_LEVEL:
        for init in sorted((REPO / top).rglob("__init__.py")):
            rel = init.parent.relative_to(REPO)
            if "embedded" not in rel.parts and "data" not in rel.parts:
                out.append(".".join(rel.parts))
    return out


def _shadowed(pkg: str) -> list[str]:
    """Submodules of ``pkg`` that an attribute of the same name hides (a function bound over its own module)."""
    import pkgutil

    mod = importlib.import_module(pkg)
    bad = []
    for info in pkgutil.iter_modules(mod.__path__):
        sub = importlib.import_module(f"{pkg}.{info.name}")
        if getattr(mod, info.name, sub) is not sub:
            bad.append(f"{pkg}.{info.name}")
    return bad


def test_no_function_hides_its_module():
    """``steering.generation.prompt_states`` and the like are reachable: no package binds a function (or any other
    object) over a submodule of the same name, as ``steering.generate`` once hid ``steering/generate.py``."""
    pkgs = _packages()
    assert {"interp", "interp.studies.refusal", "steering", "sae", "probes", "interp.tune"} <= set(pkgs)
    bad = [s for p in pkgs for s in _shadowed(p)]
    assert not bad, f"attributes hiding their submodules: {bad}"
    import steering

    assert callable(steering.generate) and callable(steering.generation.prompt_states)


def test_the_shadow_check_can_fail(tmp_path, monkeypatch):
    pkg = tmp_path / "shadowpkg"
    pkg.mkdir()
    (pkg / "run.py").write_text("def run():\n    return 1\n")
    (pkg / "__init__.py").write_text("from shadowpkg.run import run\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _shadowed("shadowpkg") == ["shadowpkg.run"]
