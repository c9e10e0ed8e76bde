# edgepilot in a container, beside the systemd unit (which stays the primary path).
#   docker build -t edgepilot .                       # portable llama.cpp build
#   docker build --build-arg LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON" -t edgepilot .   # on the board
# Two stages: the first compiles llama.cpp once into a wheel (scripts/llama-wheel.sh, the same
# wheelhouse `make install` uses) and builds every wheel; the second installs them, with no
# compiler, and runs as the non-root user `edgepilot`. DVFS profiles write sysfs, which needs
# root and a writable /sys: see deploy/README.md for the privileges and mounts that takes.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
COPY scripts/llama-wheel.sh scripts/llama-wheel.sh
# llama.cpp compiled once: this layer is rebuilt only when the script or its flags change
RUN PYTHON=python3 EDGEPILOT_WHEELHOUSE=/wheelhouse LLAMA_CMAKE_ARGS="$LLAMA_CMAKE_ARGS" \
        scripts/llama-wheel.sh > /tmp/llama-wheel \
    && mkdir -p /wheels && cp "$(cat /tmp/llama-wheel)" /wheels/
COPY setup.cfg pyproject.toml README.md ./
COPY daemon daemon
COPY backends backends
COPY profiles profiles
# edgepilot with its runtime dependencies (ONNX Runtime, LiteRT) and those of the llama.cpp
# wheel above as wheels (that wheel is used as it is: pip builds nothing here)
RUN pip wheel --no-cache-dir -w /wheels ".[onnx,tflite]" /wheels/llama_cpp_python-*.whl

FROM ${PYTHON_IMAGE}
# libgomp: llama.cpp's OpenMP threads
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/edgepilot --create-home edgepilot
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels /wheels/*.whl \
    && rm -rf /wheels
# the user made above, by number (a host resolves no names of the image)
USER 10001
ENV PYTHONUNBUFFERED=1
# the state dir holds the DVFS journal: keep it on the host so a restarted container puts the
# board back (deploy/k8s/daemonset.yaml mounts /var/lib/edgepilot from the host)
VOLUME ["/var/lib/edgepilot"]
EXPOSE 8470
ENTRYPOINT ["edgepilot", "--state-dir", "/var/lib/edgepilot"]
CMD ["run"]
