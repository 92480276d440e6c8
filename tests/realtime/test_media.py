"""realtime/media.py: every path of ``Encoder.encode`` gives the plain encoding's bytes, in order."""

from __future__ import annotations

import asyncio
import contextlib
import io

import numpy as np
import pytest
from PIL import Image

from realtime import media


@pytest.mark.parametrize("fmt", media.FORMATS)
def test_encode_on_threads_and_inline_matches_the_plain_encoding(fmt: str) -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (3, 16, 24, 3), dtype=np.uint8)
    plain = media.encode_frames(frames, fmt)
    for workers in (2, 0):  # no processes started: threads, then inline on the loop
        encoder = media.Encoder(workers=workers)
        try:
            assert asyncio.run(encoder.encode(frames, fmt)) == plain
        finally:
            encoder.close()
    if fmt == "png":  # lossless: each payload decodes back to its own frame, in order
        for frame, payload in zip(frames, plain):
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(payload))), frame)
    if fmt == "rgb8":
        assert plain == [f.tobytes() for f in frames]


def test_unknown_format_raises_through_the_pool() -> None:
    encoder = media.Encoder(workers=2)
    with pytest.raises(ValueError, match="unknown frame format"):
        asyncio.run(encoder.encode(np.zeros((1, 4, 4, 3), np.uint8), "webp"))
    encoder.close()


def test_the_default_workers_leave_two_cores_and_need_four() -> None:
    assert [media.default_workers(n) for n in (1, 2, 3, 4, 5, 6, 16)] == [0, 0, 0, 2, 3, 4, 4]
    assert media.Encoder(workers=None).workers == media.default_workers()
    with pytest.raises(ValueError, match="0 or more"):
        media.Encoder(workers=-1)


def _frames(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (n, 16, 24, 3), dtype=np.uint8)


@contextlib.asynccontextmanager
async def _running_pool(encoder: media.Encoder):
    """The encoder's processes for this loop, once every worker is up; stopped after."""
    pool = encoder.start()
    assert pool is not None
    try:
        for _ in range(400):  # fresh interpreters import numpy and PIL: well under a few seconds
            if pool.usable:
                break
            await asyncio.sleep(0.025)
        assert pool.usable, "encoder processes never became ready"
        yield pool
    finally:
        encoder.close()


def test_processes_encode_many_sessions_in_one_iteration_exactly() -> None:
    """A batch's worth of sends in one loop iteration: each gets its own frames' bytes, in order."""
    encoder = media.Encoder(workers=2)

    async def main() -> None:
        async with _running_pool(encoder) as pool:
            chunks = [_frames(1 + i % 3, i) for i in range(12)]
            fmts = ["jpeg", "png"] * 6
            got = await asyncio.gather(*(encoder.encode(c, f) for c, f in zip(chunks, fmts)))
            assert got == [media.encode_frames(c, f) for c, f in zip(chunks, fmts)]
            # A request the worker cannot do raises its own error here (re-done by the fallback),
            # and the others of its iteration are unaffected.
            bad, good = encoder.encode(_frames(1, 99), "webp"), encoder.encode(chunks[0], "jpeg")
            results = await asyncio.gather(bad, good, return_exceptions=True)
            assert isinstance(results[0], ValueError) and results[1] == media.encode_frames(chunks[0], "jpeg")
            assert pool.usable  # an encoder error is the request's, not the pool's

    asyncio.run(main())


def test_a_dead_worker_loses_nothing() -> None:
    """Kill the workers with requests in flight: every request is still answered (by threads)."""
    encoder = media.Encoder(workers=2)

    async def main() -> None:
        async with _running_pool(encoder) as pool:
            chunks = [_frames(2, i) for i in range(8)]
            futures = [asyncio.ensure_future(encoder.encode(c, "jpeg")) for c in chunks]
            await asyncio.sleep(0)  # the flush has run: the jobs are written
            for w in pool._workers:
                w.proc.kill()
            got = await asyncio.wait_for(asyncio.gather(*futures), 30)
            assert got == [media.encode_frames(c, "jpeg") for c in chunks]
            for _ in range(200):
                if pool.failed:
                    break
                await asyncio.sleep(0.025)
            assert pool.failed and not pool.usable
            assert await encoder.encode(chunks[0], "png") == media.encode_frames(chunks[0], "png")

    asyncio.run(main())


SCRIPT = """
import asyncio, os, sys
print("module level ran in", os.getpid(), flush=True)  # a script with no __main__ guard
from realtime import media
encoder = media.Encoder(workers=2)
async def main():
    pool = encoder.start()
    for _ in range(400):
        if pool.usable:
            break
        await asyncio.sleep(0.025)
    print("usable", pool.usable, flush=True)
    encoder.close()
asyncio.run(main())
"""


def test_workers_never_run_the_servers_main_script(tmp_path) -> None:
    """Workers are fresh interpreters: a script without a ``__main__`` guard runs once, not once per worker."""
    import os
    import subprocess
    import sys

    script = tmp_path / "serve_unguarded.py"
    script.write_text(SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("module level ran") == 1 and "usable True" in proc.stdout, proc.stdout


def test_a_stuck_worker_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that stops answering (SIGSTOP) is given up after STUCK_S: its requests are answered."""
    import signal

    from realtime import encode_pool

    monkeypatch.setattr(encode_pool, "STUCK_S", 0.5)
    encoder = media.Encoder(workers=1)

    async def main() -> None:
        async with _running_pool(encoder) as pool:
            pool._workers[0].proc.send_signal(signal.SIGSTOP)
            try:
                chunk = _frames(2, 7)
                got = await asyncio.wait_for(encoder.encode(chunk, "jpeg"), 20)
                assert got == media.encode_frames(chunk, "jpeg")
                assert pool.failed and "gave no answer" in pool.failed
            finally:
                pool._workers[0].proc.send_signal(signal.SIGCONT)

    asyncio.run(main())


# ---------------------------------------------------------------------- CUDA frames
def test_without_cuda_or_torchvision_the_device_path_is_pil():
    if media.nvjpeg_available():
        pytest.skip("nvJPEG is available here")
    torch = pytest.importorskip("torch")
    for path in (None, media.NVJPEG):  # measured or asked for: falls back cleanly, nothing encoded
        device = media.DeviceJpeg(path)
        assert device.encode([torch.zeros(4, 4, 3, dtype=torch.uint8)]) is None
        assert device.path == media.PIL


def test_a_bad_cuda_jpeg_path_is_refused():
    with pytest.raises(ValueError, match="cuda jpeg path must be one of"):
        media.DeviceJpeg("gpu")
    with pytest.raises(ValueError, match="cuda jpeg path must be one of"):
        media.Encoder(cuda_jpeg="gpu")


def test_a_cpu_encoder_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from realtime import media; e = media.Encoder(workers=0, cuda_jpeg=None); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_the_pick_times_each_path_after_an_untimed_first_call():
    """A first call's one-time cost (a codec's set-up, a plugin's import) is not timed."""
    import time

    calls: list[int] = []

    def path() -> int:
        calls.append(len(calls))
        if len(calls) == 1:
            time.sleep(0.2)   # the set-up
        return len(calls)

    ms, value = media.time_warm(path)
    assert len(calls) == 1 + media.MEASURE_REPEATS and value == 1 + media.MEASURE_REPEATS
    assert ms < 100


needs_nvjpeg = pytest.mark.skipif(not media.nvjpeg_available(), reason="needs CUDA and torchvision (nvJPEG)")


def _decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@needs_nvjpeg
def test_nvjpeg_batch_decodes_back_to_the_frames():
    import torch

    frames = [torch.full((48, 64, 3), v, dtype=torch.uint8, device="cuda") for v in (10, 120, 250)]
    payloads = media.encode_nvjpeg(frames)
    assert len(payloads) == 3
    for v, data in zip((10, 120, 250), payloads):
        assert data[:2] == b"\xff\xd8"  # a JPEG start-of-image marker
        assert abs(int(np.median(_decode(data))) - v) <= 2


@needs_nvjpeg
def test_nvjpeg_gives_the_plain_encodings_image():
    """The fast path against the plain one: other bytes (another encoder), the same picture.
    On CPU, PIL's 4:2:0 and 4:4:4 of these frames differ by 0.4 on average from each other
    and by 0.45-0.55 from the frames."""
    import torch

    y, x = np.mgrid[0:480, 0:832].astype(np.float32)
    host = np.stack([np.stack([x / 832 * 255, y / 480 * 255, np.full_like(x, 40 * k + 60)], -1).astype(np.uint8)
                     for k in range(4)])
    host[:, 100:200, 300:500] = (200, 30, 90)
    nv = media.encode_nvjpeg(list(torch.from_numpy(host).cuda()))
    plain = media.encode_frames(host, "jpeg")
    assert len(nv) == len(plain) == 4
    for a, b, frame in zip(nv, plain, host):
        da, db = _decode(a).astype(int), _decode(b).astype(int)
        assert da.shape == db.shape == frame.shape
        assert np.abs(da - db).mean() < 1.5
        assert np.abs(da - frame).mean() < 1.5 and np.abs(db - frame).mean() < 1.5
