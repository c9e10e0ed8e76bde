"""The local HTTP API: health, metrics, commands, tensor inference, OpenAI routes, plans."""
