"""Test support: tiny seeded models built from configs and oracle builders (TransformerLens). Not imported by the core."""
