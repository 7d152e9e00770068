# The gateway in a container, installed through the same set-up script as a
# developer machine, run as an unprivileged user with a health check.
#
#   docker build -t voice-gateway .                                   # CPU
#   docker build -t voice-gateway:cuda --build-arg ACCELERATOR=cuda .  # CUDA host
#
# buildah/podman: add `--format docker` (the OCI format drops HEALTHCHECK).
# BASE may name another Python 3.11+ image (docs/container.md: how this file
# was built and run here from a locally made Debian base, without a registry).
ARG BASE=python:3.11-slim
FROM ${BASE}

# cpu: CPU torch from the PyTorch CPU index; cuda: CUDA torch and
# onnxruntime-gpu in place of the CPU onnxruntime (docs/gpu.md).  TORCH_SPEC,
# when set, overrides the torch requirement.
ARG ACCELERATOR=cpu
ARG TORCH_SPEC=
ENV ACCELERATOR=${ACCELERATOR} TORCH_SPEC=${TORCH_SPEC} \
    OMP_WAIT_POLICY=PASSIVE \
    GATEWAY_DATA_DIR=/data \
    PYTHONUNBUFFERED=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY scripts ./scripts
COPY gateway ./gateway
# the wire format the gateway requires (scripts/setup installs it first)
COPY integrations/wire ./integrations/wire
COPY configs ./configs
RUN scripts/setup serve && rm -rf /root/.cache/pip \
    && useradd --system --uid 10001 --user-group --home-dir /data --no-create-home gateway \
    && mkdir -p /data && chown gateway:gateway /data

# the code and the virtualenv stay root-owned and read-only to the server;
# it writes only under /data (model cache, uploaded voices)
USER gateway
VOLUME /data
EXPOSE 8000
# /healthz answers once the engine is loaded (the first start also
# calibrates the voice, hence the long start period)
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD [".venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
# Inside the image the server must listen on all interfaces; it warns at
# start when no API key is set (GATEWAY_API_KEYS).
CMD [".venv/bin/python", "-m", "gateway", "serve", "--host", "0.0.0.0", "--port", "8000", "--config", "configs/default.toml"]
