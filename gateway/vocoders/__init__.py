"""Neural vocoders that decode a latent to audio incrementally (torch)."""

import os

# torch's OpenMP pool reads this when torch loads: idle threads must not spin
# against the acoustic model's pool (see docs/engine.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
