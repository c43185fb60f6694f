"""Where the refusal decision diverges across languages: activation patching from source-language (English) runs
into other-language runs of the same requests.

For each other language, the harmful test prompts are paired with their English translations and aligned on the
chat template's post-instruction tokens (the same tokens in every language); each layer's ``resid_pre``,
``attn_out`` and ``mlp_out`` at those tokens is patched from the English run into the other-language run, one
(layer, site) at a time (:func:`patching.activation.sweep_layers`), and the first-token refusal score
(:func:`interp.studies.multilingual.neurons.refusal_ids`) is read. ``restored`` is the share of the English-minus-
language score gap the patch closes (1: the English decision, 0: none). The control patches from English
*harmless* prompts (same positions, same languages): a site whose restoration is the same from a harmless source
carries no request-specific refusal signal. Each pair is patched on its own, so the shares come with paired
bootstrap intervals over pairs (ratio of means, resampled together for the harmful source and the control), and
so does their difference ``excess`` = restored - control, the request-specific part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.chat import encode, format_prompts
from interp.evals.bootstrap import percentile_interval, resample_ids
from interp.models import Model
from interp.patching.activation import sweep_layers
from interp.patching.measures import refusal_score
from interp.patching.runs import make_pairs
from interp.sites import WRITERS
from interp.studies.kit.moved import moved
from interp.studies.multilingual.data import ParallelSafety
from interp.studies.multilingual.neurons import refusal_ids
from interp.values import Runtime, moved_keywords

if TYPE_CHECKING:
    import pandas as pd

SITES = WRITERS  # the residual writers (interp.sites.WRITERS)


@dataclass
class Pathways(Result):
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
    intervals: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # lang -> name -> [2, L, 3]
    n_boot: int = 0

    def component_excess(self) -> torch.Tensor:
        """``[L, 2]``: restored minus control of each layer's attention (column 0) and MLP (column 1) writer,
        averaged over languages (nan where a language's gap is 0)."""
        return torch.stack([self.restored[lang][:, 1:] - self.control[lang][:, 1:] for lang in self.langs]).mean(0)

    def top_components(self, n: int) -> list[tuple[int, str]]:
        """The ``n`` (layer, part) writers, part ``attn`` or ``mlp``, whose patch restores the most refusal beyond
        the harmless-source control (``restored - control``, averaged over languages), best first."""
        if not 1 <= n <= 2 * len(self.layers):
            raise ValueError(f"n must be within 1..{2 * len(self.layers)} (attn and mlp of {len(self.layers)} layers), "
                             f"got {n}")
        score = torch.nan_to_num(self.component_excess().float(), nan=float("-inf"))
        order = score.flatten().argsort(descending=True)[:n].tolist()
        return [(self.layers[i // 2], ("attn", "mlp")[i % 2]) for i in order]

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the three writers restoring most beyond the control, and per language the refusal
        gap and, per site, the layer restoring the largest share of it with that share and the control's."""
        def best(lang: str) -> dict[str, Any]:
            r, c = self.restored[lang].nan_to_num(float("-inf")), self.control[lang]
            out = {}
            for j, site in enumerate(SITES):
                i = int(r[:, j].argmax())
                out[site] = {"layer": self.layers[i], "restored": float(self.restored[lang][i, j]),
                             "control": float(c[i, j])}
            return out
        return {"top_components": [f"L{la} {p}" for la, p in self.top_components(min(3, 2 * len(self.layers)))],
                "gap": {la: self.source_score[la] - self.target_score[la] for la in self.langs},
                "best_by_site": {la: best(la) for la in self.langs}, "n_pairs": self.n_pairs,
                "n_positions": self.n_positions, "split": self.split}

    def to_frame(self) -> pd.DataFrame:
        """One row per language, layer and site: the shares, their difference and (when measured) 95% intervals."""
        import pandas as pd

        out = []
        for lang in self.langs:
            ci = self.intervals.get(lang, {})
            for i, layer in enumerate(self.layers):
                for j, site in enumerate(SITES):
                    r, c = float(self.restored[lang][i, j]), float(self.control[lang][i, j])
                    row = {"lang": lang, "layer": layer, "site": site, "restored": r, "control": c, "excess": r - c}
                    for name, v in ci.items():
                        row[f"{name}_lo"], row[f"{name}_hi"] = float(v[0, i, j]), float(v[1, i, j])
                    out.append({**row, "gap": self.source_score[lang] - self.target_score[lang]})
        return pd.DataFrame(out)

    def plot(self) -> Any:
        """Share of each language's refusal gap that patching restores, per site by layer, beside the harmless-
        source control (:func:`interp.viz.multilingual.patching_by_layer`)."""
        from interp.viz.multilingual import patching_by_layer

        return patching_by_layer(self.layers, SITES, {k: self.restored[k] for k in self.langs},
                                 {k: self.control[k] for k in self.langs})


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
    sw = sweep_layers(model, pairs, metric, sites=SITES, layers=layers,
                      runtime=Runtime(batch_size=batch_size, progress=False))
    return sw.values, float(sw.reference), float(sw.baseline)


def _per_pair(model: Model, clean: list[str], corrupted: list[str], metric, k: int, layers: list[int],
              batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_patched` one pair at a time: patched ``[n, L, 3]``, source ``[n]`` and target ``[n]`` metrics."""
    runs = [_patched(model, [a], [b], metric, k, layers, batch_size) for a, b in zip(clean, corrupted)]
    return (torch.stack([r[0] for r in runs]), torch.tensor([r[1] for r in runs]), torch.tensor([r[2] for r in runs]))


def _share(vals: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """Share of the mean source-minus-target gap the mean patched value closes, over the leading (pair) dim
    (``vals [..., n, L, 3]``, ``src``/``tgt [..., n]``); nan where the gap is 0."""
    t = tgt.mean(-1)[..., None, None]
    gap = src.mean(-1)[..., None, None] - t
    return (vals.mean(-3) - t) / torch.where(gap.abs() > 1e-9, gap, torch.full_like(gap, float("nan")))


@moved_keywords(moved())
def refusal_pathways(model: Model, data: ParallelSafety, layers: list[int] | None = None, split: str = "test",
                     n_boot: int = 1000, runtime: Runtime | None = None) -> Pathways:
    """The sweep of the module docstring for every language but the source, on the ``split`` prompts (``val`` when
    the found components are then trained and measured on ``test``), with ``n_boot`` paired bootstrap resamples of
    the pairs for the 95% intervals (0: none; seeded with ``runtime.seed``; default batch size 16)."""
    rt = runtime if runtime is not None else Runtime(batch_size=16, progress=False)
    batch_size, seed = rt.batch_size, rt.seed
    layers = list(layers) if layers is not None else list(range(model.n_layers))
    k = post_instruction_tokens(model)
    metric = refusal_score(refusal_ids(model))
    src_h, src_s = data.get("harmful", split, data.source), data.get("harmless", split, data.source)
    restored, control, s_score, t_score, intervals = {}, {}, {}, {}, {}
    langs = [lang for lang in data.langs if lang != data.source]
    n = min(len(src_h), len(src_s))
    gen = torch.Generator().manual_seed(seed)
    for lang in langs:
        tgt = data.get("harmful", split, lang)[:n]
        vals, src, target = _per_pair(model, src_h[:n], tgt, metric, k, layers, batch_size)
        ctrl, _, _ = _per_pair(model, src_s[:n], tgt, metric, k, layers, batch_size)
        s_score[lang], t_score[lang] = float(src.mean()), float(target.mean())
        # both shares on the harmful source's gap (nan when English scores no higher)
        restored[lang], control[lang] = _share(vals, src, target), _share(ctrl, src, target)
        if n_boot:
            idx = resample_ids(n, n_boot, gen)
            r, c = _share(vals[idx], src[idx], target[idx]), _share(ctrl[idx], src[idx], target[idx])
            intervals[lang] = {name: torch.stack(percentile_interval(v)) for name, v in
                               (("restored", r), ("control", c), ("excess", r - c))}
    return Pathways(langs, layers, restored, control, s_score, t_score, k, n, split, intervals, n_boot)


__all__ = ["Pathways", "SITES", "post_instruction_tokens", "refusal_pathways"]
