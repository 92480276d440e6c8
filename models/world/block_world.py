"""A world made one block per tick over kv/ sessions: the pipeline's session life and the
adapter's ``generate``, shared by LingBot-World and Matrix-Game.

A block pipeline (``BlockPipeline``) keeps each session's state between blocks and runs one
block for a batch of sessions at a time. A block is two-phase: ``run`` leaves each session's
block pending (its K/V in the chunk's scratch pages, its next state aside) and ``end`` keeps
or drops it; only a kept block becomes the session's state (``_commit``). Decoding streams
through a per-session decoder state that moves on in place and cannot be rewound, so a block
dropped after it was decoded, or one whose batch failed after its decode, closes that
session's world: its next tick must start again at chunk 0. A block's rows are decoded in one
call (``_decode``: the decoder's ``frames_batch`` / ``decode_batch``), frame by frame to each
request's ``on_frame`` when one streams. The model's subclass says how a session opens and what
one block is (``_block``).

A block world (``BlockWorld``) serves such a pipeline behind the world seam: a session opens
(again) at its chunk-0 tick, one block per tick, and the Wan VAE's first block, 3 frames short
of a chunk, holds its first frame for the missing ones (``held_first``, ``_on_frame``). The
model's subclass says how a session opens (``_open``) and what its block request is
(``_request``).
"""

from __future__ import annotations

import abc
import logging
from typing import Any, Callable, Generic, Sequence, TypeVar

import numpy as np
import torch

from kv import PagedKVCache, Residency, ResidencyError
from models.base import ModelError
from models.world.base import WorldAdapter, WorldChunk, WorldTick
from models.world.noise import int64_bits

log = logging.getLogger(__name__)

S = TypeVar("S")   # what one session carries between blocks (a frozen dataclass with ``seed``, ``blocks``)
P = TypeVar("P")   # what a pending block keeps until ``end``

# What a session that kv residency dropped is told.
DROPPED_REASON = "KV and decoder state dropped: device and host memory for sessions are full"


class NoCapacity(RuntimeError):
    """The kv pool has no room for this block now; nothing changed."""


class BlockPipeline(abc.ABC, Generic[S, P]):
    """Sessions keyed by id on a kv pool, one block per ``run``. One owner thread calls it."""

    name: str   # the model, in log lines
    # The streaming decoder (``StreamingWanDecoder`` or ``TAEHVDecoder``): one state per session.
    decoder: Any
    # ``_decode`` returns a block's frames as a uint8 tensor on the device instead of numpy
    # when no row streams (the world base copies a batch to the host at once).
    device_frames = False

    def __init__(self, cache: PagedKVCache, host_budget_bytes: int) -> None:
        self.cache = cache
        self.residency = Residency(cache, host_budget_bytes=host_budget_bytes, on_drop=self._dropped)
        self.sessions: dict[str, S] = {}
        self._pending: dict[str, P] = {}   # blocks run but not yet ended
        # Called with a session id whose state the residency dropped (host budget full).
        self.on_drop: Callable[[str], None] | None = None

    # -- the model's part ----------------------------------------------------------------------

    @abc.abstractmethod
    def _block(self, requests: Sequence[Any], batch: Any, decoded: list[str]) -> tuple[list[Any], dict[str, P]]:
        """One block for ``requests`` in the kv ``batch``: each one's frames and what its ``end``
        commits. Appends each session id to ``decoded`` before its decoder state moves on."""

    @abc.abstractmethod
    def _decode_state(self, session_id: str) -> Any:
        """The session's streaming decoder state (``decoder``'s)."""

    def _commit(self, session_id: str, pending: P) -> None:
        """Make a kept block's pending state the session's (its kv chunk is committed)."""
        self.sessions[session_id] = pending

    @abc.abstractmethod
    def _restarted(self, session: S, seed: int) -> S:
        """The session's state back at its first block, with the noise of ``seed`` (int64 bits)."""

    # -- sessions ------------------------------------------------------------------------------

    def at_start(self, session_id: str) -> bool:
        """Whether the session is open with no block made (just opened or reset)."""
        s = self.sessions.get(session_id)
        return s is not None and s.blocks == 0 and session_id not in self._pending

    def _open_slot(self, session_id: str) -> None:
        """A kv slot for a new session (may swap the least recently ticked idle one out)."""
        if session_id in self.sessions:
            raise ValueError(f"session {session_id!r} is already open")
        try:
            self.residency.open(session_id)
        except ResidencyError as e:
            raise NoCapacity(f"no kv slot for session {session_id!r}: {e}") from None

    @torch.no_grad()
    def reset(self, session_id: str, seed: int | None = None) -> None:
        """Back to the first block with the same condition and cross K/V (kept), and the noise of
        ``seed`` (None: the session's seed so far)."""
        if self._pending.pop(session_id, None) is not None:
            self.cache.abort_chunk(session_id)
        s = self.sessions[session_id]
        self.residency.reset(session_id, keep_cross=True)
        self.residency.state(session_id).reset()
        self.sessions[session_id] = self._restarted(s, s.seed if seed is None else int64_bits(seed))

    @torch.no_grad()
    def close(self, session_id: str) -> None:
        """Forget the session and free its kv and state. Idempotent."""
        if self._pending.pop(session_id, None) is not None and session_id in self.cache:
            self.cache.abort_chunk(session_id)
        self.sessions.pop(session_id, None)
        self.residency.close(session_id)

    def _dropped(self, session_id: str) -> None:
        # Residency closed the session's kv and freed its state (host budget full).
        log.warning("%s session=%s dropped by kv residency", self.name, session_id)
        self._pending.pop(session_id, None)
        self.sessions.pop(session_id, None)
        if self.on_drop is not None:
            self.on_drop(session_id)

    # -- one block -----------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, requests: Sequence[Any]) -> list[Any]:
        """One block for each request's session (distinct), committed: uint8 ``[T, H, W, 3]``."""
        frames = self.run(requests)
        for r in requests:
            self.end(r.session_id, committed=True)
        return frames

    @torch.no_grad()
    def run(self, requests: Sequence[Any]) -> list[Any]:
        """Like ``generate``, but each session's block stays pending until ``end``."""
        if not requests:
            return []
        ids = [r.session_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("a session appears twice in one batch")
        for sid in ids:
            if sid not in self.sessions:
                raise ValueError(f"session {sid!r} is not open")
            if sid in self._pending:
                raise RuntimeError(f"session {sid!r} already has a block pending")
        self._prepare(requests)
        try:
            self.residency.ensure_resident(ids)   # swaps in (and others out) as needed
        except ResidencyError as e:
            raise NoCapacity(str(e)) from None
        batch = self.cache.begin_batch(ids)
        if batch is None:
            raise NoCapacity(f"no kv room for a block of {len(ids)} session(s)")
        decoded: list[str] = []
        try:
            frames, pending = self._block(requests, batch, decoded)
        except BaseException:
            self.cache.abort_batch(batch)
            for sid in decoded:   # a decoder state that moved on cannot be rewound
                self.close(sid)
            raise
        self._pending.update(pending)
        return frames

    def _decode(self, requests: Sequence[Any], z: torch.Tensor, decoded: list[str]) -> list[Any]:
        """Every row of ``z`` (the decoder's input, row ``r`` of ``requests[r]``'s session) decoded
        after its session's decoder state in one batched call: each block's frames, uint8
        ``[T, H, W, 3]`` (9 for a session's first block, 12 after).

        When a request has an ``on_frame`` the block is decoded one latent frame at a time for all
        rows, and each frame goes to its row's ``on_frame(index, uint8 [1, H, W, 3])`` as soon as
        its latent frame is decoded: the rows' earlier frames before any row's later ones, and
        within a latent frame frame ``j`` of every row before frame ``j + 1``. Otherwise the block
        is decoded whole (one pass for TAEHV). One row is the decoder's ``frames`` / ``decode``."""
        states = [self._decode_state(r.session_id) for r in requests]
        decoded.extend(r.session_id for r in requests)   # the states move from here on
        if not any(r.on_frame is not None for r in requests):
            blocks = [_uint8(v).permute(1, 2, 3, 0) for v in self.decoder.decode_batch(states, z)]
            return blocks if self.device_frames else [b.cpu().numpy() for b in blocks]
        sinks = [r.on_frame for r in requests]
        frames: list[list[np.ndarray]] = [[] for _ in requests]
        for rows, video in self.decoder.frames_batch(states, z):       # [n, 3, t, H, W]
            host = _uint8(video).permute(0, 2, 3, 4, 1).cpu().numpy()  # [n, t, H, W, 3], one copy
            for j in range(host.shape[1]):
                for k, row in enumerate(rows):
                    px = host[k, j:j + 1]
                    if sinks[row] is not None:
                        sinks[row](len(frames[row]), px)
                    frames[row].append(px)
        return [np.concatenate(f) for f in frames]

    def _prepare(self, requests: Sequence[Any]) -> None:
        """What a block's requests change before the batch starts (default: nothing)."""

    def end(self, session_id: str, committed: bool) -> None:
        """Keep (``committed``) or drop the session's pending block. Idempotent."""
        pending = self._pending.pop(session_id, None)
        if pending is None:
            return
        if committed:
            self.cache.commit_chunk(session_id)
            self._commit(session_id, pending)
        else:
            # The block was decoded: the decoder state is past it and cannot go back.
            log.info("%s session=%s block dropped after decoding: its world is closed", self.name, session_id)
            self.cache.abort_chunk(session_id)
            self.close(session_id)


def _uint8(video: torch.Tensor) -> torch.Tensor:
    """Decoder pixels in [-1, 1] as uint8."""
    return ((video.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def held_first(frames: Any, count: int) -> Any:
    """A block's frames (numpy or a torch tensor, ``[T, H, W, 3]``) made ``count`` long by
    holding its first frame before them: a session's first block makes fewer frames."""
    if len(frames) >= count:
        return frames
    if isinstance(frames, np.ndarray):
        return np.concatenate([np.repeat(frames[:1], count - len(frames), 0), frames])
    return torch.cat([frames[:1].expand(count - len(frames), *frames.shape[1:]), frames])


class BlockWorld(WorldAdapter):
    """A ``BlockPipeline`` behind the world seam: one block per tick, opened at chunk 0."""

    takes_image = True
    streams_frames = True   # each frame goes to the tick's frame_sink as soon as it is decoded
    pipeline: BlockPipeline

    @abc.abstractmethod
    def _open(self, w: WorldTick) -> None:
        """Open ``w``'s session on the pipeline from its chunk-0 tick (image, seed, prompt)."""

    @abc.abstractmethod
    def _request(self, w: WorldTick) -> Any:
        """``w``'s block request for the pipeline."""

    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        if not works:
            return []
        if len({w.session_id for w in works}) != len(works):
            raise ModelError("a session appears twice in one batch")
        F = self.geometry.frames_per_chunk
        p = self.pipeline
        for w in works:
            if len(w.actions) != F:
                raise ModelError(f"session {w.session_id}: {len(w.actions)} key sets for {F} frames")
            if w.chunk_index > 0 and w.session_id not in p.sessions:
                raise ModelError(f"session {w.session_id}: no world to continue; start at chunk 0")
        try:
            for w in works:
                if w.chunk_index == 0 and not p.at_start(w.session_id):
                    p.close(w.session_id)
                    self._open(w)
            frames = p.run([self._request(w) for w in works])
        except (NoCapacity, ValueError) as e:
            raise ModelError(str(e)) from e
        return [WorldChunk.answering(w, held_first(f, F)) for w, f in zip(works, frames)]

    def _on_frame(self, w: WorldTick, pad: int) -> Callable[[int, np.ndarray], None] | None:
        """The tick's frame sink at chunk indexes: a first block's first frame is also the ``pad``
        held frames before it (``held_first``), so the rest move up by as many."""
        sink = w.frame_sink
        if sink is None:
            return None

        def on_frame(i: int, frame: np.ndarray) -> None:
            if pad and i == 0:
                sink(0, np.repeat(frame, pad + 1, 0))
            else:
                sink(i + pad, frame)
        return on_frame

    def end_tick(self, session_id: str, committed: bool) -> None:
        self.pipeline.end(session_id, committed)

    def drop_session(self, session_id: str) -> None:
        self.pipeline.close(session_id)

    def set_drop_listener(self, listener: Callable[[str, str], None]) -> None:
        # kv residency drops a session only when the host budget for swapped sessions is full;
        # its next tick (chunk > 0) is then refused until it is reset.
        self.pipeline.on_drop = lambda sid: listener(sid, DROPPED_REASON)
