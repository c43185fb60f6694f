"""The embedded model organism: a tiny Llama-architecture chat model trained by this package.

``data`` writes its synthetic requests, ``tokenizer`` its word-level tokenizer and chat template,
``train`` the two committed checkpoints (``organism`` = aligned, ``organism-base``).
"""

from __future__ import annotations

from pathlib import Path

EMBEDDED_DIR = Path(__file__).resolve().parents[1] / "embedded"
ALIGNED_DIR = EMBEDDED_DIR / "organism"
BASE_DIR = EMBEDDED_DIR / "organism-base"

__all__ = ["EMBEDDED_DIR", "ALIGNED_DIR", "BASE_DIR"]
