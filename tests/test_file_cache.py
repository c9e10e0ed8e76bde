"""formats.file_cache: one answer per file version, recomputed when the file changes."""

from __future__ import annotations

from pathlib import Path

from edgepilot.formats.file_cache import file_key, per_file


def test_per_file_reads_once_per_version(tmp_path: Path) -> None:
    reads: list[str] = []

    @per_file(maxsize=4)
    def first_line(path: Path, upper: bool) -> str:
        text = path.read_text().splitlines()[0]
        reads.append(text)
        return text.upper() if upper else text

    f = tmp_path / "m.txt"
    f.write_text("alpha\n")
    assert first_line(f, False) == "alpha"
    assert first_line(f, False) == "alpha"
    assert reads == ["alpha"]
    assert first_line(f, True) == "ALPHA"   # other arguments: their own entry
    before = file_key(f)
    f.write_text("beta-longer\n")           # replaced in place: size (and mtime) change
    assert file_key(f) != before
    assert first_line(f, False) == "beta-longer"
    assert reads == ["alpha", "alpha", "beta-longer"]
