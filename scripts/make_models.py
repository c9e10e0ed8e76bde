#!/usr/bin/env python3
"""Generate test/demo models into a directory (nothing is downloaded).

    python scripts/make_models.py OUT_DIR                      # the default set
    python scripts/make_models.py OUT_DIR --gguf-type q4_0 --tokenizer bpe --layers 4
    python scripts/make_models.py OUT_DIR --packaged           # also copy packaged real models

Default set: a random llama GGUF (chat.gguf), ONNX MLP/transformer/CNN stacks (via
edgepilot.formats.onnx_gen) and a TFLite MLP. ``--packaged`` copies pyopen-wakeword's .tflite and
silero-vad's .onnx files when those packages are installed (pip install --no-deps ...).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from pathlib import Path

from edgepilot.formats import onnx_gen
from edgepilot.formats.gguf_gen import GgufSpec, write_gguf
from edgepilot.formats.tflite_gen import write_mlp_tflite

PACKAGED = {
    "pyopen_wakeword": ("models", ("alexa.tflite", "embedding_model.tflite")),
    "silero_vad": ("data", ("silero_vad_16k_op15.onnx",)),
}


def copy_packaged(out: Path) -> list[Path]:
    made = []
    for package, (sub, names) in PACKAGED.items():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            pip_name = package.replace("_", "-")
            print(f"skip {package}: not installed (pip install --no-deps {pip_name})",
                  file=sys.stderr)
            continue
        root = Path(next(iter(spec.submodule_search_locations)), sub)
        for name in names:
            dst = out / name
            shutil.copy(root / name, dst)
            made.append(dst)
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="directory to write into (created)")
    p.add_argument("--tokenizer", choices=["spm", "bpe"], default="spm")
    p.add_argument("--gguf-type", choices=["f16", "q8_0", "q4_0"], default="q8_0")
    p.add_argument("--layers", type=int, default=2, help="GGUF transformer blocks")
    p.add_argument("--width", type=int, default=64, help="GGUF embedding width (multiple of 32)")
    p.add_argument("--packaged", action="store_true", help="copy packaged real models too")
    args = p.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    made = [write_gguf(out / "chat.gguf", GgufSpec(
        n_layers=args.layers, n_embd=args.width, n_ff=2 * args.width,
        tokenizer=args.tokenizer, weight_type=args.gguf_type))]
    onnx_gen.mlp_stack(out / "mlp.onnx")
    onnx_gen.transformer_stack(out / "transformer.onnx")
    onnx_gen.small_cnn(out / "cnn.onnx")
    made += [out / "mlp.onnx", out / "transformer.onnx", out / "cnn.onnx"]
    made.append(write_mlp_tflite(out / "mlp.tflite"))
    if args.packaged:
        made += copy_packaged(out)
    for path in made:
        print(f"{path}\t{path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
