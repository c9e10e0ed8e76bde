"""edgepilot: serve models on ARM/NPU edge boards through the fastest mix of their backends."""

__version__ = "0.1.0"
