#!/usr/bin/env bash
# Build (once) and print the path of a llama-cpp-python wheel compiled with portable flags.
#
# Why a project-owned wheelhouse: pip's wheel cache is keyed by the sdist, not by CMAKE_ARGS, so a
# native build cached earlier would be silently reused. We key ours by version + flags instead.
#   LLAMA_CPP_VERSION   version to build (default pinned below)
#   LLAMA_CMAKE_ARGS    cmake flags (default portable: -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF)
#   EDGEPILOT_WHEELHOUSE  where wheels are kept (default ~/.cache/edgepilot/wheelhouse)
#   LLAMA_PIP_ARGS      more pip arguments, e.g. offline: --no-index --find-links DIR --no-build-isolation
#                       (DIR holding llama_cpp_python-VERSION.tar.gz; the build tools then come from the machine)
# On a board, build native for speed:  LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON" scripts/llama-wheel.sh
# --cached: print the wheel's path if it is built already, else exit 1 (builds nothing).
set -euo pipefail
cached_only=0; [ "${1:-}" = "--cached" ] && cached_only=1
version="${LLAMA_CPP_VERSION:-0.3.36}"
flags="${LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF}"
python="${PYTHON:-python3}"
key=$(printf '%s|%s|%s|%s' "$version" "$flags" "$(uname -m)" "$("$python" -c 'import sys;print(sys.implementation.cache_tag)')" | sha256sum | cut -c1-16)
house="${EDGEPILOT_WHEELHOUSE:-$HOME/.cache/edgepilot/wheelhouse}/llama-cpp-python-$version-$key"
wheel=$(ls "$house"/llama_cpp_python-*.whl 2>/dev/null | head -n1 || true)
if [ "$cached_only" = 1 ]; then
  [ -n "$wheel" ] && printf '%s\n' "$wheel"
  [ -n "$wheel" ]; exit
fi
mkdir -p "$house"
if [ -z "$wheel" ]; then
  cores=$(nproc 2>/dev/null || echo 1)
  # measured: ~9 min on 2 cores for the whole compile (about 18 core-minutes), less with more
  est=$(( (18 + cores - 1) / cores + 1 ))
  echo "building llama.cpp (llama-cpp-python $version, CMAKE_ARGS='$flags') from source, once:" \
       "roughly $est min on $cores cores; later installs reuse it from $house" >&2
  tmp=$(mktemp -d)
  # shellcheck disable=SC2086  # LLAMA_PIP_ARGS are several arguments, split on purpose
  CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL="$cores" \
    "$python" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
    ${LLAMA_PIP_ARGS:-} -w "$tmp" "llama-cpp-python==$version" >"$tmp/build.log" 2>&1 &
  pid=$!
  start=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    elapsed=$((SECONDS - start))
    if [ $((elapsed % 60)) -eq 0 ] && [ "$elapsed" -gt 0 ]; then
      echo "  llama.cpp build: $((elapsed / 60)) min elapsed (roughly $est in all)" >&2
    fi
  done
  if ! wait "$pid"; then
    echo "llama.cpp build failed after $((SECONDS - start)) s; its log:" >&2
    cat "$tmp/build.log" >&2
    exit 1
  fi
  echo "  llama.cpp built in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s" >&2
  mv "$tmp"/llama_cpp_python-*.whl "$house"/
  rm -rf "$tmp"
  printf '%s\n' "$flags" > "$house/FLAGS"
  wheel=$(ls "$house"/llama_cpp_python-*.whl | head -n1)
fi
printf '%s\n' "$wheel"
