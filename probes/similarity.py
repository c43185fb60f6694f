"""Representational similarity, vectorised over layers: dissimilarity matrices (RDMs) of activations, their rank or
linear correlation with a target RDM on the upper triangle, a Mantel permutation test, the noise ceiling of a target
judged by several raters, and leave-one-out distances of items to their category's prototype.

    D = rdm(X, "correlation")                 # X [L, n, d] -> D [L, n, n]
    test = mantel(D, target, n_perm=1000)     # .r [L], .p [L], .null [n_perm, L]
    lo, hi = noise_ceiling(ratings)           # ratings [n_raters, n, n]

Pure torch; the tests check every figure against scipy (``pdist``, ``spearmanr``, ``pearsonr``, ``kendalltau``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float

from interp.evals.metrics import average_ranks

METRICS = ("correlation", "cosine", "euclidean")
METHODS = ("spearman", "pearson", "kendall")


def _check_choice(value: str, allowed: Sequence[str], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; choose one of {list(allowed)}")


def rdm(X: Float[torch.Tensor, "... n d"], metric: str = "correlation") -> Float[torch.Tensor, "... n n"]:
    """Pairwise dissimilarities of the ``n`` rows of ``X`` (any leading axes, e.g. layers), float64, zero diagonal.

    ``correlation``: 1 - Pearson r of the two rows (each centred over its features); ``cosine``: 1 - cosine;
    ``euclidean``: the distance. A constant row (correlation) or zero row (cosine) has undefined
    dissimilarity: it is an error naming the rows."""
    _check_choice(metric, METRICS, "metric")
    X = torch.as_tensor(X).double()
    if X.dim() < 2:
        raise ValueError(f"rdm needs X [..., n, d], got shape {tuple(X.shape)}")
    if metric == "euclidean":
        G = X @ X.transpose(-1, -2)
        sq = G.diagonal(dim1=-2, dim2=-1)
        D = (sq[..., :, None] + sq[..., None, :] - 2 * G).clamp_min(0).sqrt()
    else:
        Z = X - X.mean(-1, keepdim=True) if metric == "correlation" else X
        norms = Z.norm(dim=-1, keepdim=True)
        if (norms == 0).any():
            bad = (norms[..., 0] == 0).nonzero()[:5].tolist()
            raise ValueError(f"{metric} dissimilarity is undefined for rows with zero {'variance' if metric == 'correlation' else 'norm'} "
                             f"(indices {bad}); use metric='euclidean' or drop those items")
        Z = Z / norms
        D = 1 - Z @ Z.transpose(-1, -2)
    D = (D + D.transpose(-1, -2)) / 2
    return D - torch.diag_embed(D.diagonal(dim1=-2, dim2=-1))


def upper(M: Float[torch.Tensor, "... n n"]) -> Float[torch.Tensor, "... m"]:
    """The strict upper triangle of square matrices, row by row (``m = n (n - 1) / 2``; scipy's ``squareform`` order)."""
    n = M.shape[-1]
    i, j = torch.triu_indices(n, n, 1)
    return M[..., i, j]


def check_target(target: Any, n: int, name: str = "target") -> torch.Tensor:
    """``target`` as float64 ``[n, n]`` (one matrix) or ``[n_raters, n, n]`` (repeated judgements), symmetric and
    finite; clear errors otherwise."""
    t = torch.as_tensor(target).double()
    if n < 3:
        raise ValueError(f"representational similarity needs at least 3 items (>= 3 pairs), got {n}")
    if t.dim() not in (2, 3) or t.shape[-2:] != (n, n):
        raise ValueError(f"{name} has shape {tuple(t.shape)} but there are {n} items: pass an [n, n] dissimilarity "
                         f"matrix (or [n_raters, n, n]) in the items' order")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} holds NaN or inf entries")
    asym = (t - t.transpose(-1, -2)).abs().max().item()
    if asym > 1e-8 * max(1.0, t.abs().max().item()):
        raise ValueError(f"{name} is not symmetric (max |T - T^T| = {asym:.3g}); a dissimilarity matrix is symmetric: "
                         f"symmetrise it with (T + T^T) / 2 if the asymmetry is noise")
    return t


def _standardise(v: torch.Tensor) -> torch.Tensor:
    v = v - v.mean(-1, keepdim=True)
    return v / v.norm(dim=-1, keepdim=True)


def _kendall(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Kendall's tau-b of each row of ``a [..., m]`` with each row of ``b [..., m]`` (broadcast), by pair signs.

    O(m^2) per row, chunked to ~16M pair signs at a time: quick for one RSA, slow as a permutation null."""
    a, b = torch.broadcast_tensors(a.double(), b.double())
    m = a.shape[-1]
    chunk = max(1, 2 ** 24 // max(1, a[..., 0].numel() * m))
    conc = torch.zeros(a.shape[:-1], dtype=torch.float64)
    ties_a, ties_b = torch.zeros_like(conc), torch.zeros_like(conc)
    for s in range(0, m, chunk):
        da = torch.sign(a[..., s:s + chunk, None] - a[..., None, :])   # [..., c, m]
        db = torch.sign(b[..., s:s + chunk, None] - b[..., None, :])
        conc += (da * db).sum((-1, -2))
        ties_a += (da != 0).sum((-1, -2))
        ties_b += (db != 0).sum((-1, -2))
    return conc / (ties_a * ties_b).sqrt()


def correlate(a: Float[torch.Tensor, "... m"], b: Float[torch.Tensor, "... m"], method: str = "spearman"
              ) -> Float[torch.Tensor, "..."]:
    """Spearman (tie-averaged ranks), Pearson or Kendall tau-b correlation along the last axis (broadcast), float64;
    nan where one side is constant."""
    _check_choice(method, METHODS, "method")
    if method == "kendall":
        return _kendall(a, b)
    a, b = a.double(), b.double()
    if method == "spearman":
        a, b = average_ranks(a), average_ranks(b)
    return (_standardise(a) * _standardise(b)).sum(-1)


def compare_rdms(rdms: Float[torch.Tensor, "... n n"], target: Float[torch.Tensor, "n n"], method: str = "spearman"
                 ) -> Float[torch.Tensor, "..."]:
    """Correlation of each RDM's upper triangle with the target's (one figure per layer)."""
    t = check_target(target, rdms.shape[-1])
    if t.dim() != 2:
        raise ValueError("compare_rdms takes one target [n, n]; average repeated judgements first (or see noise_ceiling)")
    return correlate(upper(rdms.double()), upper(t), method)


def permutations(n: int, n_perm: int, seed: int = 0) -> torch.Tensor:
    """``[n_perm, n]`` seeded random permutations of ``range(n)``."""
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n_perm, n, generator=g).argsort(-1)


def group_permutations(groups: torch.Tensor, n_perm: int, seed: int = 0) -> torch.Tensor:
    """``[n_perm, n]`` seeded permutations that move each item only within its group (``groups [n]`` integer ids):
    ``x[perm]`` shuffles ``x`` inside every group."""
    g = torch.Generator().manual_seed(seed)
    key = groups.double() * 2
    home = key.argsort(stable=True)                                     # positions sorted by group
    src = (key + torch.rand(n_perm, len(groups), generator=g)).argsort(-1)
    perm = torch.empty_like(src)
    perm[:, home] = src
    return perm


def p_greater(observed: torch.Tensor, null: torch.Tensor) -> torch.Tensor:
    """One-sided permutation p-value ``(1 + #{null >= observed}) / (1 + n_perm)`` along the first axis of ``null``
    (a nan in the null counts as not exceeding; a nan observed statistic gets a nan p)."""
    p = (1 + (null >= observed - 1e-12).sum(0)).double() / (1 + null.shape[0])
    return torch.where(torch.isnan(observed), torch.full_like(p, float("nan")), p)


@dataclass
class MantelTest:
    """RSA of each layer's RDM against one target: ``r [L]``, the permutation ``p [L]`` and ``null [n_perm, L]``."""

    r: torch.Tensor
    p: torch.Tensor
    null: torch.Tensor
    method: str


def mantel(rdms: Float[torch.Tensor, "L n n"], target: Float[torch.Tensor, "n n"], n_perm: int = 1000,
           method: str = "spearman", seed: int = 0, perms: torch.Tensor | None = None, chunk: int = 128) -> MantelTest:
    """Mantel-style permutation test: the item labels of ``target`` are permuted (rows and columns alike) ``n_perm``
    times, each permuted target's upper triangle is correlated with every layer's; ``p = (1 + #null >= r) / (1 +
    n_perm)`` (one-sided: the model's geometry matches the target's). ``perms [n_perm, n]`` overrides the seeded ones."""
    rdms = rdms.double()
    if rdms.dim() == 2:
        rdms = rdms[None]
    n = rdms.shape[-1]
    t = check_target(target, n)
    if t.dim() == 3:
        t = t.mean(0)
    perms = permutations(n, n_perm, seed) if perms is None else perms
    i, j = torch.triu_indices(n, n, 1)
    a = upper(rdms)                                                          # [L, m]
    r = correlate(a, upper(t)[None], method)
    if method != "kendall":
        a = _standardise(average_ranks(a) if method == "spearman" else a)
    nulls = []
    for s in range(0, perms.shape[0], chunk):
        pt = perms[s:s + chunk]
        tb = t[pt[:, i], pt[:, j]]                                             # [c, m] permuted target triangles
        if method == "kendall":
            nulls.append(_kendall(a[None], tb[:, None]))
        else:
            tb = _standardise(average_ranks(tb) if method == "spearman" else tb)
            nulls.append(tb @ a.T)
    null = torch.cat(nulls)
    return MantelTest(r=r, p=p_greater(r, null), null=null, method=method)


def pair_cosines(A: torch.Tensor, B: torch.Tensor, centre: bool = True) -> torch.Tensor:
    """Cosines ``[L, n, n]`` between the rows of ``A [L, n, d]`` and of ``B [L, n, d]``, each centred on its own mean
    over items first when ``centre``."""
    A, B = A.double(), B.double()
    if centre:
        A, B = A - A.mean(-2, keepdim=True), B - B.mean(-2, keepdim=True)
    A = A / A.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    B = B / B.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    return A @ B.transpose(-1, -2)


def pairing_stats(C: torch.Tensor, pairing: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For cosines ``C [L, n, n]`` and a pairing (row ``i`` goes with column ``pairing[i]``): mean paired cosine ``[L]``,
    mean cosine of every other pairing ``[L]``, and retrieval accuracy ``[L]`` (row's argmax is its pair)."""
    n = C.shape[-1]
    hit = torch.zeros(n, n, dtype=torch.bool)
    hit[torch.arange(n), pairing] = True
    matched = C[:, hit].mean(-1)
    mismatched = C[:, ~hit].mean(-1)
    retrieval = (C.argmax(-1) == pairing).double().mean(-1)
    return matched, mismatched, retrieval


def noise_ceiling(target: Float[torch.Tensor, "R n n"], method: str = "spearman") -> tuple[float, float]:
    """Bounds on the best RSA any model can reach against repeated judgements ``[n_raters, n, n]``: lower = each rater
    vs the mean of the others (leave one rater out), upper = each rater vs the mean of all, both averaged over raters."""
    t = torch.as_tensor(target).double()
    if t.dim() != 3 or t.shape[0] < 2:
        raise ValueError(f"a noise ceiling needs repeated judgements [n_raters >= 2, n, n], got shape {tuple(t.shape)}")
    t = check_target(t, t.shape[-1])
    u = upper(t)                                                               # [R, m]
    total = u.sum(0, keepdim=True)
    others = (total - u) / (u.shape[0] - 1)
    lower = correlate(u, others, method).mean().item()
    upper_ = correlate(u, (total / u.shape[0]).expand_as(u), method).mean().item()
    return lower, upper_


def group_ids(labels: Sequence[Any]) -> tuple[torch.Tensor, list[Any]]:
    """Integer ids ``[n]`` of ``labels`` in order of first appearance, and the distinct labels."""
    names = list(dict.fromkeys(labels))
    index = {v: k for k, v in enumerate(names)}
    return torch.tensor([index[v] for v in labels]), names


def prototype_distance(X: Float[torch.Tensor, "L n d"], groups: Sequence[Any], metric: str = "cosine",
                       leave_one_out: bool = True) -> Float[torch.Tensor, "L n"]:
    """Distance of each item to its group's prototype (the centroid of the group's items, leaving the item itself out
    when ``leave_one_out``), per layer. ``metric``: ``cosine`` (1 - cosine), ``euclidean`` or ``correlation``."""
    _check_choice(metric, METRICS, "metric")
    X = torch.as_tensor(X).double()
    if X.dim() == 2:
        X = X[None]
    gid, names = group_ids(groups)
    if len(gid) != X.shape[-2]:
        raise ValueError(f"{len(gid)} group labels for {X.shape[-2]} items")
    counts = torch.bincount(gid).double()
    small = [names[k] for k in range(len(names)) if counts[k] < (3 if leave_one_out else 2)]
    if small:
        raise ValueError(f"groups {small} have too few items for a leave-one-out prototype (need >= 3 each)")
    sums = torch.zeros(X.shape[0], len(names), X.shape[-1], dtype=torch.float64).index_add_(1, gid, X)
    if leave_one_out:
        proto = (sums[:, gid] - X) / (counts[gid] - 1)[None, :, None]
    else:
        proto = sums[:, gid] / counts[gid][None, :, None]
    if metric == "euclidean":
        return (X - proto).norm(dim=-1)
    if metric == "correlation":
        X, proto = X - X.mean(-1, keepdim=True), proto - proto.mean(-1, keepdim=True)
    return 1 - torch.nn.functional.cosine_similarity(X, proto, dim=-1)
