#!/usr/bin/env python3
"""world.v1 ``h264`` against ``jpeg`` on rendered maze corridors: bytes, quality, encoder time.

    python -m bench.world.bench_h264 --seconds 30 --out bench/results/h264_maze_cpu.json
    python -m bench.world.bench_h264 --seconds 0.5 --height 96 --width 160 --presets ultrafast \
        --sessions 2 --out /tmp/h264_smoke.json                                       # smoke test

The maze simulator (models/maze/sim.py) renders ``--height`` x ``--width`` frames (480 x 832 by
default, a world model's size) of a camera walking and turning through maze ``--seed`` with
goal walls and their beacons, for ``--seconds`` at 16 frames/s. Each frame is then encoded:

- ``jpeg``: PIL at world.v1's ``JPEG_QUALITY`` (92), one payload a frame, as the server sends it;
- ``h264``: the server's libx264 encoder (realtime/video.py ``H264Encoder``: zero latency, no
  B-frames, CBR-like at ``--bitrate-kbps``), one stream, once per preset in ``--presets``
  (the server's preset, ``realtime.video.PRESET``, is marked).

and decoded back (PIL; PyAV's H.264 decoder, then ``rgb_from_yuv420``: full-range BT.601 with
chroma sampled bilinearly, as a browser's GPU draws a decoded frame) to measure it against
the raw frames: bytes a frame (mean, and the first, an IDR), PSNR (RGB, mean and worst frame)
and SSIM (luma, 11x11 Gaussian window, sigma 1.5), and the encoder's ms a frame with this
process pinned to one core (RGB in, payload out: the colour conversion counts), wall clock and
the thread's CPU time (the CPU time is the encoder's own when other work shares the core; the
load average is recorded). ``--sessions`` streams then encode the same frames at once on
threads, unpinned, as a server's sessions do: frames/s each, against the 16 a session needs.
``yuv420_round_trip``: the frames through the colour conversions alone (RGB -> 4:2:0 -> RGB),
the PSNR ceiling of any 4:2:0 stream decoded that way. The JSON holds the hardware, versions and
the command.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F_nn
from PIL import Image

from bench.machine import cpu_name
from models.maze.goals import make_goals
from models.maze.sim import MazeSim, make_maze
from protocols import annexb
from protocols.world_v1 import DEFAULT_BITRATE_KBPS, JPEG_QUALITY, KEY_NAMES
from realtime import video

FPS = 16.0
GOALS = {"bytes_per_frame_ratio_max": 0.2, "encode_ms_per_frame_one_core_max": 8.0, "sessions_fps_min": 16.0}
# The walk: (held keys, frames), repeated: corridors, turns both ways, strafing, a look up and down.
SCRIPT = ((("w",), 24), (("w", "l"), 16), (("j",), 12), (("w",), 20), (("d",), 8), (("w", "j"), 16),
          (("i",), 4), (("k",), 4), (("l",), 24), (("s",), 8), (("w", "l"), 12), (("a",), 8))


def keys_at(i: int) -> list[float]:
    """The 8 action bits of frame ``i`` of the looping ``SCRIPT``."""
    period = sum(n for _, n in SCRIPT)
    i %= period
    for held, n in SCRIPT:
        if i < n:
            return [1.0 if k in held else 0.0 for k in KEY_NAMES]
        i -= n
    raise AssertionError("unreachable")


def render(seed: int, frames: int, height: int, width: int) -> np.ndarray:
    """``[frames, height, width, 3]`` uint8: the camera's view after each step of the walk."""
    grid, start, _ = make_maze(seed)
    sim = MazeSim([seed], goals=[make_goals(seed, "wall", grid, start)], height=height, width=width)
    out = np.empty((frames, height, width, 3), np.uint8)
    for i in range(frames):
        out[i] = sim.render()[0].numpy()
        sim.step(torch.tensor([keys_at(i)]))
    return out


# ------------------------------------------------------------------ quality
def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def _gauss(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float32) - size // 2
    g = torch.exp(-x ** 2 / (2 * sigma ** 2))
    return g / g.sum()


GAUSS = _gauss()


def _blur(x: torch.Tensor) -> torch.Tensor:
    """The 11x11 Gaussian window as two 1-D passes (valid region only)."""
    k = GAUSS.to(x.dtype)
    return F_nn.conv2d(F_nn.conv2d(x, k[None, None, :, None]), k[None, None, None, :])


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM of the luma (BT.601) of two RGB frames (Wang et al. 2004: 11x11 Gaussian, sigma 1.5)."""
    w = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float32)
    x = (torch.tensor(a, dtype=torch.float32) @ w)[None, None]
    y = (torch.tensor(b, dtype=torch.float32) @ w)[None, None]
    mx, my = _blur(x), _blur(y)
    vx = _blur(x * x) - mx ** 2
    vy = _blur(y * y) - my ** 2
    cxy = _blur(x * y) - mx * my
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))
    return float(s.mean())


def quality(raw: np.ndarray, decoded: list[np.ndarray], payloads: list[bytes], ms: list[float],
            cpu_ms: list[float]) -> dict[str, Any]:
    if len(decoded) != len(raw):
        raise RuntimeError(f"{len(decoded)} frames decoded from {len(raw)}")
    p = [psnr(r, d) for r, d in zip(raw, decoded)]
    s = [ssim(r, d) for r, d in zip(raw, decoded)]
    sizes = [len(x) for x in payloads]
    return {"bytes_per_frame_mean": statistics.fmean(sizes), "bytes_first_frame": sizes[0],
            "bytes_per_frame_after_first": statistics.fmean(sizes[1:]) if len(sizes) > 1 else None,
            "kbit_per_s": statistics.fmean(sizes) * 8 * FPS / 1000,
            "psnr_db_mean": statistics.fmean(p), "psnr_db_min": min(p),
            "ssim_mean": statistics.fmean(s), "ssim_min": min(s),
            "encode_ms_per_frame_median": statistics.median(ms), "encode_ms_per_frame_mean": statistics.fmean(ms),
            "encode_ms_per_frame_p99": float(np.percentile(ms, 99)),
            "encode_cpu_ms_per_frame_median": statistics.median(cpu_ms),
            "encode_cpu_ms_per_frame_mean": statistics.fmean(cpu_ms)}


# ------------------------------------------------------------------ codecs
def run_jpeg(raw: np.ndarray) -> dict[str, Any]:
    payloads, ms, cpu_ms = [], [], []
    for frame in raw:
        c0, t0 = time.thread_time(), time.perf_counter()
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="JPEG", quality=JPEG_QUALITY)
        ms.append((time.perf_counter() - t0) * 1000)
        cpu_ms.append((time.thread_time() - c0) * 1000)
        payloads.append(buf.getvalue())
    decoded = [np.asarray(Image.open(io.BytesIO(p)).convert("RGB")) for p in payloads]
    return {"quality": JPEG_QUALITY, **quality(raw, decoded, payloads, ms, cpu_ms)}


def h264_settings(raw: np.ndarray, bitrate: int, profile: str) -> video.H264Settings:
    return video.H264Settings(raw.shape[1], raw.shape[2], FPS, bitrate, profile)


# Full-range BT.601 Y'CbCr -> RGB (JFIF's inverse matrix; realtime.video.yuv420_planes is the forward one).
CB_TO_RGB = torch.tensor([0.0, -0.344136, 1.772])
CR_TO_RGB = torch.tensor([1.402, -0.714136, 0.0])


def rgb_from_yuv420(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """Full-range 4:2:0 planes -> ``[H, W, 3]`` uint8 RGB, chroma upsampled bilinearly (centred
    samples, as ``yuv420_planes`` averages them): what a browser's GPU does with a decoded frame."""
    c = torch.from_numpy(np.stack([cb, cr])).float()[None] - 128.0
    c = F_nn.interpolate(c, size=y.shape, mode="bilinear", align_corners=False)[0]
    rgb = torch.from_numpy(y).float()[..., None] + c[0, ..., None] * CB_TO_RGB + c[1, ..., None] * CR_TO_RGB
    return rgb.round_().clamp_(0, 255).to(torch.uint8).numpy()


def planes(frame: Any) -> list[np.ndarray]:
    """A decoded PyAV frame's planes without FFmpeg's row padding."""
    return [np.frombuffer(p, np.uint8).reshape(p.height, p.line_size)[:, :p.width] for p in frame.planes]


def decode_h264(units: list[bytes]) -> list[np.ndarray]:
    import av

    ctx = av.CodecContext.create("h264", "r")
    frames = [f for u in units for f in ctx.decode(av.Packet(u))] + list(ctx.decode(None))
    if any(f.format.name != video.PIX_FMT for f in frames):
        raise RuntimeError(f"decoded {frames[0].format.name}, not the encoder's {video.PIX_FMT}")
    return [rgb_from_yuv420(*planes(f)) for f in frames]


def run_h264(raw: np.ndarray, preset: str, bitrate: int, profile: str) -> dict[str, Any]:
    settings = h264_settings(raw, bitrate, profile)
    enc = video.H264Encoder(settings, preset=preset)
    units, ms, cpu_ms = [], [], []
    for frame in raw:
        c0, t0 = time.thread_time(), time.perf_counter()
        units += enc.encode(frame[None])
        ms.append((time.perf_counter() - t0) * 1000)
        cpu_ms.append((time.thread_time() - c0) * 1000)
    idrs = sum(annexb.is_key_frame(u) for u in units)
    return {"preset": preset, "profile": profile, "bitrate_kbps": bitrate, "codec": settings.codec, "idr_frames": idrs,
            **quality(raw, decode_h264(units), units, ms, cpu_ms)}


def run_round_trip(raw: np.ndarray) -> dict[str, Any]:
    """RGB -> 4:2:0 -> RGB through the same conversions as the encoder and decoder, no codec:
    the most PSNR an h264 stream decoded this way can have."""
    back = [rgb_from_yuv420(*video.yuv420_planes(f)) for f in raw]
    p = [psnr(r, d) for r, d in zip(raw, back)]
    s = [ssim(r, d) for r, d in zip(raw, back)]
    return {"psnr_db_mean": statistics.fmean(p), "psnr_db_min": min(p), "ssim_mean": statistics.fmean(s)}


def run_sessions(raw: np.ndarray, sessions: int, bitrate: int) -> dict[str, Any]:
    """``sessions`` streams encoding ``raw`` at once, one thread each (as the server's), unpinned."""
    settings = h264_settings(raw, bitrate, "baseline")
    took: list[float] = [0.0] * sessions

    def one(i: int) -> None:
        enc = video.H264Encoder(settings)
        t0 = time.perf_counter()
        for frame in raw:
            enc.encode(frame[None])
        took[i] = time.perf_counter() - t0

    threads = [threading.Thread(target=one, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fps = [len(raw) / t for t in took]
    return {"sessions": sessions, "preset": video.PRESET, "frames_per_s_per_session_min": min(fps),
            "frames_per_s_per_session_mean": statistics.fmean(fps), "cores": len(os.sched_getaffinity(0))}


# ------------------------------------------------------------------ record
def environment() -> dict[str, Any]:
    import av

    return {"hardware": {"cpu": cpu_name(), "cores": len(os.sched_getaffinity(0))},
            "versions": {"python": platform.python_version(), "torch": torch.__version__, "av": av.__version__,
                         "libavcodec": ".".join(map(str, av.library_versions["libavcodec"])),
                         "pillow": Image.__version__}}


def goals(result: dict[str, Any]) -> dict[str, Any]:
    jpeg, h264 = result["jpeg"], result["h264"][video.PRESET]
    ratio = h264["bytes_per_frame_mean"] / jpeg["bytes_per_frame_mean"]
    out = {"bytes_per_frame_h264_over_jpeg": ratio,
           "bytes_within_goal": ratio <= GOALS["bytes_per_frame_ratio_max"],
           "psnr_at_least_jpeg": h264["psnr_db_mean"] >= jpeg["psnr_db_mean"],
           "encode_ms_within_goal": h264["encode_ms_per_frame_median"] <= GOALS["encode_ms_per_frame_one_core_max"],
           "encode_cpu_ms_within_goal":
               h264["encode_cpu_ms_per_frame_median"] <= GOALS["encode_ms_per_frame_one_core_max"]}
    if result.get("sessions"):
        out["sessions_within_goal"] = result["sessions"]["frames_per_s_per_session_min"] >= GOALS["sessions_fps_min"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--bitrate-kbps", type=int, default=DEFAULT_BITRATE_KBPS)
    parser.add_argument("--presets", nargs="+", default=["ultrafast", "superfast", "veryfast"])
    parser.add_argument("--sessions", type=int, default=4, help="streams at once for the threads measurement (0: none)")
    parser.add_argument("--core", type=int, default=None, help="the core to pin to (default: this process's first)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if video.PRESET not in args.presets:
        args.presets.append(video.PRESET)
    frames = max(2, round(args.seconds * FPS))
    t0 = time.perf_counter()
    raw = render(args.seed, frames, args.height, args.width)
    render_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "question": "h264 against jpeg q92 on rendered maze corridors: bytes, PSNR/SSIM, encoder ms on one core",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.world.bench_h264 " + " ".join(sys.argv[1:] if argv is None else argv),
        **environment(),
        "frames": frames, "height": args.height, "width": args.width, "fps": FPS, "seed": args.seed,
        "render_s": render_s, "server_preset": video.PRESET, "goals_asked": GOALS,
        # Other work on the machine makes wall-clock times long; the thread CPU times are this encoder's own.
        "load_average_at_start": os.getloadavg(),
    }
    cores = sorted(os.sched_getaffinity(0))
    core = args.core if args.core is not None else cores[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {core})  # "one core": the encoders' timings below
    try:
        result["pinned_core"] = core
        result["jpeg"] = run_jpeg(raw)
        result["h264"] = {p: run_h264(raw, p, args.bitrate_kbps, "baseline") for p in args.presets}
        result["h264_main"] = run_h264(raw, video.PRESET, args.bitrate_kbps, "main")
        result["yuv420_round_trip"] = run_round_trip(raw)
    finally:
        os.sched_setaffinity(0, set(cores))
        torch.set_num_threads(threads)  # main() runs inside the test process too: leave torch as it was
    if args.sessions:
        result["sessions"] = run_sessions(raw, args.sessions, args.bitrate_kbps)
    result["load_average_at_end"] = os.getloadavg()
    result["goals"] = goals(result)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return result


if __name__ == "__main__":
    out = main()
    j, h = out["jpeg"], out["h264"][video.PRESET]
    print(f"jpeg: {j['bytes_per_frame_mean']:.0f} B/frame, {j['psnr_db_mean']:.2f} dB, SSIM {j['ssim_mean']:.4f}, "
          f"{j['encode_ms_per_frame_median']:.2f} ms")
    for p, r in out["h264"].items():
        print(f"h264 {p}: {r['bytes_per_frame_mean']:.0f} B/frame, {r['psnr_db_mean']:.2f} dB, SSIM "
              f"{r['ssim_mean']:.4f}, {r['encode_ms_per_frame_median']:.2f} ms")
    print(json.dumps(out["goals"]), json.dumps(out.get("sessions")))
