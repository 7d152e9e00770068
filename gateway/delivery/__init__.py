"""The delivery pipeline: how a committed segment is spoken, the same on
both surfaces (the WebSocket's ``gateway.session.audio_stream`` and the
HTTP API's ``gateway.http.synthesis``)::

    segments (queue) -> engine job (segment.segment_job) -> resample,
    with its pauses (segment.SegmentAudio) -> the sink

* ``queue``: ``SegmentQueue``, the segments in order, the next one
  submitted while the current one decodes;
* ``segment``: ``segment_job`` (a segment's engine job, or a ``SilentJob``
  when it has nothing to speak) and ``SegmentAudio`` (its pause before, the
  job's events with the audio at the output rate, its pause after, and a
  failure classified once);
* ``silence``: ``SilentJob`` and the SSML ``<break>`` pauses as silence.

The sinks frame, encode and send; they decide what a failure means for
their client.  Not to be confused with ``gateway.engines.delivery``, the
engines' side (how an engine hands chunks to a job).
"""
