"""Feature pages on a real model: a TopK SAE trained quickly on ``smollm2-aligned`` (one residual site), pages for
six of its latents (contexts, histogram, logit weights, steering preview), their size and generation time.
Writes ``runs/pages/pages.html`` and ``runs/pages/batch-0.json`` (git-ignored) and ``benchmarks/RESULTS_pages.md``.

    python benchmarks/bench_pages.py                   # CPU, one thread (~3 min on a loaded 2-core machine)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo before this folder
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "scripts"))  # screenshot_report (Chromium check)

from _common import machine, write_text  # noqa: E402

import interp  # noqa: E402
import steering  # noqa: E402
from interp.capturing import capture  # noqa: E402
from interp.data import load_prompts  # noqa: E402
from sae.analysis import encode_tokens  # noqa: E402
from sae.pages import PagesConfig, feature_pages  # noqa: E402
from sae.trainer import train_sae  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", type=int, default=9)
    ap.add_argument("--n", type=int, default=32, help="prompts per set (harmful_realistic, harmless_general)")
    ap.add_argument("--d-sae", type=int, default=2048)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=150_000, help="SAE training tokens")
    ap.add_argument("--alpha", type=float, default=None, help="steering strength (default: half the median "
                                                                "residual norm at the site)")
    ap.add_argument("--out", default=str(REPO / "runs" / "pages"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    site = f"blocks.{args.layer}.hook_resid_post"
    model = interp.load_model("smollm2-aligned")
    texts = ([r["instruction"] for r in load_prompts("harmful_realistic")][: args.n]
             + [r["instruction"] for r in load_prompts("harmless_general")][: args.n])
    run = interp.Runtime(progress=False)
    t0 = time.perf_counter()
    X = capture(model, texts, sites=[site], positions="all", runtime=run).flat_tokens(site).float()
    t_cap = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = train_sae(X, arch="topk", d_sae=args.d_sae, k=args.k, total_tokens=args.tokens, batch_size=512, lr=3e-3,
                    site=site, progress=False)
    t_train = time.perf_counter() - t0
    sae = res.sae
    z = encode_tokens(sae, X)                                             # [tokens, d_sae]
    freq, top = (z > 0).float().mean(0), z.max(0).values
    ok = ((freq > 0.005) & (freq < 0.2)).nonzero().flatten()
    latents = ok[top[ok].argsort(descending=True)[:6]].tolist()
    norm = float(X.norm(dim=-1).median())
    alpha = args.alpha if args.alpha is not None else 0.5 * norm
    cfg = PagesConfig(top=8, window=(12, 4), bins=30, n_logits=10, alpha=alpha, n_steer=2, max_new_tokens=24,
                      steer_prompts=[r["instruction"] for r in load_prompts("harmless_general")][-2:],
                      generate=steering.generate, title=f"smollm2-aligned {site}: TopK SAE latents")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pages = feature_pages(model, sae, latents, texts, config=cfg, out=out / "pages.html", overwrite=True)
    t_pages = time.perf_counter() - t0
    js = pages.to_dashboard(out / "batch-0.json", sae_set="bench-topk", dataset="harmful_realistic+harmless_general",
                            overwrite=True)
    kb, kb_js = (out / "pages.html").stat().st_size / 1024, js.stat().st_size / 1024
    from screenshot_report import chromium, rendered_figures

    drawn = ("Chromium absent: not checked" if chromium() is None else
             "headless Chromium (scripts/screenshot_report.py): {} plotly figures in the page, {} drawn (its count: "
             "plotly's main svgs / 2; at least the figures means every one drew)".format(*rendered_figures(out / "pages.html")))
    stages = " | ".join(f"{k} {v:.1f}" for k, v in pages.timings.items())
    rows = "\n".join(f"| {p['latent']} | {p['frac_nonzero']:.3%} | {p['max_act']:.2f} | "
                     f"{', '.join(repr(t) for t in p['pos']['tokens'][:4])} | "
                     f"{p['steering']['steered'][0][:60]!r} |" for p in pages.pages)
    plain = pages.pages[0]["steering"]["plain"][0][:60]
    text = f"""# Feature pages (sae.pages)

`python benchmarks/bench_pages.py` ({machine()}, one thread, a machine shared with other jobs).

smollm2-aligned, site `{site}`, {len(texts)} prompts ({args.n} harmful_realistic + {args.n} harmless_general,
chat-formatted, {X.shape[0]} tokens). TopK SAE d_sae={args.d_sae}, k={args.k}, {args.tokens} training tokens
(last logged training FVU {res.history['fvu'][-1]:.3f}, L0 {res.history['l0'][-1]:.1f}).
Six latents: firing on 0.5%..20% of tokens, highest max activation first. Steering preview: alpha = {alpha:.1f}
(half the median residual norm {norm:.1f}; the latents' max activations are 40..110), two harmless prompts, 24 greedy tokens.

| step | seconds |
|---|---|
| capture activations | {t_cap:.1f} |
| train the SAE | {t_train:.1f} |
| **feature_pages (6 latents, page written)** | **{t_pages:.1f}** |

Inside `feature_pages` (seconds): {stages}.

Page: `runs/pages/pages.html`, **{kb:.0f} KB** (plotly.js inlined once, about 4.6 MB of it; the rest is
{kb - 4600:.0f} KB or so of data and tables). sae-dashboard batch JSON: `runs/pages/batch-0.json`, {kb_js:.1f} KB.
{drawn}.

| latent | fires on | max act | top promoted tokens | steered continuation of prompt 1 |
|---|---|---|---|---|
{rows}

Plain continuation of prompt 1: {plain!r}.

Notes:
- Generation time is the model passes: `top_contexts` runs the prompts once per latent (it is the library's one
  definition of a latent's contexts, reused as is: 6 passes, each about as long as the one `activations` pass),
  and 1 + 6 greedy generations for the steering preview. Reading all latents' contexts from the one
  `activations` pass would cut `contexts` to near zero; not done (it would be a second definition of contexts).
- The steering column is one prompt at one strength with no random-latent control: an illustration of what the
  page shows, not an effect. (Some latents turn this harmless prompt into a refusal-like reply; whether that
  beats norm-matched random latents is not measured here.)
- No explanations: the explainer (`sae/explain`) is another helper's work; the page takes them as a plain mapping.
- The SAE is trained for minutes on a few thousand tokens: the latents are for exercising the pages, not findings.
"""
    write_text(REPO / "benchmarks" / "RESULTS_pages.md", text)
    print(text)


if __name__ == "__main__":
    main()
