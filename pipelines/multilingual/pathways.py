"""Where the refusal decision diverges across languages: activation patching from source-language (English) runs
into other-language runs of the same requests.

For each other language, the harmful test prompts are paired with their English translations and aligned on the
chat template's post-instruction tokens (the same tokens in every language); each layer's ``resid_pre``,
``attn_out`` and ``mlp_out`` at those tokens is patched from the English run into the other-language run, one
(layer, site) at a time (:func:`patching.activation.sweep_layers`), and the first-token refusal score
(:func:`pipelines.multilingual.neurons.refusal_ids`) is read. ``restored`` is the share of the English-minus-
language score gap the patch closes (1: the English decision, 0: none). The control patches from English
*harmless* prompts (same positions, same languages): a site whose restoration is the same from a harmless source
carries no request-specific refusal signal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from interp.chat import encode, format_prompts
from interp.models import Model
from patching.activation import sweep_layers
from patching.measures import refusal_score
from patching.runs import make_pairs
from pipelines.multilingual.data import ParallelSafety
from pipelines.multilingual.neurons import refusal_ids

SITES = ("resid_pre", "attn_out", "mlp_out")


@dataclass
class Pathways:
    """Per language: ``restored[lang] [L, 3]`` (sites :data:`SITES`) from English harmful sources, ``control[lang]``
    from English harmless sources, the English and the language's mean refusal scores (``source_score``,
    ``target_score``), and the number of aligned post-instruction tokens."""

    langs: list[str]
    layers: list[int]
    restored: dict[str, torch.Tensor]
    control: dict[str, torch.Tensor]
    source_score: dict[str, float]
    target_score: dict[str, float]
    n_positions: int
    n_pairs: int
    split: str = "test"

    def top_components(self, n: int) -> list[tuple[int, str]]:
        """The ``n`` (layer, part) writers, part ``attn`` or ``mlp``, whose patch restores the most refusal beyond
        the harmless-source control (``restored - control``, averaged over languages), best first."""
        if not 1 <= n <= 2 * len(self.layers):
            raise ValueError(f"n must be within 1..{2 * len(self.layers)} (attn and mlp of {len(self.layers)} layers), "
                             f"got {n}")
        score = torch.stack([self.restored[lang][:, 1:] - self.control[lang][:, 1:] for lang in self.langs]).mean(0)
        score = torch.nan_to_num(score.float(), nan=float("-inf"))
        order = score.flatten().argsort(descending=True)[:n].tolist()
        return [(self.layers[i // 2], ("attn", "mlp")[i % 2]) for i in order]

    def rows(self) -> list[dict]:
        return [{"lang": lang, "layer": layer, "site": site, "restored": float(self.restored[lang][i, j]),
                 "control": float(self.control[lang][i, j]), "gap": self.source_score[lang] - self.target_score[lang]}
                for lang in self.langs for i, layer in enumerate(self.layers) for j, site in enumerate(SITES)]


def post_instruction_tokens(model: Model) -> int:
    """How many tokens the chat template puts after the instruction (the same in every language)."""
    enc = encode(model, format_prompts(model, ["x"]), instructions=["x"])[0]
    n = len(enc.ids) - enc.post_start
    if n < 1:
        raise ValueError(f"{model.name}'s template leaves no token after the instruction; nothing to align across "
                         f"languages")
    return n


def _patched(model: Model, clean: list[str], corrupted: list[str], metric, k: int, layers: list[int],
             batch_size: int) -> tuple[torch.Tensor, float, float]:
    """Patched metric ``[L, 3]``, the clean (source) run's metric and the unpatched target run's."""
    pairs = make_pairs(model, clean, corrupted, align=[(-k + p, -k + p) for p in range(k)])
    sw = sweep_layers(model, pairs, metric, sites=SITES, layers=layers, batch_size=batch_size, progress=False)
    return sw.values, float(sw.reference), float(sw.baseline)


def refusal_pathways(model: Model, data: ParallelSafety, layers: list[int] | None = None, batch_size: int = 16,
                     split: str = "test") -> Pathways:
    """The sweep of the module docstring for every language but the source, on the ``split`` prompts (``val`` when
    the found components are then trained and measured on ``test``)."""
    layers = list(layers) if layers is not None else list(range(model.n_layers))
    k = post_instruction_tokens(model)
    metric = refusal_score(refusal_ids(model))
    src_h, src_s = data.get("harmful", split, data.source), data.get("harmless", split, data.source)
    restored, control, s_score, t_score = {}, {}, {}, {}
    langs = [lang for lang in data.langs if lang != data.source]
    n = min(len(src_h), len(src_s))
    for lang in langs:
        tgt = data.get("harmful", split, lang)[:n]
        vals, s_score[lang], t_score[lang] = _patched(model, src_h[:n], tgt, metric, k, layers, batch_size)
        ctrl, _, _ = _patched(model, src_s[:n], tgt, metric, k, layers, batch_size)
        gap = s_score[lang] - t_score[lang]   # both on the harmful source's gap (nan when English scores no higher)
        scale = gap if abs(gap) > 1e-9 else float("nan")
        restored[lang], control[lang] = (vals - t_score[lang]) / scale, (ctrl - t_score[lang]) / scale
    return Pathways(langs, layers, restored, control, s_score, t_score, k, n, split)


__all__ = ["Pathways", "SITES", "post_instruction_tokens", "refusal_pathways"]
