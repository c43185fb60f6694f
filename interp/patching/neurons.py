"""MLP neurons (site ``mlp_post``, the input of the down projection): activation contrast between two prompt
sets, ablation effects on a metric, and overlaps of neuron sets across conditions (languages, prompt sets)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from interp.bundle import Result
from interp.evals.controls import matched_random
from interp.forward import batch_of, last_logits
from interp.hooking import hooks
from interp.models import Model
from interp.patching.edits import NeuronAblation, ablation_values
from interp.patching.heads import ablation_sweep
from interp.patching.measures import Metric, call_metric, metric_name
from interp.patching.runs import CHAT_MOVED, MOVED, Prompts, patch_runtime, run_with_capture
from interp.sites import Site, parse_site, resolve_layers
from interp.values import Runtime, moved_keywords

if TYPE_CHECKING:
    import pandas as pd

Neuron = tuple[int, int]


def _check_dense(model: Model) -> int:
    if model.spec.mlp_proj is None or not model.d_mlp:
        raise ValueError(f"{model.spec.family} has mixture-of-experts MLPs; neurons live inside each expert, so "
                         f"mlp_post neuron tools do not apply (use heads, or hook the experts directly)")
    return int(model.d_mlp)


def _layers(model: Model, layers: Sequence[int] | None) -> list[int]:
    return resolve_layers(layers, model.n_layers, what="neurons", keep_order=layers is not None)


def _neurons(model: Model, neurons: Iterable[Neuron]) -> list[Neuron]:
    D = _check_dense(model)
    out = []
    for item in neurons:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"neurons are (layer, index) pairs, got {item!r}")
        layer = parse_site(Site("mlp_post", int(item[0])), model.n_layers).layer
        if not 0 <= int(item[1]) < D:
            raise ValueError(f"neuron {item[1]} is out of range; this model's MLP has neurons 0..{D - 1}")
        out.append((layer, int(item[1])))
    if not out:
        raise ValueError("no neurons given; pass [(layer, index), ...]")
    return out


@moved_keywords(CHAT_MOVED)
def neuron_acts(model: Model, prompts: Prompts, layers: Sequence[int] | None = None, positions: str = "last",
                batch_size: int = 32) -> Float[torch.Tensor, "n L D"]:
    """``mlp_post`` activations ``[n_tokens, L, d_mlp]``: one row per prompt (``last``) or per real token (``all``).
    ``prompts``: texts (a list: the chat template; ``interp.Prompts(texts, chat=False)``: raw) or a batch."""
    _check_dense(model)
    if positions not in ("last", "all"):
        raise ValueError(f"positions must be 'last' or 'all', got {positions!r}")
    batch = batch_of(model, prompts)
    layer_list = _layers(model, layers)
    sites = [Site("mlp_post", la) for la in layer_list]
    rows = []
    n = batch.input_ids.shape[0]
    for i in range(0, n, batch_size):
        sub = type(batch)(*(t[i:i + batch_size] for t in (batch.input_ids, batch.attention_mask, batch.position_ids,
                                                          batch.post_mask, batch.response_mask)))
        acts, _ = run_with_capture(model, sub, sites)
        x = torch.stack([acts[s].float().cpu() for s in sites], 2)       # [b, T, L, D]
        rows.append(x[:, -1] if positions == "last" else x[sub.attention_mask.bool()])
    return torch.cat(rows)


@dataclass
class NeuronContrast(Result):
    """Per-neuron statistics of prompt sets ``a`` and ``b``: means, standard deviations ``[L, D]``, the mean
    difference ``a - b`` and the effect size (difference over the pooled standard deviation)."""

    mean_a: torch.Tensor
    mean_b: torch.Tensor
    std_a: torch.Tensor
    std_b: torch.Tensor
    layers: list[int]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def diff(self) -> torch.Tensor:
        return self.mean_a - self.mean_b

    @property
    def effect(self) -> torch.Tensor:
        pooled = ((self.std_a ** 2 + self.std_b ** 2) / 2).sqrt()
        return self.diff / pooled.clamp(min=1e-6)

    def top(self, k: int = 20, by: str = "effect", sign: str = "abs") -> list[tuple[int, int, float]]:
        """The ``k`` neurons ``(layer, index, value)`` ranked by ``effect`` or ``diff``; ``sign``: abs / pos / neg."""
        if by not in ("effect", "diff"):
            raise ValueError(f"by must be 'effect' or 'diff', got {by!r}")
        v = (self.effect if by == "effect" else self.diff).flatten()
        key = {"abs": v.abs(), "pos": v, "neg": -v}.get(sign)
        if key is None:
            raise ValueError(f"sign must be 'abs', 'pos' or 'neg', got {sign!r}")
        D = self.mean_a.shape[1]
        return [(self.layers[i // D], i % D, float(v[i])) for i in key.argsort(descending=True)[:k].tolist()]

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the neurons compared, the largest |effect size| (and mean |effect|), and the five
        neurons ``[layer, index, effect]`` with the largest |effect|."""
        e = self.effect
        return {"layers": list(self.layers), "n_neurons": e.numel(), "max_abs_effect": float(e.abs().max()),
                "mean_abs_effect": float(e.abs().mean()), "top": [list(t) for t in self.top(5)]}

    def select(self, k: int = 20, by: str = "effect", sign: str = "abs") -> set[Neuron]:
        return {(la, i) for la, i, _ in self.top(k, by, sign)}

    def to_frame(self) -> pd.DataFrame:
        """One row per neuron: ``layer``, ``neuron``, ``mean_a``, ``mean_b``, ``std_a``, ``std_b``, ``diff``
        and ``effect``."""
        import pandas as pd

        L, D = self.mean_a.shape
        cols = {k: getattr(self, k).flatten().tolist() for k in ("mean_a", "mean_b", "std_a", "std_b", "diff",
                                                                 "effect")}
        return pd.DataFrame({"layer": [la for la in self.layers for _ in range(D)], "neuron": list(range(D)) * L,
                             **cols})

    def plot(self, by: str = "effect", title: str | None = None) -> Any:
        """Heatmap, layers x neurons, of the effect size (or the mean difference with ``by='diff'``)."""
        from interp.viz.patching import neuron_contrast_heatmap

        return neuron_contrast_heatmap(self, by=by, title=title)


@moved_keywords(CHAT_MOVED)
def neuron_contrast(model: Model, prompts_a: Prompts, prompts_b: Prompts, layers: Sequence[int] | None = None,
                    positions: str = "last", batch_size: int = 32) -> NeuronContrast:
    """Contrast every ``mlp_post`` neuron between two prompt sets (at the last token, or over all tokens)."""
    a = neuron_acts(model, prompts_a, layers, positions, batch_size)
    b = neuron_acts(model, prompts_b, layers, positions, batch_size)
    if a.shape[0] < 2 or b.shape[0] < 2:
        raise ValueError("each prompt set needs at least 2 prompts to estimate a spread")
    return NeuronContrast(a.mean(0), b.mean(0), a.std(0), b.std(0), _layers(model, layers),
                          meta={"positions": positions, "n_a": a.shape[0], "n_b": b.shape[0]})


@moved_keywords(CHAT_MOVED)
def neuron_means(model: Model, prompts: Prompts) -> Float[torch.Tensor, "L D"]:
    """Mean ``mlp_post`` activation of every neuron over the real tokens of ``prompts`` (for mean ablation)."""
    return neuron_acts(model, prompts, None, "all").mean(0)


@contextmanager
def ablate_neurons(model: Model, neurons: Iterable[Neuron], mode: str = "zero",
                   means: torch.Tensor | None = None) -> Iterator[None]:
    """Within the block, ``neurons [(layer, index), ...]`` are set to zero or to their mean at every position:
    a :class:`NeuronAblation` alone."""
    with hooks(model, NeuronAblation(_neurons(model, neurons), mode, means).hook_fns(model)):
        yield


@dataclass
class NeuronEffect(Result):
    """Metric with each neuron ablated alone (``values``, in the order of ``neurons``) and all together."""

    neurons: list[Neuron]
    values: torch.Tensor
    joint: float
    baseline: float
    mode: str
    metric: str = ""
    control_neurons: list[Neuron] = field(default_factory=list)
    control_values: torch.Tensor | None = None

    @property
    def delta(self) -> torch.Tensor:
        return self.values - self.baseline

    @property
    def control_delta(self) -> torch.Tensor | None:
        """Change of the metric when each random control neuron is ablated alone (``None``: no control)."""
        return None if self.control_values is None else self.control_values - self.baseline

    def summary(self) -> dict[str, Any]:
        """Headline numbers: baseline, the joint ablation's change, the mean change of one neuron ablated alone
        and of one random control neuron, n of each."""
        cd = self.control_delta
        return {"metric": self.metric, "mode": self.mode, "baseline": self.baseline, "joint": self.joint,
                "joint_delta": self.joint - self.baseline, "n_neurons": len(self.neurons),
                "mean_delta": float(self.delta.mean()) if len(self.neurons) else None,
                "n_control": len(self.control_neurons),
                "control_mean_delta": None if cd is None or cd.numel() == 0 else float(cd.mean())}

    def top(self, k: int = 10) -> list[tuple[int, int, float]]:
        d = self.delta
        return [(*self.neurons[i], float(d[i])) for i in d.abs().argsort(descending=True)[:k].tolist()]

    def to_frame(self) -> pd.DataFrame:
        """One row per ablated neuron: ``layer``, ``neuron``, ``value`` (metric), ``delta`` and ``control``
        (true for the random control neurons); the joint ablation and the baseline are in ``frame.attrs``."""
        import pandas as pd

        ns = self.neurons + self.control_neurons
        vals = self.values.tolist() + ([] if self.control_values is None else self.control_values.tolist())
        frame = pd.DataFrame({"layer": [la for la, _ in ns], "neuron": [i for _, i in ns], "value": vals,
                              "delta": [v - self.baseline for v in vals],
                              "control": [False] * len(self.neurons) + [True] * len(self.control_neurons)})
        frame.attrs.update(joint=self.joint, baseline=self.baseline, mode=self.mode, metric=self.metric)
        return frame

    def plot(self, title: str | None = None) -> Any:
        """Change of the metric per neuron ablated alone, the random control neurons beside them, and a line
        at the change with all of them ablated together."""
        from interp.viz.patching import effect_bars

        cd = self.control_delta
        return effect_bars([f"L{la}.N{i}" for la, i in self.neurons], self.delta.tolist(),
                           None if cd is None else cd.tolist(), self.joint - self.baseline,
                           self.metric or "metric", title=title or f"{self.mode}-ablating neurons")


@moved_keywords(MOVED)
def neuron_ablation_effect(model: Model, prompts: Prompts, metric: Metric, neurons: Iterable[Neuron],
                           mode: str = "zero", means: torch.Tensor | None = None, n_control: int = 0,
                           runtime: Runtime | None = None) -> NeuronEffect:
    """Ablate each neuron alone (batched variants) and all of them together; measure ``metric``.
    ``prompts``: texts (a list: the chat template; ``interp.Prompts(texts, chat=False)``: raw) or a batch.
    ``n_control``: also ablate that many random other neurons of the same layers (drawn with ``runtime.seed``),
    one at a time, as the control a chosen neuron's effect should beat; ``runtime``: rows per forward (default 64)
    and a bar over the forwards."""
    runtime = patch_runtime(runtime)
    vals = ablation_values(model, mode, means, "mlp_post")
    nlist = _neurons(model, neurons)
    batch = batch_of(model, prompts)
    D = _check_dense(model)
    controls = random_neurons(nlist, D, n_control, runtime.seed)
    values = {Site("mlp_post", la): (torch.zeros(D) if vals is None else vals[la]) for la in {la for la, _ in nlist}}
    out = ablation_sweep(model, batch, metric, [(Site("mlp_post", la), i) for la, i in nlist + controls], values,
                         runtime.batch_size, runtime.progress, f"{mode}-ablating neurons")
    with torch.no_grad():
        base = float(call_metric(metric, last_logits(model, batch)))
        with ablate_neurons(model, nlist, mode, means):
            joint = float(call_metric(metric, last_logits(model, batch)))
    return NeuronEffect(nlist, out[:len(nlist)], joint, base, mode, metric_name(metric), controls,
                        out[len(nlist):] if controls else None)


def random_neurons(chosen: list[Neuron], d_mlp: int, n: int, seed: int) -> list[Neuron]:
    """``n`` distinct neurons, none of them chosen, the ``i``-th drawn (seeded) at the layer of ``chosen[i % k]``, so
    the controls follow the chosen neurons' layers (:func:`interp.evals.controls.matched_random`)."""
    if n < 0:
        raise ValueError(f"n_control must be >= 0, got {n}")
    pool = [(la, i) for la in sorted({la for la, _ in chosen}) for i in range(d_mlp) if (la, i) not in set(chosen)]
    if n > len(pool):
        raise ValueError(f"n_control={n} but the chosen layers have only {len(pool)} other neurons; ask for fewer")
    return matched_random(chosen, lambda c: [(c[0], i) for i in range(d_mlp)], seed, n=n, what="neuron")


@dataclass
class NeuronOverlap(Result):
    """Overlaps of named neuron sets: sizes, pairwise intersections and Jaccard indices ``[C, C]``, the neurons
    common to all, and those unique to each."""

    names: list[str]
    sets: dict[str, set[Neuron]]
    intersections: torch.Tensor
    jaccard: torch.Tensor
    common: set[Neuron]
    unique: dict[str, set[Neuron]]

    def to_frame(self) -> pd.DataFrame:
        """One row per (condition, neuron) in the sets: ``condition``, ``layer``, ``neuron``, ``common`` (in
        every set) and ``unique`` (in this condition's set only), sorted by condition, layer, neuron."""
        import pandas as pd

        rows = [{"condition": k, "layer": la, "neuron": i, "common": (la, i) in self.common,
                 "unique": (la, i) in self.unique[k]} for k in self.names for la, i in sorted(self.sets[k])]
        return pd.DataFrame(rows, columns=["condition", "layer", "neuron", "common", "unique"])

    def summary(self) -> dict[str, Any]:
        """Headline numbers: each set's size, the Jaccard index of each pair, the neurons common to all and
        the number unique to each."""
        n = len(self.names)
        return {"sizes": {k: len(self.sets[k]) for k in self.names},
                "jaccard": {f"{self.names[i]}/{self.names[j]}": float(self.jaccard[i, j])
                            for i in range(n) for j in range(i + 1, n)},
                "n_common": len(self.common), "n_unique": {k: len(self.unique[k]) for k in self.names}}

    def plot(self, title: str | None = None) -> Any:
        """Jaccard overlap of the sets, annotated with intersection sizes."""
        from interp.viz.patching import overlap_heatmap

        return overlap_heatmap(self, title=title)


def intersect_neurons(sets: Mapping[str, Iterable[Neuron]]) -> NeuronOverlap:
    """Compare neuron sets found under several conditions (e.g. one per language or prompt set)."""
    if not isinstance(sets, Mapping) or len(sets) < 2:
        raise ValueError("intersect_neurons takes a dict {condition: [(layer, index), ...]} with at least 2 entries")
    names = list(sets)
    ss = {k: {(int(a), int(b)) for a, b in v} for k, v in sets.items()}
    C = len(names)
    inter = torch.zeros(C, C, dtype=torch.long)
    jac = torch.zeros(C, C)
    for i, j in itertools.product(range(C), range(C)):
        a, b = ss[names[i]], ss[names[j]]
        inter[i, j] = len(a & b)
        jac[i, j] = len(a & b) / len(a | b) if (a | b) else 1.0
    common = set.intersection(*ss.values())
    unique = {k: ss[k] - set().union(*(ss[o] for o in names if o != k)) for k in names}
    return NeuronOverlap(names, ss, inter, jac, common, unique)


__all__ = ["Neuron", "neuron_acts", "NeuronContrast", "neuron_contrast", "neuron_means", "ablate_neurons",
           "NeuronEffect", "neuron_ablation_effect", "NeuronOverlap", "intersect_neurons", "random_neurons"]
