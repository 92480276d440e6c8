"""One frozen root config made of sub-configs (built by the CLI or by tests)."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.factory import DEFAULT_WORLDS
from realtime.server.origins import LOOPBACK


# The default of ServerConfig.drain_timeout_s (``realtime serve --drain-timeout``).
DRAIN_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class EngineConfig:
    device: str = "cpu"
    # How long after a model's batch ends the engine waits for that batch's sessions
    # to queue their next tick (realtime/engine/scheduler.py, "Returners"); strangers never wait.
    batch_wait_ms: float = 20.0
    # CPU models' number format by name (models.factory.CPU_FORMATS); None: each model's pick.
    cpu_format: str | None = None
    # A lone returner's submit hands the engine the GIL (realtime/engine/overlap.py, "GIL hand-off").
    gil_hand_off: bool = True
    # The interpreter's GIL switch interval while the engine runs (seconds; 0 keeps Python's
    # 5 ms). The engine thread and the event loop share one GIL: a thread woken by the other
    # waits until the holder drops it, up to one interval, on every hand-off
    # (bench/world/serve_profile.py measures that wait; bench_served's gil<MS> rows compare intervals).
    switch_interval_s: float = 0.0005


@dataclass(frozen=True)
class WorldConfig:
    # World models as factory-table entries ("name" or "name=path"); the first is the default.
    models: tuple[str, ...] = DEFAULT_WORLDS
    max_batch: int = 32
    # Frames per tick; None: each model's own (1 for maze and tiny, one block for lingbot).
    frames_per_chunk: int | None = None
    # Denoising steps per frame for the maze model (None: the model's default).
    steps: int | None = None
    # The trusted folder of named camera trajectories (world models that play them).
    trajectory_root: str | None = None
    max_pending_events: int = 64
    # Ticks a session may have in the engine at once (credits allowing): 2 keeps the engine's
    # queue full while the loop commits and sends the last chunk (throughput), at one more
    # chunk of input latency: an event arriving meanwhile goes into the tick after the queued
    # one. 1: each tick is built after the last one committed. Frame-streaming sessions use 1.
    session_ticks_in_flight: int = 2
    # The same while the session is the server's only world session (None: as above). These
    # defaults are ``realtime serve --ticks-in-flight auto``: sessions sharing the engine keep its
    # queue full, and a session alone keeps the lower latency of one.
    session_ticks_in_flight_alone: int | None = 1
    max_sessions: int = 256
    # World KV pools: this fraction of the device's free memory, or a fixed budget (CPU tests).
    gpu_memory_fraction: float = 0.9
    kv_budget_bytes: int | None = None
    host_budget_bytes: int | None = None  # swapped-out sessions' KV on the host (None: the model's default)


@dataclass(frozen=True)
class EncodeConfig:
    """How world frames are encoded (realtime/media.py's ``Encoder``)."""

    # jpeg / png encoder processes (threads stand in until they are up, and after one fails);
    # 0 encodes on the event loop. None: ``realtime.media.default_workers()``, up to 4 with
    # 4 cores or more, 0 below (what measured faster on each).
    workers: int | None = None
    # jpeg of frames a model made on CUDA: "nvjpeg" (on the GPU, in the engine's tick), "pil"
    # (their host copies, as above), or None: the faster on the first such batch, measured.
    cuda_jpeg: str | None = None


@dataclass(frozen=True)
class PolicyConfig:
    # "default", a factory-table policy (dummy, name=path) or a user policy as
    # "module:factory" (models.factory.build_policy); empty disables the endpoint.
    policy: str = "default"
    max_batch: int = 32
    # The engine's returner wait for the policy model (robots call again after acting).
    batch_wait_ms: float = 20.0


@dataclass(frozen=True)
class TTSConfig:
    enabled: bool = True
    # The voice as a factory-table entry ("name" or "name=path"); "" is models.factory's default.
    voice: str = ""
    # Decoder windows per forward; None: the adapter's default (1 on CPU, where batching
    # does not pay, 32 on CUDA; bench/results/tts_sessions_cpu.json).
    max_batch: int | None = None


@dataclass(frozen=True)
class LimitsConfig:
    """What one client may hold (realtime/server/limits.py); 0 turns either off."""

    # Seconds a session may go with no message from its client and no output taken by it
    # (world: no chunk sent; tts: nothing spoken; OpenPI: no request) before it is closed
    # with ``idle_timeout``. Work in flight (a tick, a window, an inference) is not idle.
    idle_timeout_s: float = 300.0
    # Live sessions one client address may hold across kinds: a world session, a tts.v1
    # connection, an OpenPI connection each count one. More are refused (``too_many_sessions``).
    max_sessions_per_client: int = 32


# Proxies whose X-Forwarded-For names the client (uvicorn's forwarded_allow_ips): loopback,
# where the shipped nginx runs (deploy/); uvicorn's own default.
LOOPBACK_PROXIES = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    # Browser origins that may open WebSockets besides the server's own (realtime/server/origins.py):
    # exact origins, "loopback" (any localhost port) or "*". Clients without Origin always may.
    allowed_origins: tuple[str, ...] = (LOOPBACK,)
    # Client addresses that may list and close sessions (realtime/server/admin.py): exact
    # addresses, "loopback" or "*".
    admin_from: tuple[str, ...] = ("loopback",)
    # Addresses (or networks, or "*") of proxies trusted to name the client in X-Forwarded-For:
    # the per-client limit and the admin check then see the client, not the proxy.
    forwarded_allow_ips: tuple[str, ...] = LOOPBACK_PROXIES
    # Keys a client must present (``realtime serve --api-key``); empty: no key is asked for.
    api_keys: tuple[str, ...] = ()
    # /metrics asks for a key too (``--metrics-require-key``; needs api_keys).
    metrics_require_key: bool = False
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    # SIGTERM: how long in-flight work (world ticks, utterances, policy calls) may take to
    # finish before every socket still open is closed with 1001 anyway (docs/reliability.md).
    drain_timeout_s: float = DRAIN_TIMEOUT_S
    engine: EngineConfig = field(default_factory=EngineConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    encode: EncodeConfig = field(default_factory=EncodeConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    tts: TTSConfig = field(default_factory=TTSConfig)
