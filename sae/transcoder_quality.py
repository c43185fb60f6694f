"""Transcoder quality: per layer, the fraction of the MLP output's variance the transcoder leaves unexplained, L0 and
dead latents; over the model, the cross-entropy loss recovered when every MLP is replaced by its transcoder at once.

The replacement runs each MLP as usual and swaps its output (``mlp_module_out.L``) for the transcoder's prediction
from that MLP's input (``mlp_in.L``), so errors compound through the layers as they would in a replacement model.
The baselines zero (or mean-ablate) those same MLP outputs, all at once; ``recovered_zero`` is
``(CE_zero - CE_replaced) / (CE_zero - CE_clean)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from interp.bundle import Result
from interp.forward import Inputs
from interp.positions import check_sinks, without_first
from interp.sites import Site
from interp.values import moved_keywords
from sae.edits import TranscoderSplice
from sae.quality import CELossRecovered, SAEMetrics, ce_recovered, evaluate
from sae.runner import MOVED, SINK_MOVED
from sae.transcoder import check_transcoders
from sae.transcoder_train import capture_pairs, pair_sites

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class TranscoderQuality(Result):
    """``layers``: :class:`~sae.quality.SAEMetrics` of each layer's transcoder on its MLP output (``fvu``, ``mse``
    of the output; ``l0``, dead and dense fractions of its latents); ``ce``: loss with every MLP replaced."""

    layers: dict[int, SAEMetrics]
    ce: CELossRecovered | None = None

    def to_frame(self) -> pd.DataFrame:
        """One row per layer: ``layer``, ``fvu``, ``mse``, ``l0``, ``dead_fraction``, ``dense_fraction``,
        ``n_tokens`` (the model-wide CE figures are in :attr:`ce` and :meth:`summary`)."""
        import pandas as pd

        return pd.DataFrame([{"layer": layer, **m.summary()} for layer, m in sorted(self.layers.items())])

    def summary(self) -> dict[str, Any]:
        """Mean FVU and dead fraction over the layers, worst FVU, and the CE figures when computed."""
        ms = list(self.layers.values())
        out = {"fvu_mean": sum(m.fvu for m in ms) / len(ms), "fvu_max": max(m.fvu for m in ms),
               "dead_fraction_mean": sum(m.dead_fraction for m in ms) / len(ms), "n_layers": len(ms)}
        if self.ce is not None:
            out.update({"ce_clean": self.ce.clean, "ce_replaced": self.ce.sae, "ce_zero_ablated": self.ce.zero_ablated,
                        "ce_mean_ablated": self.ce.mean_ablated, "recovered_zero": self.ce.recovered_zero,
                        "recovered_mean": self.ce.recovered_mean})
        return out

    def plot(self, title: str = "cross-entropy with every MLP replaced by its transcoder") -> Any:
        """Bars of CE: clean, replaced, MLPs zero- and mean-ablated."""
        if self.ce is None:
            raise ValueError("no CE figures: evaluate_transcoders(..., ce=True) computes them")
        return self.ce.plot(title=title)


@moved_keywords(MOVED)
def ce_loss_recovered_transcoders(model: Any, transcoders: Any, inputs: Inputs,
                                  batch_size: int = 8) -> CELossRecovered:
    """Next-token loss on ``inputs`` with every MLP of ``transcoders`` (``{layer: tc}`` or one per layer) replaced
    at once, against the clean model and those MLP outputs zero- / mean-ablated (``sae`` field: the replaced run)."""
    tcs = check_transcoders(model, transcoders)
    sites = [Site("mlp_module_out", layer).name for layer in tcs]
    return ce_recovered(model, inputs, TranscoderSplice(tcs).hook_fns(model), sites, batch_size)


@moved_keywords(SINK_MOVED)
def evaluate_transcoders(model: Any, transcoders: Any, inputs: Inputs, batch_size: int = 8, ce: bool = True,
                         dense_threshold: float = 0.1, sinks: str = "keep") -> TranscoderQuality:
    """FVU of each MLP's output, L0 and dead latents per layer (one capture of every MLP's input and output on
    ``inputs``), and with ``ce`` the CE loss recovered with every MLP replaced. ``sinks="exclude"``: the per-layer
    figures leave each prompt's first token out (as ``train_transcoder(sinks="exclude")`` trains); CE still replaces every
    token's MLP output, the sink's included."""
    tcs = check_transcoders(model, transcoders)
    pairs = capture_pairs(model, inputs, list(tcs), batch_size=batch_size)
    if check_sinks(sinks) == "exclude" and pairs.mask is not None:
        pairs.mask = without_first(pairs.mask)
    layers = {}
    for layer, tc in tcs.items():
        site_in, site_out = pair_sites(layer)
        layers[layer] = evaluate(tc, pairs.flat_tokens(site_in), target=pairs.flat_tokens(site_out),
                                 dense_threshold=dense_threshold)
    res = ce_loss_recovered_transcoders(model, tcs, inputs, batch_size) if ce else None
    return TranscoderQuality(layers=layers, ce=res)
