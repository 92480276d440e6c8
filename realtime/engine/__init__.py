"""The engine: one thread that batches every session's work across kinds.

What the endpoints use is exported here; the modules inside are the engine's own:

* ``loop``: the thread, its queues (lanes, the control lane), futures and death;
* ``overlap``: running the event loop's sends beside the GPU (the launch gate);
* ``stats``: per-model counters the metrics endpoint reads.
"""

from realtime.engine.loop import NOT_RUN, Engine, EngineStopped, TickCancelled

__all__ = ["NOT_RUN", "Engine", "EngineStopped", "TickCancelled"]
