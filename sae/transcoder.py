"""Per-layer transcoders: a sparse dictionary that reads an MLP's input and predicts that MLP's output.

Same weight layout as :class:`sae.model.SAE` (``W_enc [d_in, d_sae]``, ``b_enc``, ``W_dec [d_sae, d_in]``,
``b_dec``, ``threshold`` for JumpReLU), but ``b_dec`` lives in the output space, so the encoder reads ``x`` itself
(``apply_b_dec_to_input=False``), and an optional linear skip ``W_skip [d_in, d_in]`` adds ``x @ W_skip``.
``d_out == d_in``: an MLP of a decoder block reads and writes the model width. It reads ``input_site`` (the MLP
module's input, after the pre-MLP norm and its gain) and writes ``site`` (the MLP module's output, before any
post-MLP norm); the replacement model and attribution graphs (``patching.graphs``) splice it there.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from jaxtyping import Float

from interp.bundle import read_object, register_kind, save_object
from sae.kinds import get_kind, kind_names
from sae.model import SAE, SAEConfig


@dataclass
class TranscoderConfig(SAEConfig):
    """An SAE config plus the layer, the skip connection and the input site. ``site`` is where it writes."""

    layer: int = 0
    skip: bool = False
    input_site: str | None = None

    def __post_init__(self) -> None:
        if not self.kind.transcoder:
            ok = [n for n in kind_names() if get_kind(n).transcoder]
            raise ValueError(f"transcoders support arch {ok}, not {self.arch!r} (a kind declares transcoder = True "
                             f"when it can predict another activation; BatchTopK infers as a JumpReLU: train "
                             f"arch='jumprelu')")
        self.apply_b_dec_to_input = False
        if self.site is None:
            self.site = f"blocks.{self.layer}.mlp.hook_out"
        if self.input_site is None:
            self.input_site = f"blocks.{self.layer}.mlp.hook_in"
        super().__post_init__()


class Transcoder(SAE):
    """``encode``: MLP input ``[..., d_in] -> [..., d_sae]``; ``decode(z, x)``: predicted MLP output ``[..., d_in]``."""

    cfg: TranscoderConfig

    def __init__(self, cfg: TranscoderConfig, seed: int | None = 0):
        if not isinstance(cfg, TranscoderConfig):
            raise TypeError(f"Transcoder needs a TranscoderConfig, got {type(cfg).__name__}")
        super().__init__(cfg, seed=seed)
        self.W_skip = (nn.Parameter(torch.zeros(cfg.d_in, cfg.d_in, dtype=cfg.torch_dtype)) if cfg.skip else None)

    @property
    def layer(self) -> int:
        return self.cfg.layer

    def skip_out(self, x: Float[torch.Tensor, "... d_in"]) -> Float[torch.Tensor, "... d_in"] | None:
        """The skip connection's part of the output, ``x @ W_skip`` (``None`` without a skip)."""
        if self.W_skip is None:
            return None
        self._check_width(x)
        return x.to(self.dtype) @ self.W_skip

    def decode(self, z: Float[torch.Tensor, "... d_sae"], x: Float[torch.Tensor, "... d_in"] | None = None
               ) -> Float[torch.Tensor, "... d_in"]:
        """Predicted MLP output ``z @ W_dec + b_dec (+ x @ W_skip)``; a skip transcoder needs ``x``."""
        out = super().decode(z)
        if self.W_skip is not None:
            if x is None:
                raise ValueError("this transcoder has a skip connection: pass the MLP input, decode(z, x)")
            out = out + self.skip_out(x)
        return out

    def forward(self, x: Float[torch.Tensor, "... d_in"]) -> Float[torch.Tensor, "... d_in"]:
        """Predicted MLP output of the MLP input ``x``."""
        return self.decode(self.encode(x), x)

    @torch.no_grad()
    def fold_input_scale_(self, scale: float, out_scale: float | None = None) -> None:
        """Turn a transcoder trained to map ``x * scale`` to ``y * out_scale`` into one mapping raw ``x`` to raw
        ``y``, keeping unit-norm decoder rows; latents become ``1/out_scale`` of the trained ones."""
        out = scale if out_scale is None else out_scale
        for s in (scale, out):
            if not (math.isfinite(s) and s > 0):
                raise ValueError(f"scales must be positive finite numbers, got {scale}, {out_scale}")
        self.W_enc.mul_(scale / out)
        for t in (self.b_enc, self.b_dec, *(getattr(self, n) for n in self.kind.scaled)):
            t.div_(out)
        if self.W_skip is not None:
            self.W_skip.mul_(scale / out)

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Save as a bundle folder (atomic; refuses to overwrite)."""
        tensors = dict(self.state_dict())
        return save_object(path, "sae.Transcoder", tensors, self.provenance, {"cfg": self.cfg.to_dict()},
                           overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device | None = None) -> Transcoder:
        """Load a transcoder saved by :meth:`save`."""
        b = read_object(Path(path), "sae.Transcoder")
        tc = cls(TranscoderConfig.from_dict(b.fields["cfg"]), seed=None)
        tc.load_state_dict(b.tensors)
        return tc.to(device) if device is not None else tc

    def extra_repr(self) -> str:
        return super().extra_repr() + f", layer={self.layer}, skip={self.cfg.skip}"


register_kind("sae.Transcoder", Transcoder.load)


def check_transcoders(model: Any, transcoders: Mapping[int, Transcoder] | Iterable[Transcoder]) -> dict[int, Transcoder]:
    """``{layer: transcoder}`` after checking they fit ``model`` (width, layer range, model id, one per layer).

    A dict may cover some layers; a list or tuple must hold one transcoder for every layer of the model."""
    n, d = int(model.n_layers), int(model.d_model)
    name = getattr(model, "name", "") or "the model"
    items = list(transcoders.items()) if isinstance(transcoders, Mapping) else [(None, t) for t in transcoders]
    if not items:
        raise ValueError("no transcoders given")
    if not isinstance(transcoders, Mapping) and len(items) != n:
        raise ValueError(f"{len(items)} transcoders for the {n} layers of {name}; give one per layer, or a dict "
                         f"{{layer: transcoder}} to replace only some layers")
    out: dict[int, Transcoder] = {}
    for key, tc in items:
        if not isinstance(tc, Transcoder):
            raise TypeError(f"expected a sae.transcoder.Transcoder, got {type(tc).__name__}")
        layer = tc.layer if key is None else int(key)
        if key is not None and layer != tc.layer:
            raise ValueError(f"the transcoder under key {layer} was trained for layer {tc.layer}; key it by its layer")
        if not 0 <= layer < n:
            raise ValueError(f"a transcoder for layer {layer} does not fit {name}, whose layers are 0..{n - 1}")
        if layer in out:
            raise ValueError(f"two transcoders for layer {layer}; give one per layer")
        if tc.d_in != d:
            raise ValueError(f"the transcoder for layer {layer} reads width {tc.d_in} but {name} has d_model={d}; "
                             f"train or load transcoders for this model (sae.transcoder_train.train_transcoder)")
        mid = tc.cfg.model_id
        if mid and getattr(model, "name", "") and mid != model.name and not tc.cfg.meta.get("allow_other_model"):
            raise ValueError(f"the transcoder for layer {layer} was trained on {mid!r}, not {model.name!r}; use "
                             f"transcoders of this model, or set tc.cfg.meta['allow_other_model'] = True if the two "
                             f"are the same weights under another name")
        out[layer] = tc
    return dict(sorted(out.items()))
