"""Results computed from a model file, kept per (path, mtime, size).

Request paths ask the same questions of a file many times (its tensor specs, its default
shapes) and parsing costs milliseconds; a file replaced in place gets a new mtime or size, so
the key never serves a stale answer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

R = TypeVar("R")

FileKey = tuple[str, int, int]


def file_key(path: Path) -> FileKey:
    """``(path, mtime_ns, size)``: changes whenever the file's content may have changed."""
    st = path.stat()
    return (str(path), st.st_mtime_ns, st.st_size)


def per_file(maxsize: int = 64) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Cache ``fn(path, *args)`` per (file key, args), least recently used first out."""
    def wrap(fn: Callable[..., R]) -> Callable[..., R]:
        @functools.lru_cache(maxsize=maxsize)
        def cached(key: FileKey, *args: object) -> R:
            return fn(Path(key[0]), *args)

        @functools.wraps(fn)
        def by_path(path: Path, *args: object) -> R:
            return cached(file_key(path), *args)

        return by_path
    return wrap
