"""Input checks shared by the steering package: directions, bases, layers, sites, scopes, scalars.

Every public entry point funnels user input through here, so bad input fails early with a message that
names the fix (``ValueError`` / ``TypeError``), never deep inside a forward pass.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from interp.sites import BLOCK_KINDS, Layers, parse_site, resolve_layers  # noqa: F401  (re-exported)

SCOPES = ("prompt", "generated", "both")
STREAM_KINDS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "experts_out", "shared_expert_out")
POSITION_RULES = ("all", "post_instruction")
ORTHO_TOL = 1e-4
MAGNITUDES = ("raw", "unit")



def as_tensor(obj: Any, name: str) -> torch.Tensor:
    """A float tensor from a tensor, array, list, or an object with a ``.vectors`` tensor (a probes Direction)."""
    if hasattr(obj, "vectors") and not isinstance(obj, torch.Tensor):
        obj = obj.vectors
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
    else:
        try:
            t = torch.as_tensor(obj)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name} must be a tensor ([d] or [n_layers, d]) or an object with a .vectors tensor, "
                            f"got {type(obj).__name__}") from e
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"{name} must hold real numbers, got dtype {t.dtype}")
    t = t.to(torch.float32) if t.dtype != torch.float64 else t
    if t.numel() == 0:
        raise ValueError(f"{name} is empty")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or Inf; check how it was computed")
    return t.cpu()


def check_finite(value: Any, name: str) -> float:
    """A finite Python float, or a clear error."""
    try:
        v = float(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a number, got {type(value).__name__}") from e
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}; pick a finite coefficient")
    return v


def object_layers(obj: Any, n_rows: int, name: str) -> list[int] | None:
    """The layers an object names for its rows (a probes Direction's ``.layers``, or its ``.sites``), else None.

    A bare tensor names none: its rows are matched to layers by :func:`label_rows`."""
    if isinstance(obj, torch.Tensor):
        return None
    layers = getattr(obj, "layers", None)
    if layers is None and getattr(obj, "sites", None) is not None:
        layers = [parse_site(s).layer for s in obj.sites]
    if layers is None:
        return None
    if any(x is None for x in layers):
        raise ValueError(f"{name}: its sites {getattr(obj, 'sites', layers)} are not all per-layer sites; steer "
                         f"with vectors fitted at blocks.{{i}}.* sites")
    layers = [int(x) for x in layers]
    if len(layers) != n_rows:
        raise ValueError(f"{name}: {len(layers)} layers named but {n_rows} vectors")
    return layers


def per_layer_vectors(obj: Any, name: str) -> torch.Tensor | dict[int, torch.Tensor]:
    """``[d]`` stays one shared vector; a ``{layer: [d]}`` dict or an object naming its layers (a probes
    Direction) becomes ``{layer: [d]}``; a bare ``[k, d]`` tensor stays 2-D until :func:`label_rows` knows
    the model and the ``layers=`` asked for (its rows carry no layer labels)."""
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, int):
                raise TypeError(f"{name}: dict keys must be layer ints, got {k!r}")
            t = as_tensor(v, f"{name}[{k}]")
            if t.dim() != 1:
                raise ValueError(f"{name}[{k}] must be one vector [d], got shape {tuple(t.shape)}")
            out[k] = t
        if not out:
            raise ValueError(f"{name} is an empty dict; give at least one layer's vector")
        return out
    t = as_tensor(obj, name)
    if t.dim() == 1:
        return t
    if t.dim() != 2:
        raise ValueError(f"{name} must be [d] (one vector) or [n_layers, d] (one per layer), got shape "
                         f"{tuple(t.shape)}; for a subspace basis use AblateSubspace")
    layers = object_layers(obj, t.shape[0], name)
    if layers is not None:
        return {layer: t[i] for i, layer in enumerate(layers)}
    return t


def label_rows(t: torch.Tensor, layers: Layers | None, n_layers: int, name: str) -> torch.Tensor | dict[int, torch.Tensor]:
    """Rows of a bare ``[k, ...]`` tensor -> ``{layer: row}``, without guessing.

    - ``layers=`` a list of ``k`` layers: row ``i`` is for ``layers[i]`` (e.g. ``d.select([10..14]).raw``
      with ``layers=[10, ..., 14]``);
    - ``k == n_layers``: row ``i`` is layer ``i`` (a full per-layer table) and ``layers=`` picks among them;
    - ``k == 1`` with no list of layers: the one row is shared by every layer asked for;
    - anything else is an error: a ``[k, d]`` band silently mapped to layers ``0..k-1`` would steer the
      wrong layers.
    """
    k = t.shape[0]
    explicit = None if layers is None or isinstance(layers, str) else ([layers] if isinstance(layers, int)
                                                                          else list(layers))
    if explicit is not None and len(explicit) == k:
        keys = resolve_layers(explicit, n_layers, None, name, keep_order=True)
        return {layer: t[i] for i, layer in enumerate(keys)}
    if k == n_layers:
        return {i: t[i] for i in range(k)}
    if k == 1 and explicit is None:
        return t[0]
    raise ValueError(f"{name}: a bare tensor of {k} rows does not say which layers its rows are for (this model "
                     f"has {n_layers} layers, so they are not one per layer); pass layers=[...] with {k} layers "
                     f"(row i is for layers[i]), or pass the probes Direction itself (e.g. d.select(band), not "
                     f"d.select(band).raw), which carries its layers")


def resolve_kinds(sites: str | Sequence[str]) -> tuple[str, ...]:
    """Site kinds an intervention writes to (residual-width sites only)."""
    items = [sites] if isinstance(sites, str) else list(sites)
    if not items:
        raise ValueError("sites is empty; give e.g. 'resid_post' or ('resid_pre', 'attn_out', 'mlp_out')")
    out = []
    for s in items:
        kind = parse_site(f"{s}.0").kind if s not in BLOCK_KINDS else s
        if kind not in STREAM_KINDS:
            raise ValueError(f"site kind {s!r} is not residual-width; steering edits act on {STREAM_KINDS}")
        out.append(kind)
    return tuple(dict.fromkeys(out))


def check_scope(scope: str) -> str:
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    return scope


def check_positions(positions: Any, scope: str) -> str | tuple[int, ...]:
    """``"all"``, ``"post_instruction"`` or explicit prompt positions (negative from the prompt's end)."""
    if isinstance(positions, str):
        if positions not in POSITION_RULES:
            raise ValueError(f"positions must be one of {POSITION_RULES} or explicit ints, got {positions!r}")
        out: str | tuple[int, ...] = positions
    else:
        items = [positions] if isinstance(positions, int) else list(positions)
        if not items or any(isinstance(p, bool) or not isinstance(p, int) for p in items):
            raise ValueError(f"positions must be 'all', 'post_instruction' or a non-empty list of ints, got {positions!r}")
        out = tuple(sorted(set(items)))
    if out != "all" and scope == "generated":
        raise ValueError("positions select prompt tokens; with scope='generated' use positions='all' "
                         "(every generated token)")
    return out


def unit(v: torch.Tensor, name: str) -> torch.Tensor:
    n = v.norm()
    if not n > 1e-12:
        raise ValueError(f"{name} has zero norm; a direction needs a nonzero vector")
    return v / n


def orthonormal(basis: torch.Tensor, name: str, orthonormalize: bool) -> torch.Tensor:
    """Rows of ``basis [k, d]`` checked orthonormal; with ``orthonormalize`` they are QR-orthonormalised (warned)."""
    if basis.dim() != 2:
        raise ValueError(f"{name} must be [k, d], got shape {tuple(basis.shape)}")
    k, d = basis.shape
    if k > d:
        raise ValueError(f"{name} has {k} rows but width {d}; a basis has at most d rows")
    b64 = basis.double()
    gram = b64 @ b64.T
    err = (gram - torch.eye(k, dtype=torch.float64)).abs().max().item()
    if err <= ORTHO_TOL:
        return basis
    if not orthonormalize:
        raise ValueError(f"{name} is not orthonormal (max |Q Q^T - I| = {err:.3g}); pass orthonormalize=True to "
                         f"orthonormalise it (QR, same span) or orthonormalise it yourself")
    q, r = torch.linalg.qr(b64.T)
    rank = int((r.diagonal().abs() > 1e-8 * r.diagonal().abs().max()).sum())
    if rank < k:
        raise ValueError(f"{name} has rank {rank} < {k} rows; drop the dependent rows")
    warnings.warn(f"{name} was not orthonormal (max |Q Q^T - I| = {err:.3g}); orthonormalised it by QR "
                  f"(same span)", stacklevel=3)
    return q.T.to(basis.dtype)


def own_kind(vector: Any) -> str:
    """The one site kind an object's ``.sites`` share (a Direction fitted at ``resid_pre``), else ``resid_post``."""
    kinds = {parse_site(s).kind for s in getattr(vector, "sites", None) or []}
    return kinds.pop() if len(kinds) == 1 and kinds <= set(STREAM_KINDS) else "resid_post"


def magnitude_table(vector: Any, vecs: Any, magnitude: str | None, unit_kind: str) -> Any:
    """An addition's vectors (``vecs``: per_layer_vectors of ``vector``) at the stated ``magnitude``: a unit
    Direction's raw vectors ``vectors * norms`` (``"raw"``), unit vectors (``"unit"``), or as given (``None``);
    a Direction that knows its raw norms, added in raw units with no stated magnitude, is an error."""
    if magnitude not in (None, *MAGNITUDES):
        raise ValueError(f"AddVector magnitude must be one of {MAGNITUDES} or None, got {magnitude!r}")
    norms = getattr(vector, "norms", None)
    known = isinstance(norms, torch.Tensor) and not isinstance(vector, torch.Tensor)
    if known and unit_kind == "raw" and magnitude is None:
        raise ValueError("AddVector got a unit probes Direction whose raw norms are known: say which vector to add, "
                         "magnitude='raw' (vectors * norms: the difference of means, as the refusal job adds it) or "
                         "magnitude='unit' (the unit vector, so alpha is an absolute norm); or unit='residual' with "
                         "norms= for a fraction of the residual norm")
    if magnitude == "unit":
        if isinstance(vecs, dict):
            return {k: unit(v, "AddVector vector") for k, v in vecs.items()}
        return vecs / vecs.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    if magnitude == "raw" and known:
        scale = as_tensor(norms, "AddVector vector norms").reshape(-1)
        if isinstance(vecs, dict):
            return {k: v * scale[i] for i, (k, v) in enumerate(vecs.items())}
        return vecs * (scale if vecs.dim() == 1 else scale[:, None])
    return vecs
