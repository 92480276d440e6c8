"""One ``realtime serve`` process on a free loopback port, no nginx, its whole log kept to be checked.

The end-to-end tests and the fuzz and soak benchmarks run the server as an operator does (a
subprocess with uvicorn's own logging, stdout and stderr to one file), so a traceback from any
thread, asyncio callback or uvicorn itself lands in a log they can read, not in a capture that
hides it. It is one ``Replica`` (deploy/replicas.py) started on its own::

    with ServerProcess(models="tiny", policy="dummy") as server:
        ...  # clients on ws://{server.addr}/v1/realtime/...
        assert server.problems() == []
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

from deploy.replicas import Replica, ReplicaSpec, free_ports

HOST = "127.0.0.1"
# What no client input may ever put in the server log.
PROBLEM = re.compile(r"Traceback|Exception in |exception was never retrieved|\bERROR\b|\bCRITICAL\b")


class ServerProcess:
    """``realtime serve`` on ``models`` and ``policy`` (and the voice with ``tts``) on ``device``.

    A context manager: entering starts the process and waits for ``/healthz``; leaving drains it
    (SIGTERM, then SIGKILL past the drain timeout) and removes its log.
    """

    def __init__(self, *, tts: bool = False, policy: str = "dummy", models: str = "tiny", device: str = "cpu",
                 start_timeout_s: float = 120.0, serve_args: Sequence[str] = ()) -> None:
        self.serve_args = ["--models", models, "--policy", policy, "--device", device, "--log-level", "info",
                           *([] if tts else ["--no-tts"]), *serve_args]
        self.start_timeout_s = start_timeout_s
        (self.port,) = free_ports(HOST, 1)
        self.addr = f"{HOST}:{self.port}"
        self.replica: Replica | None = None
        self._log_dir: Path | None = None

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.replica.proc if self.replica is not None else None

    def __enter__(self) -> ServerProcess:
        self._log_dir = Path(tempfile.mkdtemp(prefix="realtime-serve-"))
        self.replica = Replica(ReplicaSpec(0, HOST, self.port), self.serve_args, self._log_dir)
        self.replica.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.replica.healthy():
            if not self.replica.alive:
                message = f"server exited with {self.replica.proc.returncode}:\n{self.log_text()[-3000:]}"
                self.stop()
                raise RuntimeError(message)
            if time.monotonic() > deadline:
                message = f"server did not start in {self.start_timeout_s} s:\n{self.log_text()[-3000:]}"
                self.stop()
                raise RuntimeError(message)
            time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.replica is not None:
            self.replica.stop()
        # What mattered is checked (problems()) before the server stops; keep /tmp clean.
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    @property
    def alive(self) -> bool:
        return self.replica is not None and self.replica.alive

    def healthy(self) -> bool:
        """``/healthz`` answers 200 within 5 s (a server just past a burst of hostile input may be slow)."""
        return self.replica is not None and self.replica.healthy(timeout_s=5.0)

    def log_text(self) -> str:
        return self.replica.log_text() if self.replica is not None else ""

    def problems(self) -> list[str]:
        """Log lines no client input may cause (tracebacks, errors), each with a little context."""
        lines = self.log_text().splitlines()
        return ["\n".join(lines[max(0, i - 2): i + 8]) for i, line in enumerate(lines) if PROBLEM.search(line)]
