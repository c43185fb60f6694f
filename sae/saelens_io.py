"""Read and write the sae-lens on-disk format (``cfg.json`` + ``sae_weights.safetensors``), offline.

We write sae-lens 6.x inference configs (``standard``, ``topk``, ``jumprelu``; BatchTopK is saved as
``jumprelu`` with its threshold, as sae-lens does) so ``sae_lens.SAE.load_from_disk`` reads our SAEs.
We read those, sae-lens training checkpoints (``topk``/``batchtopk`` with decoder-norm rescaling) and
pre-6.0 configs, folding every input transform into the weights so the loaded SAE reads raw activations.
No import of ``sae_lens`` is needed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

import torch

from sae.model import SAE, SAEConfig

CFG = "cfg.json"
WEIGHTS = "sae_weights.safetensors"
_ARCH_OUT = {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu", "batchtopk": "jumprelu"}
_SUPPORTED_IN = ("standard", "topk", "jumprelu", "batchtopk")


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
    c = sae.cfg
    arch = _ARCH_OUT[c.arch]
    cfg: dict[str, Any] = {
        "architecture": arch, "d_in": c.d_in, "d_sae": c.d_sae, "dtype": str(sae.dtype).replace("torch.", ""),
        "device": "cpu", "apply_b_dec_to_input": bool(c.apply_b_dec_to_input), "normalize_activations": "none",
        "reshape_activations": "hook_z" if (c.site or "").endswith("hook_z") else "none",
        "metadata": {
            "sae_lens_version": _saelens_version(), "sae_lens_training_version": _saelens_version(),
            "model_name": model_name or c.model_id or None, "hook_name": hook_name or c.site,
            "hook_head_index": None, "interp_arch": c.arch, "interp_k": c.k, "interp_meta": _jsonable(c.meta),
        },
    }
    if arch == "topk":
        cfg["k"] = int(c.k)
        cfg["rescale_acts_by_decoder_norm"] = False
    tensors = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
    if arch == "jumprelu":
        tensors["threshold"] = sae.threshold
    p.mkdir(parents=True, exist_ok=True)
    write_safetensors(p / WEIGHTS, {k: v.detach() for k, v in tensors.items()})
    write_json(p / CFG, cfg)
    return p


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
    (``interp.sites.parse_site``); pass ``site=`` to override it.
    """
    p = Path(path)
    cfg = _read_cfg(p)
    md = cfg.get("metadata") or {}
    arch_in = cfg.get("architecture", "standard")
    w = _read_weights(p, cfg)
    _fold_input_transforms(w, cfg, p, norm_scaling_factor)
    arch, k = _our_arch(arch_in, cfg, md, w.get("threshold"), p)
    hook = site or md.get("hook_name") or cfg.get("hook_name")
    out_dtype = str(dtype or cfg.get("dtype", "float32")).replace("torch.", "")
    meta = {"source": "sae-lens", "path": str(p), "hook_name": hook, "architecture": arch_in}
    if isinstance(md.get("interp_meta"), dict):
        meta.update(md["interp_meta"])
    d_in, d_sae = w["W_enc"].shape
    sc = SAEConfig(d_in=d_in, d_sae=d_sae, arch=arch, k=k, site=hook, model_id=md.get("model_name") or "",
                   dtype=out_dtype, apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)), meta=meta)
    sae = SAE(sc, seed=None)
    dt = sc.torch_dtype
    with torch.no_grad():
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            getattr(sae, name).copy_(w[name].to(dt))
        if sae.threshold is not None:
            sae.threshold.copy_(w["threshold"].to(dt))
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
    if arch_in not in _SUPPORTED_IN:
        raise ValueError(f"sae-lens architecture {arch_in!r} is not supported here; supported: {_SUPPORTED_IN}")
    if cfg.get("activation_fn", "relu") not in ("relu", "topk", None) and arch_in == "standard":
        raise ValueError(f"activation {cfg['activation_fn']!r} is not supported; only ReLU standard SAEs load")
    if md.get("hook_head_index") is not None or cfg.get("hook_head_index") is not None:
        raise ValueError("SAEs on a single attention head (hook_head_index) are not supported; use a full-site SAE")
    norm = cfg.get("normalize_activations", "none") or "none"
    if norm not in ("none", "expected_average_only_in"):
        raise ValueError(f"normalize_activations={norm!r} is applied at run time by sae-lens and cannot be folded "
                         f"into the weights; only 'none' and 'expected_average_only_in' load")
    return cfg


def _read_weights(p: Path, cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights in float64 (``W_enc, b_enc, W_dec, b_dec``, ``threshold`` if any; ``scaling_factor`` kept)."""
    from safetensors.torch import load_file

    st = {k: v.to(torch.float64) for k, v in load_file(str(p / WEIGHTS)).items()}
    W_enc, W_dec = st["W_enc"], st["W_dec"]
    d_in, d_sae = W_enc.shape
    if W_dec.shape != (d_sae, d_in) or cfg.get("d_sae", d_sae) != d_sae or cfg.get("d_in", d_in) != d_in:
        raise ValueError(f"{p}: weight shapes W_enc {tuple(W_enc.shape)}, W_dec {tuple(W_dec.shape)} do not match "
                         f"d_in={cfg.get('d_in')}, d_sae={cfg.get('d_sae')}")
    w = {"W_enc": W_enc, "W_dec": W_dec, "b_dec": st["b_dec"],
         "b_enc": st.get("b_enc", torch.zeros(d_sae, dtype=torch.float64))}
    if "threshold" in st:
        w["threshold"] = st["threshold"]
    elif "log_threshold" in st:
        w["threshold"] = st["log_threshold"].exp()
    elif "topk_threshold" in st:
        w["threshold"] = st["topk_threshold"].reshape(()).expand(d_sae).clone()
    if "scaling_factor" in st:
        w["scaling_factor"] = st["scaling_factor"]
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


def _our_arch(arch_in: str, cfg: dict[str, Any], md: dict[str, Any], threshold: torch.Tensor | None, p: Path
              ) -> tuple[str, int | None]:
    """Our ``(arch, k)`` for a sae-lens architecture (BatchTopK saved as JumpReLU by us comes back as BatchTopK)."""
    if arch_in == "topk":
        return "topk", int(cfg["k"])
    if arch_in == "standard":
        return "relu", None
    if threshold is None:
        raise ValueError(f"{p}: a {arch_in} SAE needs a threshold tensor in {WEIGHTS}")
    if arch_in == "batchtopk":
        return "batchtopk", int(round(float(cfg["k"])))
    if md.get("interp_arch") == "batchtopk" and md.get("interp_k"):
        return "batchtopk", int(md["interp_k"])
    return "jumprelu", None
