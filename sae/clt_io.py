"""Read and write circuit-tracer's cross-layer transcoder folders (``model_kind: cross_layer_transcoder``), offline,
without its package.

The layout, taken from circuit-tracer's source (``circuit_tracer/transcoder/cross_layer_transcoder.py``:
``CrossLayerTranscoder.to_safetensors`` / ``load_clt`` / ``_load_state_dict``; ``circuit_tracer/utils/caching.py``:
the ``config.yaml`` it keeps beside them)::

    FOLDER/config.yaml            model_kind: cross_layer_transcoder, model_name, feature_input_hook,
                                  feature_output_hook, scan_name
    FOLDER/W_enc_{i}.safetensors  one per layer 0..n-1:
        W_enc_{i} [d_transcoder, d_model]   (their encode is x @ W_enc.T: the transpose of ours)
        b_enc_{i} [d_transcoder]   b_dec_{i} [d_model]   threshold_{i} [d_transcoder] (JumpReLU only)
    FOLDER/W_dec_{i}.safetensors  W_dec_{i} [d_transcoder, n_layers - i, d_model]: layer i's decoders into layers
                                  i, i+1, .., n-1 (ours: ``layers[i].W_dec`` then ``W_later[i]``)

Their activation is JumpReLU when ``threshold_0`` is present, else ReLU (no TopK for CLTs); the files hold no skip
connection. Their JumpReLU is ``pre * (pre > threshold)``, ours ``relu(pre) * (pre > threshold)``: the same for
thresholds >= 0 (what training keeps).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from sae.circuit_tracer_io import CONFIG
from sae.clt import CLTConfig, CrossLayerTranscoder, check_clt
from sae.kinds import get_kind

_ENC = re.compile(r"^W_enc_(\d+)\.safetensors$")
KIND = "cross_layer_transcoder"


def save_circuit_tracer_clt(clt: CrossLayerTranscoder, path: str | os.PathLike, model_name: str | None = None,
                            scan_name: str | None = None, overwrite: bool = False) -> Path:
    """Write ``PATH/config.yaml``, ``PATH/W_enc_{i}.safetensors`` and ``PATH/W_dec_{i}.safetensors`` for every layer
    (each file atomically; refuses to overwrite unless ``overwrite=True``, which also removes a longer CLT's files)."""
    import yaml

    from interp.io import atomic_write, write_safetensors

    if not isinstance(clt, CrossLayerTranscoder):
        raise TypeError(f"expected a sae.clt.CrossLayerTranscoder, got {type(clt).__name__}")
    act = get_kind(clt.cfg.arch).circuit_tracer
    if act not in ("relu", "jumprelu"):
        raise ValueError(f"circuit-tracer's cross-layer transcoders are ReLU or JumpReLU, not {clt.cfg.arch!r}; save "
                         f"this CLT with CrossLayerTranscoder.save")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise FileExistsError(f"{p} is a file; choose a folder path")
    old = [f for f in p.glob("W_*_*.safetensors") if re.match(r"^W_(enc|dec)_\d+\.safetensors$", f.name)] \
        if p.exists() else []
    if (old or (p / CONFIG).exists()) and not overwrite:
        raise FileExistsError(f"{p} already holds transcoders; pass overwrite=True to replace them, or choose another "
                              f"path")
    p.mkdir(parents=True, exist_ok=True)
    for f in old:
        if int(f.stem.rsplit("_", 1)[1]) >= clt.n_layers:
            f.unlink()
    for i in range(clt.n_layers):
        enc, dec = _layer_tensors(clt, i)
        write_safetensors(p / f"W_enc_{i}.safetensors", enc)
        write_safetensors(p / f"W_dec_{i}.safetensors", dec)
    config = {"model_kind": KIND, "model_name": model_name or clt.cfg.model_id or None,
              "feature_input_hook": clt.cfg.input_hook, "feature_output_hook": clt.cfg.output_hook,
              "scan_name": scan_name or p.name}
    text = yaml.safe_dump(config, sort_keys=False)
    atomic_write(p / CONFIG, lambda tmp: Path(tmp).write_text(text))
    return p


def _layer_tensors(clt: CrossLayerTranscoder, i: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    tc = clt.layers[i]
    enc = {f"W_enc_{i}": tc.W_enc.T, f"b_enc_{i}": tc.b_enc, f"b_dec_{i}": tc.b_dec}
    if tc.threshold is not None:
        enc[f"threshold_{i}"] = tc.threshold
    dec = {f"W_dec_{i}": torch.cat([tc.W_dec[:, None], clt.W_later[i]], 1)}
    return ({k: v.detach().cpu().contiguous() for k, v in enc.items()},
            {k: v.detach().cpu().contiguous() for k, v in dec.items()})


def _read_config(p: Path) -> dict[str, Any]:
    import yaml

    if not (p / CONFIG).exists():
        raise FileNotFoundError(f"{p} holds no circuit-tracer transcoders ({CONFIG} missing)")
    config = yaml.safe_load((p / CONFIG).read_text()) or {}
    kind = config.get("model_kind")
    if kind != KIND:
        hint = " (per-layer transcoders: load them with sae.circuit_tracer_io.load_circuit_tracer)" \
            if kind == "transcoder_set" else ""
        raise ValueError(f"{p}: model_kind {kind!r} is not a cross-layer transcoder{hint}")
    if config.get("transcoders"):
        raise ValueError(f"{p / CONFIG} lists per-layer files (Gemma Scope 2's raw layout); convert them with "
                         f"circuit-tracer's save_transcoders_to_cache (W_enc_i / W_dec_i files) first")
    for key in ("feature_input_hook", "feature_output_hook"):
        if not config.get(key):
            raise ValueError(f"{p / CONFIG} has no {key}")
    return config


def load_circuit_tracer_clt(path: str | os.PathLike, model: Any = None, device: str | torch.device | None = None,
                            dtype: str = "float32") -> CrossLayerTranscoder:
    """Load a circuit-tracer CLT folder. With ``model``, refuse a CLT of another model (layers, width, name:
    :func:`sae.clt.check_clt`)."""
    from safetensors.torch import load_file

    p = Path(path)
    config = _read_config(p)
    found = {int(m.group(1)) for f in p.glob("W_enc_*.safetensors") if (m := _ENC.match(f.name))}
    if not found or sorted(found) != list(range(len(found))):
        raise FileNotFoundError(f"{p} holds encoder files for layers {sorted(found)}; a circuit-tracer CLT needs "
                                f"W_enc_0.safetensors .. W_enc_{{n-1}}.safetensors, every layer")
    n = len(found)
    enc = [load_file(str(p / f"W_enc_{i}.safetensors")) for i in range(n)]
    dec = [load_file(str(p / f"W_dec_{i}.safetensors")) for i in range(n)]
    d_sae, d = enc[0][f"W_enc_{0}"].shape
    arch = "jumprelu" if "threshold_0" in enc[0] else "relu"
    cfg = CLTConfig(n_layers=n, d_in=int(d), d_sae=int(d_sae), arch=arch, model_id=config.get("model_name") or "",
                    dtype=dtype, input_hook=config["feature_input_hook"], output_hook=config["feature_output_hook"],
                    meta={"source": "circuit-tracer", "path": str(p), "scan_name": config.get("scan_name")})
    clt = CrossLayerTranscoder(cfg, seed=None)
    state = {}
    for i in range(n):
        w = dec[i].get(f"W_dec_{i}")
        want = (int(d_sae), n - i, int(d))
        if w is None or tuple(w.shape) != want or tuple(enc[i][f"W_enc_{i}"].shape) != (d_sae, d):
            raise ValueError(f"{p}: layer {i}'s W_enc_{i} / W_dec_{i} are not a {n}-layer CLT's (W_dec_{i} should be "
                             f"{want}, got {None if w is None else tuple(w.shape)})")
        state.update({f"layers.{i}.W_enc": enc[i][f"W_enc_{i}"].T, f"layers.{i}.b_enc": enc[i][f"b_enc_{i}"],
                      f"layers.{i}.b_dec": enc[i][f"b_dec_{i}"], f"layers.{i}.W_dec": w[:, 0],
                      f"W_later.{i}": w[:, 1:]})
        if arch == "jumprelu":
            state[f"layers.{i}.threshold"] = enc[i][f"threshold_{i}"]
    clt.load_state_dict({k: v.to(getattr(torch, dtype)).contiguous() for k, v in state.items()})
    if model is not None:
        check_clt(model, clt)
    return clt.to(device) if device is not None else clt


__all__ = ["load_circuit_tracer_clt", "save_circuit_tracer_clt"]
