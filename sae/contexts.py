"""Top-activating contexts of a latent, rendered as an HTML snippet with per-token highlighting."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from interp.values import Prompts, moved_keywords
from sae.model import SAE
from sae.runner import MOVED as FORMAT_MOVED

MOVED = {**FORMAT_MOVED, "before": "window=(before, after)", "after": "window=(before, after)"}


@dataclass
class Context:
    """A window of ``tokens`` around the token where the latent peaked (``peak`` indexes ``tokens``)."""

    prompt: int
    position: int
    tokens: list[str]
    acts: list[float]
    peak: int
    max_act: float


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Readable text of each token (``decode`` one id at a time; ids as text without a tokenizer)."""
    if tokenizer is None:
        return [f"<{int(i)}>" for i in ids]
    return [tokenizer.decode([int(i)]) for i in ids]


def pieces(tok: Any, ids: Sequence[int]) -> list[str]:
    """Each token's text such that the pieces join to the decoded window (the spaces a word-level tokenizer puts
    between tokens kept); a token whose text is not a suffix extension falls back to decoding it alone. A character
    that a byte-level tokenizer splits over several tokens (CJK, accents, emoji) is the piece of the token that
    completes it (the tokens before get ``""``), not a run of ``"\ufffd"``."""
    if tok is None:
        return token_strings(tok, ids)
    out, prev = [], ""
    for k in range(len(ids)):
        text = tok.decode([int(i) for i in ids[:k + 1]])
        if k < len(ids) - 1:
            text = text.rstrip("\ufffd")  # an unfinished character waits for the token that completes it
        out.append(text[len(prev):] if text.startswith(prev) else tok.decode([int(ids[k])]))
        prev = text
    return out


def whole_characters(tok: Any, ids: Sequence[int], lo: int, hi: int, limit: int = 4) -> tuple[int, int]:
    """``(lo, hi)`` widened by at most ``limit`` tokens each way so that ``ids[lo:hi]`` does not cut a character
    that a byte-level tokenizer split over several tokens (a cut one decodes to ``"\ufffd"`` at the edge)."""
    if tok is None:
        return lo, hi
    ids = [int(i) for i in ids]
    for _ in range(limit):
        if not (hi < len(ids) and tok.decode(ids[lo:hi]).endswith("\ufffd")):
            break
        hi += 1
    for _ in range(limit):
        if not (lo > 0 and tok.decode(ids[lo:hi]).startswith("\ufffd")):
            break
        lo -= 1
    return lo, hi


def window_context(tok: Any, ids: torch.Tensor, acts: torch.Tensor, prompt: int, pos: int,
                   window: tuple[int, int]) -> Context:
    """The :class:`Context` of prompt ``prompt`` (token ``ids [T]``, one latent's ``acts [T]``) around token
    ``pos``: ``window = (tokens before, tokens after)``, widened to whole characters (:func:`whole_characters`),
    each token's text from :func:`pieces`."""
    before, after = window
    lo, hi = whole_characters(tok, ids.tolist(), max(0, pos - before), min(len(ids), pos + after + 1))
    a = acts[lo:hi]
    return Context(prompt=prompt, position=pos, tokens=pieces(tok, ids[lo:hi].tolist()), acts=a.tolist(),
                   peak=pos - lo, max_act=float(a.max()) if a.numel() else 0.0)


@moved_keywords(MOVED)
def top_contexts(model: Any, sae: SAE, latent: int, inputs: Prompts | Sequence[str] | torch.Tensor, top: int = 10,
                 window: tuple[int, int] = (12, 4), batch_size: int = 8, site: str | None = None) -> list[Context]:
    """The ``top`` prompts (:func:`sae.runner.sae_encodings`) where ``latent`` fires hardest (one context per
    prompt, at its peak token, with ``window = (tokens before, tokens after)``)."""
    from sae.analysis import latent_acts_on_prompts

    if not 0 <= latent < sae.d_sae:
        raise ValueError(f"latent {latent} is out of range; this SAE has latents 0..{sae.d_sae - 1}")
    per = latent_acts_on_prompts(model, sae, inputs, [latent], batch_size=batch_size, site=site)
    peaks = [(float(p["acts"][:, 0].max()), i, int(p["acts"][:, 0].argmax())) for i, p in enumerate(per)
             if p["acts"].numel()]
    peaks.sort(key=lambda t: -t[0])
    out: list[Context] = []
    for val, i, pos in peaks[:top]:
        if val <= 0:
            break
        out.append(window_context(model.tokenizer, per[i]["ids"], per[i]["acts"][:, 0], i, pos, window))
    return out


def contexts_html(contexts: Sequence[Context], latent: int | None = None, scale: float | None = None,
                  title: str | None = None) -> str:
    """An HTML snippet: one line per context, each token shaded by the latent's activation (hover: value).

    ``scale``: the activation drawn at full colour (default: the largest shown)."""
    from interp.viz.tokens import heat_text

    head = title or (f"Latent {latent}: top {len(contexts)} contexts" if latent is not None else "Top contexts")
    if not contexts:
        return (f'<div class="sae-contexts"><div style="font-weight:bold">{html.escape(head)}</div>\n'
                f'<div class="sae-ctx"><i>the latent never fired on these prompts</i></div>\n</div>')
    body = heat_text([c.tokens for c in contexts], [c.acts for c in contexts], title=head,
                     prefixes=[f"[{c.max_act:.2f}]" for c in contexts], marks=[c.peak for c in contexts],
                     scale=scale, line_class="sae-ctx")
    return f'<div class="sae-contexts">{body}</div>'
