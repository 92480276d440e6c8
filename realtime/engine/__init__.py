"""The engine: one thread that batches every session's work across kinds.

What the endpoints use is exported here; the modules inside are the engine's own:

* ``loop``: the thread, the tick and control lanes, inline ``run_now``, stop and death;
* ``scheduler``: pure: which model's ticks run next, which of them, whom to wait for;
* ``forward``: one forward of a batch: validate, end_tick, count, resolve; failures isolated;
* ``futures``: a queued tick's future, resolved from the engine thread;
* ``overlap``: the loop's Python beside the device: launch gate, held results, GIL hand-off;
* ``stats``: the counters the metrics endpoint reads.
"""

from realtime.engine.loop import NOT_RUN, Engine, EngineStopped, TickCancelled

__all__ = ["NOT_RUN", "Engine", "EngineStopped", "TickCancelled"]
