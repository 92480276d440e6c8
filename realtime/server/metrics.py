"""``GET /metrics``: Prometheus exposition (``prometheus-client``) of sessions, ticks and KV.

Two sources, neither on a tick's critical section:

* what the engine thread counts (``realtime/engine/stats.py``: ticks, failures by code,
  tick latency and batch size histograms, busy time) and what the event loop keeps
  anyway (``LiveSessions``, queue lengths, a world's ``kv_usage()``) are read at
  scrape time by ``_ServerCollector``: the engine never takes a lock for metrics;
* what only an endpoint sees goes into histograms from the event loop: a sentence's
  time to first audio into a ``prometheus_client`` one (its per-metric lock is only
  ever contended by the scrape, on the same thread), a robot call's latency, observed
  on every call, and a world event's time to its first frame into plain ``Buckets``
  read at scrape time (``_BucketsCollector``); refusals by code into a counter;
* the process (CPU, memory, open fds), the interpreter and its GC: prometheus_client's
  own collectors, registered on this registry (they are on its global one only).

Every family is in the output from the first scrape (histograms and counters with
no sample yet still show their HELP and TYPE), one registry per app, so two apps
in one process (tests) do not share counters.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from protocols import errors
from protocols.world_v1 import BUSY
from realtime.engine.stats import LATENCY_BUCKETS_S, Buckets
from realtime.server.auth import UNAUTHORIZED

if TYPE_CHECKING:
    from realtime.endpoints.live import LiveSessions
    from realtime.engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
KINDS = ("world", "policy", "tts")
# SessionRecord.state values a live session is counted under (sessions/registry.py).
STATES = ("active", "failed", "closing", "cleanup_failed")
FAILURE_CODES = ("model_error", "out_of_memory", "engine_dead")  # models.base.failure_code
# Codes a client is refused or sent away with (``realtime_refusals_total``): a world's model
# full (busy), a client at its session limit, an idle session closed, no valid API key
# (realtime/server/auth.py), a session asked for before its model has loaded.
REFUSALS = (BUSY, errors.TOO_MANY_SESSIONS, errors.IDLE_TIMEOUT, UNAUTHORIZED, errors.LOADING)
# A world event's acceptance to its chunk's first frame out: a tick or two at 16-25 fps
# is 40-125 ms; seconds mean a queue or a stalled client.
EVENT_TO_FRAME_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    """The app's registry and the histograms its endpoints feed (event loop only)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.tts_first_audio = Histogram(
            "realtime_tts_first_audio_seconds",
            "Seconds from a sentence being complete (queued for speech) to its first PCM frame sent.",
            registry=self.registry, buckets=LATENCY_BUCKETS_S)
        # Observed once per robot call: a plain histogram read at scrape time, as the engine's
        # are (prometheus_client's takes a lock per bucket and sum, ~1.5 us of a ~0.1 ms call).
        self.policy_call = Buckets(LATENCY_BUCKETS_S)
        self.registry.register(_BucketsCollector(
            "realtime_policy_call_seconds",
            "Seconds one robot observation spent in the engine (queue wait and policy forward).",
            self.policy_call))
        # Observed per applied event (realtime/endpoints/event_clock.py), as policy_call is.
        self.world_event_to_frame = Buckets(EVENT_TO_FRAME_BUCKETS_S)
        self.registry.register(_BucketsCollector(
            "realtime_world_event_to_frame_seconds",
            "Seconds from a world event being accepted to the first frame of the chunk that applied it "
            "going out on the socket.", self.world_event_to_frame))
        self._refusals = Counter("realtime_refusals", "Requests and sessions refused or sent away, by code "
                                 "(busy, too_many_sessions, idle_timeout, unauthorized, loading).",
                                 ["code"], registry=self.registry)
        for code in REFUSALS:
            self._refusals.labels(code)  # every code shows, at 0, from the first scrape
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._collector: _ServerCollector | None = None

    def refused(self, code: str | None) -> None:
        """A client was told ``code``: counted when it is one of ``REFUSALS`` (the endpoints
        call this for every error they send; ``bad_request`` and the like are not refusals)."""
        if code in REFUSALS:
            self._refusals.labels(code).inc()

    def bind(self, engine: "Engine", live: "LiveSessions") -> None:
        """Read ``engine`` and ``live`` at every scrape from now on (the app's lifespan)."""
        if self._collector is not None:
            self.registry.unregister(self._collector)
        self._collector = _ServerCollector(engine, live)
        self.registry.register(self._collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _histogram(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _add_histogram(family: HistogramMetricFamily, labels: list[str], b: Buckets) -> None:
    family.add_metric(labels, b.cumulative(), b.sum)


class _BucketsCollector(Collector):
    """One unlabelled histogram that the event loop writes and the scrape (same loop) reads."""

    def __init__(self, name: str, doc: str, buckets: Buckets) -> None:
        self.name, self.doc, self.buckets = name, doc, buckets

    def collect(self) -> Iterator[Metric]:
        family = _histogram(self.name, self.doc, [])
        _add_histogram(family, [], self.buckets)
        yield family


class _ServerCollector(Collector):
    def __init__(self, engine: "Engine", live: "LiveSessions") -> None:
        self.engine, self.live = engine, live
        # Busy share is over the time since the previous scrape (or since start).
        self._last = (engine.started_at, 0.0)

    def collect(self) -> Iterator[Metric]:
        engine, stats = self.engine, self.engine.stats
        healthy = GaugeMetricFamily("realtime_engine_healthy", "1 while the engine serves; 0 once it is dead or "
                                    "stopping (then /healthz answers 503).", value=int(engine.healthy))
        yield healthy

        sessions = GaugeMetricFamily("realtime_sessions", "Live sessions by kind and state.",
                                     labels=["kind", "state"])
        counts = {(k, s): 0 for k in KINDS for s in STATES}
        for entry in self.live.sessions():
            key = (entry["kind"], entry["state"])
            counts[key] = counts.get(key, 0) + 1
        for (kind, state), n in sorted(counts.items()):
            sessions.add_metric([kind, state], n)
        yield sessions
        # Kept for the deploy tests and scripts that read it (world sessions of any state).
        yield GaugeMetricFamily("realtime_world_sessions", "Live world sessions (any state).",
                                value=sum(n for (k, _), n in counts.items() if k == "world"))

        ticks = CounterMetricFamily("realtime_ticks", "Ticks committed (world chunks, TTS decoder windows, "
                                    "policy calls), by kind and model.", labels=["kind", "model"])
        failures = CounterMetricFamily("realtime_tick_failures", "Ticks failed, by kind, model and cause "
                                       "(model_error, out_of_memory, engine_dead).", labels=["kind", "model", "code"])
        latency = _histogram("realtime_tick_seconds", "Seconds from a tick being queued on the engine to its "
                             "result (queue wait, batching wait and forward).", ["kind", "model"])
        batch = _histogram("realtime_batch_size", "Works per model forward.", ["kind", "model"])
        busy = CounterMetricFamily("realtime_engine_model_busy_seconds", "Seconds the engine thread spent in "
                                   "each model's forwards.", labels=["kind", "model"])
        queued = GaugeMetricFamily("realtime_engine_queue_depth", "Ticks queued on the engine, per model.",
                                   labels=["kind", "model"])
        for name, adapter in engine.adapters.items():
            labels = [adapter.kind, name]
            m = stats.models[name]
            ticks.add_metric(labels, m.ticks)
            found = dict(m.failures)
            for code in sorted(set(FAILURE_CODES) | set(found)):
                failures.add_metric([*labels, code], found.get(code, 0))
            _add_histogram(latency, labels, m.tick_seconds)
            _add_histogram(batch, labels, m.batch_size)
            busy.add_metric(labels, m.busy_seconds)
            queued.add_metric(labels, engine.queued(name))
        yield from (ticks, failures, latency, batch, busy, queued)

        now, busy_now = time.perf_counter(), stats.busy_seconds
        then, busy_then = self._last
        self._last = (now, busy_now)
        share = (busy_now - busy_then) / (now - then) if now > then else 0.0
        yield GaugeMetricFamily("realtime_engine_busy_share", "Share of wall time the engine thread spent in "
                                "forwards since the previous scrape (0..1).", value=min(1.0, max(0.0, share)))
        yield CounterMetricFamily("realtime_engine_busy_seconds", "Seconds the engine thread spent in forwards.",
                                  value=stats.busy_seconds)
        yield CounterMetricFamily("realtime_engine_batches", "Model forwards run.", value=stats.batches)
        yield CounterMetricFamily("realtime_engine_works", "Works committed, all models.", value=stats.works)
        yield CounterMetricFamily("realtime_engine_failed_works", "Works failed, all models.", value=stats.failed_works)
        yield CounterMetricFamily("realtime_engine_controls", "Control-lane jobs run (reset, close, cancel).",
                                  value=stats.controls)
        sizes = CounterMetricFamily("realtime_engine_batch_size", "Forwards per batch size, all models.",
                                    labels=["size"])
        for size, count in sorted(dict(stats.batch_sizes).items()):
            sizes.add_metric([str(size)], count)
        yield sizes
        yield from self._kv()

    def _kv(self) -> Iterator[Metric]:
        blocks = GaugeMetricFamily("realtime_kv_blocks", "Paged KV blocks by state: free, used (held by "
                                   "sessions), reserved (pad and worker blocks; the null block is none).",
                                   labels=["model", "state"])
        resident = GaugeMetricFamily("realtime_kv_sessions", "Sessions holding KV, by residency (resident on "
                                     "the device, swapped to host).", labels=["model", "residency"])
        host = GaugeMetricFamily("realtime_kv_host_bytes", "Host bytes held by swapped sessions.",
                                 labels=["model"])
        swap_bytes = CounterMetricFamily("realtime_kv_swap_bytes", "Bytes moved between device and host KV.",
                                         labels=["model", "direction"])
        swap_seconds = CounterMetricFamily("realtime_kv_swap_seconds", "Seconds spent swapping KV.",
                                           labels=["model", "direction"])
        evictions = CounterMetricFamily("realtime_kv_evictions", "Idle sessions evicted from the device: "
                                        "swapped to host, or dropped (client told session_evicted).",
                                        labels=["model", "outcome"])
        for name, adapter in self.engine.adapters.items():
            usage_of = getattr(adapter, "kv_usage", None)  # the world seam's; other kinds keep no paged KV
            usage: dict[str, Any] | None = usage_of() if callable(usage_of) else None
            if usage is None:
                continue
            reserved = usage["reserved_blocks"]
            total = usage["total_blocks"] - 1 - reserved  # the null block is never handed out
            blocks.add_metric([name, "free"], usage["free_blocks"])
            blocks.add_metric([name, "used"], total - usage["free_blocks"])
            blocks.add_metric([name, "reserved"], reserved)
            resident.add_metric([name, "resident"], usage["resident_sessions"])
            resident.add_metric([name, "swapped"], usage["swapped_sessions"])
            host.add_metric([name], usage["host_bytes"])
            swap_bytes.add_metric([name, "out"], usage["swap_out_bytes"])
            swap_bytes.add_metric([name, "in"], usage["swap_in_bytes"])
            swap_seconds.add_metric([name, "out"], usage["swap_out_seconds"])
            swap_seconds.add_metric([name, "in"], usage["swap_in_seconds"])
            evictions.add_metric([name, "swapped"], usage["swap_outs"])
            evictions.add_metric([name, "dropped"], usage["drops"])
        yield from (blocks, resident, host, swap_bytes, swap_seconds, evictions)
