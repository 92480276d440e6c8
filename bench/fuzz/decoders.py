"""One fuzz case through each protocol's decoder, as its endpoint runs it.

Each ``decode_*`` returns an outcome label (``ok:<type>``, ``error:<code>``,
``close:<code>``) or raises ``Crash`` for anything outside the protocol's contract:
an exception that is not its documented error, an error code that is not
documented, or an answer the endpoint could not even put on the wire.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.fuzz.cases import Frame
from protocols import openpi, tts_v1, world_v1
from sessions import Session, SessionError, SessionEvent, default_reducers

VOICES = ("en_US-joe-medium",)


class Crash(AssertionError):
    """A case the decoder did not answer with a documented error."""


def decode_world(frame: Frame) -> str:
    if not frame.is_text:
        return f"close:{world_v1.CLOSE_UNSUPPORTED_DATA}"  # the endpoint's rule, before any parsing
    try:
        msg = world_v1.parse_client(frame.data, default_model="tiny")
        if isinstance(msg, world_v1.Event):
            event = SessionEvent.from_wire(msg)
            Session("fuzz", reducers=default_reducers(1)).accept_event(event)  # the track checks
        return f"ok:{msg.type}"
    except world_v1.ProtocolError as exc:
        code, message = exc.code, exc.message
    except SessionError as exc:
        code, message = exc.code.value, exc.message
    except Exception as exc:  # noqa: BLE001 - exactly what this harness looks for
        raise Crash(f"world.v1 decoder raised {type(exc).__name__}: {exc}") from exc
    if code not in world_v1.ERROR_CODES:
        raise Crash(f"undocumented world.v1 error code {code!r}")
    world_v1.encode(world_v1.error(code, message)).encode("utf-8")
    if code == world_v1.MESSAGE_TOO_LARGE:
        return f"close:{world_v1.CLOSE_TOO_BIG}"
    return f"error:{code}"


def decode_tts(frame: Frame) -> str:
    try:
        msg = tts_v1.parse_client(frame.data, VOICES)
    except tts_v1.ProtocolError as exc:
        if exc.code not in tts_v1.ERROR_CODES:
            raise Crash(f"undocumented tts.v1 error code {exc.code!r}") from exc
        _wire_safe(tts_v1.error(exc.code, exc.message))
        return f"error:{exc.code}"
    except Exception as exc:  # noqa: BLE001
        raise Crash(f"tts.v1 decoder raised {type(exc).__name__}: {exc}") from exc
    if isinstance(msg, tts_v1.InputText):
        # The endpoint echoes the text in audio.start: it must survive UTF-8.
        _wire_safe(tts_v1.encode(tts_v1.AudioStart(0, 0, msg.text, tts_v1.DEFAULT_SAMPLE_RATE)))
    if isinstance(msg, tts_v1.SessionUpdate):
        config = tts_v1.SessionConfig(voice=VOICES[0]).apply(msg)
        if not (tts_v1.MIN_SPEED <= config.speed <= tts_v1.MAX_SPEED and type(config.speed) is float):
            raise Crash(f"speed {config.speed!r} got through")
        _wire_safe(tts_v1.encode(config.updated(VOICES)))
    return f"ok:{msg.type}"


def decode_openpi(frame: Frame, metadata: openpi.PolicyMetadata) -> str:
    try:
        req = openpi.parse_client(frame.data, metadata)
    except openpi.ProtocolError as exc:
        _wire_safe(f"invalid request: {exc}")
        return f"close:{openpi.CLOSE_ERROR}"
    except Exception as exc:  # noqa: BLE001
        raise Crash(f"OpenPI decoder raised {type(exc).__name__}: {exc}") from exc
    items = req.items if isinstance(req, openpi.BatchRequest) else (req,)
    for item in items:
        if isinstance(item, openpi.InferRequest):
            _check_observation(item.observation, metadata)
    return f"ok:{type(req).__name__}"


def _check_observation(obs: openpi.Observation, metadata: openpi.PolicyMetadata) -> None:
    h, w = metadata.image_resolution
    for key in metadata.image_keys:
        img = obs.images[key]
        if img.dtype != np.uint8 or img.shape != (h, w, 3) or img.flags.writeable:
            raise Crash(f"camera {key!r} got through as {img.dtype} {img.shape}")
    if obs.state.dtype != np.float32 or obs.state.shape != (metadata.state_dim,) or not np.isfinite(obs.state).all():
        raise Crash(f"state got through as {obs.state.dtype} {obs.state.shape}")


def _wire_safe(text: str) -> Any:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Crash(f"an answer that cannot be sent as UTF-8: {text[:80]!r}") from exc
