"""The prompts speculative-decoding tests run: a text the 135M test model copies faithfully
(bench/gguf_lookup.py's copy task, shorter) and a free-form request it does not copy."""

TEXT = ("The board has four cores and one small GPU. It runs a daemon that serves models to the "
        "devices of the house: lamps, thermostats, door sensors and cameras. ") * 2
COPY = [{"role": "user", "content": "Rewrite this text exactly:\n\n" + TEXT}]
FREE = [{"role": "user", "content": "List ten fruits, one per line."}]
