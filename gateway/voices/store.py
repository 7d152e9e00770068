"""Uploaded reference voices: validation, and a persistent store under ``data_dir``.

Layout: ``<data_dir>/voices/voices.sqlite3`` holds one row per voice (standard
library ``sqlite3``); ``<data_dir>/voices/audio/<id>.<ext>`` holds its audio
exactly as uploaded.  File names are generated (a random hex id and the
extension of the *sniffed* format), never derived from anything a client
sent, so no name can reach outside the audio folder.

Writes are ordered so that a crash leaves nothing half-listed: the audio is
written to a temporary file, flushed, renamed into place, and only then is
the row committed; a delete commits the row removal first and unlinks the
file after.  ``open`` reconciles at start: rows whose file is missing are
dropped, and files no row names (a crash between rename and commit, or a
left-over temporary file) are deleted.

Validation (``validate_name``, ``sniff``, ``probe``) is pure and does no I/O.
The store's methods block (disk and SQLite): call them off the event loop.
"""

from __future__ import annotations

import io
import logging
import os
import sqlite3
import threading
import time
import unicodedata
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import soundfile as sf
from disarm import skeleton_key

from gateway.errors import ErrorCode, GatewayError

log = logging.getLogger(__name__)

#: largest accepted upload (the audio file itself)
MAX_UPLOAD_BYTES: Final = 10 * 1024 * 1024
MIN_DURATION_S: Final = 1.0
MAX_DURATION_S: Final = 30.0
MAX_NAME_CHARS: Final = 64
MAX_TEXT_CHARS: Final = 2000  #: ``ref_text`` and ``description``
#: besides letters and digits (any script), a name may contain these
NAME_PUNCTUATION: Final = " _-."

#: sniffed format -> (extension, media type, libsndfile format)
FORMATS: Final[dict[str, tuple[str, str, str]]] = {
    "wav": ("wav", "audio/wav", "WAV"),
    "flac": ("flac", "audio/flac", "FLAC"),
    "ogg": ("ogg", "audio/ogg", "OGG"),
    "mp3": ("mp3", "audio/mpeg", "MP3"),
}


def _bad(message: str, param: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_CONFIG, message, param=param)


def validate_name(raw: str) -> str:
    """NFC-normalize a display name and check its characters and length."""
    name = unicodedata.normalize("NFC", raw)
    if not name or name != name.strip():
        raise _bad("`name` must be non-empty, without leading or trailing spaces", "name")
    if len(name) > MAX_NAME_CHARS:
        raise _bad(f"`name` is longer than {MAX_NAME_CHARS} characters", "name")
    if not name[0].isalnum():
        raise _bad("`name` must start with a letter or digit", "name")
    for ch in name:
        if not (ch.isalnum() or ch in NAME_PUNCTUATION):
            raise _bad(
                f"`name` may contain only letters, digits, spaces and {NAME_PUNCTUATION.strip()!r};"
                f" found {ch!r}",
                "name",
            )
    return name


def name_key(name: str) -> str:
    """The case-insensitive identity of a voice name."""
    return unicodedata.normalize("NFC", name).strip().casefold()


def name_skeleton(name: str) -> str:
    """What a name looks like: its Unicode TR39 confusable skeleton, from
    disarm's ``skeleton_key`` (the TR39 prototype fold, case-folded, with
    TR39's ``1``/``l``/``I`` and ``0``/``O`` classes).  Two names with one
    skeleton are refused as confusable (``јое`` in Cyrillic beside ``joe``).
    disarm deliberately leaves out TR39's multi-letter fold ``m`` -> ``rn``,
    so ``rn`` and ``m`` stay distinct names."""
    return skeleton_key(name_key(name), digit_policy="tr39")


def sniff(data: bytes) -> str | None:
    """The container format from the first bytes, or None if not one we decode."""
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    if data[:3] == b"ID3" or (len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def probe(data: bytes, fmt: str) -> tuple[float, int]:
    """Decode every sample; returns (duration in s, sample rate) or raises."""
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate = int(f.samplerate)
            frames = 0
            while True:
                block = f.read(65536, dtype="float32", always_2d=True)
                if not len(block):
                    break
                frames += len(block)
                if frames > rate * (MAX_DURATION_S + 1):
                    break  # long enough to refuse; no need to decode the rest
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError) as exc:
        # libsndfile's message names the in-memory file object (a memory
        # address): log it for the operator, answer without internals
        log.debug("audio probe failed: %r", exc)
        raise _bad(
            f"the audio could not be decoded as {fmt}: the file is damaged, truncated or"
            f" not really {fmt}; upload a complete WAV, FLAC, Ogg or MP3 file",
            "audio",
        ) from None
    if frames == 0 or rate <= 0:
        raise _bad(f"the {fmt} file holds no audio", "audio")
    return frames / rate, rate


def check_audio(data: bytes) -> tuple[str, float, int]:
    """Size, sniffed format and decoded duration of an upload: (format, s, Hz)."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise GatewayError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"the audio is {len(data)} bytes; the limit is {MAX_UPLOAD_BYTES} bytes",
            param="audio",
        )
    if not data:
        raise _bad("the audio file is empty", "audio")
    fmt = sniff(data)
    if fmt is None:
        raise _bad(
            "the audio is not WAV, FLAC, Ogg or MP3 (judged from its content, not its"
            " declared type)",
            "audio",
        )
    duration, rate = probe(data, fmt)
    if not MIN_DURATION_S <= duration <= MAX_DURATION_S:
        raise _bad(
            f"the audio lasts {duration:.2f} s; reference audio must be"
            f" {MIN_DURATION_S:g} to {MAX_DURATION_S:g} s",
            "audio",
        )
    return fmt, duration, rate


@dataclass(frozen=True)
class StoredVoice:
    id: str
    name: str
    file: str  #: generated file name inside the audio folder
    format: str  #: sniffed: wav, flac, ogg or mp3
    media_type: str
    sample_rate: int
    duration_s: float
    size_bytes: int
    consent: str
    ref_text: str
    description: str
    created_at: float  #: Unix time

    def public(self) -> dict[str, Any]:
        info = asdict(self)
        info.pop("file")
        return info


@dataclass(frozen=True)
class ReconcileReport:
    rows_dropped: int
    files_deleted: int


_SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    name_key TEXT NOT NULL UNIQUE,
    file TEXT NOT NULL UNIQUE,
    format TEXT NOT NULL,
    media_type TEXT NOT NULL,
    sample_rate INTEGER NOT NULL,
    duration_s REAL NOT NULL,
    size_bytes INTEGER NOT NULL,
    consent TEXT NOT NULL,
    ref_text TEXT NOT NULL,
    description TEXT NOT NULL,
    created_at REAL NOT NULL
)
"""
_COLUMNS = (
    "id, name, file, format, media_type, sample_rate, duration_s, size_bytes,"
    " consent, ref_text, description, created_at"
)


class VoiceStore:
    """Voices on disk; thread-safe (one lock), blocking."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "voices"
        self.audio_dir = self.root / "audio"
        self.db_path = self.root / "voices.sqlite3"
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    # --- lifecycle ----------------------------------------------------------------

    def open(self) -> ReconcileReport:
        self.audio_dir.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(_SCHEMA)
        self._db = db
        report = self.reconcile()
        if report.rows_dropped or report.files_deleted:
            log.warning(
                "voice store reconciled: %d rows without a file dropped, %d orphan files deleted",
                report.rows_dropped,
                report.files_deleted,
            )
        return report

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("voice store is not open")
        return self._db

    def reconcile(self) -> ReconcileReport:
        with self._lock:
            rows = self.db.execute("SELECT id, file FROM voices").fetchall()
            present = {p.name for p in self.audio_dir.iterdir() if p.is_file()}
            missing = [vid for vid, file in rows if file not in present]
            if missing:
                self.db.executemany("DELETE FROM voices WHERE id = ?", [(v,) for v in missing])
            named = {file for _, file in rows}
            orphans = [name for name in present if name not in named]
            for name in orphans:
                (self.audio_dir / name).unlink(missing_ok=True)
        return ReconcileReport(len(missing), len(orphans))

    # --- queries --------------------------------------------------------------------

    def list(self) -> list[StoredVoice]:
        with self._lock:
            rows = self.db.execute(
                f"SELECT {_COLUMNS} FROM voices ORDER BY created_at, name"
            ).fetchall()
        return [StoredVoice(*row) for row in rows]

    def get(self, name: str) -> StoredVoice | None:
        with self._lock:
            row = self.db.execute(
                f"SELECT {_COLUMNS} FROM voices WHERE name_key = ?", (name_key(name),)
            ).fetchone()
        return StoredVoice(*row) if row else None

    def read_audio(self, voice: StoredVoice) -> bytes | None:
        """The voice's audio exactly as uploaded (None: it was deleted), for
        an engine that keeps copies of uploads on its servers."""
        try:
            return (self.audio_dir / voice.file).read_bytes()
        except FileNotFoundError:
            return None

    # --- changes --------------------------------------------------------------------

    def add(
        self,
        *,
        name: str,
        data: bytes,
        fmt: str,
        duration_s: float,
        sample_rate: int,
        consent: str,
        ref_text: str = "",
        description: str = "",
        reserved: Iterable[str] = (),
    ) -> StoredVoice:
        """Store a validated upload; raises ``GatewayError`` on a duplicate name."""
        key = name_key(name)
        reserved = list(reserved)
        if key in {name_key(r) for r in reserved}:
            raise _duplicate(name, "a built-in voice or alias")
        skeleton = name_skeleton(name)
        for other in reserved:
            if name_skeleton(other) == skeleton:
                raise _confusable(name, other)
        ext, media_type, _ = FORMATS[fmt]
        voice = StoredVoice(
            id=uuid.uuid4().hex,
            name=name,
            file="",
            format=fmt,
            media_type=media_type,
            sample_rate=sample_rate,
            duration_s=round(duration_s, 3),
            size_bytes=len(data),
            consent=consent,
            ref_text=ref_text,
            description=description,
            created_at=time.time(),
        )
        voice = StoredVoice(**{**asdict(voice), "file": f"{voice.id}.{ext}"})
        final = self.audio_dir / voice.file
        with self._lock:
            if self.db.execute("SELECT 1 FROM voices WHERE name_key = ?", (key,)).fetchone():
                raise _duplicate(name, "an uploaded voice")
            for (other,) in self.db.execute("SELECT name FROM voices"):
                if name_skeleton(other) == skeleton:
                    raise _confusable(name, other)
            _write_atomically(final, data)
            try:
                self.db.execute(
                    "INSERT INTO voices (id, name, name_key, file, format, media_type,"
                    " sample_rate, duration_s, size_bytes, consent, ref_text, description,"
                    " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        voice.id,
                        voice.name,
                        key,
                        voice.file,
                        voice.format,
                        voice.media_type,
                        voice.sample_rate,
                        voice.duration_s,
                        voice.size_bytes,
                        voice.consent,
                        voice.ref_text,
                        voice.description,
                        voice.created_at,
                    ),
                )
            except sqlite3.IntegrityError:  # another process won the name
                final.unlink(missing_ok=True)
                raise _duplicate(name, "an uploaded voice") from None
        return voice

    def remove(self, name: str) -> StoredVoice | None:
        with self._lock:
            row = self.db.execute(
                f"SELECT {_COLUMNS} FROM voices WHERE name_key = ?", (name_key(name),)
            ).fetchone()
            if row is None:
                return None
            voice = StoredVoice(*row)
            self.db.execute("DELETE FROM voices WHERE id = ?", (voice.id,))
            (self.audio_dir / voice.file).unlink(missing_ok=True)
        return voice


def _duplicate(name: str, what: str) -> GatewayError:
    return GatewayError(
        ErrorCode.INVALID_STATE,
        f"a voice named {name!r} already exists ({what}; names are compared case-insensitively)",
        param="name",
    )


def _confusable(name: str, other: str) -> GatewayError:
    return GatewayError(
        ErrorCode.INVALID_STATE,
        f"the name {name!r} looks like the existing voice {other!r} (Unicode confusables);"
        " choose a name that reads differently",
        param="name",
    )


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
