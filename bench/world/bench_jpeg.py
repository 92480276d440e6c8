"""JPEG per frame: PIL (one thread, and the server's encoder pool) vs nvJPEG (batched, on CUDA).

The two paths a world chunk's jpeg frames can take (models/world/device_jpeg.py picks
between them on the first batch; this measures them side by side at fixed sizes,
smooth and noisy images, a batch of ``--batch`` and one frame alone):

    python -m bench.world.bench_jpeg --sizes 480x832 64x64 --batch 32 --out bench/results/jpeg_paths.json

nvJPEG rows are null where torchvision or CUDA is missing. Progress on stderr.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from bench.report import emit
from models.world.device_jpeg import encode_nvjpeg, encode_pil, nvjpeg_available
from protocols.world_v1 import JPEG_QUALITY


def _images(kind: str, n: int, h: int, w: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    if kind == "noise":
        return rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 127 // max(h + w - 2, 1)], -1)
    return np.stack([(base + 3 * i) % 256 for i in range(n)]).astype(np.uint8)


def _ms_per_frame(fn: Callable[[], Any], frames: int, repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    fn()  # warm: codec set-up, thread start
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1000 / frames)
    return statistics.median(times)


def measure(h: int, w: int, batch: int, workers: int, repeats: int) -> list[dict[str, Any]]:
    rows = []
    pool = ThreadPoolExecutor(workers) if workers > 0 else None
    nv = nvjpeg_available()
    for kind in ("smooth", "noise"):
        host = _images(kind, batch, h, w)
        row: dict[str, Any] = {"height": h, "width": w, "image": kind, "batch": batch, "quality": JPEG_QUALITY,
                               "bytes_per_frame": len(encode_pil(host[0]))}
        row["pil_ms_per_frame"] = _ms_per_frame(lambda: [encode_pil(f) for f in host], batch, repeats)
        if pool is not None:
            row["pil_pool_workers"] = workers
            row["pil_pool_ms_per_frame"] = _ms_per_frame(lambda: list(pool.map(encode_pil, host)), batch, repeats)
        row["nvjpeg_batch_ms_per_frame"] = row["nvjpeg_single_ms_per_frame"] = None
        if nv:
            import torch

            dev = [f for f in torch.from_numpy(host).cuda()]
            sync = torch.cuda.synchronize
            row["nvjpeg_batch_ms_per_frame"] = _ms_per_frame(lambda: encode_nvjpeg(dev), batch, repeats, sync)
            row["nvjpeg_single_ms_per_frame"] = _ms_per_frame(lambda: encode_nvjpeg(dev[:1]), 1, repeats, sync)
            row["nvjpeg_bytes_per_frame"] = len(encode_nvjpeg(dev[:1])[0])
        best = min(("pil", row["pil_ms_per_frame"]), ("pil_pool", row.get("pil_pool_ms_per_frame") or 1e9),
                   ("nvjpeg_batch", row["nvjpeg_batch_ms_per_frame"] or 1e9), key=lambda kv: kv[1])
        row["fastest"] = best[0]
        print(f"[bench_jpeg] {row}", file=sys.stderr, flush=True)
        rows.append(row)
    if pool is not None:
        pool.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=["480x832", "64x64"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=None, help="PIL pool threads (default: the server's)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch

    import realtime.media

    workers = realtime.media.ENCODE_WORKERS if args.workers is None else args.workers
    rows = []
    for size in args.sizes:
        h, w = (int(v) for v in size.split("x"))
        rows += measure(h, w, args.batch, workers, args.repeats)
    emit({
        "benchmark": "jpeg per frame: PIL on one thread and on the encoder pool vs nvJPEG batched on CUDA",
        "command": " ".join([sys.executable.split("/")[-1], "-m", "bench.world.bench_jpeg", *sys.argv[1:]]),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
        "torchvision": _torchvision_version(), "python": platform.python_version(),
        "rows": rows,
    }, args.out)


def _torchvision_version() -> str | None:
    try:
        import torchvision
    except ImportError:
        return None
    return str(torchvision.__version__)


if __name__ == "__main__":
    main()
