"""Timing layers and segments on targets and checking their error against the reference."""
