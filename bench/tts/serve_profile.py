"""Where a served sentence's time to first audio goes, stage by stage.

``python -m bench.tts.serve_profile --trace FILE -- SERVE ARGS`` runs ``realtime serve``
(``realtime.server.cli.main``, unchanged) with a few methods of the TTS path wrapped to stamp
``time.perf_counter()`` (CLOCK_MONOTONIC, comparable across processes on Linux), and
writes the stamps to FILE as JSON when the server exits (SIGTERM). The wrappers add
microseconds; nothing else changes. ``--load-on-main`` loads the models on the main
thread, as the server did before ``realtime.server.inventory.on_spent_thread`` (the A/B). ``stages`` lines the server's stamps up with the
client's (``input.done`` sent, first PCM frame received) for one utterance::

    client  done ─┐                                                          ┌─> first PCM
    loop          rx ─> speaker ─> audio.start sent ─> submit ┐    ┌─> result ─> PCM sent
    engine                                                    wake ─ phonemes ─ prior ─ flow ─ decode ─ end

bench/tts/bench_served.py drives it and commits the medians beside the outside figure.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from typing import Any, Sequence

clock = time.perf_counter

# Stage names in path order: (name, from-stamp, to-stamp).
STAGES: tuple[tuple[str, str, str], ...] = (
    ("client_to_reader", "client_done", "done_rx"),
    ("reader_to_speaker", "done_rx", "speak"),
    ("audio_start_send", "speak", "start_sent"),
    ("start_sent_to_submit", "start_sent", "submit"),
    ("engine_wake", "submit", "batch_start"),
    ("phonemize", "batch_start", "phonemized"),
    ("prior", "phonemized", "prior_end"),
    ("flow_prefix", "prior_end", "flow_end"),
    ("first_window_decode", "flow_end", "decode_end"),
    ("pcm_and_checks", "decode_end", "batch_end"),
    ("engine_to_loop", "batch_end", "result"),
    ("pcm_send", "result", "pcm_sent"),
    ("socket_to_client", "pcm_sent", "client_first_pcm"),
)


class Trace:
    """Stamps from the server's threads (a list append is atomic under the GIL)."""

    def __init__(self) -> None:
        self.stamps: list[tuple[str, float]] = []

    def stamp(self, name: str) -> None:
        self.stamps.append((name, clock()))


def instrument(trace: Trace) -> None:
    """Wrap the TTS path's methods (classes, before the app is built)."""
    from models.tts.base import SynthesizeSentence
    from models.tts.piper import adapter as adapter_mod
    from models.tts.piper.voice import TorchVoice
    from protocols import tts_v1 as wire
    from realtime.endpoints import tts as tts_ws
    from realtime.endpoints.connection import Connection
    from realtime.engine import Engine

    stamp = trace.stamp
    first = threading.local()  # on the engine thread: is this batch a sentence start?

    handle = tts_ws.TTSEndpoint.on_message

    async def timed_handle(self, msg):  # type: ignore[no-untyped-def]
        if isinstance(msg, wire.InputDone):
            stamp("done_rx")
        return await handle(self, msg)

    speak = tts_ws.TTSEndpoint._speak_sentence

    async def timed_speak(self, item):  # type: ignore[no-untyped-def]
        stamp("speak")
        return await speak(self, item)

    send = Connection.send

    async def timed_send(self, *frames):  # type: ignore[no-untyped-def]
        out = await send(self, *frames)
        if frames and isinstance(frames[0], str) and '"audio.start"' in frames[0][:40]:
            stamp("start_sent")
        elif frames and isinstance(frames[0], (bytes, bytearray)):
            stamp("pcm_sent")
        return out

    submit = Engine.submit

    async def timed_submit(self, model, work, **kw):  # type: ignore[no-untyped-def]
        starts = isinstance(work, SynthesizeSentence)
        if starts:
            stamp("submit")
        out = await submit(self, model, work, **kw)
        if starts:
            stamp("result")
        return out

    batch = adapter_mod.PiperTTS.synthesize_batch

    def timed_batch(self, works):  # type: ignore[no-untyped-def]
        first.on = any(isinstance(w, SynthesizeSentence) for w in works)
        if first.on:
            stamp("batch_start")
        out = batch(self, works)
        if first.on:
            stamp("batch_end")
        first.on = False
        return out

    def wrap(cls: Any, name: str, after: str) -> None:
        fn = getattr(cls, name)

        def timed(self, *a, **kw):  # type: ignore[no-untyped-def]
            out = fn(self, *a, **kw)
            if getattr(first, "on", False):
                stamp(after)
            return out

        setattr(cls, name, timed)

    wrap(adapter_mod.PiperTTS, "phonemize", "phonemized")
    wrap(TorchVoice, "prior_prefix", "prior_end")
    wrap(TorchVoice, "flow", "flow_end")
    wrap(TorchVoice, "decode", "decode_end")
    tts_ws.TTSEndpoint.on_message = timed_handle
    tts_ws.TTSEndpoint._speak_sentence = timed_speak
    Connection.send = timed_send
    Engine.submit = timed_submit
    adapter_mod.PiperTTS.synthesize_batch = timed_batch


def stages(stamps: Sequence[tuple[str, float]], client_done: float, client_first: float) -> dict[str, float] | None:
    """One utterance's stage times (ms): the first stamp of each name after
    ``client_done`` (and before ``client_first``). None if a stamp is missing."""
    seen: dict[str, float] = {"client_done": client_done, "client_first_pcm": client_first}
    for name, t in stamps:
        if client_done <= t <= client_first and name not in seen:
            seen[name] = t
    out = {}
    for stage, a, b in STAGES:
        if a not in seen or b not in seen:
            return None
        out[stage] = round((seen[b] - seen[a]) * 1e3, 3)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    load_on_main = bool(args) and args[0] == "--load-on-main"
    if load_on_main:
        args = args[1:]
    if len(args) < 2 or args[0] != "--trace":
        print("usage: python -m bench.tts.serve_profile [--load-on-main] --trace FILE -- SERVE ARGS", file=sys.stderr)
        return 2
    path, rest = args[1], args[2:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    import realtime.server.cli

    realtime.server.cli.openmp_defaults(os.environ)  # first: libgomp reads it when torch loads

    trace = Trace()
    instrument(trace)
    if load_on_main:
        # The server as it was before realtime/registry.on_spent_thread: models load on
        # the main thread, whose OpenMP team then outlives the loading (the A/B).
        from realtime.server import inventory as registry

        registry.on_spent_thread = lambda fn, *a: fn(*a)

    def dump() -> None:
        with open(path, "w") as f:
            json.dump({"stamps": trace.stamps}, f)

    atexit.register(dump)
    from realtime.server.cli import main as serve

    return serve(rest)


if __name__ == "__main__":
    raise SystemExit(main())
