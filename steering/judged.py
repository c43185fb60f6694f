"""Generate, judge, rate: the one path from prompts (under any edits) to a :class:`~interp.evals.rates.Rate`.

Every study that validates an edit by generation (refusal removed, refusal induced, a behaviour steered) asks the
same question: of these prompts' greedy answers under these edits, how many does the judge flag? This is that
question, answered once: :func:`steering.generate` then the judge (``None``: the anchored refusal judge), returning
the count, the sample size and the Wilson interval, with the answers and verdicts kept on the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from interp.evals.judge import Judge, judge_many
from interp.evals.rates import Rate, rate
from interp.models import Model
from interp.values import Prompts, Runtime
from steering.generation import generate


def generate_and_judge(model: Model, prompts: Prompts | Sequence[str], *interventions: Any, judge: Judge | None = None,
                       max_new_tokens: int = 64, runtime: Runtime | None = None, **generate_kwargs: Any) -> Rate:
    """The :class:`Rate` of ``judge`` verdicts on ``model``'s greedy answers to ``prompts`` (a list or
    :class:`interp.Prompts`) with ``interventions`` applied, run at ``runtime`` (default: no progress bar);
    other keywords go to :func:`steering.generate`. ``.texts`` and ``.flags`` hold the answers and verdicts in
    prompt order."""
    g = generate(model, prompts, *interventions, max_new_tokens=max_new_tokens,
                 runtime=runtime or Runtime(progress=False), **generate_kwargs)
    return rate(judge_many(judge, g.texts), g.texts)


__all__ = ["generate_and_judge"]
