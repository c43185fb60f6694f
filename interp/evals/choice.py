"""Forced choice read from next-token logits: the option letters' token ids, and which option each row chose.

A probe item ends in "... Answer A or B."; the model's answer is the letter with the larger next-token
probability, the letter counted over its single-token spellings (``"A"`` and ``" A"``: a chat model answers
after its template without a space, a plain prompt after ``"Answer:"`` with one).

    ids = letter_ids(tokenizer, ("A", "B"))            # [[id of "A", id of " A"], [id of "B", id of " B"]]
    lp = option_logprobs(logits, ids)                  # [n, 2], log-probabilities renormalised over the letters
    chose = lp.argmax(-1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float


def letter_ids(tokenizer: Any, letters: Sequence[str] = ("A", "B")) -> list[list[int]]:
    """Token ids of each letter's single-token spellings (bare and space-prefixed), one list per letter.

    Refuses a letter with no single-token spelling, a spelling the tokenizer maps to its unknown token, and
    letters that share a token (the answer could not be read)."""
    if isinstance(letters, str) or len(letters) < 2:
        raise ValueError(f"give at least two option letters as a sequence, e.g. ('A', 'B'); got {letters!r}")
    unk = getattr(tokenizer, "unk_token_id", None)
    out: list[list[int]] = []
    for letter in letters:
        ids: list[int] = []
        for spelling in (letter, " " + letter):
            toks = list(tokenizer(spelling, add_special_tokens=False)["input_ids"])
            if len(toks) == 1 and toks[0] != unk and toks[0] not in ids:
                ids.append(int(toks[0]))
        if not ids:
            raise ValueError(f"option letter {letter!r} is not a single known token for this tokenizer (neither "
                             f"{letter!r} nor {' ' + letter!r}); choose letters= that the tokenizer keeps whole")
        out.append(ids)
    flat = [t for ids in out for t in ids]
    if len(set(flat)) != len(flat):
        raise ValueError(f"option letters {tuple(letters)} share a token id ({out}); the choice could not be read: "
                         f"choose distinct letters")
    return out


def option_logprobs(logits: Float[torch.Tensor, "n vocab"], ids: Sequence[Sequence[int]]
                    ) -> Float[torch.Tensor, "n k"]:
    """Log-probability of each option (log-sum-exp over its spellings), renormalised over the ``k`` options."""
    if logits.dim() != 2:
        raise ValueError(f"option_logprobs needs next-token logits [n, vocab], got shape {tuple(logits.shape)}")
    lp = torch.log_softmax(logits.float(), -1)
    per = torch.stack([torch.logsumexp(lp[:, list(v)], -1) for v in ids], -1)
    return per - torch.logsumexp(per, -1, keepdim=True)


def chosen(logits: Float[torch.Tensor, "n vocab"], ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Index of the option each row chose (largest option probability) ``[n]``."""
    return option_logprobs(logits, ids).argmax(-1)


__all__ = ["chosen", "letter_ids", "option_logprobs"]
