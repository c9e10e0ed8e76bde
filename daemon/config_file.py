"""``config.apply`` / ``config.restore``: the daemon's TOML file replaced by a command, and put
back byte for byte (what ``edgepilot fleet rollout config FILE`` drives).

``config.apply {"toml": TEXT}`` validates the text as a config first (a bad key is an error
naming it; nothing is written), keeps the file in force as ``<state_dir>/config.previous``,
replaces the file atomically and reloads as SIGHUP does; a reload the running daemon refuses
puts the old file back. ``config.restore`` writes ``config.previous`` back and reloads. Both
are mutating: over HTTP they need the token, over MQTT the broker's ACL decides (the file may
hold secrets, so it is never sent back).
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from edgepilot.blocking import RunBlocking
from edgepilot.command_registry import CommandRegistry, NoParams
from edgepilot.config import parse_config
from edgepilot.errors import CommandError, ConfigError

PREVIOUS = "config.previous"


class ConfigText(BaseModel):
    model_config = ConfigDict(extra="forbid")

    toml: str = Field(min_length=0, max_length=1 << 20, description="The whole TOML file.")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class ConfigFile:
    """The config file a daemon runs on (None: the embedded default, nothing to replace)."""

    def __init__(self, path: Path | None, state_dir: Path, *,
                 reload: Callable[[], Awaitable[bool]], run_blocking: RunBlocking) -> None:
        self.path, self.previous = path, state_dir / PREVIOUS
        self.reload, self.run_blocking = reload, run_blocking

    def _path(self) -> Path:
        if self.path is None:
            raise CommandError("this daemon runs on the embedded default config (no config "
                               "file): there is no file to replace; start it with --config",
                               field="toml")
        return self.path

    async def apply(self, params: ConfigText) -> dict[str, Any]:
        path = self._path()
        new = params.toml.encode()
        try:
            parse_config(tomllib.loads(params.toml), "toml")
        except tomllib.TOMLDecodeError as exc:
            raise CommandError(f"not valid TOML: {exc}", field="toml") from None
        except ConfigError as exc:
            raise CommandError(exc.message, field=f"toml.{exc.field}" if exc.field
                               else "toml") from None
        old = await self.run_blocking(path.read_bytes)
        await self.run_blocking(_write, self.previous, old)
        await self.run_blocking(_write, path, new)
        if not await self.reload():
            await self.run_blocking(_write, path, old)
            await self.run_blocking(self.previous.unlink)
            raise CommandError("the running daemon refused the new config (see the "
                               "config.rejected event); the file was put back", field="toml")
        return {"applied": True, "path": str(path), "sha256": _sha(new),
                "previous_sha256": _sha(old)}

    async def restore(self, _: NoParams) -> dict[str, Any]:
        path = self._path()
        if not self.previous.is_file():
            return {"restored": False, "reason": "no config.apply to undo"}
        old = await self.run_blocking(self.previous.read_bytes)
        await self.run_blocking(_write, path, old)
        await self.run_blocking(self.previous.unlink)
        reloaded = await self.reload()
        return {"restored": True, "path": str(path), "sha256": _sha(old), "reloaded": reloaded}


def attach(commands: CommandRegistry, path: Path | None, state_dir: Path, *,
           reload: Callable[[], Awaitable[bool]], run_blocking: RunBlocking) -> ConfigFile:
    """Register ``config.apply`` and ``config.restore`` over ``path``."""
    cf = ConfigFile(path, state_dir, reload=reload, run_blocking=run_blocking)
    commands.register("config.apply", ConfigText, cf.apply, mutating=True,
                      summary="Replace the config file and reload (the old one kept)")
    commands.register("config.restore", NoParams, cf.restore, mutating=True,
                      summary="Put back the config file config.apply replaced")
    return cf
