"""``GatewayTTSService``: Pipecat's WebSocket TTS service for the voice gateway.

Modelled on Pipecat's own ``CartesiaTTSService``: one WebSocket per service,
one gateway context per Pipecat audio context (the Pipecat context id is the
gateway ``context_id``), ``run_tts`` sends ``input.text`` and returns at once,
a receive task routes audio and word timings to the audio context they
belong to, ``flush_audio`` sends ``input.done`` (the gateway speaks what is
buffered and ends the utterance with ``session.done``) and an interruption
sends ``cancel`` for the context without closing the socket.

Audio arrives as ``framing: "tagged"`` binary messages: each carries the
context number that ``audio.start`` announced, so contexts may interleave.
The session asks for the pipeline's output sample rate, PCM s16le, 20 ms
frames and ``flow_control: "realtime"``.

Resume (protocol 2.1.0, ``resume=True`` by default): when the connection
drops (no close frame, or a proxy's 1012-1014), Pipecat's reconnect takes
the same gateway session back with ``session.resume`` within the gateway's
``resume_window_s``: the audio continues where it stopped, text given
meanwhile is held and sent after it (only what the gateway lacks), and
nothing is reported lost.  The bookkeeping is ``voice_gateway_wire.resume``,
shared with the gateway's Python client and the LiveKit plugin.  Refused or
past the window, a new session starts and the text in flight is reported
as not spoken, as before.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from loguru import logger
from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.processors.frame_processor import FrameProcessorSetup
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from pipecat.transcriptions.language import Language
from pipecat.utils.types import NOT_GIVEN, NotGiven, is_given
from voice_gateway_wire.frames import unpack_frame
from voice_gateway_wire.resume import WINDOW_MARGIN_S, ResumeTracker, resume_url
from voice_gateway_wire.session import (
    ProtocolMismatch,
    check_protocol_version,
    engine_gives_word_timings,
    native_rate,
    resolve_language,
    session_config,
)
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

DEFAULT_URL = "ws://127.0.0.1:8000/v1/audio/speech/stream"
#: the longest wait for ``session.created`` / ``session.updated`` at connect
HANDSHAKE_TIMEOUT_S = 10.0


class ResumeRefused(ConnectionError):
    """The gateway would not give the session back: start a new one."""


@dataclass
class GatewayTTSSettings(TTSSettings):
    """Runtime-updatable settings (``TTSUpdateSettingsFrame``).

    Parameters:
        speed: Speaking rate, 0.25 to 4.0 (1.0 is the voice's own rate).
    """

    speed: float | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)


class GatewayTTSService(WebsocketTTSService):
    """Text to speech through a voice-gateway server's streaming WebSocket.

    Word timings from the gateway's ``alignment`` events become Pipecat's
    word timestamps, so the service pushes the spoken text itself
    (``push_text_frames=False``): an interrupted turn adds only what was heard
    to the LLM context.  When the engine declares no word timings the base
    class pushes each sentence's text instead.
    """

    Settings = GatewayTTSSettings
    _settings: GatewayTTSSettings
    #: settings that need a new ``session.config``; the change applies from
    #: the next gateway utterance, so the turn moves to a new context
    RECONFIGURE: ClassVar[frozenset[str]] = frozenset({"voice", "language", "speed"})

    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        sample_rate: int | None = None,
        settings: GatewayTTSSettings | None = None,
        max_lead_ms: int | None = None,
        keepalive_interval_s: float | None = None,
        text_aggregation_mode: TextAggregationMode | None = None,
        resume: bool = True,
        **kwargs: Any,
    ) -> None:
        """Create the service.

        Args:
            url: The gateway's ``/v1/audio/speech/stream`` WebSocket URL.
            api_key: Sent as ``Authorization: Bearer``; use an agent key
                (``agent_api_keys``) for a host running many calls.
            sample_rate: Output rate; ``None`` takes the pipeline's
                ``audio_out_sample_rate``.  The gateway resamples from the
                voice's native rate when they differ (see the README).
            settings: Voice, speed and language; ``None`` fields keep the
                gateway's defaults.
            max_lead_ms: ``realtime`` flow control's lead over real time
                (gateway default 1000 ms when ``None``).
            keepalive_interval_s: Seconds between keepalive pings while the
                socket is open; ``None`` is half the gateway's
                ``idle_timeout_s``.
            text_aggregation_mode: Pipecat's text aggregation; ``TOKEN``
                streams LLM tokens to the gateway's own segmenter.
            resume: Take the gateway session back after a dropped
                connection (``session.resume``, within the gateway's
                ``resume_window_s``) instead of starting a new one.
            **kwargs: Passed to ``WebsocketTTSService``.
        """
        default_settings = GatewayTTSSettings(model=None, voice=None, language=None, speed=None)
        if settings is not None:
            default_settings.apply_update(settings)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=False,
            pause_frame_processing=False,
            push_start_frame=True,
            sample_rate=sample_rate,
            settings=default_settings,
            **kwargs,
        )
        self._url = url
        self._api_key = api_key
        self._max_lead_ms = max_lead_ms
        self._keepalive_interval_s = keepalive_interval_s
        self._receive_task: asyncio.Task[None] | None = None
        #: ``session.created`` of the current connection
        self.server_info: dict[str, Any] = {}
        #: ``session.updated.config`` of the current connection
        self.effective_config: dict[str, Any] = {}
        self._word_timings = True
        #: tagged context number -> Pipecat context id (from ``audio.start``)
        self._numbers: dict[int, str] = {}
        self._resume = resume
        #: what resume needs: the token, what was received, the text of
        #: utterances not ended (reported as not spoken when the session is
        #: lost, never sent again on a new one)
        self._tracker = ResumeTracker()
        #: when the connection dropped and may be resumed (monotonic); None
        #: while connected or when it may not
        self._dropped_at: float | None = None
        #: contexts interrupted while disconnected: cancelled after the resume
        self._cancel_after_resume: set[str] = set()
        #: resumes that took the session back
        self.resumes = 0

    def can_generate_metrics(self) -> bool:
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        # the gateway accepts BCP-47 tags ("en-US"), Piper codes and names
        return str(language.value if isinstance(language, Language) else language)

    # ------------------------------------------------------------------
    # connection
    # ------------------------------------------------------------------
    # pipecat's FrameProcessor.setup narrows BaseObject.setup the same way
    async def setup(self, setup: FrameProcessorSetup) -> None:  # type: ignore[override]
        """The pipeline's output rate is known here: connect (as Cartesia's
        service does), so the first turn finds a configured session."""
        await super().setup(setup)
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._websocket is not None and self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        await self._cancel_keepalive_task()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        try:
            if self._websocket is not None and self._websocket.state is State.OPEN:
                return
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            websocket = await self._websocket_connect(
                self._url, additional_headers=headers, compression=None, max_size=None
            )
            try:
                await self._handshake(websocket)
            except BaseException:
                await websocket.close()
                raise
            self._websocket = websocket
            self._numbers.clear()
            interval = self._keepalive_interval_s or float(
                self.server_info.get("limits", {}).get("idle_timeout_s", 30.0) / 2
            )
            self._create_keepalive_task(interval)
            await self._call_event_handler("on_connected")
        except ProtocolMismatch as e:
            self._websocket = None
            await self.push_error(error_msg=str(e), exception=e, force_treat_as_permanent=True)
            await self._call_event_handler("on_connection_error", str(e))
        except Exception as e:
            self._websocket = None
            await self.push_error(error_msg=f"voice gateway connection failed: {e}", exception=e)
            await self._call_event_handler("on_connection_error", f"{e}")

    async def _handshake(self, websocket: Any) -> None:
        """``session.created`` (protocol version, engine capabilities), then
        ``session.config`` answered by ``session.updated``."""
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            created = json.loads(await websocket.recv())
            if created.get("type") == "error":
                raise ConnectionError(f"{created.get('code')}: {created.get('message')}")
            check_protocol_version(created)
            self.server_info = created
            self._tracker.new_session()
            self._tracker.created_message(created)
            self._word_timings = engine_gives_word_timings(created)
            # without word timings the base class pushes each sentence's text
            self._push_text_frames = not self._word_timings
            await websocket.send(json.dumps(self._session_config()))
            while True:
                reply = json.loads(await websocket.recv())
                self._tracker.event_message(reply)  # counted for session.resume
                if reply.get("type") == "session.updated":
                    self.effective_config = reply.get("config", {})
                    break
                if reply.get("type") == "error":
                    raise ConnectionError(f"{reply.get('code')}: {reply.get('message')}")
        voice = self.effective_config.get("voice")
        native = native_rate(created, voice if isinstance(voice, str) else None)
        if native is not None and native != self.sample_rate:
            logger.debug(
                f"{self}: the gateway resamples voice {voice} from {native} Hz to"
                f" {self.sample_rate} Hz (adds 20 to 115 ms at the start of a sentence)"
            )

    def _session_config(self) -> dict[str, Any]:
        s = self._settings
        voice = s.voice if is_given(s.voice) and s.voice else None
        language = str(s.language) if is_given(s.language) and s.language else None
        return session_config(
            sample_rate=self.sample_rate,
            voice=voice,
            speed=s.speed if is_given(s.speed) and s.speed else None,
            language=resolve_language(language, self.server_info, voice),
            timestamps=self._word_timings,
            max_lead_ms=self._max_lead_ms,
        )

    async def _disconnect_websocket(self) -> None:
        self._dropped_at = None  # a new session follows, if any: nothing to resume
        try:
            await self.stop_all_metrics()
            if self._websocket is not None:
                await self._websocket.close()
        except Exception as e:
            await self.push_error(error_msg=f"voice gateway close failed: {e}", exception=e)
        finally:
            self._websocket = None
            self._report_lost_text()
            await self._call_event_handler("on_disconnected")

    def _report_lost_text(self) -> None:
        """Text sent on a session that is gone was not (fully) spoken; it is
        reported, never re-sent on the next session."""
        unfinished = self._tracker.unfinished()
        self._tracker.ledger.clear()
        self._cancel_after_resume.clear()
        if unfinished:
            lost = " ".join(text.strip() for text in unfinished.values())
            logger.warning(f"{self}: connection lost; not spoken: {lost!r}")
            self.create_task(
                self.push_error(error_msg=f"voice gateway connection lost; not spoken: {lost!r}")
            )

    # ------------------------------------------------------------------
    # resume (protocol 2.1.0)
    # ------------------------------------------------------------------
    def _resumable(self) -> bool:
        """The connection dropped and the session may still be taken back."""
        return (
            self._dropped_at is not None
            and not self._disconnecting
            and time.monotonic() < self._dropped_at + self._tracker.window_s - WINDOW_MARGIN_S
        )

    async def _reconnect_websocket(self, attempt_number: int) -> bool:
        """Pipecat's reconnect: within the window, the same session
        (``session.resume``); a refusal or the window passing starts a new
        one as before.  A connection error is raised, so Pipecat tries again
        (with its backoff) while the window lasts."""
        if not self._resumable():
            return await super()._reconnect_websocket(attempt_number)
        logger.warning(f"{self}: connection dropped; resuming (attempt {attempt_number})")
        old, self._websocket = self._websocket, None
        if old is not None:
            await old.close()
        try:
            await self._resume_websocket()
        except ResumeRefused as e:
            logger.warning(f"{self}: {e}; starting a new session")
            self._dropped_at = None
            return await super()._reconnect_websocket(attempt_number)
        return True

    async def _resume_websocket(self) -> None:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        websocket = await self._websocket_connect(
            resume_url(self._url, self._tracker.token),
            additional_headers=headers,
            compression=None,
            max_size=None,
        )
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                own = json.loads(await websocket.recv())  # the new connection's own session
                if own.get("type") == "error":
                    raise ConnectionError(f"{own.get('code')}: {own.get('message')}")
                await websocket.send(json.dumps(self._tracker.resume_message()))
                created = json.loads(await websocket.recv())
                if created.get("type") != "session.created":
                    raise ResumeRefused(
                        f"resume refused: {created.get('code')}: {created.get('message')}"
                    )
                self._tracker.created_message(created)
                answer = self._tracker.resumed(json.loads(await websocket.recv()))
            # what the gateway sends again, then what it lacks of the text
            for _ in range(answer.replayed_messages):
                await self._handle_message(await websocket.recv())
            messages = self._tracker.resend(answer)
            while messages:
                for message in messages:
                    await websocket.send(json.dumps(message))
                messages = self._tracker.ledger.unsent()  # given meanwhile
            for context_id in sorted(self._cancel_after_resume):
                await websocket.send(json.dumps({"type": "cancel", "context_id": context_id}))
        except BaseException:
            await websocket.close()
            raise
        self.server_info = created
        self._cancel_after_resume.clear()
        self._dropped_at = None
        self._websocket = websocket
        self.resumes += 1
        logger.info(f"{self}: gateway session {created.get('session_id')} resumed")

    async def _send_keepalive(self) -> None:
        # the protocol's own ping: end to end, even through proxies that
        # answer WebSocket ping frames themselves
        await self._send({"type": "ping", "id": "keepalive"})

    async def _send(self, message: dict[str, Any]) -> None:
        if self._websocket is None:
            raise ConnectionError("not connected to the voice gateway")
        await self._websocket.send(json.dumps(message))

    # ------------------------------------------------------------------
    # contexts
    # ------------------------------------------------------------------
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send ``text`` to the gateway context ``context_id``; audio arrives
        on the receive task."""
        if not self._is_streaming_tokens and text and not text[-1].isspace():
            text += " "  # sentences arrive trimmed; the gateway joins increments as they are
        try:
            sent = await self._send_input(
                {"type": "input.text", "text": text, "context_id": context_id}
            )
            self._tracker.text(context_id, text, sent=sent)
            await self.start_tts_usage_metrics(text)
        except Exception as e:
            yield ErrorFrame(error=f"voice gateway send failed: {e}")
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None

    async def _send_input(self, message: dict[str, Any]) -> bool:
        """Send ``input.text`` / ``input.done``; False when it is held for a
        resume (the connection dropped and the session may be taken back:
        it goes out after the resume, as much as the gateway lacks)."""
        if self._resumable():
            return False
        if self._websocket is None or self._websocket.state is not State.OPEN:
            await self._connect()
        try:
            await self._send(message)
        except ConnectionClosed as e:
            self._note_close(e.rcvd.code if e.rcvd is not None else None)
            if self._resumable():
                return False
            raise
        return True

    async def flush_audio(self, context_id: str | None = None) -> None:
        """End the gateway utterance of the context: it speaks what is
        buffered and answers ``session.done``."""
        flush_id = context_id or self.get_active_audio_context_id()
        if not flush_id or (self._websocket is None and not self._resumable()):
            return
        try:
            sent = await self._send_input({"type": "input.done", "context_id": flush_id})
            self._tracker.done(flush_id, sent=sent)
        except Exception as e:
            await self.push_error(error_msg=f"voice gateway flush failed: {e}", exception=e)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: cancel the context on the gateway, keep the socket."""
        await self.stop_all_metrics()
        self._tracker.cancel(context_id)  # never sent again on a resume
        if context_id and self._resumable():
            self._cancel_after_resume.add(context_id)
        elif context_id and self._websocket is not None and self._websocket.state is State.OPEN:
            try:
                await self._send({"type": "cancel", "context_id": context_id})
            except Exception as e:
                logger.warning(f"{self}: cancel not sent: {e}")
        await super().on_audio_context_interrupted(context_id)

    # the signature of pipecat's TTSService._update_settings, itself narrower
    # than AIService's
    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:  # type: ignore[override]
        """Voice, language or speed changes send a new ``session.config``;
        the gateway applies it from the next utterance, so the turn's later
        sentences move to a new context (as Pipecat's Cartesia service does)."""
        changed = await super()._update_settings(delta)
        if not changed.keys() & self.RECONFIGURE:
            return changed
        if self._websocket is not None:
            config = self._session_config()
            try:
                await self._send(config)
            except Exception as e:
                await self.push_error(error_msg=f"voice gateway config failed: {e}", exception=e)
        if self._turn_context_id:
            await self._push_sequencer_frames(
                await self._aggregated_frame_sequencer.finalize(self._turn_context_id),
                self._turn_context_id,
            )
            if self.audio_context_available(self._turn_context_id):
                await self.flush_audio(context_id=self._turn_context_id)
            self._turn_context_id = None
            self._turn_context_id = self.create_context_id()
        return changed

    # ------------------------------------------------------------------
    # receiving
    # ------------------------------------------------------------------
    async def _receive_messages(self) -> None:
        websocket = self._websocket
        if websocket is None:
            raise ConnectionError("not connected to the voice gateway")
        try:
            async for message in websocket:
                await self._handle_message(message)
        finally:
            closed, code = websocket.state is State.CLOSED, websocket.close_code
            if closed and self._websocket is websocket:
                self._note_close(code)

    def _note_close(self, code: int | None) -> None:
        """The connection closed with ``code``: a drop of a session that can
        be resumed opens the window (Pipecat's reconnect then resumes)."""
        if (
            self._dropped_at is None
            and self._resume
            and self._reconnect_on_error  # nothing would reconnect otherwise
            and self._tracker.can_resume(code)
        ):
            self._dropped_at = time.monotonic()

    async def _handle_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            await self._handle_audio(message)
        else:
            event = json.loads(message)
            self._tracker.event_message(event)  # counted for session.resume
            await self._handle_event(event)

    async def _handle_audio(self, data: bytes) -> None:
        header, payload = unpack_frame(data)
        self._tracker.binary(header.context)  # counted for session.resume
        context_id = self._numbers.get(header.context)
        if context_id is None or header.is_wav_header or not payload:
            return
        if not self.audio_context_available(context_id):
            return  # interrupted: its audio is dropped until the cancel lands
        await self.append_to_audio_context(
            context_id,
            TTSAudioRawFrame(
                audio=bytes(payload),
                sample_rate=self.sample_rate,
                num_channels=1,
                context_id=context_id,
            ),
        )

    async def _handle_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        context_id = event.get("context_id")
        if kind == "audio.start" and isinstance(context_id, str):
            self._numbers[int(event["context_number"])] = context_id
        elif kind == "alignment" and isinstance(context_id, str):
            if self.audio_context_available(context_id):
                words = [(w["word"], float(w["start_ms"]) / 1000.0) for w in event["words"]]
                await self.add_word_timestamps(words, context_id)
        elif kind == "session.done" and isinstance(context_id, str):
            if self.audio_context_available(context_id):
                await self.stop_ttfb_metrics()
                await self.append_to_audio_context(
                    context_id, TTSStoppedFrame(context_id=context_id)
                )
                await self.remove_audio_context(context_id)
        elif kind == "session.updated":
            self.effective_config = event.get("config", {})
        elif kind == "error":
            await self._handle_error(event)

    async def _handle_error(self, event: dict[str, Any]) -> None:
        message = f"voice gateway error {event.get('code')}: {event.get('message')}"
        context_id = event.get("context_id")
        if event.get("fatal"):
            # the gateway closes the socket; the receive loop reconnects
            await self.push_error(error_msg=message)
            return
        refused = event.get("code") in {"busy", "text_too_long", "invalid_state", "rate_limited"}
        if refused and isinstance(context_id, str) and self.audio_context_available(context_id):
            # the text was not accepted: end the context rather than wait on it
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
        await self.push_error(error_msg=message)
