"""Command line: ``python -m gateway serve [--config FILE] [--host] [--port]``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from gateway.settings import SettingsError, load_settings

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
        "forwarded_allow_ips": settings.forwarded_allow_ips,
        "proxy_headers": True,
        "log_config": None,
        "timeout_graceful_shutdown": settings.drain_timeout_s + 5,
    }


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.logs import configure_logging

    try:
        settings = load_settings(args.config, overrides={"host": args.host, "port": args.port})
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.api_keys)
    if settings.host not in ("127.0.0.1", "localhost", "::1") and not settings.api_keys:
        log.warning(
            "listening on %s without API keys: anyone who can reach this port can use it;"
            " set api_keys (GATEWAY_API_KEYS)",
            settings.host,
        )
    app = create_app(settings)
    uvicorn.run(app, **uvicorn_options(settings))  # type: ignore[arg-type]
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument("--config", help="TOML settings file")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.set_defaults(func=_serve)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result
