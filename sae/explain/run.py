"""Explain and score latents, resumably: each explanation and each scorer's verdicts are written atomically to a
folder as they come; a re-run skips what is there and refuses a folder written for another SAE, model, prompt
set, latent list or configuration.

The control of every score is the same scorer, same examples in the same order, with a shuffled explanation:
latent ``i`` is scored with the explanation of ``control_of[i]``, a seeded derangement of the latents (no latent
keeps its own).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from interp.io import content_hash, read_json, write_json
from sae.explain.client import ChatClient
from sae.explain.examples import ExplainConfig, LatentExamples, latent_examples
from sae.explain.explainer import Explanation, explain
from sae.explain.result import LatentExplanations
from sae.explain.scorers import SCORERS, Verdicts, score

MANIFEST = "manifest.json"


def shuffled_assignment(latents: Sequence[int], seed: int) -> dict[int, int]:
    """``{latent: the latent whose explanation scores it in the control}``: a seeded random cyclic shift of a
    random order, so no latent gets its own (needs two latents at least)."""
    latents = [int(x) for x in latents]
    if len(latents) < 2:
        raise ValueError("the shuffled-explanation control needs at least 2 latents; explain more latents")
    order = random.Random(f"shuffle:{seed}").sample(latents, len(latents))
    return {order[i]: order[(i + 1) % len(order)] for i in range(len(order))}


def sae_hash(sae: Any) -> str:
    """A hash of the SAE's parameters (names, shapes and values)."""
    h = hashlib.sha256()
    for name, t in sorted(sae.state_dict().items()):
        t = t.detach().to("cpu", torch.float32).contiguous()
        h.update(f"{name}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def _inputs_hash(inputs: Any) -> str:
    if isinstance(inputs, torch.Tensor):
        return content_hash(inputs.tolist())
    texts = getattr(inputs, "texts", inputs)
    extra = {k: getattr(inputs, k, None) for k in ("chat", "system", "responses")}
    return content_hash({"texts": list(texts), **{k: v for k, v in extra.items() if v is not None}})


def identity(model: Any, sae: Any, latents: Sequence[int], inputs: Any, cfg: ExplainConfig,
             examples: dict[int, LatentExamples] | None = None) -> dict[str, Any]:
    """What a run folder's contents depend on, part by part (a refused resume names the part that differs).
    ``examples``: the contexts shown, hashed too, so a folder written when contexts were drawn or rendered
    otherwise (another version of this code) is refused rather than mixed with new verdicts."""
    from interp.fingerprint import weights_hash

    out = {"model_id": getattr(model, "name", ""), "model_weights": weights_hash(model), "sae": sae_hash(sae),
           "site": str(getattr(sae, "site", "") or ""), "latents": [int(x) for x in latents],
           "inputs": _inputs_hash(inputs), "config": asdict(cfg)}
    if examples is not None:
        out["examples"] = content_hash({str(lt): asdict(ex) for lt, ex in sorted(examples.items())})
    return out


def open_folder(folder: str | Path, ident: dict[str, Any]) -> Path:
    """Create ``folder`` with its manifest, or check an existing one was written for the same run."""
    p = Path(folder)
    m = p / MANIFEST
    if m.exists():
        held = read_json(m)
        ident_json = read_json_roundtrip(ident)
        differ = sorted(k for k in set(held) | set(ident_json) if held.get(k) != ident_json.get(k))
        if differ:
            raise ValueError(f"{p} holds explanations of another run (its {', '.join(differ)} differ: "
                             f"{ {k: held.get(k) for k in differ}!r:.300}); pass another folder, or delete this "
                             f"one to start over")
    elif p.exists() and any(p.iterdir()):
        raise ValueError(f"{p} exists and is not an explanation run folder (no {MANIFEST}); pass an empty or new "
                         f"folder")
    else:
        write_json(m, ident)
    return p


def read_json_roundtrip(obj: Any) -> Any:
    """``obj`` as it reads back from JSON (tuples become lists), to compare with a manifest."""
    import json

    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def _cached(path: Path | None, cls: type, make: Any, *args: Any) -> Any:
    """The ``cls`` record stored at ``path``, or ``make(*args)`` written there atomically (no folder: just made)."""
    if path is not None and path.exists():
        return cls(**read_json(path))
    obj = make(*args)
    if path is not None:
        write_json(path, asdict(obj))
    return obj


def _score_all(examples: dict[int, LatentExamples], texts: dict[int, str], control_of: dict[int, int],
               scorer: ChatClient, cfg: ExplainConfig, folder: Path | None) -> dict[str, list[Verdicts]]:
    out: dict[str, list[Verdicts]] = {}
    for kind in SCORERS:
        for suffix, whose in (("", None), ("_control", control_of)):
            out[kind + suffix] = []
            for latent, ex in examples.items():
                of = latent if whose is None else whose[latent]
                path = None if folder is None else folder / f"{kind}{suffix}_{latent}.json"
                out[kind + suffix].append(_cached(path, Verdicts, score, kind, scorer, texts[of], ex, cfg, of))
    return out


def explain_latents(model: Any, sae: Any, latents: Sequence[int], inputs: Any, explainer: ChatClient,
                    scorer: ChatClient | None = None, cfg: ExplainConfig | None = None,
                    folder: str | Path | None = None) -> LatentExplanations:
    """Explain ``latents`` of ``sae`` from their contexts in ``inputs`` (prompts or ``Prompts``) with
    ``explainer``, then score each explanation by detection and fuzzing with ``scorer`` (default: the explainer),
    and each again with a shuffled explanation as the control. ``folder``: write each step as it finishes and
    resume from it."""
    cfg = cfg or ExplainConfig()
    latents = [int(x) for x in latents]
    control_of = shuffled_assignment(latents, cfg.seed)
    scorer = scorer or explainer
    examples = latent_examples(model, sae, latents, inputs, cfg)
    path = None if folder is None else open_folder(folder, identity(model, sae, latents, inputs, cfg, examples))
    expl = [_cached(None if path is None else path / f"explanation_{lt}.json", Explanation, explain, explainer,
                    examples[lt], cfg) for lt in latents]
    texts = {e.latent: e.text for e in expl}
    scores = _score_all(examples, texts, control_of, scorer, cfg, path)
    notes = [f"latent {lt}: {n}" for lt, ex in examples.items() for n in ex.notes]
    notes += [f"latent {e.latent}: the explainer's answer had no [EXPLANATION]: line; its last line was taken"
              for e in expl if not e.found]
    return LatentExplanations(latents, expl, [control_of[lt] for lt in latents], **scores,
                              explainer=getattr(explainer, "name", ""), scorer=getattr(scorer, "name", ""),
                              model_id=getattr(model, "name", ""), site=str(getattr(sae, "site", "") or ""),
                              config=asdict(cfg), notes=notes)


__all__ = ["explain_latents", "identity", "open_folder", "sae_hash", "shuffled_assignment"]
