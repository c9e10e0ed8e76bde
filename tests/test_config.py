"""Config: every key validated, unknown keys named by path, flags override the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgepilot.config import Config, load_config, parse_config
from edgepilot.errors import ConfigError

REPO = Path(__file__).parent.parent


def test_embedded_default_needs_no_file(tmp_path: Path) -> None:
    cfg = load_config(None, {"state_dir": tmp_path})
    assert cfg.http.host == "127.0.0.1" and cfg.http.port == 8470
    assert cfg.state_dir == tmp_path and cfg.model_dir == tmp_path / "models"
    assert cfg.daemon.sysfs_root == Path("/")


def test_unknown_keys_are_named_by_dotted_path() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"mqtt": {"tls": {"ca": "x"}}, "nope": {}}, "f.toml")
    assert "unknown key 'mqtt.tls.ca'" in err.value.message
    assert "unknown key 'nope'" in err.value.message


@pytest.mark.parametrize(("data", "field", "allowed"), [
    ({"http": {"port": 70000}}, "http.port", "less than or equal to 65535"),
    ({"mqtt": {"protocol": "4"}}, "mqtt.protocol", "'5' or '3.1.1'"),
    ({"telemetry": {"sample_interval_s": 0.01}}, "telemetry.sample_interval_s",
     "greater than or equal to 0.1"),
    ({"daemon": {"log_level": "loud"}}, "daemon.log_level",
     "'debug', 'info', 'warning' or 'error'"),
    ({"mqtt": {"device_id": "a/b"}}, "mqtt.device_id", "pattern"),
    ({"backends": {"llamacpp": {"speculative": "draft_model"}}},
     "backends.llamacpp.speculative", "'off', 'prompt_lookup' or 'draft'"),
    ({"backends": {"llamacpp": {"speculative": "draft", "flash_attn": True}}},
     "backends.llamacpp.draft_model", "needs draft_model"),
    ({"backends": {"llamacpp": {"speculative": "prompt_lookup"}}},
     "backends.llamacpp.speculative", "'prompt_lookup' needs flash_attn = true"),
])
def test_bad_values_name_field_and_allowed_values(data: dict, field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert err.value.field == field
    assert f"'{field}'" in err.value.message and allowed in err.value.message


def test_duplicate_model_names_rejected() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"models": [{"name": "a", "file": "a.onnx"}, {"name": "a", "file": "b.onnx"}]})
    assert "repeated: a" in err.value.message


def test_flags_override_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[daemon]\nstate_dir = "/nonexistent/state"\nsysfs_root = "/"\n')
    cfg = load_config(f, {"state_dir": tmp_path / "s", "sysfs_root": tmp_path, "model_dir": None})
    assert cfg.state_dir == tmp_path / "s"
    assert cfg.daemon.sysfs_root == tmp_path


def test_missing_and_broken_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[http\nport=1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_shipped_example_config_is_valid() -> None:
    cfg = load_config(REPO / "systemd" / "edgepilot.toml.example")
    assert isinstance(cfg, Config)
    assert cfg.state_dir == Path("/var/lib/edgepilot")


def test_every_field_has_a_description() -> None:
    def walk(model: type, path: str) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                missing += walk(ann, f"{path}{name}.")
            elif not field.description and path:
                missing.append(path + name)
        return missing

    assert walk(Config, "") == []


def test_a_missing_sysfs_root_is_an_error_not_an_empty_board(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "edgepilot", "--sysfs-root",
                           str(tmp_path / "typo"), "--state-dir", str(tmp_path / "s"),
                           "profile", "status"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"sysfs root {tmp_path / 'typo'} is not a directory" in proc.stderr


def test_models_preload_is_load_at_start() -> None:
    lazy = parse_config({"models": [{"name": "a", "file": "a.gguf", "preload": False}]})
    assert lazy.models[0].load_at_start is False
    eager = parse_config({"models": [{"name": "a", "file": "a.gguf", "load_at_start": True}]})
    assert eager.models[0].load_at_start is True
