"""GGUF plans: llama.cpp thread count and GPU offload, measured, chosen, explained, checked live."""
