"""The one place for ``torch.distributed``: rank, world size, barrier, init from torchrun's environment, a
collective agreement on errors, round-robin ownership, gradient averaging and broadcasts.

Data-parallel capture (one :class:`~interp.store.ActivationStore`, each rank writing its own shards) and SAE
training (gradients all-reduced) use only these. Without an initialised process group of more than one process
every helper is the single-process identity (rank 0 of 1, barrier and reductions no-ops), so code written for
``torchrun`` runs unchanged alone. Nothing here initialises a process group unless :func:`init_from_env` is called.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def launched() -> bool:
    """Whether this process was started by ``torchrun`` (or another launcher setting ``RANK`` and ``WORLD_SIZE``)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def active() -> bool:
    """Whether a process group of more than one process is initialised (the data-parallel paths switch on)."""
    dist = _dist()
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank in the default group (0 without one)."""
    return _dist().get_rank() if active() else 0


def world_size() -> int:
    """Processes in the default group (1 without one)."""
    return _dist().get_world_size() if active() else 1


def local_rank() -> int:
    """This process's index on its machine (``LOCAL_RANK``; 0 when not launched)."""
    return int(os.environ.get("LOCAL_RANK", "0")) if launched() else 0


def is_main() -> bool:
    """Rank 0: the one writer of manifests, checkpoints and reports."""
    return rank() == 0


def barrier() -> None:
    if active():
        _dist().barrier()


def device_for(device: str | None) -> str | None:
    """``"cuda"`` -> ``"cuda:LOCAL_RANK"`` under a launcher (one GPU per process); anything else unchanged."""
    if device == "cuda" and launched():
        return f"cuda:{local_rank()}"
    return device


def init_from_env(device: str | None = None) -> bool:
    """Initialise the default process group from torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``PORT``): gloo for CPU tensors, plus NCCL for CUDA tensors when ``device`` is CUDA (or not
    given) and CUDA is present. A no-op when not launched or already initialised. Returns :func:`active`."""
    dist = _dist()
    if not launched() or not dist.is_available() or dist.is_initialized():
        return active()
    backend = "gloo"
    if torch.cuda.is_available() and (device is None or str(device).startswith("cuda")):
        torch.cuda.set_device(local_rank())
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend=backend)
    return active()


def shutdown() -> None:
    """Destroy the default process group if one is initialised (end of a launched command)."""
    dist = _dist()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def owns(k: int) -> bool:
    """Whether item ``k`` (a shard, a batch) is this rank's: round robin, ``k % world_size == rank``."""
    return k % world_size() == rank()


def agree(error: BaseException | None = None) -> None:
    """Collective: every rank says whether it failed; if any did, every rank raises (a failed rank its own error,
    the others a RuntimeError naming the failed ranks), so no rank waits forever at a later collective."""
    if not active():
        if error is not None:
            raise error
        return
    flags = torch.zeros(world_size(), dtype=torch.int32)
    flags[rank()] = int(error is not None)
    _dist().all_reduce(flags)
    if error is not None:
        raise error
    failed = flags.nonzero().flatten().tolist()
    if failed:
        raise RuntimeError(f"rank(s) {failed} of {world_size()} failed (their error is printed above); nothing more "
                           f"was done here")


def on_main(fn: Callable[[], T]) -> T | None:
    """Run ``fn`` on rank 0 only, then :func:`agree` (so every rank raises if it failed, and none goes on before
    it finished). Returns its result on rank 0, ``None`` elsewhere."""
    out, err = None, None
    if is_main():
        try:
            out = fn()
        except Exception as e:  # every rank must reach the agreement, then the error is raised everywhere
            err = e
    agree(err)
    return out


def all_reduce_(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce of ``t`` over ranks (``sum``, ``max``, ``min``); returns ``t``."""
    if active():
        dist = _dist()
        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t


def average_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """All-reduce the gradients of ``params`` to their mean over ranks, in one flat buffer (what DDP does)."""
    if not active():
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce_(flat).div_(world_size())
    i = 0
    for g in grads:
        g.copy_(flat[i:i + g.numel()].view_as(g))
        i += g.numel()


def broadcast_(tensors: Iterable[torch.Tensor], src: int = 0) -> None:
    """Overwrite ``tensors`` in place with rank ``src``'s (identical replicas, as DDP does at start)."""
    if active():
        for t in tensors:
            _dist().broadcast(t, src=src)


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (pickled), in rank order; ``[obj]`` alone."""
    if not active():
        return [obj]
    out: list[Any] = [None] * world_size()
    _dist().all_gather_object(out, obj)
    return out


def process_info() -> dict[str, Any]:
    """The process fields a store manifest records (world size, backend)."""
    return {"world_size": world_size(), "backend": str(_dist().get_backend()) if active() else None}


__all__ = ["active", "agree", "all_reduce_", "average_gradients", "barrier", "broadcast_", "device_for",
           "gather_objects", "init_from_env", "is_main", "launched", "local_rank", "on_main", "owns", "process_info",
           "rank", "shutdown", "world_size"]
