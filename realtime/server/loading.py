"""Models loading in the background while the server already answers: ``Loading``.

``realtime serve`` used to build every model before uvicorn started, so for the seconds to
minutes a large checkpoint takes the port accepted connections and answered nothing. Now
the app's lifespan starts a ``Loading`` and serves at once: ``/healthz`` answers 503
``loading: ...`` (readiness), ``/v1/models`` lists each requested model's state, stage and
bytes read, sessions are refused with ``loading``, and the log says how far each model
has got every ``LOG_EVERY_S``. When every model has loaded the app starts the engine
(app.py) and the server is ready.

The models are built on a thread that exits when they are built, as
``inventory.on_spent_thread`` says why (torch's OpenMP team per thread). That thread
writes each model's ``ModelLoad`` (a frozen record, replaced whole); the event loop only
reads them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Any

from realtime.server.inventory import LOADER_THREAD, Inventory, ModelLoad, ModelState, Planned, load

log = logging.getLogger(__name__)

# A model still loading after this long gets a progress line in the log, and another every
# LOG_EVERY_S (the fast ones load without a word beyond the factory's "built ..." line).
SLOW_S = 3.0
LOG_EVERY_S = 5.0
# How often the event loop looks whether the load has ended (the server is ready that much later).
POLL_S = 0.05


class Loading:
    """The models of ``planned`` (then ``fallback`` if no world loaded) built in order on a
    thread of their own; ``result`` is the ``Inventory``, or the ``FactoryError`` that
    stopped the load."""

    def __init__(self, planned: list[Planned], fallback: Planned | None = None) -> None:
        self.planned, self.fallback = planned, fallback
        self.models: dict[str, ModelLoad] = {p.name: ModelLoad(p.name, p.kind) for p in planned}
        self.result: concurrent.futures.Future[Inventory] = concurrent.futures.Future()
        self.failure: str | None = None  # the one line of a FactoryError that stopped the load
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=LOADER_THREAD, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """The server is shutting down: the model being built stops at its next progress
        report (or when it is built), none is started after it, and what was built is closed."""
        self._stop.set()

    async def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the loader thread to end (after ``stop``); whether it has.
        The process should not exit under it: torch's thread pools are torn down at exit, and
        a thread still inside a parallel op then aborts the process."""
        deadline = time.monotonic() + timeout_s
        while self.thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if self.thread.is_alive():
            m = self.current()
            log.warning("shutting down while %s is still loading", m.name if m else "a model")
        return not self.thread.is_alive()

    def _run(self) -> None:
        try:
            inventory = load(self.planned, self.fallback, self._report, self._stop.is_set)
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop
            self.result.set_exception(exc)
        else:
            self.result.set_result(inventory)

    def _report(self, model: ModelLoad) -> None:
        self.models[model.name] = model  # one assignment: a reader sees the old record or the new

    async def wait(self) -> Inventory:
        """The inventory once the loader thread has ended (so the engine's OpenMP team will be
        the process's only one), logging the progress of slow models meanwhile; raises the
        ``FactoryError`` that stopped the load. Polls: the thread never calls into the loop,
        so a shutdown while a model loads leaves nothing behind to call a closed loop."""
        next_log = time.monotonic() + LOG_EVERY_S
        while self.thread.is_alive() or not self.result.done():
            await asyncio.sleep(POLL_S)
            if time.monotonic() >= next_log:
                next_log += LOG_EVERY_S
                self.log_progress()
        return self.result.result()

    def log_progress(self) -> None:
        now = time.monotonic()
        for m in list(self.models.values()):
            if m.building and m.seconds(now) >= SLOW_S:
                log.info("loading %s (%s): %s", m.name, m.kind, m.describe(now))

    # ------------------------------------------------------------------ what the app shows
    def current(self) -> ModelLoad | None:
        """The model being built now (else the first still waiting), or None."""
        loading = [m for m in list(self.models.values()) if m.state is ModelState.LOADING]
        building = [m for m in loading if m.building]
        return (building or loading or [None])[0]

    def health(self) -> str:
        """``/healthz``'s 503 body: ``loading: NAME (KIND): STAGE[, bytes][, seconds]``, or
        ``failed: ...`` once a model could not be built and the server is stopping."""
        if self.failure is not None:
            return f"failed: {self.failure}"
        m = self.current()
        if m is None:
            return "loading: starting the engine"
        return f"loading: {m.name} ({m.kind}): {m.describe(time.monotonic())}"

    def listing(self) -> list[dict[str, Any]]:
        """``/v1/models`` while models load: every requested model, in build order."""
        now = time.monotonic()
        return [m.listing(now) for m in list(self.models.values())]
