"""``realtime serve`` run as a process by the tests: waiting for it to be ready."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_until_ready(proc: subprocess.Popen, port: int, timeout_s: float = 60.0) -> None:
    """Until the server on loopback ``port`` answers ``/healthz`` with ``OK``; fails with its
    output if the process ends or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).text == "OK":
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout and proc.stdout.read()
        time.sleep(0.1)
