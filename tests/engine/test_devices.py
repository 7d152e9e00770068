"""Device settings that cannot be honoured fail `serve` at once, loudly; under
``auto`` the choice made is logged.  On a CPU host (this suite's machines)
asking for CUDA must fail with a message that says what to install."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
import torch
from voice_gateway_wire.testing import free_port

from gateway.engines.piper.acoustic import onnx_providers
from gateway.engines.piper.engine import torch_device
from gateway.settings import SettingsError
from tests.helpers import ROOT

HAS_CUDA_PROVIDER = "CUDAExecutionProvider" in ort.get_available_providers()


def test_onnx_cuda_without_the_gpu_package_fails() -> None:
    if HAS_CUDA_PROVIDER:
        assert onnx_providers("cuda")[0] == "CUDAExecutionProvider"
        return
    with pytest.raises(SettingsError) as raised:
        onnx_providers("cuda")
    message = str(raised.value)
    assert "piper.onnx_provider=cuda" in message and "no CUDA provider" in message
    assert "onnxruntime-gpu" in message and "docs/gpu.md" in message


def test_torch_cuda_without_a_gpu_fails() -> None:
    if torch.cuda.is_available():
        assert torch_device("cuda").type == "cuda"
        return
    with pytest.raises(SettingsError) as raised:
        torch_device("cuda")
    assert "piper.device=cuda" in str(raised.value) and "docs/gpu.md" in str(raised.value)


def test_auto_logs_what_runs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gateway.engines.piper"):
        providers = onnx_providers("auto")
        device = torch_device("auto")
    expected = "CUDAExecutionProvider" if HAS_CUDA_PROVIDER else "CPUExecutionProvider"
    assert providers[0] == expected
    assert f"piper.onnx_provider=auto: acoustic models on {expected}" in caplog.text
    assert f"piper.device=auto: the vocoder runs on {device}" in caplog.text


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("GATEWAY_PIPER_ONNX_PROVIDER", "piper.onnx_provider=cuda"),
        ("GATEWAY_PIPER_DEVICE", "piper.device=cuda"),
    ],
)
def test_serve_refuses_to_start(tmp_path: Path, setting: str, needle: str) -> None:
    if setting == "GATEWAY_PIPER_ONNX_PROVIDER" and HAS_CUDA_PROVIDER:
        pytest.skip("onnxruntime-gpu is installed: onnx_provider=cuda can be honoured")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GATEWAY_DATA_DIR": str(tmp_path),
        # no GPU visible to torch, even on a CUDA host
        "CUDA_VISIBLE_DEVICES": "",
        setting: "cuda",
    }
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--port", str(free_port())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"error: {needle}" in done.stderr
    assert "Traceback" not in done.stderr
    assert "Uvicorn running" not in done.stdout + done.stderr
