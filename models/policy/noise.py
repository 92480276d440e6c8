"""Per-robot noise seeds for sampling policies (flow matching draws its chunk from noise).

A request that names ``sampling.seed`` gets exactly that seed. Otherwise the seed is
derived from (the policy's seed, the robot's session id, how many calls of that robot
were committed), so a robot's n-th call draws the same noise on every run and device,
and a call that fails (its tick not committed) does not advance the count.
"""

from __future__ import annotations

import collections
import hashlib

import torch

from models.policy.base import PolicyWork

# Robots whose call counts are remembered; the least recently served are forgotten first
# (a forgotten robot starts counting again from 0, which only repeats its noise).
MAX_TRACKED_SESSIONS = 65536


class CallSeeds:
    """The noise generator of each call, and the per-robot call counts behind it."""

    def __init__(self, seed: int, max_tracked: int = MAX_TRACKED_SESSIONS) -> None:
        self.seed = seed
        self.max_tracked = max_tracked
        # session -> committed call count; _pending holds this call's count until end_tick.
        self._calls: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._pending: dict[str, int] = {}

    def generator(self, work: PolicyWork) -> torch.Generator:
        """A CPU generator for ``work``'s noise (see the module docstring)."""
        if work.sampling.seed is not None:
            seed = work.sampling.seed
        else:
            count = self._calls.get(work.session_id, 0)
            self._pending[work.session_id] = count + 1
            digest = hashlib.blake2b(f"{self.seed}:{work.session_id}:{count}".encode(), digest_size=8).digest()
            seed = int.from_bytes(digest, "little") & (2**63 - 1)
        return torch.Generator().manual_seed(seed)

    def end_tick(self, session_id: str, committed: bool) -> None:
        """Advance ``session_id``'s count if its call was committed."""
        count = self._pending.pop(session_id, None)
        if committed and count is not None:
            self._calls[session_id] = count
            self._calls.move_to_end(session_id)
            while len(self._calls) > self.max_tracked:
                self._calls.popitem(last=False)

    def drop_session(self, session_id: str) -> None:
        self._calls.pop(session_id, None)
        self._pending.pop(session_id, None)
