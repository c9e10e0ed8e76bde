"""The model catalog: which models exist and where their files are, in one place.

Models come from ``[[models]]`` config entries, then the demo entries (when the config names
none), then files dropped in the model dir (named by their stem). The model registry (what is
resident), the serving layer, the dispatcher (what to plan) and the CLI all look names up here,
so a name means the same file to each of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from edgepilot.errors import ModelError, NotFoundError
from edgepilot.formats import files
from edgepilot.formats.model_entry import ModelEntry


class ModelCatalog:
    """Model names -> entries and verified files.

    ``paths``: a name may also be the path of a model file anywhere (the CLI's ``edgepilot plan
    ./model.onnx``); the daemon serves only what lies inside its model dir.
    """

    def __init__(self, model_dir: Path, entries: Sequence[ModelEntry], *,
                 paths: bool = False) -> None:
        self.model_dir = model_dir
        self.configured = list(entries)
        self.paths = paths
        self.extra: list[ModelEntry] = []  # the demo models, when the config names none

    def reload(self, model_dir: Path, entries: Sequence[ModelEntry]) -> None:
        """A reloaded config's model dir and ``[[models]]`` entries (demo entries stay)."""
        self.model_dir = model_dir
        self.configured = list(entries)

    def entries(self) -> dict[str, ModelEntry]:
        """Config entries, then demo entries, then files dropped in the model dir."""
        configured = list(self.configured)
        names = {e.name for e in configured}
        configured += [e for e in self.extra if e.name not in names]
        return files.discover(self.model_dir, configured)

    def entry(self, name: str) -> ModelEntry:
        """The entry of ``name``; NotFoundError naming the models there are."""
        entries = self.entries()
        found = entries.get(name)
        return found if found is not None else self._by_path(name, entries).entry

    def resolve(self, name: str) -> files.ResolvedModel:
        """The model's file (inside the model dir, present) and kind; NotFoundError for an
        unknown name, ModelError for a file outside the model dir or missing."""
        entries = self.entries()
        found = entries.get(name)
        if found is None:
            return self._by_path(name, entries)
        return files.resolve(self.model_dir, found)

    def _by_path(self, name: str, entries: dict[str, ModelEntry]) -> files.ResolvedModel:
        """``name`` as the path of a model file (when ``paths``), else NotFoundError."""
        path = Path(name)
        if self.paths and path.suffix.lower() in files.KINDS and path.is_file():
            entry = ModelEntry(name=_safe_name(path.stem), file=path.resolve(),
                               load_at_start=False)
            return files.ResolvedModel(entry.name, entry, entry.file, files.kind_of(entry))
        if self.paths and ("/" in name or name.startswith(".")) and path.is_dir():
            raise ModelError(f"{name} is a directory; give a model file in it (allowed: "
                             f"{', '.join(sorted(files.KINDS))})", field="model")
        if self.paths and path.suffix.lower() in files.KINDS and not path.exists():
            raise NotFoundError(f"no model file at {name} (nor a model of that name; "
                                f"available: {', '.join(sorted(entries)) or 'none'})",
                                field="model")
        if self.paths and path.is_file():  # a file, but of no kind run here (an archive)
            archive = any(name.lower().endswith(a) for a in ARCHIVES)
            raise ModelError(f"{name}: not a model file of a kind run here (extension "
                             f"{path.suffix or 'none'}); allowed: "
                             f"{', '.join(sorted(files.KINDS))}"
                             + ("; unpack the archive and give the model file in it"
                                if archive else ""), field="model")
        raise NotFoundError(f"unknown model {name!r}; available: "
                            f"{', '.join(sorted(entries)) or 'none (model dir is empty)'}",
                            field="model")

    def locate(self, name: str) -> files.ResolvedModel:
        """:meth:`resolve`, with the file's sha256 checked when the entry pins one."""
        model = self.resolve(name)
        files.verify(model)
        return model


ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip", ".whl", ".tar.xz", ".tar.bz2", ".7z")


def _safe_name(stem: str) -> str:
    """A file's stem as a model name (the characters a name allows; others become '_')."""
    out = "".join(c if c.isalnum() or c in "_.:-" else "_" for c in stem)[:128]
    return out or "model"
