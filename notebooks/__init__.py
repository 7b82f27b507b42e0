"""The analysis notebooks, installed as package data ``bbrlab.notebooks`` (see setup.py, bbrlab.core.resources)."""
