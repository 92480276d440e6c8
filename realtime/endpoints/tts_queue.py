"""A tts.v1 session's queue of what is left to speak, and what a drain keeps of it.

The reader puts a ``Sentence`` per complete sentence and an ``UtteranceEnd`` per
``input.done``; the speaker takes them in order. A drain (``plan_drain``) keeps the
utterance being spoken and reports every other one cancelled, behind a ``Drained`` marker.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Awaitable

@dataclass(frozen=True)
class Sentence:
    utterance_index: int
    sentence_index: int
    text: str
    queued_at: float = field(default_factory=time.perf_counter)  # for time to first audio


@dataclass(frozen=True)
class UtteranceEnd:
    utterance_index: int
    sentences: int


@dataclass(frozen=True)
class Drained:
    """The drain's marker, behind what is left to speak: report ``unfinished`` cancelled."""

    unfinished: tuple[int, ...]
    reached: asyncio.Event = field(default_factory=asyncio.Event, compare=False)


def plan_drain(items: list, current: int | None, open_utterance: int | None,
               cancelled: set[int]) -> tuple[int | None, list, set[int]]:
    """What a drain does with the queued ``items``: (the utterance that finishes, the items
    kept for it, the utterances to report cancelled). The one that finishes is the
    speaker's (``current``), or the one at the head of the queue when the speaker is between
    two of its sentences; ``open_utterance`` has text but no ``input.done`` yet; the client
    cancelled ``cancelled`` itself and heard so."""
    head = next((i.utterance_index for i in items if not isinstance(i, Drained)), None)
    finishing = current if current is not None else head
    keep = [i for i in items if not isinstance(i, Drained) and i.utterance_index == finishing]
    unfinished = {i.utterance_index for i in items if not isinstance(i, Drained)}
    if open_utterance is not None:
        unfinished.add(open_utterance)  # its input.done never came
    if finishing is not None and not any(isinstance(i, UtteranceEnd) for i in keep):
        unfinished.add(finishing)  # cut short after its queued sentences
    unfinished -= {i.utterance_index for i in keep if isinstance(i, UtteranceEnd)}
    unfinished -= cancelled
    return finishing, keep, unfinished


def take_all(queue: asyncio.Queue) -> list:
    """Everything queued, in order; the queue is empty after."""
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


async def first_of(*waits: Awaitable[object]) -> None:
    """Wait until the first of ``waits`` is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
