"""Latent analysis on planted structure (alignment, separation, AUROC, model diffing) and the SAE plots."""

from __future__ import annotations

import pytest
import torch

from interp.evals.metrics import auroc
from sae.analysis import aligned_latents, diff_latents, separating_latents


def test_aligned_latents_find_the_planted_decoder_vector(sae):
    g = torch.Generator().manual_seed(0)
    direction = sae.W_dec[13].detach() + 0.05 * torch.randn(32, generator=g)
    r = aligned_latents(sae, direction, top=5)
    assert r.indices[0] == 13 and r.scores[0] > 0.95 and (r.scores[1:] < 0.7).all()
    r_neg = aligned_latents(sae, -direction, top=3, absolute=True)
    assert r_neg.indices[0] == 13 and r_neg.scores[0] < -0.95
    with pytest.raises(ValueError, match="width 32"):
        aligned_latents(sae, torch.randn(16))


def test_auroc_matches_sklearn_with_ties():
    import sklearn.metrics as sk  # the [oracles] extra, in [dev]: never skipped

    g = torch.Generator().manual_seed(1)
    a = torch.relu(torch.randn(40, 6, generator=g) + 0.3).round(decimals=1)  # many ties, many zeros
    b = torch.relu(torch.randn(55, 6, generator=g)).round(decimals=1)
    ours = auroc(torch.cat([a, b]).T, torch.tensor([1] * 40 + [0] * 55))  # scores [..., n], labels y
    for j in range(6):
        y = [1] * 40 + [0] * 55
        ref = sk.roc_auc_score(y, torch.cat([a[:, j], b[:, j]]).tolist())
        assert ours[j].item() == pytest.approx(ref, abs=1e-6)


def test_separating_latents_rank_the_planted_latent_first(sae):
    g = torch.Generator().manual_seed(2)
    base = torch.randn(200, 32, generator=g) * 0.5
    a = base[:100] + 2.0 * sae.W_dec[21].detach()  # set A carries latent 21's direction
    sep = separating_latents(sae, a, base[100:], top=5)
    assert sep.ranking.indices[0] == 21
    assert sep.auroc[21] > 0.95 and sep.diff[21] > 0.5
    assert separating_latents(sae, a, base[100:], by="diff").ranking.indices[0] == 21


def test_diff_latents_rank_by_activation_change(sae):
    g = torch.Generator().manual_seed(3)
    base = torch.randn(150, 32, generator=g) * 0.5 + 1.0 * sae.W_dec[77].detach()  # 77 fires in the base model
    tuned = base + 1.5 * sae.W_dec[40].detach() - 1.0 * sae.W_dec[77].detach()
    d = diff_latents(sae, base, tuned, top=5)
    assert d.ranking.indices[0] == 40 and d.delta[40] > 0.5
    assert d.delta[77] < -0.3 and diff_latents(sae, base, tuned, by="decrease").ranking.indices[0] == 77
    assert d.freq_tuned[40] > d.freq_base[40]
    with pytest.raises(ValueError, match="same prompts"):
        diff_latents(sae, base, tuned[:10])


def test_sae_plots_build_from_plain_tensors():
    from interp.viz.sae import activation_histogram, diff_ranking, frequency_histogram, training_curves

    hist = {"tokens": [100, 200, 300], "l0": [30.0, 20.0, 16.0], "fvu": [0.9, 0.3, 0.2], "dead": [0, 0.01, 0.02]}
    fig = training_curves(hist)
    assert len(fig.data) == 3 and list(fig.data[1].y) == [0.9, 0.3, 0.2]
    acts = torch.relu(torch.randn(500, 10))
    assert len(activation_histogram(acts, latents=[1, 4]).data) == 2
    two = activation_histogram({"harmful": acts[:40, 0], "harmless": acts[:25, 0]}, only_active=False)
    assert [t.name for t in two.data] == ["harmful", "harmless"] and len(two.data[1].x) == 25
    assert len(frequency_histogram((acts > 0).float().mean(0)).data) == 1
    delta = torch.zeros(50)
    delta[7], delta[3] = 2.0, 1.0
    fig = diff_ranking(delta, top=4)
    assert list(fig.data[0].x)[:2] == ["#7", "#3"]
    fig2 = diff_ranking(delta, top=3, base=torch.zeros(50), tuned=delta)
    assert len(fig2.data) == 2
    with pytest.raises(ValueError, match="none of the requested metrics"):
        training_curves({"tokens": [1]})
    import subprocess
    import sys

    code = "import sys; import interp.viz.sae; assert 'sae' not in sys.modules; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
