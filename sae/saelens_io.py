"""Read and write the sae-lens on-disk format (``cfg.json`` + ``sae_weights.safetensors``), offline.

We write sae-lens 6.x inference configs, the architecture and tensor names each kind declares (:mod:`sae.kinds`:
``standard``, ``topk``, ``jumprelu``, ``gated``; BatchTopK and Matryoshka BatchTopK are saved as ``jumprelu`` with
their threshold, as sae-lens does; our kind rides in ``metadata.interp_arch``) so ``sae_lens.SAE.load_from_disk``
reads our SAEs. We read those, sae-lens training checkpoints (``topk``/``batchtopk`` with decoder-norm rescaling)
and pre-6.0 configs, folding every input transform into the weights so the loaded SAE reads raw activations.
Transcoders (:class:`~sae.transcoder.Transcoder`) go both ways as sae-lens 6.x's ``transcoder``,
``skip_transcoder``, ``jumprelu_transcoder`` and ``jumprelu_skip_transcoder`` (``hook_name`` the MLP input,
``hook_name_out`` its output in ``metadata``; sae-lens keeps ``W_skip`` as ``[d_out, d_in]``, the transpose of ours;
sae-lens has no TopK transcoder). No import of ``sae_lens`` is needed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

import torch

from sae.kinds import Kind, get_kind, kind_names, saelens_kind
from sae.model import SAE, SAEConfig
from sae.transcoder import Transcoder, TranscoderConfig

CFG = "cfg.json"
WEIGHTS = "sae_weights.safetensors"
_BASE = ("W_enc", "b_enc", "W_dec", "b_dec")


def _transcoder_archs() -> dict[str, tuple[str, bool]]:
    """sae-lens transcoder architecture -> (our kind, skip), from the registered kinds."""
    out = {}
    for name in kind_names():
        pair = get_kind(name).saelens_transcoder
        if pair:
            out[pair[0]], out[pair[1]] = (name, False), (name, True)
    return out


def _saelens_version() -> str:
    try:
        return importlib.metadata.version("sae-lens")
    except importlib.metadata.PackageNotFoundError:
        return "6.0.0"


def save_saelens(sae: SAE, path: str | os.PathLike, overwrite: bool = False, model_name: str | None = None,
                 hook_name: str | None = None) -> Path:
    """Write ``PATH/cfg.json`` and ``PATH/sae_weights.safetensors`` in the sae-lens 6.x inference format."""
    from interp.io import write_json, write_safetensors

    p = Path(path)
    if p.exists() and not p.is_dir():
        raise FileExistsError(f"{p} is a file; choose a folder path")
    if not overwrite and any((p / f).exists() for f in (CFG, WEIGHTS)):
        raise FileExistsError(f"{p} already holds an SAE; pass overwrite=True to replace it, or choose another path")
    cfg, tensors = (_transcoder_files if isinstance(sae, Transcoder) else _sae_files)(sae, model_name, hook_name)
    p.mkdir(parents=True, exist_ok=True)
    write_safetensors(p / WEIGHTS, {k: v.detach().contiguous() for k, v in tensors.items()})
    write_json(p / CFG, cfg)
    return p


def _metadata(c: SAEConfig, model_name: str | None, hook_name: str | None) -> dict[str, Any]:
    return {"sae_lens_version": _saelens_version(), "sae_lens_training_version": _saelens_version(),
            "model_name": model_name or c.model_id or None, "hook_name": hook_name or c.site,
            "hook_head_index": None, "interp_arch": c.arch, "interp_k": c.k, "interp_options": _jsonable(c.options),
            "interp_meta": _jsonable(c.meta)}


def _sae_files(sae: SAE, model_name: str | None, hook_name: str | None
               ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``cfg.json`` and the weights of an SAE."""
    c, kind = sae.cfg, sae.kind
    arch = kind.saelens
    if arch is None:
        raise ValueError(f"SAE kind {c.arch!r} has no sae-lens architecture (its class sets saelens = None); save it "
                         f"with SAE.save")
    cfg: dict[str, Any] = {
        "architecture": arch, "d_in": c.d_in, "d_sae": c.d_sae, "dtype": str(sae.dtype).replace("torch.", ""),
        "device": "cpu", "apply_b_dec_to_input": bool(c.apply_b_dec_to_input), "normalize_activations": "none",
        "reshape_activations": "hook_z" if (c.site or "").endswith("hook_z") else "none",
        "metadata": _metadata(c, model_name, hook_name),
    }
    cfg.update(kind.saelens_config(sae))
    return cfg, _named_tensors(sae, kind)


def _named_tensors(sae: SAE, kind: Kind) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``sae`` under its sae-lens name (``kind.saelens_names``)."""
    return {kind.saelens_names.get(k, k): v for k, v in sae.state_dict().items() if k != "W_skip"}


def _transcoder_files(tc: Transcoder, model_name: str | None, hook_name: str | None
                      ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``cfg.json`` and the weights of a transcoder (``hook_name`` overrides the input hook)."""
    c = tc.cfg
    pair = tc.kind.saelens_transcoder
    arch = pair[int(c.skip)] if pair else None
    if arch is None:
        raise ValueError(f"sae-lens has no {c.arch} transcoder (only ReLU and JumpReLU, with or without skip); save "
                         f"this one with sae.circuit_tracer_io.save_circuit_tracer or Transcoder.save")
    md = {**_metadata(c, model_name, hook_name or c.input_site), "hook_name_out": c.site, "hook_head_index_out": None,
          "interp_layer": c.layer}
    cfg = {"architecture": arch, "d_in": c.d_in, "d_sae": c.d_sae, "d_out": c.d_in,
           "dtype": str(tc.dtype).replace("torch.", ""), "device": "cpu", "apply_b_dec_to_input": False,
           "normalize_activations": "none", "reshape_activations": "none", "metadata": md}
    tensors = _named_tensors(tc, tc.kind)
    if tc.W_skip is not None:
        tensors["W_skip"] = tc.W_skip.T  # sae-lens: x @ W_skip.T
    return cfg, tensors


def _jsonable(obj: Any) -> Any:
    try:
        json.dumps(obj)
        return obj
    except TypeError:
        return json.loads(json.dumps(obj, default=str))


def _upgrade_pre6(cfg: dict[str, Any]) -> dict[str, Any]:
    """Rename pre-6.0 keys (``hook_point`` ...) and move model/hook names into ``metadata``."""
    ren = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index", "activation_fn_str": "activation_fn"}
    c = {ren.get(k, k): v for k, v in cfg.items()}
    if "architecture" not in c:
        kw = c.get("activation_fn_kwargs") or {}
        c["architecture"] = "topk" if c.get("activation_fn") == "topk" and kw.get("k") else "standard"
        if c["architecture"] == "topk":
            c["k"] = kw["k"]
    if isinstance(c.get("normalize_activations"), bool):
        c["normalize_activations"] = "expected_average_only_in" if c["normalize_activations"] else "none"
    md = dict(c.get("metadata") or {})
    for k in ("model_name", "hook_name", "hook_head_index"):
        if k in c and k not in md:
            md[k] = c[k]
    c["metadata"] = md
    return c


def _version_of(cfg: dict[str, Any]) -> tuple[int, ...]:
    v = cfg.get("sae_lens_version") or (cfg.get("metadata") or {}).get("sae_lens_version")
    if not v:
        return (0,)
    try:
        return tuple(int(x) for x in str(v).split("-")[0].split(".")[:2])
    except ValueError:
        return (0,)


def _scaling_factor_from_folder(p: Path) -> float | None:
    f = p / "activation_scaler.json"
    if f.exists():
        data = json.loads(f.read_text())
        sf = data.get("scaling_factor") if isinstance(data, dict) else None
        return float(sf) if sf is not None else None
    return None


def load_saelens(path: str | os.PathLike, device: str | torch.device | None = None, dtype: str | None = None,
                 norm_scaling_factor: float | None = None, site: str | None = None) -> SAE:
    """Load a sae-lens SAE folder (ours or theirs, e.g. a downloaded pretrained release) offline.

    The loaded SAE reads raw activations: decoder-norm rescaling, the old ``scaling_factor`` and
    ``expected_average_only_in`` normalisation (``norm_scaling_factor`` or the
    folder's ``activation_scaler.json``) are folded into the weights. Its ``hook_name`` becomes our site
    (``interp.sites.parse_site``); pass ``site=`` to override it. A transcoder folder loads as a
    :class:`~sae.transcoder.Transcoder` (``hook_name`` its input site, ``hook_name_out`` its site; ``site=``
    overrides the latter).
    """
    p = Path(path)
    cfg = _read_cfg(p)
    md = cfg.get("metadata") or {}
    arch_in = cfg.get("architecture", "standard")
    if arch_in in _transcoder_archs():
        return _load_transcoder(p, cfg, device, dtype, site)
    kind = saelens_kind(arch_in, md)  # an unregistered kind of ours fails here, naming register_kind
    w = _read_weights(p, cfg, kind)
    _fold_input_transforms(w, cfg, p, norm_scaling_factor)
    k, options = kind.from_saelens(cfg, md)
    hook = site or md.get("hook_name") or cfg.get("hook_name")
    out_dtype = str(dtype or cfg.get("dtype", "float32")).replace("torch.", "")
    meta = {"source": "sae-lens", "path": str(p), "hook_name": hook, "architecture": arch_in}
    if isinstance(md.get("interp_meta"), dict):
        meta.update(md["interp_meta"])
    d_in, d_sae = w["W_enc"].shape
    sc = SAEConfig(d_in=d_in, d_sae=d_sae, arch=kind.name, k=k, site=hook, model_id=md.get("model_name") or "",
                   dtype=out_dtype, apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)), meta=meta,
                   options=options)
    sae = SAE(sc, seed=None)
    missing = sorted(set(sae.state_dict()) - set(w))
    if missing:
        names = [kind.saelens_names.get(m, m) for m in missing]
        raise ValueError(f"{p}: a {arch_in} SAE (our kind {kind.name!r}) needs the tensors {names} in {WEIGHTS}")
    dt = sc.torch_dtype
    with torch.no_grad():
        for name, t in sae.state_dict().items():
            t.copy_(w[name].to(dt))
    return sae.to(device) if device is not None else sae


def _read_cfg(p: Path) -> dict[str, Any]:
    """``cfg.json`` upgraded to the 6.x layout, with everything we cannot load refused up front."""
    if not (p / CFG).exists():
        subs = sorted(q.parent.name for q in p.glob(f"*/{CFG}")) if p.is_dir() else []
        hint = f"; SAEs found in sub-folders: {subs[:8]}" if subs else ""
        raise FileNotFoundError(f"{p} holds no sae-lens SAE ({CFG} missing){hint}")
    if not (p / WEIGHTS).exists():
        raise FileNotFoundError(f"{p / WEIGHTS} is missing; download the weights next to {CFG}")
    cfg = json.loads((p / CFG).read_text())
    if _version_of(cfg) < (6, 0):
        cfg = _upgrade_pre6(cfg)
    md = cfg.get("metadata") or {}
    arch_in = cfg.get("architecture", "standard")
    if arch_in not in _transcoder_archs():
        saelens_kind(arch_in, md)  # refuses an architecture no registered kind reads
    if cfg.get("activation_fn", "relu") not in ("relu", "topk", None) and arch_in == "standard":
        raise ValueError(f"activation {cfg['activation_fn']!r} is not supported; only ReLU standard SAEs load")
    if md.get("hook_head_index") is not None or cfg.get("hook_head_index") is not None:
        raise ValueError("SAEs on a single attention head (hook_head_index) are not supported; use a full-site SAE")
    norm = cfg.get("normalize_activations", "none") or "none"
    if norm not in ("none", "expected_average_only_in"):
        raise ValueError(f"normalize_activations={norm!r} is applied at run time by sae-lens and cannot be folded "
                         f"into the weights; only 'none' and 'expected_average_only_in' load")
    return cfg


def _read_weights(p: Path, cfg: dict[str, Any], kind: Kind) -> dict[str, torch.Tensor]:
    """The weights in float64 under our names (``kind.saelens_names`` reversed; ``threshold`` also from
    ``log_threshold`` / ``topk_threshold``; ``scaling_factor`` kept for folding)."""
    from safetensors.torch import load_file

    st = {k: v.to(torch.float64) for k, v in load_file(str(p / WEIGHTS)).items()}
    st.update({ours: st[theirs] for ours, theirs in kind.saelens_names.items() if theirs in st})
    W_enc, W_dec = st["W_enc"], st["W_dec"]
    d_in, d_sae = W_enc.shape
    if W_dec.shape != (d_sae, d_in) or cfg.get("d_sae", d_sae) != d_sae or cfg.get("d_in", d_in) != d_in:
        raise ValueError(f"{p}: weight shapes W_enc {tuple(W_enc.shape)}, W_dec {tuple(W_dec.shape)} do not match "
                         f"d_in={cfg.get('d_in')}, d_sae={cfg.get('d_sae')}")
    w = {k: v for k, v in st.items() if k not in ("log_threshold", "topk_threshold")}
    w.setdefault("b_enc", torch.zeros(d_sae, dtype=torch.float64))
    if "threshold" not in st and "log_threshold" in st:
        w["threshold"] = st["log_threshold"].exp()
    elif "threshold" not in st and "topk_threshold" in st:
        w["threshold"] = st["topk_threshold"].reshape(()).expand(d_sae).clone()
    return w


def _fold_input_transforms(w: dict[str, torch.Tensor], cfg: dict[str, Any], p: Path,
                           norm_scaling_factor: float | None) -> None:
    """Fold the old latent scale, decoder-norm rescaling and input normalisation into ``w`` (in place)."""
    sf_old = w.pop("scaling_factor", None)
    if sf_old is not None and not torch.allclose(sf_old, torch.ones(())):
        w["W_dec"] = w["W_dec"] * sf_old[:, None]  # old finetuning scale multiplied the latents
    if cfg.get("rescale_acts_by_decoder_norm"):
        # latents were read as z * ||W_dec||: fold the norms so decoder rows are unit and outputs identical
        n = w["W_dec"].norm(dim=1).clamp_min(1e-8)
        w["W_enc"], w["b_enc"], w["W_dec"] = w["W_enc"] * n[None, :], w["b_enc"] * n, w["W_dec"] / n[:, None]
    if (cfg.get("normalize_activations", "none") or "none") == "expected_average_only_in":
        sf = norm_scaling_factor or _scaling_factor_from_folder(p)
        if sf is None:
            raise ValueError(f"{p} was trained on inputs scaled by a constant (normalize_activations="
                             f"'expected_average_only_in') that the folder does not record; pass "
                             f"norm_scaling_factor=... (sae-lens lists it in pretrained_saes.yaml)")
        w["W_enc"] = w["W_enc"] * sf  # scale the input by sf, and the output back by 1/sf
        w["W_dec"], w["b_dec"] = w["W_dec"] / sf, w["b_dec"] / sf


def _load_transcoder(p: Path, cfg: dict[str, Any], device: str | torch.device | None, dtype: str | None,
                     site: str | None) -> Transcoder:
    """A sae-lens transcoder folder as our :class:`Transcoder` (``site``: override the output hook)."""
    import re

    from safetensors.torch import load_file

    arch, skip = _transcoder_archs()[cfg["architecture"]]
    md = cfg.get("metadata") or {}
    d_in, d_out = int(cfg["d_in"]), int(cfg.get("d_out", cfg["d_in"]))
    if d_out != d_in:
        raise ValueError(f"{p}: a transcoder from width {d_in} to width {d_out} is not supported; ours map an MLP's "
                         f"input to its output, both of the model's width")
    if (cfg.get("normalize_activations") or "none") != "none":
        raise ValueError(f"{p}: normalize_activations={cfg['normalize_activations']!r} is not supported for transcoders")
    w = load_file(str(p / WEIGHTS))
    hook_in = md.get("hook_name") or cfg.get("hook_name")
    hook_out = site or md.get("hook_name_out") or cfg.get("hook_name_out")
    layer = md.get("interp_layer")
    if layer is None:
        m = re.match(r"^blocks\.(\d+)\.", str(hook_in or hook_out or ""))
        layer = int(m.group(1)) if m else 0
    meta = {"source": "sae-lens", "path": str(p), "hook_name": hook_in, "hook_name_out": hook_out,
            "architecture": cfg["architecture"], **(md["interp_meta"] if isinstance(md.get("interp_meta"), dict) else {})}
    tcfg = TranscoderConfig(d_in=d_in, d_sae=int(w["W_enc"].shape[1]), arch=arch, layer=int(layer), skip=skip,
                            input_site=hook_in, site=hook_out, model_id=md.get("model_name") or "",
                            dtype=str(dtype or cfg.get("dtype", "float32")).replace("torch.", ""), meta=meta)
    tc = Transcoder(tcfg, seed=None)
    names = tc.kind.saelens_names
    state = {k: w[names.get(k, k)] for k in tc.state_dict() if k != "W_skip" and names.get(k, k) in w}
    if skip:
        state["W_skip"] = w["W_skip"].T
    want = {k: tuple(v.shape) for k, v in tc.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if want != got:
        raise ValueError(f"{p}: weight shapes {got} do not match a {cfg['architecture']} of d_in={d_in}, "
                         f"d_sae={tcfg.d_sae} ({want})")
    tc.load_state_dict({k: v.to(tcfg.torch_dtype) for k, v in state.items()})
    return tc.to(device) if device is not None else tc
