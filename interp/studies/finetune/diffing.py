"""What did a fine-tune change? SAE model diffing: one SAE (trained on the base model's activations, or yours)
read in both models on the same prompts, latents ranked by the change, their top contexts, and steering the top
latents both ways with random-latent controls. The SAE is trained without each prompt's first token (an attention
sink whose activations can be 100x the others', e.g. in SmolLM2) and the edits leave that token alone.

The causal check: in the tuned model, ablating the latents the fine-tune amplified most (error term kept) should
remove the tuned behaviour (refusal on held-out harmful prompts) more than ablating as many random latents that
fire as often; in the base model, adding their decoder vectors scaled by the measured change should bring the
behaviour in (refusal on held-out harmless prompts) more than random latents' vectors of the same norm.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.capturing import capture
from interp.evals.controls import matched_random
from interp.evals.judge import Judge
from interp.evals.rates import rate_cells
from interp.models import Model
from interp.positions import without_first
from interp.studies.kit.moved import moved
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.runs import refusal_rate
from interp.values import Runtime, moved_keywords
from sae.analysis import LatentDiff, diff_latents
from sae.contexts import top_contexts
from sae.edits import LatentAblation, LatentSteering
from sae.model import SAE
from sae.quality import fvu
from sae.runner import site_tokens
from sae.trainer import train_sae

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class DiffStudy(Result):
    """``diff``: the latent ranking (by increase) on the harmful val prompts' last token; ``contexts``: the top
    latents' top contexts in the tuned model; ``rates``: one row per condition (refusal rate, ``k``, ``n``,
    ``ci95``); ``sae``: the SAE used; ``meta``: site, sizes, the SAE's fit (``fit``: FVU and L0 at the harmful
    val prompts' last token, in the base and in the tuned model)."""

    diff: LatentDiff
    contexts: dict[int, list[str]]
    rates: list[dict[str, Any]]
    sae: SAE
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def top(self) -> list[int]:
        return self.diff.ranking.indices[: self.meta["n_steer"]].tolist()

    def summary(self) -> dict[str, Any]:
        """Headline numbers: refusal (rate, k, n, 95% interval) per condition and split, the steered latents with
        their increase, the site and the SAE's fit."""
        n = self.meta["n_steer"]
        return {"rates": rate_cells(self.rates, ("condition", "split")), "top": self.top,
                "top_scores": [float(x) for x in self.diff.ranking.scores[:n]], "site": self.meta.get("site"),
                "layer": self.meta.get("layer"), "fit": self.meta.get("fit")}

    def to_frame(self, which: str = "rates") -> pd.DataFrame:
        """``which='rates'`` (the steering conditions) or ``'latents'`` (the ranking with top contexts)."""
        import pandas as pd

        if which == "rates":
            return pd.DataFrame(self.rates)
        if which != "latents":
            raise ValueError(f"which must be 'rates' or 'latents', got {which!r}")
        frame = self.diff.to_frame().dropna(subset=["rank"]).sort_values("rank").reset_index(drop=True)
        frame["context"] = [" | ".join(self.contexts.get(int(i), [])[:2]) for i in frame["latent"]]
        return frame

    def plot(self, title: str | None = None) -> Any:
        """Refusal under each steering condition with its 95% interval."""
        from interp.viz.refusal import refusal_rates

        names = [f"{r['condition']} ({r['split']})" for r in self.rates]
        fig = refusal_rates(dict(zip(names, (r["rate"] for r in self.rates))),
                            dict(zip(names, (r["ci95"] for r in self.rates))))
        return fig.update_layout(title=title or "Refusal when steering the fine-tune's top SAE latents")


def train_base_sae(base: Model, site: str, prompts: list[str], d_sae: int, k: int, seed: int) -> SAE:
    xs = [x[without_first(b.attention_mask)] for x, b in site_tokens(base, site, prompts, batch_size=16)]
    x = torch.cat(xs)
    steps_tokens = max(len(x) * 8, 4096)
    res = train_sae(x, arch="topk", d_sae=d_sae, k=k, total_tokens=steps_tokens, batch_size=min(1024, len(x)),
                    site=site, seed=seed, progress=False)
    return res.sae


def _last(model: Model, site: str, prompts: list[str]) -> torch.Tensor:
    a = capture(model, prompts, sites=[site], positions="last", runtime=Runtime(progress=False))
    return a.tensor[:, 0].reshape(len(prompts), -1)


def _fit(sae: SAE, acts_base: torch.Tensor, acts_tuned: torch.Tensor) -> dict[str, float]:
    """The SAE's FVU and mean L0 on the harmful val prompts' last token, in the base (where it was trained) and in
    the tuned model (how well it still reads the fine-tune's activations)."""
    out: dict[str, float] = {}
    with torch.no_grad():
        for name, x in (("base", acts_base), ("tuned", acts_tuned)):
            x = x.to(sae.W_dec.device, sae.W_dec.dtype)
            z = sae.encode(x)
            out[f"fvu_{name}"] = fvu(x, sae.decode(z))
            out[f"l0_{name}"] = float((z != 0).float().sum(-1).mean())
    return out


def _random_latents(sae: SAE, top: list[int], freq: torch.Tensor, rng: random.Random) -> list[int]:
    """As many latents as ``top``, none of them in it, each drawn among the latents closest in firing frequency."""
    order = freq.argsort().tolist()
    pos = {lat: i for i, lat in enumerate(order)}
    return matched_random(top, lambda lat: order[max(0, pos[lat] - 20):pos[lat] + 21], rng, what="latent")


def _gen_rate(model: Model, prompts: list[str], edits: list, max_new_tokens: int, judge: Judge | None) -> dict:
    return refusal_rate(model, prompts, judge, max_new_tokens, edits)  # the kit's generate-and-judge


def _steer_rates(base: Model, tuned: Model, sae: SAE, d: LatentDiff, top: list[int], data: RefusalData,
                 c: DiffConfig, seed: int, judge: Judge | None) -> list[dict[str, Any]]:
    n_random, max_new_tokens, strengths = c.n_random, c.max_new_tokens, c.strengths
    rng = random.Random(seed)
    harm, safe = data.harmful["test"].instructions, data.harmless["test"].instructions
    delta = d.delta[top].clamp_min(0)
    draws = [_random_latents(sae, top, d.freq_tuned, rng) for _ in range(n_random)]
    rows = [{"condition": "tuned", "split": "harmful", **_gen_rate(tuned, harm, [], max_new_tokens, judge)},
            {"condition": "tuned, top latents ablated", "split": "harmful", "latents": top,
             **_gen_rate(tuned, harm, [LatentAblation(sae, top, sinks=c.sinks)], max_new_tokens, judge)}]
    rows += [{"condition": f"tuned, random latents ablated (draw {i})", "split": "harmful", "latents": rand,
              **_gen_rate(tuned, harm, [LatentAblation(sae, rand, sinks=c.sinks)], max_new_tokens, judge)}
             for i, rand in enumerate(draws)]
    rows.append({"condition": "base", "split": "harmless", **_gen_rate(base, safe, [], max_new_tokens, judge)})
    norm = float(LatentSteering(sae, top, delta.tolist()).vector().norm())
    for s in strengths:
        add = LatentSteering(sae, top, (s * delta).tolist(), sinks=c.sinks)
        rows.append({"condition": f"base, top latents added x{s:g}", "split": "harmless", "latents": top,
                     "strength": s, **_gen_rate(base, safe, [add], max_new_tokens, judge)})
        for i, rand in enumerate(draws):
            scale = s * norm / max(float(LatentSteering(sae, rand, 1.0).vector().norm()), 1e-12)
            rows.append({"condition": f"base, random latents added x{s:g} (draw {i})", "split": "harmless",
                         "latents": rand, "strength": s,
                         **_gen_rate(base, safe, [LatentSteering(sae, rand, scale, sinks=c.sinks)], max_new_tokens,
                                     judge)})
    return rows


@dataclass(frozen=True)
class DiffConfig:
    """The study's knobs: the SAE trained when none is given (``d_sae`` latents, TopK ``k``), the ``top`` latents
    ranked, the ``n_steer`` steered with ``n_random`` frequency-matched random draws, ``max_new_tokens`` of the
    judged generations, the added latents' ``strengths`` and whether the edits leave attention sinks out
    (``sinks="exclude"``, the house default) or act on them (``"keep"``)."""

    d_sae: int = 2048
    k: int = 32
    n_steer: int = 10
    top: int = 20
    n_random: int = 3
    max_new_tokens: int = 24
    strengths: tuple[float, ...] = (1.0, 8.0, 32.0)
    sinks: str = "exclude"

    def __post_init__(self) -> None:
        if self.sinks not in ("exclude", "keep"):
            raise ValueError(f"sinks must be 'exclude' (leave attention sinks out of the edits) or 'keep', "
                             f"got {self.sinks!r}")
        if min(self.d_sae, self.k, self.n_steer, self.top, self.max_new_tokens) < 1 or self.n_random < 0:
            raise ValueError("d_sae, k, n_steer, top and max_new_tokens must be >= 1 and n_random >= 0")
        object.__setattr__(self, "strengths", tuple(float(x) for x in self.strengths))


_MOVED = {**moved(config="DiffConfig", knobs=("d_sae", "k", "n_steer", "top", "n_random", "max_new_tokens",
                                                "strengths")),
          "sae_prompts": "sae=[prompts] (the prompts to train the SAE on)",
          "skip_sink": 'config=DiffConfig(sinks="exclude" | "keep")'}


@moved_keywords(_MOVED)
def diff_study(base: Model, tuned: Model, data: RefusalData, layer: int, sae: SAE | Sequence[str] | None = None,
               judge: Judge | None = None, config: DiffConfig | None = None,
               runtime: Runtime | None = None) -> DiffStudy:
    """Train (or take) an SAE on the base at ``resid_post.{layer}``, rank latents by the fine-tune's change at the
    harmful val prompts' last token, and steer the ``config.n_steer`` most amplified both ways (module docstring):
    ablated in the tuned model, added to the base with their measured increases times each of ``config.strengths``
    (random latents: the same norm).

    ``sae``: the SAE to read, or the base prompts to train one on (default: both classes' train prompts).
    ``runtime.seed``: the SAE's training and the random draws."""
    c = config if config is not None else DiffConfig()
    seed = (runtime or Runtime()).seed
    sae_prompts = sae if isinstance(sae, (list, tuple)) else None
    sae = None if sae_prompts is not None else sae
    site = f"blocks.{layer}.hook_resid_post"
    if not 0 <= layer < base.n_layers:
        raise ValueError(f"layer {layer} is out of range; {base.name} has layers 0..{base.n_layers - 1}")
    if sae is None:
        sae_prompts = sae_prompts or (data.harmful["train"].instructions + data.harmless["train"].instructions)
        sae = train_base_sae(base, site, list(sae_prompts), c.d_sae, c.k, seed)
    elif sae.d_in != base.d_model:
        raise ValueError(f"the SAE reads width {sae.d_in} but {base.name} has width {base.d_model}; train one on "
                         f"this model (leave sae=None)")
    val = data.harmful["val"].instructions
    acts_base, acts_tuned = _last(base, site, val), _last(tuned, site, val)
    d = diff_latents(sae, acts_base, acts_tuned, top=c.top, site=site)
    chosen = d.ranking.indices[:c.n_steer].tolist()
    probe = val + data.harmless["val"].instructions
    contexts = {int(i): ["".join(c.tokens) for c in top_contexts(tuned, sae, int(i), probe, top=3, site=site)]
                for i in d.ranking.indices.tolist()}
    rates = _steer_rates(base, tuned, sae, d, chosen, data, c, seed, judge)
    return DiffStudy(d, contexts, rates, sae, meta={"site": site, "layer": layer, "n_steer": c.n_steer,
                                                    "seed": seed, "sizes": data.sizes(),
                                                    "fit": _fit(sae, acts_base, acts_tuned)})


__all__ = ["DiffConfig", "DiffStudy", "diff_study"]
