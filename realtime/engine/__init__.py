"""The engine: one thread that batches every session's work across kinds.

What the endpoints use is exported here; the modules inside are the engine's own:

* ``loop``: the thread, the tick and control lanes, inline ``run_now``, stop and death;
* ``scheduler``: pure: which model's ticks run next, which of them, whom to wait for;
* ``forward``: one forward of a batch: validate, end_tick, count, resolve; failures isolated;
* ``futures``: a queued tick's future, resolved from the engine thread;
* ``overlap``: the loop's Python beside the device: launch gate, held results, GIL hand-off;
* ``stats``: the counters the metrics endpoint reads;
* ``group``: the sequence-parallel process group: workers, command channel, watchdog;
* ``mirror``: rank 0's calls on a sequence-parallel model, run again on every worker.
"""

from realtime.engine.group import EXIT_GROUP_FAILED, Group, GroupFailed, current_group, init_group
from realtime.engine.loop import NOT_RUN, Engine, EngineStopped, TickCancelled
from realtime.engine.mirror import Mirrored, follow, parallel, serve_worker

__all__ = ["NOT_RUN", "EXIT_GROUP_FAILED", "Engine", "EngineStopped", "Group", "GroupFailed", "Mirrored",
           "TickCancelled", "current_group", "follow", "init_group", "parallel", "serve_worker"]
