"""Public logits and per-token log-probs of prompts (and responses), on the one forward layer.

``logits(model, prompts)`` gives next-token logits at the last prompt token (or at every real token);
``token_logprobs(model, prompts, responses)`` scores each response token given everything before it.
Both format and tokenise through :func:`interp.forward.prepare` and run :func:`interp.forward.forward`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int

from interp.bundle import Result
from interp.forward import batches, forward, prepare
from interp.models import Model

if TYPE_CHECKING:
    import pandas as pd


def logits(model: Model, prompts: Sequence[str], positions: str = "last", chat: bool = True,
           system: str | None = None, batch_size: int = 16
           ) -> Float[torch.Tensor, "n vocab"] | list[Float[torch.Tensor, "t vocab"]]:
    """Logits of ``prompts`` (float32, CPU): ``positions="last"`` -> ``[n, vocab]`` at each prompt's last token
    (the next-token distribution); ``"all"`` -> one ``[n_tokens_i, vocab]`` per prompt, real tokens only."""
    if positions not in ("last", "all"):
        raise ValueError(f"positions must be 'last' or 'all', got {positions!r}")
    _, encs = prepare(model, prompts, chat=chat, system=system)
    out: list[torch.Tensor] = []
    for b in batches(model, encs, batch_size):
        lg = forward(model, b, logits=positions)
        assert lg is not None
        lg = lg.cpu()
        if positions == "last":
            out.append(lg)
        else:
            out += [lg[r][b.attention_mask[r].bool()] for r in range(lg.shape[0])]
    return torch.cat(out) if positions == "last" else out


@dataclass
class TokenLogprobs(Result):
    """One response scored token by token: ``logprobs [k]`` of ``token_ids [k]`` (strings in ``tokens``) at
    ``positions`` (indices into the prompt + response token sequence, BOS included); a result (plot, summary,
    save / load)."""

    logprobs: Float[torch.Tensor, " k"]
    token_ids: Int[torch.Tensor, " k"]
    tokens: list[str]
    positions: list[int]

    @property
    def total(self) -> float:
        """Log-probability of the whole response (sum over its tokens)."""
        return float(self.logprobs.sum())

    def summary(self) -> dict[str, Any]:
        """Headline numbers: tokens scored, total and mean log-prob, and the least likely token with its position
        (``None`` for an empty response)."""
        k = len(self.tokens)
        j = int(self.logprobs.argmin()) if k else None
        return {"n_tokens": k, "total": self.total, "mean": self.total / k if k else None,
                "min": None if j is None else float(self.logprobs[j]),
                "lowest_token": None if j is None else self.tokens[j],
                "lowest_position": None if j is None else self.positions[j]}

    def plot(self, title: str | None = None) -> Any:
        """Bars of each response token's log-prob, labelled ``position token``."""
        from interp.viz.tokens import token_values

        return token_values([f"{p} {t}" for p, t in zip(self.positions, self.tokens)], self.logprobs.tolist(),
                            title=title or f"response log-probs (total {self.total:.3f})", y_title="log-prob")

    def to_frame(self) -> pd.DataFrame:
        """One row per response token: ``position``, ``token_id``, ``token``, ``logprob``."""
        import pandas as pd

        return pd.DataFrame({"position": list(self.positions), "token_id": [int(t) for t in self.token_ids],
                             "token": list(self.tokens), "logprob": [float(x) for x in self.logprobs]},
                            columns=["position", "token_id", "token", "logprob"])


def token_logprobs(model: Model, prompts: Sequence[str], responses: Sequence[str], chat: bool = True,
                   system: str | None = None, batch_size: int = 16) -> list[TokenLogprobs]:
    """Log-prob of every response token given the formatted prompt and the response tokens before it."""
    _, encs = prepare(model, prompts, chat=chat, responses=responses, system=system)
    out: list[TokenLogprobs] = []
    for k0 in range(0, len(encs), batch_size):
        chunk = encs[k0:k0 + batch_size]
        b = batches(model, chunk, batch_size)[0]
        lg = forward(model, b, logits="all")
        assert lg is not None
        T = lg.shape[1]
        for r, e in enumerate(chunk):
            pos = list(range(max(e.response_start, 1), len(e.ids)))
            off = T - len(e.ids)
            ids = torch.tensor([e.ids[p] for p in pos], dtype=torch.long)
            rows = lg[r, [off + p - 1 for p in pos]].log_softmax(-1).cpu()
            lp = rows.gather(-1, ids[:, None])[:, 0] if pos else torch.zeros(0)
            toks = model.tokenizer.convert_ids_to_tokens(ids.tolist()) if pos else []
            out.append(TokenLogprobs(lp, ids, list(toks), pos))
    return out


__all__ = ["TokenLogprobs", "logits", "token_logprobs"]
