"""Plotly figures for every stage; each topic lives in its own module (imported lazily by callers)."""
