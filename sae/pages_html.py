"""Render :class:`sae.pages.FeaturePages` as one HTML page, and as sae-dashboard's Neuronpedia batch JSON."""

from __future__ import annotations

import html
from typing import Any

from interp.viz.html import kv_table, page, table


def _contexts(p: dict[str, Any]) -> str:
    from sae.contexts import Context, contexts_html

    return contexts_html([Context(**c) for c in p["contexts"]], latent=p["latent"])


def _logits(p: dict[str, Any]) -> str:
    if p["pos"] is None:
        return ('<div class="note">no logit weights: this SAE reads a site outside the residual stream, where '
                '<code>W_dec @ W_U</code> has no meaning</div>')
    pos, neg = p["pos"], p["neg"]
    rows = [[repr(pt), round(pv, 4), repr(nt), round(nv, 4)]
            for pt, pv, nt, nv in zip(pos["tokens"], pos["values"], neg["tokens"], neg["values"])]
    return (f'<div class="sae-logits" data-latent="{p["latent"]}">'
            + table(["promoted token", "W_dec @ W_U", "suppressed token", "W_dec @ W_U"], rows) + "</div>")


def _steering(p: dict[str, Any]) -> str:
    s = p["steering"]
    rows = [[prompt, plain, steered] for prompt, plain, steered in zip(s["prompts"], s["plain"], s["steered"])]
    return (f'<div class="sae-steer" data-latent="{p["latent"]}"><p>greedy continuations without and with '
            f'<code>{s["alpha"]:g} * W_dec[{p["latent"]}]</code> added at the SAE\'s site</p>'
            + table(["prompt", "plain", f"steered (alpha={s['alpha']:g})"], rows) + "</div>")


def _head(p: dict[str, Any]) -> str:
    rows: list[tuple[str, Any]] = [("fires on", f"{p['frac_nonzero']:.3%} of {p['n_tokens']} tokens"),
                                   ("max activation", round(p["max_act"], 4))]
    e = p["explanation"]
    if e is not None:
        rows.append(("explanation", e["explanation"]))
        rows += [(k, round(e[k], 4)) for k in ("detection", "fuzzing") if e.get(k) is not None]
    else:
        rows.append(("explanation", "(none given)"))
    return f'<div class="sae-latent" id="latent-{p["latent"]}" data-latent="{p["latent"]}">{kv_table(rows)}</div>'


def render(res: Any, title: str) -> str:
    """The page: an index of latents, then per latent its summary, contexts, histogram, logits and steering."""
    from interp.viz.features import binned_histogram

    index = " ".join(f'<a href="#latent-{p["latent"]}">{p["latent"]}</a>' for p in res.pages)
    sections: list[tuple[str, Any]] = [("Latents", f"<p>{html.escape(res.model_id)} at {html.escape(res.site)}, "
                                                   f"{res.n_prompts} prompts: {index}</p>")]
    for p in res.pages:
        lat = p["latent"]
        sections.append((f"Latent {lat}", _head(p)))
        sections.append((f"Latent {lat}: top contexts", _contexts(p)))
        if p["hist_counts"]:
            sections.append((f"Latent {lat}: activation histogram",
                             binned_histogram(p["hist_edges"], p["hist_counts"],
                                              title=f"latent {lat}: nonzero activations")))
        else:
            sections.append((f"Latent {lat}: activation histogram", "<p><i>never fired on these prompts</i></p>"))
        sections.append((f"Latent {lat}: logit weights", _logits(p)))
        if p["steering"] is not None:
            sections.append((f"Latent {lat}: steering preview", _steering(p)))
    return page(title, sections)


def _centres(edges: list[float]) -> list[float]:
    return [round((a + b) / 2, 3) for a, b in zip(edges[:-1], edges[1:])]


def _r(xs: list[float]) -> list[float]:
    return [round(float(x), 3) for x in xs]


def dashboard_batch(res: Any, sae_set: str, dataset: str, layer: int | None) -> dict[str, Any]:
    """sae-dashboard's ``NeuronpediaDashboardBatch.to_dict()`` layout for these pages (values rounded to 3
    decimals as its converter does; top contexts as its ``TOP ACTIVATIONS`` group: ``bin_min=-1``,
    ``bin_max`` = the latent's max, ``bin_contains=-1``)."""
    from interp.sites import parse_site

    if layer is None:
        layer = parse_site(res.site).layer
    feats = []
    for p in res.pages:
        pos, neg = p["pos"] or {"tokens": [], "values": []}, p["neg"] or {"tokens": [], "values": []}
        feats.append({
            "feature_index": p["latent"],
            "neuron_alignment_indices": [], "neuron_alignment_values": [], "neuron_alignment_l1": [],
            "correlated_neurons_indices": [], "correlated_neurons_l1": [], "correlated_neurons_pearson": [],
            "correlated_features_indices": [], "correlated_features_l1": [], "correlated_features_pearson": [],
            "neg_str": list(neg["tokens"]), "neg_values": _r(neg["values"]),
            "pos_str": list(pos["tokens"]), "pos_values": _r(pos["values"]),
            "frac_nonzero": float(p["frac_nonzero"]),
            "freq_hist_data_bar_values": _centres(p["hist_edges"]), "freq_hist_data_bar_heights": list(p["hist_counts"]),
            "logits_hist_data_bar_heights": list(p["logit_hist_counts"]),
            "logits_hist_data_bar_values": _centres(p["logit_hist_edges"]),
            "n_prompts_total": res.n_prompts, "n_tokens_in_prompt": res.n_tokens_in_prompt, "dataset": dataset,
            "decoder_weights_dist": [],
            "activations": [{"bin_min": -1, "bin_max": round(p["max_act"], 3), "bin_contains": -1,
                             "tokens": list(c["tokens"]), "values": _r(c["acts"])} for c in p["contexts"]],
        })
    return {"model_id": res.model_id, "layer": int(layer) if layer is not None else 0, "sae_set": sae_set,
            "features": feats}


__all__ = ["dashboard_batch", "render"]
