"""Edit specs (``steering.save_edit`` / ``load_edit``): every edit reloads as the same object, provenance is
checked, nothing is overwritten; the refusal run's edits regenerate its generations byte for byte; and the two
silent defaults of issue 36 (a one-layer Direction ablated at one layer, a unit Direction added as is)."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, fields, is_dataclass

import pytest
import torch

import interp
import steering
from interp.testing.tiny import tiny_model
from probes.objects import Direction
from steering.specs import register_edit

PROMPTS = ["the man said to the boy", "how do you find water", "tell me about the house"]


def _same(a, b, where="edit"):
    """Recursive equality of two edit objects: same class, same fields, equal tensors."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif is_dataclass(a):
        for f in fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _logits(model, *edits):
    ids = torch.tensor([[1, 10, 11, 12, 13, 14]])
    with steering.apply(model, *edits):
        return model.hf(input_ids=ids).logits


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _edits(m):
    g = torch.Generator().manual_seed(0)
    v, w, u = (torch.randn(m.d_model, generator=g) for _ in range(3))
    one = Direction.from_vectors(3.0 * v[None], ["blocks.1.hook_resid_pre"], model_id=m.name,
                                 meta={"model": {"n_layers": m.n_layers, "d_model": m.d_model}})
    norms = steering.residual_norms(m, PROMPTS)
    basis = torch.linalg.qr(torch.randn(m.d_model, 2, generator=g))[0].T.contiguous()
    return {"add": steering.AddVector(v, layers=[0, 1], alpha=2.0, sites="resid_pre"),
            "add table": steering.AddVector({0: v, 1: w}, layers=[0, 1], alpha=-1.5, scope="generated"),
            "add direction": steering.AddVector(one, layers=1, magnitude="raw"),
            "add residual": steering.AddVector(v, layers=1, alpha=0.3, unit="residual", norms=norms),
            "ablate": steering.Ablate(u, layers=1, positions=[-2, -1], scope="prompt"),
            "directional": steering.DirectionalAblation(one, positions="post_instruction"),
            "gated": steering.DirectionalAblation(v).when(w, 0.25, above=False),
            "clamp": steering.Clamp(w, 1.5, layers=[1], unit="residual", norms=norms),
            "subspace": steering.AblateSubspace(basis),
            "subspace table": steering.AblateSubspace({1: basis}, layers=[1], sites="resid_post")}


def test_every_edit_reloads_as_the_same_object_with_the_same_effect(model, tmp_path):
    for name, edit in _edits(model).items():
        path = tmp_path / name.replace(" ", "_")
        steering.save_edit(edit, path, model=model)
        spec = json.loads(path.with_suffix(".json").read_text())
        assert spec["kind"] == type(edit).__name__ and path.with_suffix(".safetensors").exists()
        assert spec["layers"] == edit.resolved_layers(model) and spec["sites"] == list(edit.kinds)
        assert spec["provenance"]["d_model"] == model.d_model and spec["provenance"]["weights"]
        back = steering.load_edit(path, model=model)
        _same(edit, back, name)
        if edit.positions == "post_instruction":   # needs the prompts' chat layout: compare generations
            assert (steering.generate(model, PROMPTS, edit, max_new_tokens=4).texts
                    == steering.generate(model, PROMPTS, back, max_new_tokens=4).texts), name
        else:
            assert torch.equal(_logits(model, edit), _logits(model, back)), name
    edits = _edits(model)
    add = json.loads((tmp_path / "add.json").read_text())
    assert add["coefficients"] == {"alpha": 2.0, "unit": "raw", "magnitude": None}
    assert add["norms"] == pytest.approx([float(edits["add"].vector.norm())] * 2)
    raw = json.loads((tmp_path / "add_direction.json").read_text())   # the raw difference of means' norm
    assert raw["norms"] == pytest.approx([float(edits["add direction"].vector.norms[0])])
    assert raw["coefficients"]["magnitude"] == "raw"


def test_save_refuses_overwrite_unknown_kinds_and_other_models(model, tmp_path):
    edit = steering.DirectionalAblation(torch.ones(model.d_model))
    steering.save_edit(edit, tmp_path / "r", model=model)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        steering.save_edit(edit, tmp_path / "r")
    steering.save_edit(steering.Ablate(torch.ones(model.d_model), layers=0), tmp_path / "r", model=model,
                       overwrite=True)
    assert type(steering.load_edit(tmp_path / "r")) is steering.Ablate
    steering.save_edit(steering.AddVector(torch.ones(model.d_model), layers=range(2)), tmp_path / "range")
    assert steering.load_edit(tmp_path / "range").layers == [0, 1]
    with pytest.raises(TypeError, match="dataclass"):
        steering.save_edit(lambda m: {}, tmp_path / "f")
    spec = json.loads((tmp_path / "r.json").read_text())
    for bad in ({**spec, "class": "os.system"}, {**spec, "fields": {**spec["fields"], "condition": {
            "__dataclass__": "subprocess.Popen", "fields": {}}}}):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        (tmp_path / "bad.safetensors").write_bytes((tmp_path / "r.safetensors").read_bytes())
        with pytest.raises(ValueError, match="not a known edit"):
            steering.load_edit(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="save_edit"):
        steering.load_edit(tmp_path / "missing")
    (tmp_path / "bad.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="copy both"):
        steering.load_edit(tmp_path / "bad")
    with pytest.warns(UserWarning, match="tiny-llama"):
        steering.load_edit(tmp_path / "r", model=tiny_model("mistral"))
    with pytest.raises(ValueError, match="width 32"):
        steering.load_edit(tmp_path / "r", model=tiny_model("llama", d_model=32))
    with pytest.raises(ValueError, match="3 layers"):
        steering.load_edit(tmp_path / "r", model=tiny_model("llama", n_layers=3))


def test_one_layer_direction_is_ablated_at_every_layer_as_the_recipe_does(model):
    """Trap 1: a Direction fitted at one layer, given to the every-layer ablation, was ablated at its own layer
    only (the refusal run ablates it at every layer)."""
    v = torch.randn(model.d_model, generator=torch.Generator().manual_seed(3))
    d = Direction.from_vectors(v[None], ["blocks.1.hook_resid_pre"])
    assert steering.DirectionalAblation(d).resolved_layers(model) == [0, 1]
    assert torch.equal(_logits(model, steering.DirectionalAblation(d)),
                       _logits(model, steering.DirectionalAblation(d.vectors[0])))
    assert steering.DirectionalAblation(d, layers=[1]).resolved_layers(model) == [1]   # explicit layers: those


def test_add_vector_from_a_unit_direction_says_which_vector_it_adds(model):
    """Trap 2: ``AddVector(direction, layers=L)`` added the unit vector at ``resid_post`` while the run added the
    raw difference of means at ``resid_pre``: the choice of magnitude is now required, the site follows the
    Direction's own."""
    v = torch.randn(model.d_model, generator=torch.Generator().manual_seed(4))
    d = Direction.from_vectors(5.0 * v[None], ["blocks.1.hook_resid_pre"])
    with pytest.raises(ValueError, match="magnitude='raw'.*magnitude='unit'"):
        steering.AddVector(d, layers=1)
    raw = steering.AddVector(d, layers=1, magnitude="raw")
    assert raw.kinds == ("resid_pre",) and raw.added_norms(model) == {1: pytest.approx(5.0 * float(v.norm()))}
    assert torch.allclose(_logits(model, raw), _logits(model, steering.AddVector(5.0 * v, layers=1, sites="resid_pre")),
                          atol=1e-5)
    unit = steering.AddVector(d, layers=1, magnitude="unit", alpha=2.0)
    assert unit.added_norms(model) == {1: pytest.approx(2.0)}
    assert steering.AddVector(d, layers=1, magnitude="raw", sites="resid_post").kinds == ("resid_post",)
    assert steering.AddVector(v, layers=1).kinds == ("resid_post",)   # a bare tensor: the old default
    with pytest.raises(ValueError, match="magnitude"):
        steering.AddVector(d, layers=1, magnitude="huge")


@pytest.fixture(scope="module")
def organism_run(tmp_path_factory):
    from interp.studies.refusal import RefusalConfig, run_refusal

    out = tmp_path_factory.mktemp("runs") / "aligned"
    return run_refusal(RefusalConfig.from_flat(model="organism", n_test=8, max_new_tokens=8), out), out


def test_run_edits_reload_and_regenerate_the_run_byte_for_byte(organism_run):
    res, out = organism_run
    specs = res.metrics["edits"]
    assert {"harmful/ablation", "harmful/random ablation", "harmless/addition", "every-token ablation"} <= set(specs)
    model = interp.load_model("organism")
    rows = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    how, checked = res.metrics["generation"], 0
    for cond, rel in specs.items():
        edit = steering.load_edit(out / rel, model=model)
        mine = [r for r in rows if r["condition"] == cond]
        if not mine:
            continue  # a KL control: no generations of its own
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            gen = steering.generate(model, [r["instruction"] for r in mine], edit, max_new_tokens=how["max_new_tokens"],
                                    runtime=interp.Runtime(batch_size=how["batch_size"], progress=False))
        assert gen.texts == [r["response"] for r in mine], cond
        checked += 1
    assert checked >= 6
    # the run's saved direction, used the obvious way, now does what the run did (it did not: one layer, unit vector)
    d = Direction.load(out / "direction")
    by_hand = {"harmful/ablation": steering.DirectionalAblation(d, positions=res.metrics["selection"]["ablate_positions"]),
               "harmless/addition": steering.AddVector(d, layers=d.layers[0], magnitude="raw")}
    for cond, edit in by_hand.items():
        mine = [r for r in rows if r["condition"] == cond]
        gen = steering.generate(model, [r["instruction"] for r in mine], edit, max_new_tokens=how["max_new_tokens"],
                                runtime=interp.Runtime(batch_size=how["batch_size"], progress=False))
        assert gen.texts == [r["response"] for r in mine], cond


@dataclass(eq=False)
class _MyAblation(steering.Ablate):
    """A user's own edit class (a dataclass), registered to be saved."""

    note: str = ""


def test_a_registered_edit_class_round_trips(model, tmp_path):
    edit = _MyAblation(torch.ones(model.d_model), layers=[1], note="mine")
    with pytest.raises(TypeError, match="register_edit"):
        steering.save_edit(edit, tmp_path / "mine")
    register_edit(_MyAblation)
    steering.save_edit(edit, tmp_path / "mine", model=model)
    _same(edit, steering.load_edit(tmp_path / "mine", model=model))
