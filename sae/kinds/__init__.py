"""SAE kinds behind a registry: each kind (one module each) declares its parameters, encoder, training terms and
hooks, and its sae-lens / circuit-tracer names (:class:`~sae.kinds.base.Kind`). ``SAEConfig.arch`` names a
registered kind; the model, trainer and format readers ask the kind, never branch on its name.

A new kind, from your own code::

    from sae.kinds import Kind, register_kind
    class MyKind(Kind):
        name = "mine"
        def activate(self, sae, pre): return torch.relu(pre) ** 2
    register_kind(MyKind())
"""

from __future__ import annotations

from typing import Any

from sae.kinds.base import Kind, KindOut
from sae.kinds.batchtopk import BatchTopKKind
from sae.kinds.crosscoder import CrossBatchTopKKind, CrossReluKind
from sae.kinds.gated import GatedKind
from sae.kinds.jumprelu import JumpReLUKind
from sae.kinds.jumprelu_target import JumpReLUTargetKind
from sae.kinds.matryoshka import MatryoshkaKind
from sae.kinds.relu import ReluKind
from sae.kinds.topk import TopKKind

__all__ = ["Kind", "KindOut", "get_kind", "kind_names", "register_kind", "saelens_kind"]

_KINDS: dict[str, Kind] = {}


def register_kind(kind: Kind, replace: bool = False) -> Kind:
    """Make ``kind`` (an instance of a :class:`Kind` subclass) available as ``SAEConfig(arch=kind.name)``."""
    if not isinstance(kind, Kind):
        raise TypeError(f"register_kind takes an instance of a sae.kinds.Kind subclass, got {kind!r}")
    if not kind.name or not isinstance(kind.name, str):
        raise ValueError(f"{type(kind).__name__} has no name; set the class attribute name = '...'")
    if kind.name in _KINDS and not replace and type(_KINDS[kind.name]) is not type(kind):
        raise ValueError(f"an SAE kind named {kind.name!r} is already registered ({_KINDS[kind.name]!r}); choose "
                         f"another name or pass replace=True")
    _KINDS[kind.name] = kind
    return kind


def kind_names() -> tuple[str, ...]:
    """The registered kinds' names."""
    return tuple(_KINDS)


def get_kind(name: str) -> Kind:
    """The registered kind called ``name``; an unknown name gets an error naming ``register_kind``."""
    try:
        return _KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown SAE kind {name!r}; registered kinds: {sorted(_KINDS)}. A kind of your own must be "
                         f"registered before it is built or loaded: sae.kinds.register_kind(MyKind())") from None


def saelens_kind(architecture: str, metadata: dict[str, Any]) -> Kind:
    """The kind a sae-lens ``architecture`` loads as: the one our metadata names (``interp_arch``), else the
    registered kind that reads that architecture."""
    ours = metadata.get("interp_arch")
    if ours:
        kind = get_kind(ours)
        if architecture not in (kind.saelens, *kind.saelens_reads):
            raise ValueError(f"the file names our kind {ours!r} but sae-lens architecture {architecture!r}; "
                             f"{ours!r} saves as {kind.saelens!r}")
        return kind
    for kind in _KINDS.values():
        if architecture in kind.saelens_reads:
            return kind
    readable = sorted({a for k in _KINDS.values() for a in k.saelens_reads})
    raise ValueError(f"sae-lens architecture {architecture!r} is not supported here; supported: {readable} (a kind of "
                     f"your own that reads it: set saelens_reads and sae.kinds.register_kind(...))")


for _k in (ReluKind(), TopKKind(), BatchTopKKind(), JumpReLUKind(), JumpReLUTargetKind(), GatedKind(),
           MatryoshkaKind(), CrossReluKind(), CrossBatchTopKKind()):
    register_kind(_k)
