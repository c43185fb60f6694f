"""Read and write circuit-tracer's per-layer transcoder folders (a ``transcoder_set``), offline, without its package.

The layout, taken from circuit-tracer's source (``circuit_tracer/transcoder/single_layer_transcoder.py``:
``SingleLayerTranscoder.to_safetensors`` / ``load_transcoder`` / ``load_transcoder_set``; ``circuit_tracer/utils/
hf_utils.py``: ``load_transcoders`` / ``resolve_transcoder_paths``; ``circuit_tracer/utils/caching.py``:
``load_transcoders_from_cache``)::

    FOLDER/config.yaml            model_kind: transcoder_set, model_name, feature_input_hook, feature_output_hook,
                                  scan_name, activation (relu | jumprelu | topk), k (topk only)
    FOLDER/layer_{i}.safetensors  one per layer 0..n-1, every layer present:
        W_enc [d_transcoder, d_model]   (their encode is F.linear(x, W_enc, b_enc): the transpose of ours)
        W_dec [d_transcoder, d_model]   b_enc [d_transcoder]   b_dec [d_model]
        activation_function.threshold [d_transcoder]   (JumpReLU only)
        W_skip [d_model, d_model]       (skip only; theirs adds x @ W_skip.T: the transpose of ours)

Hooks are written without the ``blocks.{i}.`` prefix (``mlp.hook_in`` / ``mlp.hook_out``, the names our sites take
from circuit-tracer). TopK's ``k`` goes in ``config.yaml`` only: their ``load_transcoder`` loads every tensor of the
file strictly into the module, which has no ``k``. Their TopK keeps the top ``k`` pre-activations as they are, ours
keeps their positive part; the two agree wherever the ``k``-th largest pre-activation is positive.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from sae.kinds import Kind, get_kind, kind_names
from sae.transcoder import Transcoder, TranscoderConfig

CONFIG = "config.yaml"
_LAYER_FILE = re.compile(r"^layer_(\d+)\.safetensors$")


def _hook_suffix(site: str | None, layer: int, what: str) -> str:
    prefix = f"blocks.{layer}."
    if not site or not site.startswith(prefix):
        raise ValueError(f"the transcoder of layer {layer} has {what} {site!r}, not a 'blocks.{layer}.*' hook; "
                         f"circuit-tracer names one hook for every layer")
    return site[len(prefix):]


def _as_layers(transcoders: Mapping[int, Transcoder] | Iterable[Transcoder]) -> dict[int, Transcoder]:
    items = dict(transcoders) if isinstance(transcoders, Mapping) else {t.layer: t for t in transcoders}
    if not items or sorted(items) != list(range(len(items))):
        raise ValueError(f"circuit-tracer needs one transcoder for every layer 0..n-1; got layers {sorted(items)}")
    for layer, tc in items.items():
        if not isinstance(tc, Transcoder) or tc.layer != layer:
            raise ValueError(f"entry {layer} is not the Transcoder of layer {layer}")
    first = items[0].cfg
    for tc in items.values():
        c = tc.cfg
        if (c.arch, c.k, c.skip, c.d_sae, c.d_in) != (first.arch, first.k, first.skip, first.d_sae, first.d_in):
            raise ValueError("circuit-tracer's transcoder set shares one activation, k, skip and width over its "
                             f"layers; layer {c.layer} differs from layer 0")
    return dict(sorted(items.items()))


def save_circuit_tracer(transcoders: Mapping[int, Transcoder] | Iterable[Transcoder], path: str | os.PathLike,
                        model_name: str | None = None, scan_name: str | None = None, overwrite: bool = False) -> Path:
    """Write ``PATH/config.yaml`` and ``PATH/layer_{i}.safetensors`` for every layer (each file written atomically;
    refuses to overwrite unless ``overwrite=True``, which also removes stale ``layer_*`` files of a longer set)."""
    import yaml

    from interp.io import atomic_write, write_safetensors

    tcs = _as_layers(transcoders)
    if tcs[0].kind.circuit_tracer is None:
        raise ValueError(f"circuit-tracer has no activation for SAE kind {tcs[0].cfg.arch!r}; save these transcoders "
                         f"with Transcoder.save")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise FileExistsError(f"{p} is a file; choose a folder path")
    old = [f for f in p.glob("layer_*.safetensors") if _LAYER_FILE.match(f.name)] if p.exists() else []
    if (old or (p / CONFIG).exists()) and not overwrite:
        raise FileExistsError(f"{p} already holds transcoders; pass overwrite=True to replace them, or choose another path")
    c0 = tcs[0].cfg
    hook_in = {_hook_suffix(t.cfg.input_site, i, "input site") for i, t in tcs.items()}
    hook_out = {_hook_suffix(t.cfg.site, i, "output site") for i, t in tcs.items()}
    if len(hook_in) > 1 or len(hook_out) > 1:
        raise ValueError(f"circuit-tracer names one input and one output hook for all layers; got {hook_in}, {hook_out}")
    p.mkdir(parents=True, exist_ok=True)
    for f in old:
        if int(_LAYER_FILE.match(f.name).group(1)) >= len(tcs):
            f.unlink()
    for i, tc in tcs.items():
        write_safetensors(p / f"layer_{i}.safetensors", _layer_tensors(tc))
    config: dict[str, Any] = {"model_kind": "transcoder_set", "model_name": model_name or c0.model_id or None,
                              "feature_input_hook": hook_in.pop(), "feature_output_hook": hook_out.pop(),
                              "scan_name": scan_name or p.name, "activation": tcs[0].kind.circuit_tracer}
    if tcs[0].kind.needs_k:
        config["k"] = int(c0.k)
    text = yaml.safe_dump(config, sort_keys=False)
    atomic_write(p / CONFIG, lambda tmp: Path(tmp).write_text(text))
    return p


def _layer_tensors(tc: Transcoder) -> dict[str, torch.Tensor]:
    t = {"W_enc": tc.W_enc.T, "W_dec": tc.W_dec, "b_enc": tc.b_enc, "b_dec": tc.b_dec}
    for name, _ in tc.kind.extra:  # the activation's own tensors (JumpReLU's threshold)
        t[f"activation_function.{name}"] = getattr(tc, name)
    if tc.W_skip is not None:
        t["W_skip"] = tc.W_skip.T
    return {k: v.detach().cpu().contiguous() for k, v in t.items()}


def _layer_paths(p: Path, config: dict[str, Any]) -> list[Path]:
    if config.get("transcoders"):
        paths = [str(q) for q in config["transcoders"]]
        remote = [q for q in paths if q.startswith("hf://")]
        if remote:
            raise ValueError(f"{p / CONFIG} points at remote files ({remote[0]}, ...); download them and save the set "
                             f"locally (circuit_tracer.utils.caching.save_transcoders_to_cache) first")
        return [Path(q) if Path(q).is_absolute() else p / q for q in paths]
    found = {int(m.group(1)): f for f in p.glob("layer_*.safetensors") if (m := _LAYER_FILE.match(f.name))}
    if not found or sorted(found) != list(range(len(found))):
        raise FileNotFoundError(f"{p} holds layer files for layers {sorted(found)}; circuit-tracer needs "
                                f"layer_0.safetensors .. layer_{{n-1}}.safetensors, every layer")
    return [found[i] for i in range(len(found))]


def load_circuit_tracer(path: str | os.PathLike, device: str | torch.device | None = None,
                        dtype: str = "float32") -> dict[int, Transcoder]:
    """Load a circuit-tracer ``transcoder_set`` folder as ``{layer: Transcoder}`` (sites ``blocks.{i}.`` + the
    config's ``feature_input_hook`` / ``feature_output_hook``)."""
    import yaml
    from safetensors.torch import load_file

    p = Path(path)
    if not (p / CONFIG).exists():
        raise FileNotFoundError(f"{p} holds no circuit-tracer transcoders ({CONFIG} missing)")
    config = yaml.safe_load((p / CONFIG).read_text()) or {}
    kind = config.get("model_kind")
    if kind != "transcoder_set":
        hint = ("a cross-layer transcoder: load it with sae.clt_io.load_circuit_tracer_clt" if kind ==
                "cross_layer_transcoder" else "only per-layer transcoders (transcoder_set) load here")
        raise ValueError(f"{p}: model_kind {kind!r} is not a per-layer transcoder set; {hint}")
    for key in ("feature_input_hook", "feature_output_hook"):
        if not config.get(key):
            raise ValueError(f"{p / CONFIG} has no {key}")
    out = {}
    for i, f in enumerate(_layer_paths(p, config)):
        if f.suffix != ".safetensors":
            raise ValueError(f"{f}: only safetensors layer files load (not Gemma Scope's .npz); convert the set with "
                             f"circuit-tracer's save_transcoders_to_cache first")
        out[i] = _from_tensors(load_file(str(f)), i, config, str(f), dtype)
    return {i: tc.to(device) for i, tc in out.items()} if device is not None else out


def _from_tensors(w: dict[str, torch.Tensor], layer: int, config: dict[str, Any], where: str, dtype: str
                  ) -> Transcoder:
    kind = _kind_for(config.get("activation"), "activation_function.threshold" in w)
    arch = kind.name
    k = None
    if kind.needs_k:
        k = config.get("k") if config.get("k") is not None else (int(w["k"]) if "k" in w else None)
        if k is None:
            raise ValueError(f"{where}: a TopK transcoder set needs k in {CONFIG}")
    d_sae, d = w["W_enc"].shape
    if w["W_dec"].shape != (d_sae, d) or w["b_dec"].shape != (d,) or w["b_enc"].shape != (d_sae,):
        raise ValueError(f"{where}: shapes W_enc {tuple(w['W_enc'].shape)}, W_dec {tuple(w['W_dec'].shape)}, b_enc "
                         f"{tuple(w['b_enc'].shape)}, b_dec {tuple(w['b_dec'].shape)} are not a transcoder's")
    cfg = TranscoderConfig(d_in=d, d_sae=d_sae, arch=arch, k=int(k) if k is not None else None, layer=layer,
                           skip="W_skip" in w, input_site=f"blocks.{layer}.{config['feature_input_hook']}",
                           site=f"blocks.{layer}.{config['feature_output_hook']}",
                           model_id=config.get("model_name") or "", dtype=dtype,
                           meta={"source": "circuit-tracer", "path": where, "scan_name": config.get("scan_name")})
    tc = Transcoder(cfg, seed=None)
    state = {"W_enc": w["W_enc"].T, "W_dec": w["W_dec"], "b_enc": w["b_enc"], "b_dec": w["b_dec"]}
    for name, _ in kind.extra:
        state[name] = w[f"activation_function.{name}"]
    if "W_skip" in w:
        state["W_skip"] = w["W_skip"].T
    tc.load_state_dict({key: v.to(cfg.torch_dtype) for key, v in state.items()})
    return tc


def _kind_for(activation: str | None, has_threshold: bool) -> Kind:
    """The registered kind circuit-tracer's ``activation`` names (unnamed: JumpReLU with a threshold, else ReLU)."""
    by_name = {get_kind(n).circuit_tracer: get_kind(n) for n in kind_names() if get_kind(n).circuit_tracer}
    if activation in by_name:
        return by_name[activation]
    return get_kind("jumprelu" if has_threshold else "relu")
