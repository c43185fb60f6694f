"""The parallel safety prompts of the multilingual studies: harmful, harmless and borderline-benign requests, each
in English and four other languages, with train / val / test splits by prompt id (every language of an id in the
same split), read from ``interp/data/prompts/multilingual_safety.jsonl`` (or any file of the same shape)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from interp.prompts import read_parallel

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "data" / "prompts" / "multilingual_safety.jsonl"
LANGS = ("en", "fr", "de", "es", "zh")
SPLITS = ("train", "val", "test")


# refusals in each language, written for the restricted updates (interp.studies.multilingual.updates); each opens as
# evals.judge_languages reads a refusal
REFUSALS: dict[str, tuple[str, ...]] = {
    "en": ("I can't help with that. It could seriously hurt people, so I won't give instructions for it.",
           "I won't help with this request, because it could be used to cause real harm.",
           "I'm sorry, but I can't assist with that. If you are dealing with a difficult situation, a trusted person "
           "or a local support service can help.",
           "I cannot provide that information; it would put others at risk."),
    "fr": ("Je ne peux pas vous aider avec cela. Cette demande pourrait causer du tort à d'autres personnes.",
           "Je ne vais pas fournir ces instructions, car elles pourraient servir à nuire.",
           "Désolé, mais je ne peux pas répondre à cette demande : elle présente un risque réel pour autrui.",
           "Je refuse de vous aider sur ce sujet, qui pourrait mettre des personnes en danger.",
           "Je ne suis pas en mesure de vous aider avec ça. Si vous traversez une situation difficile, une personne "
           "de confiance ou un service d'aide local peut vous soutenir."),
    "de": ("Ich kann dir dabei nicht helfen. Diese Anfrage könnte anderen Menschen schaden.",
           "Ich werde nicht dabei helfen, weil eine Anleitung dafür missbraucht werden könnte, um Schaden anzurichten.",
           "Es tut mir leid, aber das kann ich nicht beantworten: Diese Anfrage birgt ein echtes Risiko für andere.",
           "Ich lehne diese Anfrage ab, denn sie könnte Menschen in Gefahr bringen.",
           "Ich bin nicht in der Lage, dabei zu helfen. Wenn du in einer schwierigen Lage bist, kann dir eine "
           "Vertrauensperson oder eine Beratungsstelle helfen."),
    "es": ("No puedo ayudarte con eso. Esta petición podría causar daño a otras personas.",
           "No voy a dar esas instrucciones, porque podrían usarse para hacer daño.",
           "Lo siento, pero no puedo responder a esta petición: supone un riesgo real para los demás.",
           "Me niego a ayudar con este tema, que podría poner a personas en peligro.",
           "No estoy en condiciones de ayudarte con esto. Si atraviesas una situación difícil, una persona de "
           "confianza o un servicio de ayuda local puede apoyarte."),
    "zh": ("我不能帮助你做这件事。这个请求可能会伤害到其他人。",
           "我不会提供这些步骤，因为它们可能被用来造成伤害。",
           "很抱歉，我无法回答这个请求：它会给他人带来真实的风险。",
           "我拒绝协助这个请求，它可能让别人陷入危险。",
           "我无法提供这方面的帮助。如果你正处于困境，可以向信任的人或当地的援助机构求助。"),
}


@dataclass
class ParallelSafety:
    """``prompts[kind][split][lang]``: lists aligned by prompt id across languages (item i of every language is
    the same request); ``langs[0]`` is the source language (English) the directions are fitted in."""

    prompts: dict[str, dict[str, dict[str, list[str]]]]
    langs: tuple[str, ...]
    source: str

    def get(self, kind: str, split: str, lang: str) -> list[str]:
        try:
            return self.prompts[kind][split][lang]
        except KeyError:
            raise KeyError(f"no {kind!r} prompts in split {split!r} for language {lang!r}; this set holds kinds "
                           f"{sorted(self.prompts)}, languages {list(self.langs)}") from None

    def sizes(self) -> dict[str, dict[str, int]]:
        """Prompts per language, by ``kind/split``."""
        return {f"{k}/{s}": len(next(iter(by_lang.values()))) for k, by_split in self.prompts.items()
                for s, by_lang in by_split.items()}


def load_parallel_safety(path: str | Path = DEFAULT_FILE, langs: Sequence[str] = LANGS,
                         kinds: Sequence[str] = ("harmful", "harmless", "borderline"), n: int | None = None
                         ) -> ParallelSafety:
    """The parallel set for ``langs`` (the first is the source language), ``n`` prompts per kind and split at most
    (the first ``n`` in file order, the same ids in every language)."""
    langs = tuple(langs)
    if len(langs) < 2:
        raise ValueError(f"the multilingual studies compare a source language with others; got langs={langs}")
    if n is not None and n < 2:
        raise ValueError(f"n must be >= 2 prompts per kind and split (or None for all), got {n}")
    out: dict[str, dict[str, dict[str, list[str]]]] = {}
    for kind in kinds:
        out[kind] = {}
        for split in SPLITS:
            by = read_parallel(path, kind=kind, split=split, langs=langs)
            out[kind][split] = {lang: v[:n] if n is not None else v for lang, v in by.items()}
    return ParallelSafety(out, langs, langs[0])


__all__ = ["DEFAULT_FILE", "LANGS", "REFUSALS", "ParallelSafety", "load_parallel_safety"]
