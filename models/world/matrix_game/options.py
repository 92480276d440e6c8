"""The options of the ``matrix_game`` entry, parsed and checked before anything loads::

    realtime serve --models 'matrix_game=/ckpt/Matrix-Game-2.0?variant=gta'

    variant=base       the universal model (base_distilled_model: W/S/A/D and the mouse), default
    variant=gta        GTA driving (gta_distilled_model: W/S and the mouse's yaw steering)
    variant=templerun  Temple Run (templerun_distilled_model: 7 keys, no mouse)

A bad option is a ``ValueError`` naming it, which the CLI prints as one line at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

VARIANT_NAMES = {"base": "universal", "gta": "gta_drive", "templerun": "templerun"}
KEYS = ("variant",)


class OptionError(ValueError):
    """A ``matrix_game`` entry option this model does not take, naming it."""


@dataclass(frozen=True)
class MatrixGameOptions:
    variant: str = "universal"      # a key of config.VARIANTS


def parse_options(pairs: Iterable[tuple[str, str]]) -> MatrixGameOptions:
    """``(key, value)`` pairs of the entry -> ``MatrixGameOptions``; ``OptionError`` names a bad one."""
    kw: dict[str, str] = {}
    for key, value in pairs:
        if key not in KEYS:
            raise OptionError(f"unknown option {key!r} (matrix_game takes {', '.join(KEYS)})")
        if value not in VARIANT_NAMES:
            raise OptionError(f"option variant={value}: must be one of {', '.join(VARIANT_NAMES)}")
        kw["variant"] = VARIANT_NAMES[value]
    return MatrixGameOptions(**kw)
