"""The logit lens: a residual site read through the model's own final norm and unembedding.

Each layer's residual gets the final norm with its own scale (as TransformerLens's
``accumulated_resid(apply_ln=True)`` then ``unembed``), then the unembedding and any final logit soft-capping
(Gemma 2) exactly as the model applies them. Residuals come from :func:`interp.capture`; only top-k tokens,
target log-probs, KL to the final distribution and entropy are kept per layer x position (full log-probs on
request).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float

from interp.capturing import capture
from interp.look.lens_result import LogitLens
from interp.models import Model
from interp.positions import Positions
from interp.sites import Site, expand_sites, resolve_layers
from interp.values import Prompts, Runtime
from interp.weights import token_id, unembed_module

RESIDUAL_KINDS = ("resid_pre", "resid_mid", "resid_post")
FINAL_SITE = "ln_final.hook_out"  # the final norm's output: unembedded, it is the model's own logits
CHUNK = 256  # token rows unembedded at once ([CHUNK, vocab] float32 per row of the grid)


def unembed(model: Model, normed: Float[torch.Tensor, "... d"]) -> Float[torch.Tensor, "... V"]:
    """Logits from the final norm's output ``[..., d]`` -> ``[..., V]`` (float32 or wider): the unembedding with its bias and
    the final soft-capping (``final_logit_softcapping``, Gemma 2) as the model's forward applies them."""
    head = unembed_module(model)
    bias = getattr(head, "bias", None)
    x = normed.to(device=head.weight.device, dtype=head.weight.dtype)
    logits = F.linear(x, head.weight.detach(), None if bias is None else bias.detach())
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32, or float64 for a float64 model
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def readout(model: Model, resid: Float[torch.Tensor, "... d"]) -> Float[torch.Tensor, "... V"]:
    """The lens: final norm (each row with its own scale) then :func:`unembed`; differentiable in ``resid`` and
    never in the model's weights (they are read detached, so nothing accumulates in their ``.grad``)."""
    norm = model.module(model.spec.final_norm)
    params = {k: v.detach() for k, v in norm.named_parameters()}
    x = resid.to(device=model.device, dtype=model.dtype)
    return unembed(model, torch.func.functional_call(norm, params, (x,)))


def lens_sites(model: Model, sites: Any, layers: Any = None) -> list[Site]:
    """Residual sites only (``resid_pre`` / ``resid_mid`` / ``resid_post``, every layer unless ``layers``);
    another site is refused with the reason."""
    if layers is not None:
        layers = resolve_layers(layers, model.n_layers, what="logit_lens")
    try:
        out = expand_sites(sites, model.n_layers, layers)
    except ValueError as e:
        raise ValueError(f"logit_lens: {e}") from None
    bad = sorted({s.kind for s in out if s.kind not in RESIDUAL_KINDS})
    if bad:
        raise ValueError(f"logit_lens reads the residual stream only; {bad} is not a residual site (the final norm "
                         f"and unembedding read a d_model residual, not a head's or neuron's output): use one of "
                         f"{RESIDUAL_KINDS}, e.g. 'resid_post' (every layer) or 'resid_post.3'")
    if any(s.kind == "resid_mid" for s in out) and model.spec.resid_mid_in is None:
        raise ValueError(f"{model.spec.family} has a parallel residual (no resid_mid); use resid_pre or resid_post")
    return out


def target_ids(model: Model, targets: Sequence[str | int] | str | int | None) -> tuple[list[str], list[int]]:
    """Target tokens as ``(labels, ids)``: ids as they are, strings that are one vocabulary token (``" Paris"``)."""
    if targets is None:
        return [], []
    items = [targets] if isinstance(targets, (str, int)) else list(targets)
    tok, vocab = model.tokenizer, model.config.vocab_size
    labels, ids = [], []
    for t in items:
        if not isinstance(t, (str, int)) or isinstance(t, bool):
            raise TypeError(f"targets must be token strings or ids, got {type(t).__name__}")
        ids.append(token_id(tok, t, vocab))  # one token, or the error naming its pieces
        labels.append(t if isinstance(t, str) else tok.convert_ids_to_tokens(t) if tok is not None else str(t))
    return labels, ids


def _grid(model: Model, prompts: Any, sites: list[Site], pos: Positions, runtime: Runtime | None
          ) -> tuple[torch.Tensor, torch.Tensor, list[list[str]]]:
    """Captured residuals ``[n, S + 1, P, d]`` (the final norm's output last), the real-position mask ``[n, P]``
    and each position's input token (``""`` at padding)."""
    if pos.rule not in ("last", "all"):
        raise ValueError(f"logit_lens positions must be 'last' or 'all' (a lens reads single tokens, not means), "
                         f"got {pos.rule!r}")
    given = prompts if isinstance(prompts, Prompts) else Prompts.of(prompts)
    acts = capture(model, given, [s.name for s in sites] + [FINAL_SITE], positions=pos, runtime=runtime)
    t = acts.tensor if acts.has_positions else acts.tensor[:, :, None]
    n, P = t.shape[0], t.shape[2]
    mask = acts.mask.bool() if acts.has_positions and acts.mask is not None else torch.ones(n, P, dtype=torch.bool)
    _, encs = given.encode(model)
    tokens = []
    for e in encs:
        last = pos.rule == "last"
        ids = list(e.ids)[:e.response_start] if last and e.response_start else list(e.ids)
        strs = model.tokenizer.convert_ids_to_tokens(ids) if model.tokenizer is not None else [str(i) for i in ids]
        tokens.append([strs[-1]] if last else [""] * (P - len(strs)) + list(strs))
    return t, mask, tokens


def _stats(logp: torch.Tensor, final: torch.Tensor, k: int, tids: torch.Tensor) -> list[torch.Tensor]:
    """``[top ids, top probs, target log-probs, KL(final || lens), entropy]`` of log-probs ``[N, V]``."""
    top = logp.topk(k, dim=-1)
    p = logp.exp()
    kl = (final.exp() * (final - logp)).sum(-1)
    ent = -(p * logp).sum(-1)
    return [top.indices, top.values.exp(), logp[:, tids], kl.clamp(min=0), ent]


def logit_lens(model: Model, prompts: Prompts | Sequence[str], sites: Any = "resid_post",
               positions: Positions | str = "last", *, layers: Any = None,
               targets: Sequence[str | int] | str | int | None = None, k: int = 5, lens: Any = None,
               keep_logprobs: bool = False, runtime: Runtime | None = None) -> LogitLens:
    """What each residual site would predict: ``[n_prompts, n_sites + 1 (the model's output), n_positions]`` grids
    of top-``k`` tokens and probabilities, ``targets``' log-probs, KL(final || lens) and entropy.

    ``lens``: a :class:`~interp.look.tuned_lens.TunedLens` (its translators first) or ``None`` (the logit lens).
    ``keep_logprobs``: also keep the full ``[n, S + 1, P, vocab]`` log-probs (memory: vocab floats per cell)."""
    if not (isinstance(k, int) and 1 <= k <= model.config.vocab_size):
        raise ValueError(f"k must be an int in 1..{model.config.vocab_size}, got {k!r}")
    site_list = lens_sites(model, sites, layers)
    if lens is not None:
        lens.check(model, [s.name for s in site_list])
    labels, ids = target_ids(model, targets)
    pos = Positions.of(positions)
    t, mask, tokens = _grid(model, prompts, site_list, pos, runtime)
    n, S1, P, _ = t.shape
    rows = mask.reshape(-1).nonzero()[:, 0]
    flat = t.permute(0, 2, 1, 3).reshape(n * P, S1, -1)
    tids = torch.tensor(ids, dtype=torch.long)
    out = _run_grid(model, flat, rows, site_list, lens, k, tids, keep_logprobs)
    grids = [o.reshape(n, P, S1, *o.shape[2:]).transpose(1, 2) for o in out]
    names = [s.name for s in site_list] + [FINAL_SITE]
    seen = {int(i) for i in grids[0].unique()}
    vocab = {str(i): s for i, s in zip(sorted(seen), model.tokenizer.convert_ids_to_tokens(sorted(seen)))} \
        if model.tokenizer is not None else {str(i): str(i) for i in seen}
    return LogitLens(model_id=model.name, lens="logit" if lens is None else "tuned", sites=names,
                     layers=[s.layer for s in site_list] + [model.n_layers], positions=str(pos.rule),
                     tokens=tokens, mask=mask, top_ids=grids[0], top_probs=grids[1], vocab=vocab, targets=labels,
                     target_ids=tids, target_logprobs=grids[2], kl=grids[3], entropy=grids[4],
                     logprobs=grids[5] if keep_logprobs else None)


def _run_grid(model: Model, flat: torch.Tensor, rows: torch.Tensor, sites: list[Site], lens: Any, k: int,
              tids: torch.Tensor, keep: bool) -> list[torch.Tensor]:
    """The statistics for every real row of ``flat [N, S + 1, d]``, chunk by chunk; padding rows stay empty
    (ids 0, probabilities and KL ``nan``)."""
    N, S1, _ = flat.shape
    V = model.config.vocab_size
    shapes = [(k,), (k,), (len(tids),), (), ()] + ([(V,)] if keep else [])
    wide = torch.promote_types(model.dtype, torch.float32)
    out = [torch.full((N, S1, *sh), float("nan"), dtype=wide if j == 5 else torch.float32)
           for j, sh in enumerate(shapes)]
    out[0] = torch.zeros(N, S1, k, dtype=torch.long)
    with torch.inference_mode():
        for c in range(0, len(rows), CHUNK):
            r = rows[c:c + CHUNK]
            final = unembed(model, flat[r, -1]).log_softmax(-1)
            for j in range(S1):
                if j == S1 - 1:
                    logp = final
                else:
                    h = flat[r, j] if lens is None else lens.translate(sites[j].name, flat[r, j])
                    logp = readout(model, h).log_softmax(-1)
                vals = _stats(logp, final, k, tids.to(logp.device)) + ([logp] if keep else [])
                for o, v in zip(out, vals):
                    o[r, j] = v.cpu().to(o.dtype)
    return out


__all__ = ["FINAL_SITE", "RESIDUAL_KINDS", "logit_lens", "readout", "target_ids", "unembed"]
