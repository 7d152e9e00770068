# The gateway in a container, installed through the same set-up script as a
# developer machine.  Docker cannot build on the project's development
# machines (no Docker engine there), so this file is untested here.
#
#   docker build -t voice-gateway .                          # CPU
#   docker build -t voice-gateway:cuda \
#     --build-arg TORCH_SPEC="torch==2.13.0" \
#     --build-arg ONNXRUNTIME_SPEC=onnxruntime-gpu .          # CUDA host
FROM python:3.11-slim

ARG TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
ARG ONNXRUNTIME_SPEC=onnxruntime
ENV TORCH_SPEC=${TORCH_SPEC} ONNXRUNTIME_SPEC=${ONNXRUNTIME_SPEC} \
    OMP_WAIT_POLICY=PASSIVE \
    GATEWAY_DATA_DIR=/data \
    PYTHONUNBUFFERED=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY scripts ./scripts
COPY gateway ./gateway
COPY web ./web
COPY configs ./configs
RUN scripts/setup serve && rm -rf /root/.cache/pip

VOLUME /data
EXPOSE 8000
# Inside the image the server must listen on all interfaces; it warns at
# start when no API key is set (GATEWAY_API_KEYS).
CMD [".venv/bin/python", "-m", "gateway", "serve", "--host", "0.0.0.0", "--port", "8000", "--config", "configs/default.toml"]
