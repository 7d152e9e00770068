"""The voice gateway's streaming wire format, shared by the gateway and its plugins.

Pure Python, no dependencies and no I/O (``testing`` aside): the gateway
(``gateway.audio.framing``, ``gateway.client``) and the Pipecat and LiveKit
plugins import the one implementation here, so none of them keeps a copy.

- ``frames``: the 20-byte tagged binary header (``framing: "tagged"``).
- ``errors``: the error registry's HTTP statuses, code by code.
- ``session``: what an agent plugin reads from ``session.created`` and the
  ``session.config`` it sends.
- ``resume``: a client's ``session.resume`` bookkeeping (what it received,
  the message that resumes, the text to send again after ``session.resumed``).
- ``testing``: a real gateway process on loopback and a proxy that drops
  connections, for the plugins' tests.

The reference is the gateway's ``docs/protocol.md`` and ``docs/audio.md``.
"""
