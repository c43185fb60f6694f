"""Feature pages on a tiny Llama and a small SAE: every piece of the page equals what the library (or a direct
computation) gives for the same latent; the page draws in headless Chromium without script errors; bad input."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import steering
from interp.values import Prompts, Runtime
from sae.contexts import contexts_html, top_contexts
from sae.model import SAE, SAEConfig
from sae.pages import FeaturePages, PagesConfig, feature_pages

from .conftest import REPO

SITE = "blocks.0.hook_resid_post"
PROMPTS = Prompts(["the man said to the boy", "what is the good word", "where is the old house by the water now ?",
                   "tell me a kind word", "the water is low", "why do they play with the old man"], chat=False)
LATENTS = [21, 60, 5]
CFG = PagesConfig(top=4, window=(6, 2), bins=12, n_logits=6, alpha=8.0, n_steer=2, max_new_tokens=5,
                  generate=steering.generate)
NOTE = {21: {"explanation": "words after <the> & such", "detection": 0.71, "fuzzing": 0.58}}
# sae-dashboard's NeuronpediaDashboardFeature.to_dict() keys (sae_dashboard/neuronpedia/neuronpedia_dashboard.py)
DASHBOARD_KEYS = {"feature_index", "neuron_alignment_indices", "neuron_alignment_values", "neuron_alignment_l1",
                  "correlated_neurons_indices", "correlated_neurons_l1", "correlated_neurons_pearson",
                  "correlated_features_indices", "correlated_features_l1", "correlated_features_pearson", "neg_str",
                  "neg_values", "pos_str", "pos_values", "frac_nonzero", "freq_hist_data_bar_values",
                  "freq_hist_data_bar_heights", "logits_hist_data_bar_heights", "logits_hist_data_bar_values",
                  "n_prompts_total", "n_tokens_in_prompt", "dataset", "decoder_weights_dist", "activations"}


def _sae(d: int, site: str = SITE) -> SAE:
    return SAE(SAEConfig(d, 128, arch="relu", site=site), seed=0)


@pytest.fixture(scope="module")
def built(tiny_models, tmp_path_factory):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = tiny_models("llama")
        sae = _sae(model.d_model)
        out = tmp_path_factory.mktemp("pages") / "pages.html"
        res = feature_pages(model, sae, LATENTS, PROMPTS, NOTE, CFG, out=out)
        yield model, sae, res, out, out.read_text(encoding="utf-8")
    finally:
        torch.set_num_threads(n)


def _direct_acts(model, sae, latent: int) -> torch.Tensor:
    """The latent on every real token, from HF's own hidden states (layer 0's output), one prompt at a time."""
    vals = []
    with torch.no_grad():
        for text in PROMPTS.texts:
            enc = model.tokenizer(text, return_tensors="pt")
            h = model.hf(**enc, output_hidden_states=True).hidden_states[1][0]      # [T, d]
            vals.append(sae.encode(h.float())[:, latent])
    return torch.cat(vals)


def test_each_latent_section_shows_the_library_pieces(built):
    model, sae, res, out, page = built
    assert res.latents == LATENTS and res.path == str(out)
    for lat in LATENTS:
        p = res.page(lat)
        assert f'id="latent-{lat}"' in page
        ctx = top_contexts(model, sae, lat, PROMPTS, top=CFG.top, window=CFG.window)
        assert ctx and p["contexts"] == [asdict(c) for c in ctx]
        assert contexts_html(ctx, latent=lat) in page                          # tokens and activations as shown
        for c in ctx:
            assert f'title="{c.acts[c.peak]:.3f}"' in page


def test_histogram_counts_equal_a_direct_histc(built):
    model, sae, res, _, page = built
    for lat in LATENTS:
        a = _direct_acts(model, sae, lat)
        on = a[a > 0]
        want = torch.histc(on, bins=CFG.bins, min=0.0, max=float(on.max()))
        p = res.page(lat)
        assert p["hist_counts"] == [int(c) for c in want.tolist()] and sum(p["hist_counts"]) == on.numel()
        assert p["n_tokens"] == a.numel() and p["frac_nonzero"] == pytest.approx(on.numel() / a.numel())
        assert p["max_act"] == pytest.approx(float(a.max()), abs=1e-5)
        assert f'"y":{json.dumps(p["hist_counts"], separators=(",", ":"))}' in page   # the bars drawn


def test_logit_weights_equal_the_decoder_row_through_the_unembedding(built):
    model, sae, res, _, page = built
    W_U = model.hf.lm_head.weight.detach().float()[: len(model.tokenizer)]    # [V, d]: rows past the tokenizer
    assert model.hf.lm_head.weight.shape[0] > W_U.shape[0]                    # are padding, never a real token
    for lat in LATENTS:
        eff = W_U @ sae.W_dec.detach()[lat].float()                            # [V]
        p = res.page(lat)
        top, bot = eff.topk(CFG.n_logits), eff.topk(CFG.n_logits, largest=False)
        assert p["pos"]["ids"] == top.indices.tolist() and p["neg"]["ids"] == bot.indices.tolist()
        assert torch.allclose(torch.tensor(p["pos"]["values"]), top.values, atol=1e-5)
        assert torch.allclose(torch.tensor(p["neg"]["values"]), bot.values, atol=1e-5)
        assert p["pos"]["tokens"] == [model.tokenizer.decode([i]) for i in top.indices.tolist()]
        section = page[page.index(f'class="sae-logits" data-latent="{lat}"'):]
        section = section[: section.index("</table>")]
        for t in p["pos"]["tokens"] + p["neg"]["tokens"]:
            assert html.escape(repr(t)) in section
        assert sum(p["logit_hist_counts"]) == eff.numel()


def test_explanation_shown_only_where_given(built):
    _, _, res, _, page = built
    assert res.page(21)["explanation"] == {"explanation": NOTE[21]["explanation"], "detection": 0.71, "fuzzing": 0.58}
    head = page[page.index('id="latent-21"'):]
    head = head[: head.index("</table>")]
    assert html.escape(NOTE[21]["explanation"]) in head and "0.71" in head and "0.58" in head
    other = page[page.index('id="latent-60"'):]
    assert "(none given)" in other[: other.index("</table>")] and res.page(60)["explanation"] is None
    assert NOTE[21]["explanation"] not in page                                 # escaped, never raw HTML


def test_steering_preview_equals_the_library_generation(built):
    from sae.edits import LatentSteering

    model, sae, res, _, page = built
    P2 = Prompts(PROMPTS.texts[:2], chat=False)
    run = Runtime(progress=False)
    plain = steering.generate(model, P2, max_new_tokens=CFG.max_new_tokens, runtime=run).texts
    changed = 0
    for lat in LATENTS:
        s = res.page(lat)["steering"]
        want = steering.generate(model, P2, LatentSteering(sae, lat, alpha=CFG.alpha), max_new_tokens=CFG.max_new_tokens,
                                 runtime=run).texts
        assert s["prompts"] == list(P2.texts) and s["plain"] == plain and s["steered"] == want
        changed += s["steered"] != s["plain"]
        section = page[page.index(f'class="sae-steer" data-latent="{lat}"'):]
        section = section[: section.index("</table>")]
        for t in s["steered"] + s["plain"]:
            assert html.escape(t) in section
    assert changed > 0, "steering at alpha=8 changed no continuation: the preview would show nothing"


def test_page_is_self_contained_and_saves(built, tmp_path):
    _, _, res, _, page = built
    assert len(re.findall(r"plotly\.js v\d", page)) == 1                      # the bundle, inlined once
    assert not re.search(r'<(script|link)[^>]+(src|href)="(https?:)?//', page)   # nothing loaded from the network
    assert page.count('class="plotly-graph-div"') == len(LATENTS)
    assert set(res.timings) == {"activations", "logits", "contexts", "steering", "html"}
    back = FeaturePages.load(res.save(tmp_path / "res"))
    assert back.pages == res.pages and back.site == SITE
    assert list(back.to_frame()["latent"]) == LATENTS


def test_dashboard_json_has_sae_dashboards_layout(built, tmp_path):
    _, _, res, _, _ = built
    path = res.to_dashboard(tmp_path / "batch-0.json", sae_set="tiny-res", dataset="six prompts")
    batch = json.loads(path.read_text())
    assert set(batch) == {"model_id", "layer", "sae_set", "features"} and batch["layer"] == 0
    for f, p in zip(batch["features"], res.pages):
        assert set(f) == DASHBOARD_KEYS and f["feature_index"] == p["latent"]
        assert f["freq_hist_data_bar_heights"] == p["hist_counts"] and len(f["freq_hist_data_bar_values"]) == CFG.bins
        assert f["pos_str"] == p["pos"]["tokens"] and f["neg_values"] == [round(v, 3) for v in p["neg"]["values"]]
        assert [a["tokens"] for a in f["activations"]] == [c["tokens"] for c in p["contexts"]]
        assert all(a["bin_min"] == -1 and a["bin_contains"] == -1 for a in f["activations"])
        assert f["n_prompts_total"] == len(PROMPTS) and f["dataset"] == "six prompts"
    with pytest.raises(FileExistsError, match="overwrite=True"):
        res.to_dashboard(path)


def test_page_renders_in_headless_chromium(built, tmp_path):
    """Chromium runs the page's scripts: no error reaches window.onerror and plotly draws every histogram."""
    sys.path.insert(0, str(REPO / "scripts"))
    from screenshot_report import FLAGS, chromium

    exe = chromium()
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); the page check needs a browser")
    _, _, res, _, page = built
    catcher = ("<script>window.onerror=function(m){document.documentElement.setAttribute("
               "'data-js-errors',(document.documentElement.getAttribute('data-js-errors')||'')+'|'+m)};</script>")
    probe = ("<script>window.addEventListener('load',function(){setTimeout(function(){"
             "document.body.setAttribute('data-drawn',document.querySelectorAll('.plotly-graph-div .main-svg').length)"
             "},500)});</script>")
    checked = page.replace("<head>", "<head>" + catcher, 1).replace("</body>", probe + "</body>", 1)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "pages.html"
        path.write_text(checked, encoding="utf-8")
        proc = subprocess.run([exe, *FLAGS, f"--user-data-dir={d}/prof", "--enable-logging=stderr", "--v=0",
                               "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    dom = proc.stdout
    err = re.search(r'data-js-errors="[^"]*"', dom)                          # the attribute, not the script's text
    assert err is None, err.group(0)
    assert "Uncaught" not in proc.stderr
    m = re.search(r'data-drawn="(\d+)"', dom)
    assert m, "the page's scripts did not run"
    assert int(m.group(1)) >= 2 * len(LATENTS)                                # plotly draws two main svgs per figure
    assert dom.count('id="latent-') == len(LATENTS)


def test_bad_input_is_refused_with_the_fix(tiny_models, tmp_path):
    model = tiny_models("llama")
    sae = _sae(model.d_model)
    few = Prompts(PROMPTS.texts[:2], chat=False)
    cfg = PagesConfig(n_steer=0, bins=4, top=2)
    with pytest.raises(ValueError, match=r"latents \[500\] are out of range; this SAE has latents 0\.\.127"):
        feature_pages(model, sae, [3, 500], few, config=cfg)
    with pytest.raises(ValueError, match=r"d_in=32 does not match site blocks.0.hook_resid_post .*width 64"):
        feature_pages(model, SAE(SAEConfig(32, 64, arch="relu", site=SITE)), [1], few, config=cfg)
    with pytest.raises(ValueError, match="'explanation' string"):
        feature_pages(model, sae, [3], few, {3: {"detection": 0.5}}, config=cfg)
    out = tmp_path / "p.html"
    out.write_text("keep me")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        feature_pages(model, sae, [21], few, config=cfg, out=out)
    assert out.read_text() == "keep me"
    feature_pages(model, sae, [21], few, config=cfg, out=out, overwrite=True)
    assert 'id="latent-21"' in out.read_text() and not list(tmp_path.glob(".p.html.*"))


def test_site_off_the_residual_stream_has_no_logit_weights(tiny_models):
    model = tiny_models("llama")
    sae = SAE(SAEConfig(model.d_mlp, 64, arch="relu", site="blocks.0.mlp.hook_post"), seed=0)
    res = feature_pages(model, sae, [0], Prompts(PROMPTS.texts[:2], chat=False), config=PagesConfig(n_steer=0))
    assert res.page(0)["pos"] is None and "outside the residual stream" in res.html()
    assert res.page(0)["steering"] is None and "sae-steer" not in res.html()           # no generator: no preview
