"""Decoding maze-sim's chunk info ``map`` (``models/maze/seen_map.py`` ``map_info``) in Python, as
clients/web/robot_episode.js does on the page."""

from __future__ import annotations

import base64
from typing import Any, Mapping

import numpy as np

from models.maze.seen_map import MAP_FLOATS, MAP_POSE


def map_from_info(info: Mapping[str, Any]) -> np.ndarray:
    """``map_info``'s inverse: the [MAP_FLOATS] float32 row."""
    bits = np.unpackbits(np.frombuffer(base64.b64decode(info["cells"]), np.uint8))[:MAP_FLOATS - MAP_POSE]
    return np.concatenate([np.asarray(info["pose"], np.float32), bits.astype(np.float32)])
