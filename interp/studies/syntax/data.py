"""Our syntactic-refusal prompt set: each harmful request in four forms of nearly the same tokens.

``interp/data/prompts/syntax_forms.jsonl`` (written by us): per row the bare ``request`` (a verb phrase) and the
``imperative`` ("Tell me how to X."), ``past`` ("How did people X in the past?"), ``statement`` ("I wonder how
someone would X.") and ``others`` ("How do criminals X?") forms. The same words carry the request in every form,
so what differs between forms is the syntax around it.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMS = ("imperative", "past", "statement", "others")
SET_NAME = "syntax_forms"


@dataclass(frozen=True)
class SyntaxForms:
    """``texts[form]``: one prompt per request, in request order; ``requests``: the bare requests; ``ids``."""

    texts: dict[str, list[str]]
    requests: list[str]
    ids: list[str]

    @property
    def forms(self) -> list[str]:
        return list(self.texts)

    def __len__(self) -> int:
        return len(self.requests)

    def get(self, form: str, n: int | None = None) -> list[str]:
        """The first ``n`` (default all) prompts of ``form``."""
        if form not in self.texts:
            raise ValueError(f"no form {form!r}; the forms are {self.forms}")
        return self.texts[form][:n]


def load_syntax_forms(n: int | None = None) -> SyntaxForms:
    """The committed set (its first ``n`` requests, default all)."""
    from interp.data import load_prompts

    rows = load_prompts(SET_NAME)[:n]
    missing = [f for f in FORMS if any(not r.get(f) for r in rows)]
    if missing:
        raise ValueError(f"{SET_NAME}.jsonl has rows without the form(s) {missing}; every row needs {list(FORMS)}")
    return SyntaxForms({f: [r[f] for r in rows] for f in FORMS}, [r["request"] for r in rows], [r["id"] for r in rows])


__all__ = ["FORMS", "SET_NAME", "SyntaxForms", "load_syntax_forms"]
