"""Kernel patches and build recipes, installed as package data ``bbrlab.kernels`` (see setup.py, bbrlab.core.resources)."""
