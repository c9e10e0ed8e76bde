#!/usr/bin/env bash
# Expose Debian's python3-pyarmnn (and nothing else from dist-packages) to a venv.
# A .pth appended after the venv's own paths: the venv's numpy etc. keep precedence.
set -euo pipefail
venv="${1:-.venv}"
src=/usr/lib/python3/dist-packages/pyarmnn
if [ ! -d "$src" ]; then
  echo "pyarmnn not installed (apt-get install python3-pyarmnn libarmnn-cpuref-backend22 libarmnntfliteparser22); the armnn backend will be reported missing" >&2
  exit 0
fi
site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$venv/debian-armnn"
ln -sfn "$src" "$venv/debian-armnn/pyarmnn"
echo "$(cd "$venv" && pwd)/debian-armnn" > "$site/zz_debian_armnn.pth"
