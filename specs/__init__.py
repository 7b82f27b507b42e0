"""Campaign specs, installed as package data ``bbrlab.specs`` (see setup.py, bbrlab.core.resources)."""
