"""The Starlette app: HTTP endpoints, WebSocket endpoints and the engine's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from models.factory import FactoryError
from realtime import media
from realtime.server.admin import ROUTES as ADMIN_ROUTES
from realtime.server.auth import ApiKeyGuard
from realtime.server.config import ServerConfig
from realtime.endpoints.live import LiveSessions
from realtime.engine import EXIT_GROUP_FAILED, Engine, GroupFailed, Mirrored, current_group, parallel
from realtime.server.limits import SOCKETS_PER_SESSION_SLOT, ClientSlots, SocketGuard
from realtime.server.metrics import CONTENT_TYPE, ServerMetrics
from realtime.server.inventory import Inventory, close_all, plan
from realtime.server.loading import Loading
from realtime.endpoints.openpi import openpi_endpoint
from realtime.server.origins import OriginGuard
from realtime.server.version import version
from realtime.endpoints.tts import tts_endpoint
from realtime.endpoints.world import world_endpoint
from sessions import SessionManager

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parents[2] / "clients" / "web"

# At shutdown, how long the lifespan waits for the engine thread to end (a daemon thread:
# a forward still running past the drain deadline does not keep the process alive).
ENGINE_STOP_TIMEOUT_S = 2.0
# At a shutdown while models load, how long the lifespan waits for the model being built to
# reach its next progress report (realtime/server/loading.py Loading.join).
LOADER_STOP_TIMEOUT_S = 10.0
# After a sequence-parallel group failed (realtime/engine/group.py): how long the sessions have
# to hear of it before the server stops as on SIGTERM, and how long past the drain deadline
# the process may take before it exits anyway (a forward stuck in a collective).
GROUP_FAILED_GRACE_S = 0.5
GROUP_FAILED_EXIT_S = 10.0


def build_app(config: ServerConfig | None = None, inventory: Inventory | None = None, *,
              loading: Loading | None = None) -> Starlette:
    """Build the app. With ``inventory`` (tests, benchmarks) its models are served from the
    start. Otherwise the models load in the background once the app starts, the config's
    (``inventory.plan``) or ``loading``'s own, and the server answers meanwhile
    (realtime/server/loading.py). An entry the factory table refuses is a ``FactoryError``
    here, before anything loads."""
    config = config or ServerConfig()
    if inventory is None and loading is None:
        loading = Loading(*plan(config))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        waiting: asyncio.Task | None = None
        group = current_group()
        if group is not None:  # the watchdog's thread -> the loop
            loop = asyncio.get_running_loop()
            group.on_failure = lambda reason: loop.call_soon_threadsafe(_group_failed, app, reason)
        if loading is None:
            assert inventory is not None
            _serve(app, inventory)
        else:
            loading.start()
            waiting = asyncio.create_task(_serve_when_loaded(app, loading))
        try:
            yield
        finally:
            if waiting is not None and not waiting.done():
                assert loading is not None
                loading.stop()
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
                await loading.join(LOADER_STOP_TIMEOUT_S)
            app.state.encoder.close()
            engine: Engine | None = app.state.engine
            if engine is not None:
                engine.stop(ENGINE_STOP_TIMEOUT_S)
            close_all(app.state.inventory)

    routes = [
        Route("/healthz", healthz),
        Route("/livez", livez),
        Route("/version", version),
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
    # Added last, so outermost: a client without a key is refused before it takes a socket slot.
    app.add_middleware(ApiKeyGuard, keys=config.api_keys, metrics_require_key=config.metrics_require_key,
                       on_refused=lambda code: app.state.metrics.refused(code))
    app.state.config = config
    # While models load: no engine, an empty inventory, and the load's progress.
    app.state.engine = None
    app.state.inventory = inventory or Inventory()
    app.state.loading = loading
    app.state.world_sessions = SessionManager(max_sessions=config.world.max_sessions)
    app.state.encoder = media.Encoder(config.encode.workers, config.encode.cuda_jpeg)
    app.state.live_sessions = LiveSessions()
    app.state.client_slots = ClientSlots(config.limits.max_sessions_per_client)
    app.state.metrics = ServerMetrics()
    return app


def _serve(app: Starlette, inventory: Inventory) -> None:
    """Start serving ``inventory``'s models: the engine over all of them, then the endpoints
    see them (on the event loop, in one step: a connection sees no engine and is refused
    with ``loading``, or sees the engine and every model).

    One engine for every model, started when the last has loaded, not a model at a time:
    a world sizes its KV pool from the device memory free after its weights, so a model
    still loading needs what the sessions of a served one would take, and the engine's
    scheduler is built for a fixed set of models."""
    config: ServerConfig = app.state.config
    group = current_group()
    if group is not None:  # each rank runs these models' calls too
        for name, adapter in list(inventory.adapters.items()):
            if parallel(adapter):
                inventory.adapters[name] = Mirrored(adapter, group)  # type: ignore[assignment]
    policy_waits = {name: config.policy.batch_wait_ms for name in inventory.names("policy")}
    engine = Engine(inventory.adapters, batch_wait_ms=config.engine.batch_wait_ms, model_wait_ms=policy_waits,
                    gil_hand_off=config.engine.gil_hand_off, switch_interval_s=config.engine.switch_interval_s)
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
    app.state.inventory = inventory
    app.state.engine = engine
    app.state.loading = None
    if group is not None and group.failure is not None:  # it failed while the models loaded
        _group_failed(app, group.failure)


def _group_failed(app: Starlette, reason: str) -> None:
    """A rank of the sequence-parallel group died or hung (on the loop): the engine dies (every
    session fails with ``engine unavailable``), then the server stops and exits with
    ``EXIT_GROUP_FAILED`` (cli.py), within the drain deadline and ``GROUP_FAILED_EXIT_S``."""
    engine: Engine | None = app.state.engine
    if engine is not None and engine.healthy:  # else a failed collective has killed it already
        def die() -> None:
            if engine.healthy:
                raise GroupFailed(reason)

        engine.post_control(die)
        # Told now, not when the engine thread gets to the control: it may be inside a forward
        # that waits on the lost rank (until the collective's timeout). Telling twice is a no-op.
        app.state.live_sessions.engine_dead(reason)
    if threading.current_thread() is threading.main_thread():
        asyncio.get_running_loop().call_later(GROUP_FAILED_GRACE_S, signal.raise_signal, signal.SIGTERM)
        exit_at = threading.Timer(GROUP_FAILED_GRACE_S + app.state.config.drain_timeout_s + GROUP_FAILED_EXIT_S,
                                  os._exit, (EXIT_GROUP_FAILED,))
        exit_at.daemon = True
        exit_at.start()


async def _serve_when_loaded(app: Starlette, loading: Loading) -> None:
    """Serve the models once they have loaded. A model that could not be built as asked
    (``FactoryError``, or a bug) stops the server: ``/healthz`` answers ``failed: ...``
    and, where the server handles signals (``realtime serve``), it stops as on SIGTERM;
    ``loading.failure`` holds the one line for the CLI to print."""
    try:
        inventory = await loading.wait()
    except FactoryError as exc:
        loading.failure = str(exc)
        log.error("cannot serve: %s", exc)
    except Exception as exc:  # noqa: BLE001 - a factory's bug stops the server the same way
        loading.failure = f"{type(exc).__name__}: {exc}"
        log.exception("cannot serve: a model failed to load")
    else:
        _serve(app, inventory)
        log.info("models loaded; serving %s", ", ".join(inventory.adapters))
        return
    if threading.current_thread() is threading.main_thread():
        signal.raise_signal(signal.SIGTERM)  # nothing is served yet: the drain is immediate


async def healthz(request: Request) -> Response:
    """Readiness: 200 ``OK``, or 503 with the reason's first word: ``draining``,
    ``loading`` (which model, its stage), ``failed``, ``engine unavailable``."""
    state = request.app.state
    if state.live_sessions.draining:  # SIGTERM: a proxy stops sending work here
        return PlainTextResponse("draining: the server is shutting down", status_code=503)
    loading: Loading | None = state.loading
    if loading is not None:
        return PlainTextResponse(loading.health(), status_code=503)
    group = current_group()
    if group is not None and group.failure is not None:  # before the engine hears of it
        return PlainTextResponse(f"engine unavailable: {group.failure}", status_code=503)
    engine: Engine = state.engine
    if engine.healthy:
        return PlainTextResponse("OK")
    return PlainTextResponse(f"engine unavailable: {engine.dead_reason or 'stopped'}", status_code=503)


async def livez(request: Request) -> Response:
    """Liveness: the process serves HTTP (loading, draining or with a dead engine alike)."""
    return PlainTextResponse("OK")


async def list_models(request: Request) -> Response:
    loading: Loading | None = request.app.state.loading
    inventory: Inventory = request.app.state.inventory
    models = loading.listing() if loading is not None else inventory.listing()
    return JSONResponse({"object": "list", "data": models})


async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


async def index(request: Request) -> Response:
    return FileResponse(WEB_DIR / "index.html")
