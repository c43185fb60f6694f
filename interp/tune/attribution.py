"""Token attribution through an adapter: per response token, ``log p_adapted - log p_base`` of the actual token.

``token_attribution(base, adapted, prompts, responses)`` scores both models with :func:`interp.readout.token_logprobs`
(chat template, batched, left padding). ``adapted`` may be a peft-wrapped model on ``base`` (``with_adapter(...,
merge=False)`` or a ``fine_tune`` result): the base pass then runs inside ``disable_adapter()``, so one model in
memory suffices (``base=None`` says so explicitly); or an adapter folder, loaded onto ``base`` and unloaded after.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float, Int

from interp.models import Model
from interp.readout import TokenLogprobs, token_logprobs
from interp.tune.data import check_pairs
from interp.tune.describe import Described


@dataclass
class TokenAttribution(Described):
    """Per response token (flat over examples, ``[N]`` each): ``gain`` = ``logp_adapted - logp_base`` of the
    actual token ``token_ids`` (``tokens``: the tokenizer's strings, ``texts``: decoded), at ``position`` (index in
    the prompt + response sequence, BOS included) of example ``example``, ``index`` within its response;
    ``special``: the tokenizer's special tokens. See :class:`~tune.describe.Described` for the summaries."""

    gain: Float[torch.Tensor, " n"]
    logp_base: Float[torch.Tensor, " n"]
    logp_adapted: Float[torch.Tensor, " n"]
    token_ids: Int[torch.Tensor, " n"]
    example: Int[torch.Tensor, " n"]
    position: Int[torch.Tensor, " n"]
    index: Int[torch.Tensor, " n"]
    special: Bool[torch.Tensor, " n"]
    tokens: list[str]
    texts: list[str]
    n_examples: int

    def of(self, i: int) -> torch.Tensor:
        """``[N]`` bool: the tokens of example ``i``."""
        return self.example == i


def _is_peft(m: Model) -> bool:
    return hasattr(m.hf, "disable_adapter") and hasattr(m.hf, "get_base_model")


def _check_same_base(base: Model, adapted: Model) -> None:
    """Refuse a pair that cannot be base and adaptation: other architecture, width, depth or vocabulary."""
    a = adapted.hf.get_base_model().config if _is_peft(adapted) else adapted.config
    b = base.config
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")
    diff = [f"{k}: base {getattr(b, k, None)} vs adapted {getattr(a, k, None)}" for k in keys
            if getattr(b, k, None) != getattr(a, k, None)]
    if not diff and base.tokenizer.get_vocab() != adapted.tokenizer.get_vocab():
        diff = ["the tokenizers' vocabularies differ"]
    if diff:
        raise ValueError(f"the adapted model is not an adaptation of this base ({'; '.join(diff)}); pass the base it "
                         f"was fine-tuned from, or only the peft-wrapped adapted model (base=None)")


def _load_adapter(base: Model, folder: Path) -> Model:
    from interp.models import with_adapter

    try:
        return with_adapter(base, folder, merge=False)
    except (RuntimeError, ValueError, KeyError) as e:
        raise ValueError(f"the adapter at {folder} does not fit this base {base.name} ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200]}); it was trained for another base: load its own base "
                         f"(adapter_config.json names it) and pass that") from e


def _score(base: Model | None, adapted: Model, prompts: list[str], responses: list[str], kw: dict
           ) -> tuple[list[TokenLogprobs], list[TokenLogprobs]]:
    shared = base is None or base is adapted or (_is_peft(adapted) and adapted.hf.get_base_model() is base.hf)
    if shared and not _is_peft(adapted):
        raise ValueError("base=None needs a peft-wrapped adapted model (its adapter disabled gives the base); pass "
                         "the base model, or wrap with interp.models.with_adapter(base, folder, merge=False)")
    if not shared:
        assert base is not None
        _check_same_base(base, adapted)
    lp_a = token_logprobs(adapted, prompts, responses, **kw)
    with adapted.hf.disable_adapter() if shared else nullcontext():
        lp_b = token_logprobs(adapted if shared else base, prompts, responses, **kw)  # type: ignore[arg-type]
    return lp_b, lp_a


def token_attribution(base: Model | None, adapted: Model | str | os.PathLike, prompts: Sequence[str],
                      responses: Sequence[str], batch_size: int = 16, chat: bool = True,
                      system: str | None = None) -> TokenAttribution:
    """Per response token, ``log p_adapted - log p_base`` of the actual token (see the module docstring for the
    forms of ``base`` / ``adapted``)."""
    check_pairs(prompts, responses)
    prompts, responses = list(prompts), list(responses)
    kw: dict[str, Any] = {"batch_size": batch_size, "chat": chat, "system": system}
    loaded = None
    if isinstance(adapted, (str, os.PathLike)):
        if base is None:
            raise ValueError("an adapter folder needs its base model: pass base=load_model(...)")
        loaded = adapted = _load_adapter(base, Path(adapted))
    try:
        lp_b, lp_a = _score(base, adapted, prompts, responses, kw)
    finally:
        if loaded is not None:
            loaded.hf.unload()  # take the adapter's layers out of the base's modules again
    return _assemble(adapted, lp_b, lp_a)


def _assemble(model: Model, lp_b: list[TokenLogprobs], lp_a: list[TokenLogprobs]) -> TokenAttribution:
    from interp.tune.classes import token_texts

    for i, (b, a) in enumerate(zip(lp_b, lp_a, strict=True)):
        if not torch.equal(b.token_ids, a.token_ids):
            raise ValueError(f"example {i} tokenises differently under the two models; they need one tokenizer")
    cat = torch.cat
    ids = cat([a.token_ids for a in lp_a]).long()
    special_ids = set(getattr(model.tokenizer, "all_special_ids", None) or [])
    logp_b, logp_a = cat([b.logprobs for b in lp_b]).float(), cat([a.logprobs for a in lp_a]).float()
    return TokenAttribution(
        gain=logp_a - logp_b, logp_base=logp_b, logp_adapted=logp_a, token_ids=ids,
        example=cat([torch.full((len(a.positions),), i, dtype=torch.long) for i, a in enumerate(lp_a)]),
        position=cat([torch.tensor(a.positions, dtype=torch.long) for a in lp_a]),
        index=cat([torch.arange(len(a.positions)) for a in lp_a]),
        special=torch.tensor([int(t) in special_ids for t in ids.tolist()], dtype=torch.bool),
        tokens=[t for a in lp_a for t in a.tokens],
        texts=[t for a in lp_a for t in token_texts(model.tokenizer, a.token_ids.tolist())],
        n_examples=len(lp_a))


__all__ = ["TokenAttribution", "token_attribution"]
