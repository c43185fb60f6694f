"""The refusal job's fast candidate search: attribution estimates (first order checked against finite differences, the logit-curvature term against its exact value), their
ranking against the exhaustive sweep on the organism, exact scoring of a subset, prefix reuse, config and CLI."""

from __future__ import annotations

import pytest
import torch

import steering
from interp.evals.logits import refusal_score
from interp.evals.metrics import spearman
from interp.forward import batches, last_logits, prepare, resid_pre_cache
from interp.studies.kit.scoring import score_rows
from interp.studies.refusal import (
    RefusalConfig,
    SelectionConfig,
    estimate_candidates,
    find_candidates,
    find_refusal_tokens,
    load_refusal_data,
    run_refusal,
    score_candidates,
    select_direction,
    top_candidates,
)
from interp.studies.refusal.estimate import (
    PROBES,
    ablation_moment,
    estimate_modes,
    harmful_terms,
    harmless_terms,
    writer_sites,
)
from interp.testing.tiny import tiny_model

PROMPTS = ["the man said", "what is the good word now, tell me", "help", "write a long story about water",
           "how do you make a house"]
TOKENS = [40, 41, 42]


def _mean_score(m, encs, hook_fns=(), *interventions):
    (b,) = batches(m, encs, len(encs))
    with steering.apply(m, *interventions):
        return refusal_score(last_logits(m, b, hook_fns), TOKENS).double().mean().item()


def _derivative(f, eps=1e-2):
    """Central difference at 0 with one Richardson step (error O(eps^4), so fp32 noise dominates)."""
    d1, d2 = (f(eps) - f(-eps)) / (2 * eps), (f(eps / 2) - f(-eps / 2)) / eps
    return (4 * d2 - d1) / 3


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_first_order_estimates_match_finite_differences(family):
    """d/da of the mean score at a = 0, with ``x - a (x.r) r`` at every writer (bypass) or ``a v`` added at
    resid_pre of one block (induce), equals ``-r^T M r`` and ``G_l . v``; batches of 2 with padding."""
    m = tiny_model(family, n_layers=3)
    _, encs = prepare(m, PROMPTS)
    M, base, n_batches = ablation_moment(m, encs, TOKENS, batch_size=2)
    assert n_batches == 3 and base == pytest.approx(_mean_score(m, encs), abs=1e-5)
    torch.manual_seed(0)
    sites = [s.name for s in writer_sites(m)]
    (b,) = batches(m, encs, len(encs))
    resid = resid_pre_cache(m, b, [0, m.n_layers - 1])
    mean_dir = resid[m.n_layers - 1][b.attention_mask.bool()].mean(0)        # a direction the stream really uses
    for r in [mean_dir, *torch.randn(2, m.d_model)]:
        r = torch.nn.functional.normalize(r, dim=-1)

        def scaled(a, r=r):
            return [(s, lambda x, ctx, a=a: x - a * (x @ r)[..., None] * r) for s in sites]

        fd = _derivative(lambda a: _mean_score(m, encs, scaled(a)), eps=0.05)
        est = -float(r.double() @ M @ r.double())
        assert est == pytest.approx(fd, rel=1e-3, abs=1e-5), (est, fd)
    G, _, _, _ = harmless_terms(m, encs, TOKENS, [0, 2], torch.zeros(1, m.d_model), batch_size=2, probes=0)
    resid = resid_pre_cache(m, b, [0, 2])
    for i, layer in enumerate((0, 2)):
        # a step of 1% of the residual's own norm: the tiny model's stream is small, a unit vector is not a small step
        scale = float(resid[layer][b.attention_mask.bool()].norm(dim=-1).mean())
        v = scale * torch.nn.functional.normalize(torch.randn(m.d_model), dim=-1)
        fd = _derivative(lambda a, v=v, layer=layer: _mean_score(
            m, encs, (), steering.AddVector(a * v, layers=layer, sites="resid_pre")))
        assert float(G[i] @ v.double()) == pytest.approx(fd, rel=1e-3, abs=1e-5), (layer, fd)


def test_second_order_kl_estimate_matches_the_exact_curvature():
    """KL(a) of ablating ``a``-scaled projections grows as ``a^2 c``; the probe estimate of ``c`` (at a = 1)
    matches the finite-difference curvature (Monte Carlo; measured within 5% with 400 probes, 2% with 2000). The
    KL itself is taken in float64: in float32 its rounding is ~10% of a KL this small."""
    m = tiny_model("llama", n_layers=3)
    _, encs = prepare(m, PROMPTS)
    (b,) = batches(m, encs, len(encs))
    sites = [s.name for s in writer_sites(m)]
    lp = last_logits(m, b).double().log_softmax(-1)
    torch.manual_seed(3)
    units = torch.nn.functional.normalize(torch.randn(3, m.d_model), dim=-1)
    _, kl, _, n_batches = harmless_terms(m, encs, TOKENS, [1], units, batch_size=2, probes=400)
    assert n_batches == 3
    a = 0.05
    for c, r in enumerate(units):
        hook = [(s, lambda x, ctx, r=r: x - a * (x @ r)[..., None] * r) for s in sites]
        lq = last_logits(m, b, hook).double().log_softmax(-1)
        curvature = float((lp.exp() * (lp - lq)).sum(-1).mean()) / a ** 2
        assert float(kl[c]) == pytest.approx(curvature, rel=0.1), (c, float(kl[c]), curvature)


def test_logit_curvature_term_matches_its_exact_value():
    """The bypass estimate's second-order term, ``1/2 dz^T (F_R - F_N) dz`` per prompt with ``dz`` the first-order
    logit change of the ablation, from probes (2000 per part) vs computed exactly: ``dz`` by a central difference
    of the logits in float64, ``F_A`` from the clean softmax within the refusal tokens and within the rest."""
    m = tiny_model("llama", n_layers=3, dtype=torch.float64)
    _, encs = prepare(m, PROMPTS)
    (b,) = batches(m, encs, len(encs))
    sites = [s.name for s in writer_sites(m)]
    torch.manual_seed(5)
    units = torch.nn.functional.normalize(torch.randn(2, m.d_model, dtype=torch.float64), dim=-1)
    _, curv, _, n_batches = harmful_terms(m, encs, TOKENS, 2, units, probes=2000)
    assert n_batches == 3 and curv.shape == (2,)
    z = last_logits(m, b).double()
    inside = torch.zeros(z.shape[-1], dtype=torch.bool)
    inside[TOKENS] = True
    a = 1e-4
    for c, r in enumerate(units):
        def logits(a, r=r):
            return last_logits(m, b, [(s, lambda x, ctx, a=a, r=r: x - a * (x @ r)[..., None] * r) for s in sites])
        dz = (logits(a) - logits(-a)).double() / (2 * a)
        exact = 0.0
        for part, sign in ((inside, 1.0), (~inside, -1.0)):
            q = z.masked_fill(~part, float("-inf")).softmax(-1)
            exact += sign * 0.5 * ((q * dz ** 2).sum(-1) - (q * dz).sum(-1) ** 2)
        assert float(curv[c]) == pytest.approx(float(exact.mean()), rel=0.1), (c, float(curv[c]), float(exact.mean()))
    _, none, _, _ = harmful_terms(m, encs, TOKENS, 2)
    assert none.numel() == 0


@pytest.fixture(scope="module")
def organism_sweep():
    """Exhaustive scores and attribution estimates of every organism candidate (default prompt sets)."""
    import interp

    m = interp.load_model("organism")
    data = load_refusal_data()
    tok = find_refusal_tokens(m, data)
    cand = find_candidates(m, data)
    return m, data, tok, cand, score_candidates(m, data, cand, tok), estimate_candidates(m, data, cand, tok)


def test_estimate_ranks_like_the_exhaustive_sweep(organism_sweep):
    """Measured on the organism (8 candidates, 2 of them the zero vector at layer 0): Spearman bypass 0.928 over
    all (first order alone: 0.735; the logit-curvature term brings the two layer-2 candidates, exact -5.0 and
    -6.0, from 3.2-3.3 estimated to 0.2 and 0.0), 1.0 over the 5 whose exact KL passes the 0.1 filter; induce
    0.976; KL 0.904."""
    m, data, tok, cand, exact, est = organism_sweep
    assert est.baseline_harmful == pytest.approx(exact.baseline_harmful, abs=1e-4)
    assert est.baseline_harmless == pytest.approx(exact.baseline_harmless, abs=1e-4)
    rho = {k: float(spearman(getattr(est, k).flatten(), getattr(exact, k).flatten())) for k in ("bypass", "induce", "kl")}
    ok = exact.kl < SelectionConfig().kl_threshold
    rho_ok = float(spearman(est.bypass[ok], exact.bypass[ok]))
    print(f"organism: Spearman {rho}, bypass over exact-KL-passing candidates {rho_ok:.3f} (n={int(ok.sum())})")
    assert rho["induce"] >= 0.9 and rho["kl"] >= 0.8 and rho_ok >= 0.8, (rho, rho_ok)
    assert rho["bypass"] >= 0.8, rho                               # measured 0.928
    first = est.bypass - est.curvature                             # the first-order estimate alone ranks worse
    assert float(spearman(first.flatten(), exact.bypass.flatten())) < rho["bypass"] - 0.1
    win = select_direction(m.n_layers, cand, exact, SelectionConfig(search="exhaustive"))
    assert win.found
    top5 = top_candidates(est, cand, m.n_layers, SelectionConfig(), 5)
    assert top5[win.layer_index, win.position_index]
    # one batch per val set: harmful 1 + PROBES per vocabulary part (the organism has 2 refusal tokens), harmless
    assert len(set(tok.tokens)) > 1 and est.forwards == 2 and est.backwards == 1 + 2 * PROBES + 1 + PROBES


def test_exact_scores_of_a_subset_equal_the_sweep(organism_sweep):
    m, data, tok, cand, exact, est = organism_sweep
    only = top_candidates(est, cand, m.n_layers, SelectionConfig(), 3)
    assert int(only.sum()) == 3
    sub = score_candidates(m, data, cand, tok, only=only)
    for name in ("bypass", "induce", "kl"):
        a, b = getattr(sub, name), getattr(exact, name)
        torch.testing.assert_close(a[only], b[only], atol=1e-5, rtol=0)
        assert a[~only].isnan().all()
    sel = select_direction(m.n_layers, cand, sub, SelectionConfig())
    assert sel.found and (sel.layer_index, sel.position_index) == _chosen(m, cand, exact)
    with pytest.raises(ValueError, match="bool mask"):
        score_candidates(m, data, cand, tok, only=only[:1])


def _chosen(m, cand, scores):
    sel = select_direction(m.n_layers, cand, scores, SelectionConfig(search="exhaustive"))
    return sel.layer_index, sel.position_index


def test_top_candidates_respects_the_filters(organism_sweep):
    m, _, _, cand, _, est = organism_sweep
    cfg = SelectionConfig(prune_layer_fraction=0.5)                # layers 0, 1 only
    mask = top_candidates(est, cand, m.n_layers, cfg, 100)
    assert mask[:2].all() and not mask[2:].any()
    mask = top_candidates(est, cand, m.n_layers, SelectionConfig(induce_threshold=0.0), 1)
    li, pi = divmod(int(mask.flatten().nonzero()[0, 0]), cand.n_positions)
    assert est.induce[li, pi] > 0                                  # passing the estimated induce comes first
    with pytest.raises(ValueError, match="top_k"):
        top_candidates(est, cand, m.n_layers, SelectionConfig(), 0)


def test_induce_with_prefix_reuse_equals_full_forwards():
    for family in ("llama", "qwen2_moe", "gemma3_text"):
        m = tiny_model(family, n_layers=4)
        _, encs = prepare(m, PROMPTS)
        torch.manual_seed(0)
        vecs = 3 * torch.randn(7, m.d_model)
        layers = torch.tensor([3, 0, 2, 2, 1, 3, 1])
        fast = score_rows(m, encs, vecs, "add", layers, max_rows=11)           # chunks of 2 candidates
        slow = score_rows(m, encs, vecs, "add", layers, max_rows=11, reuse_prefix=False)
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=0)
        red = score_rows(m, encs, vecs, "add", layers, max_rows=11, reduce=lambda lg: refusal_score(lg, TOKENS))
        torch.testing.assert_close(red, refusal_score(slow, TOKENS), atol=1e-5, rtol=0)


def test_estimate_mode_pipeline_selects_the_exhaustive_candidate(tmp_path):
    kw = dict(model="organism", n_test=8, subspace_rank=2, max_new_tokens=4)
    ex = run_refusal(RefusalConfig.from_flat(search="exhaustive", **kw), tmp_path / "ex").metrics["selection"]
    es = run_refusal(RefusalConfig.from_flat(search="estimate", top_k=3, threads=1, **kw), tmp_path / "es")
    sel = es.metrics["selection"]
    assert (sel["layer"], sel["position"]) == (ex["layer"], ex["position"])
    assert sel["bypass_score"] == pytest.approx(ex["bypass_score"], abs=1e-5)
    assert ex["search"] == "exhaustive" and ex["n_scored_exactly"] == ex["passing"]["of"]
    assert sel["search"] == "estimate" and sel["top_k"] == 3 and sel["n_scored_exactly"] == 3
    assert set(sel["estimate_spearman"]) == {"bypass", "induce", "kl"}
    assert "estimate" in es.computed and (tmp_path / "es" / "stages" / "estimate" / "meta.json").exists()
    # a larger top_k on the same folder re-runs the exact scores, not the estimate
    more = run_refusal(RefusalConfig.from_flat(search="estimate", top_k=4, **kw), tmp_path / "es")
    assert "estimate" not in more.computed and "scores" in more.computed


def test_threads_setting_is_restored(tmp_path):
    before = torch.get_num_threads()
    m = tiny_model("llama")
    h = tmp_path / "h.txt"
    h.write_text("\n".join(f"do bad thing {i}" for i in range(12)))
    run_refusal(RefusalConfig.from_flat(harmful=str(h), harmless=str(h), max_new_tokens=2, threads=before + 1),
                tmp_path / "r", model=m)
    assert torch.get_num_threads() == before


def test_config_and_cli_flags():
    with pytest.raises(ValueError, match="search must be one of"):
        SelectionConfig(search="fast")
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        RefusalConfig.from_flat(top_k=0)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        RefusalConfig.from_flat(threads=0)
    a, b = RefusalConfig.from_flat(), RefusalConfig.from_flat(search="exhaustive", top_k=3, threads=2)
    assert a.run_identity() == b.run_identity()                    # the stage keys decide what re-runs
    import argparse

    from interp.cli.refusal_job import add_refusal_parser

    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    add_refusal_parser(sub, lambda p, default="organism": p.add_argument("--model", default=default))
    args = ap.parse_args(["refusal", "--search", "exhaustive", "--top-k", "5", "--threads", "2"])
    assert (args.search, args.top_k, args.threads) == ("exhaustive", 5, 2)
    with pytest.raises(SystemExit):
        ap.parse_args(["refusal", "--search", "fast"])


def test_selection_names_what_the_kl_filter_alone_turned_down(organism_sweep):
    """With the KL threshold set just under the default winner's KL, the winner (and any stronger candidate that
    fails KL alone) is listed in ``kl_rejected``, lowest bypass first, and a note names them."""
    from interp.studies.refusal.diagnosis import kl_rejected_notes

    m, _, _, cand, exact, _ = organism_sweep
    win = select_direction(m.n_layers, cand, exact, SelectionConfig(search="exhaustive"))
    assert win.found
    cfg = SelectionConfig(search="exhaustive", kl_threshold=win.kl * 0.999)
    sel = select_direction(m.n_layers, cand, exact, cfg)
    below = sel.bypass_score if sel.found else float("inf")
    depth = int(m.n_layers * (1 - cfg.prune_layer_fraction))
    by_hand = sorted((float(exact.bypass[li, pi]), layer, pi - cand.n_positions)
                     for li, layer in enumerate(cand.layers) for pi in range(cand.n_positions)
                     if layer < depth and exact.induce[li, pi] > 0 and exact.bypass[li, pi] < exact.baseline_harmful
                     and exact.kl[li, pi] >= cfg.kl_threshold and exact.bypass[li, pi] < below)[:3]
    assert by_hand and [(x["bypass"], x["layer"], x["position"]) for x in sel.kl_rejected] == by_hand
    assert (win.layer, win.position) in {(x["layer"], x["position"]) for x in sel.kl_rejected} or len(by_hand) == 3
    (note,) = kl_rejected_notes(sel)
    assert f"layer {by_hand[0][1]}, position {by_hand[0][2]}" in note and "KL filter" in note
    assert all(x["kl"] >= 0.1 and x["bypass"] < win.bypass_score for x in win.kl_rejected)


def test_both_ablation_modes_from_the_same_passes_equal_their_own_runs(organism_sweep):
    """``auto`` estimates the every-token and the post-instruction ablation in one set of passes: each equals its own
    run (same probes: the positions change only which writer outputs count), and the passes are counted once."""
    m, data, tok, cand, _, own_all = organism_sweep
    both = estimate_modes(m, data, cand, tok, modes=("all", "post_instruction"))
    own_post = estimate_candidates(m, data, cand, tok, ablate_positions="post_instruction")
    for got, want in ((both["all"], own_all), (both["post_instruction"], own_post)):
        for name in ("bypass", "induce", "kl", "curvature"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-5)
        assert (got.baseline_harmful, got.baseline_harmless) == pytest.approx((want.baseline_harmful, want.baseline_harmless))
    assert not torch.allclose(both["all"].bypass, both["post_instruction"].bypass), "the modes must differ here"
    assert (both["all"].forwards, both["all"].backwards) == (own_all.forwards, own_all.backwards)
    assert (both["post_instruction"].forwards, both["post_instruction"].backwards) == (0, 0)
    with pytest.raises(ValueError, match="distinct"):
        estimate_modes(m, data, cand, tok, modes=("all", "all"))


def test_a_kl_gate_skips_bypass_and_induce_only_when_no_candidate_passes_the_kl_filter(organism_sweep):
    """score_candidates(kl_gate=): the KL is scored first; bypass and induce only if some candidate's KL is below the
    gate (the job's every-token search when the post-instruction one follows)."""
    m, data, tok, cand, exact, est = organism_sweep
    only = top_candidates(est, cand, m.n_layers, SelectionConfig(), 3)
    kls = exact.kl[only]
    passed = score_candidates(m, data, cand, tok, only=only, kl_gate=lambda rand: float(kls.max()) + 1)
    for name in ("bypass", "induce", "kl"):
        torch.testing.assert_close(getattr(passed, name)[only], getattr(exact, name)[only], atol=1e-5, rtol=0)
    seen: list[list[float]] = []
    gated = score_candidates(m, data, cand, tok, only=only, kl_gate=lambda rand: seen.append(rand) or
                             float(kls.min()))  # none is strictly below its own minimum
    assert gated.bypass.isnan().all() and gated.induce.isnan().all() and gated.n_scored == 3
    torch.testing.assert_close(gated.kl[only], exact.kl[only], atol=1e-5, rtol=0)
    assert seen == [gated.kl_random] and len(gated.kl_random) > 0
    assert not select_direction(m.n_layers, cand, gated, SelectionConfig()).found
