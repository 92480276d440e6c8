"""A real server process on a free loopback port, its whole log captured.

The fuzz benchmark and the hostile-input tests run the server as ``realtime serve``
does (a subprocess, uvicorn's own logging, stdout and stderr to one file), so a
traceback from any thread, asyncio callback or uvicorn itself lands in the log that
they check, not in a pytest capture that hides it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from realtime.server import free_port

REPO = Path(__file__).resolve().parents[2]
# What no client input may ever put in the server log.
PROBLEM = re.compile(r"Traceback|Exception in |exception was never retrieved|\bERROR\b|\bCRITICAL\b")


class ServerProcess:
    """``python -m realtime serve`` on the tiny world, the dummy policy and (``tts``) the voice, on ``device``."""

    def __init__(self, *, tts: bool = False, policy: str = "dummy", models: str = "tiny",
                 device: str = "cpu", start_timeout_s: float = 120.0, serve_args: tuple[str, ...] = ()) -> None:
        self.tts, self.policy, self.models, self.device = tts, policy, models, device
        self.serve_args = serve_args  # more ``realtime serve`` options
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="realtime-serve-", suffix=".log", delete=False)
        self.log_path = Path(self._log.name)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        cmd = [sys.executable, "-m", "realtime", "serve", "--models", self.models, "--policy", self.policy,
               "--device", self.device, "--port", str(self.port), "--log-level", "info"]
        if not self.tts:
            cmd.append("--no-tts")
        cmd += self.serve_args
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                if httpx.get(f"http://{self.addr}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not start in {self.start_timeout_s} s:\n{self.log_text()[-3000:]}")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        # What mattered is checked (problems()) before the server stops; keep /tmp clean.
        self.log_path.unlink(missing_ok=True)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://{self.addr}/healthz", timeout=5.0).text == "OK"
        except httpx.HTTPError:
            return False

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def problems(self) -> list[str]:
        """Log lines no client input may cause (tracebacks, errors), with a little context."""
        lines = self.log_text().splitlines()
        return ["\n".join(lines[max(0, i - 2): i + 8]) for i, line in enumerate(lines) if PROBLEM.search(line)]
