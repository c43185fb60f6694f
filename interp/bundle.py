"""One provenance record and one save/load bundle for every captured or fitted object.

A bundle is a folder: ``tensors.safetensors`` + ``meta.json`` holding ``kind`` (e.g. ``"probes.Direction"``),
``format``, ``provenance`` (:class:`Provenance`) and, beside them at the top level, the object's own fields. Upper floors register a
loader per kind at import, so :func:`load` dispatches without the core importing them. Result dataclasses inherit
:class:`Result`: their fields go into one bundle (tensors to safetensors, the rest to JSON), no pickles.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import torch

from interp.evals.rates import Rate
from interp.io import load_bundle, read_json, save_bundle
from interp.sites import parse_site

FORMAT = 2  # format 1: the same folder, provenance keys flat in meta.json (still loads)


def _package_version() -> str:
    try:
        return importlib.metadata.version("interp-toolkit")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


PACKAGE_VERSION = _package_version()


@dataclass
class Provenance:
    """Where an object came from: method, sites (layers follow), model, data hash, the sample ids it was
    fitted on, the package version that made it, and free ``meta``."""

    method: str = ""
    sites: list[str] = field(default_factory=list)
    model_id: str = ""
    data_hash: str = ""
    fitted_on: list[str] = field(default_factory=list)
    created_with: str = PACKAGE_VERSION
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def layers(self) -> list[int | None]:
        """Layer of each site (``None`` outside the blocks or for names that do not parse)."""
        out: list[int | None] = []
        for s in self.sites:
            try:
                out.append(parse_site(s).layer)
            except (ValueError, KeyError):
                out.append(None)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``layers`` included for readers; ignored on the way back)."""
        return {**asdict(self), "layers": self.layers}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Provenance:
        """From :meth:`to_dict` or a format-1 ``meta.json`` (unknown keys ignored; missing ones default)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names and v is not None}
        kw["fitted_on"] = [str(i) for i in kw.get("fitted_on", [])]
        kw["sites"] = list(kw.get("sites", []))
        kw.setdefault("created_with", "")  # unknown for files that did not record it
        return cls(**kw)


@dataclass(kw_only=True)
class Fitted:
    """Base of fitted objects: the provenance fields as keyword arguments, and :attr:`provenance`.

    Subclasses hold their tensors and ``sites``; copies pass ``**self.provenance_kwargs()`` along."""

    method: str = ""
    model_id: str = ""
    data_hash: str = ""
    fitted_on: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    created_with: str = PACKAGE_VERSION

    def __post_init__(self) -> None:
        self.fitted_on = [str(i) for i in self.fitted_on]

    @property
    def provenance(self) -> Provenance:
        return Provenance(self.method, list(getattr(self, "sites", [])), self.model_id, self.data_hash,
                          list(self.fitted_on), self.created_with, dict(self.meta))

    def provenance_kwargs(self, **changes: Any) -> dict[str, Any]:
        """The provenance fields as constructor keywords (copied), with ``changes`` applied."""
        kw = {"method": self.method, "model_id": self.model_id, "data_hash": self.data_hash,
              "fitted_on": list(self.fitted_on), "meta": dict(self.meta), "created_with": self.created_with}
        return {**kw, **changes}


def check_model(obj: Any, model: Any, what: str = "this object") -> None:
    """Check a fitted object (or its :class:`Provenance`) against the ``model`` it is applied to: silent on its own
    model, a warning on another of the same shape, an error when the width or layer count differs (recorded at
    capture in ``meta["model"]``). Objects without provenance (plain tensors) pass."""
    prov = obj if isinstance(obj, Provenance) else getattr(obj, "provenance", None)
    if not isinstance(prov, Provenance):
        return
    name, shape = getattr(model, "name", ""), prov.meta.get("model") or {}
    here = {"n_layers": getattr(model, "n_layers", None), "d_model": getattr(model, "d_model", None)}
    if any(shape.get(k) is not None and here[k] is not None and int(shape[k]) != int(here[k]) for k in here):
        raise ValueError(f"{what} was fitted on {prov.model_id or 'another model'!r} ({shape.get('n_layers')} layers, "
                         f"width {shape.get('d_model')}) but {name or 'this model'!r} has {here['n_layers']} layers, "
                         f"width {here['d_model']}: refit it on this model's activations")
    if prov.model_id and name and prov.model_id != name:
        warnings.warn(f"{what} was fitted on {prov.model_id!r} and is applied to {name!r} (same width and layer "
                      f"count): fine for a model and its fine-tune, else refit it on this model", UserWarning,
                      stacklevel=3)


def from_provenance(p: Provenance) -> dict[str, Any]:
    """Constructor keywords of :class:`Fitted` from a loaded :class:`Provenance` (``sites`` excluded)."""
    return {"method": p.method, "model_id": p.model_id, "data_hash": p.data_hash, "fitted_on": list(p.fitted_on),
            "meta": dict(p.meta), "created_with": p.created_with}


@dataclass
class Bundle:
    """A loaded bundle: ``kind``, ``tensors``, ``provenance`` and the object's own ``fields``."""

    kind: str
    tensors: dict[str, torch.Tensor]
    provenance: Provenance
    fields: dict[str, Any]


def save_object(path: str | os.PathLike, kind: str, tensors: dict[str, torch.Tensor], provenance: Provenance,
                fields: dict[str, Any] | None = None, overwrite: bool = False) -> Path:
    """Write one bundle atomically; refuses to overwrite unless ``overwrite=True``."""
    own = dict(fields or {})
    clash = {"kind", "format", "provenance"} & set(own)
    if clash:
        raise ValueError(f"field names {sorted(clash)} are reserved in a bundle's meta.json; rename them")
    meta = {**own, "kind": kind, "format": FORMAT, "provenance": provenance.to_dict()}
    return save_bundle(path, tensors, meta, overwrite=overwrite)


def read_kind(path: str | os.PathLike) -> str:
    """The ``kind`` recorded in a bundle folder (reads only ``meta.json``)."""
    p = Path(path)
    if not (p / "meta.json").exists():
        raise FileNotFoundError(f"{p} holds no saved bundle (meta.json missing)")
    return str(read_json(p / "meta.json").get("kind"))


def read_object(path: str | os.PathLike, kind: str) -> Bundle:
    """Read a bundle and check it holds ``kind``; the error names the loader that fits what it holds."""
    tensors, meta = load_bundle(path)
    got = meta.get("kind")
    if got != kind:
        hint = f"load it with {got}.load(path) or interp.bundle.load(path)" if got else "it has no kind"
        raise ValueError(f"{path} does not hold a saved {kind.split('.')[-1]}: it holds a {got}; {hint}")
    own = {k: v for k, v in meta.items() if k not in ("kind", "format", "provenance")}
    if "provenance" in meta:
        return Bundle(kind, tensors, Provenance.from_dict(meta["provenance"]), own)
    return Bundle(kind, tensors, Provenance.from_dict(meta), own)  # format 1: provenance keys flat


_LOADERS: dict[str, Callable[[Path], Any]] = {}


def register_kind(kind: str, loader: Callable[[Path], Any]) -> None:
    """Let :func:`load` open bundles of ``kind`` (each floor registers its classes at import)."""
    _LOADERS[kind] = loader


def load(path: str | os.PathLike) -> Any:
    """Open any saved bundle by its ``kind`` (the floor that defines it must be imported)."""
    kind = read_kind(path)
    if kind not in _LOADERS:
        pkg = kind.split(".")[0]
        raise ValueError(f"{path} holds a {kind}; `import {pkg}` first (it registers its loader) or call "
                         f"{kind}.load(path)")
    return _LOADERS[kind](Path(path))


OUR_PACKAGES = ("interp", "probes", "sae", "steering")  # a bundle rebuilds dataclasses of these packages only
_MARKS = ("__tensor__", "__dataclass__", "__tuple__", "__set__", "__items__", "__path__", "__order__", "__rate__")


def result_kind(cls: type) -> str:
    """The bundle ``kind`` of a result class: its module and name, e.g. ``"interp.patching.results.Sweep"``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _encode(v: Any, name: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``v`` as JSON, its tensors moved into ``tensors`` under ``name``-derived keys."""
    if isinstance(v, torch.Tensor):
        tensors[name] = v.detach().cpu().clone()  # a copy: safetensors refuses tensors that share storage
        return {"__tensor__": name}
    if is_dataclass(v) and not isinstance(v, type):
        if not type(v).__module__.startswith(OUR_PACKAGES):
            raise TypeError(f"{name}: a {type(v).__name__} from {type(v).__module__} cannot go into a result bundle")
        return {"__dataclass__": result_kind(type(v)),
                "fields": {f.name: _encode(getattr(v, f.name), f"{name}/{f.name}", tensors) for f in fields(v)}}
    if isinstance(v, Path):
        return {"__path__": str(v)}
    if isinstance(v, Rate):  # a dict, but rebuilt as the record it is (with its verdicts and answers when kept)
        return {"__rate__": {"k": v.k, "n": v.n, "flags": v.flags, "texts": v.texts}}
    if isinstance(v, (list, tuple, set, frozenset)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else list(v)
        out = [_encode(x, f"{name}/{i}", tensors) for i, x in enumerate(items)]
        return out if isinstance(v, list) else {"__tuple__" if isinstance(v, tuple) else "__set__": out}
    if isinstance(v, dict):
        if all(isinstance(k, str) and k not in _MARKS for k in v):
            out = {k: _encode(x, f"{name}/{k}", tensors) for k, x in v.items()}
            # meta.json is written with sorted keys: record the order when it differs (conditions, plot order)
            return out if list(v) == sorted(v) else {**out, "__order__": list(v)}
        return {"__items__": [[_encode(k, f"{name}/{i}/key", tensors), _encode(x, f"{name}/{i}", tensors)]
                              for i, (k, x) in enumerate(v.items())]}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(v, "item") and getattr(v, "ndim", None) == 0:  # numpy scalars
        return v.item()
    raise TypeError(f"{name}: a {type(v).__name__} cannot go into a result bundle (tensors, numbers, strings, lists, "
                    f"dicts and our dataclasses can); save it with its own .save() and keep its path instead")


def _decode(v: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(v, list):
        return [_decode(x, tensors) for x in v]
    if not isinstance(v, dict):
        return v
    if "__tensor__" in v:
        return tensors[v["__tensor__"]]
    if "__dataclass__" in v:
        return _build(_class(v["__dataclass__"]), v["fields"], tensors)
    if "__path__" in v:
        return Path(v["__path__"])
    if "__rate__" in v:
        return Rate(**v["__rate__"])
    if "__tuple__" in v:
        return tuple(_decode(x, tensors) for x in v["__tuple__"])
    if "__set__" in v:
        return {_decode(x, tensors) for x in v["__set__"]}
    if "__items__" in v:
        return {_decode(k, tensors): _decode(x, tensors) for k, x in v["__items__"]}
    return {k: _decode(v[k], tensors) for k in v.get("__order__", v) if k != "__order__"}


def _class(kind: str) -> type:
    module, _, name = kind.rpartition(".")
    if not module.startswith(OUR_PACKAGES):
        raise ValueError(f"a result bundle names class {kind!r}, which is not one of {OUR_PACKAGES}'s: refused")
    return getattr(importlib.import_module(module), name)


def _build(cls: type, raw: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    vals = {k: _decode(x, tensors) for k, x in raw.items()}
    init = {f.name for f in fields(cls) if f.init}
    obj = cls(**{k: x for k, x in vals.items() if k in init})
    for k, x in vals.items():
        if k not in init:
            object.__setattr__(obj, k, x)
    return obj


def encode_fields(obj: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A dataclass's fields as JSON (with markers for tensors, tuples, sets, our dataclasses, rates) and the tensors
    they refer to: the one serialiser of results and of the studies' stage caches (:func:`decode_fields` inverts it)."""
    tensors: dict[str, torch.Tensor] = {}
    return {f.name: _encode(getattr(obj, f.name), f.name, tensors) for f in fields(obj)}, tensors


def decode_fields(cls: type, raw: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    """The ``cls`` instance :func:`encode_fields` wrote."""
    return _build(cls, raw, tensors)


def save_result(obj: Any, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write a result dataclass as one bundle (atomic; refuses an existing ``path`` unless ``overwrite``)."""
    own, tensors = encode_fields(obj)
    prov = getattr(obj, "provenance", None)
    if not isinstance(prov, Provenance):
        prov = Provenance(method=type(obj).__name__, model_id=str(getattr(obj, "model_id", "") or ""))
    return save_object(path, result_kind(type(obj)), tensors, prov, {"fields": own}, overwrite=overwrite)


def load_result(path: str | os.PathLike, cls: type) -> Any:
    """Read a bundle :func:`save_result` wrote for ``cls`` (the error names the right loader otherwise)."""
    b = read_object(path, result_kind(cls))
    return _build(cls, b.fields["fields"], b.tensors)


def _scalar(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    return v if v is None or isinstance(v, (bool, int, float, str)) else _SKIP


_SKIP = object()


class Result:
    """Mixin of the result dataclasses: :meth:`save` / :meth:`load` as one bundle (registered with :func:`load`),
    and a default :meth:`summary` of the scalar fields; results with headline numbers of their own override it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_kind(result_kind(cls), lambda path, c=cls: c.load(path))

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write this result to the folder ``path`` (``tensors.safetensors`` + ``meta.json``)."""
        return save_result(self, path, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Any:
        """Read a result :meth:`save` wrote."""
        return load_result(path, cls)

    def summary(self) -> dict[str, Any]:
        """Headline numbers, JSON-ready: here the scalar fields (numbers, strings, one-element tensors)."""
        out = {f.name: _scalar(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]
        return {k: v for k, v in out.items() if v is not _SKIP}


__all__ = ["Bundle", "FORMAT", "Fitted", "OUR_PACKAGES", "PACKAGE_VERSION", "Provenance", "Result", "check_model", "decode_fields", "encode_fields", "from_provenance",
           "load", "load_result", "read_kind", "read_object", "register_kind", "result_kind", "save_object",
           "save_result"]
