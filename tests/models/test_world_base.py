"""models/world/base.py: every world's chunks are checked against their ticks, once, in the base."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import pytest

from models.base import ModelError
from models.world.base import CreateOption, WorldAdapter, WorldChunk, WorldGeometry, WorldTick, action_bits
from protocols.world_v1 import MAX_CHUNK_INFO_BYTES
from sessions import FrozenDict, TickRequest


class Painted(WorldAdapter):
    """Frames filled with the chunk index; ``fault`` breaks one postcondition."""

    name = "painted"

    def __init__(self, fault: str = "") -> None:
        self.geometry = WorldGeometry(height=4, width=6, frames_per_chunk=2, fps=10.0)
        self.fault = fault

    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        out = []
        for w in works:
            frames = np.full(self.geometry.frames_shape, w.chunk_index, np.uint8)
            chunk = WorldChunk.answering(w, frames)
            if self.fault == "session":
                chunk = WorldChunk("other", w.request_id, w.chunk_index, w.applied_event_ids, frames)
            elif self.fault == "request":
                chunk = WorldChunk(w.session_id, "other:0", w.chunk_index, w.applied_event_ids, frames)
            elif self.fault == "chunk":
                chunk = WorldChunk(w.session_id, w.request_id, w.chunk_index + 1, w.applied_event_ids, frames)
            elif self.fault == "events":
                chunk = WorldChunk(w.session_id, w.request_id, w.chunk_index, (), frames)
            elif self.fault == "shape":
                chunk = WorldChunk.answering(w, frames[:1])
            elif self.fault == "dtype":
                chunk = WorldChunk.answering(w, frames.astype(np.float32))
            elif self.fault == "encoded":
                chunk = chunk.with_frames(frames, (b"a", b"b"))
            elif self.fault == "info-nan":
                chunk = dataclasses.replace(chunk, info={"x": float("nan")})
            elif self.fault == "info-big":
                chunk = dataclasses.replace(chunk, info={"x": "a" * MAX_CHUNK_INFO_BYTES})
            elif self.fault == "info-list":
                chunk = dataclasses.replace(chunk, info=[1, 2])
            elif self.fault == "info-ok":
                chunk = dataclasses.replace(chunk, info={"x": 1.5, "goal": {"cell": [3, 4]}, "reached": False})
            out.append(chunk)
        if self.fault == "count":
            out.append(out[0])
        return out


def tick(i: int = 0) -> WorldTick:
    return WorldTick(f"s{i}", f"s{i}:0", 3, (1, 2), None, (frozenset("w"), frozenset()))


def test_good_chunks_pass_through():
    chunks = Painted().run_batch([tick(0), tick(1)])
    assert [c.session_id for c in chunks] == ["s0", "s1"]
    assert chunks[0].frames.shape == (2, 4, 6, 3) and int(chunks[0].frames.max()) == 3


@pytest.mark.parametrize("fault, text", [
    # The tick transaction's one identity check: each of the four fails the batch.
    ("session", "answered ('other', 's0:0', 3, (1, 2)) for tick ('s0', 's0:0', 3, (1, 2))"),
    ("request", "answered ('s0', 'other:0', 3, (1, 2)) for tick ('s0', 's0:0', 3, (1, 2))"),
    ("chunk", "answered ('s0', 's0:0', 4, (1, 2)) for tick ('s0', 's0:0', 3, (1, 2))"),
    ("events", "answered ('s0', 's0:0', 3, ()) for tick"),
    ("encoded", "returned encoded frames: models return frames, the server encodes"),
    ("shape", "frames must be uint8 [2, 4, 6, 3], got uint8 [1, 4, 6, 3]"),
    ("dtype", "frames must be uint8 [2, 4, 6, 3], got float32 [2, 4, 6, 3]"),
    ("count", "returned 2 chunks for 1 ticks"),
    ("info-nan", "chunk info is not JSON (Out of range float values are not JSON compliant"),
    ("info-big", f"chunk info of {MAX_CHUNK_INFO_BYTES + 8} bytes is over {MAX_CHUNK_INFO_BYTES}"),
    ("info-list", "chunk info must be a mapping, got list"),
])
def test_broken_postconditions_fail_the_batch(fault, text):
    with pytest.raises(ModelError) as info:
        Painted(fault).run_batch([tick(0)])
    assert text in str(info.value)


def test_chunk_info_that_is_a_small_json_object_passes():
    chunk, = Painted("info-ok").run_batch([tick(0)])
    assert chunk.info == {"x": 1.5, "goal": {"cell": [3, 4]}, "reached": False}


def test_tensor_frames_reach_the_host_with_every_other_field_kept():
    import torch

    class TensorFrames(Painted):
        def generate(self, works):
            return [dataclasses.replace(c, frames=torch.from_numpy(c.frames)) for c in super().generate(works)]

    chunk, = TensorFrames("info-ok").run_batch([tick(0)])
    assert isinstance(chunk.frames, np.ndarray) and int(chunk.frames.max()) == 3
    assert (chunk.session_id, chunk.request_id, chunk.chunk_index, chunk.applied_event_ids) == ("s0", "s0:0", 3, (1, 2))
    assert chunk.info == {"x": 1.5, "goal": {"cell": [3, 4]}, "reached": False}


def test_describe_declares_the_wire_geometry():
    d = Painted().describe()
    assert d == {"kind": "world", "name": "painted", "height": 4, "width": 6, "fps": 10.0, "frames_per_chunk": 2,
                 "max_batch": 1, "control_schemas": ["keys.v1"], "action_keys": list("wasdijkl"),
                 "uses_prompts": False, "takes_image": False, "create_options": []}


class Optioned(Painted):
    create_options = (CreateOption("guidance_scale", "number", 1.0, minimum=0.0, maximum=20.0),
                      CreateOption("negative_prompt", "string", "", max_length=8))


def test_check_options_fills_defaults_and_converts():
    assert Optioned().check_options({}) == {"guidance_scale": 1.0, "negative_prompt": ""}
    assert Optioned().check_options({"guidance_scale": 3, "negative_prompt": "blurry"}) == {
        "guidance_scale": 3.0, "negative_prompt": "blurry"}
    assert Optioned().describe()["create_options"][0] == {
        "name": "guidance_scale", "type": "number", "default": 1.0, "doc": "", "minimum": 0.0, "maximum": 20.0}


@pytest.mark.parametrize("options, text", [
    ({"guidance_scale": 20.5}, "option guidance_scale must be a number in [0.0, 20.0], got 20.5"),
    ({"guidance_scale": -1}, "option guidance_scale must be a number in [0.0, 20.0], got -1"),
    ({"guidance_scale": True}, "option guidance_scale must be a number"),
    ({"guidance_scale": "2"}, "option guidance_scale must be a number"),
    ({"negative_prompt": "x" * 9}, "option negative_prompt must be a string of at most 8 characters"),
    ({"steps": 3}, "world painted does not take option(s) steps (it takes: guidance_scale, negative_prompt)"),
])
def test_check_options_refuses_unknown_and_out_of_range(options, text):
    with pytest.raises(ValueError) as info:
        Optioned().check_options(options)
    assert text in str(info.value)


def test_a_model_without_options_refuses_any():
    with pytest.raises(ValueError, match=r"takes: none"):
        Painted().check_options({"guidance_scale": 1.0})


def _png(w: int, h: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (9, 8, 7)).save(buf, "PNG")
    return buf.getvalue()


def test_first_image_is_refused_by_a_model_that_takes_none_and_decoded_by_one_that_does():
    with pytest.raises(ValueError, match="world painted takes no first image"):
        Painted().first_image(_png(8, 8), "png")

    class Imaged(Painted):
        takes_image = True

    frame = Imaged().first_image(_png(30, 10), "png")
    assert frame.shape == (4, 6, 3) and frame.dtype == np.uint8 and (frame == [9, 8, 7]).all()
    with pytest.raises(ValueError, match="not a valid jpeg"):
        Imaged().first_image(_png(8, 8), "jpeg")


def test_tick_from_a_snapshot_and_action_bits():
    model = Painted()
    reducers = model.reducers()
    assert set(reducers) == {"keys"}
    request = TickRequest("s", "s:4", 2, (5,), "p", FrozenDict({"keys": (frozenset("wj"), frozenset())}))
    assert model.tick(request, seed=9) == WorldTick("s", "s:4", 2, (5,), "p", (frozenset("wj"), frozenset()), 9)
    assert action_bits(frozenset("wl")) == [1.0, 0, 0, 0, 0, 0, 0, 1.0]
