"""Head characterisation on repeated random tokens (Olsson et al. 2022, "In-context Learning and Induction Heads").

Each prompt is BOS, ``t`` random tokens ``r``, then ``r`` again (``T = 1 + 2t``). Per head, averaged over prompts:
``induction``: attention from each second-copy token (query ``q > t``) to the token after its earlier copy
(key ``q - t + 1``); ``duplicate_token``: to the earlier copy itself (key ``q - t``); ``previous_token``: to
``q - 1`` (every query but BOS); ``entropy`` of each query's attention row (nats) and ``bos``: attention to
position 0, both over every query but BOS. Patterns come from the ``pattern`` sites (:mod:`interp.attention`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int

from interp.bundle import Result
from interp.models import Model
from interp.values import Runtime

if TYPE_CHECKING:
    import pandas as pd

SCORES = ("induction", "previous_token", "duplicate_token", "entropy", "bos")
PATTERN_SOURCE = "the pattern sites (interp.attention)"


@dataclass
class HeadScores(Result):
    """Every head's scores, each ``[n_layers, n_heads]`` (see the module docstring), and how they were made."""

    induction: torch.Tensor
    previous_token: torch.Tensor
    duplicate_token: torch.Tensor
    entropy: torch.Tensor
    bos: torch.Tensor
    n_tokens: int = 0
    n_prompts: int = 0
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head`` and the five scores."""
        import pandas as pd

        L, H = self.induction.shape
        return pd.DataFrame({"layer": [la for la in range(L) for _ in range(H)], "head": list(range(H)) * L,
                             **{k: getattr(self, k).flatten().tolist() for k in SCORES}})

    def top(self, score: str = "induction", k: int = 10) -> list[tuple[int, int, float]]:
        """The ``k`` heads with the highest ``score`` as ``(layer, head, value)``, highest first."""
        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {score!r}")
        g = getattr(self, score)
        idx = g.flatten().argsort(descending=True)[:k].tolist()
        H = g.shape[1]
        return [(i // H, i % H, float(g.flatten()[i])) for i in idx]

    def summary(self) -> dict[str, Any]:
        """The top five heads by each score, and the setting."""
        return {"n_tokens": self.n_tokens, "n_prompts": self.n_prompts, "seed": self.seed,
                **{f"top_{k}": [list(x) for x in self.top(k, 5)] for k in SCORES}}

    def plot(self, title: str | None = None) -> Any:
        """One layer x head heatmap per score."""
        from interp.viz.looks import score_heatmaps

        return score_heatmaps({k: getattr(self, k) for k in SCORES},
                              title or f"head scores on repeated random tokens ({self.n_tokens} tokens twice)")


def repeated_tokens(model: Model, n_tokens: int = 50, n_prompts: int = 32, seed: int = 0) -> Int[torch.Tensor, "n T"]:
    """``[n_prompts, 1 + 2 * n_tokens]``: BOS, ``n_tokens`` random non-special tokens, the same tokens again."""
    if n_tokens < 2 or n_prompts < 1:
        raise ValueError(f"n_tokens must be >= 2 and n_prompts >= 1, got n_tokens={n_tokens}, n_prompts={n_prompts}")
    limit = getattr(model.config, "max_position_embeddings", None) or model.max_length
    if limit is not None and 1 + 2 * n_tokens > limit:
        raise ValueError(f"1 + 2 * n_tokens = {1 + 2 * n_tokens} exceeds the model's max_position_embeddings "
                         f"{limit}; use n_tokens <= {(limit - 1) // 2}")
    tok = model.tokenizer
    vocab = int(model.config.vocab_size)
    special = set(getattr(tok, "all_special_ids", []) or [])
    allowed = torch.tensor([i for i in range(min(vocab, len(tok) if tok is not None else vocab)) if i not in special])
    g = torch.Generator().manual_seed(int(seed))
    r = allowed[torch.randint(len(allowed), (n_prompts, n_tokens), generator=g)]
    bos = getattr(tok, "bos_token_id", None)
    bos = model.config.bos_token_id if bos is None else bos
    if bos is None:
        raise ValueError("this model's tokenizer and config name no BOS token; the repeated sequences start with it")
    return torch.cat([torch.full((n_prompts, 1), int(bos)), r, r], 1)


def _patterns(model: Model, tokens: Int[torch.Tensor, "n T"], layers: Sequence[int] | None = None
              ) -> Float[torch.Tensor, "n L H T T"]:
    """Attention patterns (query rows, key columns) of unpadded ``tokens`` at ``layers`` (default all), float32 on
    the CPU, read at the ``pattern`` sites (:mod:`interp.attention`; the model's attention implementation is
    switched only while they are hooked)."""
    from interp.hooking import hooks
    from interp.sites import Site

    keep = list(range(model.n_layers) if layers is None else layers)
    got: dict[int, torch.Tensor] = {}

    def keeper(layer: int):
        def fn(x: torch.Tensor, ctx: Any) -> None:
            got[layer] = x.detach().float().cpu()
        return fn

    with hooks(model, {Site("pattern", la).name: keeper(la) for la in keep}), torch.no_grad():
        model.hf(input_ids=tokens.to(model.device))
    return torch.stack([got[la] for la in keep], 1)


def scores_of(p: Float[torch.Tensor, "n L H T T"], n_tokens: int) -> dict[str, torch.Tensor]:
    """The five scores ``[L, H]`` from patterns of BOS + r + r sequences (``T = 1 + 2 * n_tokens``)."""
    T = p.shape[-1]
    if T != 1 + 2 * n_tokens:
        raise ValueError(f"patterns of {T} tokens do not hold BOS + {n_tokens} tokens twice")
    q = torch.arange(1, T)
    second = torch.arange(n_tokens + 1, T)
    rows = p[..., 1:, :]                                                 # every query but BOS
    ent = -(rows * rows.clamp_min(1e-30).log()).sum(-1)
    return {"induction": p[..., second, second - n_tokens + 1].mean((0, -1)),
            "previous_token": p[..., q, q - 1].mean((0, -1)),
            "duplicate_token": p[..., second, second - n_tokens].mean((0, -1)),
            "entropy": ent.mean((0, -1)), "bos": rows[..., 0].mean((0, -1))}


def head_scores(model: Model, *, n_tokens: int = 50, n_prompts: int = 32, seed: int = 0,
                runtime: Runtime | None = None) -> HeadScores:
    """Score every head on ``n_prompts`` repeated random sequences of ``n_tokens`` tokens (see the module
    docstring); batches of ``runtime.batch_size`` prompts, the sums kept per batch."""
    run = Runtime.of(runtime)
    tokens = repeated_tokens(model, n_tokens, n_prompts, seed)
    total: dict[str, torch.Tensor] = {}
    for i in range(0, n_prompts, run.batch_size):
        chunk = tokens[i:i + run.batch_size]
        got = scores_of(_patterns(model, chunk), n_tokens)
        for k, v in got.items():
            total[k] = total.get(k, 0) + v * len(chunk)
    return HeadScores(**{k: total[k] / n_prompts for k in SCORES}, n_tokens=n_tokens, n_prompts=n_prompts,
                      seed=seed, meta={"model_id": model.name, "patterns": PATTERN_SOURCE})


def pattern_figure(model: Model, prompt: str, layer: int, heads: Sequence[int] | None = None) -> Any:
    """Plotly heatmaps of ``heads``' (default all) attention patterns at ``layer`` on ``prompt`` (tokenised as
    the tokenizer does by default, no chat template), axes labelled with the tokens."""
    from interp.sites import resolve_layers
    from interp.viz.looks import pattern_heatmaps

    la = resolve_layers(layer, model.n_layers, what="pattern_figure")[0]
    hs = list(range(model.n_heads)) if heads is None else list(heads)
    bad = [h for h in hs if not 0 <= h < model.n_heads]
    if bad:
        raise ValueError(f"heads {bad} are out of range; this model has heads 0..{model.n_heads - 1}")
    ids = torch.tensor([model.tokenizer.encode(prompt)])
    p = _patterns(model, ids, [la])[0, 0, hs]
    return pattern_heatmaps(p, model.tokenizer.convert_ids_to_tokens(ids[0].tolist()), hs, la)


def pattern_html(model: Model, prompt: str, layer: int) -> Any:
    """CircuitsVis's interactive view of every head at ``layer`` (needs ``pip install circuitsvis``; not a
    dependency of the toolkit)."""
    try:
        import circuitsvis as cv
    except ImportError as e:
        raise ImportError("pattern_html needs circuitsvis: pip install circuitsvis (or use pattern_figure)") from e
    ids = torch.tensor([model.tokenizer.encode(prompt)])
    p = _patterns(model, ids, [layer])[0, 0]
    return cv.attention.attention_patterns(tokens=model.tokenizer.convert_ids_to_tokens(ids[0].tolist()), attention=p)


__all__ = ["PATTERN_SOURCE", "SCORES", "HeadScores", "head_scores", "pattern_figure", "pattern_html",
           "repeated_tokens", "scores_of"]
