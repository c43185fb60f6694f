"""Feature pages: one self-contained HTML page for a set of SAE latents, and sae-dashboard's JSON.

Per latent: its top contexts with token heat (:func:`sae.contexts.top_contexts`), a histogram of its nonzero
activations over every real token of the prompts (counts from ``torch.histc``), its logit weights
``W_dec[latent] @ W_U`` (top positive and negative tokens; residual-stream sites only), an explanation and its
detection / fuzzing scores when given, and a steering preview: greedy continuations of a few prompts with
``alpha * W_dec[latent]`` added (:class:`sae.edits.LatentSteering`) next to the plain ones. ``sae`` sits below
``steering`` in the floors, so the preview runs through the generator the caller hands in,
``PagesConfig(generate=steering.generate)`` (none: no preview). plotly.js is inlined once; the page loads nothing
from the network.

:meth:`FeaturePages.to_dashboard` writes the batch JSON of sae-dashboard's Neuronpedia runner
(``{"model_id", "layer", "sae_set", "features": [...]}``, the fields of its ``NeuronpediaDashboardFeature``), read
from its ``neuronpedia_dashboard.py`` / ``neuronpedia_converter.py``. Differences: our context windows are the
``window`` tokens around each peak, not whole dataset sequences; neuron alignment, correlated neurons / features
and the decoder-weight distribution are left empty (we do not compute them); ``n_tokens_in_prompt`` is the
longest prompt (ours vary in length); ``dataset`` is what the caller names; ``freq_hist_data_bar_values`` and
``logits_hist_data_bar_values`` are bin centres.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from interp.bundle import Result
from interp.values import Prompts, Runtime
from sae.model import SAE

if TYPE_CHECKING:
    import pandas as pd

RESID_KINDS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "ln_final")


@dataclass
class PagesConfig:
    """How the pages are made: ``top`` contexts per latent in a ``window`` (before, after) around the peak;
    ``bins`` of the activation histogram; ``n_logits`` top and bottom tokens; the steering preview adds
    ``alpha * W_dec[latent]`` on ``steer_prompts`` (default: the first ``n_steer`` of the prompts) for
    ``max_new_tokens`` greedy tokens through ``generate`` (pass ``steering.generate``; ``None`` or ``n_steer=0``:
    no preview), called as ``generate(model, prompts, *edits, max_new_tokens=, runtime=)``; ``sinks`` as
    :class:`sae.edits.LatentSteering`."""

    top: int = 8
    window: tuple[int, int] = (12, 4)
    bins: int = 30
    n_logits: int = 10
    alpha: float = 8.0
    steer_prompts: Prompts | Sequence[str] | None = None
    n_steer: int = 2
    max_new_tokens: int = 24
    sinks: str = "keep"
    batch_size: int = 8
    title: str = "SAE feature pages"
    runtime: Runtime = field(default_factory=lambda: Runtime(progress=False))
    generate: Callable[..., Any] | None = None


@dataclass
class FeaturePages(Result):
    """The data behind the page: ``pages`` holds one JSON-ready dict per latent (``latent``, ``contexts`` as
    :class:`sae.contexts.Context` dicts, ``hist_edges [bins+1]`` / ``hist_counts [bins]`` of nonzero
    activations, ``frac_nonzero``, ``n_tokens``, ``max_act``, ``pos`` / ``neg`` logit weights as
    ``{"ids", "tokens", "values"}`` (``None`` off the residual stream), ``logit_hist_edges`` / ``logit_hist_counts``
    over the vocabulary, ``explanation`` (or ``None``), ``steering`` ``{"alpha", "prompts", "plain", "steered"}``)."""

    model_id: str
    site: str
    pages: list[dict[str, Any]]
    n_prompts: int
    n_tokens_in_prompt: int
    path: str | None = None
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)   # seconds per stage

    @property
    def latents(self) -> list[int]:
        return [p["latent"] for p in self.pages]

    def page(self, latent: int) -> dict[str, Any]:
        for p in self.pages:
            if p["latent"] == latent:
                return p
        raise KeyError(f"latent {latent} has no page; the pages hold {self.latents}")

    def summary(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "site": self.site, "latents": self.latents, "n_prompts": self.n_prompts,
                "path": self.path, "seconds": self.seconds}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([{"latent": p["latent"], "frac_nonzero": p["frac_nonzero"], "max_act": p["max_act"],
                              "top_token": p["pos"]["tokens"][0] if p["pos"] else None,
                              "explanation": (p["explanation"] or {}).get("explanation")} for p in self.pages])

    def plot(self, latent: int | None = None) -> Any:
        """The activation histogram of ``latent`` (default: the first page's)."""
        from interp.viz.features import binned_histogram

        p = self.page(latent) if latent is not None else self.pages[0]
        return binned_histogram(p["hist_edges"], p["hist_counts"], title=f"latent {p['latent']}: nonzero activations")

    def html(self, title: str = "SAE feature pages") -> str:
        """The self-contained page (:func:`interp.viz.html.page`)."""
        from sae.pages_html import render

        return render(self, title)

    def to_dashboard(self, path: str | Path, sae_set: str = "", dataset: str = "", layer: int | None = None,
                     overwrite: bool = False) -> Path:
        """Write sae-dashboard's Neuronpedia batch JSON (atomic; refuses an existing ``path`` unless ``overwrite``)."""
        from interp.io import check_writable, write_json
        from sae.pages_html import dashboard_batch

        p = check_writable(path, overwrite)
        write_json(p, dashboard_batch(self, sae_set, dataset, layer))
        return p


def _explanations(explanations: Mapping[int, Mapping[str, Any]] | None, latents: list[int]) -> dict[int, dict]:
    if explanations is None:
        return {}
    if not isinstance(explanations, Mapping):
        raise TypeError("explanations must be a mapping {latent: {'explanation': str, 'detection': float, "
                        f"'fuzzing': float}}, got {type(explanations).__name__}")
    out = {}
    for k, v in explanations.items():
        if not isinstance(v, Mapping) or not isinstance(v.get("explanation"), str):
            raise ValueError(f"explanation of latent {k} must be a mapping with an 'explanation' string, got {v!r}")
        out[int(k)] = {"explanation": v["explanation"], "detection": _num(v.get("detection")),
                       "fuzzing": _num(v.get("fuzzing"))}
    return {k: v for k, v in out.items() if k in latents}


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def _histc(values: torch.Tensor, bins: int, lo: float, hi: float) -> tuple[list[float], list[int]]:
    """Edges ``[bins+1]`` and ``torch.histc`` counts ``[bins]`` of ``values`` over ``[lo, hi]``."""
    if values.numel() == 0:
        return [], []
    if hi <= lo:
        hi = lo + 1e-6
    counts = torch.histc(values.float(), bins=bins, min=lo, max=hi)
    return torch.linspace(lo, hi, bins + 1).tolist(), [int(c) for c in counts.tolist()]


def _logit_weights(model: Any, sae: SAE, latents: list[int], site: str, n: int, bins: int
                   ) -> dict[int, dict[str, Any]]:
    """Per latent: ``W_dec[latent] @ W_U`` [V] summarised (top ``n`` positive / negative and a histogram)."""
    from interp.sites import parse_site
    from interp.weights import unembed

    if parse_site(site, model.n_layers).kind not in RESID_KINDS:
        return {}
    W_U, _ = unembed(model)                                               # [V, d]
    with torch.no_grad():
        eff = _dec_rows(sae, latents) @ W_U.detach().float().cpu().T      # [L, V]
    vocab = min(eff.shape[1], len(model.tokenizer)) if model.tokenizer is not None else eff.shape[1]
    eff = eff[:, :vocab]
    from sae.contexts import token_strings

    out = {}
    for j, lat in enumerate(latents):
        top, bot = eff[j].topk(n), eff[j].topk(n, largest=False)
        edges, counts = _histc(eff[j], bins, float(eff[j].min()), float(eff[j].max()))
        out[lat] = {"pos": {"ids": top.indices.tolist(), "values": top.values.tolist(),
                            "tokens": token_strings(model.tokenizer, top.indices.tolist())},
                    "neg": {"ids": bot.indices.tolist(), "values": bot.values.tolist(),
                            "tokens": token_strings(model.tokenizer, bot.indices.tolist())},
                    "logit_hist_edges": edges, "logit_hist_counts": counts}
    return out


def _dec_rows(sae: SAE, latents: list[int]) -> torch.Tensor:
    """The decoder rows of ``latents`` as float32 on the CPU ``[L, d_in]``."""
    return sae.W_dec.detach()[latents].float().cpu()


def _steer_prompts(prompts: Prompts | Sequence[str], cfg: PagesConfig) -> Prompts | None:
    if cfg.generate is None:
        return None
    if cfg.steer_prompts is not None:
        return Prompts.of(cfg.steer_prompts)
    if cfg.n_steer <= 0:
        return None
    P = Prompts.of(prompts)
    k = min(cfg.n_steer, len(P))
    return replace(P, texts=P.texts[:k], responses=None, labels=None, ids=None)


def _check(model: Any, sae: SAE, latents: Sequence[int], cfg: PagesConfig) -> tuple[list[int], str]:
    from sae.edits import check_site

    site = check_site(sae, model)                                         # the SAE's width against this model
    lats = [int(latent) for latent in latents]
    if not lats:
        raise ValueError("no latents given; pass e.g. latents=[0, 5, 12]")
    bad = [latent for latent in lats if not 0 <= latent < sae.d_sae]
    if bad:
        raise ValueError(f"latents {bad} are out of range; this SAE has latents 0..{sae.d_sae - 1}")
    if len(set(lats)) != len(lats):
        raise ValueError(f"latents {lats} repeat a latent; give each once")
    if cfg.generate is not None and not callable(cfg.generate):
        raise TypeError(f"PagesConfig.generate must be a function like steering.generate, got {cfg.generate!r}")
    if cfg.bins < 1 or cfg.top < 1 or cfg.n_logits < 1:
        raise ValueError(f"bins, top and n_logits must be at least 1 (got {cfg.bins}, {cfg.top}, {cfg.n_logits})")
    return lats, site


def feature_pages(model: Any, sae: SAE, latents: Sequence[int], prompts: Prompts | Sequence[str],
                  explanations: Mapping[int, Mapping[str, Any]] | None = None, config: PagesConfig | None = None,
                  out: str | Path | None = None, overwrite: bool = False) -> FeaturePages:
    """Build the pages of ``latents`` from ``prompts`` and, with ``out``, write the HTML there (atomic; an existing
    file is refused unless ``overwrite=True``). ``explanations``: ``{latent: {"explanation": str, "detection":
    float, "fuzzing": float}}`` (scores optional). Returns :class:`FeaturePages` (``.html()``, ``.to_dashboard()``)."""
    from interp.io import check_writable
    from sae.analysis import latent_acts_on_prompts
    from sae.contexts import top_contexts
    from sae.edits import LatentSteering

    cfg = config or PagesConfig()
    lats, site = _check(model, sae, latents, cfg)
    notes = _explanations(explanations, lats)
    path = check_writable(out, overwrite) if out is not None else None
    t0 = time.perf_counter()
    timings = dict.fromkeys(("activations", "logits", "contexts", "steering", "html"), 0.0)
    P = Prompts.of(prompts)
    per = latent_acts_on_prompts(model, sae, P, lats, batch_size=cfg.batch_size)
    acts = torch.cat([p["acts"] for p in per]) if per else torch.zeros(0, len(lats))   # [tokens, L]
    t = _lap(timings, "activations", t0)
    logits = _logit_weights(model, sae, lats, site, cfg.n_logits, cfg.bins)
    t = _lap(timings, "logits", t)
    steer_p = _steer_prompts(P, cfg)
    gen_kw = {"max_new_tokens": cfg.max_new_tokens, "runtime": cfg.runtime}
    plain = list(cfg.generate(model, steer_p, **gen_kw).texts) if steer_p is not None else []
    t = _lap(timings, "steering", t)
    pages = []
    for j, lat in enumerate(lats):
        ctx = top_contexts(model, sae, lat, P, top=cfg.top, window=cfg.window, batch_size=cfg.batch_size)
        t = _lap(timings, "contexts", t)
        steer = None
        if steer_p is not None:
            edit = LatentSteering(sae, lat, alpha=cfg.alpha, sinks=cfg.sinks)
            steer = {"alpha": cfg.alpha, "prompts": list(steer_p.texts), "plain": plain,
                     "steered": list(cfg.generate(model, steer_p, edit, **gen_kw).texts)}
            t = _lap(timings, "steering", t)
        pages.append(_page(lat, acts[:, j], ctx, logits.get(lat, {}), notes.get(lat), steer, cfg.bins))
    res = FeaturePages(model_id=str(getattr(model, "name", "") or ""), site=site, pages=pages, n_prompts=len(P),
                       n_tokens_in_prompt=max((len(p["ids"]) for p in per), default=0), timings=timings)
    if path is not None:
        _write(path, res.html(cfg.title))
        res.path = str(path)
        _lap(timings, "html", t)
    res.seconds = time.perf_counter() - t0
    return res


def _page(lat: int, a: torch.Tensor, ctx: list, lw: dict[str, Any], note: dict | None, steer: dict | None,
          bins: int) -> dict[str, Any]:
    """One latent's JSON-ready page from its activations ``a [tokens]`` and the pieces computed for it."""
    on = a[a > 0]
    edges, counts = _histc(on, bins, 0.0, float(on.max()) if on.numel() else 0.0)
    return {"latent": lat, "contexts": [asdict(c) for c in ctx], "hist_edges": edges, "hist_counts": counts,
            "frac_nonzero": on.numel() / max(a.numel(), 1), "n_tokens": a.numel(),
            "max_act": float(a.max()) if a.numel() else 0.0, "pos": lw.get("pos"), "neg": lw.get("neg"),
            "logit_hist_edges": lw.get("logit_hist_edges", []), "logit_hist_counts": lw.get("logit_hist_counts", []),
            "explanation": note, "steering": steer}


def _write(path: Path, text: str) -> None:
    from interp.io import atomic_write

    def _w(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    atomic_write(path, _w)


def _lap(timings: dict[str, float], stage: str, since: float) -> float:
    now = time.perf_counter()
    timings[stage] += now - since
    return now


__all__ = ["FeaturePages", "PagesConfig", "feature_pages"]
