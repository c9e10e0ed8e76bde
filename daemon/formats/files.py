"""Model files: where they may live, what kind they are, whether they are the expected bytes."""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from edgepilot.errors import ModelError
from edgepilot.formats.model_entry import ModelEntry

log = logging.getLogger(__name__)

KINDS = {".gguf": "gguf", ".onnx": "onnx", ".tflite": "tflite"}
_NAME_OK = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")

_digest_lock = threading.Lock()
_digests: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True)
class ResolvedModel:
    """A model entry with its file located inside the model dir and its kind known."""

    name: str
    entry: ModelEntry
    path: Path
    kind: str


def kind_of(entry: ModelEntry) -> str:
    """The entry's kind, else guessed from the file extension."""
    if entry.kind:
        return entry.kind
    kind = KINDS.get(Path(entry.file).suffix.lower())
    if kind is None:
        raise ModelError(f"model {entry.name!r}: cannot tell the format of {entry.file}; set "
                         f"kind to one of gguf, onnx, tflite", field=f"models.{entry.name}.kind")
    return kind


def inside_model_dir(model_dir: Path, entry: ModelEntry) -> Path:
    """``entry.file`` resolved inside ``model_dir`` (it need not exist yet); refuse anything
    resolving outside it (``..``, absolute paths, symlinks)."""
    root = model_dir.resolve()
    path = (root / entry.file).resolve()
    if not path.is_relative_to(root):
        link = (root / entry.file).is_symlink()
        raise ModelError(f"model {entry.name!r}: file {str(entry.file)!r} "
                         + (f"is a symlink to {path}, which resolves outside the model dir "
                            f"{root} (links out of it are refused: any file on the board could "
                            "be served); copy the file into the model dir" if link else
                            f"resolves outside the model dir {root}; put the file in the model "
                            "dir"), field=f"models.{entry.name}.file")
    return path


def adapter_paths(model_dir: Path, entry: ModelEntry) -> dict[str, Path]:
    """The entry's LoRA adapter files by name, inside ``model_dir`` (one resolving outside it
    is a ModelError naming it); a missing file is the backend's to refuse."""
    root = model_dir.resolve()
    out = {}
    for name, file in entry.adapters.items():
        path = (root / file).resolve()
        if not path.is_relative_to(root):
            raise ModelError(f"model {entry.name!r}: adapter {name!r} file {str(file)!r} "
                             f"resolves outside the model dir {root}; put it in the model dir",
                             field=f"models.{entry.name}.adapters.{name}")
        out[name] = path
    return out


def resolve_path(model_dir: Path, entry: ModelEntry) -> Path:
    """``entry.file`` inside ``model_dir`` and present; refuse anything resolving outside it."""
    path = inside_model_dir(model_dir, entry)
    if not path.is_file():
        raise ModelError(f"model {entry.name!r}: file {path} does not exist",
                         field=f"models.{entry.name}.file")
    return path


def resolve(model_dir: Path, entry: ModelEntry) -> ResolvedModel:
    return ResolvedModel(entry.name, entry, resolve_path(model_dir, entry), kind_of(entry))


def sha256_of(path: Path) -> str:
    """Hex digest of ``path``, cached by (path, mtime, size) so reloads do not re-hash."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _digest_lock:
        if key in _digests:
            return _digests[key]
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    with _digest_lock:
        _digests[key] = digest
    return digest


def verify(model: ResolvedModel) -> None:
    """Raise ModelError when the entry pins a sha256 and the file differs."""
    want = model.entry.sha256
    if not want:
        return
    got = sha256_of(model.path)
    if got.lower() != want.lower():
        raise ModelError(f"model {model.name!r}: {model.path.name} has sha256 {got}, config "
                         f"expects {want.lower()}; replace the file or fix models.sha256",
                         field=f"models.{model.name}.sha256")


def discover(model_dir: Path, configured: list[ModelEntry]) -> dict[str, ModelEntry]:
    """Configured entries plus files dropped in the dir (named by stem), config first."""
    entries = {e.name: e for e in configured}
    claimed = {Path(e.file).name for e in configured if len(Path(e.file).parts) == 1}
    if model_dir.is_dir():
        for path in sorted(model_dir.iterdir()):
            if path.suffix.lower() not in KINDS or path.name in claimed or not path.is_file():
                continue
            if not _NAME_OK.match(path.stem):
                log.warning("model file %s skipped: its name is not a valid model name", path)
                continue
            if path.stem in entries:
                log.warning("model file %s skipped: name %r is already taken", path, path.stem)
                continue
            entries[path.stem] = ModelEntry(name=path.stem, file=Path(path.name),
                                            load_at_start=False)
    return entries
