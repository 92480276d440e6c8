"""H.264 access units in Annex B, as world.v1 ``format: "h264"`` carries them (one a binary message).

Pure Python: what the server's encoder (realtime/video.py), the Python client (clients/h264.py)
and the tests need to read of an access unit, its NAL unit types.
"""

from __future__ import annotations

NAL_SLICE = 1  # a slice of a non-IDR picture
NAL_IDR = 5  # a slice of an IDR picture: the stream can start here
NAL_SPS = 7  # sequence parameter set (repeated before every IDR)
NAL_PPS = 8  # picture parameter set (repeated before every IDR)


def nal_types(access_unit: bytes) -> list[int]:
    """The NAL unit types of an Annex B access unit, in order (7 SPS, 8 PPS, 5 IDR slice, 1 slice)."""
    types, at = [], 0
    while (at := access_unit.find(b"\x00\x00\x01", at)) >= 0:
        at += 3
        if at < len(access_unit):
            types.append(access_unit[at] & 0x1F)
    return types


def is_key_frame(access_unit: bytes) -> bool:
    """The access unit holds an IDR slice."""
    return NAL_IDR in nal_types(access_unit)
