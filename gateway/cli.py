"""Command line: ``python -m gateway serve [--config FILE] [--host] [--port]``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from types import FrameType

import uvicorn

from gateway.http.security import startup_warnings
from gateway.settings import SettingsError, load_settings
from gateway.state import GatewayState

log = logging.getLogger("gateway")


def uvicorn_options(settings: object) -> dict[str, object]:
    """The uvicorn settings the gateway depends on, in one place."""
    from gateway.settings import Settings

    assert isinstance(settings, Settings)
    return {
        "host": settings.host,
        "port": settings.port,
        # named explicitly: write backpressure depends on the implementation
        "ws": settings.ws_impl,
        "ws_max_size": settings.max_message_bytes,
        # audio does not compress; deflate would only add latency and memory
        "ws_per_message_deflate": False,
        # X-Forwarded-For is believed only from listed proxies; by default
        # none, so a client cannot pick its own address for the per-client limits
        "forwarded_allow_ips": settings.forwarded_allow_ips,
        "proxy_headers": bool(settings.forwarded_allow_ips.strip()),
        "log_config": None,
        "timeout_graceful_shutdown": settings.drain_timeout_s + 5,
    }


def _serve(args: argparse.Namespace) -> int:
    from gateway.ops.heap import tune_malloc

    # done already when started as ``python -m gateway serve`` (gateway/__main__.py)
    tuned = tune_malloc()

    from gateway.app import create_app
    from gateway.ops.logs import configure_logging

    try:
        settings = load_settings(args.config, overrides={"host": args.host, "port": args.port})
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.accepted_keys)
    log.info("malloc: %s", ", ".join(f"{k}={v}" for k, v in tuned.items()) or "as configured")
    for warning in startup_warnings(settings):
        log.warning("%s", warning)
    try:
        # an engine checks here that its device settings can be honoured
        app = create_app(settings)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = uvicorn.Config(app, **uvicorn_options(settings))  # type: ignore[arg-type]
    DrainingServer(config, app.state.gateway).run()
    return 0


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a graceful drain on the first SIGTERM/SIGINT.

    The signal handler only flips flags (``/readyz`` answers 503 from that
    moment); the drain (``GatewayState.drain``) runs as a task started by the
    main loop's next tick (within 0.1 s), and uvicorn's own shutdown follows
    once it is done.  A second signal is uvicorn's usual immediate exit.  The
    first signal is not re-raised after shutdown, so the process exits 0."""

    def __init__(self, config: uvicorn.Config, state: GatewayState) -> None:
        super().__init__(config)
        self.gateway = state
        self.drain_requested = False
        self._drain: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_requested:
            super().handle_exit(sig, frame)
            return
        log.info("signal %d: draining (a second signal exits at once)", sig)
        self.drain_requested = True
        self.gateway.shutting_down = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain_requested and self._drain is None:
            self._drain = asyncio.create_task(self.gateway.drain(), name="drain")
        if self._drain is not None and self._drain.done():
            self.should_exit = True
        return await super().on_tick(counter)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument("--config", help="TOML settings file")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.set_defaults(func=_serve)
    _add_client_commands(commands)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def _add_client_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``say``, ``bench`` and ``bench-readme``: client-side tools (imported lazily)."""

    def say(args: argparse.Namespace) -> int:
        from gateway.say import run

        return run(args)

    def bench(args: argparse.Namespace) -> int:
        from gateway.bench.runner import run

        return run(args)

    def bench_readme(args: argparse.Namespace) -> int:
        from pathlib import Path

        from gateway.bench.report import update_readme

        update_readme(Path(args.readme), Path(args.results))
        return 0

    from gateway import say as say_module
    from gateway.bench import runner as bench_runner

    parser = commands.add_parser("say", help="speak text (or standard input) through a server")
    say_module.add_arguments(parser)
    parser.set_defaults(func=say)
    parser = commands.add_parser("bench", help="measure latency as a listener hears it")
    bench_runner.add_arguments(parser)
    parser.set_defaults(func=bench)
    parser = commands.add_parser("bench-readme", help="regenerate README's Performance section")
    parser.add_argument("--results", default="bench/results/latest.jsonl")
    parser.add_argument("--readme", default="README.md")
    parser.set_defaults(func=bench_readme)
