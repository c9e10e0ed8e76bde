"""Cutting a model into layers per format, input-shape signatures, realistic sample inputs."""
