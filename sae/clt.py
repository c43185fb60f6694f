"""Cross-layer transcoders (Ameisen et al. 2025): one dictionary per layer that reads that layer's MLP input and
writes into that MLP's output and the output of every later MLP.

A :class:`CrossLayerTranscoder` holds one :class:`~sae.transcoder.Transcoder` per layer (its encoder, its
activation from :mod:`sae.kinds`, its decoder into the same layer and that layer's ``b_dec``) and, for each layer
``l``, the decoders into the later layers ``W_later[l] [d_sae, n_layers - 1 - l, d]``. The prediction of MLP
``L``'s output is ``sum_{l <= L} z_l @ D(l, L) + b_dec[L]`` with ``D(l, l) = layers[l].W_dec`` and
``D(l, L) = W_later[l][:, L - l - 1]``. No skip connection: circuit-tracer's CLT files store none.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from interp.bundle import Provenance, read_object, register_kind, save_object
from sae.transcoder import Transcoder, TranscoderConfig, check_transcoders


@dataclass
class CLTConfig:
    """Shape and kind of a CLT: ``n_layers`` layers of ``d_sae`` features each over width ``d_in``; ``arch`` a
    transcoder kind (``relu``, ``jumprelu``, ``topk`` with ``k``); ``input_hook`` / ``output_hook``: the hook
    under ``blocks.L.`` each layer reads and writes (the MLP module's input and output)."""

    n_layers: int
    d_in: int
    d_sae: int
    arch: str = "relu"
    k: int | None = None
    model_id: str = ""
    dtype: str = "float32"
    input_hook: str = "mlp.hook_in"
    output_hook: str = "mlp.hook_out"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n_layers < 1:
            raise ValueError(f"a cross-layer transcoder needs n_layers >= 1, got {self.n_layers}")
        self.layer_config(0)  # the kind, k and widths checked once, by the transcoder config

    def layer_config(self, layer: int) -> TranscoderConfig:
        """The per-layer transcoder config of ``layer`` (its encoder, activation and same-layer decoder)."""
        return TranscoderConfig(d_in=self.d_in, d_sae=self.d_sae, arch=self.arch, k=self.k, layer=layer,
                                input_site=f"blocks.{layer}.{self.input_hook}",
                                site=f"blocks.{layer}.{self.output_hook}", model_id=self.model_id,
                                dtype=self.dtype, meta=dict(self.meta))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CLTConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class CrossLayerTranscoder(nn.Module):
    """``encode(layer, x)``: MLP input ``[..., d] -> [..., d_sae]``; ``predict(layer, zs)``: MLP ``layer``'s
    predicted output from the latents of layers ``<= layer``; ``forward(xs)``: every layer's prediction."""

    def __init__(self, cfg: CLTConfig, seed: int | None = 0):
        super().__init__()
        if not isinstance(cfg, CLTConfig):
            raise TypeError(f"CrossLayerTranscoder needs a CLTConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.layers = nn.ModuleList([Transcoder(cfg.layer_config(i), seed=None if seed is None else seed + i)
                                     for i in range(cfg.n_layers)])
        gen = torch.Generator().manual_seed(seed + 10_000) if seed is not None else None
        later = []
        for i in range(cfg.n_layers):
            w = torch.randn(cfg.d_sae, cfg.n_layers - 1 - i, cfg.d_in, generator=gen) if gen is not None else \
                torch.zeros(cfg.d_sae, cfg.n_layers - 1 - i, cfg.d_in)
            later.append(nn.Parameter((0.1 * w / cfg.d_in ** 0.5).to(getattr(torch, cfg.dtype))))
        self.W_later = nn.ParameterList(later)

    @property
    def n_layers(self) -> int:
        return self.cfg.n_layers

    @property
    def d_in(self) -> int:
        return self.cfg.d_in

    @property
    def d_sae(self) -> int:
        return self.cfg.d_sae

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].dtype

    @property
    def transcoders(self) -> dict[int, Transcoder]:
        """The per-layer parts ``{layer: Transcoder}`` (encoder, activation, same-layer decoder, ``b_dec``)."""
        return {i: tc for i, tc in enumerate(self.layers)}  # type: ignore[misc]

    def _layer(self, layer: int) -> int:
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer {layer} is outside this CLT's layers 0..{self.n_layers - 1}")
        return layer

    def decoder(self, source: int, target: int) -> torch.Tensor:
        """``D(source, target) [d_sae, d]``: how layer ``source``'s features write into MLP ``target``'s output."""
        self._layer(source), self._layer(target)
        if target < source:
            raise ValueError(f"layer {source}'s features write only into layers {source}..{self.n_layers - 1}, "
                             f"not {target}")
        return self.layers[source].W_dec if target == source else self.W_later[source][:, target - source - 1]

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s latents of its MLP input ``x [..., d]``."""
        return self.layers[self._layer(layer)].encode(x)

    def cross_write(self, layer: int, zs: Mapping[int, torch.Tensor]) -> torch.Tensor | None:
        """What the earlier layers' latents ``zs`` (``{l: [..., d_sae]}``, layers ``< layer`` used) write into MLP
        ``layer``'s output (``None`` when none of them is earlier)."""
        out = None
        for src in sorted(s for s in zs if s < self._layer(layer)):
            part = zs[src].to(self.dtype) @ self.W_later[src][:, layer - src - 1]
            out = part if out is None else out + part
        return out

    def predict(self, layer: int, zs: Mapping[int, torch.Tensor]) -> torch.Tensor:
        """MLP ``layer``'s predicted output from the latents ``zs`` of every layer ``<= layer``."""
        missing = [i for i in range(self._layer(layer) + 1) if i not in zs]
        if missing:
            raise ValueError(f"predicting layer {layer} needs the latents of layers {missing} too")
        own = self.layers[layer].decode(zs[layer])
        cross = self.cross_write(layer, zs)
        return own if cross is None else own + cross

    def forward(self, xs: Sequence[torch.Tensor] | Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Every layer's predicted MLP output from every layer's MLP input ``xs`` (``{layer: [..., d]}``)."""
        xs = dict(xs) if isinstance(xs, Mapping) else dict(enumerate(xs))
        zs = {i: self.encode(i, xs[i]) for i in range(self.n_layers)}
        return {i: self.predict(i, zs) for i in range(self.n_layers)}

    @classmethod
    def from_transcoders(cls, transcoders: Mapping[int, Transcoder] | Sequence[Transcoder]) -> CrossLayerTranscoder:
        """The CLT of per-layer transcoders (one per layer 0..n-1, one kind and width, no skip): their encoders,
        decoders and ``b_dec``, with zero cross-layer decoders, so it predicts exactly what they predict."""
        tcs = dict(transcoders) if isinstance(transcoders, Mapping) else {t.layer: t for t in transcoders}
        if not tcs or sorted(tcs) != list(range(len(tcs))):
            raise ValueError(f"a CLT needs one transcoder for every layer 0..n-1; got layers {sorted(tcs)}")
        c = tcs[0].cfg
        for i, tc in tcs.items():
            if (tc.cfg.arch, tc.cfg.k, tc.d_in, tc.d_sae) != (c.arch, c.k, c.d_in, c.d_sae) or tc.W_skip is not None:
                raise ValueError(f"layer {i}'s transcoder differs from layer 0's (kind, k, width) or has a skip "
                                 f"connection; a CLT shares one kind and width over its layers and has no skip")
        cfg = CLTConfig(n_layers=len(tcs), d_in=c.d_in, d_sae=c.d_sae, arch=c.arch, k=c.k, model_id=c.model_id,
                        dtype=c.dtype, meta=dict(c.meta))
        clt = cls(cfg, seed=None)
        with torch.no_grad():
            for i, tc in tcs.items():
                clt.layers[i].load_state_dict(tc.state_dict())
        return clt.to(tcs[0].device)

    @property
    def provenance(self) -> Provenance:
        m = dict(self.cfg.meta)
        sites = [f"blocks.{i}.{self.cfg.output_hook}" for i in range(self.n_layers)]
        return Provenance(method=f"sae.clt.{self.cfg.arch}", sites=sites, model_id=self.cfg.model_id,
                          data_hash=str(m.get("data_hash", "")), fitted_on=list(m.get("fitted_on", [])), meta=m)

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Save as a bundle folder (atomic; refuses to overwrite). circuit-tracer's layout: :mod:`sae.clt_io`."""
        return save_object(path, "sae.CrossLayerTranscoder", dict(self.state_dict()), self.provenance,
                           {"cfg": self.cfg.to_dict()}, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device | None = None) -> CrossLayerTranscoder:
        """Load a CLT saved by :meth:`save`."""
        b = read_object(Path(path), "sae.CrossLayerTranscoder")
        clt = cls(CLTConfig.from_dict(b.fields["cfg"]), seed=None)
        clt.load_state_dict(b.tensors)
        return clt.to(device) if device is not None else clt

    def extra_repr(self) -> str:
        c = self.cfg
        return f"n_layers={c.n_layers}, d_in={c.d_in}, d_sae={c.d_sae}, arch={c.arch!r}, model_id={c.model_id!r}"


register_kind("sae.CrossLayerTranscoder", CrossLayerTranscoder.load)


def check_clt(model: Any, clt: CrossLayerTranscoder) -> dict[int, Transcoder]:
    """A clear error unless ``clt`` fits ``model`` (one layer per model layer, the width, the model id); returns
    its per-layer parts ``{layer: Transcoder}``."""
    if not isinstance(clt, CrossLayerTranscoder):
        raise TypeError(f"expected a sae.clt.CrossLayerTranscoder, got {type(clt).__name__}")
    n = int(model.n_layers)
    name = getattr(model, "name", "") or "the model"
    if clt.n_layers != n:
        raise ValueError(f"this cross-layer transcoder spans {clt.n_layers} layers but {name} has {n}; a CLT "
                         f"replaces every MLP of the model it was trained on: load or train one for {name} "
                         f"(sae.clt_train.train_clt)")
    return check_transcoders(model, clt.transcoders)


__all__ = ["CLTConfig", "CrossLayerTranscoder", "check_clt"]
