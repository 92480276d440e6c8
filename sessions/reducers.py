"""Control reducers: fold a tick's control updates into the value the model sees.

A reducer holds the committed state of one control track. Each tick the session
asks it to ``prepare`` the tick's value from the updates applied in that tick;
that is speculative and changes nothing. Only when the tick's result comes back
with matching metadata does the session ``commit`` the prepared state, so a failed
tick leaves the reducer exactly where it was.

Reducer state must live in immutable values that ``commit`` rebinds (never mutates
in place): the session saves and restores ``vars(reducer)`` around commits so that
a failure in one reducer leaves every other one uncommitted too.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from protocols.echo import listed, shown
from protocols.world_v1 import KEY_NAMES
from sessions.errors import ErrorCode, SessionError
from sessions.frozen import FrozenDict


@dataclass(frozen=True)
class Prepared:
    """A speculative tick result: ``value`` goes into ``TickRequest.controls[track]``,
    ``next_state`` is what ``commit`` adopts."""

    value: Any
    next_state: Any


class ControlReducer(abc.ABC):
    """The state of one control track of one session (one instance per session)."""

    track: ClassVar[str]
    schema: ClassVar[str]

    @abc.abstractmethod
    def validate(self, data: FrozenDict) -> None:
        """Raise ``SessionError(BAD_REQUEST)`` if ``data`` is not a valid update."""

    def admit(self, updates: Sequence[FrozenDict]) -> None:
        """Refuse an update that would grow a backlog past its bound.

        ``updates`` are every accepted, not yet committed update of this track, in
        event order, ending with the candidate. Raise ``SessionError(QUEUE_FULL)``
        to refuse the candidate. Called after ``validate``; the default admits all.
        """

    @abc.abstractmethod
    def prepare(self, updates: Sequence[FrozenDict]) -> Prepared:
        """Apply ``updates`` (validated, in event order) to a copy of the committed
        state and return this tick's value and the state after it. Pure."""

    @abc.abstractmethod
    def commit(self, prepared: Prepared) -> None:
        """Adopt ``prepared.next_state`` (from this reducer's own ``prepare``)."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Back to the initial state."""

    # Save/restore for the session's all-or-nothing commit across reducers. The
    # defaults are enough for a reducer that keeps its state in immutable values.
    def save(self) -> Any:
        return dict(vars(self))

    def restore(self, saved: Any) -> None:
        vars(self).clear()
        vars(self).update(saved)


_KEY_SET = frozenset(KEY_NAMES)

KeysState = tuple[frozenset[str], tuple[frozenset[str], ...]]


class KeysReducer(ControlReducer):
    """Held keys (WASD move, IJKL look), per generated frame.

    Two update modes::

        {"mode": "state",  "held": ["w", "d"]}        replace the held set
        {"mode": "script", "frames": [["w"], [], ...]} queue per-frame key sets

    A tick's value has exactly ``frames_per_chunk`` frozensets, one per frame:
    queued script frames first, the held set for the rest. Unused script frames
    carry over to the next tick. With 4 frames per chunk, held {w} and a 6-frame
    script s0..s5::

        tick 0:  s0 s1 s2 s3      script left: s4 s5
        tick 1:  s4 s5 w  w       script left: -
        tick 2:  w  w  w  w

    A key pressed and released again between two ticks (``held: ["j"]`` then
    ``held: []``) would leave no trace in the final held set, so it is kept as a
    *pulse*: it acts in the first held frame of that tick only. With 3 frames and
    nothing held before::

        updates  held [j], held []   ->  {j} {} {}   (as script [[j], [], []])

    Like the held set itself, a pulse is overridden by script frames: in a tick
    whose every frame comes from the script it has no effect.
    """

    track = "keys"
    schema = "keys.v1"
    MAX_FRAMES_PER_EVENT = 256

    def __init__(self, frames_per_chunk: int, *, max_script_frames: int = 4096) -> None:
        if type(frames_per_chunk) is not int or frames_per_chunk < 1:
            raise ValueError(f"frames_per_chunk must be a positive int, got {frames_per_chunk!r}")
        if max_script_frames < self.MAX_FRAMES_PER_EVENT:
            raise ValueError(
                f"max_script_frames must be at least {self.MAX_FRAMES_PER_EVENT}, "
                f"got {max_script_frames}"
            )
        self.frames_per_chunk = frames_per_chunk
        # A client can queue script frames faster than ticks consume them; this
        # bound keeps the backlog (and server memory) finite.
        self.max_script_frames = max_script_frames
        self._held: frozenset[str] = frozenset()
        self._script: tuple[frozenset[str], ...] = ()

    @property
    def held(self) -> frozenset[str]:
        return self._held

    @property
    def script(self) -> tuple[frozenset[str], ...]:
        return self._script

    def validate(self, data: FrozenDict) -> None:
        mode = data.get("mode")
        if mode == "state":
            _check_fields(data, "held")
            _keyset(data["held"], "held")
        elif mode == "script":
            _check_fields(data, "frames")
            frames = data["frames"]
            if not isinstance(frames, (tuple, list)):
                raise _bad("frames must be a list of key lists")
            if len(frames) > self.MAX_FRAMES_PER_EVENT:
                raise _bad(f"frames: {len(frames)} frames, at most {self.MAX_FRAMES_PER_EVENT}")
            for i, frame in enumerate(frames):
                _keyset(frame, f"frames[{i}]")
        else:
            raise _bad(f"mode must be 'state' or 'script', got {shown(mode)}")

    def admit(self, updates: Sequence[FrozenDict]) -> None:
        # Conservative: counts frames an in-flight tick may be about to consume.
        backlog = len(self._script) + sum(
            len(u["frames"]) for u in updates if u["mode"] == "script"
        )
        if backlog > self.max_script_frames:
            raise SessionError(
                ErrorCode.QUEUE_FULL,
                f"keys: script backlog would be {backlog} frames, at most {self.max_script_frames}",
            )

    def prepare(self, updates: Sequence[FrozenDict]) -> Prepared:
        held, script = self._held, self._script
        pressed: frozenset[str] = frozenset()
        for data in updates:
            if data["mode"] == "state":
                new_held = _keyset(data["held"], "held")
                pressed |= new_held - held
                held = new_held
            else:
                script = script + tuple(
                    _keyset(frame, f"frames[{i}]") for i, frame in enumerate(data["frames"])
                )
        n = self.frames_per_chunk
        from_script = script[:n]
        # Keys that went down in this tick's updates but are up again at its end.
        pulse = pressed - held
        held_frames = (held,) * (n - len(from_script))
        if pulse and held_frames:
            held_frames = (held | pulse,) + held_frames[1:]
        value = from_script + held_frames
        next_state: KeysState = (held, script[len(from_script) :])
        return Prepared(value=value, next_state=next_state)

    def commit(self, prepared: Prepared) -> None:
        held, script = prepared.next_state
        self._held, self._script = held, script

    def reset(self) -> None:
        self._held, self._script = frozenset(), ()


def _bad(message: str) -> SessionError:
    return SessionError(ErrorCode.BAD_REQUEST, f"keys.v1: {message}")


def _check_fields(data: Mapping[str, Any], field: str) -> None:
    if set(data) != {"mode", field}:
        extra = sorted(set(data) - {"mode", field})
        if field not in data:
            raise _bad(f"mode {shown(data['mode'])} needs {field!r}")
        raise _bad(f"unknown fields for mode {shown(data['mode'])}: {listed(extra)}")


def _keyset(keys: Any, where: str) -> frozenset[str]:
    """Lower-cased key names as a frozenset; ``where`` names the list in errors."""
    if not isinstance(keys, (tuple, list)):
        raise _bad(f"{where} must be a list of key names")
    out = set()
    for i, key in enumerate(keys):
        # ASCII only: str.lower() maps other letters onto these too (the Kelvin sign onto "k").
        name = key.lower() if type(key) is str and key.isascii() else None
        if name not in _KEY_SET:
            raise _bad(
                f"unknown key {shown(key)} at {where}[{i}]; keys are {', '.join(KEY_NAMES)}"
            )
        out.add(name)
    return frozenset(out)


def default_reducers(frames_per_chunk: int) -> dict[str, ControlReducer]:
    """Fresh reducers (one set per session) for every known track."""
    return {KeysReducer.track: KeysReducer(frames_per_chunk)}
