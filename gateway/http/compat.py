"""Where OpenAI and vllm-omni 0.30 disagree about ``POST /v1/audio/speech``,
and how the gateway chooses: per request where the body says which camp it
is from, by the ``http_compat`` setting where it cannot.

=========================================  ===================  =====================
body                                       ``openai`` (default)  ``vllm-omni``
=========================================  ===================  =====================
no ``response_format``                     ``mp3``              ``wav``
neither ``stream`` nor ``stream_format``   streamed body        one whole file
=========================================  ===================  =====================

Decided by the body alone, the same under both settings:

* ``stream_format: "audio"`` / ``"sse"``: a streamed body / SSE (both camps
  agree; given, it wins over ``stream``, as in vllm-omni 0.30);
* ``stream: true`` alone: SSE.  Only vllm-omni has the ``stream`` field
  (OpenAI's API and SDK have ``stream_format`` only), so its meaning is
  vllm-omni 0.30's (``OpenAICreateSpeechRequest.is_sse_stream``);
* ``stream: false`` alone: one whole file;
* a ``flac`` body with neither field: one whole file under both (a
  streamed FLAC's length is "unknown", which libsndfile cannot read).

Pure: no I/O, no settings object (the caller passes the one value).
"""

from __future__ import annotations

from typing import Literal

HttpCompat = Literal["openai", "vllm-omni"]
Mode = Literal["file", "audio", "sse"]

#: each camp's ``response_format`` when the body has none
DEFAULT_FORMAT: dict[HttpCompat, str] = {"openai": "mp3", "vllm-omni": "wav"}
#: each camp's answer to a body with neither ``stream`` nor ``stream_format``
UNSAID_MODE: dict[HttpCompat, Mode] = {"openai": "audio", "vllm-omni": "file"}
#: formats whose streamed form lacks what a whole-file reader needs: a
#: streamed FLAC's STREAMINFO says "total samples unknown", which libsndfile
#: cannot read, and the openai SDK's ``speech.create`` reads the body whole.
#: Unless a client asks for a stream (``stream_format``, ``stream: true``),
#: these come back as one complete file with exact headers.
WHOLE_BY_DEFAULT: frozenset[str] = frozenset({"flac"})
STREAM_FORMATS: tuple[str, ...] = ("audio", "sse")


def default_format(compat: HttpCompat) -> str:
    return DEFAULT_FORMAT[compat]


def response_mode(
    stream: bool | None, stream_format: str | None, response_format: str, compat: HttpCompat
) -> Mode | None:
    """How a single request's audio goes back; None when ``stream_format``
    is not one of ``STREAM_FORMATS`` (the caller words that error)."""
    if stream_format is not None:
        if stream_format not in STREAM_FORMATS:
            return None
        return "sse" if stream_format == "sse" else "audio"
    if stream is True:
        return "sse"
    if stream is False or response_format in WHOLE_BY_DEFAULT:
        return "file"
    return UNSAID_MODE[compat]
