"""A real server whose models fail on request, for the fault-injection suite.

``python -m tests.reliability.faulty_server --port P [--tts]`` serves, through the
production app and uvicorn settings (``realtime.server.server.run``) but outside the factory
table (test models never enter it):

* world ``maze`` (``FaultyMaze``, the real maze model on kv/'s paged cache) whose
  session ids name their fault: ``raise-at-N-*`` raises a ``RuntimeError`` in the
  forward of chunk N, ``oom-at-N-*`` a real ``torch.OutOfMemoryError``, ``die-at-N-*``
  a ``torch.AcceleratorError`` (a dead CUDA context: the engine dies). Each fires once
  per session id, after the frame's KV pages were allocated, so the abort path has
  blocks to give back; ``slow-*`` takes ``SLOW_TICK_S`` longer every forward (a tick
  that is still running when the client's next message arrives);
* policy ``slow-policy``: the dummy policy's zeros; an observation whose prompt is
  ``sleep:S`` holds the engine for S seconds (a long inference);
* ``--tts``: the real joe voice (the ``tts`` extra).
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from models.policy.base import PolicyWork
from models.policy.dummy import DummyPolicy
from models.world.maze.adapter import MazeWorld, _Session
from protocols.openpi import PolicyMetadata
from realtime.server.app import build_app
from realtime.server.config import EngineConfig, PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import Inventory
from realtime.server.server import bind_socket, run

FAULT = re.compile(r"^(raise|oom|die)-at-(\d+)-")
SLOW_TICK_S = 0.4
METADATA = PolicyMetadata(action_horizon=4, action_dim=3, image_keys=("cam",), image_resolution=(16, 16), state_dim=2)


class FaultyMaze(MazeWorld):
    """The maze world, failing the forward of the chunk a session's id names, until the
    session is reset or released (the engine's one-by-one retry of a failed batch fails
    again, as a real fault would)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.fired: set[str] = set()
        self.recovered: set[str] = set()

    def drop_session(self, session_id: str) -> None:
        if session_id in self.fired:
            self.recovered.add(session_id)
        super().drop_session(session_id)

    def _generate(self, ids: list[str], sessions: list[_Session], acts: np.ndarray) -> np.ndarray:
        for sid, s in zip(ids, sessions):
            m = FAULT.match(sid)
            if m and sid not in self.recovered and s.frames == int(m.group(2)):
                self.fired.add(sid)
                self._begin(ids)  # the frame's pages are taken: the failure must give them back
                if m.group(1) == "oom":
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
                if m.group(1) == "die":
                    raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered (injected)")
                raise RuntimeError(f"injected failure in the forward of {sid}")
        if any(sid.startswith("slow-") for sid in ids):
            time.sleep(SLOW_TICK_S)
        return super()._generate(ids, sessions, acts)


class SlowPolicy(DummyPolicy):
    """Zeros; a prompt ``sleep:S`` sleeps S seconds in the forward (the engine is held)."""

    def infer_batch(self, works: Sequence[PolicyWork]) -> list[Mapping[str, Any]]:
        for w in works:
            prompt = w.observation.prompt if hasattr(w.observation, "prompt") else None
            if isinstance(prompt, str) and prompt.startswith("sleep:"):
                time.sleep(float(prompt.split(":", 1)[1]))
        return super().infer_batch(works)


def build(tts: bool = False, drain_timeout_s: float = 20.0) -> Any:
    inventory = Inventory()
    inventory.add(FaultyMaze(device="cpu", steps=1, window=2, max_batch=8, max_sessions=16))
    inventory.add(SlowPolicy(metadata=METADATA, name="slow-policy"))
    if tts:
        from models.tts.piper.adapter import PiperTTS

        inventory.add(PiperTTS.load(device="cpu", max_batch=1))
    config = ServerConfig(engine=EngineConfig(batch_wait_ms=2.0), world=WorldConfig(models=("maze",)),
                          policy=PolicyConfig(policy=""), tts=TTSConfig(enabled=tts),
                          drain_timeout_s=drain_timeout_s)
    return build_app(config, inventory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tts", action="store_true")
    parser.add_argument("--drain-timeout", type=float, default=20.0)
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = bind_socket("127.0.0.1", args.port)
    run(build(args.tts, args.drain_timeout), sock=sock, log_level="info")


if __name__ == "__main__":
    main()
