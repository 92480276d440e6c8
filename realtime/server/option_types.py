"""The value types of ``realtime serve``'s options: each turns an option's text (a flag's,
a REALTIME_* variable's or a config file's, realtime/server/settings.py) into its value, or
raises ``argparse.ArgumentTypeError`` saying what it wants."""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass, field

from protocols.echo import shown
from realtime.server.admin import ANYONE, LOOPBACK, admin_entry_valid
from realtime.server.origins import parse_allowed


def origins(text: str) -> tuple[str, ...]:
    try:
        return parse_allowed(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def positive(text: str) -> float:
    value = float(text)
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:  # the socket layer would take 99999 as 99999 % 65536
        raise argparse.ArgumentTypeError(f"must be a TCP port in [0, 65535], got {text}")
    return value


def finite_positive(text: str) -> float:
    value = positive(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text}")
    return value


def device(text: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda, cuda:N or auto, got {shown(text)}")
    return text


def directory(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"no such directory: {shown(text)}")
    return text


def admin_addresses(text: str) -> tuple[str, ...]:
    entries = addresses(text)
    for entry in entries:
        if not admin_entry_valid(entry):
            raise argparse.ArgumentTypeError(
                f"not an address: {shown(entry)} (want an IP address, a network such as 10.0.0.0/8, "
                f"{LOOPBACK!r} or {ANYONE!r})")
    return entries


def addresses(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip())


@dataclass(frozen=True)
class KeyFile:
    """``--api-key-file``: the file and the keys it holds (neither repr nor str shows a key)."""

    path: str
    keys: tuple[str, ...] = field(repr=False)

    def __str__(self) -> str:
        return f"{self.path} ({len(self.keys)} keys)"


def key_file(path: str) -> KeyFile:
    """One key per line; blank lines and lines starting with ``#`` are skipped (a ``#``
    later in a line is part of the key)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"{path!r}: {getattr(exc, 'strerror', None) or exc}") from None
    keys = tuple(line for line in lines if line and not line.startswith("#"))
    if not keys:
        raise argparse.ArgumentTypeError(f"{path!r} holds no key")
    return KeyFile(path, keys)
