"""Edit specs: any steering edit written as ``PATH.json`` + ``PATH.safetensors`` and rebuilt exactly.

The JSON says what the edit does, readable without the code: ``kind`` (the class name), ``layers`` (resolved on the
model when one is given), ``sites``, ``positions``, ``scope``, ``coefficients`` (``alpha``, ``value``, ``unit``,
``magnitude``), ``norms`` (of each layer's vector, before coefficients) and ``provenance`` (model name, width, layer
count, weights hash); ``fields`` holds the dataclass's own fields for :func:`load_edit`, with every tensor (vectors,
``{layer: vector}`` tables, bases, probes Directions' vectors and norms, residual norms) in the safetensors file.

Only the classes registered here are rebuilt (the edit dataclasses of ``steering``'s edit modules and what they
nest: ``Condition``, ``ResidualNorms``, probes ``Direction`` / ``Subspace``): no pickle, no import named by a file.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import is_dataclass, replace
from pathlib import Path
from typing import Any

import torch

from interp.bundle import Provenance, check_model, decode_fields, encode_fields, result_kind
from interp.fingerprint import weights_hash
from interp.io import check_writable, read_json, read_safetensors, write_json, write_safetensors
from interp.models import Model

SPEC_FORMAT = 1
# modules whose public dataclasses are edits or what edits hold; steering.abliteration joins when present
EDIT_MODULES = ("steering.interventions", "steering.strength", "probes.objects", "steering.abliteration",
                "steering.abliteration_norm")
COEFFICIENTS = ("alpha", "value", "unit", "magnitude")
_KNOWN: dict[str, type] = {}


def register_edit(cls: type) -> type:
    """Let :func:`load_edit` rebuild dataclass ``cls`` (for edit classes outside :data:`EDIT_MODULES`)."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass; an edit spec rebuilds dataclasses from their fields")
    _KNOWN[result_kind(cls)] = cls
    return cls


def known_edits() -> dict[str, type]:
    """``{module.Class: class}`` of every class an edit spec may name."""
    if not _KNOWN:
        for name in EDIT_MODULES:
            if importlib.util.find_spec(name) is None:
                continue
            mod = importlib.import_module(name)
            for obj in vars(mod).values():
                if isinstance(obj, type) and is_dataclass(obj) and obj.__module__ == name and obj.__name__[0] != "_":
                    register_edit(obj)
    return _KNOWN


def _paths(path: str | os.PathLike) -> tuple[Path, Path]:
    p = Path(path)
    if p.suffix in (".json", ".safetensors"):
        p = p.with_suffix("")
    return p.parent / f"{p.name}.json", p.parent / f"{p.name}.safetensors"


def model_record(model: Model | None) -> dict[str, Any]:
    """The provenance an edit spec records of ``model``: name, width, layer count, weights hash."""
    if model is None:
        return {}
    return {"model": model.name, "d_model": model.d_model, "n_layers": model.n_layers, "weights": weights_hash(model)}


def describe(edit: Any, model: Model | None = None) -> dict[str, Any]:
    """The readable part of a spec: kind, layers, sites, positions, scope, coefficients, norms of the vectors."""
    out: dict[str, Any] = {"kind": type(edit).__name__}
    table = getattr(edit, "_vecs", None)
    if model is not None and hasattr(edit, "resolved_layers"):
        table = edit._table(model)
        out["layers"] = edit.resolved_layers(model)
        norms = [float((table if isinstance(table, torch.Tensor) else table[layer]).norm()) for layer in out["layers"]]
    else:
        out["layers"] = getattr(edit, "layers", None)
        norms = ([float(v.norm()) for v in table.values()] if isinstance(table, dict) else
                 [float(table.norm())] if isinstance(table, torch.Tensor) else None)
    if hasattr(edit, "kinds"):
        out["sites"] = list(edit.kinds)
    for name in ("positions", "scope"):
        if hasattr(edit, name):
            v = getattr(edit, name)
            out[name] = list(v) if isinstance(v, tuple) else v
    out["coefficients"] = {k: getattr(edit, k) for k in COEFFICIENTS if hasattr(edit, k)}
    out["norms"] = norms
    return out


def save_edit(edit: Any, path: str | os.PathLike, model: Model | None = None, overwrite: bool = False,
              record: dict[str, Any] | None = None) -> Path:
    """Write ``edit`` as ``PATH.json`` + ``PATH.safetensors`` (atomic; an existing spec is refused unless
    ``overwrite=True``). ``model``: resolve its layers there and record the model's provenance (``record``: that
    provenance computed once, :func:`model_record`, when saving many edits). Returns the JSON path."""
    if not is_dataclass(edit) or isinstance(edit, type) or result_kind(type(edit)) not in known_edits():
        raise TypeError(f"save_edit takes a dataclass edit of steering (one of {sorted(c.__name__ for c in known_edits().values())}), "
                        f"got {type(edit).__name__}; register another dataclass with steering.specs.register_edit")
    if isinstance(getattr(edit, "layers", None), range):   # JSON has no range: the same layers as a list
        edit = replace(edit, layers=list(edit.layers))
    js, st = _paths(path)
    check_writable(js, overwrite)
    check_writable(st, overwrite)
    own, tensors = encode_fields(edit)
    prov = record if record is not None else model_record(model)
    spec = {**describe(edit, model), "class": result_kind(type(edit)), "format": SPEC_FORMAT, "provenance": prov,
            "fields": own}
    write_safetensors(st, tensors)
    write_json(js, spec)
    return js


def _check_classes(raw: Any, where: str) -> None:
    """Refuse any class name in a spec that is not a known edit class (before anything is imported)."""
    if isinstance(raw, list):
        for x in raw:
            _check_classes(x, where)
    elif isinstance(raw, dict):
        kind = raw.get("__dataclass__")
        if kind is not None and kind not in known_edits():
            raise ValueError(f"{where} names class {kind!r}, which is not a known edit class "
                             f"(steering.specs.known_edits()): refused")
        for x in raw.values():
            _check_classes(x, where)


def load_edit(path: str | os.PathLike, model: Model | None = None) -> Any:
    """The edit :func:`save_edit` wrote: same class, same fields, equal tensors. With ``model``, its provenance is
    checked (:func:`interp.bundle.check_model`: a warning on another model, an error on another width or depth)."""
    js, st = _paths(path)
    if not js.exists():
        raise FileNotFoundError(f"no edit spec at {js}; write one with steering.save_edit(edit, path)")
    if not st.exists():
        raise FileNotFoundError(f"{st} is missing: an edit spec is the pair {js.name} + {st.name}; copy both")
    spec = read_json(js)
    kind = spec.get("class")
    if kind not in known_edits():
        raise ValueError(f"{js} names class {kind!r}, which is not a known edit class "
                         f"(steering.specs.known_edits()): refused")
    _check_classes(spec.get("fields", {}), str(js))
    prov = spec.get("provenance") or {}
    if model is not None and prov:
        shape = {k: prov.get(k) for k in ("n_layers", "d_model")}
        check_model(Provenance(model_id=prov.get("model", ""), meta={"model": shape}), model, f"the edit spec {js}")
    tensors = read_safetensors(st)
    return decode_fields(known_edits()[kind], spec["fields"], tensors)


__all__ = ["EDIT_MODULES", "describe", "known_edits", "load_edit", "model_record", "register_edit", "save_edit"]
