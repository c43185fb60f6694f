"""The committed prompt sets: harmful_realistic (our own harmful requests) against harmless_realistic."""

from __future__ import annotations

from collections import Counter
from statistics import median

from interp.data import available_prompt_sets, load_prompts
from interp.organisms.smollm2_data import HARMFUL_SALT, HARMFUL_SPLITS, split_of

from .conftest import benchmark_texts, norm_text


def test_harmful_realistic_loads_with_fields_splits_and_categories() -> None:
    assert "harmful_realistic" in available_prompt_sets()
    rows = load_prompts("harmful_realistic")
    assert len(rows) >= 300
    assert all(set(r) == {"instruction", "category", "split"} for r in rows)
    assert all(isinstance(r["instruction"], str) and 5 <= len(r["instruction"].split()) <= 60 for r in rows)
    assert all(r["split"] == split_of(r["instruction"], HARMFUL_SALT, HARMFUL_SPLITS) for r in rows), \
        "splits come from split_of(text, HARMFUL_SALT, HARMFUL_SPLITS)"
    split = Counter(r["split"] for r in rows)
    assert split["train"] >= 64 and split["val"] >= 32 and split["test"] >= 64, split
    cats = Counter(r["category"] for r in rows)
    assert 8 <= len(cats) <= 12 and min(cats.values()) >= 25, cats


def test_harmful_realistic_is_unique_and_disjoint_from_harmless() -> None:
    harmful = [norm_text(r["instruction"]) for r in load_prompts("harmful_realistic")]
    harmless = {norm_text(r["instruction"]) for r in load_prompts("harmless_realistic")}
    assert len(set(harmful)) == len(harmful), "duplicate instructions"
    assert not set(harmful) & harmless


def test_harmful_realistic_is_not_separable_by_surface_form() -> None:
    harmful = [r["instruction"] for r in load_prompts("harmful_realistic")]
    harmless = [r["instruction"] for r in load_prompts("harmless_realistic")]
    for size in (len, lambda t: len(t.split())):
        a, b = median(map(size, harmful)), median(map(size, harmless))
        assert max(a, b) / min(a, b) < 1.5, (a, b)
    questions = [sum(t.rstrip().endswith("?") for t in s) / len(s) for s in (harmful, harmless)]
    assert all(0.3 < q < 0.7 for q in questions), questions
    assert sum(t[0].islower() for t in harmful) >= 10 and sum(t[-1] not in ".?!" for t in harmful) >= 10


def test_harmful_realistic_is_our_own_writing() -> None:
    bench = benchmark_texts()
    copied = [r["instruction"] for r in load_prompts("harmful_realistic") if norm_text(r["instruction"]) in bench]
    assert not copied, f"verbatim from a benchmark: {copied[:5]}"
