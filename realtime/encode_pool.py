"""JPEG / PNG encoding in worker processes: one message per worker per loop iteration.

An implementation detail of ``realtime/media.py``'s ``Encoder``: the workers run its plain
codec, named by ``codec`` (``"module:function"``, imported in each worker), so this module
imports nothing from media.py. Encoder *threads* (the Encoder's fallback) hold the GIL for
PIL's Python around every frame, and the engine thread waits for it between its torch calls. Measured on the
H200 (bench/results/world_jpeg_threads_h200.json, 32 maze sessions): the engine's step went
from 16.5 ms in rgb8 to 24.6 ms in jpeg, and jpeg served 0.72x the frames of rgb8.
Worker processes have GILs of their own::

    encode(frames, fmt)   any session's send, on the loop; the first call of a loop
                          iteration schedules the flush (call_soon)
    flush                 that iteration's requests, each to the worker with the fewest
                          frames in flight; one pickled message per worker, written
                          without blocking the loop
    worker                a fresh interpreter (the codec's module: numpy + PIL; no torch,
                          no CUDA, never the server's __main__): encodes each request's
                          frames, replies with the payloads, in order
    reply                 read when the socket is readable; each request's future gets
                          its payloads

A launch-gated batch's 32 sends become ready in one loop iteration, so they cost the
loop one message per worker and one reply each, not 32 hand-offs.

Nothing is lost to a worker: until every worker has said it is ready, and after one dies,
stops answering (``STUCK_S``) or sends a bad reply, requests are encoded by the ``fallback``
(the Encoder's threads), the in-flight ones included; a failed worker stops the pool's use of
processes (logged once).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

log = logging.getLogger(__name__)

Fallback = Callable[[np.ndarray, str], Awaitable[list[bytes]]]
_READ_BYTES = 1 << 20
# A job this old has a stuck worker (a chunk's frames take milliseconds; a LingBot chunk of
# 480x832 frames, tens): the watchdog hands its requests to the fallback.
STUCK_S = 5.0
# multiprocessing.connection.Connection's framing (the worker's send_bytes / recv_bytes):
# a 4-byte big-endian length, or -1 and an 8-byte length for messages of 2 GiB and more.
_SHORT, _LONG = struct.Struct("!i"), struct.Struct("!Q")


def serve(fd: int, codec: str) -> None:
    """A worker process (``python -c``, started by ``EncodePool``): encode each job's requests
    with ``codec`` (``"module:function"``, called as ``function(frames, fmt)``) until the pool's
    end of the socket ``fd`` closes."""
    import signal
    from multiprocessing.connection import Connection

    module, _, name = codec.partition(":")
    encode_frames = getattr(importlib.import_module(module), name)
    # Ctrl-C reaches the whole process group; the server shuts down and closes the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    conn.send_bytes(pickle.dumps(("ready", os.getpid())))
    while True:
        try:
            job, items = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            reply = (job, [encode_frames(frames, fmt) for frames, fmt in items], None)
        except Exception as exc:  # noqa: BLE001 - reported back; the pool re-encodes those requests itself
            reply = (job, None, f"{type(exc).__name__}: {exc}")
        conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


def _frame(payload: bytes) -> bytes:
    n = len(payload)
    return (_SHORT.pack(n) if n < 0x7FFFFFFF else _SHORT.pack(-1) + _LONG.pack(n)) + payload


@dataclass
class _Request:
    frames: np.ndarray
    fmt: str
    future: asyncio.Future


def _start_worker(fd: int, codec: str) -> subprocess.Popen:
    """A fresh interpreter that imports only this module's worker and its codec (never the
    server's ``__main__``, as multiprocessing's spawn would: a script that starts a server at
    import would start one per worker), with ``fd`` its end of the socket."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where ``realtime`` is
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    return subprocess.Popen([sys.executable, "-c", f"from realtime.encode_pool import serve; serve({fd}, {codec!r})"],
                            pass_fds=(fd,), env=env, stdin=subprocess.DEVNULL, close_fds=True)


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen
    sock: socket.socket  # the pool's end, non-blocking, for the loop's reader / writer
    ready: bool = False
    alive: bool = True
    frames_in_flight: int = 0
    writing: bool = False
    out: bytearray = field(default_factory=bytearray)
    inbuf: bytearray = field(default_factory=bytearray)
    jobs: deque = field(default_factory=deque)  # (job id, requests, sent at) in the order sent
    watchdog: asyncio.TimerHandle | None = None


class EncodePool:
    """``workers`` spawned processes running ``codec`` for the running loop (create it on that
    loop); ``fallback`` encodes what they cannot."""

    def __init__(self, workers: int, codec: str, fallback: Fallback) -> None:
        self.loop = asyncio.get_running_loop()
        self._fallback_fn = fallback
        self._pending: list[_Request] = []
        self._scheduled = False
        self._ids = itertools.count(1)
        self.failed: str | None = None
        self._workers: list[_Worker] = []
        try:
            for i in range(workers):
                ours, theirs = socket.socketpair()
                try:
                    proc = _start_worker(theirs.fileno(), codec)
                finally:
                    theirs.close()
                ours.setblocking(False)
                w = _Worker(i, proc, ours)
                self._workers.append(w)
                self.loop.add_reader(ours.fileno(), self._readable, w)
        except BaseException:
            self.close()  # the workers started so far
            raise

    @property
    def usable(self) -> bool:
        """Every worker has started and none has failed (until then, ``encode`` is not called)."""
        return self.failed is None and bool(self._workers) and all(w.ready for w in self._workers)

    def encode(self, frames: np.ndarray, fmt: str) -> asyncio.Future:
        """A future of the codec's payloads for ``frames`` in ``fmt``, from a worker (or the fallback)."""
        future = self.loop.create_future()
        self._pending.append(_Request(frames, fmt, future))
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)
        return future

    def close(self) -> None:
        """Stop the workers; whatever they still hold is encoded by the fallback."""
        self._stop("the pool closed")
        for w in self._workers:
            try:
                w.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()

    # ------------------------------------------------------------------ loop callbacks
    def _flush(self) -> None:
        self._scheduled = False
        requests, self._pending = self._pending, []
        if not self.usable:
            for r in requests:
                self._fallback(r)
            return
        jobs: dict[int, list[_Request]] = {}
        for r in requests:  # each to the worker with the fewest frames in flight
            w = min(self._workers, key=lambda x: x.frames_in_flight)
            w.frames_in_flight += len(r.frames)
            jobs.setdefault(w.index, []).append(r)
        for index, group in jobs.items():
            w = self._workers[index]
            if self.failed is not None:  # an earlier write of this flush found a worker gone
                for r in group:
                    self._fallback(r)
                continue
            job = next(self._ids)
            w.jobs.append((job, group, self.loop.time()))
            if w.watchdog is None:
                w.watchdog = self.loop.call_later(STUCK_S, self._watch, w)
            w.out += _frame(pickle.dumps((job, [(r.frames, r.fmt) for r in group]), protocol=pickle.HIGHEST_PROTOCOL))
            self._write(w)

    def _write(self, w: _Worker) -> None:
        if not w.alive:
            return
        try:
            sent = w.sock.send(w.out) if w.out else 0
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._lost(w, f"write failed: {exc}")
            return
        del w.out[:sent]
        if w.out and not w.writing:
            self.loop.add_writer(w.sock.fileno(), self._write, w)
            w.writing = True
        elif not w.out and w.writing:
            self.loop.remove_writer(w.sock.fileno())
            w.writing = False

    def _readable(self, w: _Worker) -> None:
        try:
            data = w.sock.recv(_READ_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(w, f"read failed: {exc}")
            return
        if not data:
            self._lost(w, f"exited (code {w.proc.poll()})")
            return
        w.inbuf += data
        while True:
            if len(w.inbuf) < _SHORT.size:
                return
            size, head = _SHORT.unpack_from(w.inbuf)[0], _SHORT.size
            if size == -1:
                if len(w.inbuf) < head + _LONG.size:
                    return
                size, head = _LONG.unpack_from(w.inbuf, head)[0], head + _LONG.size
            if len(w.inbuf) < head + size:
                return
            message = bytes(w.inbuf[head:head + size])
            del w.inbuf[:head + size]
            try:
                self._reply(w, pickle.loads(message))
            except Exception as exc:  # noqa: BLE001 - a garbled reply: stop using workers, lose nothing
                self._lost(w, f"bad reply: {type(exc).__name__}: {exc}")
                return

    def _reply(self, w: _Worker, message: tuple) -> None:
        if message[0] == "ready":
            w.ready = True
            if self.usable:
                log.info("encoder processes ready: %d", len(self._workers))
            return
        job, payloads, error = message
        expected, group, _ = w.jobs.popleft()
        if job != expected:
            raise ValueError(f"reply for job {job}, expected {expected}")
        w.frames_in_flight -= sum(len(r.frames) for r in group)
        if error is not None or payloads is None or len(payloads) != len(group):
            for r in group:  # the fallback raises each request's own error, or encodes it
                self._fallback(r)
            return
        for r, p in zip(group, payloads):
            if not r.future.done():  # a closed session's send may have been cancelled
                r.future.set_result(p)

    def _watch(self, w: _Worker) -> None:
        """A worker whose oldest job is ``STUCK_S`` old is stuck (a chunk takes milliseconds):
        its jobs go to the fallback, as for a dead one."""
        w.watchdog = None
        if not w.alive or not w.jobs:
            return
        age = self.loop.time() - w.jobs[0][2]
        if age >= STUCK_S:
            self._lost(w, f"gave no answer for {age:.1f} s")
            return
        w.watchdog = self.loop.call_later(STUCK_S - age, self._watch, w)

    # ------------------------------------------------------------------ failure
    def _lost(self, w: _Worker, reason: str) -> None:
        if self.failed is None:
            log.warning("encoder process %d %s: encoding on threads from now on", w.index, reason)
        self._stop(f"encoder process {w.index} {reason}")

    def _stop(self, reason: str) -> None:
        self.failed = self.failed or reason
        for w in self._workers:
            if not w.alive:
                continue
            w.alive = False
            if w.watchdog is not None:
                w.watchdog.cancel()
                w.watchdog = None
            self.loop.remove_reader(w.sock.fileno())
            if w.writing:
                self.loop.remove_writer(w.sock.fileno())
            w.sock.close()  # the worker reads EOF and exits
            while w.jobs:
                for r in w.jobs.popleft()[1]:
                    self._fallback(r)
        pending, self._pending = self._pending, []
        for r in pending:
            self._fallback(r)

    def _fallback(self, r: _Request) -> None:
        if r.future.done():
            return
        task = asyncio.ensure_future(self._fallback_fn(r.frames, r.fmt))

        def done(t: asyncio.Future, future: asyncio.Future = r.future) -> None:
            if future.done():
                if not t.cancelled():
                    t.exception()  # retrieved: the caller is gone
                return
            if t.cancelled():
                future.cancel()
            elif t.exception() is not None:
                future.set_exception(t.exception())
            else:
                future.set_result(t.result())

        task.add_done_callback(done)
