"""The harness's measurement logic on synthetic timings (no server, no clock)."""

from __future__ import annotations

import pytest

from gateway.bench.drivers import Record
from gateway.bench.measure import (
    Piece,
    percentile,
    playout,
    sentence_ready_times,
    summarize,
    tokenize,
)
from gateway.bench.report import performance_section, summary_table
from gateway.bench.runner import ratios, summary_line


def frames(start: float, count: int, every_s: float = 0.0, ms: float = 20.0) -> list[Piece]:
    return [Piece(arrival=start + i * every_s, duration_ms=ms) for i in range(count)]


def test_audio_faster_than_real_time_has_no_gap() -> None:
    heard = playout(frames(1.0, 50, every_s=0.005))
    assert heard.gaps == [] and heard.underruns == 0
    assert heard.start == 1.0 and heard.end == pytest.approx(2.0)
    assert heard.audio_ms == pytest.approx(1000.0)


def test_known_gap_is_one_underrun_of_its_length() -> None:
    # 10 frames (200 ms) at once, then the next frame 500 ms after the start
    pieces = frames(0.0, 10) + frames(0.5, 10)
    heard = playout(pieces)
    assert heard.underruns == 1
    assert heard.underrun_ms == pytest.approx(300.0)
    assert heard.gaps[0].start == pytest.approx(0.2) and heard.gaps[0].end == pytest.approx(0.5)


def test_gap_at_threshold_is_not_an_underrun() -> None:
    heard = playout(frames(0.0, 5) + frames(0.2, 5))  # 100 ms gap exactly
    assert len(heard.gaps) == 1 and heard.underruns == 0 and heard.starvations == 0


def test_prebuffer_absorbs_a_gap() -> None:
    pieces = frames(0.0, 10) + frames(0.5, 10)
    assert playout(pieces, prebuffer_ms=0).underruns == 1
    assert playout(pieces, prebuffer_ms=300).gaps == []


def test_tail_after_the_last_frame_is_not_an_underrun() -> None:
    heard = playout(frames(0.0, 10))
    assert heard.gaps == [] and heard.end == pytest.approx(0.2)


def test_input_starvation_is_not_an_underrun() -> None:
    # the text of the late audio reached the server only at 0.45 s; audio 0.5 s
    late = [Piece(arrival=0.5 + i * 0.001, duration_ms=20, ready_at=0.45) for i in range(10)]
    heard = playout(frames(0.0, 10) + late)
    assert heard.underruns == 0
    assert heard.starvations == 1
    assert heard.starvation_ms == pytest.approx(250.0)


def test_server_slow_after_the_text_arrived_is_an_underrun() -> None:
    # text ready at 0.25 s, audio at 0.5 s: 250 ms are the server's
    late = [Piece(arrival=0.5, duration_ms=20, ready_at=0.25)]
    heard = playout(frames(0.0, 10) + late)
    assert heard.underruns == 1 and heard.starvations == 0
    assert heard.underrun_ms == pytest.approx(250.0)


def test_sentence_ready_times_wait_for_the_next_visible_character() -> None:
    sends = [(1.0, "Hello"), (2.0, " there."), (3.0, " How"), (4.0, " are you?")]
    ready = sentence_ready_times(sends, ["Hello there.", "How are you?"], end_at=5.0)
    assert ready == [3.0, 5.0]


def test_sentence_ready_times_all_at_once() -> None:
    ready = sentence_ready_times([(1.0, "One. Two.")], ["One.", "Two."], end_at=1.5)
    assert ready == [1.0, 1.5]


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([5.0], 99, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        (list(range(1, 101)), 95, 95.05),
        (list(range(1, 101)), 99, 99.01),
        ([3.0, 1.0, 2.0], 0, 1.0),
        ([3.0, 1.0, 2.0], 100, 3.0),
    ],
)
def test_percentile_interpolates_linearly(values: list[float], q: float, expected: float) -> None:
    result = percentile(values, q)
    assert result == (None if expected is None else pytest.approx(expected))


def test_summarize_skips_missing_values() -> None:
    s = summarize([1.0, None, 3.0])
    assert s["n"] == 2 and s["p50"] == 2.0 and s["max"] == 3.0


def test_tokenize_round_trips() -> None:
    text = "Sure, I can help with that. It's 3.14 -- fine!"
    tokens = tokenize(text)
    assert "".join(tokens) == text
    assert tokens[:3] == ["Sure", ",", " I"]


def _record(scenario: str = "llm") -> Record:
    r = Record("gateway", scenario, 1, 0, 0, "Hello there. How are you?")
    r.sends = [(10.0, "Hello"), (10.1, " there."), (10.2, " How"), (10.3, " are you?")]
    r.done_at = 10.35
    r.sentences = ["Hello there.", "How are you?"]
    # sentence 0: 200 ms from 10.4; sentence 1 arrives at 10.9 (ready at 10.35)
    r.arrivals = [10.4 + i * 0.001 for i in range(10)] + [10.9 + i * 0.001 for i in range(10)]
    r.durations_ms = [20.0] * 20
    r.piece_sentence = [0] * 10 + [1] * 10
    return r


def test_record_measures() -> None:
    m = _record().measures()
    assert m["ttfa_first_token_ms"] == pytest.approx(400.0)
    assert m["ttfa_flush_ms"] == pytest.approx(50.0)
    assert m["underruns"] == 1 and m["underrun_ms"] == pytest.approx(300.0, abs=0.2)
    # the listener ran out after the first sentence's 200 ms
    assert m["first_underrun_at_ms"] == pytest.approx(200.0, abs=0.2)
    assert m["starvations"] == 0
    assert m["audio_ms"] == 400.0
    steady = _record()
    steady.arrivals = [10.4 + i * 0.001 for i in range(20)]
    assert steady.measures()["first_underrun_at_ms"] is None


def test_cancel_measures() -> None:
    r = _record("barge-in")
    r.cancel_at, r.last_frame_at, r.cancelled_at, r.cancelled = 10.5, 10.52, 10.53, True
    m = r.measures()
    assert m["cancel_to_report_ms"] == pytest.approx(30.0)
    assert m["cancel_to_last_frame_ms"] == pytest.approx(20.0)


def _results() -> list[dict[str, object]]:
    lines: list[dict[str, object]] = [
        {
            "kind": "run",
            "machine": {"cpu": "test", "cpus": 2, "platform": "x", "python": "3", "versions": {}},
            "settings": {
                "protocol": "gateway",
                "peer": "piper",
                "prebuffer_ms": 0.0,
                "token_rate": 20.0,
                "jitter": 0.5,
                "utterances": 1,
                "ttfa_target_ms": 1000.0,
            },
        }
    ]
    for target, ttfa in (("gateway", 100.0), ("piper", 400.0)):
        for scenario in ("flush", "llm"):
            r = _record(scenario)
            r.target = target
            m = r.measures()
            m["ttfa_flush_ms"] = m["ttfa_first_token_ms"] = ttfa
            lines.append(summary_line(target, scenario, 1, [m]))
        lines.append(
            {
                "kind": "capacity",
                "target": target,
                "held_level": 4 if target == "gateway" else 2,
                "ttfa_target_ms": 1000.0,
                "steps": [{"level": 1, "held": True, "ttfa_p95_ms": ttfa, "underruns": 0}],
            }
        )
    return lines


def test_ratios_and_readme_section() -> None:
    lines = _results()
    found = {
        (r["scenario"], r["measure"]): r["peer_over_target"]
        for r in ratios(lines, "gateway", "piper")  # type: ignore[arg-type]
    }
    assert found[("flush", "ttfa_flush_ms p50")] == 4.0
    assert found[("capacity", "held_level")] == 0.5
    section = performance_section(lines)  # type: ignore[arg-type]
    assert section.startswith("## Performance\n")
    assert "| 100 | 400 | 4.0x |" in section
    assert "python -m gateway bench --peer piper" in section
    assert "gateway" in summary_table(lines)  # type: ignore[arg-type]


def test_subclause_cuts_are_counted_from_the_segments_received() -> None:
    record = Record("gateway", "llm", 1, 0, 0, "text")
    record.sentences = ["Sure,", "I can help you", "plan a trip.", "Then we go"]
    # the last segment is the end of the input, whatever it ends in
    assert record.measures()["subclause_cuts"] == 1
    line = summary_line("gateway", "llm", 1, [record.measures(), record.measures()])
    assert line["subclause_cuts"] == 2 and line["segments"] == 8


def test_held_by_ttfa_stops_at_the_first_step_over_the_figure_or_with_a_gap() -> None:
    from gateway.bench.runner import held_by_ttfa

    def step(level: int, p95: float, gaps: int = 0) -> dict[str, object]:
        return {
            "level": level,
            "ttfa_p95_ms": p95,
            "errors": 0,
            "underruns": 0,
            "utterances_with_gap": gaps,
        }

    steps = [step(1, 300), step(2, 550), step(4, 700), step(6, 650), step(8, 900)]
    assert held_by_ttfa(steps, [600, 1000]) == {"600": 2, "1000": 8}  # type: ignore[arg-type]
    steps[1] = step(2, 550, gaps=1)
    assert held_by_ttfa(steps, [600, 1000]) == {"600": 1, "1000": 1}  # type: ignore[arg-type]


async def test_wyoming_events_round_trip_over_a_socket() -> None:
    import asyncio
    import json

    from gateway.bench.drivers import read_wyoming, write_wyoming

    received: list[tuple[str, dict[str, object], bytes] | None] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await read_wyoming(reader))
        received.append(await read_wyoming(reader))
        # an event with a payload, as wyoming-piper sends audio
        data = json.dumps({"rate": 22050, "width": 2, "channels": 1}).encode()
        header = {"type": "audio-chunk", "data_length": len(data), "payload_length": 4}
        writer.write(json.dumps(header).encode() + b"\n" + data + b"\x00\x01\x02\x03")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await write_wyoming(writer, "synthesize-chunk", {"text": " héllo"})
    await write_wyoming(writer, "synthesize-stop")
    event = await read_wyoming(reader)
    writer.close()
    server.close()
    assert received == [("synthesize-chunk", {"text": " héllo"}, b""), ("synthesize-stop", {}, b"")]
    assert event is not None and event[0] == "audio-chunk" and event[2] == b"\x00\x01\x02\x03"
    assert event[1]["rate"] == 22050
