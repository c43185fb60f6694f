"""The studies and the main job, one folder each, composed from every floor below (the CLI sits on top)."""
