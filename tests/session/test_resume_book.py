"""Resume tokens (``gateway.session.resume_book``): single use, bound to a
credential, windows that end suspended sessions, a drain that ends them all."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.protocol import UnspokenText
from gateway.session.resume_book import ResumeBook, credential_of, token_hash


class Holder:
    def __init__(self) -> None:
        self.expired = 0
        self.taken_over = 0

    def expire(self) -> asyncio.Task[None] | None:
        self.expired += 1
        return None

    def take_over(self) -> None:
        self.taken_over += 1

    def unheard(self) -> list[UnspokenText]:
        return [UnspokenText(context_id=None, unspoken_text="not heard")]


def _code(book: ResumeBook, token: str, credential: str = "") -> ErrorCode:
    with pytest.raises(GatewayError) as refused:
        book.take(token, credential)
    return refused.value.code


async def test_a_token_resumes_once_and_is_kept_only_as_a_hash() -> None:
    book, holder = ResumeBook(30), Holder()
    token, digest = book.issue(holder, "")
    prefix, secret = token.split(".")
    assert prefix == "gateway" and len(secret) == 43
    assert digest == token_hash(token) and token not in digest
    book.suspend(digest)
    assert book.suspended == 1
    assert book.take(token, "") is holder
    assert holder.taken_over == 0  # it was suspended: nothing to take over
    assert _code(book, token) is ErrorCode.RESUME_INVALID
    assert _code(book, "made-up") is ErrorCode.RESUME_INVALID


async def test_another_credential_is_forbidden_and_uses_nothing_up() -> None:
    book, holder = ResumeBook(30), Holder()
    token, _ = book.issue(holder, credential_of("key-one"))
    assert _code(book, token, credential_of("key-two")) is ErrorCode.RESUME_FORBIDDEN
    assert _code(book, token, credential_of(None)) is ErrorCode.RESUME_FORBIDDEN
    assert book.take(token, credential_of("key-one")) is holder
    assert holder.taken_over == 1  # never suspended: its connection is dropped


async def test_the_window_ends_the_session_and_a_late_resume_is_expired() -> None:
    book, holder = ResumeBook(0.05), Holder()
    token, digest = book.issue(holder, "")
    book.suspend(digest)
    await asyncio.sleep(0.2)
    assert holder.expired == 1 and book.suspended == 0
    assert _code(book, token) is ErrorCode.RESUME_EXPIRED


async def test_a_drain_ends_every_suspended_session_and_no_connected_one() -> None:
    book, gone, connected = ResumeBook(30), Holder(), Holder()
    _, digest = book.issue(gone, "")
    token, _ = book.issue(connected, "")
    book.suspend(digest)
    await book.end_all()
    assert (gone.expired, connected.expired) == (1, 0)
    assert book.take(token, "") is connected
