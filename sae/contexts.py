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


@moved_keywords(MOVED)
def top_contexts(model: Any, sae: SAE, latent: int, inputs: Prompts | Sequence[str] | torch.Tensor, top: int = 10,
                 window: tuple[int, int] = (12, 4), batch_size: int = 8, site: str | None = None) -> list[Context]:
    """The ``top`` prompts (:func:`sae.runner.sae_encodings`) where ``latent`` fires hardest (one context per
    prompt, at its peak token, with ``window = (tokens before, tokens after)``)."""
    before, after = window
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
        ids, acts = per[i]["ids"], per[i]["acts"][:, 0]
        lo, hi = max(0, pos - before), min(len(ids), pos + after + 1)
        out.append(Context(prompt=i, position=pos, tokens=token_strings(model.tokenizer, ids[lo:hi].tolist()),
                           acts=acts[lo:hi].tolist(), peak=pos - lo, max_act=val))
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
