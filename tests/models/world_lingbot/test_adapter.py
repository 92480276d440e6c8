"""The LingBot world adapter built by its factory from a tiny checkpoint in the real layout."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from models.base import ModelError
from models.world.base import WorldTick
from models.world.lingbot import build
from models.world.lingbot.adapter import latent_keys

OPTIONS = dict(device="cpu", max_batch=2, frames_per_chunk=None, steps=None, gpu_memory_fraction=0.5,
               height=16, width=16)


@pytest.fixture(scope="module")
def world(tiny_checkpoint):
    return build(str(tiny_checkpoint), SimpleNamespace(**OPTIONS)), tiny_checkpoint


def _tick(sid, chunk, keys=("w",), prompt=None, seed=3):
    return WorldTick(session_id=sid, request_id=f"{sid}-{chunk}", chunk_index=chunk,
                     applied_event_ids=(chunk,), prompt=prompt, actions=(frozenset(keys),) * 12, seed=seed)


def test_describe_and_geometry(world):
    w, root = world
    d = w.describe()
    assert d["checkpoint"] == str(root) and d["frames_per_chunk"] == 12 and (d["height"], d["width"]) == (16, 16)
    assert d["dtype"] == "float32" and d["device"] == "cpu" and d["denoising_steps"] == 4
    assert (d["sink_frames"], d["rolling_frames"], d["tokens_per_latent_frame"]) == (3, 6, 1)
    assert d["uses_prompts"] is True and d["takes_image"] is True
    assert d["control_schemas"] == ["keys.v1", "lingbot.camera_actions.v1", "lingbot.camera_trajectory.v1"]
    assert set(w.reducers()) == {"keys", "camera_actions", "camera_trajectory"}


def test_ticks_commit_abort_and_release(world):
    w, _ = world
    [c0] = w.run_batch([_tick("s", 0, prompt="a cave")])
    assert c0.frames.shape == (12, 16, 16, 3) and c0.frames.dtype == np.uint8
    assert c0.chunk_index == 0 and c0.applied_event_ids == (0,) and c0.request_id == "s-0"
    np.testing.assert_array_equal(c0.frames[0], c0.frames[3])          # first frame held
    w.end_tick("s", committed=True)
    [c1] = w.run_batch([_tick("s", 1)])
    w.end_tick("s", committed=True)
    assert w.pipeline.cache.committed_frames("s") == 6
    state = w.pipeline.residency.state("s")
    assert state.nbytes == w.pipeline.geometry.model_state_bytes > 0 and state.latent_frames == 6
    [c2] = w.run_batch([_tick("s", 2)])
    w.end_tick("s", committed=False)          # dropped after decoding: the world is closed
    assert "s" not in w.pipeline.sessions and "s" not in w.pipeline.cache and state.freed
    with pytest.raises(ModelError, match="start at chunk 0"):
        w.run_batch([_tick("s", 3)])
    w.run_batch([_tick("s", 0)])
    w.end_tick("s", committed=True)
    w.drop_session("s")
    w.drop_session("s")
    assert "s" not in w.pipeline.sessions
    with pytest.raises(ModelError, match="start at chunk 0"):
        w.run_batch([_tick("s", 2)])


def test_bad_ticks_are_model_errors(world):
    w, _ = world
    bad = WorldTick(session_id="x", request_id="r", chunk_index=0, applied_event_ids=(), prompt="p",
                    actions=(frozenset(),) * 3)
    with pytest.raises(ModelError, match="3 key sets for 12 frames"):
        w.run_batch([bad])


def test_block_controls_turn_tick_values_into_a_block_request():
    from models.world.lingbot.controls import CameraTrajectoryReducer
    from sessions.frozen import deep_freeze
    from models.world.lingbot.adapter import block_controls
    r = CameraTrajectoryReducer(3)
    poses = [np.eye(4).tolist()] * 3
    u = deep_freeze({"mode": "inline", "poses": poses, "intrinsics": [[500, 500, 416, 240]] * 3}, "d")
    r.validate(u)
    keys, traj = block_controls((frozenset("w"),) * 3, r.prepare([u]).value)
    assert keys == [frozenset("w")] * 3 and traj[0].shape == (3, 4, 4) and traj[1].shape == (3, 4)
    assert traj[2] is True and block_controls(None, None) == ([], None)


def test_latent_keys_are_the_union_of_four_frames():
    acts = [frozenset()] * 12
    acts = list(acts)
    acts[5] = frozenset("w")
    assert latent_keys(acts, 3) == [frozenset(), frozenset("w"), frozenset()]


@pytest.mark.parametrize("change,match", [({"steps": 8}, "takes its denoising steps from its entry"),
                                          ({"frames_per_chunk": 4}, "12 frames per chunk")])
def test_factory_refuses_options_the_model_cannot_honour(world, change, match):
    _, root = world
    with pytest.raises(ValueError, match=match):
        build(str(root), SimpleNamespace(**{**OPTIONS, **change}))


def test_factory_needs_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="needs a checkpoint folder"):
        build(None, SimpleNamespace(**OPTIONS))
    from models.world.lingbot.weights import CheckpointError
    with pytest.raises(CheckpointError, match="not a folder"):
        build(str(tmp_path / "nope"), SimpleNamespace(**OPTIONS))


def test_device_frames_come_out_as_the_host_frames(tiny_checkpoint):
    # On CUDA the pipeline keeps frames on the device (the base copies a batch at once and may
    # encode jpeg there); the same path with CPU tensors gives the numpy path's frames exactly.
    host, dev = (build(str(tiny_checkpoint), SimpleNamespace(**OPTIONS)) for _ in range(2))
    dev.pipeline.device_frames = True
    chunks = []
    for w in (host, dev):
        first = w.run_batch([_tick("s", 0, prompt="a cave")])[0]
        w.end_tick("s", committed=True)
        second = w.run_batch([_tick("s", 1, keys=("d",))])[0]
        w.end_tick("s", committed=True)
        chunks.append((first, second))
    for a, b in zip(*chunks):
        assert isinstance(b.frames, np.ndarray) and b.frames.shape == (12, 16, 16, 3)
        np.testing.assert_array_equal(a.frames, b.frames)
