"""Telemetry: board power, energy, clocks and temperatures, with work and energy per model."""
