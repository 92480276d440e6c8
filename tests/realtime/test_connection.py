"""realtime/endpoints/connection.py: the live-session registry, failure mapping and session ids."""

from __future__ import annotations

import re

from models.base import EngineDeadError, ModelError
from realtime.endpoints.lifecycle import Failure, engine_failure
from sessions.registry import new_session_id
from realtime.endpoints.live import LiveSessions
from realtime.engine import EngineStopped, TickCancelled


class Owner:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def dropped(self, reason: str) -> None:
        self.reasons.append(reason)


def test_registry_lists_every_kind_and_routes_drops_by_model():
    live = LiveSessions()
    world, robot = Owner(), Owner()
    w = live.add("world", "w1", "maze", world)
    live.add("policy", "w1", "flow", robot)  # the same id on another model is another session
    w.ticked(4)
    rows = live.sessions()
    assert [(r["kind"], r["session_id"], r["model"], r["state"], r["chunk_index"]) for r in rows] == [
        ("world", "w1", "maze", "active", 4), ("policy", "w1", "flow", "active", 0)]
    assert isinstance(rows[0]["last_tick"], float) and rows[1]["last_tick"] is None
    live.dropped("flow", "w1", "evicted")
    live.dropped("maze", "nobody", "evicted")  # no owner: logged, nothing else
    assert (world.reasons, robot.reasons) == ([], ["evicted"])
    assert live.find("world", "w1") is w and live.find("tts", "w1") is None
    live.remove(w)
    assert len(live) == 1


def test_engine_failures_by_type():
    assert engine_failure(ModelError("x")) is Failure.MODEL
    assert engine_failure(EngineDeadError("x")) is Failure.ENGINE
    assert engine_failure(EngineStopped("x")) is Failure.ENGINE
    assert engine_failure(TickCancelled("x")) is Failure.CANCELLED


def test_server_made_session_ids():
    a, b = new_session_id("tts"), new_session_id("tts")
    assert a != b and re.fullmatch(r"tts-[0-9a-f]{12}", a)
