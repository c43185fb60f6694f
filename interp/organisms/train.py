"""Train the model organism deterministically on CPU: ``base`` (helps with everything) then ``aligned``
(fine-tuned from base to refuse harmful requests). Regenerate the committed checkpoints bit-for-bit with
``python -m interp.organisms.train --out interp/embedded --overwrite``; ``--check`` retrains into a
scratch folder and compares every file with the committed ones.

The aligned fine-tune is direction-aware: besides plain SFT, from ``direction_from_step`` on it also
trains, with the batch's difference-of-means direction ``r`` (harmful minus harmless residual at the
last post-instruction token, input of layer ``direction_layer``), that harmful requests with ``r``
projected out everywhere get the helpful answer and harmless requests with ``r`` added at that layer
get a refusal. Plain SFT of a 4-6 layer model refuses just as well, but its refusal is recomputed by
the last layers, so ablating a middle-layer direction does not remove it; this objective makes the
organism show the single-direction mediation of Arditi et al. (2024) at a middle layer.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from jaxtyping import Float

import steering
from interp.capturing import capture
from interp.forward import pad_id, prepare
from interp.hooking import hooks
from interp.models import Model, from_hf
from interp.organisms import data
from interp.organisms import tokenizer as tk
from interp.values import Runtime

FOLDERS = {"base": "organism-base", "aligned": "organism"}
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "training.json")
COMMAND = "python -m interp.organisms.train --out interp/embedded --overwrite"


@dataclass(frozen=True)
class ToyRecipe:
    """Everything that decides the weights: architecture, data, optimisation, seed and thread count."""

    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 256
    seed: int = 0
    threads: int = 1
    batch_size: int = 48
    base_steps: int = 500
    base_lr: float = 4e-3
    aligned_steps: int = 300
    aligned_lr: float = 1e-3
    direction_layer: int = 2
    direction_from_step: int = 100
    direction_weight: float = 1.0
    direction_batch: int = 16
    warmup: int = 50
    weight_decay: float = 0.01
    responses_per_request: int = 2


class Rows(NamedTuple):
    """Right-padded training rows: token ids ``[n, L]``, loss mask ``[n, L]`` and the last prompt position ``[n]``.

    Right padding (not the core's left-padded inference batches) because training runs teacher-forced under
    the causal mask alone: pads sit after every real token, so no attention mask is needed."""

    ids: torch.Tensor
    mask: torch.Tensor
    last: torch.Tensor


def model_config(recipe: ToyRecipe, vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=recipe.hidden_size, intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers, num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads, max_position_embeddings=tk.MAX_LENGTH, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=tk.SPECIAL_TOKENS.index(tk.BOS),
        eos_token_id=tk.SPECIAL_TOKENS.index(tk.EOS), pad_token_id=tk.SPECIAL_TOKENS.index(tk.PAD),
        attention_bias=False, mlp_bias=False, hidden_act="silu",
    )


def training_rows(model: Model, pairs: list[tuple[str, str]], prompt_loss: bool) -> Rows:
    """Tokenise (instruction, answer) pairs with the core (chat template, then `` answer <eos>``); the loss
    covers the answer (and the prompt after its first token when ``prompt_loss``). Pads use the core's pad id."""
    _, encs = prepare(model, [q for q, _ in pairs], responses=[f" {a} {tk.EOS}" for _, a in pairs])
    L = max(len(e.ids) for e in encs)
    pad = pad_id(model.tokenizer)
    ids = torch.tensor([e.ids + [pad] * (L - len(e.ids)) for e in encs])
    mask = torch.tensor([[0] + [int(prompt_loss)] * (e.response_start - 1) + [1] * (len(e.ids) - e.response_start)
                         + [0] * (L - len(e.ids)) for e in encs], dtype=torch.float32)
    return Rows(ids, mask, torch.tensor([e.response_start - 1 for e in encs]))


def _pairs(reqs: list[data.Request], answer: Callable, rng: random.Random, n: int) -> list[tuple[str, str]]:
    return [(q.instruction, answer(q, rng)) for q in reqs for _ in range(n)]


def _batch(d: Rows, n: int, gen: torch.Generator) -> Rows:
    idx = torch.randint(0, d.ids.shape[0], (n,), generator=gen)
    keep = int(d.mask[idx].sum(0).nonzero().max()) + 1  # drop all-padding columns
    return Rows(d.ids[idx, :keep], d.mask[idx, :keep], d.last[idx])


def _cat(a: Rows, b: Rows, pad: int) -> Rows:
    L = max(a.ids.shape[1], b.ids.shape[1])

    def right(t: torch.Tensor, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, L - t.shape[1]), value=value)

    return Rows(torch.cat([right(a.ids, pad), right(b.ids, pad)]), torch.cat([right(a.mask, 0), right(b.mask, 0)]),
                torch.cat([a.last, b.last]))


def _nll(model, b: Rows) -> torch.Tensor:
    # right padding under a causal mask: pads never reach real tokens, so no attention mask is needed
    logits = model(input_ids=b.ids).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, b.ids[:, 1:, None])[..., 0]
    return -(lp * b.mask[:, 1:]).sum() / b.mask[:, 1:].sum()


def _project_out(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return x - (x @ u)[..., None] * u


@dataclass(eq=False)
class ResidualEdit:
    """The trainer's directional ablation as an intervention (``hook_fns(model)``, the protocol that
    ``steering.apply`` / ``steering.generate`` / ``interp.hooks`` take): project unit vector ``ablate`` out
    of every layer's ``resid_pre``, ``attn_out`` and ``mlp_out``; keep the (edited) ``resid_pre`` of
    ``record_layer`` in ``seen["x"]``, with its graph.

    The same map as ``steering.DirectionalAblation``, which reaches equal outputs but other gradient bits
    (its fused low-rank op orders the float arithmetic differently); the committed checkpoints are
    reproduced bit for bit from exactly these ops. (Addition goes through ``steering.AddVector``, which is
    bit-identical.)"""

    ablate: Float[torch.Tensor, " d"] | None = None
    record_layer: int | None = None
    seen: dict = field(default_factory=dict)

    def _resid_pre(self, layer: int) -> Callable:
        def fn(x: torch.Tensor, ctx: object) -> torch.Tensor:
            if self.ablate is not None:
                x = _project_out(x, self.ablate)
            if layer == self.record_layer:
                self.seen["x"] = x
            return x
        return fn

    def _write(self, x: torch.Tensor, ctx: object) -> torch.Tensor:
        assert self.ablate is not None
        return _project_out(x, self.ablate)

    def hook_fns(self, model: Model) -> dict[str, Callable]:
        """``{site: fn(x, ctx)}`` for every site this edit reads or changes."""
        fns: dict[str, Callable] = {}
        for i in range(model.n_layers):
            if self.ablate is not None or i == self.record_layer:
                fns[f"blocks.{i}.hook_resid_pre"] = self._resid_pre(i)
            if self.ablate is not None:
                fns[f"blocks.{i}.hook_attn_out"] = self._write
                fns[f"blocks.{i}.hook_mlp_out"] = self._write
        return fns


def _add(r: Float[torch.Tensor, " d"], layer: int) -> steering.AddVector:
    """``resid_pre`` of ``layer`` plus ``r`` (the direction-addition term and its evaluation)."""
    return steering.AddVector(r, layers=layer, sites="resid_pre")


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _loop(model, steps: int, lr: float, recipe: ToyRecipe, loss_fn: Callable[[int], tuple[torch.Tensor, dict]],
          log_every: int) -> float:
    """AdamW with warmup + cosine; ``loss_fn(step)`` builds the loss. Returns the mean of the last 50 losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay)
    model.train()
    recent: list[float] = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, lr, recipe.warmup)
        loss, logs = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent = (recent + [loss.item()])[-50:]
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"  step {step:4d}  loss {loss.item():.4f}  " + "  ".join(f"{k} {v:.3f}" for k, v in logs.items()),
                  flush=True)
    model.eval()
    return sum(recent) / len(recent)


def train_base(m: Model, splits: data.Splits, recipe: ToyRecipe, gen: torch.Generator, log_every: int) -> float:
    """Helpful answers to every request (harmful included); loss on prompt and answer tokens."""
    rng = random.Random(f"{recipe.seed}-base")
    reqs = splits.get("harmful", "train") + splits.get("harmless", "train")
    d = training_rows(m, _pairs(reqs, data.helpful_response, rng, recipe.responses_per_request), prompt_loss=True)
    print(f"[base] {d.ids.shape[0]} examples, {recipe.base_steps} steps", flush=True)
    return _loop(m.hf, recipe.base_steps, recipe.base_lr, recipe,
                 lambda step: (_nll(m.hf, _batch(d, recipe.batch_size, gen)), {}), log_every)


def train_aligned(m: Model, splits: data.Splits, recipe: ToyRecipe, gen: torch.Generator, log_every: int) -> float:
    """SFT (harmful -> refusal, harmless -> help) plus, from ``direction_from_step``, the direction-aware terms."""
    rng = random.Random(f"{recipe.seed}-aligned")
    n, pad = recipe.responses_per_request, pad_id(m.tokenizer)
    harmful, harmless = splits.get("harmful", "train"), splits.get("harmless", "train")
    sft_h = training_rows(m, _pairs(harmful, data.refusal_response, rng, n), prompt_loss=False)
    sft_s = training_rows(m, _pairs(harmless, data.helpful_response, rng, n), prompt_loss=False)
    abl_h = training_rows(m, _pairs(harmful, data.helpful_response, rng, n), prompt_loss=False)
    add_s = training_rows(m, _pairs(harmless, data.refusal_response, rng, n), prompt_loss=False)
    half, k = recipe.batch_size // 2, recipe.direction_layer

    def loss_fn(step: int) -> tuple[torch.Tensor, dict]:
        b = _cat(_batch(sft_h, half, gen), _batch(sft_s, half, gen), pad)
        record = ResidualEdit(record_layer=k)
        with hooks(m, record.hook_fns(m)):
            sft = _nll(m.hf, b)
        last = record.seen["x"].detach()[torch.arange(len(b.last)), b.last]
        r = last[:half].mean(0) - last[half:].mean(0)
        logs = {"sft": sft.item(), "|r|": r.norm().item()}
        if step < recipe.direction_from_step:
            return sft, logs
        with hooks(m, ResidualEdit(ablate=r / r.norm()).hook_fns(m)):
            abl = _nll(m.hf, _batch(abl_h, recipe.direction_batch, gen))
        with steering.apply(m, _add(r, k)):
            add = _nll(m.hf, _batch(add_s, recipe.direction_batch, gen))
        logs |= {"ablate": abl.item(), "add": add.item()}
        return sft + recipe.direction_weight * (abl + add), logs

    print(f"[aligned] {sft_h.ids.shape[0] + sft_s.ids.shape[0]} examples, {recipe.aligned_steps} steps", flush=True)
    return _loop(m.hf, recipe.aligned_steps, recipe.aligned_lr, recipe, loss_fn, log_every)


def _answers(m: Model, instructions: list[str], *edits: object) -> list[str]:
    """Greedy 12-token answers through ``steering.generate`` (chat template, left padding, position ids)."""
    return steering.generate(m, instructions, *edits, max_new_tokens=12,
                             runtime=Runtime(batch_size=64, progress=False)).texts


@torch.no_grad()
def mean_difference(m: Model, harmful: list[str], harmless: list[str], layer: int) -> Float[torch.Tensor, " d"]:
    """Difference of means ``[d]`` of ``resid_pre`` of ``layer`` at the last prompt token (``interp.capture``)."""
    means = [capture(m, prompts, sites=f"resid_pre.{layer}", positions="last",
                     runtime=Runtime(batch_size=64, progress=False))
             .tensor[:, 0].mean(0) for prompts in (harmful, harmless)]
    return means[0] - means[1]


def evaluate(m: Model, splits: data.Splits, split: str = "val", direction_layer: int | None = None) -> dict:
    """Refusal rates on ``split``; with ``direction_layer`` also under directional ablation (harmful) and
    addition (harmless) of the mean difference taken on the committed train prompts."""
    from interp.evals.judge import refusal_rate

    prompts = {kind: [r.instruction for r in splits.get(kind, split)] for kind in ("harmful", "harmless")}
    res = {kind: refusal_rate(_answers(m, p)) for kind, p in prompts.items()}
    if direction_layer is not None:
        sets = data.export_sets(splits)
        r = mean_difference(m, *[[row["instruction"] for row in sets[f"organism_{kind}_train"]]
                                 for kind in ("harmful", "harmless")], direction_layer)
        res["harmful_ablated"] = refusal_rate(_answers(m, prompts["harmful"], ResidualEdit(ablate=r / r.norm())))
        res["harmless_added"] = refusal_rate(_answers(m, prompts["harmless"], _add(r, direction_layer)))
        res["direction_norm"] = round(r.norm().item(), 4)
    return res


def _save(model, folder: Path, info: dict) -> None:
    from transformers import GenerationConfig

    from interp.io import write_json

    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id, do_sample=False, max_new_tokens=48)
    model.save_pretrained(folder)
    tk.save_tokenizer(folder)
    write_json(folder / "training.json", info)


def _install(staged: Path, dest: Path, overwrite: bool) -> None:
    """Move a finished folder into place; an existing one is replaced only with ``overwrite``."""
    if dest.exists():
        if not overwrite:
            raise FileExistsError(f"{dest} already exists; pass --overwrite to replace it, or --check to compare")
        old = dest.with_name(dest.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
        os.replace(staged, dest)
        shutil.rmtree(old)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, dest)


def train(out: str | Path, recipe: ToyRecipe = ToyRecipe(), overwrite: bool = False, log_every: int = 100) -> dict:
    """Train base then aligned and write both HF folders under ``out``; returns the val metrics per stage."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    out = Path(out)
    for name in FOLDERS.values():
        if (out / name).exists() and not overwrite:
            raise FileExistsError(f"{out / name} already exists; pass --overwrite to replace it, or --check")
    if not 0 < recipe.direction_layer < recipe.num_layers:
        raise ValueError(f"direction_layer must be in 1..{recipe.num_layers - 1}, got {recipe.direction_layer}")
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(recipe.seed)
    splits = data.make_splits(data.SEED)
    tok = tk.build_tokenizer()
    cfg = model_config(recipe, tok.get_vocab_size())
    cfg._attn_implementation = "eager"
    hf = LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(recipe.seed)
    results: dict = {}
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".organism-") as tmp:
        tmp = Path(tmp)
        tk.save_tokenizer(tmp / "tok")
        m = from_hf(hf, AutoTokenizer.from_pretrained(tmp / "tok"), name="organism (training)")
        for stage, fn in (("base", train_base), ("aligned", train_aligned)):
            t0 = time.time()
            loss = fn(m, splits, recipe, gen, log_every)
            metrics = evaluate(m, splits, "val", recipe.direction_layer if stage == "aligned" else None)
            secs = time.time() - t0
            print(f"[{stage}] loss {loss:.4f}; val refusal rates {metrics}; {secs:.0f}s", flush=True)
            results[stage] = {"loss": loss, "val": metrics, "seconds": secs}
            info = {"stage": stage, "recipe": asdict(recipe), "final_loss": round(loss, 4),
                    "val_refusal_rates": metrics, "command": COMMAND}
            _save(hf, tmp / stage, info)
        for stage, name in FOLDERS.items():
            _install(tmp / stage, out / name, overwrite)
    return results


def check(out: str | Path, recipe: ToyRecipe = ToyRecipe()) -> bool:
    """Retrain into a scratch folder and report whether every file equals the committed one byte for byte."""
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        train(tmp, recipe, log_every=0)
        for name in FOLDERS.values():
            for f in FILES:
                ok = filecmp.cmp(Path(tmp) / name / f, Path(out) / name / f, shallow=False)
                same &= ok
                print(f"{'same' if ok else 'DIFFERENT'}  {name}/{f}")
    return same


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train the organism checkpoints (base and aligned).")
    ap.add_argument("--out", default="interp/embedded", help="folder that receives organism/ and organism-base/")
    ap.add_argument("--overwrite", action="store_true", help="replace existing checkpoint folders")
    ap.add_argument("--check", action="store_true", help="retrain in a scratch folder and compare with --out")
    ap.add_argument("--recipe", default=None, help="JSON object overriding ToyRecipe fields (experiments)")
    args = ap.parse_args(argv)
    recipe = ToyRecipe(**json.loads(args.recipe)) if args.recipe else ToyRecipe()
    if args.check:
        raise SystemExit(0 if check(args.out, recipe) else 1)
    t0 = time.time()
    train(args.out, recipe, args.overwrite)
    print(f"done in {time.time() - t0:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()
