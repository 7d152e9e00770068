"""Flow control and admission, in one place.

Everything that bounds how much a client may make the server hold or do:

* ``listener``: ``Listener``, the one model of a context's listener: how far
  ahead of it the context may send (``session.config.flow_control``:
  ``none``/``ack``/``realtime``), where it is at a cancel, and how much audio
  it has not heard yet (for the segmentation policy);
* ``budget``: ``DecodeBudget``, decoded but unsent audio one session may hold
  (``max_buffered_ms``), shared by its engine jobs;
* ``stall``: ``StallGuard``, the stall close policy (a send that waits
  ``stall_timeout_s`` for the client to read closes the connection with
  4008); the transport-specific close itself is in ``gateway.ws.outbound``
  (WebSocket) and ``gateway.http.outbound`` (HTTP responses);
* ``admission``: ``SlotQueue`` and ``AdmissionGate``, how many utterances
  (WebSocket) or responses (HTTP) synthesize at once across the server, how
  many one session may hold (``max_streams_per_session``), and the bounded,
  fair queue with a deadline in front of the slots;
* ``capacity``: ``SlotController``, automatic admission: the WebSocket slots
  follow the engine's lateness (``max_active_streams = 0``).

The transport's own write backpressure (a bounded send buffer) is in
``gateway.ws.outbound``; the engine-side bound on audio a job holds before the
consumer takes it is the engine's (``gateway.engines``).

This package imports nothing from the rest of the gateway except
``gateway.protocol`` and ``gateway.errors``: session, audio stream, HTTP and
engines all depend on it, never the other way round.
"""
