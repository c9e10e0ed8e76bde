#!/bin/sh
# mypy on the package as one tree (see package-tree.sh), with pyproject.toml's [tool.mypy].
# Usage: scripts/typecheck.sh [VENV] [EXTRA.py ...]   (EXTRA files join the package: tests)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv}
case $venv in /*) ;; *) venv=$(pwd)/$venv ;; esac
[ $# -gt 0 ] && shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$root/scripts/package-tree.sh" "$tmp" "$root"
for extra in "$@"; do cp "$extra" "$tmp/edgepilot/"; done
cd "$tmp"
"$venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$tmp/.mypy_cache" -p edgepilot
