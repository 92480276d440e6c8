"""The options of the ``dreamzero`` entry: parsed, checked and named before anything loads.

They come after the checkpoint folder as ``key=value`` pairs (``models.factory.parse_entry``)::

    realtime serve --policy 'dreamzero=/ckpt/DreamZero-DROID?tokenizer=/ckpt/umt5-xxl&sessions=2'

    tokenizer=PATH   the umt5-xxl tokenizer folder (google/umt5-xxl's tokenizer.json or
                     spiece.model with its tokenizer_config.json); required: the checkpoint
                     folder does not hold it, and nothing is ever downloaded
    step_cache=1     upstream's DiT cache: the DiT runs on 8 of the 16 steps, the others
                     reuse the last flows (scheduler.DIT_STEPS_8; default 0, every step)
    sessions=N       robots whose state (K/V, cross K/V, first-frame condition) may be resident
                     on the device at once, 1..64 (default 2), fewer when the KV budget holds
                     fewer (at 14B a session holds 11.35 GB: cache.py, MODEL_CARD.md); past it the
                     least recently used idle one is swapped to the host
    kv_gib=X         the device KV budget in GiB (default: 0.9 of the device's free memory
                     after loading; on CPU no limit)
    host_gib=X       host memory in GiB for sessions swapped out of the device (default 64;
                     0: none); a new robot that fits neither is refused ``busy``
    cfg_parallel=1   under ``realtime serve --sequence-parallel 2``: the two CFG branches on the
                     two ranks (one branch's rows a rank, the flows all-gathered each pass)
                     instead of Ulysses (every rank half of each forward's heads); default 0.
                     Without a group of 2 ranks the server stops at start saying so

This module imports nothing heavy: ``models.factory.validate`` runs ``parse_options`` before a
server starts to load. A bad option is a ``ValueError`` naming it, printed as one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

KEYS = ("tokenizer", "step_cache", "sessions", "kv_gib", "host_gib", "cfg_parallel")
MAX_SESSIONS = 64
DEFAULT_SESSIONS = 2
DEFAULT_HOST_GIB = 64.0


class OptionError(ValueError):
    """A ``dreamzero`` entry option this model does not take, naming it."""


@dataclass(frozen=True)
class DreamZeroOptions:
    tokenizer: str
    step_cache: bool = False
    sessions: int = DEFAULT_SESSIONS
    kv_budget_bytes: int | None = None
    host_budget_bytes: int = int(DEFAULT_HOST_GIB * (1 << 30))
    cfg_parallel: bool = False


def parse_options(pairs: Iterable[tuple[str, str]]) -> DreamZeroOptions:
    """``(key, value)`` pairs of the entry -> ``DreamZeroOptions``; ``OptionError`` names a bad one."""
    got: dict[str, str] = {}
    for key, value in pairs:
        if key not in KEYS:
            raise OptionError(f"unknown option {key!r} (dreamzero takes {', '.join(KEYS)})")
        got[key] = value
    if "tokenizer" not in got:
        raise OptionError("option tokenizer=PATH is required: the umt5-xxl tokenizer folder "
                          "(google/umt5-xxl), which the checkpoint folder does not hold")
    tokenizer = got["tokenizer"]
    if not Path(tokenizer).is_dir():
        raise OptionError(f"option tokenizer={tokenizer}: not a folder (expected the umt5-xxl tokenizer folder)")
    step_cache = got.get("step_cache", "0")
    if step_cache not in ("0", "1"):
        raise OptionError(f"option step_cache={step_cache}: must be 0 or 1")
    sessions = got.get("sessions", str(DEFAULT_SESSIONS))
    if not sessions.isdigit() or not 1 <= int(sessions) <= MAX_SESSIONS:
        raise OptionError(f"option sessions={sessions}: must be an integer in 1..{MAX_SESSIONS}")
    kv = _gib(got, "kv_gib", positive=True)
    host = _gib(got, "host_gib", positive=False)
    cfg_parallel = got.get("cfg_parallel", "0")
    if cfg_parallel not in ("0", "1"):
        raise OptionError(f"option cfg_parallel={cfg_parallel}: must be 0 or 1")
    return DreamZeroOptions(tokenizer, step_cache == "1", int(sessions), kv,
                            int(DEFAULT_HOST_GIB * (1 << 30)) if host is None else host, cfg_parallel == "1")


def _gib(got: dict[str, str], key: str, *, positive: bool) -> int | None:
    """Option ``key`` in GiB as bytes (None when absent)."""
    if key not in got:
        return None
    try:
        value = float(got[key])
    except ValueError:
        value = float("nan")
    if not (value > 0 if positive else value >= 0) or value == float("inf"):
        raise OptionError(f"option {key}={got[key]}: must be a number of GiB {'> 0' if positive else '>= 0'}")
    return int(value * (1 << 30))
