"""The tagged binary header in front of every audio message under ``framing: "tagged"``.

A fixed 20-byte little-endian header (``struct`` format ``<BBHIIQ``)::

    offset size type meaning
    0      1    u8   version, 1
    1      1    u8   flags: bit 0 first frame of a sentence, bit 1 last frame
                     of a sentence, bit 2 the payload is a WAV header;
                     other bits reserved (sent as 0, ignored by readers)
    2      2    u16  context number, announced in ``audio.start``
    4      4    u32  utterance index
    8      4    u32  sequence number, per context, from 0
    12     8    u64  sample offset: samples since the start of the utterance,
                     at the output rate

followed by the payload.  The gateway's ``docs/audio.md`` is the reference
for clients; ``gateway/web/frames.js`` reads the same header and is checked
against the same fixture of frames as this module.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

TAGGED_VERSION: Final = 1
_HEADER = struct.Struct("<BBHIIQ")
#: bytes in a tagged header
HEADER_SIZE: Final = _HEADER.size


class FrameFlags(enum.IntFlag):
    """Bits of the tagged header's flags byte."""

    NONE = 0
    FIRST = 1  #: first frame of a sentence
    LAST = 2  #: last frame of a sentence
    WAV_HEADER = 4  #: the payload is a WAV header, not samples


@dataclass(frozen=True)
class TaggedHeader:
    """The fixed header in front of every binary message in tagged framing."""

    context: int  #: context number (u16), announced in ``audio.start``
    utterance_index: int  #: u32, counts per session
    sequence: int  #: u32, per context, from 0
    sample_offset: int  #: u64, samples since the utterance start at the output rate
    flags: FrameFlags = FrameFlags.NONE
    version: int = TAGGED_VERSION

    @property
    def is_wav_header(self) -> bool:
        """Whether the payload is a WAV header (``response_format: "wav"``), not samples."""
        return bool(self.flags & FrameFlags.WAV_HEADER)


def pack_header(header: TaggedHeader) -> bytes:
    """The 20 header bytes; ValueError if a field does not fit its type."""
    try:
        return _HEADER.pack(
            header.version,
            int(header.flags),
            header.context,
            header.utterance_index,
            header.sequence,
            header.sample_offset,
        )
    except struct.error as exc:
        raise ValueError(f"tagged header field out of range: {exc}") from None


def unpack_frame(data: bytes | bytearray | memoryview) -> tuple[TaggedHeader, memoryview]:
    """Split a tagged binary message into its header and a view of its payload.

    Raises ValueError when the message is shorter than a header or its version
    is not one this package speaks.  Reserved flag bits are kept, not rejected.
    """
    view = memoryview(data).cast("B")
    if len(view) < HEADER_SIZE:
        raise ValueError(f"tagged frame too short: {len(view)} bytes, header is {HEADER_SIZE}")
    version, flags, context, utterance_index, sequence, sample_offset = _HEADER.unpack_from(view)
    if version != TAGGED_VERSION:
        raise ValueError(f"unknown tagged frame version {version}; expected {TAGGED_VERSION}")
    header = TaggedHeader(
        context=context,
        utterance_index=utterance_index,
        sequence=sequence,
        sample_offset=sample_offset,
        flags=FrameFlags(flags),
        version=version,
    )
    return header, view[HEADER_SIZE:]
