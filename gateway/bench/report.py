"""Turn a run's JSON lines into a terminal table, an HTML report and the
README's "Performance" section.

The report is one self-contained HTML file with inline SVG (no plotting
dependency, opens anywhere): the CDF of time to first audio, p95 time to first
audio and underruns against concurrency, and a timeline of a few ``llm``
sessions.  ``performance_section`` is pure so a test can check the README
against the committed results file.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: the command of the committed results file (``bench/results/latest.jsonl``):
#: the default capacity ladder, and the gateway's load scenarios, which the
#: section shows when a run has them
REPRODUCE = (
    "python -m gateway bench --peer piper --peer wyoming --utterances 20"
    " --scenarios flush,llm,barge-in,capacity,http-load,overload"
    " --out bench/results/latest.jsonl --report bench/results/latest.html"
)
MARKDOWN_REPRODUCE = (
    "python -m gateway bench --peer piper --peer wyoming --corpus markdown --scenarios llm"
    " --utterances 20 --out bench/results/markdown.jsonl --report bench/results/markdown.html"
)
#: the Markdown run's results, beside the main results file
MARKDOWN_RESULTS = "markdown.jsonl"
README_HEADING = "## Performance"
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


def _stagger(settings: dict[str, Any]) -> str:
    stagger = settings.get("capacity_stagger_s") or 0
    starts = f"starts spread over {stagger:g} s" if stagger else "all starting at once"
    # (runs before round 14 sent each reply as soon as the last had arrived)
    turns = {"conversation": ", taking turns with their listeners"}
    return f" ({starts}{turns.get(settings.get('capacity_turns', ''), '')})"


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _summaries(lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["kind"] == "summary"]


def _step(step: dict[str, Any]) -> str:
    cuts = step.get("subclause_cuts")
    return (
        f"x{step['level']} p95 {_fmt(step['ttfa_p95_ms'])} ms {step['underruns']} underruns"
        + ("" if cuts is None else f" {cuts} sub-clause cuts")
        + ("" if step["held"] else " (failed)")
    )


def load_sentences(lines: Sequence[dict[str, Any]]) -> list[str]:
    """One line per ``http-load`` level and ``overload`` run (the gateway's
    own surfaces; no peer has them), for the terminal and the README."""
    out = []
    for load in (line for line in lines if line["kind"] == "http_load"):
        ttfp = load["ttfp_ms"]
        out.append(
            f"http-load x{load['level']}: {load['requests']} requests, {load['failed']} failed"
            f" ({load['busy_503']} busy); ttfp p50 {_fmt(ttfp['p50'])} p95 {_fmt(ttfp['p95'])}"
            f" p99 {_fmt(ttfp['p99'])} ms"
        )
    for over in (line for line in lines if line["kind"] == "overload"):
        busy_ms = over["busy_answered_after_first_text_ms"]
        waited = over.get("busy_queue_waited_ms")  # servers of protocol 1.4 on
        queue = (
            ""
            if waited is None
            else f" from the first token; at most {_fmt(waited['max'])} ms in the admission"
            f" queue, {over['busy_refused_at_once']} refused at once"
        )
        out.append(
            f"overload {over['level']} sessions: {over['admitted']} admitted"
            f" ({over['admitted_with_gap']} with a gap), {over['busy']} busy"
            f" ({over['busy_with_retry_advice']} with retry advice, answered by"
            f" {_fmt(busy_ms['max'])} ms{queue}), other errors {over['other_errors']}; RSS MiB"
            f" {over['rss_mib']}"
        )
    return out


def summary_table(lines: Sequence[dict[str, Any]]) -> str:
    """The terminal summary: one row per target, scenario and level."""
    rows = [
        (
            "target", "scenario", "users", "n", "ttfa p50", "ttfa p95", "ttfa p99",
            "underruns", "starved", "rtf p50", "cancel p95",
        )
    ]  # fmt: skip
    for s in _summaries(lines):
        key = "ttfa_flush_ms" if s["scenario"] in ("flush", "barge-in") else "ttfa_first_token_ms"
        ttfa = s[key]
        cancel = s.get("cancel_to_report_ms", {}).get("p95")
        rows.append(
            (
                s["target"],
                s["scenario"],
                str(s["level"]),
                str(s["utterances"]),
                _fmt(ttfa["p50"]),
                _fmt(ttfa["p95"]),
                _fmt(ttfa["p99"]),
                _fmt(s.get("underruns")),
                _fmt(s.get("starvations")),
                _fmt(s.get("compute_rtf", {}).get("p50"), 3),
                _fmt(cancel),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    text = "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    for cap in (line for line in lines if line["kind"] == "capacity"):
        text += (
            f"\ncapacity {cap['target']}: {_fmt(cap['held_level'])} concurrent sessions held"
            f" (p95 ttfa <= {cap['ttfa_target_ms']:.0f} ms, no underrun)"
            + "".join(
                f"; {_fmt(held)} with p95 <= {ms} ms and no gap"
                for ms, held in cap.get("held_by_ttfa_ms", {}).items()
            )
            + "; steps: "
            + ", ".join(_step(s) for s in cap["steps"])
        )
    for sentence in load_sentences(lines):
        text += "\n" + sentence
    for h in (line for line in lines if line["kind"] == "harness"):
        text += f"\nharness CPU {h['cpu_s']} s over {h['wall_s']} s wall"
    return text


# --- SVG ----------------------------------------------------------------------------------------


class _Chart:
    def __init__(self, title: str, xlabel: str, ylabel: str, w: int = 560, h: int = 300) -> None:
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel
        self.w, self.h = w, h
        self.left, self.right, self.top, self.bottom = 60, 130, 30, 40
        self.parts: list[str] = []
        self.legend: list[tuple[str, str]] = []

    def frame(self, xmax: float, ymax: float) -> None:
        self.xmax, self.ymax = max(xmax, 1e-9), max(ymax, 1e-9)

    def x(self, v: float) -> float:
        return self.left + (self.w - self.left - self.right) * v / self.xmax

    def y(self, v: float) -> float:
        return self.h - self.bottom - (self.h - self.top - self.bottom) * v / self.ymax

    def line(self, points: Sequence[tuple[float, float]], color: str, label: str) -> None:
        path = " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in points)
        self.parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>'
        )
        for a, b in points if len(points) < 20 else []:
            self.parts.append(
                f'<circle cx="{self.x(a):.1f}" cy="{self.y(b):.1f}" r="3" fill="{color}"/>'
            )
        self.legend.append((color, label))

    def render(self) -> str:
        axes = []
        for i in range(5):
            xv, yv = self.xmax * i / 4, self.ymax * i / 4
            axes.append(
                f'<text x="{self.x(xv):.1f}" y="{self.h - self.bottom + 15}" font-size="10"'
                f' text-anchor="middle">{xv:.3g}</text>'
                f'<text x="{self.left - 5}" y="{self.y(yv) + 3:.1f}" font-size="10"'
                f' text-anchor="end">{yv:.3g}</text>'
                f'<line x1="{self.left}" x2="{self.w - self.right}" y1="{self.y(yv):.1f}"'
                f' y2="{self.y(yv):.1f}" stroke="#eee"/>'
            )
        legend = "".join(
            f'<rect x="{self.w - self.right + 10}" y="{self.top + 16 * i}" width="10" height="10"'
            f' fill="{c}"/><text x="{self.w - self.right + 24}" y="{self.top + 16 * i + 9}"'
            f' font-size="11">{html.escape(label)}</text>'
            for i, (c, label) in enumerate(self.legend)
        )
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}"'
            f' font-family="sans-serif">'
            f'<text x="{self.left}" y="18" font-size="13" font-weight="bold">'
            f"{html.escape(self.title)}</text>"
            + "".join(axes)
            + f'<line x1="{self.left}" x2="{self.left}" y1="{self.top}"'
            f' y2="{self.h - self.bottom}" stroke="#000"/>'
            f'<line x1="{self.left}" x2="{self.w - self.right}" y1="{self.h - self.bottom}"'
            f' y2="{self.h - self.bottom}" stroke="#000"/>'
            f'<text x="{(self.left + self.w - self.right) / 2}" y="{self.h - 5}" font-size="11"'
            f' text-anchor="middle">{html.escape(self.xlabel)}</text>'
            f'<text x="12" y="{self.h / 2}" font-size="11" text-anchor="middle"'
            f' transform="rotate(-90 12 {self.h / 2})">{html.escape(self.ylabel)}</text>'
            + "".join(self.parts)
            + legend
            + "</svg>"
        )


def _ttfa_cdf(lines: Sequence[dict[str, Any]]) -> str:
    chart = _Chart("Time to first audio (CDF)", "ms", "fraction of utterances")
    series: list[tuple[str, list[float]]] = []
    for scenario, key in (("flush", "ttfa_flush_ms"), ("llm", "ttfa_first_token_ms")):
        targets = sorted({m["target"] for m in lines if m.get("scenario") == scenario})
        for target in targets:
            values = sorted(
                m[key]
                for m in lines
                if m["kind"] == "utterance"
                and m["scenario"] == scenario
                and m["target"] == target
                and m.get(key) is not None
            )
            if values:
                series.append((f"{target} {scenario}", values))
    chart.frame(max((v[-1] for _, v in series), default=1.0), 1.0)
    for i, (label, values) in enumerate(series):
        n = len(values)
        points = [(v, (k + 1) / n) for k, v in enumerate(values)]
        chart.line([(values[0], 0.0), *points], COLORS[i % len(COLORS)], label)
    return chart.render()


def _capacity_charts(lines: Sequence[dict[str, Any]]) -> str:
    caps = [line for line in lines if line["kind"] == "capacity"]
    if not caps:
        return "<p>No capacity run.</p>"
    out = []
    for field, title, label in (
        ("ttfa_p95_ms", "p95 time to first audio against concurrency", "ms"),
        ("underruns", "Underruns against concurrency", "underruns"),
    ):
        chart = _Chart(title, "concurrent sessions", label)
        xmax = max(s["level"] for c in caps for s in c["steps"])
        ymax = max((s[field] or 0) for c in caps for s in c["steps"])
        chart.frame(xmax, max(ymax * 1.1, 1.0))
        for i, cap in enumerate(caps):
            chart.line(
                [(s["level"], s[field] or 0) for s in cap["steps"]],
                COLORS[i % len(COLORS)],
                cap["target"],
            )
        out.append(chart.render())
    return "".join(out)


def _timelines(lines: Sequence[dict[str, Any]]) -> str:
    rows = [line for line in lines if line["kind"] == "timeline"]
    if not rows:
        return "<p>No timelines recorded.</p>"
    w, row_h, left = 900, 34, 150

    def playout_end(r: dict[str, Any]) -> float:
        cursor = 0.0
        for a, d in zip(r["arrivals_ms"], r["durations_ms"], strict=True):
            cursor = max(cursor, a) + d
        return float(max([cursor, *r["sends_ms"]]))

    end = max(playout_end(r) for r in rows)
    scale = (w - left - 20) / max(end, 1.0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{row_h * len(rows) + 40}"'
        ' font-family="sans-serif"><text x="4" y="14" font-size="13" font-weight="bold">'
        "Timelines (llm): text sent (ticks), audio arrivals (blue) and playout (green)</text>"
    ]
    for i, r in enumerate(rows):
        y = 30 + i * row_h
        parts.append(
            f'<text x="4" y="{y + 14}" font-size="11">{html.escape(r["target"])}'
            f" #{r['user']}.{r['index']}</text>"
        )
        for t in r["sends_ms"]:
            parts.append(
                f'<line x1="{left + t * scale:.1f}" x2="{left + t * scale:.1f}" y1="{y}"'
                f' y2="{y + 8}" stroke="#555"/>'
            )
        cursor = None
        for a, d in zip(r["arrivals_ms"], r["durations_ms"], strict=True):
            cursor = a if cursor is None or a > cursor else cursor
            parts.append(
                f'<rect x="{left + a * scale:.1f}" y="{y + 10}" width="1.5" height="8"'
                ' fill="#1f77b4"/>'
                f'<rect x="{left + cursor * scale:.1f}" y="{y + 20}"'
                f' width="{max(d * scale, 0.5):.1f}" height="8" fill="#2ca02c"/>'
            )
            cursor += d
    parts.append("</svg>")
    return "".join(parts)


def write_report(lines: Sequence[dict[str, Any]], path: Path) -> None:
    run = next((line for line in lines if line["kind"] == "run"), {})
    body = (
        "<!doctype html><meta charset='utf-8'><title>voice-gateway benchmark</title>"
        "<body style='font-family:sans-serif;max-width:960px;margin:auto'>"
        "<h1>voice-gateway benchmark</h1>"
        f"<pre>{html.escape(summary_table(lines))}</pre>"
        + _ttfa_cdf(lines)
        + _capacity_charts(lines)
        + _timelines(lines)
        + "<h2>Machine and settings</h2><pre>"
        + html.escape(json.dumps(run, indent=2))
        + "</pre><p>Definitions: docs/benchmarks.md</p></body>"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body, encoding="utf-8")


# --- README ------------------------------------------------------------------------------------


def _summary(lines: Sequence[dict[str, Any]], target: str, scenario: str) -> dict[str, Any] | None:
    for s in _summaries(lines):
        if s["target"] == target and s["scenario"] == scenario:
            return s
    return None


def _held(cap: dict[str, Any] | None) -> str:
    if cap is None:
        return "n/a"
    return str(cap["held_level"] or 0)


def _measured_code(source: dict[str, Any] | None) -> str:
    """`` Code: commit abc123def456.`` (results files from before the commit
    was recorded have no ``source``: nothing is said)."""
    if not source:
        return ""
    if source.get("commit", "unknown") == "unknown":
        return " Code: an installed package (commit unknown)."
    dirty = " with uncommitted changes" if source.get("dirty") else ""
    return f" Code: commit {str(source['commit'])[:12]}{dirty}."


PEER_NAMES = {"piper": "Piper's HTTP server", "wyoming": "wyoming-piper"}


def _peers(settings: dict[str, Any]) -> list[str]:
    """The peers of a run (one name in older results files, a list since)."""
    peer = settings.get("peer")
    if not peer:
        return []
    return [peer] if isinstance(peer, str) else list(peer)


Row = tuple[str, str, list[str]]


def _ratio(a: str, b: str) -> str:
    try:
        return f"{float(b) / float(a):.1f}x"
    except (ValueError, ZeroDivisionError):
        return "-"


def _table(target: str, peers: Sequence[str | None], rows: Sequence[Row]) -> list[str]:
    """Rows (label, the gateway's cell, the peers' cells) as a Markdown
    table with each peer's ratio to the gateway: for times ("(ms)", "(s)"),
    peer / gateway; for capacity, how many more sessions the gateway held."""
    names = [PEER_NAMES.get(peer, "-") if peer else "-" for peer in peers]
    table = [
        f"| measure | gateway ({target} protocol) | "
        + " | ".join(f"{name} | {name} / gateway" for name in names)
        + " |",
        "|---|---|" + "---|---|" * len(peers),
    ]
    for label, a, bs in rows:
        cells = []
        for b in bs:
            r = _ratio(a, b) if "(ms)" in label or "(s)" in label else "-"
            if label.startswith("capacity") and a not in ("-", "n/a") and b not in ("-", "n/a"):
                r = f"{float(a) / max(float(b), 1e-9):.1f}x more sessions" if float(b) else "-"
            cells.append(f"{b} | {r}")
        table.append(f"| {label} | {a} | " + " | ".join(cells) + " |")
    return table


def _llm_rows(
    lines: Sequence[dict[str, Any]], target: str, peers: Sequence[str | None]
) -> list[Row]:
    """The ``llm`` scenario of a Markdown run: first audio, gaps, and the
    audio heard (a reader that speaks the markup makes more of it)."""

    def summary(who: str | None) -> dict[str, Any] | None:
        return _summary(lines, who, "llm") if who else None

    def first(who: str | None, q: str) -> str:
        s = summary(who)
        return _fmt(s["ttfa_first_token_ms"][q]) if s else "-"

    def gaps(who: str | None) -> str:
        s = summary(who)
        return f"{s['utterances_with_gap']} / {s['utterances']}" if s else "-"

    spoken: dict[str, dict[int, float]] = {}
    for u in lines:
        if u["kind"] == "utterance" and u["scenario"] == "llm" and not u.get("error"):
            spoken.setdefault(u["target"], {})[u["index"]] = u["audio_ms"]
    common = set.intersection(*(set(by) for by in spoken.values())) if spoken else set()

    def audio(who: str | None) -> str:
        by = spoken.get(who or "")
        return f"{sum(by[i] for i in common) / 1000:.1f}" if by and common else "-"

    rows: list[Row] = [
        (f"time to first audio, from the first token, {q} (ms)", first(target, q),
         [first(p, q) for p in peers])
        for q in ("p50", "p95")
    ]  # fmt: skip
    rows.append(("utterances with a gap over 100 ms / all", gaps(target), [gaps(p) for p in peers]))
    rows.append(
        (
            f"audio of the {len(common)} replies every target spoke (s)",
            audio(target),
            [audio(p) for p in peers],
        )
    )
    return rows


def _failures(lines: Sequence[dict[str, Any]]) -> list[str]:
    """A sentence for each target whose run stopped at a failed utterance."""
    out = []
    for u in lines:
        if u["kind"] == "utterance" and u.get("error"):
            name = PEER_NAMES.get(u["target"], u["target"])
            out.append(
                f"{name} failed reply {u['index'] + 1} (`{u['error']}`); its figures cover the"
                " replies before it."
            )
    return [" ".join(out), ""] if out else []


def markdown_section(lines: Sequence[dict[str, Any]]) -> list[str]:
    """The Performance section's part on Markdown replies (``--corpus
    markdown``), from its own results file."""
    run = next(line for line in lines if line["kind"] == "run")
    settings = run["settings"]
    target = settings["protocol"]
    peers: list[str | None] = [*_peers(settings)] or [None]
    return [
        "### Markdown replies",
        "",
        f"The `llm` scenario with the Markdown/emoji replies of"
        f" `bench/text_corpus/markdown.jsonl` ({settings['utterances']} utterances, tokens at"
        f" {settings['token_rate']:.0f}/s): the gateway's text front-end reads them; the peers"
        " have none and read the markup aloud, so their audio is longer.",
        "",
        *_table(target, peers, _llm_rows(lines, target, peers)),
        "",
        *_failures(lines),
        f"Machine: load average {run['machine'].get('loadavg_1m_at_start')} at the start."
        + _measured_code(run.get("source")),
        "",
        "```bash",
        MARKDOWN_REPRODUCE,
        "python -m gateway bench-readme",
        "```",
        "",
    ]


def performance_section(
    lines: Sequence[dict[str, Any]], markdown: Sequence[dict[str, Any]] | None = None
) -> str:
    """The README's "Performance" section, generated from one results file
    (and a Markdown run's, when there is one)."""
    run = next(line for line in lines if line["kind"] == "run")
    machine = run["machine"]
    settings = run["settings"]
    target = settings["protocol"]
    peers: list[str | None] = [*_peers(settings)] or [None]
    caps = {line["target"]: line for line in lines if line["kind"] == "capacity"}
    harness = next((line for line in lines if line["kind"] == "harness"), None)

    def cell(who: str | None, scenario: str, key: str, q: str) -> str:
        if who is None:
            return "-"
        s = _summary(lines, who, scenario)
        if s is None or key not in s:
            return "n/a"
        return _fmt(s[key][q])

    rows: list[Row] = []
    for label, scenario, key in (
        ("time to first audio, `flush`, from `input.done`", "flush", "ttfa_flush_ms"),
        ("time to first audio, `llm`, from the first token", "llm", "ttfa_first_token_ms"),
    ):
        for q in ("p50", "p95"):
            rows.append(
                (
                    f"{label}, {q} (ms)",
                    cell(target, scenario, key, q),
                    [cell(peer, scenario, key, q) for peer in peers],
                )
            )

    def underruns(summary: dict[str, Any] | None, missing: str) -> str:
        if not summary:
            return missing
        return f"{summary['sessions_with_underrun']} / {summary['utterances']}"

    for scenario in ("flush", "llm"):
        rows.append(
            (
                f"underruns, `{scenario}` (utterances with one / all)",
                underruns(_summary(lines, target, scenario), "n/a"),
                [
                    underruns(_summary(lines, peer, scenario) if peer else None, "-")
                    for peer in peers
                ],
            )
        )
    llm_summary = _summary(lines, target, "llm")
    if llm_summary is not None and "subclause_cuts" in llm_summary:
        rows.append(
            (
                "`llm`: utterances with a gap over 100 ms / segments cut below clause level",
                f"{llm_summary['utterances_with_gap']} / {llm_summary['subclause_cuts']}",
                [
                    (
                        f"{s['utterances_with_gap']} / {s['subclause_cuts']}"
                        if peer and (s := _summary(lines, peer, "llm"))
                        else "-"
                    )
                    for peer in peers
                ],
            )
        )
    rows.append(
        (
            f"capacity: concurrent `{settings.get('capacity_pacing', 'llm')}` sessions"
            + _stagger(settings)
            + " with p95 first audio"
            f" <= {settings['ttfa_target_ms']:.0f} ms and no underrun",
            _held(caps.get(target)),
            [_held(caps.get(peer)) if peer else "-" for peer in peers],
        )
    )
    for held_ms in settings.get("capacity_report_ms") or []:
        if held_ms == settings["ttfa_target_ms"]:
            continue
        rows.append(
            (
                f"capacity: the same with p95 first audio <= {held_ms:g} ms and no gap",
                _held_at(caps.get(target), held_ms),
                [_held_at(caps.get(peer), held_ms) if peer else "-" for peer in peers],
            )
        )
    for label, key in (
        ("cancel to `audio.cancelled`", "cancel_to_report_ms"),
        ("cancel to the last audio frame", "cancel_to_last_frame_ms"),
    ):
        for q in ("p50", "p95"):
            rows.append(
                (
                    f"{label}, {q} (ms)",
                    cell(target, "barge-in", key, q),
                    ["no cancel" if peer else "-" for peer in peers],
                )
            )

    table = _table(target, peers, rows)
    steps = "; ".join(
        f"{who}: "
        + ", ".join(
            f"x{s['level']} {_fmt(s['ttfa_p95_ms'])} ms{'' if s['held'] else ' (failed)'}"
            for s in cap["steps"]
        )
        for who, cap in caps.items()
    )
    versions = ", ".join(f"{k} {v}" for k, v in machine.get("versions", {}).items())
    notes = []
    if "piper" in peers:
        notes.append(
            "Piper's server (Flask/Werkzeug development server from `piper-tts[http]`) answers"
            " each request with one complete WAV, so its first audio is the whole sentence; it"
            " has no cancel."
        )
    if "wyoming" in peers:
        notes.append(
            "wyoming-piper receives the tokens as they stream (`synthesize-chunk`) and speaks"
            " each sentence once it is complete, as one block of audio; it has no cancel."
        )
    lines_out = [
        README_HEADING,
        "",
        "<!-- generated by `python -m gateway bench-readme` from bench/results/latest.jsonl;"
        " do not edit by hand (tests/test_bench_readme.py checks it) -->",
        "",
        "Measured by the benchmark harness (`python -m gateway bench`, definitions in"
        " [docs/benchmarks.md](docs/benchmarks.md)) on one machine, client and server"
        " sharing its cores; each target measured alone, same seeded workload, same voice"
        f" (`joe`). Listener's clock: playout from the first frame, prebuffer"
        f" {settings['prebuffer_ms']:.0f} ms; `llm` streams tokens at"
        f" {settings['token_rate']:.0f}/s (jitter ±{settings['jitter'] * 100:.0f}%);"
        f" {settings['utterances']} utterances per scenario.",
        "",
        *table,
        "",
        f"Capacity steps (p95 first audio): {steps}.",
        "",
        *_load_part(lines),
        f"Machine: {machine.get('cpu') or 'unknown CPU'}, {machine.get('cpus')} logical CPUs,"
        f" {machine.get('platform')}, Python {machine.get('python')}; {versions};"
        f" load average {machine.get('loadavg_1m_at_start')} at the start (other work"
        " shared the machine)."
        + (f" Harness CPU: {harness['cpu_s']} s over {harness['wall_s']} s." if harness else "")
        + _measured_code(run.get("source")),
        " ".join(notes),
        "",
        "Reproduce (writes the results file and an HTML report with plots), then regenerate"
        " this section:",
        "",
        "```bash",
        f"{REPRODUCE}",
        "python -m gateway bench-readme",
        "```",
        "",
    ]
    if markdown is not None:
        lines_out += markdown_section(markdown)
    return "\n".join(lines_out)


def _load_part(lines: Sequence[dict[str, Any]]) -> list[str]:
    """The HTTP-load and overload results (time to first audio byte, ttfp,
    queueing included; RSS idle / right after / after settling), if run."""
    sentences = load_sentences(lines)
    if not sentences:
        return []
    return [
        "The gateway's own surfaces under load (HTTP: concurrent `POST /v1/audio/speech`"
        " requests, ttfp is the time to the first audio byte, queueing included; overload:"
        " twice the capacity target in `llm` sessions arriving together; RSS idle, right"
        " after, and after settling):",
        "",
        *(f"- {sentence}" for sentence in sentences),
        "",
    ]


def _held_at(cap: dict[str, Any] | None, ttfa_ms: float) -> str:
    if cap is None or "held_by_ttfa_ms" not in cap:
        return "n/a"
    return str(cap["held_by_ttfa_ms"].get(f"{ttfa_ms:g}") or 0)


def update_readme(readme: Path, results: Path) -> None:
    """Replace the README's "Performance" section (its last section) from a
    results file and, beside it, the Markdown run's (``MARKDOWN_RESULTS``)."""
    text = readme.read_text(encoding="utf-8")
    markdown = results.parent / MARKDOWN_RESULTS
    section = performance_section(load(results), load(markdown) if markdown.exists() else None)
    index = text.find("\n" + README_HEADING + "\n")
    head = text if index < 0 else text[: index + 1]
    readme.write_text(head.rstrip("\n") + "\n\n" + section, encoding="utf-8")


def readme_section(readme: Path) -> str | None:
    text = readme.read_text(encoding="utf-8")
    index = text.find("\n" + README_HEADING + "\n")
    return None if index < 0 else text[index + 1 :]
