"""Frame encoding off the loop gives the same bytes, in order, as encoding inline."""

from __future__ import annotations

import asyncio
import contextlib
import io

import numpy as np
import pytest
from PIL import Image

from realtime import media


@pytest.mark.parametrize("fmt", ["jpeg", "png", "rgb8"])
def test_encode_chunk_matches_inline(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (3, 16, 24, 3), dtype=np.uint8)
    inline = media.encode_frames(frames, fmt)
    monkeypatch.setattr(media, "ENCODE_WORKERS", 2)
    assert asyncio.run(media.encode_chunk(frames, fmt)) == inline
    monkeypatch.setattr(media, "ENCODE_WORKERS", 0)
    assert asyncio.run(media.encode_chunk(frames, fmt)) == inline
    if fmt == "png":  # lossless: each payload decodes back to its own frame, in order
        for frame, payload in zip(frames, inline):
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(payload))), frame)


def test_unknown_format_raises_through_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(media, "ENCODE_WORKERS", 2)
    with pytest.raises(ValueError, match="unknown frame format"):
        asyncio.run(media.encode_chunk(np.zeros((1, 4, 4, 3), np.uint8), "webp"))


def _frames(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (n, 16, 24, 3), dtype=np.uint8)


@contextlib.asynccontextmanager
async def _running_pool():
    """The app's encoder processes for this loop, once every worker is up; stopped after."""
    pool = media.start_processes()
    assert pool is not None
    try:
        for _ in range(400):  # fresh interpreters import numpy and PIL: well under a few seconds
            if pool.usable:
                break
            await asyncio.sleep(0.025)
        assert pool.usable, "encoder processes never became ready"
        yield pool
    finally:
        media.stop_processes()


def test_processes_encode_many_sessions_in_one_iteration_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's worth of sends in one loop iteration: each gets its own frames' bytes, in order."""
    monkeypatch.setattr(media, "ENCODE_WORKERS", 2)

    async def main() -> None:
        async with _running_pool() as pool:
            chunks = [_frames(1 + i % 3, i) for i in range(12)]
            fmts = ["jpeg", "png"] * 6
            got = await asyncio.gather(*(media.encode_chunk(c, f) for c, f in zip(chunks, fmts)))
            assert got == [media.encode_frames(c, f) for c, f in zip(chunks, fmts)]
            # A request the worker cannot do raises its own error here (re-done by the fallback),
            # and the others of its iteration are unaffected.
            bad, good = media.encode_chunk(_frames(1, 99), "webp"), media.encode_chunk(chunks[0], "jpeg")
            results = await asyncio.gather(bad, good, return_exceptions=True)
            assert isinstance(results[0], ValueError) and results[1] == media.encode_frames(chunks[0], "jpeg")
            assert pool.usable  # an encoder error is the request's, not the pool's

    asyncio.run(main())


def test_a_dead_worker_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kill the workers with requests in flight: every request is still answered (by threads)."""
    monkeypatch.setattr(media, "ENCODE_WORKERS", 2)

    async def main() -> None:
        async with _running_pool() as pool:
            chunks = [_frames(2, i) for i in range(8)]
            futures = [asyncio.ensure_future(media.encode_chunk(c, "jpeg")) for c in chunks]
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
            assert await media.encode_chunk(chunks[0], "png") == media.encode_frames(chunks[0], "png")

    asyncio.run(main())


SCRIPT = """
import asyncio, os, sys
print("module level ran in", os.getpid(), flush=True)  # a script with no __main__ guard
from realtime import media
media.ENCODE_WORKERS = 2
async def main():
    pool = media.start_processes()
    for _ in range(400):
        if pool.usable:
            break
        await asyncio.sleep(0.025)
    print("usable", pool.usable, flush=True)
    media.stop_processes()
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

    monkeypatch.setattr(media, "ENCODE_WORKERS", 1)
    monkeypatch.setattr(encode_pool, "STUCK_S", 0.5)

    async def main() -> None:
        async with _running_pool() as pool:
            pool._workers[0].proc.send_signal(signal.SIGSTOP)
            try:
                chunk = _frames(2, 7)
                got = await asyncio.wait_for(media.encode_chunk(chunk, "jpeg"), 20)
                assert got == media.encode_frames(chunk, "jpeg")
                assert pool.failed and "gave no answer" in pool.failed
            finally:
                pool._workers[0].proc.send_signal(signal.SIGCONT)

    asyncio.run(main())
