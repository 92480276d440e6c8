"""world.v1 ``format: "h264"``: one H.264 stream per session, libx264 through PyAV.

The media layer's video codec (``media.py`` has the per-frame ones): models return frames,
the edge encodes. One ``H264Stream`` per session, made at ``session.create`` and ended at
its close; its libx264 encoder is built on the stream's own thread at the first frame
after create, reset or failure, so that frame is an IDR carrying SPS and PPS::

    loop thread (H264Stream)                      the stream's thread (H264Encoder)
    encode(frames, chunk_index) -> IdrPlan.plan -> [new encoder?] encode, one AU a frame
    keyframe()                  -> IdrPlan.ask     (the next planned frame is an IDR)
    restart()  (reset, failure) -> IdrPlan.restart  + the encoder dropped in turn
    close()                     -> the encoder dropped, the thread ends

One thread a stream, not the app's pool: an H.264 stream is a chain of frames, so a
session's frames must be encoded in order by one encoder; x264 releases the GIL while it
encodes, so the event loop runs on. The libx264 settings are a game stream's (as
FlashDreams' NVENC ones): ``tune=zerolatency`` (no B-frames, no lookahead, one access unit
out per frame in), ``bframes=0``, no scene-cut or periodic IDR (an IDR comes only at the
start, after reset and when the client asks), constant quality (``CRF``) under a ceiling
(``vbv-maxrate`` = the bitrate, a one-second ``vbv-bufsize``), Annex B with SPS/PPS repeated before each IDR,
one thread. ``PRESET`` is picked on rendered maze corridors (bench/world/bench_h264.py).
Frames go in as full-range BT.601 4:2:0 (JPEG's colours: ``yuv420_planes``), flagged so
in the stream's VUI, so a decoder draws them back as JPEG's are drawn.

PyAV is the ``video`` extra (GPL through the FFmpeg and x264 it bundles); without it
``h264_missing`` says what to install and the endpoint refuses ``h264``.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from protocols.world_v1 import H264_PROFILES

log = logging.getLogger(__name__)

CODEC = "libx264"
# FFmpeg's name for full-range 4:2:0, which libx264 takes and flags as such in its VUI.
PIX_FMT = "yuvj420p"
INSTALL_HINT = "pip install 'realtime-sessions[video]'"
# 480x832 maze frames on one core (AMD EPYC, bench/results/h264_maze_cpu.json), CPU ms a frame
# (colour conversion included) and bytes a frame at CRF 24: ultrafast 4.8 ms / 3.2 KB, superfast
# 5.5 / 3.0, veryfast 7.2 / 2.5. superfast: two thirds of the 8 ms budget, so 4 sessions at 16
# frames/s take a third of a core beside the model on a 2-core box; veryfast's 15 % fewer bytes
# cost 1.3x the time and leave no margin.
PRESET = "superfast"
# Constant quality under the client's bitrate ceiling: on the same frames CRF 24 kept 44.55 dB
# of PSNR at 2,966 bytes a frame, against JPEG q92's 44.35 dB at 17,934 (CRF 23: 45.02 dB at
# 6,029; CRF 26: 44.35 dB at 2,607), bench/results/h264_maze_cpu.json.
CRF = 24
# (profile_idc, constraint flags) of x264's SPS for each world.v1 profile: baseline is
# constrained baseline (constraint_set0 and set1), as WebCodecs' "avc1.42C0.." names it.
PROFILE_IDC = {"baseline": (0x42, 0xC0), "main": (0x4D, 0x40)}
# H.264 levels (Table A-1): level_idc, most macroblocks a frame, most macroblocks a second.
# 3.1 at least: what browsers decode everywhere; the smallest that holds the stream is used.
LEVELS = ((31, 3600, 108000), (32, 5120, 216000), (40, 8192, 245760), (42, 8704, 522240),
          (50, 22080, 589824), (51, 36864, 983040))


# RGB -> full-range BT.601 Y'CbCr in 16-bit fixed point (JFIF's matrix, as libjpeg's): Y's
# weights over 2^16, Cb's and Cr's over 2^18 since they take the sum of a 2 x 2 block.
Y_WEIGHTS = (19595, 38470, 7471)
CB_WEIGHTS = (-11059, -21709, 32768)
CR_WEIGHTS = (32768, -27439, -5329)


def yuv420_planes(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[H, W, 3]`` uint8 RGB (H, W even) -> full-range Y ``[H, W]``, Cb and Cr ``[H/2, W/2]``.

    Chroma is the mean of each 2 x 2 block, as a JPEG encoder takes it. FFmpeg's own
    conversion (``reformat("yuv420p")``) is limited range with a cruder chroma filter: on
    rendered maze frames it alone cost 3.5 dB of PSNR against the raw RGB, more than
    libx264 did at its default quality (bench/results/h264_maze_cpu.json)."""
    x = torch.from_numpy(rgb).to(torch.int32)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    y = (r * Y_WEIGHTS[0] + g * Y_WEIGHTS[1] + b * Y_WEIGHTS[2] + (1 << 15)) >> 16
    s = x[0::2, 0::2] + x[1::2, 0::2] + x[0::2, 1::2] + x[1::2, 1::2]
    r, g, b = s[..., 0], s[..., 1], s[..., 2]
    offset = (128 << 18) + (1 << 17)
    cb = (r * CB_WEIGHTS[0] + g * CB_WEIGHTS[1] + b * CB_WEIGHTS[2] + offset) >> 18
    cr = (r * CR_WEIGHTS[0] + g * CR_WEIGHTS[1] + b * CR_WEIGHTS[2] + offset) >> 18
    return tuple(p.clamp_(0, 255).to(torch.uint8).numpy() for p in (y, cb, cr))  # type: ignore[return-value]


def h264_missing() -> str | None:
    """What this server lacks to encode ``h264`` (None: nothing): PyAV, or its libx264."""
    try:
        import av
    except ImportError:
        return f"this server has no H.264 encoder (PyAV is not installed: {INSTALL_HINT})"
    try:
        av.codec.Codec(CODEC, "w")
    except Exception:  # noqa: BLE001 - PyAV's FFmpeg built without x264: any error says the same
        return f"this server has no H.264 encoder (PyAV's FFmpeg has no {CODEC}: {INSTALL_HINT})"
    return None


def level_for(height: int, width: int, fps: float) -> int:
    """The smallest H.264 ``level_idc`` (3.1 at least) whose limits hold ``height x width`` at
    ``fps``; ValueError naming the size when none does."""
    mbs = ((width + 15) // 16) * ((height + 15) // 16)
    for level, max_fs, max_mbps in LEVELS:
        if mbs <= max_fs and mbs * fps <= max_mbps:
            return level
    raise ValueError(f"{width}x{height} at {fps:g} fps is over H.264 level 5.1")


def codec_string(profile: str, level: int) -> str:
    """The RFC 6381 ``avc1.PPCCLL`` string that WebCodecs' ``VideoDecoder.configure`` takes."""
    idc, flags = PROFILE_IDC[profile]
    return f"avc1.{idc:02X}{flags:02X}{level:02X}"


@dataclass(frozen=True)
class H264Settings:
    """One session's stream: its frame size and rate, and the client's ``bitrate_kbps`` and ``profile``."""

    height: int
    width: int
    fps: float
    bitrate_kbps: int
    profile: str

    def __post_init__(self) -> None:
        if self.profile not in H264_PROFILES:
            raise ValueError(f"profile must be one of {', '.join(H264_PROFILES)}, got {self.profile!r}")
        if self.height % 2 or self.width % 2:
            raise ValueError(f"h264 needs an even frame size (4:2:0), the model makes {self.width}x{self.height}")
        level_for(self.height, self.width, self.fps)

    @property
    def level(self) -> int:
        return level_for(self.height, self.width, self.fps)

    @property
    def codec(self) -> str:
        return codec_string(self.profile, self.level)


class H264Encoder:
    """One libx264 stream (PyAV): ``[T, H, W, 3]`` uint8 RGB frames in, one Annex B access unit
    a frame out. Not thread-safe: one thread uses it (``H264Stream``'s)."""

    def __init__(self, settings: H264Settings, preset: str = PRESET) -> None:
        import av

        s = self.settings = settings
        rate = Fraction(s.fps).limit_denominator(1001)
        ctx = av.CodecContext.create(CODEC, "w")
        ctx.width, ctx.height, ctx.pix_fmt = s.width, s.height, PIX_FMT
        ctx.time_base, ctx.framerate = 1 / rate, rate
        ctx.thread_count = 1
        level = s.level
        params = ":".join((
            "bframes=0", "keyint=infinite", "scenecut=0", "repeat-headers=1", "annexb=1", "threads=1",
            f"crf={CRF}", "fullrange=on", "colormatrix=smpte170m",  # the VUI says: full-range BT.601 (yuv420_planes)
            f"level={level // 10}.{level % 10}", f"vbv-maxrate={s.bitrate_kbps}", f"vbv-bufsize={s.bitrate_kbps}",
        ))
        ctx.options = {"preset": preset, "tune": "zerolatency", "profile": s.profile, "forced-idr": "1",
                       "x264-params": params}
        ctx.open()
        self._ctx: Any = ctx
        self._av = av
        self._pts = 0

    def encode(self, frames: np.ndarray, idr_at: int | None = None) -> list[bytes]:
        """One access unit per frame, in order; frame ``idr_at`` of ``frames`` is an IDR (and the
        encoder's very first frame always is)."""
        av = self._av
        out: list[bytes] = []
        for i, rgb in enumerate(frames):
            frame = self._frame(rgb)
            frame.pts = self._pts
            self._pts += 1
            if i == idr_at:
                frame.pict_type = av.video.frame.PictureType.I
            packets = self._ctx.encode(frame)
            # zerolatency: no lookahead and no B-frames, so each frame comes straight out.
            if len(packets) != 1:
                raise RuntimeError(f"libx264 gave {len(packets)} packets for one frame (zero latency gives 1)")
            out.append(bytes(packets[0]))
        return out

    def _frame(self, rgb: np.ndarray) -> Any:
        frame = self._av.VideoFrame(self.settings.width, self.settings.height, PIX_FMT)
        for plane, data in zip(frame.planes, yuv420_planes(rgb)):
            if plane.line_size != data.shape[1]:   # FFmpeg's rows may be padded for alignment
                rows = np.zeros((data.shape[0], plane.line_size), np.uint8)
                rows[:, :data.shape[1]] = data
                data = rows
            plane.update(data)
        return frame

    def close(self) -> None:
        self._ctx = None


class IdrPlan:
    """Which frame of the next encode is an IDR: pure bookkeeping, on the event loop.

    A fresh encoder (the session's first chunk, after reset or a failure) starts with an
    IDR; a client's ``keyframe`` asks for one at the next frame encoded. A chunk has at most
    one IDR, however many requests came: a request made in a chunk that had one waits for
    the next chunk, and any number of requests before a frame is one IDR::

        chunk 0  [IDR P P]          fresh encoder
        chunk 1  [P P P]            keyframe x5 asked during chunk 1's send
        chunk 2  [IDR P P]          one IDR for the five
    """

    def __init__(self) -> None:
        self.fresh = True              # the next encode builds a new encoder (its frame 0 an IDR)
        self.asked = False             # a keyframe was asked for and not given yet
        self._idr_chunk: int | None = None  # the chunk whose frames hold the last IDR

    def ask(self) -> None:
        self.asked = True

    def restart(self) -> None:
        self.fresh, self.asked, self._idr_chunk = True, False, None

    def plan(self, chunk_index: int) -> tuple[bool, int | None]:
        """For the next frames (all of chunk ``chunk_index``): (build a new encoder, the index
        of the frame to force as an IDR or None)."""
        fresh = self.fresh
        if fresh:
            self.fresh, self.asked, self._idr_chunk = False, False, chunk_index
            return True, None
        if self.asked and self._idr_chunk != chunk_index:
            self.asked, self._idr_chunk = False, chunk_index
            return False, 0
        return False, None


class H264Stream:
    """One session's H.264 stream (module docstring): loop-side calls, libx264 on its own thread."""

    def __init__(self, settings: H264Settings, session_id: str) -> None:
        self.settings = settings
        self.session_id = session_id
        self.plan = IdrPlan()
        self._encoder: H264Encoder | None = None  # the thread's alone
        self._thread: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix=f"h264-{session_id}"[:15])

    @property
    def codec(self) -> str:
        return self.settings.codec

    async def encode(self, frames: np.ndarray, chunk_index: int) -> list[bytes]:
        """One access unit per frame of chunk ``chunk_index``, off the loop, in call order."""
        if self._thread is None:
            raise RuntimeError(f"session {self.session_id}: its h264 stream is closed")
        fresh, idr_at = self.plan.plan(chunk_index)
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._encode, frames, fresh, idr_at)

    def _encode(self, frames: np.ndarray, fresh: bool, idr_at: int | None) -> list[bytes]:
        if fresh or self._encoder is None:
            self._drop()
            self._encoder = H264Encoder(self.settings)
        return self._encoder.encode(frames, idr_at)

    def keyframe(self) -> None:
        """The client's ``keyframe``: an IDR at the next frame, at most one a chunk (``IdrPlan``)."""
        self.plan.ask()

    def restart(self) -> None:
        """Reset or a failed session: the encoder's state is freed (after any encode in flight)
        and the next frame starts a new stream with an IDR."""
        self.plan.restart()
        if self._thread is not None:
            self._thread.submit(self._drop)

    def close(self) -> None:
        """Free the encoder after any encode in flight and end the thread; idempotent."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.submit(self._drop)
            thread.shutdown(wait=False)

    def _drop(self) -> None:
        encoder, self._encoder = self._encoder, None
        if encoder is not None:
            encoder.close()
