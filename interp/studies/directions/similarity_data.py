"""Our own data for the similarity study: category items with typicality ratings (our ratings, not human norms),
category matrices built from them, and parallel sentences in five languages; plus the capture of items' activations."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

import torch

from interp.capturing import capture
from interp.models import Model, from_hf
from interp.positions import without_first
from interp.values import Prompts, Runtime

LANGUAGES = ("en", "fr", "de", "es", "zh")


def _rows(name: str) -> list[dict[str, Any]]:
    text = resources.files("interp.studies.directions").joinpath("data", "similarity", name).read_text(encoding="utf-8")
    return [r for r in map(json.loads, filter(str.strip, text.splitlines())) if "_meta" not in r]


def load_categories() -> dict[str, list[Any]]:
    """``{"items", "categories", "superordinates", "typicality"}``: 96 items (8 categories x 12), in file order;
    typicality 1-7 are our own ratings."""
    rows = _rows("categories.jsonl")
    return {"items": [r["item"] for r in rows], "categories": [r["category"] for r in rows],
            "superordinates": [r["superordinate"] for r in rows], "typicality": [float(r["typicality"]) for r in rows]}


def load_parallel(languages: Sequence[str] = LANGUAGES, n: int | None = None) -> dict[str, list[str]]:
    """``{lang: [sentence, ...]}``: the parallel sentences (62, or the first ``n``), aligned by index across languages."""
    bad = [lang for lang in languages if lang not in LANGUAGES]
    if bad:
        raise ValueError(f"no parallel sentences in {bad}; the data holds {list(LANGUAGES)}")
    rows = _rows("parallel.jsonl")[:n]
    return {lang: [r[lang] for r in rows] for lang in languages}


def category_matrix(categories: Sequence[Any], superordinates: Sequence[Any] | None = None,
                    between: float = 0.5) -> torch.Tensor:
    """A human-style target RDM ``[n, n]``: 0 within a category, 1 between categories; with ``superordinates`` a graded
    one (``between`` for different categories of one superordinate, 1 across superordinates)."""
    cats = list(categories)
    same = torch.tensor([[a == b for b in cats] for a in cats])
    target = (~same).double()
    if superordinates is not None:
        sup = list(superordinates)
        if len(sup) != len(cats):
            raise ValueError(f"{len(sup)} superordinates for {len(cats)} categories labels")
        same_sup = torch.tensor([[a == b for b in sup] for a in sup])
        target[same_sup & ~same] = between
    return target


def random_init(model: Model, seed: int = 0) -> Model:
    """The same architecture and tokenizer with freshly initialised weights (HF's own init, seeded): the control for
    what tokenisation and architecture alone give a similarity study, without learned structure."""
    import copy

    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(model.hf.config)
    if hasattr(cfg, "quantization_config"):  # a GGUF-loaded model's config; the twin is plain float
        del cfg.quantization_config
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return from_hf(hf.eval(), model.tokenizer, name=f"{model.name} (random init)")


MEAN_AFTER_FIRST = "mean_after_first"


def item_activations(model: Model, texts: Sequence[str], layers: Sequence[int] | None = None,
                     positions: Any = "last", batch_size: int = 16) -> tuple[torch.Tensor, list[int]]:
    """``X [L, n, d]`` (float64) of plain texts (no chat template) at the residual stream after each block in
    ``layers`` (default: all), at ``positions``: any capture rule (``"last"``: the last token; ``"prompt_mean"``: mean
    over the tokens less the special ones), or ``"mean_after_first"``: mean over the real tokens after the first, the
    attention sink (Gemma's BOS; with the chat template off SmolLM2 has no BOS and its first word is the sink, whose
    huge activations would dominate a mean). Returns the layer indices too."""
    layer_list = list(range(model.n_layers)) if layers is None else [int(v) for v in layers]
    bad = [v for v in layer_list if not 0 <= v < model.n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range for {model.n_layers} blocks")
    rule = "all" if positions == MEAN_AFTER_FIRST else positions
    acts = capture(model, Prompts(list(texts), chat=False), sites="resid_post", positions=rule,
                   layers=layer_list, runtime=Runtime(batch_size=batch_size, progress=False))
    X = acts.tensor.double()
    if positions == MEAN_AFTER_FIRST:
        keep = without_first(acts.mask)
        keep = torch.where(keep.any(1, keepdim=True), keep, acts.mask.bool())  # a one-token text keeps its token
        w = keep.double() / keep.sum(1, keepdim=True)
        X = torch.einsum("nltd,nt->nld", X, w)
    return X.transpose(0, 1).contiguous(), layer_list


__all__ = ["category_matrix", "item_activations", "LANGUAGES", "load_categories", "load_parallel",
           "MEAN_AFTER_FIRST", "random_init"]
