"""How one world session's frames are encoded: the app's per-frame encoder, or its H.264 stream.

``jpeg``, ``png`` and ``rgb8`` go through the app's ``Encoder`` (realtime/media.py), each
frame alone. ``h264`` is one stream per session (realtime/video.py): ``h264_settings``
checks a create before anything is taken (``format_unavailable`` on a server without
libx264, ``bad_request`` for a frame size H.264 cannot carry), ``start`` makes the stream
once the session exists, and the endpoint restarts it at reset and failure (the next
frame an IDR) and closes it with the session.
"""

from __future__ import annotations

import numpy as np

from models.world.base import WorldGeometry
from protocols import world_v1 as wire
from realtime import video
from realtime.media import Encoder
from sessions import ErrorCode, SessionError


def h264_settings(req: wire.CreateRequest, geometry: WorldGeometry) -> video.H264Settings | None:
    """The session's stream settings for an ``h264`` create (None for another format), or the
    ``SessionError`` that refuses the create, naming what is missing or wrong."""
    if req.format != "h264":
        return None
    missing = video.h264_missing()
    if missing is not None:
        raise SessionError(ErrorCode.FORMAT_UNAVAILABLE, missing)
    try:
        return video.H264Settings(
            geometry.height, geometry.width, geometry.fps,
            req.bitrate_kbps if req.bitrate_kbps is not None else wire.DEFAULT_BITRATE_KBPS,
            req.profile if req.profile is not None else wire.DEFAULT_H264_PROFILE)
    except ValueError as exc:
        raise SessionError(ErrorCode.BAD_REQUEST, f"format h264: {exc}") from None


class SessionFrames:
    """One connection's frame encoding for its session of the moment (event loop only)."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.format = "jpeg"
        self.h264: video.H264Stream | None = None

    def start(self, fmt: str, h264: video.H264Settings | None, session_id: str) -> str | None:
        """A new session's encoding; the ``codec`` its ``session.created`` names (h264 only)."""
        self.close()
        self.format = fmt
        if h264 is None:
            return None
        self.h264 = video.H264Stream(h264, session_id)
        return self.h264.codec

    async def encode(self, frames: np.ndarray, chunk_index: int) -> list[bytes]:
        """One payload a frame of chunk ``chunk_index``, in order, off the loop where that pays."""
        if self.h264 is not None:
            return await self.h264.encode(frames, chunk_index)
        return await self.encoder.encode(frames, self.format)

    def keyframe(self) -> None:
        """The client's ``keyframe``: nothing to do but for an h264 stream."""
        if self.h264 is not None:
            self.h264.keyframe()

    def restart(self) -> None:
        """Reset, eviction or a failed tick: the stream's state is freed, its next frame an IDR."""
        if self.h264 is not None:
            self.h264.restart()

    def close(self) -> None:
        h264, self.h264 = self.h264, None
        if h264 is not None:
            h264.close()
