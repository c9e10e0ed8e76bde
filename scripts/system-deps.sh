#!/usr/bin/env bash
# Debian packages the tests need: a real MQTT broker and clients, Arm NN (CpuRef + TfLite parser),
# systemd-analyze for unit verification, ss (iproute2: bytes waiting in a worker's socket),
# graphviz (dot: scripts/import_graph.py draws docs/import-graph.svg).
# Idempotent: does nothing when all are present.
set -euo pipefail
pkgs=(mosquitto mosquitto-clients python3-pyarmnn libarmnn-cpuref-backend22
      libarmnntfliteparser22 systemd e2fsprogs iproute2 graphviz)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing: ${missing[*]}" >&2
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
