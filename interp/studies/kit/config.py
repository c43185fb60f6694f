"""The refusal job's settings: four small configs (data, selection, generation, runtime) and their sum.

Each stage is keyed on the fields that change its result only (see :func:`stage_key`), so changing a
selection threshold on a finished run re-runs selection and nothing that it does not feed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from interp.io import content_hash

DEFAULT_REFUSAL_MODEL = "smollm2-aligned"  # the realistic organism: a real result by default (toy: "organism")


@dataclass
class DataConfig:
    """Which prompts: files (``None``: the project's own sets, see :func:`load_refusal_data`), their columns,
    split sizes, the over-refusal (borderline-benign) set, seed."""

    harmful: str | None = None
    harmless: str | None = None
    column: str | None = None
    harmless_column: str | None = None
    n_train: int = 64
    n_val: int = 32
    n_test: int = 64
    seed: int = 0
    borderline: str | None = None
    borderline_column: str | None = None
    n_borderline: int = 64


SEARCHES = ("estimate", "exhaustive")
KL_REFERENCES = ("absolute", "random")  # the KL filter: the fixed threshold (the paper), or calibrated by random ablations
ABLATE_POSITIONS = ("all", "post_instruction")  # where an ablation acts (the edits themselves)
# the job's setting adds "auto": the paper's every-token ablation first, the post-instruction one only when no
# every-token candidate passes the filters (said in the notes); see SelectionConfig
ABLATE_SETTINGS = ("auto",) + ABLATE_POSITIONS
RANDOM_KL = 4     # random unit directions whose ablation KL is the level the KL filter is read against


@dataclass
class SelectionConfig:
    """Which candidates exist (``layers``; ``None``: all), the paper's filters that pick one of them, and the
    diagnosis before any scoring: refusal tokens only from at least ``min_refusals`` refusals, and a stop
    unless harmful train prompts are refused more often than harmless ones (one-sided Fisher exact test,
    p < ``diagnosis_alpha``). How the candidates
    are searched: ``"estimate"`` (attribution estimates of all: first order, plus the refusal score's curvature in the
    logits for bypass; the ``top_k`` scored exactly) or
    ``"exhaustive"`` (every candidate scored exactly). Where a candidate is ablated (scoring, evaluation,
    writers, subspaces): ``ablate_positions="all"`` tokens (the paper; bakeable into weights),
    ``"post_instruction"``: the prompt's post-instruction tokens and every generated token (hooks only), or
    ``"auto"`` (the default): every token first and, only when no every-token candidate passes the filters, the
    post-instruction ablation, which the notes, ``metrics.json`` and the report then state (the every-token
    search's outcome included). The KL filter: ``kl_reference="absolute"`` keeps candidates whose ablation KL is
    below ``kl_threshold`` (the paper); ``"random"`` below the larger of ``kl_threshold`` and the highest KL of the
    seeded random unit directions ablated the same way (``Scores.kl_random``): no costlier than ablating a random
    direction, for a model on which any ablation costs about the paper's threshold (stated as a relaxed filter;
    the estimate search then ranks by induce and bypass only, the cut being known after exact scoring).
    ``n_random``: the random unit directions of that reference (seeded by the data seed); ``max_rows``: rows
    (prompts x candidates) per scoring forward (memory; and the conditions stacked per judged generation)."""

    layers: list[int] | None = None
    kl_threshold: float = 0.1
    prune_layer_fraction: float = 0.2
    induce_threshold: float = 0.0
    min_refusals: int = 8
    diagnosis_alpha: float = 0.01
    search: str = "estimate"
    top_k: int = 8
    ablate_positions: str = "auto"
    kl_reference: str = "absolute"
    n_random: int = RANDOM_KL
    max_rows: int = 256

    def __post_init__(self) -> None:
        if self.n_random < 0 or self.max_rows < 1:
            raise ValueError(f"n_random must be >= 0 and max_rows >= 1, got {self.n_random} and {self.max_rows}")
        if self.kl_reference not in KL_REFERENCES:
            raise ValueError(f"kl_reference must be one of {KL_REFERENCES} (the fixed KL threshold, or the larger of it "
                             f"and the KL of random directions ablated the same way), got {self.kl_reference!r}")
        if self.ablate_positions not in ABLATE_SETTINGS:
            raise ValueError(f"ablate_positions must be one of {ABLATE_SETTINGS} (every token, as in the paper; the "
                             f"post-instruction tokens and every generated one; or 'auto': every token first, the "
                             f"post-instruction tokens when no every-token candidate passes), got "
                             f"{self.ablate_positions!r}")
        if self.search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got {self.search!r}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 (candidates scored exactly in search='estimate'), got {self.top_k}")

    def modes(self) -> tuple[str, ...]:
        """The ablation positions the search tries, in order (``auto``: every token, then post-instruction)."""
        return ABLATE_POSITIONS if self.ablate_positions == "auto" else (self.ablate_positions,)

    def ablate_at(self) -> str:
        """Where one stage ablates: ``ablate_positions``, or for ``"auto"`` its first mode, every token (the job
        passes the mode its search ended in)."""
        return self.modes()[0]


@dataclass
class GenerationConfig:
    """Generation for the judge: response length, and the largest per-category subspace to ablate."""

    max_new_tokens: int = 24
    subspace_rank: int = 8


@dataclass
class RuntimeConfig:
    """Which model and how to run it: name, dtype, device, batch size, whether to save the baked model, and the
    refusal judge (``None``: the anchored phrase judge; a local classifier model folder; see ``evals.judge``). and the torch
    threads for the run (``None``: torch's default)."""

    model: str = DEFAULT_REFUSAL_MODEL
    dtype: str | None = None
    device: str | None = None
    batch_size: int = 64
    save_model: bool = False
    judge: str | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 (or None: torch's default), got {self.threads}")


SECTIONS = {"data": DataConfig, "selection": SelectionConfig, "generation": GenerationConfig, "runtime": RuntimeConfig}
# changing these on a finished run re-runs selection (and what depends on its result); anything else is a new run
RESELECT_FIELDS = ("kl_threshold", "prune_layer_fraction", "induce_threshold", "diagnosis_alpha", "kl_reference")
DEFAULTS = {"kl_threshold": 0.1, "prune_layer_fraction": 0.2, "induce_threshold": 0.0}  # the paper's filters
# neither makes another run: the stage keys decide what a change re-runs (search: the exact scores; threads: nothing)
# (n_random: the scores' key holds it)
SAME_RUN_FIELDS = RESELECT_FIELDS + ("search", "top_k", "save_model", "threads", "ablate_positions", "n_random")


@dataclass
class RefusalConfig:
    """The whole job's settings, one small config per concern."""

    data: DataConfig = field(default_factory=DataConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        if self.runtime.save_model and self.selection.ablate_positions == "post_instruction":
            raise ValueError("save_model bakes the ablation into the weights, which act on every token alike, but "
                             "ablate_positions='post_instruction' ablates some tokens only: use ablate_positions='all' "
                             "(--ablate-positions all) or 'auto' (saves the model when the every-token search "
                             "finds a direction) to save a baked model, or drop save_model")

    @classmethod
    def from_flat(cls, **flat: Any) -> RefusalConfig:
        """Build from flat names (the CLI flags: ``model=``, ``n_train=``, ``induce_threshold=``, ...)."""
        parts: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        owner = {f.name: name for name, c in SECTIONS.items() for f in fields(c)}
        for k, v in flat.items():
            if k not in owner:
                raise TypeError(f"unknown refusal setting {k!r}; known: {', '.join(sorted(owner))}")
            parts[owner[k]][k] = v
        return cls(**{name: SECTIONS[name](**kw) for name, kw in parts.items()})

    def flat(self) -> dict[str, Any]:
        """All settings as one flat dict (the run folder's ``run.json``)."""
        return {k: v for part in (self.data, self.selection, self.generation, self.runtime) for k, v in asdict(part).items()}

    def run_identity(self) -> str:
        """Hash of everything that makes a run another run (all but ``SAME_RUN_FIELDS``)."""
        flat = self.flat()
        return stage_key("run", {k: v for k, v in flat.items() if k not in SAME_RUN_FIELDS})


def stage_key(name: str, inputs: dict[str, Any]) -> str:
    """A stage's cache key: its name, its inputs (settings, data digests, upstream keys), the package version."""
    import interp

    return content_hash({"stage": name, "version": interp.__version__, "inputs": inputs})


__all__ = ["DEFAULT_REFUSAL_MODEL", "DataConfig", "GenerationConfig", "RefusalConfig", "RuntimeConfig", "SelectionConfig", "stage_key"]
