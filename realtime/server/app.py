"""The Starlette app: HTTP endpoints, WebSocket endpoints and the engine's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from realtime import media
from realtime.server.admin import ROUTES as ADMIN_ROUTES
from realtime.server.config import ServerConfig
from realtime.endpoints.live import LiveSessions
from realtime.engine import Engine
from realtime.server.limits import SOCKETS_PER_SESSION_SLOT, ClientSlots, SocketGuard
from realtime.server.metrics import CONTENT_TYPE, ServerMetrics
from realtime.server.inventory import Inventory, build_inventory
from realtime.endpoints.openpi import openpi_endpoint
from realtime.server.origins import OriginGuard
from realtime.endpoints.tts import tts_endpoint
from realtime.endpoints.world import world_endpoint
from sessions import SessionManager

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parents[2] / "clients" / "web"

# At shutdown, how long the lifespan waits for the engine thread to end (a daemon thread:
# a forward still running past the drain deadline does not keep the process alive).
ENGINE_STOP_TIMEOUT_S = 2.0


def build_app(config: ServerConfig | None = None, inventory: Inventory | None = None) -> Starlette:
    """Build the app. Models load here (not at import) so tests can pass their own."""
    config = config or ServerConfig()
    inventory = inventory or build_inventory(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        policy_waits = {name: config.policy.batch_wait_ms for name in inventory.names("policy")}
        engine = Engine(inventory.adapters, batch_wait_ms=config.engine.batch_wait_ms, model_wait_ms=policy_waits,
                        gil_hand_off=config.engine.gil_hand_off, switch_interval_s=config.engine.switch_interval_s)
        app.state.engine = engine
        loop = asyncio.get_running_loop()

        live: LiveSessions = app.state.live_sessions
        app.state.metrics.bind(engine, live)
        # A dead engine fails every live session at once, idle ones too (engine thread -> loop).
        engine.on_dead = lambda reason: loop.call_soon_threadsafe(live.engine_dead, reason)
        for name, adapter in inventory.adapters.items():
            # Called on the engine thread when a model drops a session's state on its own
            # (LRU eviction with a full host budget); the owner, of whatever kind, is looked
            # up on the loop.
            adapter.set_drop_listener(
                lambda sid, why, name=name: loop.call_soon_threadsafe(live.dropped, name, sid, why))
        encoder: media.Encoder = app.state.encoder
        for name in inventory.names("world"):
            # The jpeg of frames a world makes on CUDA is encoded on the engine thread (media.py).
            inventory.adapters[name].device_jpeg = encoder.device_jpeg
        engine.start()
        if inventory.names("world"):
            encoder.start()  # jpeg / png encoder processes (threads until they are up)
        try:
            yield
        finally:
            encoder.close()
            engine.stop(ENGINE_STOP_TIMEOUT_S)
            for name, adapter in inventory.adapters.items():
                try:
                    adapter.close()
                except Exception as exc:  # noqa: BLE001 - the others still close
                    log.warning("%s: close failed at shutdown: %r", name, exc)

    routes = [
        Route("/healthz", healthz),
        Route("/v1/models", list_models),
        Route("/metrics", metrics),
        *ADMIN_ROUTES,
        WebSocketRoute("/v1/realtime/world", world_endpoint),
        WebSocketRoute("/v1/realtime/robot/openpi", openpi_endpoint),
        WebSocketRoute("/v1/realtime/tts", tts_endpoint),
        # openpi-client's WebsocketClientPolicy(host, port) connects to "/", as robots
        # do with the reference server; an HTTP GET "/" still gets the page below.
        WebSocketRoute("/", openpi_endpoint),
    ]
    if WEB_DIR.is_dir():
        routes += [Route("/", index), Mount("/web", app=StaticFiles(directory=WEB_DIR), name="web")]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(OriginGuard, allowed=config.allowed_origins)
    app.add_middleware(SocketGuard, limit=SOCKETS_PER_SESSION_SLOT * config.limits.max_sessions_per_client)
    app.state.config = config
    app.state.inventory = inventory
    app.state.world_sessions = SessionManager(max_sessions=config.world.max_sessions)
    app.state.encoder = media.Encoder(config.encode.workers, config.encode.cuda_jpeg)
    app.state.live_sessions = LiveSessions()
    app.state.client_slots = ClientSlots(config.limits.max_sessions_per_client)
    app.state.metrics = ServerMetrics()
    return app


async def healthz(request: Request) -> Response:
    engine: Engine = request.app.state.engine
    if request.app.state.live_sessions.draining:  # SIGTERM: a proxy stops sending work here
        return PlainTextResponse("draining: the server is shutting down", status_code=503)
    if engine.healthy:
        return PlainTextResponse("OK")
    return PlainTextResponse(f"engine unavailable: {engine.dead_reason or 'stopped'}", status_code=503)


async def list_models(request: Request) -> Response:
    inventory: Inventory = request.app.state.inventory
    # ``id`` as OpenAI-style model lists have it: the name a session's ``model`` field takes.
    models = [{"id": name, **a.describe(), "available": True} for name, a in inventory.adapters.items()]
    models += [{"id": name, **entry} for name, entry in inventory.unavailable.items()]
    return JSONResponse({"object": "list", "data": models})


async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


async def index(request: Request) -> Response:
    return FileResponse(WEB_DIR / "index.html")
