"""One provenance and one save/load bundle: every object kind round-trips, kinds are checked, old files load."""

import json

import pytest
import torch

import interp.bundle
import probes
from interp.activations import Activations
from interp.bundle import PACKAGE_VERSION, Provenance, read_kind
from interp.io import save_bundle
from probes import Direction, Subspace
from probes.erasure import INLPEraser, LeaceEraser
from probes.logistic import LogisticProbe
from sae.model import SAE, SAEConfig

SITES = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]


def data(n=80, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    X = torch.randn(n, 2, d, generator=g) + y[:, None, None].float()
    return Activations(tensor=X, sites=SITES, model_id="tiny", labels=y.tolist())


def objects():
    acts = data()
    sae = SAE(SAEConfig(d_in=6, d_sae=12, arch="topk", k=3, site="blocks.1.hook_resid_post", model_id="tiny",
                        meta={"data_hash": "abc", "fitted_on": ["0", "1"]}), seed=1)
    return {"Activations": acts, "Direction": probes.diff_of_means(acts), "Subspace": probes.subspace.pca_subspace(acts, k=2),
            "LeaceEraser": probes.fit_leace(acts), "INLPEraser": probes.fit_inlp(acts, n_iter=2),
            "LogisticProbe": probes.fit_logistic(acts), "SAE": sae}


def tensors_of(obj):
    if isinstance(obj, SAE):
        return obj.state_dict()
    return {k: v for k, v in vars(obj).items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("name", ["Activations", "Direction", "Subspace", "LeaceEraser", "INLPEraser",
                                  "LogisticProbe", "SAE"])
def test_round_trip_keeps_tensors_and_provenance(tmp_path, name):
    obj = objects()[name]
    obj.save(tmp_path / name)
    meta = json.loads((tmp_path / name / "meta.json").read_text())
    assert meta["kind"] == read_kind(tmp_path / name) and meta["format"] == interp.bundle.FORMAT
    assert meta["provenance"]["created_with"] == PACKAGE_VERSION
    for back in (type(obj).load(tmp_path / name), interp.bundle.load(tmp_path / name)):
        assert type(back) is type(obj)
        want, got = tensors_of(obj), tensors_of(back)
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
        assert back.provenance == obj.provenance
    assert obj.provenance.model_id == "tiny" and obj.provenance.sites


def test_fitted_provenance_records_the_fit():
    acts = data()
    for obj in (probes.diff_of_means(acts), probes.fit_leace(acts), probes.fit_logistic(acts)):
        p = obj.provenance
        assert p.method and p.sites == SITES and p.layers == [0, 1]
        assert p.data_hash and p.fitted_on == acts.prompt_ids and p.created_with == PACKAGE_VERSION
    sae_p = objects()["SAE"].provenance
    assert (sae_p.method, sae_p.sites, sae_p.data_hash, sae_p.fitted_on) == \
           ("sae.topk", ["blocks.1.hook_resid_post"], "abc", ["0", "1"])


def test_kind_is_checked_and_names_the_right_loader(tmp_path):
    objects()["Direction"].save(tmp_path / "d")
    with pytest.raises(ValueError, match=r"holds a probes\.Direction; load it with probes\.Direction\.load"):
        SAE.load(tmp_path / "d")
    with pytest.raises(ValueError, match="does not hold a saved LogisticProbe"):
        LogisticProbe.load(tmp_path / "d")
    save_bundle(tmp_path / "x", {"t": torch.zeros(1)}, {"kind": "elsewhere.Thing"})
    with pytest.raises(ValueError, match="import elsewhere"):
        interp.bundle.load(tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="meta.json missing"):
        interp.bundle.load(tmp_path / "nothing")


def test_sae_load_refuses_a_saelens_folder_with_the_fix(tmp_path):
    from sae.saelens_io import save_saelens

    save_saelens(objects()["SAE"], tmp_path / "s")
    with pytest.raises(ValueError, match="load_saelens"):
        SAE.load(tmp_path / "s")


def test_format_1_files_still_load(tmp_path):
    """Bundles written before the shared Provenance (provenance keys flat in meta.json) load unchanged."""
    d = objects()["Direction"]
    save_bundle(tmp_path / "old_dir", {"vectors": d.vectors, "norms": d.norms},
                {"kind": "probes.Direction", "method": d.method, "sites": d.sites, "model_id": d.model_id,
                 "data_hash": d.data_hash, "fitted_on": d.fitted_on, "meta": d.meta})
    back = Direction.load(tmp_path / "old_dir")
    assert torch.equal(back.vectors, d.vectors) and back.fitted_on == d.fitted_on and back.created_with == ""
    s = objects()["Subspace"]
    save_bundle(tmp_path / "old_sub", {"bases": s.bases, "strengths": s.strengths},
                {"kind": "probes.Subspace", "names": None, "method": s.method, "sites": s.sites,
                 "model_id": s.model_id, "data_hash": s.data_hash, "fitted_on": s.fitted_on, "meta": s.meta})
    assert torch.equal(Subspace.load(tmp_path / "old_sub").bases, s.bases)
    e = objects()["LeaceEraser"]
    save_bundle(tmp_path / "old_er", {"left": e.left, "right": e.right, "bias": e.bias},
                {"kind": "probes.LeaceEraser", "sites": e.sites, "model_id": e.model_id, "data_hash": e.data_hash,
                 "fitted_on": e.fitted_on, "meta": e.meta})
    assert torch.equal(LeaceEraser.load(tmp_path / "old_er").left, e.left)
    a = objects()["Activations"]
    save_bundle(tmp_path / "old_acts", {"activations": a.tensor},
                {"kind": "interp.Activations", "sites": a.sites, "positions": a.positions, "model_id": a.model_id,
                 "prompt_ids": a.prompt_ids, "labels": a.labels, "dtype": str(a.tensor.dtype), "meta": a.meta})
    back_a = Activations.load(tmp_path / "old_acts")
    assert torch.equal(back_a.tensor, a.tensor) and back_a.labels == a.labels
    sae = objects()["SAE"]
    save_bundle(tmp_path / "old_sae", dict(sae.state_dict()), {"kind": "sae.SAE", "cfg": sae.cfg.to_dict()})
    assert torch.equal(SAE.load(tmp_path / "old_sae").W_enc, sae.W_enc)


def test_provenance_dict_round_trip():
    p = Provenance("diff_of_means", SITES + ["ln_final.hook_normalized"], "m", "h", ["1"], meta={"a": 1})
    d = p.to_dict()
    assert d["layers"] == [0, 1, None] and Provenance.from_dict(d) == p
    assert INLPEraser.__mro__[1] is interp.bundle.Fitted
