"""Circuits at feature level as studies: attribution graphs of a behaviour over many prompts, the features they
find checked by ablation against random ones. ``interp.studies.circuits.refusal.refusal_circuit``."""

from __future__ import annotations

from interp.studies.circuits.refusal import CircuitConfig, RefusalCircuit, refusal_circuit

__all__ = ["CircuitConfig", "RefusalCircuit", "refusal_circuit"]
