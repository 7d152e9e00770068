"""Resume tokens (``gateway.session.resume_book``): single use, bound to a
credential, windows that end suspended sessions, a drain that ends them all."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.protocol import UnspokenText
from gateway.session.resume_book import (
    ResumeBook,
    ResumeExpired,
    SuspendLimits,
    bounded_report,
    credential_of,
    token_hash,
)


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


async def test_the_oldest_suspended_session_ends_at_each_limit() -> None:
    book = ResumeBook(30, limits=SuspendLimits(sessions=3, per_client=2, retained_bytes=100))
    holders = [Holder() for _ in range(5)]
    made = [book.issue(holder, "") for holder in holders]
    digests = [digest for _, digest in made]
    evicted: list[str] = []
    book.on_evicted = evicted.append
    book.suspend(digests[0], "a", 10)
    book.suspend(digests[1], "b", 10)
    book.suspend(digests[2], "a", 10)
    book.suspend(digests[3], "a", 10)  # a's third: a's oldest (0) ends
    assert [h.expired for h in holders[:4]] == [1, 0, 0, 0]
    assert book.suspended == 3 and book.retained_bytes == 30
    # c's first: 4 sessions > 3, the oldest (1) ends; then 20 + 85 > 100 bytes: 2 ends
    book.suspend(digests[4], "c", 85)
    assert [h.expired for h in holders] == [1, 1, 1, 0, 0]
    assert evicted == [
        "max_suspended_sessions_per_client",
        "max_suspended_sessions",
        "max_suspended_bytes",
    ]
    assert book.suspended == 2 and book.retained_bytes == 95
    with pytest.raises(GatewayError) as refused:
        book.take(made[1][0], "")
    assert refused.value.code is ErrorCode.RESUME_EXPIRED
    assert "max_suspended_sessions" in refused.value.message
    assert book.take(made[3][0], "") is holders[3]
    assert book.suspended == 1 and book.retained_bytes == 85


async def test_a_token_of_another_gateway_is_elsewhere_and_names_it() -> None:
    here, there = ResumeBook(30, gateway_id="gw-a"), ResumeBook(30, gateway_id="gw-b")
    token, _ = there.issue(Holder(), "")
    assert token.startswith("gw-b.")
    with pytest.raises(GatewayError) as refused:
        here.take(token, "")
    assert refused.value.code is ErrorCode.RESUME_ELSEWHERE
    assert "'gw-b'" in refused.value.message
    # no prefix (a 2.1.0 token), or one no gateway id can be: not elsewhere
    for other in ("x" * 43, "not a/gateway.secret"):
        assert _code(here, other) is ErrorCode.RESUME_INVALID


async def test_the_report_is_bounded_given_once_and_kept_report_s() -> None:
    book = ResumeBook(0.01, report_s=30)
    holder = Holder()
    token, digest = book.issue(holder, "")
    book.suspend(digest)
    await asyncio.sleep(0.1)
    with pytest.raises(ResumeExpired) as first:
        book.take(token, "")
    assert first.value.unspoken == [UnspokenText(context_id=None, unspoken_text="not heard")]
    with pytest.raises(ResumeExpired) as again:
        book.take(token, "")
    assert again.value.unspoken is None  # given once
    # past report_s: the error alone
    late = ResumeBook(0.01, report_s=0.05)
    token, digest = late.issue(Holder(), "")
    late.suspend(digest)
    await asyncio.sleep(0.2)
    with pytest.raises(ResumeExpired) as stale:
        late.take(token, "")
    assert stale.value.unspoken is None


def test_a_report_keeps_the_beginning_of_each_context_within_its_bound() -> None:
    long = [
        UnspokenText(context_id="a", unspoken_text="a" * 6),
        UnspokenText(context_id="b", unspoken_text="b" * 6),
    ]
    assert bounded_report(long, limit=8) == [
        UnspokenText(context_id="a", unspoken_text="aaaaaa", truncated=False),
        UnspokenText(context_id="b", unspoken_text="bb", truncated=True),
    ]
