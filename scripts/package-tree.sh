#!/bin/sh
# Join the package into one tree under DIR: daemon/ -> DIR/edgepilot, backends/ ->
# DIR/edgepilot/backends, as setup.cfg's package_dir installs it. Tools that read one folder per
# package (import-linter, mypy) run on it: an editable install's import hook is invisible to them.
# Usage: scripts/package-tree.sh DIR [ROOT]   (ROOT: the checkout, default this script's)
set -eu
dir=$1
root=${2:-$(cd "$(dirname "$0")/.." && pwd)}
mkdir -p "$dir/edgepilot"
cp -R "$root/daemon/." "$dir/edgepilot/"
rm -rf "$dir/edgepilot/backends"
cp -R "$root/backends" "$dir/edgepilot/backends"
