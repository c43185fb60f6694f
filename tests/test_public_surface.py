"""The public surface is deliberate: a short ``__all__`` per package, every name real and documented, and the
rest reachable from the submodules (``probes.folds.make_folds``, ``sae.quality.ce_loss_recovered``, ...)."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ("interp", "evals", "probes", "sae", "steering", "patching", "tune")


def test_about_sixty_deliberate_names():
    total = sum(len(importlib.import_module(p).__all__) for p in PACKAGES)
    assert total <= 85, f"{total} public names; keep __all__ to the deliberate API (the rest lives in submodules)"


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
    from .test_architecture import PACKAGES as FLOORS

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    missing = [p for p in FLOORS if not any(fnmatch.fnmatch(p, g) for g in include)]
    assert not missing, f"add {missing} to pyproject.toml's [tool.setuptools.packages.find] include"
