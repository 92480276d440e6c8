"""LingBot-World through a real uvicorn server and real WebSocket clients (world.v1).

One server per module: a tiny random checkpoint in the real diffusers layout,
loaded by the factory table's ``lingbot`` row at 16x16 on CPU, beside the tiny
world (a model that takes no image), and a trusted trajectory root.
"""

from __future__ import annotations

import json
from typing import Iterator

import httpx
import numpy as np
import pytest
import websockets

from clients.world import ServerError, WorldClient
from models import factory
from models.factory import BuildOptions, ModelEntry
from models.world.tiny import TinyWorld
from tests.support.served_world import png, run, serving, url

SIZE = 16
ACTIONS = {"track": "camera_actions", "schema": "lingbot.camera_actions.v1"}
TRAJECTORY = {"track": "camera_trajectory", "schema": "lingbot.camera_trajectory.v1"}
KEYS = {"track": "keys", "schema": "keys.v1"}
INTRINSICS = [500.0, 500.0, 416.0, 240.0]


def _slide(frames: int, step: float) -> tuple[np.ndarray, np.ndarray]:
    poses = np.repeat(np.eye(4)[None], frames, 0)
    poses[:, 0, 3] = step * np.arange(frames)     # slide along +x
    return poses, np.tile(INTRINSICS, (frames, 1))


def _flat(poses: np.ndarray) -> np.ndarray:
    """``poses`` with a singular first pose (its rotation part all zeros)."""
    out = poses.copy()
    out[0, :3, :3] = 0.0
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, object]]:
    from models.world.lingbot.tiny_checkpoint import write_tiny_checkpoint

    base = tmp_path_factory.mktemp("lingbot_e2e")
    ckpt = write_tiny_checkpoint(base / "ckpt")
    root = base / "trajectories"
    (root / "slide").mkdir(parents=True)
    poses, intr = _slide(5, 0.3)
    np.save(root / "slide" / "poses.npy", poses)
    np.save(root / "slide" / "intrinsics.npy", intr)
    (root / "flat").mkdir()
    np.save(root / "flat" / "poses.npy", _flat(poses))
    np.save(root / "flat" / "intrinsics.npy", intr)
    options = BuildOptions(device="cpu", max_batch=2, height=SIZE, width=SIZE, trajectory_root=str(root))
    lingbot = factory.build(ModelEntry("lingbot", str(ckpt)), options, kind="world")
    with serving(lingbot, TinyWorld()) as addr:
        yield addr, lingbot, str(ckpt)


def test_models_lists_lingbot_with_its_checkpoint_geometry_and_controls(server):
    addr, _, ckpt = server
    models = {m["id"]: m for m in httpx.get(f"http://{addr}/v1/models").json()["data"]}
    lb = models["lingbot"]
    assert (lb["kind"], lb["checkpoint"], lb["height"], lb["width"]) == ("world", ckpt, SIZE, SIZE)
    assert (lb["frames_per_chunk"], lb["fps"], lb["dtype"], lb["device"]) == (12, 16.0, "float32", "cpu")
    assert lb["control_schemas"] == ["keys.v1", "lingbot.camera_actions.v1", "lingbot.camera_trajectory.v1"]
    assert lb["uses_prompts"] is True and lb["takes_image"] is True and lb["named_trajectories"] is True
    assert models["tiny"]["takes_image"] is False


def test_bad_images_answer_bad_request_and_create_nothing(server):
    addr, lingbot, _ = server

    async def main():
        async with websockets.connect(url(addr)) as ws:
            async def create(sid, model, spec, payload):
                await ws.send(json.dumps({"type": "session.create", "session_id": sid, "model": model,
                                          "image": spec}))
                if payload is not None:
                    await ws.send(payload)
                return json.loads(await ws.recv())

            garbage = b"\x89PNG not really"
            answers = [
                await create("a", "lingbot", {"format": "png", "bytes": len(garbage)}, garbage),
                await create("a", "lingbot", {"format": "jpeg", "bytes": len(png(8, 8))}, png(8, 8)),
                await create("a", "lingbot", {"format": "png", "bytes": 100}, b"x" * 50),
                await create("a", "lingbot", {"format": "gif", "bytes": 10}, None),
                await create("a", "lingbot", {"format": "png", "bytes": (8 << 20) + 1}, None),
                await create("a", "tiny", {"format": "png", "bytes": len(png(8, 8))}, png(8, 8)),
            ]
            assert [a["code"] for a in answers] == ["bad_request"] * 6
            messages = [a["message"] for a in answers]
            assert "not a valid png" in messages[0] and "not a valid jpeg" in messages[1]
            assert "50 bytes, announced 100" in messages[2] and "png, jpeg" in messages[3]
            assert "[1, 8388608]" in messages[4] and "'tiny' takes no first image" in messages[5]
            assert "a" not in lingbot.pipeline.sessions
            # Nothing was created: the same id is free, on the same connection.
            await ws.send(json.dumps({"type": "session.create", "session_id": "a", "model": "tiny",
                                      "credits": 0}))
            assert json.loads(await ws.recv())["type"] == "session.created"

    run(main())


def test_prompt_image_keys_trajectories_reset_and_close(server):
    addr, lingbot, _ = server
    image = png(40, 24)

    async def main():
        async with WorldClient.connect(url(addr), session_id="lb") as c:
            created = await c.create(model="lingbot", prompt="a stone cave", image=image, format="rgb8",
                                     credits=0, seed=5)
            assert (created["height"], created["width"], created["frames_per_chunk"]) == (SIZE, SIZE, 12)
            await c.event(event_id=1, controls=[{**KEYS, "data": {"mode": "state", "held": ["w"]}}])
            await c.credit(1)
            first = await c.next_chunk(credit=False)
            state = lingbot.pipeline.sessions["lb"]
            assert bool((state.condition[:4, 0] == 1).all()) and bool((state.condition[:4, 1:] == 0).all())
            moved_w = state.camera.pose.clone()
            assert moved_w[2, 3] > 0 and abs(float(moved_w[0, 3])) < 1e-9     # W: along +z only

            # A bad control, a bad trajectory name, a missing one: documented errors, nothing changes.
            bad = [({**ACTIONS, "data": {"mode": "hold", "held": ["w"]}}, "mode must be"),
                   ({**TRAJECTORY, "data": {"mode": "named", "name": "../slide"}}, "'..' component"),
                   ({**TRAJECTORY, "data": {"mode": "named", "name": "nope"}}, "does not exist"),
                   ({**ACTIONS, "data": {"mode": "state", "held": ["q"]}}, "unknown key 'q'")]
            for i, (control, text) in enumerate(bad):
                with pytest.raises(ServerError) as info:
                    await c.event(event_id=2 + i, controls=[control])
                assert info.value.code == "bad_request" and text in info.value.message
                assert info.value.event_id == 2 + i

            # An inline trajectory (camera_actions held keys lose to it), then one by name.
            poses, intr = _slide(3, 0.1)
            await c.event(event_id=10, controls=[
                {**KEYS, "data": {"mode": "state", "held": []}},
                {**TRAJECTORY, "data": {"mode": "inline", "poses": poses.tolist(), "intrinsics": intr.tolist()}}])
            await c.credit(1)
            inline = await c.next_chunk(credit=False)
            after_inline = lingbot.pipeline.sessions["lb"].camera.pose
            np.testing.assert_allclose(after_inline.numpy(), (moved_w @ _as(poses[2])).numpy(), atol=1e-9)
            await c.event(event_id=11, controls=[{**TRAJECTORY, "data": {"mode": "named", "name": "slide"}}])
            await c.credit(1)
            named = await c.next_chunk(credit=False)
            after_named = lingbot.pipeline.sessions["lb"].camera.pose
            np.testing.assert_allclose(after_named.numpy(), (after_inline @ _as(_slide(5, 0.3)[0][2])).numpy(),
                                       atol=1e-9)
            assert [ch.chunk_index for ch in (first, inline, named)] == [0, 1, 2]
            assert [ch.applied_event_ids for ch in (first, inline, named)] == [[1], [10], [11]]
            for ch in (first, inline, named):
                assert len(ch.payloads) == 12 and all(f.shape == (SIZE, SIZE, 3) for f in ch.frames())

            # Reset: the same prompt, image and seed, so the same keys make the same chunk 0.
            reset = await c.reset()
            assert reset["chunk_index"] == 0 and "lb" not in lingbot.pipeline.sessions   # all released
            await c.event(event_id=12, controls=[{**KEYS, "data": {"mode": "state", "held": ["w"]}}])
            await c.credit(2)
            again = await c.next_chunk(credit=False)
            assert (again.chunk_index, again.applied_event_ids) == (0, [12])
            assert again.payloads == first.payloads and lingbot.pipeline.sessions["lb"].text_builds == 1
            follow = await c.next_chunk(credit=False)
            assert (follow.chunk_index, follow.applied_event_ids) == (1, [])
            closed = await c.close()
            assert closed["session_id"] == "lb" and "lb" not in lingbot.pipeline.sessions
            assert "lb" not in lingbot.pipeline.cache

    run(main())


def _as(pose: np.ndarray):
    import torch

    return torch.from_numpy(np.asarray(pose, dtype=np.float64))


def test_streamed_frames_come_one_by_one_as_decoded_and_equal_the_plain_chunks(server):
    addr, lingbot, _ = server
    image = png(24, 24)

    async def transcript(sid: str, stream: bool) -> list:
        async with websockets.connect(url(addr), max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.create", "session_id": sid, "model": "lingbot",
                                      "prompt": "a cave", "seed": 7, "format": "rgb8", "credits": 0,
                                      "stream_frames": stream, "image": {"format": "png", "bytes": len(image)}}))
            await ws.send(image)
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "event", "event_id": 1,
                                      "controls": [{**KEYS, "data": {"mode": "state", "held": ["w"]}}]}))
            assert json.loads(await ws.recv())["type"] == "event.accepted"
            await ws.send(json.dumps({"type": "credit", "chunks": 2}))
            out: list = []
            while sum(isinstance(m, dict) and m["type"] == "chunk" for m in out) < 2:
                msg = await ws.recv()
                out.append(msg if isinstance(msg, bytes) else json.loads(msg))
                if isinstance(out[-1], dict) and out[-1]["type"] == "chunk":
                    out += [await ws.recv() for _ in range(out[-1]["frames"])]
            await ws.send(json.dumps({"type": "session.close"}))
            return out

    async def main():
        streamed = await transcript("st", True)
        plain = await transcript("pl", False)
        parts = [(m["chunk_index"], m["first"], m["frames"]) for m in streamed
                 if isinstance(m, dict) and m["type"] == "chunk.frames"]
        # Chunk 0: its first decoded frame stands for the 3 held before it too, then one by one.
        assert parts == [(0, 0, 4)] + [(0, i, 1) for i in range(4, 12)] + [(1, i, 1) for i in range(12)]
        commits = [m for m in streamed if isinstance(m, dict) and m["type"] == "chunk"]
        assert [(c["chunk_index"], c["frames"], c["streamed"]) for c in commits] == [(0, 0, 12), (1, 0, 12)]
        assert isinstance(streamed[-1], dict) and streamed[-1]["type"] == "chunk"
        assert [m for m in streamed if isinstance(m, bytes)] == [m for m in plain if isinstance(m, bytes)]
        assert len([m for m in plain if isinstance(m, bytes)]) == 24

    run(main())


def test_a_first_pose_that_cannot_be_inverted_is_refused_and_the_session_goes_on(server):
    """It used to be accepted and fail the next tick silently (``LinAlgError`` in the
    reducer's prepare), leaving the session behind its client."""
    addr, lingbot, _ = server

    async def main():
        async with WorldClient.connect(url(addr), session_id="lb-flat") as c:
            await c.create(model="lingbot", prompt="a cave", image=png(16, 16), format="rgb8", credits=0)
            poses, intr = _slide(3, 0.1)
            inline = {"mode": "inline", "poses": _flat(poses).tolist(), "intrinsics": intr.tolist()}
            for i, data in enumerate([inline, {"mode": "named", "name": "flat"}]):
                with pytest.raises(ServerError) as info:
                    await c.event(event_id=1 + i, controls=[{**TRAJECTORY, "data": data}])
                assert (info.value.code, info.value.event_id) == ("bad_request", 1 + i)
                assert "the first pose cannot be inverted" in info.value.message
            await c.event(event_id=3, controls=[{**TRAJECTORY, "data": {"mode": "named", "name": "slide"}}])
            await c.credit(1)
            chunk = await c.next_chunk(credit=False)
            assert (chunk.chunk_index, chunk.applied_event_ids) == (0, [3])
            listed = httpx.get(f"http://{addr}/v1/sessions", timeout=5).json()["data"]
            assert [s["state"] for s in listed if s["session_id"] == "lb-flat"] == ["active"]
            await c.close()

    run(main())
