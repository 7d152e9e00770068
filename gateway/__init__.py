"""Real-time streaming text-to-speech gateway."""

__version__ = "0.1.0"
