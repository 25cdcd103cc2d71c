"""Helpers for testing code built on art_core (stand-in servers), shipped with the package
so integrations and users can test offline too."""
