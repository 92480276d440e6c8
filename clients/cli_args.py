"""The command-line options every Python client shares: where the server is, and counts.

``--host`` and ``--port`` build the endpoint's URL (the server's defaults: 127.0.0.1:8000,
as ``realtime serve`` and ``make serve`` listen); ``--url`` gives the whole URL instead
(another path, ``wss://`` behind a proxy) and wins over both.
"""

from __future__ import annotations

import argparse
import secrets

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def add_server_options(parser: argparse.ArgumentParser, path: str) -> None:
    """``--host``, ``--port`` and ``--url`` for the endpoint at ``path`` (``server_url`` reads them)."""
    parser.add_argument("--host", default=DEFAULT_HOST, help="the server's address (default: %(default)s)")
    parser.add_argument("--port", type=port, default=DEFAULT_PORT, help="the server's port (default: %(default)s)")
    parser.add_argument("--url", default=None,
                        help=f"the whole WebSocket URL instead of --host and --port "
                             f"(default: ws://HOST:PORT{path})")


def server_url(args: argparse.Namespace, path: str) -> str:
    """The URL ``add_server_options``' options name."""
    if args.url:
        return args.url
    host = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
    return f"ws://{host}:{args.port}{path}"


def fresh_id(prefix: str) -> str:
    """A session id no other run of a client picks: ``prefix`` and 8 random hex digits."""
    return f"{prefix}-{secrets.token_hex(4)}"


def count(text: str) -> int:
    """An argparse type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def port(text: str) -> int:
    """An argparse type: a TCP port, 1..65535."""
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port, 1..65535, got {text}")
    return value
