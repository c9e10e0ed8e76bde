#!/usr/bin/env bash
# What `make install` (and so `make run` / `make test`) needs from the system before it starts:
# Python >= 3.11 with its venv module, and, while llama-cpp-python still has to be compiled (no
# wheel for these flags in the wheelhouse yet, see scripts/llama-wheel.sh), a C/C++ compiler
# and cmake. One line per missing piece naming the apt package; exit 1 when anything is missing.
#   PYTHON   the interpreter the venv is made from (default python3)
#   VENV     the venv to make (default .venv); one that exists already needs no venv module
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
venv="${VENV:-.venv}"
missing=()
hint() { echo "check-prereqs: $1" >&2; missing+=("$2"); }

if ! command -v "$python" >/dev/null 2>&1; then
  hint "$python not found: sudo apt-get install -y python3 python3-venv" python3
else
  ver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "?")
  if [ "$ver" = "?" ]; then
    hint "$python does not start ($(command -v "$python")); install Debian's: sudo apt-get install -y python3 python3-venv" python3
  elif ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    hint "$python is Python $ver; edgepilot needs 3.11 or newer: install python3.11 and run make PYTHON=python3.11" python3.11
  elif [ ! -x "$venv/bin/python" ] && ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    # Debian/Ubuntu ship venv's pip bootstrap (ensurepip) in a separate package
    hint "$python cannot create a venv (no ensurepip): sudo apt-get install -y python$ver-venv" "python$ver-venv"
  fi
fi

if ! PYTHON="$python" scripts/llama-wheel.sh --cached >/dev/null 2>&1; then
  need="needed to compile llama-cpp-python once"
  if ! command -v "${CC:-cc}" >/dev/null 2>&1 || ! command -v "${CXX:-c++}" >/dev/null 2>&1; then
    hint "no C/C++ compiler (${CC:-cc}, ${CXX:-c++}), $need: sudo apt-get install -y build-essential" build-essential
  fi
  if ! command -v cmake >/dev/null 2>&1; then
    hint "cmake not found, $need: sudo apt-get install -y cmake" cmake
  fi
fi

[ ${#missing[@]} -gt 1 ] && echo "check-prereqs: all at once: sudo apt-get install -y ${missing[*]}" >&2
[ ${#missing[@]} -eq 0 ]
