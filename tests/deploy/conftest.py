"""Three real ``realtime serve`` replicas (tiny world, no TTS, dummy policy) behind real nginx
on loopback, started once for the module that asks for ``cluster`` (deploy/replicas.py).

Which replica holds a session is told two ways: nginx's ``X-Upstream`` header on the
WebSocket's 101 response (where this connection went), and each replica's own list of
live world sessions (``live_sessions``: its ``GET /v1/sessions``, what the replica itself holds).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Iterator

import httpx
import pytest

from clients.world import WorldClient
from deploy.nginx import find_nginx
from deploy.replicas import Deployment

SERVE_ARGS = ["--models", "tiny", "--no-tts", "--policy", "dummy", "--device", "cpu", "--log-level", "info"]
REPLICAS = 3
GPUS = ["0", "1", "2"]  # CPU replicas: only the process layout (CUDA_VISIBLE_DEVICES) is tested

requires_nginx = pytest.mark.skipif(find_nginx() is None,
                                    reason="nginx not installed (as root, `make nginx` installs Debian's package)")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Deployment]:
    with Deployment(REPLICAS, gpus=GPUS, serve_args=SERVE_ARGS) as deployment:
        yield deployment


def live_sessions(replica_addr: str) -> set[str]:
    """The ids of the world sessions the replica itself holds (its ``GET /v1/sessions``)."""
    data = httpx.get(f"http://{replica_addr}/v1/sessions", timeout=5).json()["data"]
    return {s["session_id"] for s in data if s["kind"] == "world"}


async def settled(players: "list[Player]", addrs: set[str], timeout_s: float = 10.0) -> dict[str, set[str]]:
    """Wait until each replica's ``/v1/sessions`` in ``addrs`` shows exactly the ``players``
    that nginx sent it, and none of the others' (sessions of earlier tests may still be
    closing); returns those session ids per replica."""
    expected = {addr: {p.session_id for p in players if p.upstream == addr} for addr in addrs}
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        held = {addr: live_sessions(addr) for addr in addrs}
        if held == expected:
            return held
        assert asyncio.get_running_loop().time() < deadline, f"replicas hold {held}, nginx placed {expected}"
        await asyncio.sleep(0.05)


@dataclass
class Player:
    """One world session through nginx, crediting each chunk after ``pace_s``."""

    session_id: str
    client: WorldClient
    connector: object
    upstream: str  # the replica nginx picked, host:port
    indexes: list[int] = field(default_factory=list)
    task: asyncio.Task | None = None
    stopping: bool = False

    @property
    def close_code(self) -> int | None:
        return self.client.ws.close_code

    async def play(self, pace_s: float) -> None:
        while not self.stopping:
            chunk = await self.client.next_chunk(timeout=60.0, credit=False)
            self.indexes.append(chunk.chunk_index)
            await asyncio.sleep(pace_s)
            try:
                await self.client.credit(1)
            except Exception:  # noqa: BLE001 - the socket closed; the chunks already read stay
                return

    def start(self, pace_s: float = 0.02) -> None:
        self.task = asyncio.create_task(self.play(pace_s))

    async def until(self, chunks: int, timeout_s: float = 20.0) -> None:
        """Wait until this session has ``chunks`` more chunks than now."""
        target = len(self.indexes) + chunks
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(self.indexes) < target:
            assert asyncio.get_running_loop().time() < deadline, f"{self.session_id}: stalled at {self.indexes[-1:]}"
            await asyncio.sleep(0.02)

    async def closed(self, timeout_s: float = 10.0) -> int | None:
        """Wait for the socket to close; its close code (None: no close frame)."""
        await asyncio.wait_for(self.client.ws.wait_closed(), timeout_s)
        return self.client.ws.close_code

    async def stop(self) -> None:
        """Stop crediting and close the socket, in bounded time whatever state it is in (the
        flag as well as the cancel: a cancel that lands as a chunk arrives can be lost)."""
        self.stopping = True
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=5.0)
        try:
            async with asyncio.timeout(5.0):
                await self.connector.__aexit__(None, None, None)
        except Exception:  # noqa: BLE001 - a close that cannot finish: drop the connection
            self.client.ws.transport.abort()


async def join(addr: str, session_id: str, credits: int = 1) -> Player:
    """Connect through nginx with ``?session_id=`` and create the session."""
    connector = WorldClient.connect(f"ws://{addr}/v1/realtime/world", session_id=session_id)
    client = await connector.__aenter__()
    # $upstream_addr lists every replica nginx tried, the one that answered last.
    upstream = client.ws.response.headers["X-Upstream"].split(",")[-1].strip()
    await client.create(credits=credits, format="rgb8")
    return Player(session_id, client, connector, upstream)
