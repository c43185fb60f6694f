"""The value types every call takes instead of threaded flags: what is read (:class:`Prompts`) and how it runs
(:class:`Runtime`).

A researcher chooses prompts, sites, positions and edits; batch size, seed and progress bars are how a call runs,
and chat formatting, system prompts, responses and labels belong to the prompts themselves. Passing them as one
value each keeps public signatures short and gives every function the same defaults:

    prompts = interp.Prompts(texts, chat=False)             # one default for chat: True (the template, if any)
    run = interp.Runtime(batch_size=32, progress=False)
    acts = interp.capture(model, prompts, "resid_post", "last", runtime=run)

A plain list of strings is accepted wherever :class:`Prompts` is (``Prompts.of``), with the defaults.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch


def _tuple(x: Sequence[Any] | None, what: str, n: int | None = None) -> tuple[Any, ...] | None:
    if x is None:
        return None
    if isinstance(x, str):
        raise TypeError(f"{what} must be a list, not a single string; wrap it in a list")
    out = tuple(x)
    if n is not None and len(out) != n:
        raise ValueError(f"{len(out)} {what} for {n} prompts: give one per prompt")
    return out


@dataclass(frozen=True)
class Prompts:
    """Prompt texts with what travels with them: ``responses`` (teacher-forced answers), the chat formatting
    (``chat``: the model's chat template, if it has one; ``system``: a system prompt), ``labels`` and ``ids`` (one
    per prompt). Encoded once per model (:meth:`encode`)."""

    texts: tuple[str, ...]
    responses: tuple[str, ...] | None = None
    chat: bool = True
    system: str | None = None
    labels: tuple[Any, ...] | None = None
    ids: tuple[str, ...] | None = None
    _encoded: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        texts = _tuple(self.texts, "prompts")
        if not all(isinstance(t, str) for t in texts):
            raise TypeError(f"prompts must be strings, got {type(next(t for t in texts if not isinstance(t, str)))}")
        object.__setattr__(self, "texts", texts)
        n = len(texts)
        for name in ("responses", "labels", "ids"):
            object.__setattr__(self, name, _tuple(getattr(self, name), name, n))
        if not isinstance(self.chat, bool):
            raise TypeError(f"chat must be True or False, got {self.chat!r}")

    @classmethod
    def of(cls, prompts: Prompts | Sequence[str], **options: Any) -> Prompts:
        """``prompts`` as :class:`Prompts`: a list of strings with ``options`` (``chat=``, ``system=``, ...), or a
        :class:`Prompts` as it is (with ``options`` applied on top, as :func:`dataclasses.replace`)."""
        options = {k: v for k, v in options.items() if v is not None}  # None: not given
        if isinstance(prompts, Prompts):
            return replace(prompts, **options) if options else prompts
        return cls(tuple(_tuple(prompts, "prompts")), **options)

    def __len__(self) -> int:
        return len(self.texts)

    def __iter__(self):
        return iter(self.texts)

    def encode(self, model: Any) -> tuple[list[str], list[Any]]:
        """``(formatted texts, encodings)`` for ``model`` (:func:`interp.forward.prepare`), computed once per
        tokenizer and kept on this value."""
        from interp.forward import prepare

        tok = model.tokenizer
        held = self._encoded.get(id(tok))
        if held is None or held[0] is not tok:  # the tokenizer itself is kept, so a recycled id cannot match
            held = (tok, prepare(model, list(self.texts), chat=self.chat, responses=self.responses,
                                 system=self.system))
            self._encoded[id(tok)] = held
        return held[1]


@dataclass(frozen=True)
class Runtime:
    """How a call runs, not what it computes: ``batch_size`` prompts per forward, the ``seed`` of anything random,
    a ``progress`` bar, the ``dtype`` results are kept in, and for captures ``sort_by_length`` (fewer pad tokens)
    and ``distributed`` (split batches over torchrun ranks; ``None``: when launched by torchrun)."""

    batch_size: int = 16
    seed: int = 0
    progress: bool = True
    dtype: torch.dtype = torch.float32
    sort_by_length: bool = False
    distributed: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {self.batch_size!r}")

    @classmethod
    def of(cls, runtime: Runtime | None, **options: Any) -> Runtime:
        """``runtime`` (default: ``Runtime()``) with ``options`` that are not ``None`` set on top."""
        base = runtime if runtime is not None else cls()
        given = {k: v for k, v in options.items() if v is not None}
        return replace(base, **given) if given else base


def refuse_moved(kwargs: dict[str, Any], moved: dict[str, str], where: str) -> None:
    """The one check of keywords a signature no longer takes: a ``TypeError`` naming, for each keyword of ``kwargs``
    in ``moved`` (old keyword -> where it went, e.g. ``"runtime=interp.Runtime(batch_size=...)"``), its
    replacement, instead of Python's bare "unexpected keyword" (or, through ``**kwargs``, a silent pass-on)."""
    old = [k for k in kwargs if k in moved]
    if old:
        raise TypeError(f"{where} no longer takes " + "; ".join(f"{k}= (moved into {moved[k]})" for k in old))


def moved_keywords(moved: dict[str, str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator applying :func:`refuse_moved` to every call of the function."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            refuse_moved(kwargs, moved, f"{fn.__name__}()")
            return fn(*args, **kwargs)
        return call
    return wrap


__all__ = ["Prompts", "Runtime"]
