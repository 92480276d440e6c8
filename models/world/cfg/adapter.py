"""``CFGWorld``: the two-branch CFG world core (``core.py``) behind the world seam.

Session options (``session.create`` ``options``, declared in ``create_options``):
``guidance_scale`` (0..``MAX_GUIDANCE_SCALE``, default 1: the positive branch
alone) and ``negative_prompt`` (default empty). The session's ``prompt`` feeds the
positive branch, from the tick that carries it on. A session is opened in the core at create (``admit``), so a
session that cannot fit is refused there with ``busy`` (``Residency.refusal``:
never by dropping another session); its pool is sized by ``kv.capacity`` from the
build options' budget (``--gpu-memory-fraction`` of free device memory, or
``--kv-budget-gib``), counting both branches and the guided-frame state.

A tick of ``frames_per_chunk`` F makes F core steps; each step commits its KV at
once, so a tick the engine does not commit (``end_tick(committed=False)``) resets
the session in the core: it is FAILED then and must reset or close anyway. Every
tick carries the session's options (``WorldTick.options``), so a session released
after a failure, or dropped by LRU, is opened again by its next chunk-0 tick
(after ``session.reset``); a later tick of such a session is refused.
Frames: the guided frame ``[tokens, dim]`` as an image, ``(tanh(x) + 1) * 127.5``
per value, each value a ``SCALE`` x ``SCALE`` grey pixel block.

The session's ``seed`` (``WorldTick.seed``) draws its first frame (``core.py``); a chunk-0
tick starts the session's world from it, so a reset or a reopened session replays its
frames, and what shares its ticks changes none of them.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from kv import CapacityError, kv_budget, plan_capacity
from models.base import ModelError
from models.factory import BuildOptions, FactoryError
from models.world.base import CreateOption, WorldAdapter, WorldChunk, WorldGeometry, WorldTick
from models.world.cfg.core import MAX_GUIDANCE_SCALE, CFGWorldConfig, CFGWorldCore

log = logging.getLogger(__name__)

SCALE = 4   # pixels per value, each way
FPS = 10.0

CREATE_OPTIONS = (
    CreateOption("guidance_scale", "number", 1.0, minimum=0.0, maximum=MAX_GUIDANCE_SCALE,
                 doc="classifier-free guidance: neg + s * (pos - neg); 1 is the positive branch alone"),
    CreateOption("negative_prompt", "string", "", max_length=1024, doc="the negative branch's prompt"),
)


def to_image(frame: torch.Tensor) -> np.ndarray:
    """A guided frame [tokens, dim] -> uint8 [tokens * SCALE, dim * SCALE, 3]."""
    grey = ((torch.tanh(frame.float()) + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8).cpu().numpy()
    big = grey.repeat(SCALE, axis=0).repeat(SCALE, axis=1)
    return np.repeat(big[:, :, None], 3, axis=2)


class CFGWorld(WorldAdapter):
    """A small two-branch CFG world with random weights (``MODEL_CARD.md``)."""

    name = "cfg-tiny"
    uses_prompts = True
    create_options = CREATE_OPTIONS

    def __init__(self, config: CFGWorldConfig = CFGWorldConfig(), *, device: str = "cpu", max_batch: int = 4,
                 max_sessions: int = 16, frames_per_chunk: int = 1, host_budget_bytes: int = 1 << 26,
                 budget_bytes: int | None = None, gpu_memory_fraction: float = 0.9, seed: int = 0) -> None:
        if not 1 <= frames_per_chunk <= 4:
            raise ValueError(f"frames_per_chunk must be 1..4, got {frames_per_chunk}")
        g = config.geometry()
        available, fraction = kv_budget(device, fraction=gpu_memory_fraction, budget_bytes=budget_bytes)
        try:
            self.plan = plan_capacity(g, available, fraction=fraction, requested_sessions=max_sessions,
                                      ticks_in_flight=max_batch)
        except CapacityError as exc:
            raise ValueError(str(exc)) from exc
        # Every session of a batch must be resident at once.
        self.max_batch = min(max_batch, self.plan.capacity)
        self.core = CFGWorldCore(config, max_sessions=self.plan.capacity, ticks_in_flight=max_batch,
                                 host_budget_bytes=host_budget_bytes, device=device, seed=seed)
        self.core.residency.on_drop = self._dropped
        self.frames_per_chunk = frames_per_chunk
        self.geometry = WorldGeometry(height=config.tokens_per_frame * SCALE, width=config.dim * SCALE,
                                      frames_per_chunk=frames_per_chunk, fps=FPS)
        self._prompts: dict[str, str] = {}   # the positive prompt of every session open in the core
        self._drop_listener: Callable[[str, str], None] | None = None
        log.info("cfg world on %s: %d resident sessions in %d KV bytes (budget %d)", device,
                 self.plan.capacity, self.plan.required_bytes, self.plan.budget_bytes)

    def details(self) -> Mapping[str, Any]:
        p = self.plan
        return {"branches": list(self.core.geometry.branches), "weights": "random",
                "kv": {"resident_sessions": p.capacity, "required_bytes": p.required_bytes,
                       "budget_bytes": p.budget_bytes, "num_blocks": p.num_blocks}}

    # ------------------------------------------------------------------ seam
    def admit(self, session_id: str, options: Mapping[str, Any]) -> str | None:
        # Opened now, so the room it takes is counted from create on.
        if session_id in self._prompts:
            return f"session {session_id!r} is already open in {self.name}"
        refusal = self.core.residency.refusal()
        if refusal is None:
            self._open(session_id, "", options)
        return refusal

    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        for w in works:
            if w.session_id not in self._prompts and w.chunk_index > 0:
                # Dropped (LRU with the host full) or released after a failure: never restart silently.
                raise ModelError(f"session {w.session_id}: its KV was evicted or released; reset or close it")
        for w in works:
            sid, prompt = w.session_id, w.prompt or ""
            if sid not in self._prompts:
                # chunk 0 after a drop or failure
                self._open(sid, prompt, self.check_options(w.options), seed=w.seed)
            elif w.chunk_index == 0 and (self.core.seed(sid) != w.seed or self.core.frames_made(sid)):
                self.core.reset(sid, seed=w.seed)  # admitted before its seed was known, or not reset
            if prompt != self._prompts[sid]:
                self.core.set_prompt(sid, prompt)
                self._prompts[sid] = prompt
        ids = [w.session_id for w in works]
        frames = np.empty((len(works), *self.geometry.frames_shape), dtype=np.uint8)
        for j in range(self.frames_per_chunk):
            try:
                out = self.core.step(ids)
            except RuntimeError as exc:
                raise ModelError(f"cfg tick failed: {exc}") from exc
            for i, sid in enumerate(ids):
                frames[i, j] = to_image(out[sid].guided)
        return [WorldChunk.answering(w, frames[i]) for i, w in enumerate(works)]

    def end_tick(self, session_id: str, committed: bool) -> None:
        if not committed and session_id in self._prompts:
            log.info("cfg tick not committed session=%s: its world starts over", session_id)
            self.core.reset(session_id)

    def reset(self, session_id: str) -> None:
        if session_id in self._prompts:
            self.core.reset(session_id)

    def drop_session(self, session_id: str) -> None:
        self._prompts.pop(session_id, None)
        self.core.close(session_id)

    def set_drop_listener(self, listener: Callable[[str, str], None]) -> None:
        self._drop_listener = listener

    # ------------------------------------------------------------------ internals
    def _open(self, session_id: str, prompt: str, options: Mapping[str, Any], seed: int = 0) -> None:
        """Open the session in the core with its checked ``options``: a fresh world from ``seed``'s
        first frame (at admit the seed is not known yet: its chunk-0 tick sets it)."""
        self.core.open(session_id, prompt, options["negative_prompt"], guidance_scale=options["guidance_scale"],
                       seed=seed)
        self._prompts[session_id] = prompt

    def _dropped(self, session_id: str) -> None:
        self.core._forget(session_id)
        self._prompts.pop(session_id, None)
        log.warning("cfg kv dropped session=%s: refused until it is reset", session_id)
        if self._drop_listener is not None:
            self._drop_listener(session_id, "KV evicted: device and host memory for sessions are full")


def build(path: str | None, options: BuildOptions) -> CFGWorld:
    """Factory-table entry ``cfg-tiny`` (random weights: ``path`` must be empty)."""
    if path is not None:
        raise FactoryError("cfg-tiny has random weights and takes no path")
    try:
        host = {} if options.host_budget_bytes is None else {"host_budget_bytes": options.host_budget_bytes}
        return CFGWorld(device=options.device, max_batch=options.max_batch or 4, **host,
                        frames_per_chunk=options.frames_per_chunk or 1, budget_bytes=options.kv_budget_bytes,
                        gpu_memory_fraction=options.gpu_memory_fraction)
    except ValueError as exc:
        raise FactoryError(f"cfg-tiny: {exc}") from exc
