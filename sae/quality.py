"""SAE quality: L0, fraction of variance unexplained, dead/dense latents, cross-entropy loss recovered.

Transcoders: ``evaluate(tc, mlp_in, target=mlp_out)`` and :mod:`sae.transcoder_quality`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from interp.bundle import Result
from interp.chat import Batch
from interp.evals.logits import cross_entropy
from interp.forward import Inputs, batches, forward
from interp.sites import parse_site
from interp.values import moved_keywords
from sae.model import SAE
from sae.runner import MOVED, sae_encodings

if TYPE_CHECKING:
    import pandas as pd


def l0(z: Float[torch.Tensor, "... d_sae"]) -> float:
    """Mean number of active latents per token."""
    return float((z > 0).float().sum(-1).mean())


def fvu(x: Float[torch.Tensor, "n d"], x_hat: Float[torch.Tensor, "n d"]) -> float:
    """Fraction of variance unexplained: ``sum ||x - x_hat||^2 / sum ||x - mean(x)||^2``."""
    x, x_hat = x.reshape(-1, x.shape[-1]).double(), x_hat.reshape(-1, x_hat.shape[-1]).double()
    return float((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum().clamp_min(1e-30))


@dataclass
class SAEMetrics(Result):
    """Reconstruction and sparsity of an SAE on a set of tokens. ``frequency``: ``[d_sae]`` firing rate."""

    l0: float
    fvu: float
    mse: float
    dead_fraction: float
    dense_fraction: float
    frequency: torch.Tensor
    n_tokens: int
    dense_threshold: float = 0.1

    def to_frame(self) -> pd.DataFrame:
        """One row per latent: ``latent``, ``frequency`` (share of tokens it fires on), ``dead`` (never fires)
        and ``dense`` (fires on more than ``dense_threshold``); the scalar metrics are in :meth:`summary`."""
        import pandas as pd

        f = self.frequency.tolist()
        return pd.DataFrame({"latent": range(len(f)), "frequency": f, "dead": [v == 0 for v in f],
                             "dense": [v > self.dense_threshold for v in f]})

    def summary(self) -> dict[str, Any]:
        """The scalar metrics: L0, FVU, MSE, dead and dense fractions, token count."""
        return {"l0": self.l0, "fvu": self.fvu, "mse": self.mse, "dead_fraction": self.dead_fraction,
                "dense_fraction": self.dense_fraction, "n_tokens": self.n_tokens}

    def plot(self, title: str = "SAE metrics") -> Any:
        """Firing-frequency histogram, bars of FVU / dead / dense fractions, and a bar of L0."""
        from interp.viz.sae import metrics_summary

        return metrics_summary(self.frequency, {"FVU": self.fvu, "dead": self.dead_fraction,
                                                "dense": self.dense_fraction}, {"L0": self.l0},
                               title=f"{title} on {self.n_tokens} tokens")


@torch.no_grad()
def evaluate(sae: SAE, x: Float[torch.Tensor, "n d"] | Any, batch_size: int = 4096, dense_threshold: float = 0.1,
             site: str | None = None, target: Float[torch.Tensor, "n d"] | None = None) -> SAEMetrics:
    """L0, FVU, MSE and dead (never fire) / dense (fire on more than ``dense_threshold`` of tokens) fractions.

    ``x``: a tensor ``[..., d]`` or ``Activations`` (``site`` picks one; real tokens only). ``target``: what the
    output should be (default ``x``; a transcoder's MLP output ``[..., d]``, same tokens): FVU and MSE are of it."""
    if not isinstance(x, torch.Tensor):
        x = x.flat_tokens(site or (sae.site if sae.site in x.sites else x.sites[0]))
    x = x.reshape(-1, x.shape[-1])
    y = x if target is None else target.reshape(-1, target.shape[-1])
    sae._check_width(x)
    n = x.shape[0]
    if n == 0 or y.shape != x.shape:
        raise ValueError("no tokens to evaluate" if n == 0 else
                         f"target {tuple(target.shape)} does not match the inputs {tuple(x.shape)}: one row per token")
    counts = torch.zeros(sae.d_sae, dtype=torch.float64)
    sq_err = 0.0
    active = 0.0
    mean = y.double().mean(0)
    var = float((y.double() - mean).pow(2).sum())
    for a in range(0, n, batch_size):
        xb = x[a:a + batch_size].to(sae.device, sae.dtype)
        z = sae.encode(xb)
        on = z > 0
        counts += on.sum(0).double().cpu()
        active += float(on.sum())
        out = sae.decode(z, xb) if getattr(sae, "W_skip", None) is not None else sae.decode(z)
        sq_err += float((out - y[a:a + batch_size].to(out)).double().pow(2).sum())
    freq = (counts / n).float()
    return SAEMetrics(l0=active / n, fvu=sq_err / max(var, 1e-30), mse=sq_err / n,
                      dead_fraction=float((freq == 0).float().mean()),
                      dense_fraction=float((freq > dense_threshold).float().mean()), frequency=freq, n_tokens=n,
                      dense_threshold=dense_threshold)


@dataclass
class CELossRecovered(Result):
    """Mean next-token cross-entropy (nats) with the site clean, spliced with the SAE, zero- and mean-
    ablated; ``recovered_*`` = ``(CE_ablated - CE_sae) / (CE_ablated - CE_clean)`` (1 = perfect)."""

    clean: float
    sae: float
    zero_ablated: float
    mean_ablated: float
    recovered_zero: float
    recovered_mean: float
    n_predictions: int

    def to_frame(self) -> pd.DataFrame:
        """One row per condition (``clean``, ``sae``, ``zero_ablated``, ``mean_ablated``): ``condition``,
        ``ce`` (nats) and ``recovered`` (the ablations' loss recovered by the SAE; empty for clean and sae)."""
        import pandas as pd

        return pd.DataFrame({"condition": ["clean", "sae", "zero_ablated", "mean_ablated"],
                             "ce": [self.clean, self.sae, self.zero_ablated, self.mean_ablated],
                             "recovered": [float("nan"), float("nan"), self.recovered_zero, self.recovered_mean]})

    def plot(self, title: str = "cross-entropy with the SAE spliced in") -> Any:
        """Bars of CE per condition, the recovered fractions in the title."""
        from interp.viz.sae import ce_loss_bars

        return ce_loss_bars(["clean", "sae", "zero-ablated", "mean-ablated"],
                            [self.clean, self.sae, self.zero_ablated, self.mean_ablated],
                            {"vs zero": self.recovered_zero, "vs mean": self.recovered_mean}, title=title)


def predicted(batch: Batch) -> torch.Tensor:
    """``[B, T]`` bool: the real tokens that follow a real token (the next-token predictions to count)."""
    m = batch.attention_mask.bool()
    out = m.clone()
    out[:, 0] = False
    out[:, 1:] &= m[:, :-1]
    return out


@moved_keywords(MOVED)
@torch.no_grad()
def ce_loss_recovered(model: Any, sae: SAE, inputs: Inputs, site: str | None = None,
                      batch_size: int = 8) -> CELossRecovered:
    """Splice ``sae`` into ``model`` at its site (``interp.hooks``) and compare next-token loss on ``inputs``
    (prompts, :func:`sae.runner.sae_encodings`, or token ids ``[n, T]``) against the clean model and zero-/mean-ablation of the site."""
    from sae.edits import SAESplice, check_site

    site = check_site(sae, model, site)
    return ce_recovered(model, inputs, SAESplice(sae, site=site).hook_fns(model), [site], batch_size)


@torch.no_grad()
def ce_recovered(model: Any, inputs: Inputs, splice: dict[str, Any], sites: list[str],
                 batch_size: int = 8) -> CELossRecovered:
    """Next-token loss on ``inputs`` with the ``splice`` hooks (``{site: fn(x, ctx)}``) against the clean model and
    against every one of ``sites`` zero- / mean-ablated at once (the means over real tokens of the clean run)."""
    sites = [parse_site(s, model.n_layers).name for s in sites]
    bs = batches(model, sae_encodings(model, inputs), batch_size)
    acc: dict[str, dict[str, Any]] = {s: {"sum": None, "n": 0} for s in sites}
    cur: dict[str, Any] = {}

    def collect(x: torch.Tensor, ctx: Any) -> None:
        m, a = cur["mask"].to(x.device), acc[ctx.site.name]
        s = x[m].double().sum(0)
        a["sum"] = s if a["sum"] is None else a["sum"] + s
        a["n"] += int(m.sum())

    def ce(b: Batch, fns: Any) -> tuple[float, int]:
        return cross_entropy(forward(model, b, fns), b.input_ids, predicted(b))

    tot = {"clean": 0.0, "sae": 0.0, "zero": 0.0, "mean": 0.0}
    n_pred = 0
    for b in bs:
        cur["mask"] = b.attention_mask.bool()
        total, n = ce(b, {s: collect for s in sites})
        tot["clean"] += total
        n_pred += n
    if n_pred == 0:
        raise ValueError("no next-token predictions: give prompts of at least two tokens")
    means = {s: (a["sum"] / max(a["n"], 1)).float() for s, a in acc.items()}
    zero = {s: (lambda x, ctx: torch.zeros_like(x)) for s in sites}
    mean = {s: (lambda x, ctx: means[ctx.site.name].to(x).expand_as(x).clone()) for s in sites}
    for b in bs:
        tot["sae"] += ce(b, splice)[0]
        tot["zero"] += ce(b, zero)[0]
        tot["mean"] += ce(b, mean)[0]
    c = {k: v / n_pred for k, v in tot.items()}

    def rec(abl: float) -> float:
        gap = abl - c["clean"]
        return float("nan") if abs(gap) < 1e-12 else (abl - c["sae"]) / gap

    return CELossRecovered(clean=c["clean"], sae=c["sae"], zero_ablated=c["zero"], mean_ablated=c["mean"],
                           recovered_zero=rec(c["zero"]), recovered_mean=rec(c["mean"]), n_predictions=n_pred)
