"""How many sessions fit: capacity planning from a model's declared geometry.

Everything is counted in *pages*: one block of ``block_size`` tokens across all
layers, K and V together (``KVGeometry.page_bytes``)::

    page_bytes = num_layers * 2 * block_size * kv_heads * head_dim * itemsize

For ``c`` resident sessions, ``B`` local branches, ``ppf`` pages per frame and
``T`` frames per tick::

    in_flight_frames = T * ticks_in_flight       (ticks in flight at once: the batch)
    managed_pages(c) = B * (c * (sink + window) + in_flight_frames) * ppf + 2
    scratch          = B' * (T * ppf + scratch_blocks)   B' = 1 if the branches share
                                                          the worker-local slot, else B
                                                          (0 without a worker slot)
    required(c)      = (scratch + managed_pages(c)) * page_bytes
                       + c * cross_bytes + c * model_state_bytes

``window`` here is the window rounded up to whole spans (``retention``); the
``+ 2`` is the null block 0 and the pad block (the write target of padded batch
rows). ``cross_bytes`` is ``B * num_layers * 2 * cross_tokens * kv_heads *
head_dim * itemsize``. The pool gets ``scratch + managed_pages(c)`` blocks.

Why these units reproduce the issue's figures (one tick in flight):

* tiny (1 layer, 1 head, head 1, float32, block 1, span 1, sink 3, window 3,
  T=3, cross 2): page = 1*2*1*1*1*4 = 8 bytes, cross = 1*2*2*1*1*4 = 16 bytes.
  scratch = 3, managed(1) = (6 + 3) + 2 = 11, so required(1) = 14*8 + 16 = 128;
  managed(2) = (12 + 3) + 2 = 17, required(2) = 20*8 + 2*16 = 192.
* LingBot-World v2 (40 layers, 40 heads, head 128, bf16, block = frame = 1560
  tokens, sink 9, window 9, span 1, T=3, cross 512, state 7,488,000):
  page = 40*2*1560*40*128*2 = 1,277,952,000 bytes; cross = 40*2*512*40*128*2 =
  419,430,400. scratch = 3, managed(1) = 21 + 2 = 23, so required(1) =
  26*1,277,952,000 + 419,430,400 + 7,488,000 = 33,653,670,400, which is the
  budget at fraction 0.1 of 100 GiB (10 GiB < required(1)). required(2) =
  44 pages + 2*(cross + state) = 57,083,724,800 <= 60 GiB, so fraction 0.6 fits 2.
* Two CFG branches (DreamZero-style: the LingBot geometry with branches positive
  and negative, the worker slot shared, and the Wan VAE decode state of 603 MiB =
  632,291,328 bytes per session as ``model_state_bytes``): scratch = 3 (shared;
  6 if not), managed(1) = 2*(18 + 3) + 2 = 44, cross = 2*419,430,400, so
  required(1) = 47*1,277,952,000 + 838,860,800 + 632,291,328 = 61,534,896,128;
  each further session adds 2*18 pages + cross + state = 47,477,424,128, so
  required(2) = 109,012,320,256: 139 GiB (149,250,113,536 bytes) at fraction 0.9
  is a budget of 134,325,102,182 bytes and holds 2 (required(3) =
  156,489,744,384). Without the shared slot required(1) = 65,368,752,128.

* DreamZero-DROID (40 layers, 40 heads, head 128, bf16, block = frame = 880 tokens, two
  branches, sink 1, window 6, T=2, no worker slot, state 1,262,464,000 bytes: both branches'
  cross K/V of 512 text + 257 CLIP tokens and the float32 I2V condition ``y``):
  page = 40*2*880*40*128*2 = 720,896,000 bytes; managed(1) = 2*(7 + 2) + 2 = 20, so
  required(1) = 20*720,896,000 + 1,262,464,000 = 15,680,384,000, and each further session
  adds 2*7 pages + state = 11,355,008,000 (``models/policy/dreamzero/cache.py``).

The budget is soft: ``effective = max(available * fraction, required(1))`` so one
session always fits when the device can hold it at all; when ``required(1) >
available`` planning fails at start with both numbers in the message.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from fractions import Fraction

from kv import retention
from kv.geometry import KVGeometry

log = logging.getLogger(__name__)


class CapacityError(RuntimeError):
    """Not even one session fits in the memory available."""


def scratch_pages(g: KVGeometry) -> int:
    """The worker-local slot: one tick's pages (+ ``scratch_blocks``) per branch, or once if
    shared; none for a geometry without one (``worker_slot=False``)."""
    if not g.worker_slot:
        return 0
    branches = 1 if g.branches_share_worker_slot else g.num_branches
    return branches * (g.pages_per_tick + g.scratch_blocks)


def managed_pages(g: KVGeometry, sessions: int, ticks_in_flight: int = 1) -> int:
    retained = retention.max_retained_frames(g.sink_frames, g.window_frames, g.span_frames)
    in_flight_frames = g.frames_per_tick * ticks_in_flight
    return g.num_branches * (sessions * retained + in_flight_frames) * g.pages_per_frame + 2


def pool_blocks(g: KVGeometry, sessions: int, ticks_in_flight: int = 1) -> int:
    """Blocks of the device pool for ``sessions`` resident sessions."""
    return scratch_pages(g) + managed_pages(g, sessions, ticks_in_flight)


def required_bytes(g: KVGeometry, sessions: int, ticks_in_flight: int = 1) -> int:
    """Device bytes for ``sessions`` resident sessions (see the module docstring)."""
    pages = pool_blocks(g, sessions, ticks_in_flight)
    return pages * g.page_bytes + sessions * (g.cross_bytes + g.model_state_bytes)


def session_bytes(g: KVGeometry) -> int:
    """What one more resident session adds: every branch's retained pages, cross caches, state."""
    return required_bytes(g, 2) - required_bytes(g, 1)


def kv_budget(device: "torch.device | str", *, fraction: float,
              budget_bytes: int | None = None) -> tuple[int | None, float]:
    """``(available_bytes, fraction)`` for ``plan_capacity`` on ``device``.

    An explicit ``budget_bytes`` (``--kv-budget-gib``) is the whole budget (fraction 1,
    on any device: how CPU tests get a limit); otherwise CUDA plans from the device's
    free memory now (``torch.cuda.mem_get_info``, after the weights are loaded) at
    ``fraction``, and CPU has no limit (``None``).
    """
    if budget_bytes is not None:
        if budget_bytes <= 0:
            raise ValueError(f"KV budget must be positive, got {budget_bytes} bytes")
        return int(budget_bytes), 1.0
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0]), fraction
    return None, fraction


@dataclass(frozen=True)
class CapacityPlan:
    available_bytes: int | None  # None: no memory limit
    fraction: float
    budget_bytes: int          # effective budget: max(available * fraction, required(1))
    required_one_bytes: int    # required(1)
    capacity: int              # resident sessions
    required_bytes: int        # required(capacity)
    num_blocks: int            # device pool blocks, null and pad included
    worker_blocks: int         # the scratch term, reserved for the model's worker
    ticks_in_flight: int


def format_bytes(n: int) -> str:
    """``n`` bytes for a person: ``512 B``, ``3.5 KiB``, ``1.04 GiB``."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{n} B"


def plan_capacity(g: KVGeometry, available_bytes: int | None, *, fraction: float = 0.9,
                  requested_sessions: int | None = None, ticks_in_flight: int = 1) -> CapacityPlan:
    """Largest resident session count that fits, capped by ``requested_sessions``.

    ``available_bytes=None`` means no memory limit (host memory, or a device the
    caller does not measure): the plan is then exactly ``requested_sessions``.
    Raises ``CapacityError`` naming available and required bytes when not even one
    session fits in ``available_bytes``.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if ticks_in_flight < 1:
        raise ValueError(f"ticks_in_flight must be >= 1, got {ticks_in_flight}")
    one = required_bytes(g, 1, ticks_in_flight)
    if available_bytes is None:
        if requested_sessions is None or requested_sessions < 1:
            raise ValueError("without a memory limit, requested_sessions must be a positive int")
        need = required_bytes(g, requested_sessions, ticks_in_flight)
        log.info("kv capacity: %d sessions in %s (no memory limit)", requested_sessions, format_bytes(need))
        return CapacityPlan(
            available_bytes=None, fraction=fraction, budget_bytes=need, required_one_bytes=one,
            capacity=requested_sessions, required_bytes=need,
            num_blocks=pool_blocks(g, requested_sessions, ticks_in_flight),
            worker_blocks=scratch_pages(g), ticks_in_flight=ticks_in_flight)
    if one > available_bytes:
        raise CapacityError(
            f"KV cache needs {one} bytes for one session but only {available_bytes} bytes "
            f"are available (required {one} > available {available_bytes})")
    # Decimal fractions exactly: 0.6 * 100 GiB is 60 GiB, not one byte less.
    budget = max(int(Fraction(repr(fraction)) * available_bytes), one)
    # required(c) = base + c * per_session exactly, so the largest c is a division.
    per_session = required_bytes(g, 2, ticks_in_flight) - one
    base = one - per_session
    capacity = (budget - base) // per_session
    if requested_sessions is not None:
        capacity = min(capacity, requested_sessions)
    capacity = max(capacity, 1)
    need = required_bytes(g, capacity, ticks_in_flight)
    assert need <= budget, (need, budget)
    log.info("kv capacity: %d sessions in %s of a %s budget (%s of %s available)",
             capacity, format_bytes(need), format_bytes(budget), fraction, format_bytes(available_bytes))
    return CapacityPlan(
        available_bytes=available_bytes, fraction=fraction, budget_bytes=budget,
        required_one_bytes=one, capacity=capacity, required_bytes=need,
        num_blocks=pool_blocks(g, capacity, ticks_in_flight),
        worker_blocks=scratch_pages(g), ticks_in_flight=ticks_in_flight)
