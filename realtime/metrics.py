"""``GET /metrics``: Prometheus text exposition of engine, session and model counters."""

from __future__ import annotations

from typing import Any


def render_metrics(state: Any) -> str:
    engine = state.engine
    stats = engine.stats
    lines = [
        "# TYPE realtime_engine_healthy gauge",
        f"realtime_engine_healthy {int(engine.healthy)}",
        "# TYPE realtime_engine_batches_total counter",
        f"realtime_engine_batches_total {stats.batches}",
        "# TYPE realtime_engine_works_total counter",
        f"realtime_engine_works_total {stats.works}",
        "# TYPE realtime_engine_failed_works_total counter",
        f"realtime_engine_failed_works_total {stats.failed_works}",
        "# TYPE realtime_engine_controls_total counter",
        f"realtime_engine_controls_total {stats.controls}",
        "# TYPE realtime_engine_busy_seconds_total counter",
        f"realtime_engine_busy_seconds_total {stats.busy_seconds:.6f}",
        "# TYPE realtime_engine_batch_size_total counter",
    ]
    for size, count in sorted(stats.batch_sizes.items()):
        lines.append(f'realtime_engine_batch_size_total{{size="{size}"}} {count}')
    lines += ["# TYPE realtime_engine_queued gauge"]
    for name in engine.adapters:
        lines.append(f'realtime_engine_queued{{model="{name}"}} {engine.queued(name)}')
    lines += ["# TYPE realtime_world_sessions gauge", f"realtime_world_sessions {len(state.world_sessions)}"]
    for name, adapter in engine.adapters.items():
        # Adapters with a paged KV cache expose its residency counters (kv/ metrics).
        kv_metrics = getattr(adapter, "kv_metrics", None)
        if callable(kv_metrics):
            for key, value in sorted(kv_metrics().items()):
                lines.append(f'realtime_kv_{key}{{model="{name}"}} {value}')
    return "\n".join(lines) + "\n"
