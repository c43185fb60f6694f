"""Shared Triton plumbing for the packages' GPU kernels: availability and interpreter mode (CPU testing)."""

from __future__ import annotations

import os


def triton_available() -> bool:
    """True when Triton imports (kernels are still only launched on CUDA or under the interpreter)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def triton_interpret() -> bool:
    """True under ``TRITON_INTERPRET=1``, where kernels run on the CPU for correctness tests."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")
