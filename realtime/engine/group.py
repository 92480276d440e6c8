"""The sequence-parallel process group: N processes, one engine.

``realtime serve --sequence-parallel N`` runs one world (or DreamZero robot) session over N
ranks (devices) of one host (models/world/parallel says what each rank computes). Rank 0 is
the server: the app, the sessions and the engine loop. Ranks 1..N-1 are workers: each builds
the same world models and policy and runs, in the same order, every call rank 0's engine
makes on a sequence-parallel model (``mirror.py``): the forwards, whose collectives need every
rank, and the per-session commands (end_tick, reset, drop, detach) that keep each rank's share
of the K/V in step.

Processes. ``realtime serve --sequence-parallel N`` starts the N-1 workers itself
(``spawn_workers``: the same command line with torchrun's variables ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, rendezvous on loopback); under
``torchrun --nproc-per-node N`` every rank already has them. ``init_group`` joins the
torch.distributed group (NCCL on CUDA, each rank on its ``LOCAL_RANK`` device; gloo on CPU).

Two channels, both on the rendezvous's TCP store:

* commands, rank 0 -> workers (``send`` / ``receive``): one pickled call per key ``cmd/<n>``,
  deleted once every worker read it. Never a collective: an idle server's workers wait here
  as long as it stays idle, and rank 0 never waits for them to read;
* heartbeats, workers -> rank 0: each worker's thread adds 1 to ``beat/<rank>`` every
  ``HEARTBEAT_S``.

Faults. Rank 0's watchdog (``watch``) declares the group failed when a worker it started
exits, or when a worker's heartbeat has not moved for ``HANG_S`` (a process killed under
torchrun, or stopped). A collective that fails or waits past ``COLLECTIVE_TIMEOUT_S`` (a worker
hung inside a forward) fails the forward as ``EngineDeadError`` (models/world/parallel/ulysses.py).
Either way the engine dies: ``/healthz`` 503 ``engine unavailable: ...``, every session
``session_failed`` (docs/sequence_parallel.md), and the server stops with status
``EXIT_GROUP_FAILED``. Workers die with rank 0: the ones it started get SIGKILL when it
exits (``PR_SET_PDEATHSIG``), and every worker exits when rank 0's store goes away.
"""

from __future__ import annotations

import copyreg
import ctypes
import datetime
import io
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from models.base import EngineDeadError

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.25
# A worker whose heartbeat has not moved for this long has stopped (killed, SIGSTOP, wedged).
HANG_S = 5.0
# A collective (an all-to-all inside a forward) waiting longer than this fails the forward.
# The ranks run the same forward, so a wait is their skew, never a whole forward (NCCL's first
# collective also sets up its communicators: seconds on 8 GPUs).
COLLECTIVE_TIMEOUT_S = 30.0
# The status ``realtime serve`` exits with after its group failed.
EXIT_GROUP_FAILED = 3
# A worker waits for its next command this long at a time (rank 0 going away ends the wait at
# once; c10d logs a line at each timeout, so an idle worker would log every POLL_S).
POLL_S = 600.0


class GroupFailed(EngineDeadError):
    """The group lost a rank (or rank 0 went away): nothing more can run on it."""


def launched_rank() -> tuple[int, int] | None:
    """``(rank, world size)`` when a launcher (torchrun, or ``spawn_workers``) started this
    process as one rank of a group, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def _die_with_parent() -> None:  # in the child, before exec: SIGKILL when the parent exits
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn_workers(size: int, argv: list[str]) -> list[subprocess.Popen]:
    """Ranks 1..size-1 as ``python -m realtime.server.cli ARGV`` with torchrun's variables on a
    free loopback port, and the same variables set here for rank 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE=str(size), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    procs = []
    for rank in range(1, size):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        procs.append(subprocess.Popen([sys.executable, "-m", "realtime.server.cli", *argv], env=env,
                                      preexec_fn=_die_with_parent if sys.platform == "linux" else None))
    log.info("sequence parallel: started ranks 1..%d (pids %s), rendezvous 127.0.0.1:%d",
             size - 1, [p.pid for p in procs], port)
    return procs


def read_only(mapping: dict) -> types.MappingProxyType:
    """``mapping`` behind a read-only view (how ``dumps``'s read-only mappings unpickle)."""
    return types.MappingProxyType(mapping)


def _mapping_proxy(proxy: types.MappingProxyType) -> tuple[Any, tuple[dict]]:
    return read_only, (dict(proxy),)


def dumps(command: Any) -> bytes:
    """``command`` pickled, read-only mappings included (a policy work's observation holds its
    images and extras as ``MappingProxyType``, which pickle refuses; they arrive read-only)."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table, types.MappingProxyType: _mapping_proxy}
    pickler.dump(command)
    return buf.getvalue()


@dataclass
class Group:
    """This process's rank of the group and its channels (``init_group`` builds it)."""

    rank: int
    size: int
    store: Any                      # commands (the engine thread on rank 0, the main thread on a worker)
    beats: Any                      # heartbeats and the watchdog (a client of its own: another thread)
    procs: list[subprocess.Popen] = field(default_factory=list)   # the workers rank 0 started
    failure: str | None = None      # why the group failed; None while it serves
    on_failure: Callable[[str], None] | None = None
    _sent: int = 0
    _received: int = 0
    _stopping: bool = False

    # -- commands ------------------------------------------------------------------------
    def send(self, command: Any) -> None:
        """Rank 0: hand ``command`` to every worker (they run it in order); returns at once."""
        if self.failure is not None:
            raise GroupFailed(self.failure)
        self._sent += 1
        self.store.set(f"cmd/{self._sent}", dumps(command))

    def receive(self) -> Any:
        """A worker: the next command, waiting as long as rank 0 is there (``GroupFailed`` once
        it is not)."""
        key = f"cmd/{self._received + 1}"
        while True:
            try:
                self.store.wait([key], datetime.timedelta(seconds=POLL_S))
                break
            except Exception as exc:  # noqa: BLE001 - a timeout, or rank 0's store gone
                if "timeout" not in str(exc).lower():
                    raise GroupFailed(f"rank 0 went away: {exc}") from None
        data = self.store.get(key)
        self._received += 1
        if self.store.add(f"read/{self._received}", 1) == self.size - 1:  # the last reader cleans up
            self.store.delete_key(key)
            self.store.delete_key(f"read/{self._received}")
        return pickle.loads(data)

    # -- health --------------------------------------------------------------------------
    def beat(self) -> None:
        """A worker: start the heartbeat thread."""
        def run() -> None:
            try:
                while True:
                    self.beats.add(f"beat/{self.rank}", 1)
                    time.sleep(HEARTBEAT_S)
            except Exception:  # noqa: BLE001 - rank 0 is gone: the command loop ends the process
                return

        threading.Thread(target=run, name="heartbeat", daemon=True).start()

    def watch(self) -> None:
        """Rank 0: start the watchdog thread (``fail`` on a worker's exit or a stale heartbeat)."""
        def run() -> None:
            seen = {r: (-1, time.monotonic()) for r in range(1, self.size)}
            while self.failure is None and not self._stopping:
                for rank, proc in enumerate(self.procs, 1):
                    if proc.poll() is not None:
                        return self.fail(f"sequence-parallel rank {rank} exited with status {proc.returncode}")
                now = time.monotonic()
                for rank, (count, since) in seen.items():
                    try:
                        beat = self.beats.add(f"beat/{rank}", 0)
                    except Exception as exc:  # noqa: BLE001 - the store itself is gone
                        return self.fail(f"sequence-parallel store failed: {exc}")
                    if beat != count:
                        seen[rank] = (beat, now)
                    elif now - since > HANG_S:
                        return self.fail(f"sequence-parallel rank {rank} stopped answering "
                                         f"(no heartbeat for {HANG_S:g} s)")
                time.sleep(HEARTBEAT_S / 2)

        threading.Thread(target=run, name="group-watchdog", daemon=True).start()

    def fail(self, reason: str) -> None:
        """The group failed: remember why (once), stop the workers rank 0 started, tell the server."""
        if self.failure is not None or self._stopping:
            return
        self.failure = reason
        log.error("%s: the group has failed", reason)
        self.kill_workers()
        if self.on_failure is not None:
            self.on_failure(reason)

    # -- shutdown ------------------------------------------------------------------------
    def stop(self, timeout_s: float = 5.0) -> None:
        """Rank 0 at exit: tell the workers to end, wait for them, then kill any left."""
        if self.rank != 0 or self._stopping:
            return
        self._stopping = True
        if self.failure is None:
            try:
                self.send(("stop",))
            except Exception:  # noqa: BLE001 - they are killed below
                pass
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill_workers()

    def kill_workers(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


_GROUP: Group | None = None


def start_rank0(size: int, device: str, argv: list[str] | None) -> Group:
    """Rank 0: start ranks 1..size-1 with ``argv`` (None: a launcher started them) and join them;
    ``GroupFailed`` (the ranks it started killed) when they do not all join."""
    procs = spawn_workers(size, list(argv)) if argv is not None else []
    try:
        return init_group(device, procs)
    except Exception as exc:  # noqa: BLE001 - a rank that never came, a port taken
        for proc in procs:
            proc.kill()
        raise GroupFailed(f"sequence parallel: the {size} ranks did not all join: {exc}") from exc


def rank_device(device: str) -> str:
    """The device this rank's models load on: ``cuda`` is the rank's own GPU, ``cuda:LOCAL_RANK``
    (named, not the current device, which is per thread and the models load on another)."""
    if device.split(":")[0] != "cuda" or launched_rank() is None:
        return device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', launched_rank()[0]))}"


def current_group() -> Group | None:
    """This process's group, or None (no sequence parallel)."""
    return _GROUP


def init_group(device: str, procs: list[subprocess.Popen] = ()) -> Group:
    """Join the group the environment names (``launched_rank``); rank 0 starts its watchdog."""
    global _GROUP
    import torch
    import torch.distributed as dist

    rank, size = launched_rank() or (0, 1)
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    backend = "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(rank_device(device)))   # this thread's (the engine's on a worker)
        backend = "nccl"
    store, rank, size = next(dist.rendezvous("env://", timeout=timeout))
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)

    def client() -> Any:
        return dist.PrefixStore("realtime/", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout))

    group = Group(rank, size, client(), client(), list(procs))
    if rank == 0:
        group.watch()
    else:
        group.beat()
    _GROUP = group
    log.info("sequence parallel: rank %d of %d joined (%s)", rank, size, backend)
    return group
