"""A world.v1 ``h264`` session on the client: its access units kept as they came, written
as an MP4 without re-encoding, and decoded to pictures (PyAV, the ``video`` extra).

Each binary frame of an ``h264`` session is one access unit in Annex B, SPS and PPS
before each IDR. The MP4 is made by letting FFmpeg's raw H.264 parser read the units back
(it finds SPS/PPS for the ``avcC`` box and the frame boundaries) and copying its packets
into the MP4 muxer with one timestamp a frame at the session's ``fps``: the bytes the
server encoded are the bytes in the file.
"""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import numpy as np

from protocols.annexb import is_key_frame

INSTALL_HINT = "pip install 'realtime-sessions[video]'"


def pyav_missing() -> str | None:
    """Why this client cannot mux or decode H.264 (None: it can)."""
    try:
        import av  # noqa: F401
    except ImportError:
        return f"--format h264 needs PyAV to write or decode the stream ({INSTALL_HINT})"
    return None


class H264Recording:
    """The access units of one stream, from its first IDR on (a unit before it cannot be
    decoded, so a file could not start with it)."""

    def __init__(self, fps: float) -> None:
        self.fps = Fraction(fps).limit_denominator(1001)
        self.units: list[bytes] = []
        self.skipped = 0  # units that came before the first IDR

    def add(self, access_unit: bytes) -> None:
        if not self.units and not is_key_frame(access_unit):
            self.skipped += 1
            return
        self.units.append(access_unit)

    def write_mp4(self, path: str | Path) -> int:
        """Write the stream as an MP4 at ``path``; returns the frames written."""
        import av

        if not self.units:
            raise ValueError("no H.264 key frame was received: nothing to write")
        time_base = 1 / self.fps
        with av.open(io.BytesIO(b"".join(self.units)), format="h264") as raw, \
                av.open(str(path), "w", format="mp4") as mp4:
            source = raw.streams.video[0]
            stream = mp4.add_stream_from_template(source)
            stream.time_base = time_base
            written = 0
            for packet in raw.demux(source):
                if packet.size == 0:  # the parser's end-of-stream marker
                    continue
                # The raw stream has no clock: frame n is at n / fps, shown for 1 / fps.
                packet.pts = packet.dts = written
                packet.duration = 1
                packet.time_base = time_base
                packet.stream = stream
                mp4.mux(packet)
                written += 1
        return written

    def last_frame(self) -> np.ndarray:
        """The last frame as ``[H, W, 3]`` uint8 RGB (the stream decoded from its first IDR)."""
        import av

        decoder = av.CodecContext.create("h264", "r")
        last = None
        for unit in self.units:
            for frame in decoder.decode(av.Packet(unit)):
                last = frame
        for frame in decoder.decode(None):
            last = frame
        if last is None:
            raise ValueError("the H.264 stream decoded to no frame")
        return last.to_ndarray(format="rgb24")
