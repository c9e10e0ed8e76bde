"""Per-layer dispatch: the dispatcher and one dispatch state per model, from partition to replan."""
