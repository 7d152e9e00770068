"""One writer per record: no module writes the audio ledger but its owner.

The records are the dataclasses of ``gateway/session/ledger.py``
(``SegmentAudio``, ``UtteranceAudio``, ``ContextAudio``: the audio side of
segments, utterances and contexts, ``docs/architecture.md`` section 3).
Their owner, the one writer, is the audio stream
(``gateway/session/audio_stream.py``); the ledger's own methods are how it
writes.  Every other module reads them: the core for cancel reports and
``session.done``, ``segment_events``, ``segmentation``, ``utterance``.

A write is, found with ``ast``: an assignment (``=``, ``+=``, annotated,
``del``, ``setattr``) to one of the records' fields, or a call of one of
their methods, on a record reached as ``<something>.audio`` (how every
record hangs from its text-side record) or through a name bound to one
(``audio = segment.audio``).  Reading is free.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = ROOT / "gateway"
LEDGER = GATEWAY / "session" / "ledger.py"
#: the modules that may write the ledger's records
OWNERS = {LEDGER, GATEWAY / "session" / "audio_stream.py"}


@dataclass(frozen=True)
class Records:
    fields: frozenset[str]
    methods: frozenset[str]


def ledger_records(source: str) -> Records:
    """The fields and methods of the dataclasses ``source`` defines."""
    fields: set[str] = set()
    methods: set[str] = set()
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        if not any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                fields.add(item.target.id)
            elif isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                methods.add(item.name)
    return Records(frozenset(fields), frozenset(methods))


def _bound_to_records(tree: ast.AST) -> set[str]:
    """Names bound to a record anywhere in the module (``x = y.audio``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if _reaches_record(node.value, set()):
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _reaches_record(node: ast.expr, bound: set[str]) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "audio":
        return True
    return isinstance(node, ast.Name) and node.id in bound


def ledger_writes(source: str, records: Records) -> list[str]:
    """Each write of a record in ``source``: ``line: what``."""
    tree = ast.parse(source)
    bound = _bound_to_records(tree)
    found: list[str] = []

    def written(target: ast.expr, line: int) -> None:
        if (
            isinstance(target, ast.Attribute)
            and target.attr in records.fields
            and _reaches_record(target.value, bound)
        ):
            found.append(f"{line}: {ast.unparse(target)} assigned")

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.Delete):
            for target in node.targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.expr):
                        written(part, node.lineno)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            written(node.target, node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in records.methods
                and _reaches_record(func.value, bound)
            ):
                found.append(f"{node.lineno}: {ast.unparse(func)}() called")
            if (
                isinstance(func, ast.Name)
                and func.id == "setattr"
                and node.args
                and _reaches_record(node.args[0], bound)
            ):
                found.append(f"{node.lineno}: setattr({ast.unparse(node.args[0])}, ...)")
    return sorted(found, key=lambda f: int(f.split(":", 1)[0]))


def test_no_module_but_the_audio_stream_writes_the_audio_ledger() -> None:
    records = ledger_records(LEDGER.read_text())
    assert {"sent_ms", "finished", "sequence"} <= records.fields
    assert {"count_sent", "message_sent", "start_segment"} <= records.methods
    writes = {
        str(path.relative_to(ROOT)): found
        for path in sorted(GATEWAY.rglob("*.py"))
        if path not in OWNERS and (found := ledger_writes(path.read_text(), records))
    }
    assert writes == {}, "only gateway/session/audio_stream.py writes the audio ledger"


def test_the_check_sees_the_owners_writes() -> None:
    """The audio stream does write the ledger, and the check sees it: a
    check that found nothing anywhere would prove nothing."""
    records = ledger_records(LEDGER.read_text())
    stream = GATEWAY / "session" / "audio_stream.py"
    found = " ".join(ledger_writes(stream.read_text(), records))
    for method in ("start_segment", "finish_segment", "add_words", "account"):
        assert f".{method}() called" in found


def test_a_ledger_write_from_the_session_core_is_found() -> None:
    """What the rule forbids, added to the real ``session/core.py``: each
    kind of write is reported."""
    records = ledger_records(LEDGER.read_text())
    core = (GATEWAY / "session" / "core.py").read_text()
    assert ledger_writes(core, records) == []
    tampered = core + (
        "\n\ndef _tamper(ctx, utt, segment):\n"
        "    utt.audio.sent_ms = 0.0\n"
        "    ctx.audio.sequence += 1\n"
        "    audio = segment.audio\n"
        "    audio.finished = True\n"
        "    utt.audio.account(None)\n"
        "    setattr(segment.audio, 'samples', 0)\n"
    )
    found = ledger_writes(tampered, records)
    assert [f.split(": ", 1)[1] for f in found] == [
        "utt.audio.sent_ms assigned",
        "ctx.audio.sequence assigned",
        "audio.finished assigned",
        "utt.audio.account() called",
        "setattr(segment.audio, ...)",
    ]
