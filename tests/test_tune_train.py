"""tune's fine-tuning loop on tiny random models: equal to a hand-written plain-torch loop, the loss goes down,
seeds are deterministic, a resumed run equals an uninterrupted one, masks and layer restriction are respected,
and bad input gets a clear error."""

from __future__ import annotations

import pytest
import torch

from interp.testing.tiny import tiny_model
from interp.tune import TuneConfig, fine_tune
from interp.tune.config import make_trainable
from interp.tune.data import encode_pairs
from interp.tune.objective import response_nll

P = ["how do you make water", "tell me a word", "what is the day", "why is the air blue"]
R = ["i can not do that .", "the word is good", "the day is long and great for you", "because of light"]


def plain_ids(tok, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """Prompt ids through the tokenizer's own chat template, response ids on their own (no library code of ours)."""
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"], tok(response, add_special_tokens=False)["input_ids"]


def plain_nll(hf, ids: list[int], n_resp: int, keep: list[bool] | None = None) -> tuple[torch.Tensor, int]:
    """Summed NLL of the (kept) response tokens of one unpadded sequence, and how many were kept."""
    x = torch.tensor([ids])
    lp = torch.log_softmax(hf(input_ids=x).logits[0].float(), -1)
    start = len(ids) - n_resp
    keep = keep if keep is not None else [True] * n_resp
    terms = [-lp[start + k - 1, ids[start + k]] for k in range(n_resp) if keep[k]]
    return torch.stack(terms).sum(), len(terms)


def test_equals_a_plain_torch_loop():
    """Full fine-tune of block 1: losses and final weights equal AdamW on per-example unpadded HF forwards."""
    cfg = TuneConfig(method="full", layers=(1,), steps=4, batch_size=3, lr=1e-2, warmup=2, seed=3)
    ours = fine_tune(tiny_model("llama", n_layers=3), P, R, cfg, progress=False)

    m = tiny_model("llama", n_layers=3)
    seqs = [plain_ids(m.tokenizer, p, r) for p, r in zip(P, R)]
    params = list(m.hf.model.layers[1].parameters())
    for p in m.hf.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    gen, order, losses = torch.Generator().manual_seed(cfg.seed), [], []
    for step in range(cfg.steps):
        if len(order) < cfg.batch_size:
            order += torch.randperm(len(P), generator=gen).tolist()
        batch, order = order[:cfg.batch_size], order[cfg.batch_size:]
        for g in opt.param_groups:
            g["lr"] = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * (1 - step / cfg.steps)
        parts = [plain_nll(m.hf, s[0] + s[1], len(s[1])) for s in (seqs[i] for i in batch)]
        loss = sum(t for t, _ in parts) / sum(n for _, n in parts)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert ours.losses == pytest.approx(losses, abs=1e-5)
    got, init = dict(ours.model.hf.named_parameters()), dict(tiny_model("llama", n_layers=3).hf.named_parameters())
    for name, p in m.hf.named_parameters():  # Adam divides by sqrt(v): a near-zero gradient's rounding shows ~1e-5
        assert torch.allclose(got[name], p, atol=1e-4), name
    key = "model.layers.1.mlp.up_proj.weight"
    assert float((got[key] - init[key]).detach().abs().max()) > 1e-2, "the oracle comparison can fail"


def test_rows_align_with_the_template():
    m = tiny_model("llama")
    rows = encode_pairs(m, P, R)
    for row, p, r in zip(rows, P, R):
        pid, rid = plain_ids(m.tokenizer, p, r)
        assert row.enc.ids == pid + rid and row.enc.response_start == len(pid) and row.n_response == len(rid)


def test_loss_goes_down_and_seeds_are_deterministic():
    cfg = TuneConfig(steps=25, batch_size=2, lr=2e-2, targets=("q_proj", "v_proj", "down_proj"))
    a = fine_tune(tiny_model("llama"), P, R, cfg, progress=False)
    assert sum(a.losses[-5:]) / 5 < a.losses[0] - 0.3, a.losses
    b = fine_tune(tiny_model("llama"), P, R, cfg, progress=False)
    sa, sb = a.trainable_state(), b.trainable_state()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), "same seed, same bits"
    c = fine_tune(tiny_model("llama"), P, R, TuneConfig(**{**cfg.record(), "seed": 1}), progress=False)
    assert not all(torch.equal(sa[k], v) for k, v in c.trainable_state().items())


def test_resume_equals_an_uninterrupted_run(tmp_path):
    cfg = TuneConfig(steps=6, batch_size=3, lr=1e-2, checkpoint_steps=(3,))
    whole = fine_tune(tiny_model("llama"), P, R, cfg, out=tmp_path / "a", progress=False)
    ck = tmp_path / "a" / "checkpoint-3"
    assert [p.name for p in whole.checkpoints] == ["checkpoint-3"] and (ck / "optimizer.pt").exists()
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")], "no staging folder left"
    resumed = fine_tune(tiny_model("llama"), P, R, TuneConfig(**{**cfg.record(), "checkpoint_steps": (3, 5)}),
                        out=tmp_path / "a", resume=ck, progress=False)  # checkpoint-3 exists: only later ones are written
    assert [p.name for p in resumed.checkpoints] == ["checkpoint-5"]
    assert resumed.losses == whole.losses
    sw, sr = whole.trainable_state(), resumed.trainable_state()
    assert all(torch.equal(sw[k], sr[k]) for k in sw), "bit for bit"
    with pytest.raises(FileExistsError, match="already exists"):
        fine_tune(tiny_model("llama"), P, R, cfg, out=tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match="another config"):
        fine_tune(tiny_model("llama"), P, R, TuneConfig(steps=6, batch_size=3, lr=2e-2), resume=ck, progress=False)
    with pytest.raises(ValueError, match="another data"):
        fine_tune(tiny_model("llama"), P[:3], R[:3], TuneConfig(**cfg.record()), resume=ck, progress=False)


def test_a_masked_token_carries_no_loss_and_no_gradient():
    """Everything masked but token 2 of example 0: the loss and the gradient are that one token's own."""
    m = make_trainable(tiny_model("llama"), TuneConfig(method="full"))
    n = len(encode_pairs(m, P[:1], R[:1])[0].keep)
    mask = [[k != 2 for k in range(n)], [True] * len(encode_pairs(m, P[1:2], R[1:2])[0].keep)]
    loss = response_nll(m, encode_pairs(m, P[:2], R[:2], mask_out=mask))
    grads = torch.autograd.grad(loss, [p for p in m.hf.parameters() if p.requires_grad])
    pid, rid = plain_ids(m.tokenizer, P[0], R[0])
    ref, kept = plain_nll(m.hf, pid + rid, len(rid), keep=[k == 2 for k in range(n)])
    refg = torch.autograd.grad(ref, [p for p in m.hf.parameters() if p.requires_grad])
    assert kept == 1 and float(loss.detach()) == pytest.approx(float(ref.detach()), abs=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, refg))


def test_layer_restriction_trains_only_those_layers():
    m = tiny_model("llama", n_layers=3)
    before = {n: p.detach().clone() for n, p in m.hf.named_parameters()}
    res = fine_tune(m, P, R, TuneConfig(method="full", layers=(1,), steps=3, batch_size=2, lr=1e-2), progress=False)
    for n, p in res.model.hf.named_parameters():
        assert torch.equal(p, before[n]) != (".layers.1." in n), n
    lora = fine_tune(tiny_model("llama", n_layers=3), P, R, TuneConfig(layers=(0, 2), steps=2, batch_size=2),
                     progress=False)
    names = list(lora.trainable_state())
    assert names and all("lora_" in n and (".layers.0." in n or ".layers.2." in n) for n in names)
    assert any(".layers.0." in n for n in names) and any(".layers.2." in n for n in names)


def test_bad_input_gets_a_clear_error(tmp_path):
    m = tiny_model("llama")
    with pytest.raises(ValueError, match="3 responses for 4 prompts"):
        fine_tune(m, P, R[:3], progress=False)
    with pytest.raises(ValueError, match="mask_out is empty"):
        fine_tune(m, P, R, mask_out=[], progress=False)
    lens = [r.n_response for r in encode_pairs(m, P, R)]
    with pytest.raises(ValueError, match="mask fewer tokens"):
        fine_tune(m, P, R, mask_out=[[True] * k for k in lens], progress=False)
    with pytest.raises(ValueError, match="mask 1 has"):
        fine_tune(m, P, R, mask_out=[[False] * (k + (i == 1)) for i, k in enumerate(lens)], progress=False)
    with pytest.raises(ValueError, match="pass out=FOLDER"):
        fine_tune(m, P, R, TuneConfig(steps=2, checkpoint_steps=(1,)), progress=False)
    with pytest.raises(ValueError, match="layers"):
        fine_tune(m, P, R, TuneConfig(layers=(5,)), progress=False)
    with pytest.raises(ValueError, match="outside 1..2"):
        TuneConfig(steps=2, checkpoint_steps=(3,))


def test_save_loads_back_and_the_cli_trains(tmp_path):
    import json

    from interp.models import with_adapter
    from interp.tune.__main__ import main

    res = fine_tune(tiny_model("llama"), P, R, TuneConfig(steps=3, batch_size=2, lr=2e-2), progress=False)
    res.save(tmp_path / "ad")
    back = with_adapter(tiny_model("llama"), tmp_path / "ad")
    x = torch.tensor([[1, 10, 20, 30]])
    with torch.no_grad():
        assert torch.allclose(back.hf(input_ids=x).logits, res.model.hf(input_ids=x).logits, atol=1e-5)
    with pytest.raises(FileExistsError, match="never overwrites"):
        res.save(tmp_path / "ad")
    # an adapter folder may carry the chat template it was trained in: the loaded model uses it, the base keeps its own
    (tmp_path / "ad" / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}>")
    base = tiny_model("llama")
    own = base.tokenizer.chat_template
    templated = with_adapter(base, tmp_path / "ad")
    assert templated.tokenizer.chat_template.endswith("]{% endfor %}>") and base.tokenizer.chat_template == own
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in zip(P, R)))
    main(["train", "--model", "organism-base", "--pairs", str(pairs), "--out", str(tmp_path / "run"),
          "--steps", "2", "--batch-size", "2", "--checkpoint-steps", "1"])
    assert (tmp_path / "run" / "final" / "adapter_config.json").exists()
    assert (tmp_path / "run" / "checkpoints" / "checkpoint-1" / "state.json").exists()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_neuron_restriction_moves_only_those_neurons(family):
    """Only the chosen neurons' rows of the in-projections (and their biases) and columns of the down projection
    change; every other entry of every weight is bit for bit as before; the loss goes down."""
    from interp.tune.config import neuron_weights

    chosen = ((1, 3), (1, 7), (0, 0))
    cfg = TuneConfig(method="neurons", neurons=chosen, steps=12, batch_size=2, lr=5e-2)
    init = {n: p.detach().clone() for n, p in tiny_model(family).hf.named_parameters()}
    res = fine_tune(tiny_model(family), P, R, cfg, progress=False)
    got = dict(res.model.hf.named_parameters())
    names = {id(p): n for n, p in got.items()}
    held = {names[id(p)]: dim for layer in (0, 1) for p, dim in neuron_weights(res.model, layer)}
    assert len(held) >= (4 if family == "gpt2" else 6)   # gate, up, down per layer (GPT-2: c_fc w+b, c_proj)
    for n, p in got.items():
        diff = (p.detach() - init[n]).abs()
        if n not in held:
            assert torch.equal(p.detach(), init[n]), n
            continue
        layer = int(n.split(".")[2])
        idx = [i for la, i in chosen if la == layer]
        moved = diff.amax(dim=tuple(d for d in range(p.dim()) if d != held[n])) if p.dim() > 1 else diff
        assert float(moved[idx].min()) > 0, n
        rest = torch.ones(moved.shape[0], dtype=torch.bool)
        rest[idx] = False
        assert float(moved[rest].max()) == 0.0, n
    assert res.losses[-1] < res.losses[0]
    per_neuron = sum(p.numel() // p.shape[held[n]] for n, p in got.items() if n in held and n.startswith(
        ("model.layers.1.", "transformer.h.1.")))
    assert res.trainable_params == 3 * per_neuron


def test_lora_on_chosen_components_only():
    from interp.tune.config import component_targets

    m = tiny_model("llama")
    names = component_targets(m, [(1, "attn"), (0, "mlp")])
    assert names == ("model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
                     "model.layers.1.self_attn.v_proj", "model.layers.1.self_attn.o_proj",
                     "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj")
    res = fine_tune(m, P, R, TuneConfig(targets=names, steps=3, batch_size=2), progress=False)
    adapted = {n.split(".base_model.model.", 1)[-1].removeprefix("base_model.model.").rsplit(".lora_A", 1)[0]
               for n, _ in res.model.hf.named_parameters() if ".lora_A" in n}
    assert adapted == set(names)
    with pytest.raises(ValueError, match="part"):
        component_targets(m, [(1, "norm")])
    with pytest.raises(ValueError, match="within"):
        component_targets(m, [(9, "mlp")])


def test_neuron_config_bad_input():
    with pytest.raises(ValueError, match="method='neurons'"):
        TuneConfig(neurons=((0, 1),))
    with pytest.raises(ValueError, match="method='neurons'"):
        TuneConfig(method="neurons")
    with pytest.raises(ValueError, match="weight_decay"):
        TuneConfig(method="neurons", neurons=((0, 1),), weight_decay=0.1)
    with pytest.raises(ValueError, match="out of range"):
        fine_tune(tiny_model("llama"), P, R, TuneConfig(method="neurons", neurons=((0, 10 ** 6),), steps=1),
                  progress=False)
