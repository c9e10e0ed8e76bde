"""Model file formats: ONNX, TFLite and GGUF readers, tensor specs, graph cuts, generators.

The base layer: nothing here imports a runtime backend, the dispatcher or the daemon.
"""
