"""Interventions that test an attribution graph: set or scale features and measure the targets' change.

:func:`intervene` runs a graph's prompt three ways: ``"linear"``, the linearised model the graph describes
(every other feature, the errors, attention patterns and norm scales held), where the change is exactly the
graph's direct edges (``predicted``); ``"replacement"``, the replacement model with its error terms held at
their recorded values and downstream features re-encoded from their changed inputs (``freeze=True`` also holds
attention patterns and norm scales); ``"real"``, the real model with the change written through the
transcoder's decoder (:class:`DecoderEdit`: ``(new - old) * W_dec[f]`` added at the MLP output).
:class:`DecoderEdit` follows the shared edit protocol (``hook_fns(model) -> {site: fn(x, ctx)}``), so
``steering.apply(model, DecoderEdit(...))`` composes it with other interventions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.forward import forward
from interp.models import Model
from interp.patching.graph_result import AttributionGraph
from interp.patching.graph_targets import Readout
from interp.patching.replacement import ReplacementModel, ReplacementRun, check_transcoder
from sae.clt import CrossLayerTranscoder
from sae.transcoder import Transcoder

if TYPE_CHECKING:
    import pandas as pd

MODES = ("linear", "replacement", "real")


@dataclass(frozen=True)
class FeatureEdit:
    """Feature ``feature`` of the layer-``layer`` transcoder at ``position``: set to ``value``, or multiplied by
    ``scale`` (default: scale 0, an ablation)."""

    layer: int
    position: int
    feature: int
    value: float | None = None
    scale: float | None = None

    def __post_init__(self) -> None:
        if self.value is not None and self.scale is not None:
            raise ValueError("a FeatureEdit sets a value or a scale, not both")

    def new(self, old: torch.Tensor) -> torch.Tensor:
        if self.value is not None:
            return torch.full_like(old, float(self.value))
        return old * (0.0 if self.scale is None else float(self.scale))

    @property
    def label(self) -> str:
        how = f"= {self.value}" if self.value is not None else f"x {0.0 if self.scale is None else self.scale}"
        return f"L{self.layer} f{self.feature} @{self.position} {how}"


def as_edits(edits: FeatureEdit | Sequence[FeatureEdit | tuple[int, int, int]]) -> list[FeatureEdit]:
    """A list of :class:`FeatureEdit` (a bare ``(layer, position, feature)`` is an ablation)."""
    items = [edits] if isinstance(edits, FeatureEdit) else list(edits)
    out = [e if isinstance(e, FeatureEdit) else FeatureEdit(*e) for e in items]
    if not out:
        raise ValueError("no feature edits given")
    return out


def _check(edits: list[FeatureEdit], transcoders: Mapping[int, Transcoder], n_positions: int | None) -> None:
    for e in edits:
        if e.layer not in transcoders:
            raise ValueError(f"{e.label}: no transcoder for layer {e.layer}")
        if not 0 <= e.feature < transcoders[e.layer].d_sae:
            raise ValueError(f"{e.label}: the layer-{e.layer} transcoder has features 0..{transcoders[e.layer].d_sae - 1}")
        if n_positions is not None and not 0 <= e.position < n_positions:
            raise ValueError(f"{e.label}: position outside the prompt's {n_positions} tokens")


def apply_to_acts(z: torch.Tensor, edits: Sequence[FeatureEdit], layer: int) -> torch.Tensor:
    """``z [b, T, d_sae]`` with this layer's edits applied (a copy)."""
    z = z.clone()
    for e in edits:
        if e.layer == layer and e.position < z.shape[1]:
            z[:, e.position, e.feature] = e.new(z[:, e.position, e.feature])
    return z


class DecoderEdit:
    """The edits in the real model: at ``mlp_module_out.L`` add ``(new - old) * W_dec[f]`` at each edit's
    position, ``old`` being the feature's activation on the MLP's current input (read at ``mlp_in.L``).
    ``transcoders``: a list or ``{layer: Transcoder}`` (only the edited layers are needed), a
    :class:`~sae.clt.CrossLayerTranscoder` (the change is written through its decoders into MLP ``L`` and every
    later MLP) or a :class:`ReplacementModel`. Positions index the
    tokens of a full forward over the prompt; a shorter pass (a KV-cached generation step) sees only the edits
    whose position it contains, counted from its own start."""

    def __init__(self, transcoders: Sequence[Transcoder] | Mapping[int, Transcoder] | CrossLayerTranscoder
                 | ReplacementModel, edits: FeatureEdit | Sequence[FeatureEdit | tuple[int, int, int]]):
        self.clt = transcoders.clt if isinstance(transcoders, ReplacementModel) else \
            transcoders if isinstance(transcoders, CrossLayerTranscoder) else None
        tcs = self.clt.transcoders if self.clt is not None else \
            transcoders.transcoders if isinstance(transcoders, ReplacementModel) else transcoders
        self.transcoders = dict(tcs) if isinstance(tcs, Mapping) else {t.layer: t for t in tcs}
        self.edits = as_edits(edits)
        _check(self.edits, self.transcoders, None)

    def hook_fns(self, model: Model) -> dict[str, Any]:
        for layer, tc in self.transcoders.items():
            check_transcoder(model, layer, tc)
        if self.clt is not None:
            return self._clt_fns(self.clt)
        fns: dict[str, Any] = {}
        for layer in sorted({e.layer for e in self.edits}):
            fns.update(self._layer_fns(layer))
        return fns

    def _layer_fns(self, layer: int) -> dict[str, Any]:
        tc, edits = self.transcoders[layer], [e for e in self.edits if e.layer == layer]
        seen: dict[str, torch.Tensor] = {}

        def read(x: torch.Tensor, ctx: Any) -> None:
            seen["x"] = x

        def write(out: torch.Tensor, ctx: Any) -> torch.Tensor:
            z = tc.encode(seen.pop("x").to(tc.device))
            delta = (apply_to_acts(z, edits, layer) - z) @ tc.W_dec
            return out + delta.to(out.device, out.dtype)

        return {f"mlp_in.{layer}": read, f"mlp_module_out.{layer}": write}

    def _clt_fns(self, clt: CrossLayerTranscoder) -> dict[str, Any]:
        """Each edited layer's change ``delta_l`` read at its MLP; MLP ``L`` gets ``sum_{l <= L} delta_l @ D(l, L)``."""
        edited = sorted({e.layer for e in self.edits})
        seen: dict[int, torch.Tensor] = {}
        deltas: dict[int, torch.Tensor] = {}
        fns: dict[str, Any] = {}
        for layer in range(edited[0], clt.n_layers):
            def write(out: torch.Tensor, ctx: Any, layer: int = layer) -> torch.Tensor:
                if layer in edited:
                    z = clt.encode(layer, seen.pop(layer).to(clt.layers[layer].device))
                    deltas[layer] = apply_to_acts(z, self.edits, layer) - z
                total = sum(d @ clt.decoder(src, layer) for src, d in deltas.items() if src <= layer)
                return out + total.to(out.device, out.dtype)
            if layer in edited:
                fns[f"mlp_in.{layer}"] = lambda x, ctx, layer=layer: seen.__setitem__(layer, x)
            fns[f"mlp_module_out.{layer}"] = write
        return fns


@dataclass
class InterventionResult(Result):
    """Each target's value ``before`` and ``after`` the edits in one ``mode``; ``predicted`` is the graph's
    direct-effect prediction ``sum_f (new_f - old_f) * A[t, f] / old_f`` (NaN where an edited feature is not a
    node of the graph, or was inactive)."""

    mode: str
    labels: list[str]
    before: torch.Tensor
    after: torch.Tensor
    predicted: torch.Tensor
    edits: list[FeatureEdit] = field(default_factory=list)

    @property
    def delta(self) -> torch.Tensor:
        return self.after - self.before

    def to_frame(self) -> pd.DataFrame:
        """One row per target: ``target, before, after, delta, predicted``."""
        import pandas as pd

        return pd.DataFrame({"target": self.labels, "before": self.before.tolist(), "after": self.after.tolist(),
                             "delta": self.delta.tolist(), "predicted": self.predicted.tolist(), "mode": self.mode})

    def summary(self) -> dict[str, Any]:
        """The mode, the edits, and each target's change measured and predicted (NaN: not predictable)."""
        return {"mode": self.mode, "n_edits": len(self.edits),
                "delta": dict(zip(self.labels, self.delta.tolist())),
                "predicted": dict(zip(self.labels, self.predicted.tolist()))}

    def plot(self, title: str | None = None) -> Any:
        """Each target before and after, with the graph's predicted value after (:func:`viz.patching.intervention_bars`)."""
        from interp.viz.patching import intervention_bars

        return intervention_bars(self.labels, self.before.tolist(), self.after.tolist(), self.predicted.tolist(),
                                 self.mode, title)


def graph_readouts(graph: AttributionGraph) -> list[Readout]:
    """The graph's target nodes as :class:`Readout` s."""
    return [Readout(graph.target_labels[j], graph.target_kinds[j], graph.target_sites[j], graph.target_positions[j],
                    graph.target_vectors[j], graph.target_consts[j], float(graph.target_weights[j]))
            for j in range(graph.n_targets)]


def predicted_change(graph: AttributionGraph, edits: Sequence[FeatureEdit]) -> torch.Tensor:
    """The graph's direct-effect prediction of each target's change ``[n_targets]`` (module docstring)."""
    total = torch.zeros(graph.n_targets, dtype=torch.float64)
    for e in edits:
        try:
            i = graph.feature_node(e.layer, e.position, e.feature)
        except KeyError:
            return torch.full((graph.n_targets,), float("nan"), dtype=torch.float64)
        old = graph.activations[i].double()
        per_unit = graph.adjacency[graph.target_offset:, i].double() / old
        total += per_unit * (e.new(old) - old)
    return total


def _values(readouts: list[Readout], sites: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.stack([r.value({k: v[:1].detach() for k, v in sites.items()})[0] for r in readouts]).double()


def _real(rm: ReplacementModel, run: ReplacementRun, readouts: list[Readout], edits: list[FeatureEdit] | None
          ) -> torch.Tensor:
    sites: dict[str, torch.Tensor] = {}
    fns: list[tuple[str, Any]] = list(DecoderEdit(rm, edits).hook_fns(rm.model).items()) if edits else []
    for s in {r.site for r in readouts}:
        fns.append((s, lambda x, ctx, s=s: sites.__setitem__(s, x)))
    forward(rm.model, run.batch, fns)
    return _values(readouts, sites)


def intervene(rm: ReplacementModel, graph: AttributionGraph, edits: FeatureEdit | Sequence[FeatureEdit | tuple],
              mode: str = "linear", freeze: bool = False) -> InterventionResult:
    """Apply ``edits`` on the graph's prompt in ``mode`` (``linear`` / ``replacement`` / ``real``, see the module
    docstring; ``freeze`` for ``replacement``) and report every target before and after."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    edits = as_edits(edits)
    name = getattr(rm.model, "name", "")
    if graph.model_id and name and graph.model_id != name or graph.n_layers != rm.n_layers:
        raise ValueError(f"this graph was made on {graph.model_id!r} ({graph.n_layers} layers), not on {name!r} "
                         f"({rm.n_layers} layers); intervene with the replacement model that made it")
    run = rm.run(graph.input_ids.tolist())
    _check(edits, rm.transcoders, run.n_positions)
    readouts = graph_readouts(graph)
    sites = sorted({r.site for r in readouts})
    if mode == "linear":
        before = _values(readouts, rm.linear(run, read=sites)["sites"])
        acts = {e.layer: apply_to_acts(run.acts[e.layer][None], edits, e.layer) for e in edits}
        after = _values(readouts, rm.linear(run, acts=acts, read=sites)["sites"])
    elif mode == "replacement":
        before = _values(readouts, rm.replaced(run, freeze=freeze, read=sites)["sites"])
        edit = lambda layer, z: apply_to_acts(z, edits, layer)  # noqa: E731
        after = _values(readouts, rm.replaced(run, edit=edit, freeze=freeze, read=sites)["sites"])
    else:
        before, after = _real(rm, run, readouts, None), _real(rm, run, readouts, edits)
    return InterventionResult(mode, [r.label for r in readouts], before, after, predicted_change(graph, edits),
                              edits)


__all__ = ["DecoderEdit", "FeatureEdit", "InterventionResult", "as_edits", "intervene", "predicted_change"]
