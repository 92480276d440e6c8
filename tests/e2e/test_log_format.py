"""One log format for the app and uvicorn: a real ``realtime serve`` process (tiny world,
dummy policy) whose every log line, uvicorn's included, has the app's format, and whose
session lines name the session."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import websockets

from deploy.server_process import ServerProcess

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


def test_every_line_has_one_format_and_session_lines_name_the_session():
    async def session(addr: str) -> None:
        async with websockets.connect(f"ws://{addr}/v1/realtime/world?session_id=log-w1", max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.create", "session_id": "log-w1", "format": "rgb8"}))
            await ws.send(json.dumps({"type": "nonsense"}))
            while not (isinstance(m := await ws.recv(), str) and json.loads(m)["type"] == "error"):
                pass
            await ws.send(json.dumps({"type": "session.close"}))
            while not (isinstance(m := await ws.recv(), str) and json.loads(m)["type"] == "session.closed"):
                pass

    with ServerProcess() as proc:
        httpx.get(f"http://{proc.addr}/v1/models")  # an access-log line
        asyncio.run(asyncio.wait_for(session(proc.addr), 60))
        text = proc.log_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert any(" uvicorn.error: " in line for line in lines)  # "Application startup complete."
    assert any(" uvicorn.access: " in line and "/v1/models" in line for line in lines)
    assert [line for line in lines if not LINE.match(line)] == []
    world = [line for line in lines if " realtime.endpoints.world: " in line]
    assert world and all("session log-w1" in line for line in world), world
