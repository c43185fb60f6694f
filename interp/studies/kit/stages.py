"""The refusal job's first four stages, each a function returning a dataclass (Arditi et al. 2024).

``find_refusal_tokens`` (the model's own refusals) -> ``find_candidates`` (difference of means at every
layer x post-instruction position) -> ``score_candidates`` (bypass, induce, KL; batched) ->
``select_direction`` (the paper's filters). Evaluation and subspaces are in :mod:`.evaluation`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

import steering
from interp.bundle import Result
from interp.capturing import capture
from interp.chat import format_prompts
from interp.evals.judge import Judge, judge_many
from interp.evals.logits import kl_div, refusal_score
from interp.evals.rates import Rate, fisher_greater, rate
from interp.forward import prepare
from interp.models import Model
from interp.studies.kit import stage_views as views
from interp.studies.kit.config import SelectionConfig
from interp.studies.kit.moved import moved
from interp.studies.kit.prompt_sets import RefusalData
from interp.studies.kit.scoring import prompt_logits, refusal_tokens, score_rows
from interp.values import Runtime, moved_keywords
from probes.directions import diff_of_means, random_directions
from probes.objects import Direction

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class RefusalTokens(Result):
    """First tokens of the model's own refusals on the training prompts, how often it refused there, and the
    baseline generations and verdicts themselves (the diagnosis reads them; ``generations.jsonl`` keeps them).

    ``tokens`` is empty when fewer than ``min_refusals`` harmful train prompts were refused."""

    tokens: list[int]
    strings: list[str]
    train_refusal_harmful: float
    train_refusal_harmless: float
    harmful_texts: list[str] = field(default_factory=list)
    harmless_texts: list[str] = field(default_factory=list)
    harmful_refused: list[bool] = field(default_factory=list)
    harmless_refused: list[bool] = field(default_factory=list)
    min_refusals: int = 1

    def rates(self) -> dict[str, Rate]:
        """The judged refusal rate on the harmful and the harmless train prompts (empty when not kept)."""
        return {f"{w}/train": rate(f) for w, f in (("harmful", self.harmful_refused), ("harmless", self.harmless_refused))
                if f}

    def summary(self) -> dict[str, Any]:
        """The refusal tokens and the train refusal rates (with counts and intervals when the verdicts are kept)."""
        return views.tokens_summary(self)

    def to_frame(self) -> pd.DataFrame:
        """One row per judged train prompt: ``set`` (harmful / harmless), the model's ``response``, ``refused``."""
        return views.tokens_frame(self)

    def plot(self) -> Any:
        """Refusal rate on the harmful and harmless train prompts, with 95% Wilson intervals when kept."""
        return views.tokens_figure(self)


@dataclass
class Candidates(Result):
    """Difference-of-means candidates ``raw [layers, P, d]`` and the train activations they came from."""

    raw: Float[torch.Tensor, "layers P d"]
    harmful_acts: Float[torch.Tensor, "n layers P d"]
    harmless_acts: Float[torch.Tensor, "m layers P d"]
    layers: list[int]
    sites: list[str]
    pos_tokens: list[str]
    fitted_on: list[Any]
    data_hash: str

    @property
    def n_positions(self) -> int:
        """Number of post-instruction positions ``P`` (candidate position ``p`` is ``p - P`` from the end)."""
        return self.raw.shape[1]

    def separation(self) -> Float[torch.Tensor, "layers P"]:
        """Cohen's d of the harmful over the harmless train prompts' projections on each unit candidate."""
        return views.separation(self.raw, self.harmful_acts, self.harmless_acts)

    def summary(self) -> dict[str, Any]:
        """The grid's size, the prompts it came from and the best-separating candidate."""
        return views.candidates_summary(self)

    def to_frame(self) -> pd.DataFrame:
        """One row per candidate (layer x position): its ``norm`` and ``separation`` (:meth:`separation`)."""
        return views.grid_frame({"norm": self.raw.float().norm(dim=-1), "separation": self.separation()},
                                self.layers, self.pos_tokens)

    def plot(self, position: int = -1) -> Any:
        """Cosine similarity of the candidates across layers at one ``position`` (-P..-1, from the end)."""
        return views.cosine_figure(self, position)


@dataclass
class Scores(Result):
    """Per candidate ``[layers, P]``: refusal score under ablation (harmful), under addition (harmless), KL; and
    ``kl_random``: the KL of seeded random unit directions ablated the same way on the same prompts, the level
    the KL filter is read against (a model whose random ablations already cost about the threshold has no
    room under it)."""

    bypass: Float[torch.Tensor, "layers P"]
    induce: Float[torch.Tensor, "layers P"]
    kl: Float[torch.Tensor, "layers P"]
    baseline_harmful: float
    baseline_harmless: float
    kl_random: list[float] = field(default_factory=list)

    @property
    def n_scored(self) -> int:
        """How many candidates were scored exactly (the others are NaN: not scored by the estimate search; a
        candidate whose KL alone was scored, see ``score_candidates(kl_gate=)``, counts)."""
        return int((~self.kl.isnan()).sum())

    @property
    def n_gated(self) -> int:
        """How many candidates have their KL scored but not their bypass and induce (``score_candidates(kl_gate=)``
        skipped them: none passed the KL filter)."""
        return int((~self.kl.isnan() & self.bypass.isnan()).sum())

    def summary(self) -> dict[str, Any]:
        """Counts, baselines, the best score of each map over the candidates scored, and the random KL level."""
        return views.scores_summary(self)

    def to_frame(self, cand: Candidates | None = None, selection: Selection | None = None) -> pd.DataFrame:
        """One row per candidate (layer x position): bypass, induce, KL (NaN: not scored); ``cand`` labels the layers
        and position tokens (default: row indices), ``selection`` marks the chosen one."""
        return views.grid_frame({"bypass": self.bypass, "induce": self.induce, "kl": self.kl}, *views.labels(cand),
                                views.chosen(selection))

    def plot(self, cand: Candidates | None = None, selection: Selection | None = None) -> Any:
        """The three candidate maps, white at each filter's threshold when ``selection`` gives them (else the median)."""
        return views.scores_figure(self, cand, selection)


@dataclass
class Selection(Result):
    """The chosen candidate (``layer_index``/``position_index`` into ``Candidates``) or none, with filter counts."""

    found: bool
    filters: dict[str, float]
    passing: dict[str, int]
    baseline_refusal_score: dict[str, float]
    layer_index: int = -1
    position_index: int = -1
    layer: int = -1
    position: int = 0
    position_token: str = ""
    bypass_score: float = math.nan
    induce_score: float = math.nan
    kl: float = math.nan
    kl_rejected: list[dict[str, Any]] = field(default_factory=list)

    def direction(self, cand: Candidates, model_id: str) -> Direction:
        """The selected candidate as a :class:`probes.Direction` with provenance."""
        if not self.found:
            raise ValueError("no candidate passed the filters, so there is no direction; loosen the thresholds")
        li, pi = self.layer_index, self.position_index
        return Direction.from_vectors(cand.raw[li, pi][None], [cand.sites[li]], method="mean_diff", model_id=model_id,
                                      data_hash=cand.data_hash, fitted_on=cand.fitted_on,
                                      meta={"position": self.position, "position_token": self.position_token,
                                            "layer": self.layer, "pipeline": "refusal"})

    def summary(self) -> dict[str, Any]:
        """The chosen candidate (when found), its scores, and how many candidates pass all filters."""
        return views.selection_summary(self)

    def to_frame(self) -> pd.DataFrame:
        """One row per filter (depth, KL, induce, bypass, all together): its rule and how many candidates pass it."""
        return views.selection_frame(self)

    def plot(self) -> Any:
        """How many candidates pass each filter alone and all together."""
        return views.selection_figure(self)


PROBE = 32        # prompts per class judged first
PROBE_STOP_P = 0.2  # the probe alone stops the run when it shows no sign of harmful-specific refusal


def find_refusal_tokens(model: Model, data: RefusalData, max_new_tokens: int = 12, batch_size: int = 64,
                        judge: Judge | None = None, min_refusals: int = 1) -> RefusalTokens:
    """Generate on the train prompts, judge them, and keep the first tokens that open refusals but not helpful
    answers, when at least ``min_refusals`` harmful prompts were refused (fewer: no tokens, so no scoring).

    Sequential: the first ``PROBE`` prompts per class go first; when their harmful refusals do not exceed the
    harmless ones (one-sided Fisher p > ``PROBE_STOP_P``) the rest is not generated, so a model that does
    not refuse is diagnosed in seconds (the diagnosis then reads the probe, with its own sample size)."""
    run = Runtime(batch_size=2 * batch_size, progress=False)  # both classes at once
    prompts = {w: getattr(data, w)["train"].instructions for w in ("harmful", "harmless")}
    texts: dict[str, list[str]] = {"harmful": [], "harmless": []}
    first: dict[str, list[int]] = {"harmful": [], "harmless": []}
    flags: dict[str, list[bool]] = {"harmful": [], "harmless": []}
    for lo, hi in ((0, PROBE), (PROBE, None)):
        chunks = {w: prompts[w][lo:hi] for w in prompts}
        both = [p for w in prompts for p in chunks[w]]
        if not both:
            continue
        g = steering.generate(model, both, max_new_tokens=max_new_tokens, runtime=run)
        verdicts, at = judge_many(judge, g.texts), 0
        for w in prompts:
            span = slice(at, at + len(chunks[w]))
            texts[w] += list(g.texts[span])
            flags[w] += verdicts[span]
            first[w] += [ids[0] if ids else -1 for ids in g.token_ids[span]]
            at += len(chunks[w])
        kh, ks = sum(flags["harmful"]), sum(flags["harmless"])
        if hi is not None and fisher_greater(kh, len(flags["harmful"]), ks, len(flags["harmless"])) > PROBE_STOP_P:
            break
    rh, rs = flags["harmful"], flags["harmless"]
    toks: list[int] = []
    if sum(rh) >= max(1, min_refusals):
        toks = refusal_tokens([f for f, r in zip(first["harmful"], rh) if r],
                              [f for f, r in zip(first["harmless"], rs) if not r])
    return RefusalTokens(toks, [model.tokenizer.decode([t]) for t in toks], sum(rh) / len(rh), sum(rs) / len(rs),
                         texts["harmful"], texts["harmless"], rh, rs, min_refusals)


def find_candidates(model: Model, data: RefusalData, layers: list[int] | None = None, batch_size: int = 64
                    ) -> Candidates:
    """Difference of means (harmful - harmless) at resid_pre of ``layers`` x every post-instruction position."""
    layers = list(layers) if layers is not None else list(range(model.n_layers))
    kw = dict(sites="resid_pre", layers=layers, positions="post_instruction",
              runtime=Runtime(batch_size=batch_size, progress=False))
    h = capture(model, data.harmful["train"].instructions, **kw)
    s = capture(model, data.harmless["train"].instructions, **kw)
    n_pos = min(h.tensor.shape[2], s.tensor.shape[2])
    h_acts, s_acts = h.tensor[:, :, -n_pos:], s.tensor[:, :, -n_pos:]
    x = torch.cat([h_acts, s_acts])                                               # [n, layers, P, d]
    y = torch.tensor([1] * h.n_prompts + [0] * s.n_prompts)
    n, n_layers, _, d = x.shape
    fit = diff_of_means(x.reshape(n, n_layers * n_pos, d), y)
    text = format_prompts(model, ["x"])[0]
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    return Candidates(fit.raw.reshape(n_layers, n_pos, d), h_acts, s_acts, layers,
                      [f"blocks.{layer}.hook_resid_pre" for layer in layers],
                      [model.tokenizer.decode([t]) for t in ids[-n_pos:]], list(fit.fitted_on), fit.data_hash)


@moved_keywords(moved(config="SelectionConfig", knobs=("max_rows", "ablate_positions", "n_random")))
def score_candidates(model: Model, data: RefusalData, cand: Candidates, tokens: RefusalTokens,
                     only: torch.Tensor | None = None, kl_gate: Callable[[list[float]], float] | None = None,
                     config: SelectionConfig | None = None, runtime: Runtime | None = None) -> Scores:
    """Bypass (ablate on harmful val), KL (ablate on harmless val) and induce (add on harmless val), batched;
    and the KL of ``config.n_random`` random unit directions (seeded with ``runtime.seed``) ablated the same way on
    the same prompts.

    ``only [layers, P]`` (bool): score just these candidates; the others are NaN (and so pass no filter).
    ``config.ablate_at()``: ablate at every token, or at the post-instruction tokens only. ``kl_gate`` (the KL
    filter's threshold from the random directions' KLs, :func:`kl_cutoff`): the KL is scored first, and when no
    candidate passes it, bypass and induce are not scored (NaN; nothing here could be selected): for a caller
    with another search to try next. ``runtime``: default batch size 64, seed 0."""
    c = config if config is not None else SelectionConfig()
    rt = runtime if runtime is not None else Runtime(batch_size=64, progress=False)
    batch_size, max_rows, ablate_positions, n_random, seed = rt.batch_size, c.max_rows, c.ablate_at(), c.n_random, rt.seed
    toks = tokens.tokens
    enc_h, enc_s = _val_encodings(model, data)
    base_h, base_s = prompt_logits(model, enc_h, batch_size=batch_size), prompt_logits(model, enc_s, batch_size=batch_size)
    n_layers, n_pos, d = cand.raw.shape
    if only is not None and tuple(only.shape) != (n_layers, n_pos):
        raise ValueError(f"only must be a bool mask [layers, P] = {[n_layers, n_pos]}, got {tuple(only.shape)}")
    idx = torch.arange(n_layers * n_pos) if only is None else only.flatten().nonzero().squeeze(1)
    flat, units, layer_of = _candidate_rows(cand, idx)
    out = torch.full((3, n_layers * n_pos), math.nan)
    kw: dict[str, Any] = dict(max_rows=max_rows)
    at = dict(positions=ablate_positions)
    # KL of the candidates and of the random directions in one batched pass (a direction ablation acts at every
    # layer, so a random one has no layer of its own)
    rand = torch.stack([r.vectors[0] for r in random_directions(d, n_random, seed=seed)]) if n_random > 0 else \
        units.new_empty((0, d))
    dirs = torch.cat([units, rand])
    kls = score_rows(model, enc_s, dirs, "ablate", reduce=lambda lg: kl_div(base_s[None].expand_as(lg), lg), **kw,
                     **at).mean(1) if len(dirs) else dirs.new_empty(0)
    out[2, idx] = kls[:len(idx)]
    kl_random = kls[len(idx):].tolist()
    if len(idx) and (kl_gate is None or bool((kls[:len(idx)] < kl_gate(kl_random)).any())):
        out[0, idx], out[1, idx] = _bypass_induce(model, enc_h, enc_s, units, flat, layer_of, toks, max_rows,
                                                  ablate_positions)
    bypass, induce, kl = (x.view(n_layers, n_pos) for x in out)
    return Scores(bypass, induce, kl, refusal_score(base_h, toks).mean().item(), refusal_score(base_s, toks).mean().item(),
                  kl_random)


def _val_encodings(model: Model, data: RefusalData) -> tuple[list, list]:
    """The harmful and harmless validation prompts, encoded (the exact scores' prompts)."""
    return prepare(model, data.harmful["val"].instructions)[1], prepare(model, data.harmless["val"].instructions)[1]


def _candidate_rows(cand: Candidates, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Candidates ``idx`` (flat indices into ``[layers, P]``): their raw vectors, unit directions and layers."""
    n_pos, d = cand.raw.shape[1], cand.raw.shape[2]
    flat = cand.raw.reshape(-1, d)[idx]
    return flat, torch.nn.functional.normalize(flat, dim=-1), torch.tensor(cand.layers).repeat_interleave(n_pos)[idx]


def _bypass_induce(model: Model, enc_h: list, enc_s: list, units: torch.Tensor, flat: torch.Tensor,
                   layer_of: torch.Tensor, toks: list[int], max_rows: int, positions: str
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean refusal score per candidate: harmful prompts with ``units`` ablated, harmless ones with ``flat`` added
    at ``layer_of``."""
    bypass = score_rows(model, enc_h, units, "ablate", reduce=lambda lg: refusal_score(lg, toks), max_rows=max_rows,
                        positions=positions).mean(1)
    induce = score_rows(model, enc_s, flat, "add", layer_of, reduce=lambda lg: refusal_score(lg, toks),
                        max_rows=max_rows).mean(1)
    return bypass, induce


def fill_skipped(model: Model, data: RefusalData, cand: Candidates, tokens: RefusalTokens, scores: Scores,
                 batch_size: int = 64, max_rows: int = 256, ablate_positions: str = "all",
                 kl_gate: Callable[[list[float]], float] | None = None) -> Scores | None:
    """``scores`` with the bypass and induce that a KL gate skipped (``score_candidates(kl_gate=)``) scored, when
    this run needs them: no gate now (the mode's own search), or some candidate passes the gate now (new
    thresholds); ``None`` when nothing was skipped or nothing is needed."""
    scored = ~scores.kl.isnan()
    missing = scored & scores.bypass.isnan()
    if not scores.n_gated or (kl_gate is not None and not bool(
            (scores.kl[scored] < kl_gate(scores.kl_random)).any())):
        return None
    idx = missing.flatten().nonzero().squeeze(1)
    flat, units, layer_of = _candidate_rows(cand, idx)
    bypass, induce = scores.bypass.clone().flatten(), scores.induce.clone().flatten()
    bypass[idx], induce[idx] = _bypass_induce(model, *_val_encodings(model, data), units, flat, layer_of,
                                              tokens.tokens, max_rows, ablate_positions)
    return replace(scores, bypass=bypass.view_as(scores.bypass), induce=induce.view_as(scores.induce))


def kl_cutoff(cfg: SelectionConfig, scores: Scores) -> float:
    """The KL filter's threshold: ``cfg.kl_threshold``, or with ``kl_reference="random"`` the larger of it and the
    highest KL of the random directions ablated the same way (an error when the scores have none)."""
    return kl_threshold(cfg, scores.kl_random)


def kl_threshold(cfg: SelectionConfig, kl_random: list[float]) -> float:
    """:func:`kl_cutoff` from the random directions' KLs alone."""
    if cfg.kl_reference == "absolute":
        return cfg.kl_threshold
    if not kl_random:
        raise ValueError("kl_reference='random' needs the KL of random directions (score_candidates(n_random > 0))")
    return max(cfg.kl_threshold, max(kl_random))


def select_direction(n_layers: int, cand: Candidates, scores: Scores, cfg: SelectionConfig) -> Selection:
    """The paper's filters (depth, KL, induce, bypass below baseline); the lowest bypass score among the rest."""
    n_pos = cand.n_positions
    layer_grid = torch.tensor(cand.layers)[:, None].expand(len(cand.layers), n_pos)
    kl_cut = kl_cutoff(cfg, scores)
    keep = {"layer": layer_grid < math.floor(n_layers * (1 - cfg.prune_layer_fraction)),
            "kl": scores.kl < kl_cut, "induce": scores.induce > cfg.induce_threshold,
            "bypass": scores.bypass < scores.baseline_harmful}
    ok = keep["layer"] & keep["kl"] & keep["induce"] & keep["bypass"]
    passing = {k: int(v.sum()) for k, v in keep.items()} | {"all": int(ok.sum()), "of": ok.numel()}
    common: dict[str, Any] = dict(
        filters={"kl_threshold": kl_cut, "kl_reference": cfg.kl_reference, "kl_threshold_set": cfg.kl_threshold,
                 "prune_layer_fraction": cfg.prune_layer_fraction, "induce_threshold": cfg.induce_threshold},
        passing=passing,
        baseline_refusal_score={"harmful": scores.baseline_harmful, "harmless": scores.baseline_harmless})
    only_kl = keep["layer"] & keep["induce"] & keep["bypass"] & ~keep["kl"]
    if not ok.any():
        return Selection(found=False, kl_rejected=_stronger(cand, scores, only_kl, math.inf), **common)
    masked = torch.where(ok, scores.bypass, torch.full_like(scores.bypass, float("inf")))
    li, pi = divmod(int(masked.flatten().argmin()), n_pos)
    best = float(scores.bypass[li, pi])
    return Selection(True, layer_index=li, position_index=pi, layer=cand.layers[li], position=pi - n_pos,
                     position_token=cand.pos_tokens[pi], bypass_score=best,
                     induce_score=float(scores.induce[li, pi]), kl=float(scores.kl[li, pi]),
                     kl_rejected=_stronger(cand, scores, only_kl, best), **common)


def _stronger(cand: Candidates, scores: Scores, only_kl: torch.Tensor, below: float, k: int = 3) -> list[dict[str, Any]]:
    """Up to ``k`` candidates that fail the KL filter alone with a bypass score below ``below`` (the selected one's),
    lowest first: what the KL filter turned down."""
    n_pos = cand.n_positions
    flat = torch.where(only_kl & (scores.bypass < below), scores.bypass, math.inf).flatten()
    order = [i for i in flat.argsort()[:k].tolist() if math.isfinite(flat[i])]
    bypass, kl, induce = scores.bypass.flatten(), scores.kl.flatten(), scores.induce.flatten()
    return [{"layer": cand.layers[i // n_pos], "position": i % n_pos - n_pos, "bypass": float(bypass[i]),
             "kl": float(kl[i]), "induce": float(induce[i])} for i in order]


__all__ = ["Candidates", "RefusalTokens", "Scores", "Selection", "find_candidates", "find_refusal_tokens",
           "score_candidates", "select_direction"]
