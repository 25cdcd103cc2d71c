"""Inference engines behind the gateway."""
