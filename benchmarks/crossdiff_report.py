"""The markdown section of benchmarks/study_crossdiff.py."""

from __future__ import annotations

import torch

from benchmarks._common import machine


def heading(tuned: str) -> str:
    return f"### Crosscoder model diffing on {tuned}"


def _ctx(st, lat: int) -> str:
    c = (st.contexts.get(lat) or [None])[0]
    if c is None:
        return ""
    return "".join(c.tokens).replace("|", "/").replace("\n", " ")[-70:]


def _unit(w: torch.Tensor) -> torch.Tensor:
    return w / w.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def report(args, st, cc, fit: dict, sae_side, r: torch.Tensor, n_tokens: int, n_prompts: int, wall: float,
           t_cap: float, l1=None) -> str:
    diff, counts = st.diff, st.diff.counts()
    dec_t = _unit(cc.decoders()[:, 1].detach().float())
    sae_top, sae_dec = ([], None) if sae_side is None else (sae_side[1], _unit(sae_side[0].W_dec.detach().float()))
    cos_r = dec_t @ r.float()
    true = diff.true_tuned_only()
    only = diff.of("tuned-only")
    sc = diff.scaling
    nu = {} if sc is None else {lat: (float(a), float(b)) for lat, a, b in
                                zip(sc.latents, sc.nu_error, sc.nu_reconstruction)}
    lines = [heading(args.tuned), "", f"`python benchmarks/study_crossdiff.py{args.pair_flags} --prompts {args.prompts} "
             f"--threads {args.threads}"
             f"{' --also-l1' if l1 else ''}` ({machine()}; {wall:.0f} s in all, {t_cap:.0f} s of it capturing or "
             f"reading the cached stores; the machine shared with other jobs). BatchTopK crosscoder (d_sae {args.d_sae}, k {args.k}) over "
             f"{args.base} and {args.tuned} at `{cc.site}` (lr {args.lr:g}, batch 1024), trained with the SAE trainer from two activation "
             f"stores of the same {n_prompts} prompts of the project's prompt sets (chat template; the refusal "
             f"val / test prompts held out; {n_tokens} tokens, attention sinks left out), {args.epochs} passes: "
             f"FVU {fit['fvu']:.3f}, L0 {fit['l0']:.1f}, dead {fit['dead']:.2f} after {fit['steps']} steps "
             f"({fit['seconds']:.0f} s). This is far fewer tokens than Minder et al. (100M+): the classes below are "
             f"what this small run finds, not a bound on what a larger one would.", "",
             "Norm ratio r = ||d_tuned|| / (||d_base|| + ||d_tuned||); classes: tuned-only r >= 0.9, base-only "
             "r <= 0.1, shared 0.4-0.6, other between; latent scaling on every tuned-only latent that fires "
             "(nu = beta_base / beta_tuned for the error and the reconstruction targets; a true tuned-only latent has "
             "both below 0.3).", "",
             "| crosscoder | tuned-only | base-only | shared | other | dead (never fires / zero decoder) | tuned-only passing latent scaling |",
             "|---|---|---|---|---|---|---|",
             f"| BatchTopK | {counts.get('tuned-only', 0)} | {counts.get('base-only', 0)} | {counts.get('shared', 0)} | "
             f"{counts.get('other', 0)} | {int((diff.freq == 0).sum())} | {len(true)} |"]
    if l1 is not None:
        d1, f1 = l1
        c1 = d1.counts()
        lines.append(f"| L1 (l1_coefficient {args.l1}; FVU {f1['fvu']:.3f}, L0 {f1['l0']:.1f}) | "
                     f"{c1.get('tuned-only', 0)} | {c1.get('base-only', 0)} | {c1.get('shared', 0)} | "
                     f"{c1.get('other', 0)} | {int((d1.freq == 0).sum())} | {len(d1.true_tuned_only())} |")
    rmax = float(diff.ratios[~diff.ratios.isnan()].max())
    if true:
        exist = (f"**Fine-tune-only latents exist in this crosscoder**: {len(only)} latents have r >= 0.9, {len(true)} "
                 f"of them pass latent scaling.")
    elif only:
        exist = (f"**No fine-tune-only latent survives here**: {len(only)} latents have r >= 0.9 and none passes "
                 f"latent scaling (each keeps its direction in the base's error or reconstruction).")
    else:
        exist = (f"**No fine-tune-only latent exists here**: no latent has r >= 0.9 (the largest ratio is "
                 f"{rmax:.3f}); every latent writes about equally in both models, so latent scaling has nothing to "
                 f"check and the steered latents below are the most fine-tune-leaning shared ones.")
    lines += ["", exist, ""]
    if only:
        lines += ["| latent | r | firing freq | nu error | nu reconstruction | mean act, harmful val last token | "
                  "cos with refusal dir | top context |", "|---|---|---|---|---|---|---|---|"]
        for lat in sorted(only, key=lambda j: -float(st.mean_act[j]))[:15]:
            ne, nr = nu.get(lat, (float("nan"), float("nan")))
            lines.append(f"| {lat} | {float(diff.ratios[lat]):.2f} | {float(diff.freq[lat]):.4f} | {ne:.2f} | "
                         f"{nr:.2f} | {float(st.mean_act[lat]):.3f} | {float(cos_r[lat]):.3f} | `{_ctx(st, lat)}` |")
        lines.append("")
    lines += [f"Steered: {len(st.chosen)} latents ({'; '.join(sorted(set(st.meta['chosen_classes'])))}), each "
              f"scaled by its mean activation at the harmful val prompts' last token; their fine-tuned-model "
              f"decoder vectors subtracted in {args.tuned} (harmful test prompts) "
              f"{' and '.join(f'x{v}' for v in args.subtract.split(',') if v) or 'at no strength'} and added to "
              f"{args.base} (harmless test prompts) {' and '.join(f'x{v}' for v in args.strengths.split(','))}, "
              f"against {args.n_random} draws of random latents matched in firing frequency (within 20 ranks) and "
              f"scaled to the same vector norm" + (
                  "; and ablated in the tune token by token (`CrossDiffConfig.ablate`: each latent's own "
                  "activation times its tuned decoder vector removed where it fires, read through the crosscoder's "
                  "tuned-model view with every model's input taken as the tuned activation, the reconstruction "
                  "error kept; against the same random draws ablated alike, and against `sae.edits.MatchedRemoval` "
                  "with each draw: at every token exactly as much removed as the chosen ablation removes there, along "
                  "the draw's decoder vectors weighted by the chosen latents' activations)" if args.ablate else "") +
              "; greedy 24 tokens, the anchored judge, 95% Wilson intervals.", "",
              "| latent | chosen as | r | mean act | cos with refusal dir | max cos with the SAE-diff top 10 | top context |",
              "|---|---|---|---|---|---|---|"]
    for lat, why in zip(st.chosen, st.meta["chosen_classes"]):
        mc = "-" if sae_dec is None else f"{float((sae_dec[sae_top] @ dec_t[lat]).abs().max()):.3f}"
        lines.append(f"| {lat} | {why} | {float(diff.ratios[lat]):.2f} | {float(st.mean_act[lat]):.3f} | "
                     f"{float(cos_r[lat]):.3f} | {mc} | `{_ctx(st, lat)}` |")
    lines += ["", "| condition | prompts | refused | n | rate | 95% CI | broken answers | not English |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {x['condition']} | {x['split']} | {x['k']} | {x['n']} | {x['rate']:.2f} | "
              f"{x['ci95'][0]:.2f}-{x['ci95'][1]:.2f} | {x['degenerate']} | {x['non_english']} |" for x in st.rates]
    lines += ["", "One-sided Fisher tests, chosen vs the pooled random draws: " + "; ".join(
        f"{t['condition']} vs {t.get('control', 'random')} latents: {t['hypothesis']}, p = {t['p']:.3g} "
        f"({t['chosen']} vs {t['random']})"
        for t in st.meta["tests"]) + ".", ""]
    lines += ["No SAE-diffing comparison in this run (--no-sae).", ""] if sae_dec is None else \
        _vs_sae(diff, (sae_side, cc), sae_dec, dec_t, r)
    return "\n".join(lines) + "\n"


def init_decoders(cc, sae) -> tuple[torch.Tensor, torch.Tensor]:
    """The unit decoder rows both dictionaries started from (their seed-0 initialisations; the crosscoder's
    fine-tuned-model block): the SAE's latent ``i`` and the crosscoder's ``i // 2`` start in the same direction."""
    from sae.crosscoder import Crosscoder

    c0 = Crosscoder.build(cc.cfg.d_in // 2, cc.d_sae, cc.cfg.arch, cc.cfg.k, ("base", "chat"), site=cc.site, seed=0)
    s0 = type(sae)(sae.cfg, seed=0)
    return _unit(c0.decoders()[:, 1].detach().float()), _unit(s0.W_dec.detach().float())


def _vs_sae(diff, sae_side, sae_dec, dec_t, r) -> list[str]:
    """Each SAE-diff top latent's nearest crosscoder latent (fine-tuned decoder, |cos|), that latent's class, and the
    same pair's |cos| at initialisation (a shared seed makes some pairs start aligned)."""
    (sae, sae_top), cc = sae_side
    cc0, sae0 = init_decoders(cc, sae)
    lines = ["Beside the SAE diffing study's method (`benchmarks/study_diffing.py`, its SmolLM2 run in "
             "RESULTS_finetune.md: a TopK SAE on the base at the same site, latents ranked by their increase at the "
             "harmful val prompts' last token; the SAE trained here by that study's recipe, 1 thread): each of its "
             "10 most amplified latents, the crosscoder latent whose fine-tuned-model decoder vector is nearest "
             "(|cos|), that latent's class, and the two decoders' |cos| before training (both dictionaries start from "
             "seed 0, and the SAE's latent i starts in the crosscoder's latent i // 2's direction: a pair near 1 there "
             "is the shared initialisation, not a shared feature).", "",
             "| SAE-diff rank | SAE latent | cos with refusal dir | nearest crosscoder latent | |cos| | its r | its class "
             "| |cos| at init |", "|---|---|---|---|---|---|---|---|"]
    cos = (sae_dec[sae_top] @ dec_t.T).abs()
    for rank, (lat, row) in enumerate(zip(sae_top, cos)):
        j = int(row.argmax())
        lines.append(f"| {rank} | {lat} | {float(sae_dec[lat] @ r.float()):.3f} | {j} | {float(row[j]):.3f} | "
                     f"{float(diff.ratios[j]):.2f} | {diff.classes[j]} | {float((sae0[lat] @ cc0[j]).abs()):.3f} |")
    return lines + [""]


def delta_heading(tuned: str) -> str:
    return f"### The fine-tune's difference at the site, and how much of it the crosscoders reconstruct ({tuned})"


def massive(x: torch.Tensor, factor: float = 20.0) -> torch.Tensor:
    """The massive dimensions of ``x [n, d]``: mean |activation| above ``factor`` times the median dimension's (the
    rule of the multilingual studies, RESULTS_multilingual.md)."""
    m = x.abs().mean(0)
    return m > factor * m.median()


@torch.no_grad()
def _errors(cc, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-dimension squared reconstruction errors of both models and of the difference, summed over tokens, and
    which latents fire (``fired``)."""
    err = {k: torch.zeros(a.shape[1]) for k in "abd"}
    err["fired"] = torch.zeros(cc.d_sae, dtype=torch.bool)
    for i in range(0, len(a), 4096):
        xa, xb = a[i:i + 4096], b[i:i + 4096]
        z = cc.encode(cc.join(xa, xb))
        err["fired"] |= (z > 0).any(0).cpu()
        rec = cc.decode_models(z)
        ra, rb = rec[:, 0].float().cpu(), rec[:, 1].float().cpu()
        err["a"] += (ra - xa).pow(2).sum(0)
        err["b"] += (rb - xb).pow(2).sum(0)
        err["d"] += ((rb - ra) - (xb - xa)).pow(2).sum(0)
    return err


@torch.no_grad()
def delta_section(ccs: dict, xs, command: str, names: tuple[str, str], variant: str = "") -> str:
    """How large the fine-tune's change of the activations is against their spread, and what share of that change
    each crosscoder's reconstruction carries (FVU of the difference of its two reconstructions); the FVUs also without
    the massive dimensions (:func:`massive`), which can hold most of the spread (Gemma)."""
    from sae.crosscoder_analysis import norm_ratios

    a, b = xs
    delta = b - a
    var = {k: (x - x.mean(0)).pow(2).sum(0) / len(a) for k, x in (("a", a), ("b", b), ("d", delta))}
    big = massive(a)
    spread = float(var["a"].sum())
    lines = [delta_heading(names[1] + variant), "", f"`{command}` ({machine()}). Over the {len(a)} training tokens: "
             f"E||x_tuned - x_base||^2 is {float(delta.pow(2).sum(-1).mean()) / spread:.4f} of the base's spread "
             f"E||x_base - mean||^2 (mean norms {float(a.norm(dim=-1).mean()):.1f} / {float(b.norm(dim=-1).mean()):.1f}). "
             f"{int(big.sum())} massive dimensions (mean |x_base| above 20x the median dimension's) hold "
             f"{float(var['a'][big].sum()) / spread:.3f} of the base's spread and {float(var['d'][big].sum() / var['d'].sum()):.3f} "
             f"of the difference's; the last column leaves them out.",
             "", f"| crosscoder | FVU base ({names[0]}) | FVU tuned ({names[1]}) | FVU of the difference (x_tuned - x_base) | "
             "norm ratio min / median / max | FVU base / tuned / difference without the massive dimensions |",
             "|---|---|---|---|---|---|"]
    quantiles = []
    for name, cc in ccs.items():
        err = _errors(cc, a, b)
        fvu = {k: float(err[k].sum()) / len(a) / float(var[k].sum()) for k in "abd"}
        rest = {k: float(err[k][~big].sum()) / len(a) / float(var[k][~big].sum()) for k in "abd"}
        r = norm_ratios(cc)
        live = r[~r.isnan() & err["fired"]]
        r = r[~r.isnan()]
        lines.append(f"| {name} | {fvu['a']:.3f} | {fvu['b']:.3f} | {fvu['d']:.3f} | "
                     f"{float(r.min()):.3f} / {float(r.median()):.3f} / {float(r.max()):.3f} | "
                     f"{rest['a']:.3f} / {rest['b']:.3f} / {rest['d']:.3f} |")
        q = torch.quantile(live, torch.tensor([0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99])).tolist() if len(live) else []
        quantiles.append(f"{name}: {len(live)} of {cc.d_sae} latents fire on these tokens; their ratios' 1 / 5 / 25 / "
                         f"50 / 75 / 95 / 99% quantiles " + " / ".join(f"{v:.3f}" for v in q))
    return "\n".join(lines + ["", "Norm ratios of the latents that fire: " + "; ".join(quantiles) + "."]) + "\n"
