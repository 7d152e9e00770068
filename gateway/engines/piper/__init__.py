"""The Piper engine (``piper``): the default voice, streamed chunk by chunk.

Requires the ``gateway[piper]`` extra (piper-tts is GPL-3.0-or-later).
"""

import os

# torch's OpenMP pool reads this when torch loads; a spinning pool fights
# onnxruntime's on a small machine (measured: 2x latency on 2 cores).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from gateway.engines.piper.engine import PiperEngine

__all__ = ["PiperEngine"]
