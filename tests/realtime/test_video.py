"""realtime/video.py: libx264 through PyAV, decoded back with PyAV's H.264 decoder (real codecs, CPU)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from realtime import video
from protocols.annexb import NAL_IDR, NAL_PPS, NAL_SLICE, NAL_SPS, nal_types
from realtime.video import H264Encoder, H264Settings, H264Stream, IdrPlan

av = pytest.importorskip("av", reason="the video extra (PyAV) is not installed")

H, W = 96, 160


def scene(n: int, h: int = H, w: int = W) -> np.ndarray:
    """``n`` frames of a smooth picture panning right, 2 pixels a frame (a turn, roughly)."""
    y, x = np.mgrid[0:h, 0:w * 2].astype(np.float32)
    base = np.stack([128 + 90 * np.sin(x / 17), 128 + 90 * np.cos(y / 13), 128 + 60 * np.sin((x + y) / 23)], -1)
    return np.stack([base[:, 2 * i:2 * i + w] for i in range(n)]).clip(0, 255).astype(np.uint8)


def decode(units: list[bytes]) -> list[np.ndarray]:
    ctx = av.CodecContext.create("h264", "r")
    out = []
    for unit in units:
        out += [f.to_ndarray(format="rgb24") for f in ctx.decode(av.Packet(unit))]
    out += [f.to_ndarray(format="rgb24") for f in ctx.decode(None)]
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * np.log10(255 ** 2 / mse)


def settings(**kw) -> H264Settings:
    return H264Settings(**{"height": H, "width": W, "fps": 16.0, "bitrate_kbps": 2500, "profile": "baseline", **kw})


def is_idr(unit: bytes) -> bool:
    return NAL_IDR in nal_types(unit)




def test_frames_go_in_as_jpeg_colours_full_range_with_2x2_mean_chroma():
    from PIL import Image

    rgb = scene(1)[0]
    y, cb, cr = video.yuv420_planes(rgb)
    assert y.shape == (H, W) and cb.shape == cr.shape == (H // 2, W // 2)
    jfif = np.asarray(Image.fromarray(rgb).convert("YCbCr")).astype(int)      # JPEG's matrix
    assert np.abs(y.astype(int) - jfif[..., 0]).max() <= 1
    mean = jfif[..., 1:].reshape(H // 2, 2, W // 2, 2, 2).mean((1, 3))
    assert np.abs(np.stack([cb, cr], -1) - mean).max() <= 1.5
    extremes = np.array([[[0, 0, 0], [255, 255, 255]]] * 2, np.uint8)        # the full range is used
    y, cb, cr = video.yuv420_planes(extremes)
    assert y.tolist() == [[0, 255], [0, 255]] and cb.item() == cr.item() == 128


def test_the_stream_says_full_range_and_decodes_to_the_colours_it_was_given():
    grey_red = np.zeros((8, H, W, 3), np.uint8)
    grey_red[:, :, : W // 2] = (128, 128, 128)
    grey_red[:, :, W // 2:] = (200, 30, 40)
    units = H264Encoder(settings()).encode(grey_red)
    ctx = av.CodecContext.create("h264", "r")
    frame = [f for u in units for f in ctx.decode(av.Packet(u))][0]
    assert frame.format.name == video.PIX_FMT                      # the VUI's full-range flag, read back
    back = frame.to_ndarray(format="rgb24").astype(int)
    assert np.abs(back[H // 2, 8] - (128, 128, 128)).max() <= 3
    assert np.abs(back[H // 2, W - 8] - (200, 30, 40)).max() <= 4


def test_the_bitrate_is_a_ceiling_under_which_quality_is_constant():
    frames = scene(64)
    noisy = np.clip(frames + np.random.default_rng(0).integers(-40, 40, frames.shape), 0, 255).astype(np.uint8)

    def kbit_per_s(kbps: int, clip: np.ndarray) -> float:
        units = H264Encoder(settings(bitrate_kbps=kbps)).encode(clip)
        return sum(map(len, units[16:])) * 8 / 1000 / ((len(units) - 16) / 16.0)

    assert kbit_per_s(100, noisy) <= 100 * 1.1                   # noise would take far more
    assert kbit_per_s(20000, noisy) > 4 * kbit_per_s(100, noisy)
    assert kbit_per_s(20000, frames) < 0.5 * kbit_per_s(20000, noisy)  # a quiet scene costs less


def test_the_stream_decodes_back_close_to_the_input():
    frames = scene(24)
    units = H264Encoder(settings()).encode(frames)
    assert len(units) == 24
    decoded = decode(units)
    assert len(decoded) == 24 and decoded[0].shape == (H, W, 3)
    worst = min(psnr(a, b) for a, b in zip(frames, decoded))
    assert worst > 32, worst


def test_the_first_frame_is_an_idr_with_its_headers_and_the_rest_are_p_frames():
    units = H264Encoder(settings()).encode(scene(6))
    assert nal_types(units[0])[:2] == [NAL_SPS, NAL_PPS] and is_idr(units[0])
    assert all(nal_types(u) == [NAL_SLICE] for u in units[1:])
    ctx = av.CodecContext.create("h264", "r")
    kinds = [av.video.frame.PictureType(f.pict_type).name for u in units for f in ctx.decode(av.Packet(u))]
    assert kinds == ["I", "P", "P", "P", "P", "P"]  # no B-frames, each frame out as soon as it is in


def test_a_forced_idr_repeats_the_headers():
    enc = H264Encoder(settings())
    units = enc.encode(scene(4)) + enc.encode(scene(4)[::-1], idr_at=1)
    assert [is_idr(u) for u in units] == [True, False, False, False, False, True, False, False]
    assert nal_types(units[5])[:2] == [NAL_SPS, NAL_PPS]
    assert len(decode(units)) == 8


@pytest.mark.parametrize("profile, codec", [("baseline", "avc1.42C01F"), ("main", "avc1.4D401F")])
def test_the_codec_string_is_the_streams_sps(profile, codec):
    s = settings(profile=profile)
    assert s.codec == codec
    unit = H264Encoder(s).encode(scene(1))[0]
    sps = unit[unit.index(b"\x00\x00\x01\x67") + 4:][:3]
    assert f"avc1.{sps.hex().upper()}" == codec


def test_levels_and_sizes():
    assert video.level_for(480, 832, 16) == 31
    assert video.level_for(720, 1280, 30) == 31
    assert video.level_for(1080, 1920, 30) == 40
    with pytest.raises(ValueError, match="over H.264 level 5.1"):
        video.level_for(4320, 7680, 60)
    with pytest.raises(ValueError, match="even frame size"):
        settings(height=63)


def test_idr_plan_one_idr_a_chunk_whatever_the_requests():
    plan = IdrPlan()
    assert plan.plan(0) == (True, None)      # a fresh encoder: frame 0 is its IDR
    for _ in range(5):
        plan.ask()
    assert plan.plan(0) == (False, None)     # chunk 0 (streamed in parts) had its IDR
    assert plan.plan(1) == (False, 0)        # one IDR for the five requests
    assert plan.plan(1) == (False, None)
    plan.ask()
    assert plan.plan(1) == (False, None)     # asked in chunk 1, which has one: next chunk
    assert plan.plan(2) == (False, 0)
    assert plan.plan(3) == (False, None)
    plan.ask()
    plan.restart()                           # reset: a new stream, the request is met by its IDR
    assert plan.plan(0) == (True, None)
    assert plan.plan(1) == (False, None)


def test_a_stream_encodes_in_order_off_the_loop_and_restarts_with_an_idr():
    async def main():
        stream = H264Stream(settings(), "s1")
        frames = scene(9)
        chunks = [await stream.encode(frames[i:i + 3], i // 3) for i in (0, 3)]
        for _ in range(10):
            stream.keyframe()
        chunks.append(await stream.encode(frames[6:9], 2))
        chunks.append(await stream.encode(frames[0:3], 3))
        stream.restart()
        chunks.append(await stream.encode(frames[3:6], 0))
        stream.close()
        stream.close()
        with pytest.raises(RuntimeError, match="closed"):
            await stream.encode(frames[:1], 1)
        return chunks

    chunks = asyncio.run(main())
    assert [[is_idr(u) for u in c] for c in chunks] == [
        [True, False, False], [False, False, False], [True, False, False], [False, False, False],
        [True, False, False]]
    assert len(decode([u for c in chunks for u in c])) == 15


def test_missing_names_the_extra(monkeypatch):
    assert video.h264_missing() is None
    monkeypatch.setitem(__import__("sys").modules, "av", None)
    assert video.h264_missing() == ("this server has no H.264 encoder (PyAV is not installed: "
                                    "pip install 'realtime-sessions[video]')")
