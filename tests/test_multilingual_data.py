"""The committed parallel multilingual safety set (``multilingual_safety``), written by ``interp.organisms.multilingual_data``."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from statistics import median

import pytest

from interp.data import available_prompt_sets, load_prompts
from interp.organisms import multilingual_data as md

from .conftest import benchmark_texts, norm_text

MINIMA = {"harmful": 120, "harmless": 120, "borderline": 60}
TARGET = {"train": 0.60, "val": 0.15, "test": 0.25}
FIELDS = {"id", "kind", "lang", "instruction", "category", "split"}
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return load_prompts(md.NAME)


@pytest.fixture(scope="module")
def by_id(rows) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        out[r["id"]].append(r)
    return out


def test_committed_file_is_what_the_generator_writes(tmp_path, capsys) -> None:
    out = tmp_path / "sub" / f"{md.NAME}.jsonl"
    md.main(["--out", str(out)])
    assert "wrote" in capsys.readouterr().out
    assert out.read_bytes() == md.OUT.read_bytes(), \
        "multilingual_safety.jsonl is stale; run python -m interp.organisms.multilingual_data"
    assert [p.name for p in out.parent.iterdir()] == [out.name], "the temp file was left behind"


def test_loads_through_interp_data_with_fields(rows) -> None:
    assert md.NAME in available_prompt_sets()
    assert rows == md.build_rows()
    assert all(set(r) == FIELDS and all(isinstance(v, str) for v in r.values()) for r in rows)
    assert {r["lang"] for r in rows} == set(md.LANGS) and {r["kind"] for r in rows} == set(md.KINDS)
    assert {r["split"] for r in rows} == set(TARGET)


def test_counts_per_kind_and_language(rows) -> None:
    n = Counter((r["kind"], r["lang"]) for r in rows)
    for kind, least in MINIMA.items():
        for lang in md.LANGS:
            assert n[kind, lang] >= least, (kind, lang, n[kind, lang])
    assert len(rows) >= 5 * sum(MINIMA.values())


def test_every_id_is_parallel_across_the_five_languages(by_id) -> None:
    for pid, group in by_id.items():
        assert sorted(r["lang"] for r in group) == sorted(md.LANGS), pid
        for key in ("kind", "category", "split"):
            assert len({r[key] for r in group}) == 1, (pid, key)
        kind = group[0]["kind"]
        assert re.fullmatch(rf"{kind}-\d{{3}}", pid), pid
        assert group[0]["category"] in md.CATEGORIES[kind], pid
        en = next(r["instruction"] for r in group if r["lang"] == "en")
        assert all(r["instruction"] != en for r in group if r["lang"] != "en"), f"{pid} is not translated"


def test_splits_are_disjoint_by_id_and_balanced_within_each_kind(by_id) -> None:
    split = {pid: group[0]["split"] for pid, group in by_id.items()}  # one split per id (test above)
    for kind in md.KINDS:
        ids = [pid for pid in split if pid.startswith(f"{kind}-")]
        share = Counter(split[pid] for pid in ids)
        for name, want in TARGET.items():
            assert abs(share[name] / len(ids) - want) <= 0.05, (kind, name, share)
        assert md.assign_splits(ids) == {pid: split[pid] for pid in ids}, "splits follow the stated rule"


def test_no_duplicate_instruction_within_a_language(rows) -> None:
    for lang in md.LANGS:
        texts = [r["instruction"] for r in rows if r["lang"] == lang]
        dup = [t for t, c in Counter(texts).items() if c > 1]
        assert not dup, (lang, dup[:3])
    en = [norm_text(r["instruction"]) for r in rows if r["lang"] == "en"]
    assert len(set(en)) == len(en), "English near-duplicates (up to case and punctuation)"


def test_scripts_and_punctuation_fit_each_language(rows) -> None:
    for r in rows:
        text, lang = r["instruction"], r["lang"]
        assert text == text.strip() and "\n" not in text, r["id"]
        if lang == "zh":
            assert CJK.search(text), r["id"]
            assert "?" not in text and "," not in text, f"{r['id']}: ASCII punctuation in Chinese"
        else:
            assert not CJK.search(text), (r["id"], lang)
        if lang == "es" and "?" in text:
            assert "¿" in text, f"{r['id']}: Spanish question without ¿"
        if lang == "fr":
            assert not re.search(r"\w[?!]", text), f"{r['id']}: French ? or ! needs a space before it"
    for lang, marks in (("fr", "éèàçô"), ("de", "äöüß"), ("es", "áéíóñ")):
        texts = [r["instruction"] for r in rows if r["lang"] == lang]
        assert sum(any(c in t for c in marks) for t in texts) > len(texts) / 4, f"{lang}: diacritics missing?"


def test_harmful_and_harmless_look_alike_on_the_surface(rows) -> None:
    """Length and question rate must not give the kind away (in every language); harmful is 6-40 words."""
    for lang in md.LANGS:
        texts = {k: [r["instruction"] for r in rows if r["lang"] == lang and r["kind"] == k] for k in md.KINDS}
        a, b = median(map(len, texts["harmful"])), median(map(len, texts["harmless"]))
        assert max(a, b) / min(a, b) < 1.5, (lang, a, b)
        q = [sum(t.endswith(("?", "？")) for t in texts[k]) / len(texts[k]) for k in ("harmful", "harmless")]
        assert all(0.3 < x < 0.75 for x in q), (lang, q)
    harmful_en = [r["instruction"] for r in rows if r["lang"] == "en" and r["kind"] == "harmful"]
    assert all(6 <= len(t.split()) <= 40 for t in harmful_en)
    assert sum(t[0].islower() for t in harmful_en) >= 5, "some casual lowercase requests"


def _strings(row) -> list[str]:
    """Every text in a row of any committed set (the study sets nest their texts: syntax forms, entrainment contexts)."""
    if isinstance(row, str):
        return [row]
    if isinstance(row, dict):
        return [t for k, v in row.items() if k not in ("id", "category", "lang", "kind") for t in _strings(v)]
    if isinstance(row, list):
        return [t for v in row for t in _strings(v)]
    return []


def test_english_is_not_copied_from_other_committed_sets(rows) -> None:
    others = {norm_text(t) for name in available_prompt_sets() if name != md.NAME
              for r in load_prompts(name) for t in _strings(r)}
    copied = [r["instruction"] for r in rows if r["lang"] == "en" and norm_text(r["instruction"]) in others]
    assert not copied, copied[:5]


def test_english_is_not_copied_from_the_refusal_benchmarks(rows) -> None:
    bench = benchmark_texts()
    copied = [r["instruction"] for r in rows if r["lang"] == "en" and norm_text(r["instruction"]) in bench]
    assert not copied, copied[:5]


def test_generator_rejects_malformed_entries(monkeypatch) -> None:
    real = md.entries
    cases = [
        (lambda kind: real(kind) + real(kind)[:1] if kind == "harmless" else real(kind), "duplicate harmless"),
        (lambda kind: [(1, "weapons", "a", "b", "c", "d")] if kind == "harmful" else [], "fields"),
        (lambda kind: [(1, "cooking", "a", "b", "c", "d", "中")] if kind == "harmful" else [], "category"),
        (lambda kind: [(1, "weapons", "a ", "b", "c", "d", "中")] if kind == "harmful" else [], "whitespace"),
    ]
    for entries, message in cases:
        monkeypatch.setattr(md, "entries", entries)
        with pytest.raises(ValueError, match=message):
            md.build_rows()
