"""espeak-ng in a child process, so that a text it crashes on fails one sentence, not the server.

espeak-ng is C with fixed-size buffers, and some short texts write past them: ``".a" * 97``
(194 characters, 97 letters joined by dots, which it reads as one abbreviation of 97
letters) kills its process with SIGSEGV (piper-tts 1.8.0's espeak-ng 1.52). In the
server's own process that was the server, every session at once, from one ``input.text``.
Here the child dies instead: the call raises ``EspeakFailed`` (the adapter fails that
sentence alone), and a fresh child is started at once for the next call. A child that
does not answer within ``CALL_TIMEOUT_S`` is killed the same way.

Between the two, each way: a 4-byte big-endian length, then that many bytes of UTF-8
JSON. The child first says ``{"ready": backend}`` once espeak-ng is initialised; then
each request ``{"voice", "text"}`` gets ``{"clauses": [[phonemes, terminator,
end_of_sentence], ...]}``, or ``{"error": text}`` for an exception the backend raised
(a voice espeak-ng lacks). A round trip adds ~0.1 ms to a sentence's ~1 ms of espeak-ng.

The child is ``python -m models.tts.piper.espeak_process BACKEND``; it ends when its stdin
closes (the server exited, however).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# A child's start (Python, the bridge, espeak-ng's data): ~0.3 s of CPU, longer on a loaded box.
START_TIMEOUT_S = 60.0
# One call: espeak-ng takes milliseconds for the longest sentence (2,000 characters).
CALL_TIMEOUT_S = 5.0
_LENGTH = struct.Struct(">I")
# The directory that holds the ``models`` package, for the child's import path.
_ROOT = str(Path(__file__).resolve().parents[3])


class EspeakFailed(RuntimeError):
    """espeak-ng's process died or hung on a text; the next call has a fresh one."""


class EspeakProcess:
    """One espeak-ng back end (``piper`` or ``system``) in a child process. Not thread-safe:
    the caller serialises calls (``phonemes._ESPEAK_LOCK``)."""

    def __init__(self, backend: str, *, call_timeout_s: float = CALL_TIMEOUT_S,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.name = backend
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._ready = False
        self._start()
        # The first child must come up: a back end that cannot start (not installed) is
        # said here, where the in-process one raised, not at every later call.
        self._wait_ready()
        atexit.register(self.close)

    def clauses(self, voice: str, text: str) -> list[tuple[str, str, bool]]:
        """espeak-ng's ``(phonemes, terminator, end_of_sentence)`` clauses of ``text``."""
        if self._proc is None:
            self._start()
        try:
            self._wait_ready()
            self._send({"voice": voice, "text": text})
            answer = self._receive(self.call_timeout_s)
        except EspeakFailed:
            self._restart()
            raise
        if "error" in answer:
            raise ValueError(answer["error"])
        return [(str(p), str(t), bool(e)) for p, t, e in answer["clauses"]]

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        _close_pipes(proc)  # the child ends on EOF
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # --- the parent's side ---------------------------------------------------------

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        # Its own session: a Ctrl-C meant for the server does not reach it.
        self._proc = subprocess.Popen([sys.executable, "-m", "models.tts.piper.espeak_process", self.name],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                      start_new_session=True)
        self._ready = False

    def _restart(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            _close_pipes(proc)
        self.restarts += 1
        self._start()  # it initialises while the engine goes on; the next call waits for it

    def _wait_ready(self) -> None:
        if self._ready:
            return
        answer = self._receive(self.start_timeout_s)
        if answer.get("ready") != self.name:
            raise EspeakFailed(f"espeak-ng ({self.name}) did not start: {answer}")
        self._ready = True

    def _send(self, message: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        data = json.dumps(message).encode()
        try:
            self._proc.stdin.write(_LENGTH.pack(len(data)) + data)
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise EspeakFailed(self._gone()) from None

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        (size,) = _LENGTH.unpack(self._read(fd, _LENGTH.size, deadline))
        return json.loads(self._read(fd, size, deadline))

    def _read(self, fd: int, size: int, deadline: float) -> bytes:
        parts, left = [], size
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise EspeakFailed(f"espeak-ng ({self.name}) gave no answer within "
                                   f"{self.call_timeout_s if self._ready else self.start_timeout_s:g} s")
            data = os.read(fd, left)
            if not data:
                raise EspeakFailed(self._gone())
            parts.append(data)
            left -= len(data)
        return b"".join(parts)

    def _gone(self) -> str:
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=self.call_timeout_s)
        except subprocess.TimeoutExpired:  # its stdout closed, yet it runs: end it
            self._proc.kill()
            code = self._proc.wait()
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        return f"espeak-ng ({self.name}) {how}"


def _close_pipes(proc: subprocess.Popen) -> None:
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:  # a request left in the buffer of a child that died: nobody reads it
                pass


# --- the child's side ----------------------------------------------------------------


def _serve(backend: Any, name: str) -> None:
    """Answer requests on stdin until it closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def send(message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        stdout.write(_LENGTH.pack(len(data)) + data)
        stdout.flush()

    send({"ready": name})
    while True:
        head = stdin.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return
        request = json.loads(stdin.read(_LENGTH.unpack(head)[0]))
        try:
            clauses = backend.clauses(request["voice"], request["text"])
        except Exception as exc:  # noqa: BLE001 - the parent raises it for this call alone
            send({"error": f"{type(exc).__name__}: {exc}"})
            continue
        send({"clauses": [list(c) for c in clauses]})


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from models.tts.piper.phonemes import in_process_backend

    name = sys.argv[1]
    try:
        _serve(in_process_backend(name), name)
    except BrokenPipeError:  # the parent closed it (server exit, or it gave up on this child)
        pass


if __name__ == "__main__":
    main()
