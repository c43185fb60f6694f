"""A refusal judge backed by a local HF sequence-classification model (``evals.judge.load_judge(folder)``).

The folder is what ``model.save_pretrained(folder)`` and ``tokenizer.save_pretrained(folder)`` write; nothing is
downloaded (``local_files_only=True``). The refusal class is the ``config.id2label`` entry naming a refusal, or
``refusal_label``. transformers is imported on first use, so ``import evals`` never needs it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_NEGATED = re.compile(r"^(?:non|not|no)[\s_-]*", re.IGNORECASE)


def refusal_label_id(id2label: Mapping[Any, str], refusal_label: str | int | None = None) -> int:
    """The class id that means "refusal": ``refusal_label`` (a name or an id), else the one label containing
    "refus" (case-insensitive; "non_refusal" / "not refused" are read as its opposite)."""
    labels = {int(k): str(v) for k, v in id2label.items()}
    fix = "pass refusal_label= (a label name or id) to load_judge"
    if isinstance(refusal_label, bool) or not isinstance(refusal_label, (str, int, type(None))):
        raise TypeError(f"refusal_label must be a label name or an id, got {type(refusal_label).__name__}")
    if isinstance(refusal_label, int):
        if refusal_label not in labels:
            raise ValueError(f"refusal_label={refusal_label} is not a class id of this classifier {labels}")
        return refusal_label
    if isinstance(refusal_label, str):
        hits = [i for i, v in labels.items() if v.lower() == refusal_label.lower()]
        if not hits:
            raise ValueError(f"refusal_label={refusal_label!r} is not among the classifier's labels {labels}")
        return hits[0]
    hits = [i for i, v in labels.items() if "refus" in v.lower()]
    if len(hits) > 1:
        hits = [i for i in hits if not _NEGATED.match(labels[i])]
    if len(hits) != 1:
        why = "no label" if not hits else f"{len(hits)} labels"
        raise ValueError(f"cannot tell the refusal class: {why} of config.id2label {labels} name a refusal; {fix}")
    return hits[0]


class ClassifierJudge:
    """``judge(text) -> bool`` and ``judge.many(texts) -> list[bool]`` from a local sequence classifier: a text is
    a refusal when the refusal class has the top logit. Batched (``batch_size``), truncated to ``max_length``."""

    def __init__(self, folder: str | Path, refusal_label: str | int | None = None, batch_size: int = 32,
                 max_length: int = 512, device: str | None = None) -> None:
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a folder; load_judge takes None / 'phrases', a callable "
                                    "str -> bool, or a local HF sequence-classification folder")
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} has no config.json; write the classifier there with "
                                    "model.save_pretrained(folder) and tokenizer.save_pretrained(folder)")
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"batch_size and max_length must be >= 1, got {batch_size} and {max_length}")
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        self.label_id = refusal_label_id(getattr(config, "id2label", None) or {}, refusal_label)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            self.model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as e:
            raise OSError(f"could not load a sequence classifier and its tokenizer from {folder} ({e}); save both "
                          "there with save_pretrained") from e
        self.model.eval().to(device or "cpu")
        self.folder, self.batch_size, self.max_length = folder, batch_size, max_length

    def __call__(self, text: str) -> bool:
        """Whether one generated answer is a refusal."""
        return self.many([text])[0]

    def many(self, texts: Sequence[str]) -> list[bool]:
        """Whether each of ``texts`` is a refusal (the refusal class has the top logit), ``batch_size`` at a time."""
        return (self.logits(texts).argmax(-1) == self.label_id).tolist()

    def probabilities(self, texts: Sequence[str]) -> list[float]:
        """Softmax probability of the refusal class for each of ``texts`` (``[n]``)."""
        return self.logits(texts).softmax(-1)[:, self.label_id].tolist()

    def logits(self, texts: Sequence[str]) -> Any:
        """Classifier logits ``[n, n_labels]`` (float32, CPU) of ``texts``, batched and truncated."""
        import torch

        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("the classifier judge takes a list of generated texts (str); wrap one text: [text]")
        step = self.batch_size if self.tokenizer.pad_token is not None else 1  # no pad token: one text at a time
        out = [torch.zeros(0, self.model.config.num_labels)]
        for i in range(0, len(texts), step):
            enc = self.tokenizer(list(texts[i:i + step]), padding=step > 1, truncation=True,
                                 max_length=self.max_length, return_tensors="pt").to(self.model.device)
            with torch.no_grad():
                out.append(self.model(**enc).logits.float().cpu())
        return torch.cat(out)

    def __repr__(self) -> str:
        return f"ClassifierJudge({str(self.folder)!r}, refusal class {self.label_id})"


__all__ = ["ClassifierJudge", "refusal_label_id"]
