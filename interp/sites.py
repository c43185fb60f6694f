"""Site names: TransformerLens hook names are canonical, short aliases are accepted.

``blocks.3.hook_resid_post`` == ``resid_post.3``. A kind without a layer (``"resid_post"``)
expands to every layer in :func:`expand_sites`.

Inside attention (:mod:`interp.attention`): ``blocks.{i}.attn.hook_q`` / ``hook_k`` / ``hook_v`` (``q.3``: the
projections per head, ``[.., n_heads | n_kv_heads, d_head]``, before rotary and before qk-norm as in
TransformerLens), ``hook_rot_q`` / ``hook_rot_k`` (after qk-norm and rotary, what the scores use), ``hook_attn_scores``
(``scores``: pre-softmax, after scaling, soft-capping and masking) and ``hook_pattern`` (``pattern``: post-softmax),
both ``[batch, n_heads, query, key]`` in a hook; k and v stay per key-value head (``interp.attention.expand_kv``).
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass

Layers = str | int | Sequence[int]  # "all", one layer or a list (negative counts from the end)
WRITERS = ("resid_pre", "attn_out", "mlp_out")  # every write to the residual stream, layer by layer (embedding at 0)

# kind -> canonical TransformerLens suffix inside ``blocks.{i}.``
BLOCK_KINDS: dict[str, str] = {
    "resid_pre": "hook_resid_pre",
    "resid_mid": "hook_resid_mid",
    "resid_post": "hook_resid_post",
    "attn_out": "hook_attn_out",
    "mlp_out": "hook_mlp_out",
    "attn_z": "attn.hook_z",
    "mlp_post": "mlp.hook_post",
    # the MLP module's own input and output (after any pre-MLP norm with its gain; before any post-MLP norm, which
    # only Gemma-2/3 and OLMo-2 have), the sites a transcoder reads and writes; named as circuit-tracer names them
    "mlp_in": "mlp.hook_in",
    "mlp_module_out": "mlp.hook_out",
    # mixture of experts, our own names (TransformerLens has none): the routed experts' weighted sum, and the
    # shared expert's output before its sigmoid gate (a per-token scalar); mlp_out = experts + gate * shared
    "experts_out": "mlp.hook_experts_out",
    "shared_expert_out": "mlp.hook_shared_expert_out",
    # inside attention (interp.attention), as TransformerLens names them
    "q": "attn.hook_q", "k": "attn.hook_k", "v": "attn.hook_v", "rot_q": "attn.hook_rot_q", "rot_k": "attn.hook_rot_k",
    "scores": "attn.hook_attn_scores", "pattern": "attn.hook_pattern",
}
ATTN_KINDS = ("q", "k", "v", "rot_q", "rot_k", "scores", "pattern")
MOE_KINDS = ("experts_out", "shared_expert_out")  # exist only in mixture-of-experts layers
# ``ln_final.hook_normalized`` is before the final norm's gain, as in TransformerLens; ``ln_final.hook_out`` (our
# own name, no TransformerLens equivalent) is the norm's output, what the unembedding reads.
GLOBAL_KINDS: dict[str, str] = {"ln_final": "ln_final.hook_normalized", "ln_final_out": "ln_final.hook_out"}

ALIASES: dict[str, str] = {
    "resid": "resid_post",
    "residual": "resid_post",
    "attn": "attn_out",
    "mlp": "mlp_out",
    "z": "attn_z",
    "heads": "attn_z",
    "neurons": "mlp_post",
    "experts": "experts_out",
    "routed": "experts_out",
    "shared_expert": "shared_expert_out",
    "final": "ln_final",
    "ln_final": "ln_final",
    "final_out": "ln_final_out",
    "attn_scores": "scores",
    "attn_pattern": "pattern",
}

_CANON_BLOCK = re.compile(r"^blocks\.(\d+)\.(" + "|".join(re.escape(v) for v in BLOCK_KINDS.values()) + r")$")
_SHORT = re.compile(r"^([a-z_]+)[.:]?(-?\d+)?$")
_SUFFIX_TO_KIND = {v: k for k, v in BLOCK_KINDS.items()}


@dataclass(frozen=True)
class Site:
    """One hook point: ``kind`` (e.g. ``resid_post``) at ``layer`` (``None`` for global sites)."""

    kind: str
    layer: int | None

    @property
    def name(self) -> str:
        if self.layer is None:
            return GLOBAL_KINDS[self.kind]
        return f"blocks.{self.layer}.{BLOCK_KINDS[self.kind]}"

    def __str__(self) -> str:
        return self.name


SiteSpec = str | Site | Sequence[str | Site]
"""One site name (or a kind meaning every layer), a :class:`Site`, or a list of them."""


def known_site_forms() -> str:
    kinds = ", ".join(list(BLOCK_KINDS) + list(GLOBAL_KINDS))
    return (f"use a TransformerLens name like 'blocks.3.hook_resid_post' or 'ln_final.hook_normalized', "
            f"or a short form 'KIND.LAYER' with KIND in: {kinds}")


def _unknown(name: str) -> ValueError:
    """An unknown site, naming the nearest supported one (``blocks.0.attn.hook_result`` -> ``hook_z``'s kin)."""
    m = re.match(r"^blocks\.(\d+)\.(.+)$", name.strip())
    layer, rest = (m.group(1), m.group(2)) if m else ("0", name.strip())
    pool = [f"blocks.{layer}.{v}" for v in BLOCK_KINDS.values()] + list(GLOBAL_KINDS.values())
    near = difflib.get_close_matches(f"blocks.{layer}.{rest}" if m else name.strip(), pool, n=1, cutoff=0.0)
    hint = f"the nearest supported site is {near[0]!r}; " if near else ""
    return ValueError(f"unknown site {name!r}: {hint}{known_site_forms()}")


def parse_site(name: str | Site, n_layers: int | None = None) -> Site:
    """Parse a canonical or short site name; negative layers count from the end when ``n_layers`` is known."""
    if isinstance(name, Site):
        site = name
    else:
        s = name.strip()
        m = _CANON_BLOCK.match(s)
        if m:
            site = Site(_SUFFIX_TO_KIND[m.group(2)], int(m.group(1)))
        elif s in GLOBAL_KINDS.values():
            site = Site(next(k for k, v in GLOBAL_KINDS.items() if v == s), None)
        else:
            m = _SHORT.match(s)
            if not m:
                raise _unknown(s)
            kind = ALIASES.get(m.group(1), m.group(1))
            layer = None if m.group(2) is None else int(m.group(2))
            if kind in GLOBAL_KINDS:
                if layer is not None:
                    raise ValueError(f"site {name!r}: {kind} has no layer")
                site = Site(kind, None)
            elif kind in BLOCK_KINDS:
                if layer is None:
                    raise ValueError(f"site {name!r} needs a layer ('{kind}.3'); use expand_sites to take every layer")
                site = Site(kind, layer)
            else:
                raise _unknown(s)
    if site.layer is not None and n_layers is not None:
        layer = site.layer + n_layers if site.layer < 0 else site.layer
        if not 0 <= layer < n_layers:
            raise ValueError(f"site {name!r}: layer {site.layer} is out of range; this model has layers 0..{n_layers - 1}")
        site = Site(site.kind, layer)
    return site


def expand_sites(spec: SiteSpec, n_layers: int, layers: Sequence[int] | None = None) -> list[Site]:
    """Turn user input into a list of :class:`Site`.

    ``"resid_post"`` (a kind with no layer) means that kind at every layer (or at ``layers``).
    """
    items = [spec] if isinstance(spec, (str, Site)) else list(spec)
    if not items:
        raise ValueError("no sites given: " + known_site_forms())
    out: list[Site] = []
    for item in items:
        if isinstance(item, str):
            kind = ALIASES.get(item.strip(), item.strip())
            if kind in BLOCK_KINDS:
                for layer in resolve_layers(layers, n_layers, what="sites", keep_order=layers is not None):
                    out.append(parse_site(Site(kind, layer), n_layers))
                continue
        out.append(parse_site(item, n_layers))
    seen: set[Site] = set()
    uniq = [s for s in out if not (s in seen or seen.add(s))]
    return uniq


def _is_layer(x: object) -> bool:
    """An integer layer index (Python, numpy or a 0-d integer tensor), not a bool."""
    if isinstance(x, bool):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def resolve_layers(layers: Layers | None, n_layers: int, available: Sequence[int] | None = None,
                   what: str = "layers", keep_order: bool = False) -> list[int]:
    """The one layer resolver (capture, steering, SAE edits, patching, fine-tuning): ``"all"`` / ``None``, an int or a
    list (negative from the end) -> sorted layer indices, range-checked (``keep_order``: in the order given,
    duplicates refused, for labelling rows); ``available``: the layers a per-layer input covers."""
    if layers is None or (isinstance(layers, str) and layers == "all"):
        if available is not None:
            return sorted(resolve_layers(list(available), n_layers, None, what))
        return list(range(n_layers))
    if isinstance(layers, str):
        raise ValueError(f"{what}: layers must be 'all', an int or a list of ints, got {layers!r}")
    items = [layers] if _is_layer(layers) else list(layers)
    if not items:
        raise ValueError(f"{what}: empty layer list; give at least one layer or 'all'")
    out = []
    for layer in items:
        if not _is_layer(layer):
            raise TypeError(f"{what}: layer {layer!r} is not an int")
        layer = operator.index(layer)
        j = layer + n_layers if layer < 0 else layer
        if not 0 <= j < n_layers:
            raise ValueError(f"{what}: layer {layer} is out of range; this model has layers 0..{n_layers - 1}")
        out.append(j)
    if available is not None:
        missing = [j for j in out if j not in set(available)]
        if missing:
            raise ValueError(f"{what}: no vector for layers {missing}; the per-layer input covers {sorted(available)}")
    if keep_order:
        if len(set(out)) != len(out):
            raise ValueError(f"{what}: layers {items} repeat a layer; give each layer once")
        return out
    return sorted(set(out))
