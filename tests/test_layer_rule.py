"""One layer-choosing rule (`probes.layers.LayerRule`) and its `choose`: ties, tolerance, window, minimise, top-k."""

import pytest
import torch

from probes.layers import LayerRule, choose


def test_ties_go_to_the_next_criterion_then_the_middle():
    crit = {"auroc": torch.ones(6), "d": torch.tensor([1.0, 2.0, 5.0, 5.0, 5.0, 3.0])}
    c = choose(LayerRule(("auroc", "d")), crit)
    assert c.tied == [0, 1, 2, 3, 4, 5] and c.remaining == [2, 3, 4] and c.index == 3
    assert c.values["d"] == [1.0, 2.0, 5.0, 5.0, 5.0, 3.0]
    assert "highest auroc" in c.rule and "then highest d" in c.rule and "middle" in c.rule
    assert choose(LayerRule(("auroc", "d"), tie="lowest"), crit).index == 2
    assert choose(LayerRule(("auroc", "d"), tie="highest"), crit).index == 4


def test_tolerance_takes_the_smallest_layer_within_tol_of_the_best():
    crit = {"auroc": [0.80, 0.90, 0.95, 0.96, 0.94]}
    assert choose(LayerRule(("auroc",)), crit).index == 3                          # the best alone
    c = choose(LayerRule(("auroc",), tol=0.02, tie="lowest"), crit, sites=[f"blocks.{i}.hook_resid_post" for i in range(5)])
    assert c.index == 2 and c.tied == [2, 3, 4] and c.site == "blocks.2.hook_resid_post" and c.layer == 2
    assert "within 0.02" in c.rule and "lowest" in c.rule


def test_window_middle_half_and_its_fallback():
    d = torch.tensor([9.0, 1.0, 2.0, 3.0, 2.5, 1.0, 9.0, 9.0])              # layers 0..7: middle half is 2..5
    c = choose(LayerRule(("d",), window="middle half"), {"d": d})
    assert c.index == 3 and "middle half" in c.rule
    assert choose(LayerRule(("d",)), {"d": d}).index == 6                       # no window: 0, 6, 7 tie -> middle
    assert choose(LayerRule(("d",), window=(5, 8), tie="lowest"), {"d": d}).index == 6
    only_ends = choose(LayerRule(("d",), window="middle half"), {"d": [1.0, 3.0]}, sites=[0, 12], n_layers=13)
    assert only_ends.index == 1 and "no layer in the window" in only_ends.rule   # none captured there: all layers


def test_minimise_and_the_floor():
    crit = {"loss": [0.5, 0.2, 0.2, 0.9]}
    c = choose(LayerRule(("loss",), minimise=("loss",), tie="lowest"), crit)
    assert c.index == 1 and "lowest loss" in c.rule
    with pytest.raises(ValueError, match="above 1"):
        choose(LayerRule(("loss",), above=1.0), crit)


def test_top_k_is_the_lexicographic_order_and_nan_is_never_chosen():
    score = torch.tensor([0.0, 0.3, 0.3, float("nan"), 0.1])
    effect = torch.tensor([0.9, 0.1, 0.2, 5.0, 0.0])
    c = choose(LayerRule(("score", "effect"), tol=0.0, tie="lowest", above=0.0, top_k=3), {"score": score, "effect": effect})
    assert c.indices == [2, 1, 4] and c.index == 2                            # layer 0 has score 0: not above
    with pytest.raises(ValueError, match="NaN"):
        choose(LayerRule(("score",)), {"score": torch.full((3,), float("nan"))})


def test_avoid_lowest_and_bad_input():
    crit = {"auroc": [1.0, 1.0, 1.0, 0.5], "d": [3.0, 1.0, 1.0, 0.0]}
    assert choose(LayerRule(("auroc", "d")), crit).index == 0
    c = choose(LayerRule(("auroc", "d"), avoid_lowest=True), crit)
    assert c.index == 1 and c.remaining == [1] and "lowest captured layer" in c.rule
    with pytest.raises(ValueError, match="missing"):
        choose(LayerRule(("auroc", "kl")), crit)
    with pytest.raises(ValueError, match="tie"):
        LayerRule(("auroc",), tie="first")
    with pytest.raises(ValueError, match="4 values"):
        choose(LayerRule(("auroc",)), crit, sites=[0, 1])
