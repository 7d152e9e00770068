"""Shared bits of the HTTP API tests: decoding responses, reading /metrics."""

from __future__ import annotations

import io
import re

import httpx
import numpy as np
import soundfile as sf

#: OpenAI's SDK wants a key even when the server needs none
API_KEY = "unused"


def decode(data: bytes, response_format: str, rate: int = 24_000) -> tuple[np.ndarray, int]:
    """Decode a response body to float samples and their rate."""
    if response_format == "pcm":
        ints = np.frombuffer(data, dtype="<i2")
        return ints.astype(np.float32) / 32768.0, rate
    audio, sr = sf.read(io.BytesIO(data), dtype="float32")
    return np.asarray(audio), int(sr)


def metric(base_url: str, name: str) -> float:
    text = httpx.get(base_url + "/metrics").text
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))
