"""The group's command channel, the mirror of rank 0's calls, and the watchdog, in one process
(an in-memory ``HashStore`` stands in for the rendezvous's TCP store)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import pytest
import torch.distributed as dist

from models.base import EngineDeadError, ModelAdapter, ModelError
from realtime.engine import group as group_module
from realtime.engine.group import Group, GroupFailed
from realtime.engine.mirror import Mirrored, follow, parallel, portable


@dataclasses.dataclass(frozen=True)
class Work:
    session_id: str
    keys: tuple[str, ...]
    sink: Callable[[int], None] | None = None


class Recorder(ModelAdapter):
    """A model that records each call on it, as a worker's copy would run them."""

    kind = "world"
    sequence_parallel = 2

    def __init__(self, name: str = "split") -> None:
        self.name = name
        self.calls: list[tuple[Any, ...]] = []
        self.device_jpeg = None

    def describe(self):
        return {"name": self.name}

    def run_batch(self, works):
        self.calls.append(("run_batch", [dataclasses.replace(w, sink=None) for w in works]))
        if works[0].session_id == "bad":
            raise ModelError("bad session")
        if works[0].session_id == "dead":
            raise EngineDeadError("device lost")
        return [w.session_id for w in works]

    def end_tick(self, session_id, committed):
        self.calls.append(("end_tick", session_id, committed))

    def reset(self, session_id):
        self.calls.append(("reset", session_id))


def pair(size: int = 2) -> tuple[Group, list[Group]]:
    commands, beats = dist.HashStore(), dist.HashStore()
    return Group(0, size, commands, beats), [Group(r, size, commands, beats) for r in range(1, size)]


def test_commands_reach_every_worker_in_order_and_are_deleted_once_all_read():
    rank0, workers = pair(3)
    for n in range(3):
        rank0.send(("call", "m", "reset", [f"s{n}"]))
    for w in workers:
        assert [w.receive() for _ in range(3)] == [("call", "m", "reset", [f"s{n}"]) for n in range(3)]
    assert rank0.store.num_keys() == 0


def test_rank0_calls_are_run_on_the_worker_and_only_the_state_changing_ones_sent():
    rank0, [worker] = pair()
    here, there = Recorder(), Recorder()
    served = Mirrored(here, rank0)
    assert parallel(here) and not parallel(type("One", (), {})())
    seen: list[int] = []
    assert served.run_batch([Work("a", ("w",), sink=seen.append)]) == ["a"]
    served.end_tick("a", True)
    with pytest.raises(ModelError):
        served.run_batch([Work("bad", ())])
    served.reset("a")
    assert served.describe() == {"name": "split"} and served.kind == "world"   # rank 0's own, not sent
    served.device_jpeg = "encoder"
    assert here.device_jpeg == "encoder" and there.device_jpeg is None
    rank0.send(("stop",))
    assert follow(worker, {"split": there}) == 0          # the ModelError was the same on both
    assert there.calls == here.calls == [
        ("run_batch", [Work("a", ("w",))]), ("end_tick", "a", True), ("run_batch", [Work("bad", ())]),
        ("reset", "a")]


def test_a_fatal_error_on_a_worker_fails_the_group():
    rank0, [worker] = pair()
    rank0.send(("call", "split", "run_batch", [[Work("dead", ())]]))
    with pytest.raises(GroupFailed, match="rank 1: split.run_batch: EngineDeadError"):
        follow(worker, {"split": Recorder()})


def test_portable_leaves_out_callables_only():
    assert portable(Work("a", ("w",), sink=print)) == Work("a", ("w",))
    assert portable("text") == "text" and portable(Work) is Work


def _failed(group: Group) -> threading.Event:
    done = threading.Event()
    group.on_failure = lambda reason: done.set()
    return done


def test_the_watchdog_fails_the_group_when_a_started_worker_exits():
    rank0, _ = pair()
    rank0.procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])]
    done = _failed(rank0)
    rank0.watch()
    assert done.wait(10)
    assert rank0.failure == "sequence-parallel rank 1 exited with status 7"
    with pytest.raises(GroupFailed):
        rank0.send(("stop",))


def test_the_watchdog_fails_the_group_when_a_heartbeat_stops(monkeypatch):
    monkeypatch.setattr(group_module, "HANG_S", 0.3)
    rank0, [worker] = pair()
    done = _failed(rank0)
    started = time.monotonic()
    rank0.watch()                 # the worker never beats: as a stopped (SIGSTOP) process
    assert done.wait(10)
    assert rank0.failure == "sequence-parallel rank 1 stopped answering (no heartbeat for 0.3 s)"
    assert time.monotonic() - started < 2.0


def test_a_beating_worker_keeps_the_group_alive(monkeypatch):
    monkeypatch.setattr(group_module, "HANG_S", 0.3)
    monkeypatch.setattr(group_module, "HEARTBEAT_S", 0.05)
    rank0, [worker] = pair()
    worker.beat()
    rank0.watch()
    time.sleep(1.0)
    assert rank0.failure is None
    rank0.stop(timeout_s=0.1)
