#!/bin/sh
# Check the import-linter contracts (pyproject.toml [tool.importlinter]).
# edgepilot is split over two folders (daemon/ and backends/ via setup.cfg package_dir) and
# import-linter reads one folder per package, so it runs on a copy joined into one tree.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv}
# absolute: it is used after the cd below
case $venv in /*) ;; *) venv=$(pwd)/$venv ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$root/scripts/package-tree.sh" "$tmp" "$root"
cd "$tmp"
PYTHONPATH="$tmp" "$venv/bin/lint-imports" --no-cache "$root/pyproject.toml"
