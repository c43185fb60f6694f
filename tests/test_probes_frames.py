"""Every probes result's to_frame has a numeric layer column and is sorted by it (blocks.10 after blocks.2)."""

import torch

import probes
from interp.activations import Activations

SITES = [f"blocks.{i}.hook_resid_post" for i in (10, 2, 1)]             # deliberately out of order


def _acts(n=120, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor([0, 1] * (n // 2))
    X = torch.randn(n, len(SITES), d, generator=g) + (y.float() - 0.5)[:, None, None] * 3
    return Activations(tensor=X, sites=SITES, labels=y.tolist(), model_id="m", prompt_ids=[f"p{i}" for i in range(n)])


def _sorted_by_layer(frame, within=()):
    assert "layer" in frame.columns
    for _, part in (frame.groupby(list(within), sort=False) if within else [(None, frame)]):
        layers = part["layer"].tolist()
        assert layers == sorted(layers), layers


def test_every_to_frame_has_sorted_layer_column():
    acts = _acts()
    held = _acts(seed=1)
    held.prompt_ids = [f"h{i}" for i in range(len(held.prompt_ids))]
    direction = probes.diff_of_means(acts)
    cv = probes.cross_validate(acts, config=probes.CVConfig(n_folds=3))
    frames = {
        "ProbeScores": (cv.to_frame(), ["metric", "fold"]),
        "ProbeScores.by_site": (cv.by_site(), []),
        "DirectionScores": (probes.evaluate_direction(held, direction=direction).to_frame(), []),
        "Direction": (direction.to_frame(), []),
        "Subspace": (probes.subspace.pca_subspace(acts, k=2).to_frame(), ["component"]),
        "Signature": (probes.compare.signature(acts, {"a": direction}).to_frame(), ["direction", "group"]),
        "INLPEraser": (probes.fit_inlp(acts, n_iter=2).to_frame(), ["iteration"]),
        "ErasureScores": (probes.erasure_cv(acts, config=probes.CVConfig(n_folds=3)).to_frame(), ["stage", "metric", "fold"]),
        "AblationScores": (probes.transfer.rank_ablation(acts, subspace=lambda idx: probes.subspace.pca_subspace(acts[idx.tolist()], k=2),
                                                ranks=[0, 1], config=probes.CVConfig(n_folds=3)).to_frame(), ["rank"]),
        "GradedDirection": (probes.graded_direction(acts, n_folds=None, warn=False).to_frame(), []),
    }
    for name, (frame, within) in frames.items():
        try:
            _sorted_by_layer(frame, within)
        except AssertionError as err:
            raise AssertionError(f"{name}.to_frame: {err}") from err
    assert cv.by_site()["site"].tolist() == [SITES[2], SITES[1], SITES[0]]
