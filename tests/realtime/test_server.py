"""realtime/server/server.py: the access log switch and the second Ctrl-C, on a real
``realtime serve`` subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import websockets

from models.policy.dummy import PROBE_METADATA
from protocols.openpi import pack
from realtime.server.server import free_port, uvicorn_config
from tests.support.process import wait_until_ready

ROOT = Path(__file__).resolve().parents[2]


def test_the_access_log_is_on_unless_turned_off():
    async def app(scope, receive, send):  # pragma: no cover - never called
        pass

    assert uvicorn_config(app, host="127.0.0.1", port=0).access_log is True
    assert uvicorn_config(app, host="127.0.0.1", port=0, access_log=False).access_log is False


def observation() -> dict:
    h, w = PROBE_METADATA.image_resolution
    obs: dict = {key: np.zeros((h, w, 3), np.uint8) for key in PROBE_METADATA.image_keys}
    obs[PROBE_METADATA.state_key] = np.zeros(PROBE_METADATA.state_dim, np.float32)
    obs[PROBE_METADATA.prompt_key] = "go"
    return obs


def test_a_second_ctrl_c_during_the_drain_exits_at_once_with_130_and_no_access_lines():
    """A policy call of 30 s holds the drain (deadline 60 s); the second SIGINT ends it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime", "serve", "--port", str(port), "--models", "tiny",
         "--policy", "dummy=30000", "--no-tts", "--no-access-log", "--drain-timeout", "60"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(proc, port)

        async def interrupt_twice_during_a_call() -> tuple[bool, float, int]:
            async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime/robot/openpi", max_size=None) as ws:
                assert isinstance(await ws.recv(), bytes)  # the policy's metadata
                await ws.send(pack(observation()))
                await asyncio.sleep(1.0)  # the call is in the engine, sleeping its 30 s
                proc.send_signal(signal.SIGINT)
                await asyncio.sleep(1.0)
                drained_meanwhile = proc.poll() is not None
                second = time.monotonic()
                proc.send_signal(signal.SIGINT)
                code = await asyncio.to_thread(proc.wait, 20)
                return drained_meanwhile, time.monotonic() - second, code

        drained_meanwhile, exited_s, code = asyncio.run(asyncio.wait_for(interrupt_twice_during_a_call(), 60))
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not drained_meanwhile, out  # the first Ctrl-C was waiting for the call
    assert code == 130, out
    assert exited_s < 3.0, out  # not the 29 s left of the call
    assert "drain: 1 open sockets, waiting at most 60.0 s" in out
    assert out.rstrip().splitlines()[-1].endswith("second Ctrl-C: exiting now, without finishing the drain"), out
    assert "Traceback" not in out, out
    assert '"GET /healthz' not in out, out  # --no-access-log
