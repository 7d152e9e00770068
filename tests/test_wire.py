"""The wire package (integrations/wire, ``voice_gateway_wire``) against the gateway.

The gateway and both framework plugins share that package instead of keeping
copies; these tests fail when its copy of the error registry drifts from
``gateway.errors``, when the header the gateway sends stops matching the
fixture of frames ``gateway/web/frames.js`` is checked against, or when a
plugin starts to need the gateway itself.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from voice_gateway_wire import errors as wire_errors
from voice_gateway_wire import frames as wire_frames
from voice_gateway_wire import resume as wire_resume

from gateway import protocol
from gateway.audio import framing
from gateway.errors import ErrorCode
from gateway.session.created import session_resumed
from gateway.ws.endpoint import DROPPED
from tests.helpers import ROOT

WIRE = ROOT / "integrations" / "wire"
FIXTURE: dict[str, Any] = json.loads((WIRE / "tests" / "tagged_frames.json").read_text())


def test_the_wire_status_table_is_the_error_registrys() -> None:
    registry = {code.value: code.spec.http_status for code in ErrorCode}
    assert registry == wire_errors.ERROR_STATUS
    assert list(wire_errors.ERROR_STATUS) == list(registry)  # the same order, for readers


def test_the_wire_resume_codes_are_the_gateways() -> None:
    """What suspends a session on the server is what a client resumes, and
    the refusals it stops at are the registry's resume errors."""
    assert wire_resume.DROP_CLOSE_CODES == DROPPED
    registry = {code.value for code in ErrorCode if code.value.startswith("resume_")}
    assert registry == wire_resume.RESUME_REFUSALS


def test_the_browser_clients_resume_codes_are_the_gateways() -> None:
    """The browser client's copy of the drop and refusal codes
    (``gateway/web/resume.js``) is the server's, as the wire package's is."""
    source = (Path(__file__).parents[1] / "gateway/web/resume.js").read_text()

    def js_set(name: str) -> set[str]:
        match = re.search(rf"export const {name} = new Set\(\[([^\]]*)\]\)", source)
        assert match, name
        return {item.strip().strip('"') for item in match.group(1).split(",")}

    assert js_set("DROPPED") == {str(code) for code in DROPPED}
    assert js_set("REFUSALS") == wire_resume.RESUME_REFUSALS


def test_the_wire_resume_messages_are_the_protocols() -> None:
    tracker = wire_resume.ResumeTracker()
    tracker.created("token", 30.0)
    tracker.event("audio.start", "a", context_number=3)
    tracker.binary(3)
    tracker.event("audio.done", "a")
    message = protocol.client_decoder.decode(json.dumps(tracker.resume_message()))
    assert message == protocol.SessionResume(
        resume_token="token",
        received=[protocol.ReceivedMessages(context_id="a", messages=1)],
        events=2,
    )
    answer = session_resumed("s1", [("a", 7), (None, 0)], {"a": 1}, 4)
    read = tracker.resumed(json.loads(protocol.encode_text(answer)))
    assert read == wire_resume.Resumed({"a": 7, None: 0}, {"a": 1, None: 0}, 4)


def test_the_gateway_frames_with_the_wire_packages_header() -> None:
    assert framing.pack_header is wire_frames.pack_header
    assert framing.unpack_frame is wire_frames.unpack_frame
    assert framing.TaggedHeader is wire_frames.TaggedHeader


@pytest.mark.parametrize("case", FIXTURE["frames"], ids=lambda case: case["name"])
def test_the_gateway_packs_each_fixture_frame(case: dict[str, Any]) -> None:
    header = framing.TaggedHeader(
        context=case["context"],
        utterance_index=case["utterance_index"],
        sequence=case["sequence"],
        sample_offset=case["sample_offset"],
        flags=framing.FrameFlags(case["flags"]),
    )
    data = bytes.fromhex(case["hex"])
    assert framing.pack_header(header) + bytes.fromhex(case["payload_hex"]) == data
    assert framing.unpack_frame(data)[0] == header


def _requirement_names(pyproject: dict[str, Any]) -> set[str]:
    return {
        re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()
        for requirement in pyproject["project"]["dependencies"]
    }


def test_the_gateway_and_the_plugins_require_the_wire_package_by_name() -> None:
    gateway = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "voice-gateway-wire" in _requirement_names(gateway)
    wire = tomllib.loads((WIRE / "pyproject.toml").read_text())
    assert wire["project"]["dependencies"] == []  # pure Python: nothing comes with it
    for plugin in ("pipecat", "livekit"):
        pyproject = tomllib.loads((ROOT / "integrations" / plugin / "pyproject.toml").read_text())
        names = _requirement_names(pyproject)
        assert "voice-gateway-wire" in names, plugin
        assert "voice-gateway" not in names, plugin  # the gateway needs torch


def test_no_plugin_or_wire_module_imports_the_gateway() -> None:
    sources = sorted((ROOT / "integrations").glob("*/src/**/*.py"))
    assert len(sources) >= 7
    offenders = [
        str(path.relative_to(ROOT))
        for path in sources
        if re.search(r"^\s*(from|import)\s+gateway\b", path.read_text(), re.MULTILINE)
    ]
    assert offenders == []
