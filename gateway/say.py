"""``python -m gateway say``: speak text from the command line or a pipe.

    python -m gateway say "Hello there." -o hello.wav
    llm-tool | python -m gateway say | aplay -f S16_LE -r 22050 -c 1

With no text argument, standard input is read incrementally and each chunk is
sent as it arrives (so an LLM's output can be piped in).  With ``-o`` the
audio is written as a WAV file; without it raw 16-bit PCM goes to standard
output, unless that is a terminal.  Audio is written as it arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from typing import BinaryIO

from gateway.audio.wav import wav_header
from gateway.client import DEFAULT_URL, AudioFrame, Client, ClientError, Disconnected
from gateway.protocol import Error, SessionDone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="?", help="text to speak (default: read standard input)")
    parser.add_argument("-o", "--output", help="WAV file to write (default: raw PCM to stdout)")
    parser.add_argument("--voice", help="voice name (default: the server's)")
    parser.add_argument("--url", default=os.environ.get("GATEWAY_URL", DEFAULT_URL))
    parser.add_argument("--api-key", default=os.environ.get("GATEWAY_API_KEY"))


async def _read_stdin(client: Client) -> None:
    """Send standard input chunk by chunk, as it arrives, then ``input.done``."""
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    decoder_buffer = b""
    while True:
        # os.read returns as soon as some input is available: no line buffering
        chunk = await loop.run_in_executor(None, os.read, fd, 4096)
        if not chunk:
            break
        data = decoder_buffer + chunk
        try:
            text = data.decode("utf-8")
            decoder_buffer = b""
        except UnicodeDecodeError as exc:  # a character split across reads
            if exc.start < len(data) - 3:
                raise
            text, decoder_buffer = data[: exc.start].decode("utf-8"), data[exc.start :]
        if text:
            await client.send_text(text)
    if decoder_buffer:
        await client.send_text(decoder_buffer.decode("utf-8", errors="replace"))
    await client.done()


async def say(
    text: str | None, out: BinaryIO, *, wav: bool, url: str, voice: str | None, api_key: str | None
) -> int:
    client = await Client.connect(url, voice=voice, api_key=api_key)
    async with client:
        assert client.config is not None
        rate = client.config.sample_rate
        if wav:  # sizes are patched at the end when the file is seekable
            out.write(wav_header(rate, "pcm_s16le", None))
        sender = asyncio.create_task(
            _read_stdin(client) if text is None else _send_all(client, text)
        )
        data_bytes = 0
        status = 0
        try:
            async for event in client.events():
                match event:
                    case AudioFrame():
                        out.write(event.data)
                        out.flush()
                        data_bytes += len(event.data)
                    case Error():
                        print(f"error: {event.code}: {event.message}", file=sys.stderr)
                        if event.fatal:
                            status = 1
                            break
                    case SessionDone(context_id=None):
                        # all spoken; closing after it (not with finish()
                        # right after input.done) keeps a long text clear of
                        # the server's drain_timeout_s bound on a polite close
                        break
                    case Disconnected():
                        print(f"error: connection closed ({event.code})", file=sys.stderr)
                        status = 1
                        break
        finally:
            if not sender.done():
                sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        if wav and out.seekable():
            out.seek(0)
            out.write(wav_header(rate, "pcm_s16le", data_bytes))
        return status


async def _send_all(client: Client, text: str) -> None:
    await client.send_text(text)
    await client.done()


def run(args: argparse.Namespace) -> int:
    if args.output is None and sys.stdout.isatty():
        print(
            "error: standard output is a terminal; give -o FILE.wav, or pipe the raw PCM"
            " (16-bit mono) into a player",
            file=sys.stderr,
        )
        return 2
    try:
        if args.output is not None:
            with open(args.output, "wb") as out:
                return asyncio.run(
                    say(
                        args.text, out, wav=True, url=args.url, voice=args.voice,
                        api_key=args.api_key,
                    )
                )  # fmt: skip
        return asyncio.run(
            say(
                args.text, sys.stdout.buffer, wav=False, url=args.url, voice=args.voice,
                api_key=args.api_key,
            )
        )  # fmt: skip
    except (ClientError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
