"""The ``interp`` command line: ``info``, ``capture``, ``refusal``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from interp import distributed
from interp.cli.patch import add_patch_parser
from interp.cli.probe import add_probe_parser
from interp.cli.refusal_job import add_refusal_parser
from interp.cli.sae_train import add_sae_parser
from interp.cli.steer import add_steer_parser
from interp.models import DEFAULT_MODEL
from interp.prompts import read_prompts
from interp.values import Prompts, Runtime


def cmd_info(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from interp.chat import has_chat_template
    from interp.models import load_model

    m = load_model(args.model, dtype=args.dtype, device=args.device)
    con = Console()
    t = Table(title=f"{m.name}", show_header=False)
    rows = [("family", m.spec.family), ("class", type(m.hf).__name__), ("layers", m.n_layers), ("d_model", m.d_model),
            ("heads", f"{m.n_heads} (kv {m.n_kv_heads}, d_head {m.d_head})"), ("d_mlp", m.d_mlp),
            ("vocab", m.config.vocab_size), ("context", m.max_length), ("dtype", str(m.dtype)), ("device", str(m.device)),
            ("mixture of experts", "yes" if m.spec.is_moe else "no"), ("parallel residual", m.spec.parallel_residual),
            ("norms after sublayers", m.spec.post_sublayer_norms),
            ("chat template", "yes" if has_chat_template(m) else "no (plain fallback)"),
            ("parameters", f"{sum(p.numel() for p in m.hf.parameters()):,}")]
    for k, v in rows:
        t.add_row(k, str(v))
    con.print(t)
    sites = m.site_names()
    per_layer = sorted({s.split(".", 2)[2] for s in sites if s.startswith("blocks.")})
    con.print(f"sites: blocks.{{0..{m.n_layers - 1}}}.{{{', '.join(per_layer)}}}, ln_final.hook_normalized")
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from interp.capturing import capture
    from interp.models import load_model

    prompts = read_prompts(args.prompts, args.column)
    m = load_model(args.model, dtype=args.dtype, device=args.device)
    positions: Any = args.positions
    if positions.lstrip("-").replace(",", "").replace("-", "").isdigit():
        positions = [int(x) for x in positions.split(",")]
    store = capture(m, Prompts(prompts, chat=not args.raw), sites=args.sites.split(","), positions=positions,
                    out=args.out, overwrite=args.overwrite,
                    runtime=Runtime(batch_size=args.batch_size, sort_by_length=args.sort_by_length))
    if not distributed.is_main():
        return 0  # rank 0 prints the summary
    con = Console()
    t = Table(title=f"{store.n_prompts} prompts -> {args.out} ({store.n_shards} shards)")
    for c in ("site", "mean norm", "std of norm", "max norm"):
        t.add_column(c, justify="right" if c != "site" else "left")
    sums = torch.zeros(len(store.sites), 3, dtype=torch.float64)
    count = 0
    for shard in store.iter_shards():
        x = shard.tensor.float()
        norms = x.norm(dim=-1)  # [b, S, (P)]
        if shard.mask is not None:
            norms = torch.stack([norms[:, s][shard.mask] for s in range(len(store.sites))])  # [S, real tokens]
        else:
            norms = norms.T
        sums[:, 0] += norms.sum(1).double()
        sums[:, 1] += (norms.double() ** 2).sum(1)
        sums[:, 2] = torch.maximum(sums[:, 2], norms.max(1).values.double())
        count += norms.shape[1]
    mean = sums[:, 0] / count
    std = (sums[:, 1] / count - mean ** 2).clamp(min=0).sqrt()
    for i, s in enumerate(store.sites):
        t.add_row(s, f"{mean[i]:.3f}", f"{std[i]:.3f}", f"{sums[i, 2]:.3f}")
    con.print(t)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="interp", description="Mechanistic interpretability toolkit for alignment research.")
    sub = ap.add_subparsers(dest="command", required=True)

    def model_args(p: argparse.ArgumentParser, default: str = DEFAULT_MODEL) -> None:
        p.add_argument("--model", default=default,
                       help=f"embedded name, HF folder, .gguf file or hub id (default: {default})")
        p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 or auto (default: float32)")
        p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cpu, where the weights load)")

    p = sub.add_parser("info", help="architecture, layers, width and sites of a model")
    model_args(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("capture", help="capture activations into an on-disk store and summarise norms per layer")
    model_args(p)
    p.add_argument("--prompts", required=True, help="CSV, JSON, JSONL or text file of prompts")
    p.add_argument("--column", default=None, help="column/key holding the prompt (CSV/JSON/JSONL)")
    p.add_argument("--sites", default="resid_post", help="comma-separated sites; a kind alone means every layer")
    p.add_argument("--positions", default="last",
                   help="last, post_instruction, all, prompt_mean, or comma-separated ints (e.g. -2,-1)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--raw", action="store_true", help="do not wrap prompts in the chat template")
    p.add_argument("--out", required=True, help="output store folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at --out")
    p.add_argument("--sort-by-length", action="store_true",
                   help="batch prompts longest first (less padding, faster on mixed lengths; the store records the "
                        "row order)")
    p.set_defaults(func=cmd_capture)

    for add in SUBCOMMANDS:
        add(sub, model_args)
    return ap


SUBCOMMANDS = (add_refusal_parser, add_probe_parser, add_steer_parser, add_sae_parser, add_patch_parser)  # every further subcommand registers here: a plain table, no optional imports


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. Launched by torchrun, the data-parallel ones (:data:`DATA_PARALLEL`) join the process
    group torchrun describes (gloo on CPU, NCCL for CUDA); the others refuse to run once per process."""
    args = build_parser().parse_args(argv)
    try:
        with _process_group(args):
            return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


@contextmanager
def _process_group(args: argparse.Namespace) -> Iterator[None]:
    """The process group of a torchrun launch for the duration of a data-parallel command (none otherwise)."""
    if not distributed.launched() or int(os.environ["WORLD_SIZE"]) < 2:
        yield
        return
    name = args.command + (f" {args.sae_command}" if getattr(args, "sae_command", None) else "")
    if name not in DATA_PARALLEL:
        raise ValueError(f"`interp {name}` does not run data-parallel; launch it without torchrun (data-parallel "
                         f"commands: {', '.join(DATA_PARALLEL)})")
    if getattr(args, "device", None) is not None:
        args.device = distributed.device_for(args.device)
    distributed.init_from_env(getattr(args, "device", None))
    try:
        yield
    finally:
        distributed.shutdown()


DATA_PARALLEL = ("capture", "sae train")  # commands that split their work over torchrun's processes


if __name__ == "__main__":
    sys.exit(main())
