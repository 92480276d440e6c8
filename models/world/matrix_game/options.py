"""The options of the ``matrix-game`` entry, parsed and checked before anything loads::

    realtime serve --models 'matrix-game=/ckpt/Matrix-Game-2.0?variant=gta'

    variant=base       the universal model (base_distilled_model: W/S/A/D and the mouse), default
    variant=gta        GTA driving (gta_distilled_model: W/S and the mouse's yaw steering)
    variant=templerun  Temple Run (templerun_distilled_model: 7 keys, no mouse)
    decoder=wan        the Wan VAE (default), or ``decoder=taehv:PATH`` for the small TAEHV
                       decoder whose ``taew2_1`` state dict the operator holds at PATH

A bad option is a ``ValueError`` naming it, which the CLI prints as one line at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

VARIANT_NAMES = {"base": "universal", "gta": "gta_drive", "templerun": "templerun"}
KEYS = ("variant", "decoder")


class OptionError(ValueError):
    """A ``matrix-game`` entry option this model does not take, naming it."""


@dataclass(frozen=True)
class MatrixGameOptions:
    variant: str = "universal"      # a key of config.VARIANTS
    taehv: str | None = None        # the TAEHV state dict's path; None is the Wan VAE


def parse_options(pairs: Iterable[tuple[str, str]]) -> MatrixGameOptions:
    """``(key, value)`` pairs of the entry -> ``MatrixGameOptions``; ``OptionError`` names a bad one."""
    kw: dict[str, str | None] = {}
    for key, value in pairs:
        if key not in KEYS:
            raise OptionError(f"unknown option {key!r} (matrix-game takes {', '.join(KEYS)})")
        if key == "variant":
            if value not in VARIANT_NAMES:
                raise OptionError(f"option variant={value}: must be one of {', '.join(VARIANT_NAMES)}")
            kw["variant"] = VARIANT_NAMES[value]
        else:
            kind, _, path = value.partition(":")
            if kind not in ("wan", "taehv") or (kind == "wan") != (path == ""):
                raise OptionError(f"option decoder={value}: must be 'wan' or 'taehv:PATH' (a taew2_1 state dict)")
            kw["taehv"] = path or None
    return MatrixGameOptions(**kw)
