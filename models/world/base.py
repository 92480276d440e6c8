"""The world seam: what the engine hands a world model and what it must give back.

A world adapter is a ``ModelAdapter`` of kind "world" that declares what the wire
needs and implements one method:

* ``geometry``: frame height and width, frames per chunk, fps (sent in
  ``session.created`` and checked on every chunk);
* ``control_schemas``: the control schemas its ticks understand (``keys.v1``);
* ``uses_prompts``: whether a prompt changes what it draws (``/v1/models`` and the
  page say so);
* ``takes_image``: whether a session may start from a first image (world.v1's
  ``session.create`` ``image``); ``first_image`` decodes one to the geometry;
* ``generate(works)``: one forward for ticks of distinct sessions, one
  ``WorldChunk`` each, in order;
* ``create_options`` (optional): the ``session.create`` ``options`` it accepts,
  each a ``CreateOption`` with its type and range (listed in ``/v1/models``);
  ``check_options`` validates a request against them generically, so the
  endpoint answers ``bad_request`` for an unknown or out-of-range option without
  knowing any model;
* ``admit(session_id, options)`` (optional, engine thread, at create): take the
  session in, or return why it cannot fit (the endpoint answers ``busy`` with
  that message and creates nothing).

``run_batch`` (called by the engine thread) wraps ``generate`` and enforces the
tick postconditions for every world model: each chunk echoes its tick's
``session_id``, ``request_id``, ``chunk_index`` and ``applied_event_ids``, and its
frames are uint8 ``[frames_per_chunk, height, width, 3]``. A chunk that breaks them
fails its batch with a ``ModelError`` before anything commits. This is the tick
transaction's one identity check: the engine keeps the model's state for the tick
(``end_tick``) only after it, and the session commits from the same checked chunk
(``Session.complete_tick(chunk.request_id)``) without comparing again, so the two
commits cannot disagree about which tick they keep. The tick's identities come from
the session's snapshot through ``tick`` (below); a model that overrides ``tick``
builds on ``super().tick``.

Models return frames; the server encodes them (realtime/media.py). A chunk's frames
leave ``run_batch`` as numpy, copied from the device in one go for the batch. The one
encoding that happens here is the server's own: for the ``jpeg`` ticks whose frames are
on CUDA, ``run_batch`` hands them to ``device_jpeg`` (the app sets it; media.py says
why it runs on the engine thread, before the host copy) and puts what it returns in
``WorldChunk.encoded``.

Frames as they exist: a tick may carry a ``frame_sink`` (the endpoint sets one for a
session created with ``stream_frames``). A model with ``streams_frames = True``
calls ``work.frame_sink(first, frames)`` on the engine thread as soon as frames of
the chunk exist (uint8 ``[n, height, width, 3]``, in order, from index 0);
``run_batch`` hands a non-streaming model's frames to the sink when its batch ends,
and checks that what a model streamed is exactly its chunk's frames (a
``ModelError`` otherwise). Streamed frames are provisional: the tick commits only
after ``run_batch`` returns, so a failed tick sends an error after them instead of
the commit.

A chunk may carry ``info`` (world.v1 ``chunk.info``): a small JSON object of facts about
it for the client (a simulator's pose and goal); ``run_batch`` checks it
(``protocols.world_v1.info_problem``) with the other postconditions.

Seeds and replay: a session's ``seed`` (``WorldTick.seed``, on every tick) is the only
randomness its frames may have. Every noise value of a frame is a function of the seed and
the frame's position in the session (frame, block, denoising step), drawn for a batch at
once with each row from its own (seed, counter) (``models/world/noise.py``), never from a
generator shared by sessions. So the same seed, prompt, first image, options and controls
give the same frames on a new session, after a reset, and after an eviction and reset,
whatever other sessions share the batches. How exact: on CPU bit for bit (the same build
and number format on the same CPU): a row's products run on row-count-stable kernels and
it attends its own keys unpadded (``models/world/rows.py``). On CUDA the noise is still bit
for bit and a replay in batches of the same size is bit for bit, but the batch size may
pick other kernels, so a frame made in a batch of another size can differ by rounding,
which an autoregressive model carries into later frames. For the maze (bf16, graphs) the
one such kernel is the paged attention's split count (``kv.triton_paged.choose_splits``,
chosen per batch size for speed): at most 2 of 255 in a session's first generated frame,
up to 45 in single values of later frames, about 0.5 on average
(``tests/models/world_maze/test_maze_replay_cuda.py``; H100).

``tick(request, seed)`` turns a session's snapshot into the ``WorldTick`` the
model sees, and ``reducers()`` gives a new session the control reducers the
model's schemas need: the endpoint never reads controls itself. A model with
controls of its own overrides both (its ``tick`` may return a subclass of
``WorldTick`` carrying them). The endpoint adds the session's first image, if
any, to every chunk-0 tick (``WorldTick.image``): a reset starts from it again.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from models.base import ModelAdapter, ModelError
from protocols.world_v1 import KEY_NAMES, info_problem
from sessions import TickRequest, default_reducers
from sessions.reducers import ControlReducer

if TYPE_CHECKING:  # kv imports torch; this seam does not need it at run time
    from kv.residency import Residency

# The control schema every world here takes: held keys per frame (sessions/reducers.py).
KEYS_SCHEMA = "keys.v1"

# Called with (index of the first frame, uint8 frames [n, H, W, 3]) as a chunk's frames exist.
FrameSink = Callable[[int, np.ndarray], None]


class DeviceJpeg(Protocol):
    """The server's JPEG encoder for frames on the device (``realtime.media.DeviceJpeg``)."""

    def encode(self, frames: Sequence[Any]) -> list[bytes] | None:
        """JPEG bytes of each CUDA uint8 ``[H, W, 3]`` frame, or None: the server encodes their
        host copies instead. Engine thread only."""


def action_bits(keys: frozenset[str]) -> list[float]:
    """The held keys of one frame as 8 floats in ``KEY_NAMES`` order (w a s d i j k l)."""
    return [1.0 if k in keys else 0.0 for k in KEY_NAMES]


@dataclass(frozen=True)
class CreateOption:
    """One ``session.create`` option a world model accepts: a number in a range, or a bounded string."""

    name: str
    type: str  # "number" or "string"
    default: float | str
    minimum: float | None = None  # numbers
    maximum: float | None = None  # numbers
    max_length: int = 1024        # strings, in characters
    doc: str = ""

    def check(self, value: Any) -> float | str:
        """``value`` as this option's type, or ``ValueError`` saying what is allowed."""
        if self.type == "number":
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            if not ok or (self.minimum is not None and value < self.minimum) or (
                    self.maximum is not None and value > self.maximum):
                raise ValueError(f"option {self.name} must be a number in [{self.minimum}, {self.maximum}], "
                                 f"got {value!r}")
            return float(value)
        if not isinstance(value, str) or len(value) > self.max_length:
            raise ValueError(f"option {self.name} must be a string of at most {self.max_length} characters")
        return value

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "default": self.default, "doc": self.doc}
        if self.type == "number":
            out.update(minimum=self.minimum, maximum=self.maximum)
        else:
            out["max_length"] = self.max_length
        return out


@dataclass(frozen=True)
class WorldGeometry:
    """What a world model's chunks look like on the wire."""

    height: int
    width: int
    frames_per_chunk: int
    fps: float

    @property
    def frames_shape(self) -> tuple[int, int, int, int]:
        return (self.frames_per_chunk, self.height, self.width, 3)


@dataclass(frozen=True)
class WorldTick:
    """One session's tick as the model sees it."""

    session_id: str
    request_id: str
    chunk_index: int
    applied_event_ids: tuple[int, ...]
    prompt: str | None
    # One entry per generated frame: the keys held during that frame.
    actions: tuple[frozenset[str], ...]
    seed: int = 0
    # The session's checked create options (``check_options``), on every tick like the seed.
    options: Mapping[str, Any] = field(default_factory=dict)
    # The session's first image (uint8 [height, width, 3]) on chunk-0 ticks, else None.
    image: np.ndarray | None = field(default=None, repr=False, compare=False)
    # The wire format the session asked for (world.v1 ``format``): run_batch has the server's
    # ``device_jpeg`` encode ``jpeg`` frames that the model made on CUDA, in one batch.
    format: str = "rgb8"
    # Where the chunk's frames go as they exist (engine thread), or None: all at the end.
    frame_sink: FrameSink | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class WorldChunk:
    """What the model returns for one tick: the echoed identities and the frames."""

    session_id: str
    request_id: str
    chunk_index: int
    applied_event_ids: tuple[int, ...]
    # [F, H, W, 3] uint8. ``generate`` may return a torch tensor (e.g. on CUDA);
    # ``run_batch`` hands every chunk on as numpy.
    frames: np.ndarray = field(repr=False)
    # Set by ``run_batch`` only, never by a model: the frames in the tick's ``format`` as the
    # server's ``device_jpeg`` made them (one payload per frame), or None: the server
    # encodes the host frames (realtime/media.py).
    encoded: tuple[bytes, ...] | None = field(default=None, repr=False, compare=False)
    # Facts about the chunk for the client (world.v1 ``chunk.info``), or None: a small JSON
    # object (``protocols.world_v1.info_problem``), e.g. a simulator's pose and goal.
    info: Mapping[str, Any] | None = None

    @classmethod
    def answering(cls, tick: WorldTick, frames: Any) -> "WorldChunk":
        """The chunk that answers ``tick`` with ``frames``."""
        return cls(tick.session_id, tick.request_id, tick.chunk_index, tick.applied_event_ids, frames)

    def with_frames(self, frames: Any, encoded: tuple[bytes, ...] | None) -> "WorldChunk":
        """This chunk with other ``frames`` and ``encoded``, every other field kept. Built
        directly for a plain chunk (``dataclasses.replace`` costs ~10x more, and the host copy
        runs once per chunk of every batch); subclasses go through ``replace``."""
        if type(self) is not WorldChunk:
            return dataclasses.replace(self, frames=frames, encoded=encoded)
        return WorldChunk(self.session_id, self.request_id, self.chunk_index, self.applied_event_ids, frames,
                          encoded, self.info)


class WorldAdapter(ModelAdapter[WorldTick, WorldChunk]):
    """Base of every world model the engine runs."""

    kind = "world"
    chained_ticks = True  # each chunk is generated from the KV the last one committed
    geometry: WorldGeometry
    control_schemas: tuple[str, ...] = (KEYS_SCHEMA,)
    uses_prompts: bool = False
    create_options: tuple[CreateOption, ...] = ()
    # Whether ``generate`` feeds each tick's ``frame_sink`` as frames are decoded.
    streams_frames: bool = False

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Every declared option, from ``options`` or its default; ``ValueError`` for an
        option this model does not take or a value out of its range."""
        declared = {o.name: o for o in self.create_options}
        unknown = sorted(set(options) - set(declared))
        if unknown:
            takes = ", ".join(declared) if declared else "none"
            raise ValueError(f"world {self.name} does not take option(s) {', '.join(unknown)} (it takes: {takes})")
        return {name: o.check(options[name]) if name in options else o.default for name, o in declared.items()}

    def admit(self, session_id: str, options: Mapping[str, Any]) -> str | None:
        """Take a new session with its checked ``options`` (engine thread, at create).

        Returns None when admitted, or why it cannot fit now (what it needs and what
        is free): the endpoint answers ``busy`` and creates nothing. The default
        admits everyone. An admitted session is dropped as usual (``drop_session``).
        """
        return None

    takes_image: bool = False
    # A world whose KV lives in kv/'s paged cache sets this; ``kv_usage`` (and so
    # ``/metrics``) reads its block and residency counters.
    residency: "Residency | None" = None

    @abc.abstractmethod
    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        """One forward for ``works`` (distinct sessions): one chunk each, in order."""

    def details(self) -> Mapping[str, Any]:
        """Model-specific facts added to ``describe()`` (default: none)."""
        return {}

    def describe(self) -> Mapping[str, Any]:
        g = self.geometry
        return {"kind": self.kind, "name": self.name, "height": g.height, "width": g.width, "fps": g.fps,
                "frames_per_chunk": g.frames_per_chunk, "max_batch": self.max_batch,
                "control_schemas": list(self.control_schemas), "action_keys": list(KEY_NAMES),
                "uses_prompts": self.uses_prompts, "takes_image": self.takes_image,
                "create_options": [o.describe() for o in self.create_options], **self.details()}

    def first_image(self, data: bytes, fmt: str) -> np.ndarray:
        """A client's first image -> uint8 ``[height, width, 3]`` (resized, centre-cropped).

        Raises ``ValueError`` saying why it is refused: a model that takes no image,
        a bad or oversized image, a decompression bomb. Called off the engine thread.
        """
        if not self.takes_image:
            raise ValueError(f"world {self.name} takes no first image")
        from models.world.image import decode_image

        return decode_image(data, fmt, self.geometry.height, self.geometry.width)

    def kv_usage(self) -> Mapping[str, float] | None:
        """The paged KV's counters (``kv.Residency.metrics``), or None for a world
        without a paged cache. Read from the event loop while the engine thread
        writes: each value is one int or float, read whole."""
        return None if self.residency is None else self.residency.metrics()

    def reducers(self) -> dict[str, ControlReducer]:
        """Fresh control reducers for a new session of this model."""
        return default_reducers(self.geometry.frames_per_chunk)

    def tick(self, request: TickRequest, seed: int, options: Mapping[str, Any] | None = None, *,
             format: str = "rgb8") -> WorldTick:
        """The tick the model sees for a session's snapshot ``request`` (``options``: checked
        ones; ``format``: the session's wire format, ``WorldTick.format``)."""
        return WorldTick(
            session_id=request.session_id,
            request_id=request.request_id,
            chunk_index=request.chunk_index,
            applied_event_ids=request.applied_event_ids,
            prompt=request.prompt,
            actions=tuple(frozenset(keys) for keys in request.controls["keys"]),
            seed=seed,
            options=dict(options or {}),
            format=format,
        )

    # The server's encoder for ``jpeg`` ticks' CUDA frames (realtime/media.py), set by the
    # app; None: they are copied to the host and encoded there like any others.
    device_jpeg: DeviceJpeg | None = None

    def run_batch(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        streams = [None if w.frame_sink is None else _Streamed(w.frame_sink, self.geometry) for w in works]
        if self.streams_frames and any(streams):
            works = [w if s is None else dataclasses.replace(w, frame_sink=s) for w, s in zip(works, streams)]
        chunks = self.generate(works)
        if any(getattr(getattr(c, "frames", None), "is_cuda", False) for c in chunks):
            self.launched()  # CUDA frames are still being made: the server may send meanwhile
        if len(chunks) != len(works):
            raise ModelError(f"world {self.name} returned {len(chunks)} chunks for {len(works)} ticks")
        if any(getattr(c, "encoded", None) is not None for c in chunks):
            raise ModelError(f"world {self.name} returned encoded frames: models return frames, the server encodes")
        chunks = self._to_host(works, list(chunks))
        for work, chunk in zip(works, chunks):
            check_chunk(work, chunk, self.geometry, self.name)
        for chunk, streamed in zip(chunks, streams):
            if streamed is None:
                continue
            if self.streams_frames:
                streamed.check(chunk.frames, self.name)
            else:  # checked above: all of its frames at once
                streamed(0, chunk.frames)
        return list(chunks)

    def _to_host(self, works: Sequence[WorldTick], chunks: list[WorldChunk]) -> list[WorldChunk]:
        """Chunks whose frames are torch tensors -> numpy, in one device-to-host copy; the
        ``jpeg`` ones on CUDA first through ``device_jpeg``, all in one call. A tick with a
        frame sink is left out: its frames go out as they exist, encoded by the server."""
        on_device = [i for i, c in enumerate(chunks) if isinstance(c, WorldChunk)
                     and not isinstance(c.frames, np.ndarray) and hasattr(c.frames, "is_cuda")]
        if not on_device:
            return chunks
        import torch

        shape = self.geometry.frames_shape
        for i in on_device:
            f = chunks[i].frames
            if f.dtype != torch.uint8 or tuple(f.shape) != shape:
                raise ModelError(f"world {self.name}: frames must be uint8 {list(shape)}, got {f.dtype} {list(f.shape)}")
        jpeg = [i for i in on_device if works[i].format == "jpeg" and works[i].frame_sink is None
                and chunks[i].frames.is_cuda]
        encoded: dict[int, tuple[bytes, ...]] = {}
        if jpeg and self.device_jpeg is not None:
            payloads = self.device_jpeg.encode([f for i in jpeg for f in chunks[i].frames])
            if payloads is not None:
                per = shape[0]
                encoded = {i: tuple(payloads[k * per:(k + 1) * per]) for k, i in enumerate(jpeg)}
        host = torch.stack([chunks[i].frames for i in on_device]).cpu().numpy()
        out = list(chunks)
        for k, i in enumerate(on_device):
            out[i] = chunks[i].with_frames(host[k], encoded.get(i))
        return out


class _Streamed:
    """A tick's frame sink that keeps what went through it, for the end-of-batch check."""

    def __init__(self, sink: FrameSink, geometry: WorldGeometry) -> None:
        self.sink, self.geometry = sink, geometry
        self.parts: list[np.ndarray] = []
        self.count = 0
        self.error: str | None = None

    def __call__(self, first: int, frames: np.ndarray) -> None:
        g = self.geometry
        if first != self.count or not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 \
                or frames.ndim != 4 or frames.shape[1:] != g.frames_shape[1:] \
                or self.count + len(frames) > g.frames_per_chunk:
            # Nothing malformed reaches the wire; the batch fails at its end.
            self.error = self.error or (f"streamed frames {first}.. {getattr(frames, 'dtype', None)} "
                                        f"{list(getattr(frames, 'shape', ()))} after {self.count} frames")
            return
        self.parts.append(frames)
        self.count += len(frames)
        self.sink(first, frames)

    def check(self, frames: np.ndarray, name: str) -> None:
        if self.error is None and (self.count != len(frames)
                                   or not np.array_equal(np.concatenate(self.parts), frames)):
            self.error = f"streamed {self.count} frames that are not the chunk's {len(frames)}"
        if self.error is not None:
            raise ModelError(f"world {name}: {self.error}")


def check_chunk(work: WorldTick, chunk: Any, geometry: WorldGeometry, name: str) -> None:
    """``chunk`` answers ``work`` with frames of ``geometry``, or a ``ModelError``."""
    if not isinstance(chunk, WorldChunk):
        raise ModelError(f"world {name} returned {type(chunk).__name__}, not a WorldChunk")
    echoed = (chunk.session_id, chunk.request_id, chunk.chunk_index, tuple(chunk.applied_event_ids))
    expected = (work.session_id, work.request_id, work.chunk_index, work.applied_event_ids)
    if echoed != expected:
        raise ModelError(f"world {name} answered {echoed} for tick {expected}")
    frames = chunk.frames
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.shape != geometry.frames_shape:
        raise ModelError(f"world {name}: frames must be uint8 {list(geometry.frames_shape)}, got "
                         f"{getattr(frames, 'dtype', None)} {list(getattr(frames, 'shape', ()))}")
    if chunk.info is not None and (problem := info_problem(chunk.info)) is not None:
        raise ModelError(f"world {name}: {problem}")
