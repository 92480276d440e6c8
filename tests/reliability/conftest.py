"""The fault server as a real process on a free loopback port (tests/reliability/faulty_server.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from realtime.server.server import free_port

REPO = Path(__file__).resolve().parents[2]


class FaultServer:
    def __init__(self, *, tts: bool = False, port: int | None = None, drain_timeout_s: float | None = None) -> None:
        self.tts = tts
        self.drain_timeout_s = drain_timeout_s
        self.port = port or free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="faulty-serve-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> float:
        """Start and wait for ``/healthz`` OK; the seconds it took."""
        cmd = [sys.executable, "-m", "tests.reliability.faulty_server", "--port", str(self.port)]
        if self.tts:
            cmd.append("--tts")
        if self.drain_timeout_s is not None:
            cmd += ["--drain-timeout", str(self.drain_timeout_s)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        started = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                if httpx.get(f"http://{self.addr}/healthz", timeout=1.0).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server did not start:\n{self.log_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def close(self) -> None:
        self.stop()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def metrics(self) -> str:
        return httpx.get(f"http://{self.addr}/metrics", timeout=5).text

    def sample(self, name: str, **labels: str) -> float:
        """One sample of ``/metrics`` (labels in any order)."""
        for line in self.metrics().splitlines():
            if not line.startswith(name + ("{" if labels else " ")):
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if all(got.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError((name, labels))


@pytest.fixture
def fault_server() -> Iterator[FaultServer]:
    server = FaultServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


def robot_obs(prompt: str = "go") -> dict:
    return {"cam": np.zeros((16, 16, 3), np.uint8), "state": np.zeros(2, np.float32), "prompt": prompt}
