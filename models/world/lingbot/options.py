"""The opt-in shortcuts of the ``lingbot`` entry: parsed, checked and named before anything loads.

They come after the checkpoint folder as ``key=value`` pairs (``models.factory.parse_entry``)::

    realtime serve --models 'lingbot=/ckpt?steps=2&reuse_kv=1&fp8=ffn&decoder=taehv:/w/taew2_1.pth'

    steps=N          denoising passes per block, 1..4 (default 4): the first N timesteps of the
                     distilled schedule (``pipeline.denoising_timesteps``)
    reuse_kv=1       the last denoising pass writes the block's K/V; no committing pass (default 0)
    fp8=GROUPS       e4m3 linear layers with per-row scales (``fp8.py``): ``ffn``, ``attn``
                     (self-attention q/k/v and out), ``cross`` (cross-attention), ``all``, or
                     several joined by ``+`` (default: none, bf16)
    decoder=wan      the Wan VAE (default), or ``decoder=taehv:PATH`` for a TAEHV decoder
                     whose ``taew2_1`` state dict is at PATH
    size=HxW         the frame size, multiples of 16 (default 480x832); not a shortcut: the
                     model at another size (a tiny checkpoint served in a test)

With no option the exact path runs: 4 passes and the committing pass, bf16, the Wan VAE.
A bad option is a ``ValueError`` naming it, which the CLI prints as one line at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

STEPS = (1, 2, 3, 4)
FP8_GROUPS = ("ffn", "attn", "cross")
DECODERS = ("wan", "taehv")
KEYS = ("steps", "reuse_kv", "fp8", "decoder", "size")
# Each side of ``size``: a multiple of the VAE stride times the patch (16), at most this.
MAX_SIDE = 1920


class OptionError(ValueError):
    """A ``lingbot`` entry option this model does not take, naming it."""


@dataclass(frozen=True)
class LingBotOptions:
    steps: int = 4
    reuse_kv: bool = False
    fp8: tuple[str, ...] = ()          # groups of FP8_GROUPS, in that order; () is bf16
    taehv: str | None = None           # the TAEHV state dict's path; None is the Wan VAE
    size: tuple[int, int] | None = None  # (height, width); None: the server's (480x832)

    @property
    def exact(self) -> bool:
        """No shortcut: the path whose outputs the tests pin (at any size)."""
        return (self.steps, self.reuse_kv, self.fp8, self.taehv) == (4, False, (), None)

    @property
    def passes_per_block(self) -> int:
        return self.steps + (0 if self.reuse_kv else 1)

    def query(self) -> str:
        """The options as an entry's query (``""`` for the exact path); parses back to ``self``."""
        parts = []
        if self.steps != 4:
            parts.append(f"steps={self.steps}")
        if self.reuse_kv:
            parts.append("reuse_kv=1")
        if self.fp8:
            parts.append("fp8=" + "+".join(self.fp8))
        if self.taehv is not None:
            parts.append(f"decoder=taehv:{self.taehv}")
        if self.size is not None:
            parts.append(f"size={self.size[0]}x{self.size[1]}")
        return "&".join(parts)


def parse_options(pairs: Iterable[tuple[str, str]]) -> LingBotOptions:
    """``(key, value)`` pairs of the entry -> ``LingBotOptions``; ``OptionError`` names a bad one."""
    got: dict[str, str] = {}
    for key, value in pairs:
        if key not in KEYS:
            raise OptionError(f"unknown option {key!r} (lingbot takes {', '.join(KEYS)})")
        got[key] = value
    kw: dict = {}
    if "steps" in got:
        v = got["steps"]
        if not v.isdigit() or int(v) not in STEPS:
            raise OptionError(f"option steps={v}: must be an integer in {STEPS[0]}..{STEPS[-1]}")
        kw["steps"] = int(v)
    if "reuse_kv" in got:
        v = got["reuse_kv"]
        if v not in ("0", "1"):
            raise OptionError(f"option reuse_kv={v}: must be 0 or 1")
        kw["reuse_kv"] = v == "1"
    if "fp8" in got:
        kw["fp8"] = _fp8_groups(got["fp8"])
    if "decoder" in got:
        v = got["decoder"]
        kind, _, path = v.partition(":")
        if kind not in DECODERS or (kind == "wan") != (path == ""):
            raise OptionError(f"option decoder={v}: must be 'wan' or 'taehv:PATH' (a taew2_1 state dict)")
        kw["taehv"] = path if kind == "taehv" else None
    if "size" in got:
        kw["size"] = _size(got["size"])
    return LingBotOptions(**kw)


def _size(value: str) -> tuple[int, int]:
    h, x, w = value.partition("x")
    if not (x and h.isdigit() and w.isdigit()) or not all(
            16 <= int(n) <= MAX_SIDE and int(n) % 16 == 0 for n in (h, w)):
        raise OptionError(f"option size={value}: must be HEIGHTxWIDTH, each a multiple of 16 in 16..{MAX_SIDE}")
    return int(h), int(w)


def _fp8_groups(value: str) -> tuple[str, ...]:
    names = value.split("+")
    if names == ["all"]:
        return FP8_GROUPS
    if names == ["none"]:
        return ()
    bad = [n for n in names if n not in FP8_GROUPS]
    if bad or len(set(names)) != len(names):
        raise OptionError(f"option fp8={value}: must be 'all', 'none' or groups of "
                          f"{', '.join(FP8_GROUPS)} joined by '+'")
    return tuple(g for g in FP8_GROUPS if g in names)
