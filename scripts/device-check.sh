#!/usr/bin/env bash
# Check edgepilot on a machine with a CUDA GPU: the CUDA targets next to the CPU ones.
#
# Usage: scripts/device-check.sh OUT_DIR [VENV]        (VENV default: .venv, made by `make install`)
#
# Without a CUDA device (no nvidia-smi, or it lists no GPU) it says so, writes
# OUT_DIR/device-check.json {"cuda": false, ...} and exits 0: nothing here can be checked.
# With one it installs onnxruntime-gpu in place of onnxruntime and a CUDA build of
# llama-cpp-python (scripts/llama-wheel.sh with -DGGML_CUDA=ON, built once into the wheelhouse),
# then writes into OUT_DIR:
#   doctor.json                      `edgepilot doctor --json` (the targets it found)
#   plan-NAME.json, bench-NAME.json  `plan --json` and `bench --json` of every real corpus model
#                                    (tests/real_models.py) with every target installed
#   device-check.json                what ran, the GPU, and the models that failed (one line each)
set -uo pipefail
out="${1:?usage: scripts/device-check.sh OUT_DIR [VENV]}"
venv="${2:-.venv}"
here="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"

gpu=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n1)"
fi
if [ -z "$gpu" ]; then
  echo "device-check: no CUDA device present on this machine (nvidia-smi lists no GPU); nothing to check, exiting 0"
  printf '{"cuda": false, "reason": "no CUDA device present (nvidia-smi lists no GPU)"}\n' \
    > "$out/device-check.json"
  exit 0
fi
echo "device-check: CUDA device: $gpu"
py="$venv/bin/python"
[ -x "$py" ] || { echo "device-check: $py missing; run make install first" >&2; exit 1; }

# onnxruntime-gpu replaces the CPU wheel (same module name); its CUDA libraries come as wheels
"$py" -m pip uninstall -q -y onnxruntime >/dev/null 2>&1 || true
"$py" -m pip install -q "onnxruntime-gpu[cuda,cudnn]" || "$py" -m pip install -q onnxruntime-gpu
# llama.cpp with CUDA, built once per flags into the wheelhouse (several minutes the first time)
if wheel="$(LLAMA_CMAKE_ARGS="-DGGML_CUDA=ON -DGGML_NATIVE=OFF" PYTHON="$py" "$here/scripts/llama-wheel.sh")"; then
  "$py" -m pip install -q --force-reinstall --no-deps "$wheel"
else
  echo "device-check: the CUDA llama-cpp-python build failed; GGUF stays on the CPU build" >&2
fi

"$venv/bin/edgepilot" doctor --json > "$out/doctor.json" 2> "$out/doctor.err" || true
state="$out/state"
failed=()
while IFS=$'\t' read -r name path args; do
  # shellcheck disable=SC2086  # args are --input-shape flags, split on purpose
  if ! "$venv/bin/edgepilot" --state-dir "$state" plan --json "$path" $args \
      > "$out/plan-$name.json" 2> "$out/plan-$name.err"; then
    failed+=("$name plan: $(tail -n1 "$out/plan-$name.err")")
    continue
  fi
  # shellcheck disable=SC2086
  "$venv/bin/edgepilot" --state-dir "$state" bench --json --runs 10 "$path" $args \
    > "$out/bench-$name.json" 2> "$out/bench-$name.err" \
    || failed+=("$name bench: $(tail -n1 "$out/bench-$name.err")")
done < <(PYTHONPATH="$here/tests" "$py" -c '
from real_models import CORPUS
for m in CORPUS:
    print(m.name, m.path, " ".join(m.shape_args()), sep="\t")')

"$py" - "$out/device-check.json" "$gpu" "${failed[@]}" <<'EOF'
import json, sys
path, gpu, failed = sys.argv[1], sys.argv[2], sys.argv[3:]
json.dump({"cuda": True, "gpu": gpu, "failed": failed}, open(path, "w"), indent=2)
EOF
echo "device-check: JSON in $out (${#failed[@]} failure(s))"
