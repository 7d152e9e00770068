"""``multipart/form-data`` parsing with limits, for voice uploads.

The parser is python-multipart's streaming ``MultipartParser`` (the one
Starlette uses), driven here directly so that the whole parse runs in a
worker thread (``asyncio.to_thread``), never on the event loop: a body of
140,000 tiny parts took the standard library's ``email`` parser 8 s of event
loop time.  Limits, checked while parsing so that a hostile body is dropped
as soon as it crosses one:

* at most ``max_parts`` parts (``message_too_large``);
* at most ``MAX_PART_HEADERS`` header lines per part (``invalid_message``);
* a text field at most ``max_field_bytes``; a file part (one with a
  filename, or named in ``file_fields``) at most ``max_file_bytes``
  (``message_too_large``, naming the field).

The body itself is read under a cap before this runs (``http_errors.read_body``).
This module does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from gateway.errors import ErrorCode, GatewayError

MAX_PART_HEADERS = 8
_HEADER_BYTES = 1024  #: longest header line of a part


@dataclass
class FormPart:
    name: str
    filename: str | None = None
    content_type: str = "text/plain"
    data: bytearray = field(default_factory=bytearray)


class _Collector:
    """python-multipart callbacks that build ``FormPart``s within the limits."""

    def __init__(
        self,
        max_parts: int,
        max_field_bytes: int,
        max_file_bytes: int,
        file_fields: tuple[str, ...],
    ) -> None:
        self.file_fields = file_fields
        self.max_parts = max_parts
        self.max_field_bytes = max_field_bytes
        self.max_file_bytes = max_file_bytes
        self.parts: list[FormPart] = []
        self._headers: list[tuple[bytes, bytes]] = []
        self._field = bytearray()
        self._value = bytearray()
        self._current: FormPart | None = None

    def on_part_begin(self) -> None:
        if len(self.parts) >= self.max_parts:
            raise GatewayError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"the form has more than {self.max_parts} parts (max_form_parts); send only"
                " the documented fields",
            )
        self._headers = []
        self._current = None

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]
        self._check_header()

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]
        self._check_header()

    def _check_header(self) -> None:
        if len(self._field) + len(self._value) > _HEADER_BYTES:
            raise GatewayError(
                ErrorCode.INVALID_MESSAGE, f"a form part header is over {_HEADER_BYTES} bytes"
            )

    def on_header_end(self) -> None:
        self._headers.append((bytes(self._field).lower(), bytes(self._value)))
        self._field.clear()
        self._value.clear()
        if len(self._headers) > MAX_PART_HEADERS:
            raise GatewayError(
                ErrorCode.INVALID_MESSAGE,
                f"a form part has more than {MAX_PART_HEADERS} headers",
            )

    def on_headers_finished(self) -> None:
        headers = dict(self._headers)
        _, params = parse_options_header(headers.get(b"content-disposition", b""))
        raw_name = params.get(b"name")
        filename = params.get(b"filename")
        content_type, _ = parse_options_header(headers.get(b"content-type", b"text/plain"))
        part = FormPart(
            name=raw_name.decode("utf-8", "replace") if raw_name is not None else "",
            filename=filename.decode("utf-8", "replace") if filename is not None else None,
            content_type=content_type.decode("latin-1"),
        )
        self.parts.append(part)
        self._current = part

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        part = self._current
        if part is None:
            return
        part.data += data[start:end]
        is_file = part.filename is not None or part.name in self.file_fields
        limit = self.max_file_bytes if is_file else self.max_field_bytes
        if len(part.data) > limit:
            kind = "file" if is_file else "text field"
            raise GatewayError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"the {kind} `{part.name}` is over its limit of {limit} bytes",
                param=part.name or None,
            )


def parse_form(
    content_type: str,
    body: bytes,
    *,
    max_parts: int,
    max_field_bytes: int,
    max_file_bytes: int,
    file_fields: tuple[str, ...] = (),
) -> dict[str, FormPart]:
    """The named parts of a ``multipart/form-data`` body (the last of a
    repeated name wins), or ``GatewayError``.  Blocking: call it in a thread."""
    media_type, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if media_type != b"multipart/form-data" or not boundary:
        raise GatewayError(
            ErrorCode.INVALID_MESSAGE,
            "upload voices as multipart/form-data with a boundary (fields: audio, name,"
            " consent, ...)",
        )
    collector = _Collector(max_parts, max_field_bytes, max_file_bytes, file_fields)
    callbacks = {
        name: getattr(collector, name)
        for name in (
            "on_part_begin",
            "on_header_field",
            "on_header_value",
            "on_header_end",
            "on_headers_finished",
            "on_part_data",
        )
    }
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    try:
        parser.write(body)
        parser.finalize()
    except MultipartParseError:
        raise GatewayError(
            ErrorCode.INVALID_MESSAGE,
            "the multipart body could not be parsed: check the boundary and part framing",
        ) from None
    return {part.name: part for part in collector.parts if part.name}
