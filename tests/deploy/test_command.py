"""``python -m deploy.replicas``: one command starts the replicas and nginx, and SIGTERM stops all."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from deploy.replicas import port_free
from tests.deploy.conftest import requires_nginx

pytestmark = requires_nginx


def _free_run(count: int) -> int:
    """A port p with p .. p+count-1 all free (nginx on p, the replicas above it)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65536 and all(port_free("127.0.0.1", base + i) for i in range(count)):
            return base
    pytest.skip("no run of free ports")


def _refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return False
    except OSError:
        return True


def test_one_command_starts_replicas_and_nginx_and_sigterm_stops_all(tmp_path):
    port = _free_run(3)
    proc = subprocess.Popen([sys.executable, "-m", "deploy.replicas", "--replicas", "2", "--port", str(port),
                             "--nginx-workers", "1", "--log-dir", str(tmp_path), "--",
                             "--models", "tiny", "--no-tts", "--policy", "", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        while line and not line.startswith("serving on"):
            line = proc.stdout.readline()
        assert line.startswith(f"serving on http://127.0.0.1:{port} via nginx; replicas "
                               f"127.0.0.1:{port + 1}, 127.0.0.1:{port + 2}"), line
        seen = {httpx.get(f"http://127.0.0.1:{port}/healthz").headers["X-Upstream"] for _ in range(4)}
        assert seen == {f"127.0.0.1:{port + 1}", f"127.0.0.1:{port + 2}"}  # round robin without a session_id
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(40) == 0
        for p in (port, port + 1, port + 2):
            assert _refuses(p), p
        assert {f.name for f in tmp_path.iterdir()} == {"replica-0.log", "replica-1.log"}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
