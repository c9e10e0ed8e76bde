"""``edgepilot top``: a live view of a running daemon, read over its HTTP API.

Three layers, each usable alone: :mod:`.snapshot` fetches what the daemon exposes (plain data,
no rendering), :mod:`.view` turns a snapshot into titled tables of strings, and :mod:`.text`
(``--once``) or :mod:`.app` (the live Textual view) draws them. ``top`` never changes the
daemon: it only reads, and never asks for a plan that is not made yet (that would start
profiling on a board that is serving).
"""
