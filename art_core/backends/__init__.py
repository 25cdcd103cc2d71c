"""Backends: where models are served and trained."""
